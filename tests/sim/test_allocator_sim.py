"""The allocator models inside the simulator (NOTE [ The memory a GPU really
uses ]): the caching allocator's fragmentation and its out of memory on
reserved bytes, the context reserve, SmartPool's pools, pinned host bytes,
and the books balanced after runs with every safety net."""

from __future__ import annotations

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Fixed
from memplan.planners.core.plan import Plan, SwapIn, SwapOut
from memplan.planners.heuristics.vanilla import release_only_plan
from memplan.sim import Job, SimError, simulate
from memplan.sim import model as sim_model
from memplan.traces import synthetic
from memplan.traces.io import fingerprint

from tests.sim.handtraces import B, Call, MiB, gpu, make


def frag_trace():
    """A (6 MiB) made by op 0, read by op 1, which makes B (6 MiB); op 2 reads
    B and makes C (9 MiB). A is freed after op 1, B and C after op 2."""
    return make([B(6), B(6), B(9)], [Call([], [0]), Call([0], [1]), Call([1], [2])])


def run(trace, lat, budget_mib=1024, **kw):
    return simulate([trace], DeviceModel(gpu(), lat), budget=budget_mib * MiB, **kw)


def test_caching_fragmentation_worked_by_hand():
    # A and B share a 20 MiB segment ([A 6][B 6][8 free]); A is freed: holes
    # of 6 and 8 MiB; C (9 MiB) fits neither and reserves a second segment.
    # At the reserved peak (40 MiB) 15 MiB are allocated: 25 MiB fragmentation.
    # The second iteration finds both segments free and reserves nothing more.
    t, lat = frag_trace()
    r = run(t, lat, allocator="caching", iterations=2)
    assert (r.reserved_peak_bytes, r.allocated_peak_bytes) == (40 * MiB, 15 * MiB)
    assert (r.fragmentation_bytes, r.device_peak_bytes) == (25 * MiB, 40 * MiB)
    assert r.peak_bytes == 15 * MiB  # the memory curve counts tensor bytes
    (j,) = r.jobs
    assert (j.reserved_peak_bytes, j.allocated_peak_bytes, j.device_peak_bytes) == (
        40 * MiB,
        15 * MiB,
        40 * MiB,
    )
    exact = run(t, lat, iterations=2)
    assert (exact.device_peak_bytes, exact.reserved_peak_bytes, exact.fragmentation_bytes) == (
        15 * MiB,
        15 * MiB,
        0,
    )


@pytest.mark.parametrize("oom", ["fail", "stall", "passive", "dtr"])
def test_out_of_memory_is_on_reserved_bytes(oom):
    # 30 MiB hold the 15 MiB of tensors but not the second 20 MiB segment;
    # no net helps: B is in use by op 2 and A's hole is inside a used segment
    t, lat = frag_trace()
    assert not run(t, lat, 30).oom
    r = run(t, lat, 30, allocator="caching", oom=oom)
    assert r.jobs[0].oom_at == (0, 2, 2)
    assert not run(t, lat, 40, allocator="caching", oom=oom).oom  # exactly enough


def test_context_reserve_is_inside_the_budget():
    t, lat = frag_trace()
    r = run(t, lat, 40, context_reserve=10 * MiB)  # exact: 10 + 15 fits in 40
    assert (r.peak_bytes, r.device_peak_bytes, r.allocated_peak_bytes) == (
        25 * MiB,
        25 * MiB,
        15 * MiB,
    )
    assert r.context_reserve_bytes == 10 * MiB
    # caching: 10 MiB of context leaves 30 for segments: C's does not fit
    assert run(t, lat, 40, allocator="caching", context_reserve=10 * MiB).jobs[0].oom_at == (
        0,
        2,
        2,
    )
    # the profile's figure is the default with an allocator model, none with exact
    hw = gpu()
    hw = type(hw)(**{**{f: getattr(hw, f) for f in hw.__slots__}, "context_reserve_bytes": MiB})
    dev = DeviceModel(hw, lat)
    assert simulate([t], dev, allocator="smartpool").context_reserve_bytes == MiB
    assert simulate([t], dev).context_reserve_bytes == 0
    with pytest.raises(SimError, match="leaves nothing of the budget"):
        run(t, lat, 40, context_reserve=40 * MiB)
    with pytest.raises(SimError, match="must be a whole number of bytes >= 0"):
        run(t, lat, 40, context_reserve=-1)
    with pytest.raises(SimError, match="allocator='buddy' must be one of exact, caching"):
        run(t, lat, allocator="buddy")


@pytest.mark.parametrize("oom", ["fail", "passive"])
def test_a_context_that_does_not_fit_is_out_of_memory_at_arrival(oom):
    # job 0 holds 20 MiB of context and 12 MiB of A and B at 1.5 ms; job 1's
    # context (20 MiB) would make 52 > 45: out of memory at once, no eviction
    t, lat = frag_trace()
    jobs = [Job(t), Job(t, arrival_s=0.0015)]
    r = simulate(jobs, DeviceModel(gpu(), lat), budget=45 * MiB, context_reserve=20 * MiB, oom=oom)
    assert [j.oom_at for j in r.jobs] == [None, (0, -1, -1)]
    assert r.jobs[0].evictions == 0


def test_smartpool_pools_and_their_admission():
    t, lat = frag_trace()
    # one job: C (9) at 0, A (6) at 0 too (their lives do not overlap), B above: 15
    r = run(t, lat, allocator="smartpool", iterations=2)
    assert (r.reserved_peak_bytes, r.allocated_peak_bytes, r.fragmentation_bytes) == (
        15 * MiB,
        15 * MiB,
        0,
    )
    # two jobs, the second arriving at 1.5 ms: at most 27 MiB live at once,
    # but two pools of 15 MiB do not fit 28 MiB: the second job is refused
    jobs = [Job(t), Job(t, arrival_s=0.0015)]
    dev = DeviceModel(gpu(), lat)
    exact = simulate(jobs, dev, budget=28 * MiB)
    assert (exact.oom, exact.peak_bytes) == (False, 27 * MiB)
    pooled = simulate(jobs, dev, budget=28 * MiB, allocator="smartpool")
    assert [j.oom_at for j in pooled.jobs] == [None, (0, -1, -1)]
    assert (pooled.reserved_peak_bytes, pooled.device_peak_bytes) == (15 * MiB, 15 * MiB)
    assert not simulate(jobs, dev, budget=30 * MiB, allocator="smartpool").oom


def test_pinned_host_bytes_of_a_swap_worked_by_hand():
    # ops of 3 ms; A (4 MiB) swaps out after op 0 ([3, 7) ms on the lane) and
    # back after op 2 ([9, 13)): off the device with its host copy from 7 to
    # 13 ms. B (2 MiB) is only released: it has no host copy, nothing pinned.
    t, lat = make(
        [B(4), B(2)],
        [Call([], [0], 3), Call([], [1], 3), Call([1], [], 3), Call([0], [], 3)],
    )
    plan = Plan(fingerprint(t), (SwapOut(0, 0), SwapIn(0, 2, 3)))
    for alloc in ("exact", "caching", "smartpool"):
        r = simulate([Job(t, plan)], DeviceModel(gpu(), lat), allocator=alloc)
        assert (r.pinned_peak_bytes, r.jobs[0].pinned_peak_bytes) == (4 * MiB, 4 * MiB)
    assert run(t, lat).pinned_peak_bytes == 0
    assert simulate([Job(t, release_only_plan(t))], DeviceModel(gpu(), lat)).pinned_peak_bytes == 0


def test_pinned_host_bytes_of_two_swaps_one_after_the_other():
    # ops of 3 ms. A (4 MiB) copies out [3, 7) and back [9, 13) (op 3 waits
    # for it until 13); B (2 MiB) out after op 3 [16, 18) and back after op 4
    # [19, 21). A is parked 7-13, B 18-21: never both, so the peak is A's
    # 4 MiB, not 6 -- A's return to the device unparks it.
    t, lat = make(
        [B(4), B(2)],
        [Call([], [0], 3), Call([], [1], 3), Call([], [], 3), Call([0], [], 3),
         Call([], [], 3), Call([1], [], 3)],
    )  # fmt: skip
    events = (SwapOut(0, 0), SwapIn(0, 2, 3), SwapOut(1, 3), SwapIn(1, 4, 5))
    r = simulate([Job(t, Plan(fingerprint(t), events))], DeviceModel(gpu(), lat))
    assert (r.pinned_peak_bytes, r.jobs[0].pinned_peak_bytes) == (4 * MiB, 4 * MiB)
    assert r.jobs[0].iteration_time_s == pytest.approx(0.024)  # stalls 9-13 and 19-21


@pytest.mark.parametrize("seed", [3, 8])
@pytest.mark.parametrize("allocator", ["caching", "smartpool"])
@pytest.mark.parametrize("oom", ["fail", "stall", "passive", "dtr"])
def test_the_books_balance_under_every_net(allocator, oom, seed, monkeypatch):
    # two random steps sharing a tight budget: every block, loose copy and
    # workspace is given back when the run ends, whatever the net did
    seen = {}
    real = sim_model.GpuModel.run

    def keep(self):
        real(self)
        seen["mem"] = self.mem  # the model lets go of its pool once the result is built

    monkeypatch.setattr(sim_model.GpuModel, "run", keep)
    t = synthetic.random_dag(40, seed=seed)
    dev = DeviceModel(gpu(), Fixed([1e-3] * t.n_ops))
    peak = simulate([t, t], dev).peak_bytes
    plans = [release_only_plan(t)] * 2
    r = simulate(
        [Job(t, p) for p in plans], dev, budget=int(peak * 0.7), oom=oom, allocator=allocator
    )
    mem = seen["mem"]
    assert (mem.used, mem.parked_bytes) == (0, 0)
    books = mem.ledger
    for j in range(2):
        assert (books.owned[j], books.scratch[j]) == ({}, [])
        assert not any(books.loose[j].values())
        if allocator == "caching":
            assert (books.backs[j].allocated, books.backs[j].reserved) == (0, 0)
        else:
            assert min(books.backs[j].ends, default=0) >= 0  # every lifetime closed
    assert r.device_peak_bytes <= int(peak * 0.7) or r.oom
    # two counts of the same bytes: the memory curve and the allocator's blocks
    # (smartpool's lifetimes give the curve's peak; caching's blocks, rounded
    # up, never hold less)
    for j in r.jobs:
        if allocator == "smartpool":
            assert j.allocated_peak_bytes == j.peak_bytes
        else:
            assert j.allocated_peak_bytes >= j.peak_bytes

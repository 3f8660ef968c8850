"""Capuchin: hand-made traces whose choices are worked out by hand.

The device moves 1 MiB per millisecond each way with no fixed cost and op
durations are whole milliseconds, so a copy of k MiB takes k ms. Buffers die
after their last access (the framework's frees).
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Fixed, Measured
from memplan.hwmodels.profile import Hardware, load_hardware
from memplan.planners import registry
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Reason, Recompute, Release, Status, SwapIn, SwapOut
from memplan.planners.heuristics.capuchin.planner import NO_BUDGET, capuchin
from memplan.sim import Job, simulate
from memplan.traces import io
from memplan.traces.model import Buffer, BufferKind, Op, Phase, Trace, TraceMeta, View
from memplan.traces.synthetic import Durations, Grain, sized

MiB = 1 << 20


def gpu(mib_per_ms: float = 1.0) -> Hardware:
    bw = mib_per_ms * 1000.0 * MiB
    return Hardware(
        name="hand",
        memory_bytes=1024 * MiB,
        h2d_bytes_per_s=bw,
        d2h_bytes_per_s=bw,
        transfer_fixed_s=0.0,
        copy_engines=2,
        h2d_duplex_factor=0.5,
        peak_flops={"float32": 1e12},
        mem_bw_bytes_per_s=1e11,
        launch_overhead_s=0.0,
    )


def make(buffers, ops, name: str = "hand") -> tuple[Trace, Fixed]:
    """`buffers`: (MiB, kind); `ops`: (reads, writes, ms[, phase]). Every
    buffer dies after its last access; ops are named aten.op<i>."""
    last: dict[int, int] = {}
    for i, op in enumerate(ops):
        for b in (*op[0], *op[1]):
            last[b] = i
    bufs = []
    for i, (mib, kind) in enumerate(buffers):
        k = BufferKind(kind)
        persistent = k in (BufferKind.PARAM, BufferKind.OPTIMIZER_STATE)
        bufs.append(Buffer(i, mib * MiB, k, persistent, f"b{i}", None if persistent else last[i]))
    views = tuple(View(i, i, (b.nbytes // 4,), (1,), 0, "float32") for i, b in enumerate(bufs))
    trace_ops = tuple(
        Op(i, f"aten.op{i}.default", Phase(op[3] if len(op) > 3 else "forward"), op[0], op[1])
        for i, op in enumerate(ops)
    )
    trace = io.from_dict(io.to_dict(Trace(TraceMeta(name, 1), tuple(bufs), views, trace_ops)))
    return trace, Fixed([op[2] * 1e-3 for op in ops])


def a_around_peak(op3_ms: int, x_read_at_end: bool) -> tuple[Trace, Fixed]:
    """x (input, 1 MiB) -> a (4 MiB, op 0); t1 (8 MiB, op 1, 5 ms) -> t2 (op 2,
    the peak: x a t1 t2 = 14 MiB when x lives to the end); t3 (op 3, op3_ms);
    op 4 reads a again. a is the only candidate whose accesses span op 2."""
    buffers = [(1, "input"), (4, "activation"), (8, "activation")] + [(1, "activation")] * 3
    end = [1, 4, 0] if x_read_at_end else [1, 4]
    ops = [([0], [1], 1), ([0], [2], 5), ([2], [3], 1), ([3], [4], op3_ms), (end, [5], 1)]
    return make(buffers, ops)


def run(trace: Trace, lat: Fixed, budget: int, hw: Hardware | None = None):
    hw = hw or gpu()
    res = capuchin([trace], DeviceModel(hw, lat), budget_bytes=budget)
    for p in res.plans:
        check(p, trace)
    return res


def test_swaps_when_the_swap_in_hides():
    # a leaves after op 0 (copy 1..5 ms, before the peak op starts at 6) and
    # comes back in the latest 4 ms before op 4 starts at 12: after op 2 ends
    # at 7, plus 1 ms. The peak moves to op 1 (a still copying): 13 MiB.
    trace, lat = a_around_peak(op3_ms=5, x_read_at_end=True)
    assert trace.peak() == (14 * MiB, 2)
    res = run(trace, lat, 14 * MiB - 1)
    assert res.feasible
    (out, back) = res.plans[0].events
    assert out == SwapOut(1, 0, 0.0, before_op=2)  # due by the peak op, the first after 5
    assert (back.buffer, back.after_op, back.before_op) == (1, 2, 4)
    assert back.delay_us == pytest.approx(1000.0, abs=0.01)
    assert res.stats["job_peak_bytes"] == [13 * MiB]
    sim = simulate([Job(trace, res.plans[0])], DeviceModel(gpu(), lat), budget=14 * MiB - 1)
    assert not sim.oom and sim.jobs[0].stall_s == 0 and sim.peak_bytes == 13 * MiB


def test_recomputes_when_swapping_cannot_hide_and_recompute_is_cheaper():
    # After the peak only op 3 (1 ms) runs before a is needed: the 4 ms swap-in
    # would stall 3 ms; re-running op 0 from x (alive to the end) costs 1 ms.
    trace, lat = a_around_peak(op3_ms=1, x_read_at_end=True)
    res = run(trace, lat, 14 * MiB - 1)
    assert res.feasible
    assert res.plans[0].events == (Release(1, 0), Recompute(1, 4, (0,)))
    assert res.stats["jobs"][0]["recompute_us"] == pytest.approx(1000.0)
    sim = simulate(
        [Job(trace, res.plans[0])], DeviceModel(gpu(), lat), budget=14 * MiB - 1, iterations=1
    )
    assert not sim.oom and sim.jobs[0].recompute_s == pytest.approx(1e-3)


def test_swaps_with_overhead_when_recompute_is_impossible():
    # a = f(x) but x dies after op 0, so a cannot be recomputed; t2 (2 MiB)
    # makes op 2 the peak (a t1 t2 = 14 MiB). The swap-in can only start
    # after op 2 ends (7 ms) and a is due at 8 ms: a 3 ms stall, still taken.
    buffers = [(1, "input"), (4, "activation"), (8, "activation"), (2, "activation")]
    buffers += [(1, "activation"), (1, "activation"), (1, "input")]
    ops = [([0], [1], 1), ([6], [2], 5), ([2], [3], 1), ([3], [4], 1), ([1, 4], [5], 1)]
    trace, lat = make(buffers, ops)
    assert trace.peak() == (14 * MiB, 2)
    res = run(trace, lat, 14 * MiB - 1)
    assert res.feasible
    assert [type(ev) for ev in res.plans[0].events] == [SwapOut, SwapIn]
    assert res.stats["jobs"][0]["swap_overhead_us"] == pytest.approx(3000.0, abs=0.01)
    sim = simulate(
        [Job(trace, res.plans[0])], DeviceModel(gpu(), lat), budget=14 * MiB - 1, iterations=1
    )
    assert not sim.oom and sim.jobs[0].stall_s == pytest.approx(3e-3, abs=1e-6)


def two_candidates() -> tuple[Trace, Fixed]:
    """a (4 MiB, op 0) and b (2 MiB, op 1) are read again by op 6; op 2 (10 ms)
    leaves time to copy both out before the peak ops 3 and 4 (15 MiB) and op
    5 (10 ms) to copy both back. FT(b) = 24-2 - (2+2) = 18 ms > FT(a) = 24-4 -
    (1+4) = 15 ms: b first."""
    buffers = [(1, "input"), (4, "activation"), (2, "activation"), (1, "activation")]
    buffers += [(8, "activation"), (1, "activation"), (1, "activation"), (1, "activation")]
    ops = [
        ([0], [1], 1),
        ([0], [2], 1),
        ([0], [3], 10),
        ([3], [4], 1),
        ([4], [5], 1),
        ([5], [6], 10),
        ([1, 2, 6], [7], 1),
    ]
    return make(buffers, ops)


def test_stops_when_the_memory_to_save_is_reached():
    trace, lat = two_candidates()
    assert trace.peak() == (15 * MiB, 3)
    one = run(trace, lat, 14 * MiB)  # 1 MiB to save: b (2 MiB, best FT) is enough
    assert [ev.buffer for ev in one.plans[0].events] == [2, 2]
    assert one.feasible and one.stats["job_peak_bytes"] == [13 * MiB]
    both = run(trace, lat, 12 * MiB)  # 3 MiB: b, then a
    assert [ev.buffer for ev in both.plans[0].events] == [2, 2, 1, 1]
    assert both.feasible and both.stats["job_peak_bytes"] == [9 * MiB]
    # a's copy out queues behind b's on the one lane: 2..4 ms is b's; a's
    # ends at 8 ms, and op 3 (12 ms) is the first op to start after: its deadline
    assert both.plans[0].events[2] == SwapOut(1, 0, 3000.0, before_op=3)
    sim = simulate([Job(trace, both.plans[0])], DeviceModel(gpu(), lat), budget=12 * MiB)
    assert not sim.oom and sim.peak_bytes == 9 * MiB and sim.jobs[0].stall_s == 0


def test_nothing_to_do_when_the_budget_fits():
    trace, lat = two_candidates()
    res = run(trace, lat, 15 * MiB)
    assert res.feasible and res.plans[0].events == ()


def test_msps_update_lengthens_the_chain_of_a_recompute_whose_source_is_evicted():
    # PCIe so slow nothing can be swapped. a = f(x), c = g(a); the peak op 3
    # (18 MiB) lies in both gaps. Both have MSPS 4 MiB/ms; a (lower id) goes
    # first, then c's lineage starts at x: rp_time 2 ms, chain (0, 1).
    buffers = [(1, "input"), (4, "activation"), (4, "activation"), (8, "activation")]
    buffers += [(1, "activation")] * 3
    ops = [
        ([0], [1], 1),
        ([1], [2], 1),
        ([0], [3], 1),
        ([3], [4], 1),
        ([2, 4, 0], [5], 1),
        ([1, 5, 0], [6], 1),
    ]
    trace, lat = make(buffers, ops)
    assert trace.peak() == (18 * MiB, 3)
    slow = gpu(mib_per_ms=0.001)
    res = run(trace, lat, 11 * MiB, hw=slow)
    assert res.feasible
    assert res.plans[0].events == (
        Release(1, 1),
        Recompute(1, 5, (0,)),
        Release(2, 1),
        Recompute(2, 4, (0, 1)),
    )
    sim = simulate([Job(trace, res.plans[0])], DeviceModel(slow, lat), budget=11 * MiB)
    assert not sim.oom and sim.peak_bytes <= 11 * MiB


def test_infeasible_when_nothing_spans_the_peak():
    # x dies after op 1 and a's copy cannot end before op 1 starts: the peak
    # at op 1 has no candidate.
    trace, lat = a_around_peak(op3_ms=5, x_read_at_end=False)
    assert trace.peak() == (13 * MiB, 1)
    res = run(trace, lat, 13 * MiB - 1)
    assert not res.feasible
    assert (res.status, res.reason) == (Status.STOPPED, Reason.NO_MOVE_LEFT)
    assert res.stats["job_peak_bytes"] == [13 * MiB]


def test_without_a_budget_the_result_says_why():
    trace, lat = two_candidates()
    res = capuchin([trace], DeviceModel(gpu(), lat))
    assert not res.feasible and res.plans == ()
    assert (res.status, res.reason, res.detail) == (Status.STOPPED, Reason.NO_BUDGET, NO_BUDGET)


def test_registry_and_options():
    trace, lat = a_around_peak(op3_ms=1, x_read_at_end=True)
    res = registry.run(
        "capuchin",
        [trace],
        DeviceModel(gpu(), lat),
        budget_bytes=14 * MiB - 1,
        options=["recompute=false"],
    )
    assert [type(ev) for ev in res.plans[0].events] == [SwapOut, SwapIn]
    assert res.options == {"recompute": False, "max_recompute_ops": 32, "max_rounds": 1000}
    with pytest.raises(PlanError, match="unknown option"):
        registry.run(
            "capuchin", [trace], DeviceModel(gpu(), lat), budget_bytes=MiB, options=["swap_first=1"]
        )
    with pytest.raises(PlanError, match="budget_bytes"):
        capuchin([trace], DeviceModel(gpu(), lat), budget_bytes=0)


def test_several_jobs_share_the_budget_by_their_peaks():
    trace, lat = two_candidates()
    res = capuchin([trace, trace], DeviceModel(gpu(), lat), budget_bytes=2 * 14 * MiB)
    assert res.feasible and len(res.plans) == 2
    assert [s["budget_bytes"] for s in res.stats["jobs"]] == [14 * MiB, 14 * MiB]
    for p in res.plans:
        check(p, trace)


# ---- property: every plan checks, never above vanilla, fits when it says so -----------
V100 = load_hardware("v100-sxm2-16gb")
MS = Durations(Grain.MS, 1, 9)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_ops=st.integers(12, 120),
    seed=st.integers(0, 10_000),
    fraction=st.sampled_from([0.95, 0.8, 0.6, 0.4]),
)
def test_plans_check_and_fit_when_feasible(n_ops, seed, fraction):
    trace = sized(n_ops, seed=seed, durations=MS)
    lat = Measured()
    vanilla = simulate([trace], DeviceModel(V100, lat)).peak_bytes
    budget = int(vanilla * fraction)
    res = capuchin([trace], DeviceModel(V100, lat), budget_bytes=budget)
    check(res.plans[0], trace)
    sim = simulate([Job(trace, res.plans[0])], DeviceModel(V100, lat), budget=max(budget, vanilla))
    assert sim.peak_bytes <= vanilla
    if res.feasible:
        assert sim.peak_bytes <= budget


def test_options_dataclass_rejects_bad_values():
    with pytest.raises(PlanError, match="max_recompute_ops"):
        registry.make_options("capuchin", {"max_recompute_ops": 0})
    opts = registry.make_options("capuchin", None)
    assert dataclasses.asdict(opts)["recompute"] is True

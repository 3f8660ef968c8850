"""Buffer lifetimes across iterations (NOTE [ Incarnations ] in `sim/model.py`).

A non-persistent buffer lives from its creation to the framework's free, once
per iteration; every piece of per-buffer state (where it is, its host copy, a
running copy, a pending swap-in) belongs to that one incarnation. The
hand-worked cases use `handtraces` (MiB sizes, 1 MiB/ms both ways, op times in
ms); the property test runs the registry's planners on random steps.

Invariants checked by `check_lifetimes` on every run:
- conservation: per job and buffer kind, the allocations and the frees are
  the same multiset of sizes, and the device is empty at the end;
- at the end of every iteration the job holds exactly its persistent buffers
  that are on the device (resident, leaving, or arriving with their copy
  running) plus the bytes that D2H copies of dead buffers are still reading
  (NOTE [ Event semantics ]: the framework's free of a buffer whose copy is
  running takes effect when the copy ends) -- nothing else survives.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import LatencyModel, Measured
from memplan.hwmodels.profile import Hardware, load_hardware
from memplan.planners import registry
from memplan.planners.core.check import check as check_plan
from memplan.planners.core.plan import Plan, PlanResult, Recompute, Release, SwapIn, SwapOut
from memplan.sim import Job, OomPolicy, SimResult
from memplan.sim.job import CompiledJob
from memplan.sim.log import CODE, Log, LogKind, Rows
from memplan.sim.metrics import build_result
from memplan.sim.model import GpuModel
from memplan.sim.state import ARRIVING, DEV, LEAVING, OFF
from memplan.traces import synthetic
from memplan.traces.io import fingerprint
from memplan.traces.synthetic import Durations, Grain

from tests.sim.handtraces import B, Call, MiB, fmt, gpu, make

K = LogKind
D2H_START, D2H_END = {K.SWAP_OUT_START, K.EVICT_START}, {K.SWAP_OUT_END, K.EVICT_END}
H2D_START, H2D_END = {K.SWAP_IN_START, K.FETCH_START}, {K.SWAP_IN_END, K.FETCH_END}


# ---- running the model with a probe ------------------------------------------------
class _ProbedLog(Log):
    """The model's log, also noting how many memory samples precede each entry
    and where every buffer of the job is when an iteration ends. The model
    extends the flat list by whole rows (NOTE [ A flat log ]), so the
    list takes the notes."""

    __slots__ = ("model", "samples_before", "where_at_end")

    def __init__(self, model: GpuModel):
        super().__init__()
        self.model = model
        self.samples_before: list[int] = []
        self.where_at_end: dict[int, tuple[int, ...]] = {}  # log index of iter_end -> where
        self.flat = _Noting(self)


class _Noting(list):
    """The log's flat list, taking the probe's notes as each row comes in."""

    def __init__(self, log: _ProbedLog):
        super().__init__()
        self.log = log

    def extend(self, row: tuple) -> None:  # (t, job, iteration, kind code, op, buffer, lane)
        log = self.log
        if row[3] == CODE[K.ITER_END]:
            log.where_at_end[len(log)] = tuple(log.model.jobs[row[1]].where)
        log.samples_before.append(len(log.model.mem.samples))
        super().extend(row)


@dataclass
class Probe:
    result: SimResult
    log: _ProbedLog
    samples: Rows

    def curve(self, job: int | None = None) -> list[tuple[float, float]]:
        """(ms, MiB) after every memory change (of one job, or of all)."""
        out, used = [], 0
        for t, j, _k, d in self.samples:
            if job is None or j == job:
                used += d
                out.append((t / 1000, used / MiB))
        return out


def iteration_end_bytes(p: Probe, job: int = 0) -> list[float]:
    """MiB the job holds at the end of each of its iterations (its last op's
    frees done, the next iteration's inputs not yet taken)."""
    out = []
    for i, e in enumerate(p.log):
        if e.kind is K.ITER_END and e.job == job:
            n = p.log.samples_before[i]
            out.append(sum(d for _t, j, _k, d in p.samples[:n] if j == job) / MiB)
    return out


def run(
    jobs: list[Job],
    hw: Hardware,
    latency: LatencyModel,
    *,
    iterations: int,
    lanes: int = 1,
    budget: int | None = None,
    oom: str = "fail",
) -> Probe:
    """`sim.simulate` (plans checked first), keeping the model's probed log."""
    for job in jobs:
        if job.plan is not None:
            check_plan(job.plan, job.trace)
    device = DeviceModel(hw, latency, lanes)
    compiled = [
        CompiledJob(j, job, iterations if job.iterations is None else job.iterations, device)
        for j, job in enumerate(jobs)
    ]
    budget = hw.memory_bytes if budget is None else budget
    model = GpuModel(compiled, device, budget, OomPolicy(oom))
    log = _ProbedLog(model)
    model.log.flat = log.flat  # every part of the model logs to `model.log`: probe its list
    model.run()
    return Probe(build_result(model, hw.name, 0), log, model.mem.samples)


def check_lifetimes(p: Probe) -> None:
    """The invariants of the module docstring."""
    r, samples = p.result, p.samples
    allocs: Counter = Counter()
    frees: Counter = Counter()
    for _t, j, k, d in samples:
        (allocs if d > 0 else frees)[(j, k, abs(d))] += 1
    assert allocs == frees, "an allocation without its free (or the reverse)"
    assert r.memory.bytes[-1] == 0 and not r.memory.by_job[-1].any()

    traces = r.traces
    used = [0] * len(traces)
    pos = 0
    d2h: Counter = Counter()  # (job, buffer) -> D2H copies running
    h2d: Counter = Counter()
    for i, e in enumerate(p.log):
        while pos < p.log.samples_before[i]:
            used[samples[pos][1]] += samples[pos][3]
            pos += 1
        if e.kind in D2H_START:
            d2h[(e.job, e.buffer)] += 1
        elif e.kind in D2H_END:
            d2h[(e.job, e.buffer)] -= 1
        elif e.kind in H2D_START:
            h2d[(e.job, e.buffer)] += 1
        elif e.kind in H2D_END:
            h2d[(e.job, e.buffer)] -= 1
        elif e.kind is K.ITER_END:
            t = traces[e.job]
            where = p.log.where_at_end[i]
            persistent = t.persistent.tolist()
            nbytes = t.nbytes.tolist()
            expected = 0
            for b, w in enumerate(where):
                if persistent[b]:
                    on_device = w in (DEV, LEAVING) or (w == ARRIVING and h2d[(e.job, b)])
                    expected += nbytes[b] * on_device
                else:
                    assert w == OFF, f"iteration {e.iteration}: buffer {b} outlived it"
                    assert not h2d[(e.job, b)], f"iteration {e.iteration}: buffer {b} arriving"
                    expected += nbytes[b] * d2h[(e.job, b)]
            assert used[e.job] == expected, (
                f"job {e.job}, end of iteration {e.iteration} at {e.t_us} us: "
                f"{used[e.job]} bytes on the device, expected {expected}"
            )


def plan(trace, *events) -> Plan:
    return Plan(fingerprint(trace), events)


# ---- the reported bug: a running copy of the previous incarnation -------------------
# a (4 MiB) is made by op0 and freed after op1 (1 ms each; a saved tensor
# that nothing reads in this short step) and swapped out after op0. Its copy
# takes 4 ms, two iterations: the copy of iteration k's a is still running
# when iteration k+1 frees its own a, whose swap-out is queued behind it.
# That queued swap-out has not started, so the free takes the bytes back at
# once -- the running copy belongs to the previous incarnation.
def relay(mib: int = 4, extra: list[B] | None = None, ops: list[Call] | None = None):
    return make([B(mib, freed_after=1), *(extra or [])], ops or [Call([], [0]), Call([], [])])


def test_queued_swap_out_of_a_new_incarnation_is_freed_at_once():
    # it0 0->2: a0 made at 0, copied 1->5, dies at 2 (bytes back when its copy
    # ends). it1 2->4: a1 made at 2 (8 MiB: a0 is still being read), its
    # swap-out queues at 3, it dies at 4: freed then (4 MiB). it2 4->6: a2 made
    # at 4; a0's copy ends at 5 (4 MiB), a1's swap-out then finds a1 dead and
    # gives up the lane, a2's copy runs 5->9; a2 dies at 6, bytes back at 9.
    t, lat = relay()
    p = run([Job(t, plan(t, SwapOut(0, 0)))], gpu(), lat, iterations=3)
    assert p.curve() == [(0.0, 4), (2.0, 8), (4.0, 4), (4.0, 8), (5.0, 4), (9.0, 0)]
    assert [e for e in fmt(p.result.log) if e[1] not in ("op_start", "op_end")] == [
        (0.0, "iter_start", -1, -1),
        (1.0, "swap_out_start", 0, 0, "lane0"),
        (2.0, "iter_end", -1, -1),
        (2.0, "iter_start", -1, -1),
        (4.0, "iter_end", -1, -1),
        (4.0, "iter_start", -1, -1),
        (5.0, "swap_out_end", 0, 0, "lane0"),
        (5.0, "swap_out_start", 0, 0, "lane0"),
        (6.0, "iter_end", -1, -1),
        (9.0, "swap_out_end", 0, 0, "lane0"),
    ]
    j = p.result.jobs[0]
    assert (j.bytes_d2h, j.iteration_times_s) == (8 * MiB, (0.002, 0.002, 0.002))
    check_lifetimes(p)


def test_the_stale_copy_does_not_cost_a_spurious_oom():
    # a (6 MiB, copied in 6 ms) made by op0, freed after op1; c (6 MiB) made by
    # op2, read by op3; 1 ms per op, budget 12 MiB. it0 (0->4): a0 copied 1->7,
    # c made at 2 next to a0's bytes (12 MiB). it1 (4->8): a1 made at 4 (12
    # MiB), its swap-out queued at 5, a1 freed at 6 (6 MiB), c made at 6 (12
    # MiB); a0's bytes back at 7. Had a1's free been mistaken for a0's running
    # copy, c would need 18 MiB: an OOM that vanilla (peak 6 MiB) never has.
    ops = [Call([], [0]), Call([], []), Call([], [1]), Call([1], [])]
    t, lat = relay(6, extra=[B(6)], ops=ops)
    p = run([Job(t, plan(t, SwapOut(0, 0)))], gpu(), lat, iterations=2, budget=12 * MiB)
    assert not p.result.oom
    assert p.curve() == [
        (0.0, 6), (2.0, 12), (4.0, 6), (4.0, 12), (6.0, 6), (6.0, 12), (7.0, 6), (8.0, 0),
    ]  # fmt: skip
    assert p.result.jobs[0].iteration_times_s == (0.004, 0.004)
    check_lifetimes(p)


def test_a_job_that_runs_out_of_memory_returns_a_queued_swap_out():
    # a (8 MiB) made by op0, freed after op1, which makes c (6 MiB), read by op2;
    # budget 20 MiB. it0: a0 copied 1->9 (dies at 2, read until 9), c at 1.
    # it1 at 3: a1 made (16 MiB), its swap-out triggered at 4, then c needs
    # 22 MiB: OOM at (1, 1, c). The job's memory goes back at once -- a1 too,
    # although a copy of a (a0's) is running -- and a0's bytes at 9.
    t, lat = relay(8, extra=[B(6)], ops=[Call([], [0]), Call([], [1]), Call([1], [])])
    p = run([Job(t, plan(t, SwapOut(0, 0)))], gpu(), lat, iterations=3, budget=20 * MiB)
    j = p.result.jobs[0]
    assert (j.oom, j.oom_at) == (True, (1, 1, 1))
    assert p.curve() == [(0.0, 8), (1.0, 14), (3.0, 8), (3.0, 16), (4.0, 8), (9.0, 0)]
    check_lifetimes(p)


# ---- a plan that only swaps ----------------------------------------------------------
# p (param, 2 MiB) and m (optimizer state, 1 MiB) persist; x (input, 1 MiB) is
# read by op0, which makes a (2 MiB); op2 makes b (4 MiB), read by op3; op5
# reads a and makes g (grad, 2 MiB); op6 updates p and m from g; op1, op4 and
# op7 are pads (3 ms each; the others 1 ms).
def swap_step():
    return make(
        [B(2, "param"), B(1, "optimizer_state"), B(1, "input"), B(2), B(4), B(2, "grad")],
        [
            Call([2, 0], [3]),
            Call([], [], 3),
            Call([], [4]),
            Call([4], [], phase="backward"),
            Call([], [], 3, "backward"),
            Call([3], [5], phase="backward"),
            Call([5, 0, 1], [0, 1], phase="optimizer"),
            Call([], [], 3, "optimizer"),
        ],
    )


def test_a_swap_only_plan_returns_to_the_persistent_set_and_stays_under_vanilla():
    # a out after op0 (1->3, hidden by op1, 1->4), in after op3 (6->8, hidden
    # by op4, 6->9); p out after its update (11->13, hidden by op7, 11->14)
    # and in for the next iteration after op7 (14->16: op0 of it1 waits 2
    # ms). The last iteration's swap-in of p serves nothing and never starts.
    t, lat = swap_step()
    events = (SwapOut(3, 0), SwapIn(3, 3, 5), SwapOut(0, 6), SwapIn(0, 7, 0, next_iteration=True))
    p = run([Job(t, plan(t, *events))], gpu(), lat, iterations=3)
    vanilla = run([Job(t)], gpu(), lat, iterations=3)
    it0 = [
        (0.0, 2), (0.0, 3), (0.0, 4), (0.0, 6), (1.0, 5),  # p, m; x; a; x freed
        (3.0, 3), (4.0, 7), (6.0, 3), (6.0, 5),  # a out; b; b freed; a in
        (9.0, 7), (10.0, 5), (11.0, 3), (13.0, 1),  # g; a, g freed; p out
    ]  # fmt: skip
    later = [  # from the start of it1 (14) and it2 (30)
        (0, 2), (0, 4), (2, 6), (3, 5),  # x; p in; a (after the 2 ms wait); x freed
        (5, 3), (6, 7), (8, 3), (8, 5),
        (11, 7), (12, 5), (13, 3), (15, 1),
    ]  # fmt: skip
    it1 = [(14.0 + dt, b) for dt, b in later]
    it2 = [(30.0 + dt, b) for dt, b in later]
    assert p.curve() == it0 + it1 + it2 + [(46.0, 0)]  # the job ends: m freed
    # every iteration ends with m alone: p is on the host, nothing else lives
    assert iteration_end_bytes(p) == [1, 1, 1]
    assert iteration_end_bytes(vanilla) == [3, 3, 3]  # p and m
    assert (p.result.peak_bytes, vanilla.result.peak_bytes) == (7 * MiB, 9 * MiB)
    j = p.result.jobs[0]
    assert j.iteration_times_s == (0.014, 0.016, 0.016)
    assert (j.stall_s, j.bytes_d2h, j.bytes_h2d) == (0.004, 12 * MiB, 10 * MiB)
    check_lifetimes(p)
    check_lifetimes(vanilla)


# ---- the iteration boundary: no op is running ------------------------------------
def test_between_iterations_no_buffer_is_in_use():
    # w (param, 2 MiB) is updated by op1, the last op; x (input, 2 MiB) is
    # read by op0. Budget 3 MiB, passive: each iteration starts by making room
    # for x, evicting w (2 ms); op1 fetches w back on demand (2 ms). Between
    # iterations no op runs, so w -- last used by op1 of the iteration that
    # ended -- may be evicted at the start of it1 as at the start of it0.
    t, lat = make(
        [B(2, "param"), B(2, "input")], [Call([1], []), Call([0], [0], phase="optimizer")]
    )
    p = run([Job(t)], gpu(), lat, iterations=2, budget=3 * MiB, oom="passive")
    j = p.result.jobs[0]
    assert (j.oom, j.iteration_times_s, j.passive_swaps) == (False, (0.006, 0.006), 4)
    assert j.stall_s == 0.008
    assert [e for e in fmt(p.result.log) if e[1] not in ("op_start", "op_end")] == [
        (0.0, "iter_start", -1, -1),
        (0.0, "evict_start", -1, 0, "lane0"),
        (2.0, "evict_end", -1, 0, "lane0"),
        (3.0, "fetch_start", 1, 0, "lane0"),
        (5.0, "fetch_end", 1, 0, "lane0"),
        (6.0, "iter_end", -1, -1),
        (6.0, "iter_start", -1, -1),
        (6.0, "evict_start", -1, 0, "lane0"),
        (8.0, "evict_end", -1, 0, "lane0"),
        (9.0, "fetch_start", 1, 0, "lane0"),
        (11.0, "fetch_end", 1, 0, "lane0"),
        (12.0, "iter_end", -1, -1),
    ]
    assert p.curve() == [
        (0.0, 2), (2.0, 0), (2.0, 2), (3.0, 0), (3.0, 2),  # w, evicted; x; x freed; w back
        (8.0, 0), (8.0, 2), (9.0, 0), (9.0, 2), (12.0, 0),
    ]  # fmt: skip
    check_lifetimes(p)


# ---- recompute: a dead buffer made again is an incarnation of its own ----------------
class _PerJob(LatencyModel):
    name = "per-job"

    def __init__(self, by_trace):
        self.by_trace = by_trace

    def predict_all(self, trace, hw, usage=0.0):
        return self.by_trace[trace].predict_all(trace, hw, usage)


def test_a_dead_buffer_remade_by_a_recompute_dies_with_the_chain():
    # Job A: op0 (4 ms) makes g (2 MiB, freed after op2) and u (1 MiB); op1
    # makes t from u; op2 pads; op3 reads t. t is released after op1 and
    # recomputed for op3 by (op0, op1), which also makes g and u again --
    # both already dead: temporaries of the chain. Job B (x, 2 MiB, made by
    # its op0) arrives at 10.5 during the chain's op1; budget 5 MiB, passive.
    #
    # it0 of A: g+u at 0, t at 4, u freed and t released at 5, g freed at 6;
    # the chain takes g+u at 6 and t at 10. B needs 2 MiB at 10.5 (4 in use):
    # it evicts the LRU buffer not in use, A's temporary g, 10.5->12.5. The
    # chain ends at 11 with g's copy running: u is freed, g's bytes come back
    # when the copy ends (12.5) -- not later: they belong to the chain's g,
    # not to the g that A's it1 makes at 12 (and op0 is using at 12.5), so
    # they cannot be mistaken for it (kept on the device, or freed for it).
    # B then takes x (5 MiB in use), runs 16->18 (A's op0 holds the device until
    # 16) and ends. A's op1 needs 1 MiB at 16: evicts its g (16->18, host
    # copy made, dead at 20); the chain of it1 makes g+u again at 20, t at
    # 24, and frees the temporaries at 25.
    ta, la = make(
        [B(2, freed_after=2, name="g"), B(1, name="u"), B(1, name="t")],
        [Call([], [0, 1], 4), Call([1], [2]), Call([], []), Call([2], [])],
        "A",
    )
    tb, lb = make([B(2, name="x")], [Call([], [0]), Call([0], [])], "B")
    jobs = [
        Job(ta, plan(ta, Release(2, 1), Recompute(2, 3, (0, 1)))),
        Job(tb, arrival_s=0.0105, iterations=1),
    ]
    lat = _PerJob({ta: la, tb: lb})
    p = run(jobs, gpu(), lat, iterations=2, budget=5 * MiB, oom="passive")
    assert [j.oom for j in p.result.jobs] == [False, False]
    assert [e for e in fmt(p.result.log, job=True) if e[2].startswith(("evict", "recomp"))] == [
        (0, 6.0, "recompute_start", 0, 2),
        (0, 10.0, "recompute_end", 0, 2),
        (0, 10.0, "recompute_start", 1, 2),
        (0, 10.5, "evict_start", -1, 0, "lane0"),
        (0, 11.0, "recompute_end", 1, 2),
        (0, 12.5, "evict_end", -1, 0, "lane0"),
        (0, 16.0, "evict_start", 1, 0, "lane0"),
        (0, 18.0, "evict_end", 1, 0, "lane0"),
        (0, 20.0, "recompute_start", 0, 2),
        (0, 24.0, "recompute_end", 0, 2),
        (0, 24.0, "recompute_start", 1, 2),
        (0, 25.0, "recompute_end", 1, 2),
    ]
    assert p.curve(0) == [
        (0.0, 2), (0.0, 3), (4.0, 4), (5.0, 3), (5.0, 2), (6.0, 0),  # it0: g, u, t, ...
        (6.0, 2), (6.0, 3), (10.0, 4), (11.0, 3),  # the chain: g, u, t; u freed
        (12.0, 2), (12.0, 4), (12.0, 5),  # t freed; it1: g, u
        (12.5, 3),  # the copy of the chain's g ends
        (18.0, 1), (18.0, 2), (19.0, 1), (19.0, 0),  # g evicted, t made; u, t gone
        (20.0, 2), (20.0, 3), (24.0, 4), (25.0, 2), (25.0, 1), (26.0, 0),  # chain, op3
    ]  # fmt: skip
    assert p.curve(1) == [(12.5, 2), (18.0, 0)]
    assert p.result.peak_bytes == 5 * MiB
    check_lifetimes(p)


def test_a_dead_source_remade_by_its_own_recompute_dies_with_the_chain():
    # s (2 MiB) is made by op0 and read by op1, which makes t (1 MiB), read by
    # op3; 1 ms per op. t is released after op1 and recomputed for op3 by op1,
    # whose source s the framework freed after op1: s has its own Recompute
    # (op0) before op3, nested. it0: s at 0, t at 1, s freed and t released
    # at 2; op3 due at 3: s made again (3->4), t (4->5); s's life ends with
    # the chain at 5 -- it is not left on the device for it1 to make again.
    t, lat = make([B(2), B(1)], [Call([], [0]), Call([0], [1]), Call([], []), Call([1], [])])
    p = run(
        [Job(t, plan(t, Release(1, 1), Recompute(1, 3, (1,)), Recompute(0, 3, (0,))))],
        gpu(),
        lat,
        iterations=2,
    )
    it = [(0, 2), (1, 3), (2, 1), (2, 0), (3, 2), (4, 3), (5, 1), (6, 0)]
    assert p.curve() == [(float(dt), b) for dt, b in it] + [(6.0 + dt, b) for dt, b in it]
    recomputes = [e for e in fmt(p.result.log) if e[1].startswith("recompute")]
    assert recomputes[:4] == [
        (3.0, "recompute_start", 0, 0),
        (4.0, "recompute_end", 0, 0),
        (4.0, "recompute_start", 1, 1),
        (5.0, "recompute_end", 1, 1),
    ]
    assert iteration_end_bytes(p) == [0, 0]
    j = p.result.jobs[0]
    assert (j.iteration_times_s, j.recompute_s) == ((0.006, 0.006), 0.004)
    check_lifetimes(p)


# ---- property: any planner, random steps, µs or ms ops ------------------------------
V100 = load_hardware("v100-sxm2-16gb")
PLANNERS = ["release_only", "vdnn", "checkpoint", "tensile"]


def _plan(name: str, trace) -> PlanResult:
    """The planner's result, its plans accepted by `planners.core.check`."""
    res = registry.run(name, [trace], DeviceModel(V100, Measured()))
    for plan_, t in zip(res.plans, [trace]):
        check_plan(plan_, t)
    return res


@pytest.mark.parametrize("name", PLANNERS)
def test_every_iteration_returns_its_memory(name):
    @settings(
        max_examples=30,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )
    @given(
        n_ops=st.integers(10, 80),
        seed=st.integers(0, 2**32 - 1),
        unit=st.sampled_from([Grain.US, Grain.MS]),
        dropout=st.booleans(),
    )
    def prop(n_ops, seed, unit, dropout):
        t = synthetic.random_dag(n_ops, seed=seed, dropout=dropout, durations=Durations(unit, 1, 9))
        res = _plan(name, t)
        if not res.plans:
            reject()
        p = run([Job(t, res.plans[0])], V100, Measured(), iterations=3)
        assert not p.result.oom
        assert all(math.isfinite(x) for x in p.result.jobs[0].iteration_times_s)
        check_lifetimes(p)

    prop()

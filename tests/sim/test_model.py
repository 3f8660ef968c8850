"""Hand-worked simulations: exact event orders, times and memory.

Every case uses `handtraces`: MiB sizes, 1 MiB/ms in both directions, op
durations in ms. The expected logs were worked out on paper first; the
comments give the reasoning.
"""

from __future__ import annotations

import numpy as np
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import LatencyModel
from memplan.planners.core.plan import Plan, Recompute, Release, SwapIn, SwapOut, empty_plan
from memplan.sim import Job, simulate
from memplan.traces.io import fingerprint

from tests.sim.handtraces import B, Call, MiB, fmt, gpu, make


def plan(trace, *events) -> Plan:
    return Plan(fingerprint(trace), events)


# a (2 MiB) is made by op0 and read by op3; op1 and op2 take 3 ms each.
def swap_chain():
    return make(
        [B(2), B(1, freed_after=3), B(1)],
        [Call([], [0], 1), Call([], [1], 3), Call([], [2], 3), Call([0], [], 1)],
    )


def test_swap_hidden_behind_compute():
    # D2H 1->3 while op1 runs 1->4; H2D 4->6 while op2 runs 4->7: op3 never waits.
    t, lat = swap_chain()
    r = simulate(
        [Job(t, plan(t, SwapOut(0, 0), SwapIn(0, 1, 3)))], DeviceModel(gpu(), lat), iterations=1
    )
    assert fmt(r.log) == [
        (0.0, "iter_start", -1, -1),
        (0.0, "op_start", 0, -1),
        (1.0, "op_end", 0, -1),
        (1.0, "op_start", 1, -1),
        (1.0, "swap_out_start", 0, 0, "lane0"),
        (3.0, "swap_out_end", 0, 0, "lane0"),
        (4.0, "op_end", 1, -1),
        (4.0, "op_start", 2, -1),
        (4.0, "swap_in_start", 1, 0, "lane0"),
        (6.0, "swap_in_end", 1, 0, "lane0"),
        (7.0, "op_end", 2, -1),
        (7.0, "op_start", 3, -1),
        (8.0, "op_end", 3, -1),
        (8.0, "iter_end", -1, -1),
    ]
    j = r.jobs[0]
    assert j.iteration_times_s == (0.008,)
    assert (j.stall_s, j.recompute_s, j.passive_swaps) == (0.0, 0.0, 0)
    assert (j.bytes_d2h, j.bytes_h2d) == (2 * MiB, 2 * MiB)
    # a leaves at 3 (copy end) and is back at 4 (copy start)
    assert (r.memory.t_s * 1e3).tolist() == [0, 1, 3, 4, 4, 7, 8, 8]
    assert (r.memory.bytes // MiB).tolist() == [2, 3, 1, 2, 4, 3, 1, 0]


def test_late_swap_in_stalls_compute():
    # The swap-in is triggered only when op2 ends (7): op3 waits for it 7->9.
    t, lat = swap_chain()
    r = simulate(
        [Job(t, plan(t, SwapOut(0, 0), SwapIn(0, 2, 3)))], DeviceModel(gpu(), lat), iterations=1
    )
    assert fmt(r.log)[6:] == [
        (4.0, "op_end", 1, -1),
        (4.0, "op_start", 2, -1),
        (7.0, "op_end", 2, -1),
        (7.0, "stall_start", 3, 0),
        (7.0, "swap_in_start", 2, 0, "lane0"),
        (9.0, "swap_in_end", 2, 0, "lane0"),
        (9.0, "stall_end", 3, 0),
        (9.0, "op_start", 3, -1),
        (10.0, "op_end", 3, -1),
        (10.0, "iter_end", -1, -1),
    ]
    assert r.jobs[0].stall_s == 0.002
    assert r.jobs[0].iteration_time_s == 0.010


def test_swap_out_deadline_waits_for_the_copy():
    # The copy of a runs 1->3; op1 may not start before it ends: stall 1->3,
    # and op1 takes its output when a is gone (1 MiB, not 3). Then op1 3->6,
    # op2 6->9 (the swap-in 6->8 hides), op3 9->10.
    t, lat = swap_chain()
    out = SwapOut(0, 0, before_op=1)
    r = simulate([Job(t, plan(t, out, SwapIn(0, 1, 3)))], DeviceModel(gpu(), lat), iterations=1)
    assert fmt(r.log)[:9] == [
        (0.0, "iter_start", -1, -1),
        (0.0, "op_start", 0, -1),
        (1.0, "op_end", 0, -1),
        (1.0, "stall_start", 1, 0),
        (1.0, "swap_out_start", 0, 0, "lane0"),
        (3.0, "swap_out_end", 0, 0, "lane0"),
        (3.0, "stall_end", 1, 0),
        (3.0, "op_start", 1, -1),
        (6.0, "op_end", 1, -1),
    ]
    j = r.jobs[0]
    assert (j.stall_s, j.iteration_time_s) == (0.002, 0.010)
    assert (r.memory.t_s[:3] * 1e3).tolist() == [0, 3, 3]
    assert (r.memory.bytes[:3] // MiB).tolist() == [2, 0, 1]
    # without the deadline op1 starts at 1 with a still there: 3 MiB
    free = simulate(
        [Job(t, plan(t, SwapOut(0, 0), SwapIn(0, 1, 3)))], DeviceModel(gpu(), lat), iterations=1
    )
    assert (free.memory.bytes[:2] // MiB).tolist() == [2, 3]
    assert free.jobs[0].stall_s == 0.0


def test_a_deadline_past_the_copy_does_not_wait():
    # the copy ends at 3, op2 starts at 4: no stall, the same log as without
    t, lat = swap_chain()
    events = (SwapOut(0, 0, before_op=2), SwapIn(0, 1, 3))
    r = simulate([Job(t, plan(t, *events))], DeviceModel(gpu(), lat), iterations=1)
    plain = simulate(
        [Job(t, plan(t, SwapOut(0, 0), SwapIn(0, 1, 3)))], DeviceModel(gpu(), lat), iterations=1
    )
    assert fmt(r.log) == fmt(plain.log)
    assert r.jobs[0].stall_s == 0.0


def test_delay_shifts_the_trigger():
    # SwapOut 0.5 ms after op0: 1.5->3.5. SwapIn 2 ms after op1 (4): starts at
    # 6, ends at 8 -> op3 (due at 7) stalls 1 ms.
    t, lat = swap_chain()
    p = plan(t, SwapOut(0, 0, delay_us=500), SwapIn(0, 1, 3, delay_us=2000))
    r = simulate([Job(t, p)], DeviceModel(gpu(), lat), iterations=1)
    copies = [e for e in fmt(r.log) if "swap" in e[1] or "stall" in e[1]]
    assert copies == [
        (1.5, "swap_out_start", 0, 0, "lane0"),
        (3.5, "swap_out_end", 0, 0, "lane0"),
        (6.0, "swap_in_start", 1, 0, "lane0"),
        (7.0, "stall_start", 3, 0),
        (8.0, "swap_in_end", 1, 0, "lane0"),
        (8.0, "stall_end", 3, 0),
    ]
    assert r.jobs[0].stall_s == 0.001


# Job A swaps a0 out after op0 and back in after op1 (op1 4 ms, so the swap-in
# at 5 makes op2 wait). Job B arrives at 5 ms, while A is stalled, and swaps b0
# out after its op0 (at 6), right while A's swap-in is copying.
def two_jobs():
    ta, lat_a = make([B(2), B(1)], [Call([], [0], 1), Call([], [1], 4), Call([0], [], 1)], "A")
    tb, lat_b = make(
        [B(2, freed_after=2), B(1)], [Call([], [0], 1), Call([], [1], 4), Call([1], [], 1)], "B"
    )
    jobs = [
        Job(ta, plan(ta, SwapOut(0, 0), SwapIn(0, 1, 2))),
        Job(tb, plan(tb, SwapOut(0, 0)), arrival_s=0.005),
    ]
    return jobs, _PerJob({ta: lat_a, tb: lat_b})


class _PerJob(LatencyModel):
    """Each trace its own fixed latencies."""

    name = "per-job"

    def __init__(self, by_trace):
        self.by_trace = by_trace

    def predict_all(self, trace, hw, usage=0.0):
        return self.by_trace[trace].predict_all(trace, hw, usage)


def test_two_jobs_contend_for_one_lane():
    # lanes=1: A's H2D holds the lane 5->7, so B's D2H waits until 7 (7->9).
    # Compute: B runs op0 5->6 and op1 6->10 while A waits; A's op2 then 10->11
    # (queued since 7), B's op2 11->12.
    jobs, lat = two_jobs()
    r = simulate(jobs, DeviceModel(gpu(), lat, lanes=1), iterations=1)
    copies = [e for e in fmt(r.log, job=True) if len(e) == 6]
    assert copies == [
        (0, 1.0, "swap_out_start", 0, 0, "lane0"),
        (0, 3.0, "swap_out_end", 0, 0, "lane0"),
        (0, 5.0, "swap_in_start", 1, 0, "lane0"),
        (0, 7.0, "swap_in_end", 1, 0, "lane0"),
        (1, 7.0, "swap_out_start", 0, 0, "lane0"),
        (1, 9.0, "swap_out_end", 0, 0, "lane0"),
    ]
    ops = [(e[0], e[1], e[3]) for e in fmt(r.log, job=True) if e[2] == "op_start"]
    assert ops == [(0, 0.0, 0), (0, 1.0, 1), (1, 5.0, 0), (1, 6.0, 1), (0, 10.0, 2), (1, 11.0, 2)]
    a, b = r.jobs
    assert (a.iteration_time_s, a.stall_s) == (0.011, 0.002)
    assert (b.start_s, b.iteration_time_s, b.stall_s) == (0.005, 0.007, 0.0)
    assert r.lanes == ("pcie",)


def test_two_jobs_do_not_contend_with_a_lane_per_direction():
    # lanes=2: B's D2H starts at once (6->8) on its own lane; while it runs A's
    # H2D moves at half speed: 1 MiB in 5->6, the second MiB in 6->8.
    jobs, lat = two_jobs()
    r = simulate(jobs, DeviceModel(gpu(), lat, lanes=2), iterations=1)
    copies = [e for e in fmt(r.log, job=True) if len(e) == 6]
    assert copies == [
        (0, 1.0, "swap_out_start", 0, 0, "lane1"),
        (0, 3.0, "swap_out_end", 0, 0, "lane1"),
        (0, 5.0, "swap_in_start", 1, 0, "lane0"),
        (1, 6.0, "swap_out_start", 0, 0, "lane1"),
        (1, 8.0, "swap_out_end", 0, 0, "lane1"),
        (0, 8.0, "swap_in_end", 1, 0, "lane0"),
    ]
    a, b = r.jobs
    assert (a.iteration_time_s, a.stall_s) == (0.011, 0.003)
    assert b.iteration_time_s == 0.007
    assert r.lanes == ("h2d", "d2h")


def test_recompute_time_is_added_and_bytes_retaken():
    # x (1) -> op0 -> a (2) -> op1 (2 ms) -> b (1) -> op2 -> c (1); op3 reads a and c.
    # a is released after op1 and recomputed (op0 again, 1 ms) before op3.
    t, lat = make(
        [B(1, "input", freed_after=3), B(2), B(1), B(1)],
        [Call([0], [1], 1), Call([1], [2], 2), Call([2], [3], 1), Call([1, 3], [], 1)],
    )
    r = simulate(
        [Job(t, plan(t, Release(1, 1), Recompute(1, 3, (0,))))],
        DeviceModel(gpu(), lat),
        iterations=1,
    )
    assert fmt(r.log) == [
        (0.0, "iter_start", -1, -1),
        (0.0, "op_start", 0, -1),
        (1.0, "op_end", 0, -1),
        (1.0, "op_start", 1, -1),
        (3.0, "op_end", 1, -1),
        (3.0, "release", 1, 1),
        (3.0, "op_start", 2, -1),
        (4.0, "op_end", 2, -1),
        (4.0, "recompute_start", 0, 1),
        (5.0, "recompute_end", 0, 1),
        (5.0, "op_start", 3, -1),
        (6.0, "op_end", 3, -1),
        (6.0, "iter_end", -1, -1),
    ]
    j = r.jobs[0]
    assert (j.iteration_time_s, j.recompute_s, j.stall_s) == (0.006, 0.001, 0.0)
    # x+a, +b, -a (release), +c, -b, +a (recompute, at 4), then the end
    assert (r.memory.bytes // MiB).tolist()[:7] == [1, 3, 4, 2, 3, 2, 4]
    assert r.memory.t_s[6] == 0.004
    assert j.peak_bytes == 4 * MiB
    vanilla = simulate([t], DeviceModel(gpu(), lat), iterations=1)
    assert vanilla.jobs[0].peak_bytes == 5 * MiB  # op2 holds x, a, b, c


# a (2 MiB, op0 -> op3) and b (2 MiB, op1 -> op2) under a 3 MiB budget.
def param_step():
    return make(
        [
            B(2, "param"),
            B(1, "input", freed_after=0),
            B(2),
            B(2, "grad"),
            B(1, "other"),
            B(6, "other"),
        ],
        [
            Call([0, 1], [2], 1),
            Call([2], [3], 2, "backward"),
            Call([3, 0], [0], 1, "optimizer"),
            Call([], [4], 3, "optimizer"),
            Call([], [5], 4, "optimizer"),
        ],
    )


def test_cross_iteration_parameter_swap():
    # it0: ops 0-1, 1-3, 3-4, 4-7, 7-11; p copies out 4->6 (gone before q at 7),
    # back in 11->13 for it1, whose op0 waits for it (stall 2 ms). it1 updates p
    # again, so its swap-out copies again (the old host copy is stale); the
    # swap-in of the last iteration serves no iteration and never starts.
    t, lat = param_step()
    p = plan(t, SwapOut(0, 2), SwapIn(0, 4, 0, next_iteration=True))
    r = simulate([Job(t, p)], DeviceModel(gpu(), lat), iterations=2)
    events = [e for e in fmt(r.log) if e[1] not in ("op_start", "op_end")]
    assert events == [
        (0.0, "iter_start", -1, -1),
        (4.0, "swap_out_start", 2, 0, "lane0"),
        (6.0, "swap_out_end", 2, 0, "lane0"),
        (11.0, "iter_end", -1, -1),
        (11.0, "iter_start", -1, -1),
        (11.0, "stall_start", 0, 0),
        (11.0, "swap_in_start", 4, 0, "lane0"),
        (13.0, "swap_in_end", 4, 0, "lane0"),
        (13.0, "stall_end", 0, 0),
        (17.0, "swap_out_start", 2, 0, "lane0"),
        (19.0, "swap_out_end", 2, 0, "lane0"),
        (24.0, "iter_end", -1, -1),
    ]
    j = r.jobs[0]
    assert j.iteration_times_s == (0.011, 0.013)
    assert (j.iteration_time_s, j.stall_s) == (0.013, 0.002)
    assert (j.bytes_d2h, j.bytes_h2d) == (4 * MiB, 2 * MiB)
    assert j.peak_bytes == 6 * MiB  # p + a + g in op1; q alone in op4
    assert simulate([t], DeviceModel(gpu(), lat)).jobs[0].peak_bytes == 8 * MiB  # p + q


def test_host_copy_is_kept_until_a_write():
    # a is swapped out, in, and out again with no write in between: the second
    # swap-out only drops the device copy (discard), no bytes move.
    t, lat = make(
        [B(2), B(1), B(1)],
        [Call([], [0]), Call([], [1], 4), Call([0], []), Call([], [2], 4), Call([0], [])],
    )
    p = plan(t, SwapOut(0, 0), SwapIn(0, 1, 2), SwapOut(0, 2), SwapIn(0, 3, 4))
    r = simulate([Job(t, p)], DeviceModel(gpu(), lat), iterations=1)
    kinds = [e[1] for e in fmt(r.log) if e[3] == 0 and "stall" not in e[1]]
    assert kinds == ["swap_out_start", "swap_out_end", "swap_in_start", "swap_in_end",
                     "discard", "swap_in_start", "swap_in_end"]  # fmt: skip
    assert (r.jobs[0].bytes_d2h, r.jobs[0].bytes_h2d) == (2 * MiB, 4 * MiB)


def test_framework_free_during_a_swap_out_waits_for_the_copy():
    # a (2 MiB) is dead after op1 (freed_after=1, at 2 ms) but its copy runs
    # 1->3: the bytes come back at 3, when the copy ends.
    t, lat = make([B(2, freed_after=1), B(1)], [Call([], [0]), Call([], [1]), Call([1], [], 5)])
    r = simulate([Job(t, plan(t, SwapOut(0, 0)))], DeviceModel(gpu(), lat), iterations=1)
    assert list(zip((r.memory.t_s * 1e3).tolist(), (r.memory.bytes // MiB).tolist())) == [
        (0.0, 2), (1.0, 3), (3.0, 1), (7.0, 0),
    ]  # fmt: skip
    # with a 5 ms delay the copy has not started when a dies: freed at 2, no copy
    r = simulate([Job(t, plan(t, SwapOut(0, 0, 5000)))], DeviceModel(gpu(), lat), iterations=1)
    assert list(zip((r.memory.t_s * 1e3).tolist(), (r.memory.bytes // MiB).tolist())) == [
        (0.0, 2), (1.0, 3), (2.0, 1), (7.0, 0),
    ]  # fmt: skip
    assert r.jobs[0].bytes_d2h == 0
    assert (6.0, "skip", 0, 0) in fmt(r.log)


def test_sharing_is_the_compute_queue_not_a_usage_stretch():
    class Stretch(LatencyModel):
        name = "stretch"

        def predict_all(self, trace, hw, usage=0.0):
            return np.full(trace.n_ops, 0.002 * (1 + usage))

    t, _ = make([B(1)], [Call([], [0]), Call([0], [])])
    r = simulate([t, t], DeviceModel(gpu(), Stretch()), iterations=1)
    # kernels alternate FIFO and each holds the device alone: 2 ms per op, not
    # stretched for the other job (hwmodels NOTE [ Usage under a compute queue ])
    ops = [(e[0], e[1]) for e in fmt(r.log, job=True) if e[2] == "op_start"]
    assert ops == [(0, 0.0), (1, 2.0), (0, 4.0), (1, 6.0)]
    assert [j.end_s for j in r.jobs] == [0.006, 0.008]


def test_same_inputs_same_result():
    from memplan.traces.synthetic import random_dag

    t = random_dag(120, seed=3, dropout=True)
    from memplan.hwmodels.latency import Fixed
    from memplan.planners.heuristics.vanilla import release_only_plan

    lat = Fixed(np.linspace(1e-4, 1e-3, t.n_ops))
    budget = int(t.peak("liveness")[0] * 0.8)
    runs = [
        simulate([Job(t, release_only_plan(t)), Job(t, arrival_s=0.002)], DeviceModel(gpu(4096), lat), budget=budget * 2, oom="passive")
        for _ in range(2)
    ]  # fmt: skip
    a, b = runs
    assert a.log == b.log
    assert a.jobs == b.jobs
    assert np.array_equal(a.memory.bytes, b.memory.bytes)
    assert np.array_equal(a.memory.t_s, b.memory.t_s)
    assert a.n_events == b.n_events


def test_empty_plan_equals_no_plan():
    t, lat = swap_chain()
    a = simulate([Job(t, empty_plan(t))], DeviceModel(gpu(), lat))
    b = simulate([t], DeviceModel(gpu(), lat))
    assert a.log == b.log


def test_write_during_a_swap_out_keeps_the_buffer_and_stales_the_copy():
    # Unchecked plan: op2 (2->4) updates a in place while its copy runs (1->3).
    # The copy completes but a stays (op2 uses it) and its host copy is stale,
    # so the second swap-out (4->6) copies again instead of discarding.
    t, lat = make(
        [B(2), B(1), B(1)],
        [Call([], [0]), Call([], [1]), Call([0], [0], 2), Call([1], [2], 3), Call([0, 2], [])],
    )
    p = plan(t, SwapOut(0, 0), SwapOut(0, 2), SwapIn(0, 3, 4))
    r = simulate([Job(t, p)], DeviceModel(gpu(), lat), iterations=1, check=False)
    copies = [e[:2] for e in fmt(r.log) if e[3] == 0 and "swap" in e[1]]
    assert copies == [
        (1.0, "swap_out_start"), (3.0, "swap_out_end"),  # a stays: op2 uses it
        (4.0, "swap_out_start"), (6.0, "swap_out_end"),  # copied again: op2 wrote it
        (7.0, "swap_in_start"), (9.0, "swap_in_end"),
    ]  # fmt: skip
    assert r.jobs[0].bytes_d2h == 4 * MiB


def test_a_write_at_the_end_of_an_op_stales_a_copy_that_began_during_it():
    # Unchecked plan: op1 (1->4) updates a in place; a's swap-out waits 2 ms
    # after op0 and copies 3->5, so op1's write as it ends (4) lands inside
    # the copy: a stays (op2 uses it) with a stale host copy, and the second
    # swap-out (after op2, 6->8) copies again instead of discarding (the
    # swap-in for op4 finds it leaving and keeps it). Only the end-of-op pass
    # sees this write while the copy moves (NOTE [ Writes during a copy ] in
    # sim/copies.py).
    t, lat = make(
        [B(2), B(1)],
        [Call([], [0]), Call([0], [0], 3), Call([0], [], 2), Call([], [1]), Call([0, 1], [])],
    )
    p = plan(t, SwapOut(0, 0, delay_us=2000.0), SwapOut(0, 2), SwapIn(0, 3, 4))
    r = simulate([Job(t, p)], DeviceModel(gpu(), lat), iterations=1, check=False)
    moves = ("swap_out_start", "swap_out_end", "discard", "swap_in_start", "swap_in_end")
    copies = [e[:2] for e in fmt(r.log) if e[1] in moves]
    assert copies == [
        (3.0, "swap_out_start"), (5.0, "swap_out_end"),  # a stays: op2 uses it
        (6.0, "swap_out_start"), (8.0, "swap_out_end"),  # copied again: op1 wrote it at 4
    ]  # fmt: skip
    assert r.jobs[0].bytes_d2h == 4 * MiB


def test_host_copy_dies_with_the_buffer():
    # a is swapped out for good (never read again) and freed by the framework
    # after op2: a swap-in after that has nothing to read (unchecked plan).
    t, lat = make(
        [B(2, freed_after=2), B(1)], [Call([], [0]), Call([], [1]), Call([1], []), Call([1], [])]
    )
    r = simulate(
        [Job(t, plan(t, SwapOut(0, 0), SwapIn(0, 2, 3)))],
        DeviceModel(gpu(), lat),
        iterations=1,
        check=False,
    )
    assert (3.0, "skip", 2, 0) in fmt(r.log)
    assert r.jobs[0].bytes_h2d == 0


def test_no_barrier_at_the_iteration_boundary():
    # a's copy (1->3) is still running when iteration 0 ends at 2 and op0 of
    # iteration 1 makes a new a: both are on the device until the old copy
    # ends at 3. The framework's free of the new a (at 4) waits for its copy (3->5).
    t, lat = make([B(2, freed_after=1), B(1)], [Call([], [0]), Call([], [1])])
    r = simulate([Job(t, plan(t, SwapOut(0, 0)))], DeviceModel(gpu(), lat), iterations=2)
    curve = list(zip((r.memory.t_s * 1e3).tolist(), (r.memory.bytes // MiB).tolist()))
    assert curve == [
        (0.0, 2), (1.0, 3), (2.0, 2), (2.0, 4), (3.0, 2), (3.0, 3), (4.0, 2), (5.0, 0),
    ]  # fmt: skip
    assert r.jobs[0].iteration_times_s == (0.002, 0.002)
    assert (r.peak_bytes, simulate([t], DeviceModel(gpu(), lat)).peak_bytes) == (4 * MiB, 3 * MiB)

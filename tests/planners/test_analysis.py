"""The shared planner machinery on tiny hand traces: every number below is
worked out by hand (1 MiB copies take 1 ms each way, ops whole ms)."""

from __future__ import annotations

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel, Direction
from memplan.hwmodels.latency import Fixed
from memplan.hwmodels.profile import Hardware
from memplan.planners.analysis import (
    BOTH,
    FIRST,
    STEADY,
    LaneSet,
    MemoryState,
    access_table,
    as_traces,
    check_budget,
    memory_of_plan,
    peak_analysis,
    predict_timeline,
    predict_timelines,
)
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Plan, SwapIn, SwapOut, fingerprint_of
from memplan.traces import io
from memplan.traces.model import Buffer, BufferKind, Op, Phase, Trace, TraceMeta, View

# ---- hand traces: whole MiB, whole ms, copies of 1 MiB per ms ------------------------
MiB = 1 << 20
H2D, D2H = Direction.H2D, Direction.D2H
HAND_PERSISTENT = (BufferKind.PARAM, BufferKind.OPTIMIZER_STATE)


def gpu(memory_mib: int = 1024, mib_per_ms: float = 1.0) -> Hardware:
    """A device whose copies move `mib_per_ms` MiB per ms each way, no fixed cost."""
    return Hardware(
        name="hand-gpu",
        memory_bytes=memory_mib * MiB,
        h2d_bytes_per_s=1000.0 * MiB * mib_per_ms,
        d2h_bytes_per_s=1000.0 * MiB * mib_per_ms,
        transfer_fixed_s=0.0,
        copy_engines=2,
        h2d_duplex_factor=0.5,
        peak_flops={"float32": 1e12},
        mem_bw_bytes_per_s=1e11,
        launch_overhead_s=0.0,
    )


def B(mib: int, kind: str = "activation") -> tuple[int, BufferKind]:
    """A buffer of `mib` MiB; non-persistent ones die after their last access."""
    return mib, BufferKind(kind)


def O(reads, writes, ms: float = 1.0, phase: str = "forward", rng: bool = False):  # noqa: E743
    """An op reading and writing buffer ids, running `ms` milliseconds."""
    return tuple(reads), tuple(writes), ms, Phase(phase), rng


def make(buffers, ops, name: str = "hand") -> tuple[Trace, Fixed]:
    """A validated trace (one view per buffer) and the fixed latencies of its ops."""
    last: dict[int, int] = {}
    for i, (reads, writes, *_rest) in enumerate(ops):
        for b in (*reads, *writes):
            last[b] = i
    bufs = []
    for i, (mib, kind) in enumerate(buffers):
        persistent = kind in HAND_PERSISTENT
        freed = None if persistent else last[i]
        bufs.append(Buffer(i, mib * MiB, kind, persistent, f"b{i}", freed))
    views = tuple(View(i, i, (b.nbytes // 4,), (1,), 0, "float32") for i, b in enumerate(bufs))
    trace_ops = tuple(
        Op(i, f"aten.op{i}.default", ph, r, w, duration_us=ms * 1000, rng=rng)
        for i, (r, w, ms, ph, rng) in enumerate(ops)
    )
    trace = Trace(TraceMeta(name, 1), tuple(bufs), views, trace_ops)
    trace = io.from_dict(io.to_dict(trace))  # the loader's validation
    return trace, Fixed([o[2] * 1e-3 for o in ops])


HW = gpu()


def four_ops():
    """b0 input (1), b1 (4), b2 (1), b3 (1) MiB; ops of 1, 1, 5, 1 ms.

    op0: b0 -> b1;  op1: b1 -> b2;  op2: b2 -> b3;  op3: b3, b1 -> (nothing)
    Resident (liveness): op0 b0 b1 = 5, op1 b1 b2 = 5, op2 b1 b2 b3 = 6,
    op3 b1 b3 = 5 MiB: the peak is 6 MiB at op 2.
    """
    return make(
        [B(1, "input"), B(4), B(1), B(1)],
        [O([0], [1], 1), O([1], [2], 1), O([2], [3], 5), O([3, 1], [], 1)],
    )


def test_timeline_of_one_job():
    t, lat = four_ops()
    tl = predict_timeline(t, DeviceModel(HW, lat))
    assert tl.start_us.tolist() == [0, 1000, 2000, 7000]
    assert tl.end_us.tolist() == [1000, 2000, 7000, 8000]
    assert tl.ready_us.tolist() == tl.start_us.tolist()  # alone: ready = start
    assert tl.period_us == 8000
    assert tl.iteration_start(1) == 8000
    assert tl.unrolled_start(1, 1) == 9000


def test_timeline_of_two_jobs_follows_the_fifo_compute_queue():
    # A: ops of 1 and 1 ms; B: one op of 2 ms. The queue runs A0 [0,1),
    # B0 [1,3) (asked at 0), A1 [3,4), B0' [4,6) (asked at 3), A0' [6,7), A1' [7,8)
    a, _ = make([B(1), B(1)], [O([], [0], 1), O([0], [1], 1)], "a")
    b, _ = make([B(1)], [O([], [0], 2)], "b")

    class PerTrace(Fixed):
        def predict_all(self, trace, hw, usage=0.0):
            return np.array([1e-3, 1e-3]) if trace.meta.model == "a" else np.array([2e-3])

    ta, tb = predict_timelines([a, b], DeviceModel(HW, PerTrace([0.0])))
    assert ta.start_us.tolist() == [0, 3000] and ta.end_us.tolist() == [1000, 4000]
    assert ta.ready_us.tolist() == [0, 1000]  # A waits from 1 to 3 for compute
    assert ta.period_us == 6000
    assert tb.start_us.tolist() == [1000] and tb.end_us.tolist() == [3000]
    assert tb.period_us == 3000  # B's op 0 starts at 1, then at 4


def test_trigger_of_a_time():
    t, lat = four_ops()
    tl = predict_timeline(t, DeviceModel(HW, lat))
    assert tl.trigger(2500) == (1, 500, 0)  # op 1 ends at 2000
    assert tl.trigger(500) == (-1, 500, 0)  # before op 0 ends: the iteration start
    assert tl.trigger(8500) == (-1, 500, 1)  # iteration 1 starts at 8000
    assert tl.trigger(9500) == (0, 500, 1)
    with pytest.raises(ValueError):
        tl.trigger(2500, not_before_us=2600)


def test_ops_within_a_time_window():
    t, lat = four_ops()
    tl = predict_timeline(t, DeviceModel(HW, lat))
    assert tl.ops_within(1000, 7000) == [(1, 2, 0)]
    assert tl.ops_within(1500, 7000) == [(2, 2, 0)]
    assert tl.ops_within(7000, 10000) == [(3, 3, 0), (0, 1, 1)]


def test_peak_analysis_of_one_job():
    t, lat = four_ops()
    st = MemoryState(t)
    assert (st.curve // MiB).tolist() == [5, 5, 6, 5]
    pa = peak_analysis([st], [predict_timeline(t, DeviceModel(HW, lat))])
    assert pa.peak_bytes == 6 * MiB
    assert pa.job_peak_op == (2,)
    assert pa.job_peak_time_us == (2000.0,)
    assert pa.resident[0].tolist() == [1, 2, 3]
    assert pa.last_input_op == (2,)


def test_peak_analysis_sums_the_jobs_peaks():
    t, _ = four_ops()
    pa = peak_analysis([MemoryState(t), MemoryState(t, "framework")])
    assert pa.peak_bytes == 12 * MiB
    assert pa.job_peak_bytes == (6 * MiB, 6 * MiB)


def test_a_hole_lowers_the_curve_and_leaves_the_resident_set():
    t, _ = four_ops()
    st = MemoryState(t)
    assert st.add_hole(1, 1, 2)
    assert (st.curve // MiB).tolist() == [5, 1, 2, 5]
    assert st.resident_at(2).tolist() == [2, 3]
    assert st.peak() == (5 * MiB, 0)
    assert not st.add_hole(3, 0, 1)  # b3 is not alive before op 2: nothing left


def test_first_and_steady_curves_of_a_persistent_buffer():
    # a weight (2 MiB) read by op 0 and op 2 of three
    t, _ = make([B(2, "param"), B(1)], [O([0], [1]), O([1], []), O([0], [])])
    st = MemoryState(t)
    assert st.add_hole(0, 1, 1, BOTH)
    assert st.add_hole(0, 0, 0, STEADY)  # a hole only after iteration 0
    assert (st.first // MiB).tolist() == [3, 1, 2]
    assert (st.steady // MiB).tolist() == [1, 1, 2]
    assert st.peak() == (3 * MiB, 0)  # iteration 0 counts
    steady = MemoryState(t, count_first_iteration=False)
    steady.add_hole(0, 0, 0, STEADY)
    steady.add_hole(0, 1, 1, FIRST)
    assert steady.peak() == (3 * MiB, 1)
    assert st.resident_at(0).tolist() == [0, 1] and st.resident_at(0, steady=True).tolist() == [1]


def test_access_gaps_and_writes():
    # n = 8 ops; a persistent weight read by op 1, written by op 5
    ops = [O([], []) for _ in range(8)]
    ops[1] = O([0], [1])
    ops[5] = O([0], [0])
    t, _ = make([B(1, "param"), B(1)], ops)
    tab = access_table(t)
    assert tab.accesses(0).tolist() == [1, 5]
    assert tab.writes[tab.ptr[0] : tab.ptr[1]].tolist() == [False, True]
    assert tab.gap_around(0, 3) == (0, 1, 5)
    assert tab.gap_around(0, 6) == (1, 5, 9)  # wraps into the next iteration
    assert tab.gap_around(0, 0) == (1, -3, 1)  # comes from the previous one
    assert tab.gap_around(0, 5) is None  # an access
    assert tab.gap_around(1, 3) is None  # b1 is not persistent and dead then
    assert tab.written_between(0, 0, 1)
    assert access_table(t) is tab


def test_lane_free_intervals_and_slots():
    t, lat = four_ops()
    lanes = LaneSet([predict_timeline(t, DeviceModel(HW, lat))])  # a circle of 8000 us
    assert lanes.free_intervals(0, 0, 8000, H2D) == [(0, 8000)]
    lanes.book(0, 2000, 1000, H2D)
    assert lanes.free_intervals(0, 0, 8000, H2D) == [(0, 2000), (3000, 8000)]
    assert lanes.earliest(0, 1500, 8000, 1000, H2D) == 3000
    assert lanes.latest(0, 0, 7000, 1000, H2D) == 6000
    assert lanes.latest(0, 0, 2500, 1000, H2D) == 1000
    assert lanes.earliest(0, 1500, 3900, 1000, H2D) is None
    lanes.book(0, 7500, 1000, H2D)  # wraps: busy [7500, 8000) and [0, 500)
    assert lanes.free_intervals(0, 0, 8000, H2D) == [(500, 2000), (3000, 7500)]
    assert lanes.free_intervals(0, 7000, 9000, H2D) == [(7000, 7500), (8500, 9000)]
    assert lanes.earliest(0, 7200, 20000, 400, H2D) == 8500  # the next iteration's lane
    assert lanes.is_free(0, 3000, 4500, H2D) and not lanes.is_free(0, 3000, 4600, H2D)


def test_shared_lane_replicates_a_shorter_jobs_copies():
    a, la = make([B(1)], [O([], [0], 4)], "a")  # period 4 ms
    b, lb = make([B(1)], [O([], [0], 8)], "b")  # period 8 ms
    tla, tlb = predict_timeline(a, DeviceModel(HW, la)), predict_timeline(b, DeviceModel(HW, lb))
    lanes = LaneSet([tla, tlb])
    lanes.book(0, 1000, 1000, H2D)  # A's copy recurs at 5000 within B's period
    assert lanes.free_intervals(1, 0, 8000, H2D) == [(0, 1000), (2000, 5000), (6000, 8000)]
    lanes.book(1, 6200, 1000, H2D)
    # A's slot must be free in both of its repetitions: [2000, 2500) is, but
    # [6000, 6500) is B's, so A's earliest 500 us slot after 2000 is at 3200
    assert lanes.earliest(0, 2000, 4000, 500, H2D) == pytest.approx(3200)
    own = LaneSet([tla, tlb], per_job_lane=True)
    own.book(0, 1000, 1000, H2D)
    assert own.free_intervals(1, 0, 8000, H2D) == [(0, 8000)]  # each job its own lane


def gap_chain():
    """A chain whose 2 MiB activation b1 waits through a long gap.

    b0 input 1 MiB, b1 2, b2 1, b3 1, b4 3 (a temporary nothing reads),
    b5 1, b6 1, b7 1 MiB; op durations 1, 1, 3, 2, 3, 1 ms:

        op0 b0 -> b1   [0, 1)      op3 b3 -> b4, b5  [5, 7)
        op1 b1 -> b2   [1, 2)      op4 b5 -> b6      [7, 10)
        op2 b2 -> b3   [2, 5)      op5 b6, b1 -> b7  [10, 11)

    Resident: 3, 3, 4, 7, 4, 4 MiB: the peak is op 3 (b1 b3 b4 b5), where
    only b1 is not accessed. Swapping b1 out after op 1 takes [2, 4) ms, back
    in [8, 10) ms: only op 3 runs entirely between, so the peak drops to
    5 MiB, with both copies hidden.
    """
    return make(
        [B(1, "input"), B(2), B(1), B(1), B(3), B(1), B(1), B(1)],
        [
            O([0], [1], 1),
            O([1], [2], 1),
            O([2], [3], 3),
            O([3], [4, 5], 2),
            O([5], [6], 3),
            O([6, 1], [7], 1),
        ],
    )


def cross_iteration():
    """A step whose peak is in the optimizer phase, after the weight's update.

    b0 input x 1 MiB, b1 weight w 4 (param), b2 a 1, b3 l 1, b4 grad g 1,
    b5 optimizer state s 1, b6 a 6 MiB optimizer temporary T, b7 u 1 MiB;
    op durations 1, 1, 1, 1, 5, 1, 5 ms (period 15 ms):

        op0 fwd x, w -> a  [0, 1)     op4 opt s -> s      [4, 9)
        op1 fwd a -> l     [1, 2)     op5 opt s -> T      [9, 10)
        op2 bwd l, x -> g  [2, 3)     op6 opt s -> u      [10, 15)
        op3 opt w, g -> w  [3, 4)

    Resident (w and s always): 7, 8, 8, 6, 5, 11, 6 MiB: the peak is op 5.
    w's last access is its update at op 3: swapped out [4, 8) ms and back
    [11, 15) ms, before op 0 of the next iteration, it is off the device for
    op 5, whose memory drops to 7 MiB; the peak is then 8 MiB at op 1.
    """
    return make(
        [
            B(1, "input"),
            B(4, "param"),
            B(1),
            B(1),
            B(1, "grad"),
            B(1, "optimizer_state"),
            B(6),
            B(1),
        ],
        [
            O([0, 1], [2], 1),
            O([2], [3], 1),
            O([3, 0], [4], 1, "backward"),
            O([1, 4], [1], 1, "optimizer"),
            O([5], [5], 5, "optimizer"),
            O([5], [6], 1, "optimizer"),
            O([5], [7], 5, "optimizer"),
        ],
    )


def test_hand_traces_peak_where_their_docstrings_say():
    t, _ = gap_chain()
    assert (MemoryState(t).curve // MiB).tolist() == [3, 3, 4, 7, 4, 4]
    t, _ = cross_iteration()
    assert (MemoryState(t).curve // MiB).tolist() == [7, 8, 8, 6, 5, 11, 6]


def test_memory_of_a_plan():
    t, lat = gap_chain()
    dev = DeviceModel(HW, lat)
    tl = predict_timeline(t, dev)
    fp = fingerprint_of(t)
    swap = Plan(fp, (SwapOut(1, 1), SwapIn(1, 3, 5, 999.999)))
    assert (memory_of_plan(t, tl, swap, dev).curve // MiB).tolist() == [3, 3, 4, 5, 4, 4]
    # a swap-in due after op 5 is ready counts from then (op 5 waits for it)
    late = Plan(fp, (SwapOut(1, 1), SwapIn(1, 4, 5, 5000)))
    assert (memory_of_plan(t, tl, late, dev).curve // MiB).tolist() == [3, 3, 4, 5, 4, 4]
    # never back (the checker rejects it; the analysis just counts it)
    gone = Plan(fp, (SwapOut(1, 1),))
    assert (memory_of_plan(t, tl, gone, dev).curve // MiB).tolist() == [3, 3, 4, 5, 2, 2]
    # the empty plan: the framework's frees (after the last use in hand traces)
    assert (memory_of_plan(t, tl, Plan(fp), dev).curve // MiB).tolist() == [3, 3, 4, 7, 4, 4]
    # b1's copy [2, 4) ms ends during op 2 [2, 5): b1 is counted there; with
    # op 2 as its deadline, op 2 waits for it and runs without b1 (2 MiB less)
    due = Plan(fp, (SwapOut(1, 1, before_op=2), SwapIn(1, 3, 5, 999.999)))
    assert (memory_of_plan(t, tl, due, dev).curve // MiB).tolist() == [3, 3, 2, 5, 4, 4]


def test_memory_of_a_cross_iteration_plan():
    t, lat = cross_iteration()
    dev = DeviceModel(HW, lat)
    tl = predict_timeline(t, dev)
    fp = fingerprint_of(t)
    plan = Plan(fp, (SwapOut(1, 3), SwapIn(1, 5, 0, 999.999, next_iteration=True)))
    st = memory_of_plan(t, tl, plan, dev)
    assert (st.first // MiB).tolist() == [7, 8, 8, 6, 5, 7, 6]
    assert (st.steady // MiB).tolist() == [7, 8, 8, 6, 5, 7, 6]
    # s (1 MiB) out after op 6 ([15, 16) ms) and back after op 3 of the next
    # iteration ([18, 19) ms): off for op 2 of every iteration but the first,
    # which starts with s resident
    plan = Plan(fp, (SwapOut(5, 6), SwapIn(5, 3, 4)))
    st = memory_of_plan(t, tl, plan, dev)
    assert (st.first // MiB).tolist() == [7, 8, 8, 6, 5, 11, 6]
    assert (st.steady // MiB).tolist() == [7, 8, 7, 6, 5, 11, 6]
    assert st.peak() == (11 * MiB, 5)


def test_jobs_and_budget_arguments():
    t, _ = four_ops()
    assert as_traces(t) == (t,)
    assert as_traces([t, t]) == (t, t)

    class Job:
        trace = t

    assert as_traces([Job()]) == (t,)
    with pytest.raises(PlanError, match="no jobs"):
        as_traces([])
    with pytest.raises(PlanError, match=r"jobs\[0\]"):
        as_traces([3])
    assert check_budget(None) is None and check_budget(5) == 5
    for bad in (0, -1, 1.5, True):
        with pytest.raises(PlanError, match="budget_bytes"):
            check_budget(bad)


def test_two_lanes_book_each_direction_apart():
    """With `lanes=2` a D2H booking leaves the H2D lane free (the simulator's
    one copy engine per direction); with one lane both directions share it."""
    t, lat = four_ops()
    tl = predict_timeline(t, DeviceModel(HW, lat))  # a circle of 8000 us
    two, one = LaneSet([tl], lanes=2), LaneSet([tl])
    for lanes in (two, one):
        lanes.book(0, 2000, 1000, D2H)
    assert two.free_intervals(0, 0, 8000, H2D) == [(0, 8000)]
    assert two.free_intervals(0, 0, 8000, D2H) == [(0, 2000), (3000, 8000)]
    assert one.free_intervals(0, 0, 8000, H2D) == [(0, 2000), (3000, 8000)]
    assert two.earliest(0, 1500, 8000, 1000, H2D) == 1500
    assert one.earliest(0, 1500, 8000, 1000, H2D) == 3000

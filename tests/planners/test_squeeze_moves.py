"""squeeze's moves that read the simulated run, and its finer prunes,
worked by hand on tiny traces (ops of 1 ms; the lane's speed as given)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Measured
from memplan.planners.analysis.optimes import op_durations_us, predict_timelines
from memplan.planners.core.evaluate import Evaluation, OpTimes
from memplan.planners.core.plan import Plan, Recompute, Release, SwapIn, SwapOut
from memplan.planners.search.moves import (
    Search,
    accept_batches,
    pair_prune_moves,
    plan_pairs,
    queue_moves,
    stall_moves,
    swap_moves,
    with_room,
)
from memplan.planners.search.squeeze import start_order

from memplan.evaluator import sim_evaluator
from tests.planners.bruteforce import B, Step, tiny_hw, tiny_trace


def _line(n: int = 6):
    """X (buffer 0) made by op 0 and read again by the last op; a chain of
    2 MiB buffers in between."""
    steps = [Step((), (0,))] + [Step((i - 1,), (i,)) for i in range(1, n - 1)]
    steps.append(Step((0, n - 2), ()))
    return tiny_trace([B(2)] * (n - 1), steps)


def test_plan_pairs_match_each_absence_with_its_return():
    out1, in1 = SwapOut(0, 0), SwapIn(0, 1, 3)
    rel, rec = Release(0, 3), Recompute(0, 5, (0,))
    cross = SwapIn(1, 4, 0, next_iteration=True)  # back in the next iteration: no pair
    plan = Plan("fp", (rec, in1, rel, out1, cross, SwapOut(1, 4)))
    assert sorted(plan_pairs(plan), key=lambda p: p[0].after_op) == [(out1, in1), (rel, rec)]


def test_pair_prune_offers_each_added_absence_alone_costliest_first():
    base_pair = (Release(2, 1), Recompute(2, 4, (1,)))
    cheap = (SwapOut(0, 0), SwapIn(0, 1, 3))  # buffer 0 absent twice
    dear = (Release(0, 3), Recompute(0, 5, (0,)))
    plan = Plan("fp", (*cheap, *dear, *base_pair))
    base = Plan("fp", base_pair)

    def cost(j, e):
        return 5.0 if isinstance(e, Recompute) else 1.0

    moves = pair_prune_moves([base], [plan], cost, random.Random(0))
    assert moves == [(0, dear, ()), (0, cheap, ())]


def test_a_late_swap_in_moves_earlier_by_its_wait_not_before_its_swap_out():
    """Ops end at 1, 2, ..., 6 ms. The swap-in of X before op 4, triggered
    after op 3 (ends at 4 ms), made op 4 wait 1.5 ms: triggered 1.5 ms
    earlier, after the last op ending by 2.5 ms: op 1. With X's swap-out
    after op 2 it may not go before op 2. The swap-out of Y with op 3 as
    deadline held op 3 0.7 ms: offered without the deadline, after the
    longer wait."""
    ends = np.arange(1, 7) * 1000.0
    ran = [OpTimes(ends - 1000.0, ends, 6000.0, ((4, 0, 1500.0), (3, 1, 700.0)))]
    late, y_out = SwapIn(0, 3, 4), SwapOut(1, 1, before_op=3)
    for out_at, k in ((0, 1), (2, 2)):
        plan = Plan("fp", (SwapOut(0, out_at), late, y_out))
        assert stall_moves(ran, [plan]) == [
            (0, (late,), (SwapIn(0, k, 4),)), (0, (y_out,), (SwapOut(1, 1),)),
        ]  # fmt: skip


def test_the_swap_ins_queued_ahead_of_a_stall_move_earlier_together():
    """NOTE [ Queues ahead of a stall ]. Ops end at 1, 2, ..., 9 ms. Op 7
    waited 1.5 ms for X and 0.5 ms for Y, both fetched after op 5: 2 ms in
    all. Fetched from op 5 up to op 7 are X, Y and Z (after op 6, for op 8):
    each is triggered 2 ms earlier -- X after op 3 (the last op ending by
    4 ms), Z after op 4 -- but Y not before its swap-out, after op 4. W,
    fetched after op 2, is not in that queue; op 4 waited 0.3 ms for it
    alone: W after op 1, the shorter wait second. A swap-out deadline's
    wait (V at op 5) is not a queue."""
    ends = np.arange(1, 10) * 1000.0
    stalls = ((7, 0, 1500.0), (7, 1, 500.0), (4, 3, 300.0), (5, 4, 900.0))
    ran = [OpTimes(ends - 1000.0, ends, 9000.0, stalls)]
    x, y, z, w = SwapIn(0, 5, 7), SwapIn(1, 5, 7), SwapIn(2, 6, 8), SwapIn(3, 2, 4)
    outs = (SwapOut(0, 0), SwapOut(1, 4), SwapOut(2, 0), SwapOut(3, 0), SwapOut(4, 1, before_op=5))
    plan = Plan("fp", (*outs, x, y, z, w))
    assert queue_moves(ran, [plan]) == [
        (0, (x, y, z), (SwapIn(0, 3, 7), SwapIn(1, 4, 7), SwapIn(2, 4, 8))),
        (0, (w,), (SwapIn(3, 1, 4),)),
    ]


def test_hidden_swaps_are_the_chains_cheaper_than_their_copies():
    """A lane of 4 MiB per ms. X (1 MiB): two copies take 0.5 ms, its
    producer 1 ms: a swap (the swap_moves of before). Y (8 MiB): copies 4 ms
    against 1 ms of compute: offered only as a hidden swap (NOTE [ Hidden
    swaps ]), whose gain is the chain's whole cost. Both swap-ins are
    triggered where the predicted timeline hides them: X's 0.25 ms after op 3
    (ends at 4 ms, op 5 starts at 5), Y's 2 ms after op 2 -- but not before
    Y's release, after op 2: op 3."""
    trace = tiny_trace(
        [B(1), B(8), B(2), B(2), B(2)],
        [
            Step((), (0,)), Step((0,), (1,)), Step((1,), (2,)), Step((2,), (3,)),
            Step((3,), (4,)), Step((0, 1, 4), ()),
        ],
    )  # fmt: skip
    device = DeviceModel(tiny_hw(lanes_bw_mib_per_ms=4.0), Measured())
    x = (Release(0, 1), Recompute(0, 5, (0,)))
    y = (Release(1, 2), Recompute(1, 5, (1,)))
    plan = Plan("fp", (*x, *y))
    tl, d = predict_timelines([trace], device), [op_durations_us(trace, device)]
    assert swap_moves([trace], device, tl, d, [plan]) == [(0, x, (SwapOut(0, 1), SwapIn(0, 3, 5)))]
    assert swap_moves([trace], device, tl, d, [plan], hidden=True) == [
        (0, y, (SwapOut(1, 2), SwapIn(1, 3, 5)))
    ]


def test_the_evaluator_reads_when_ops_ran_and_what_they_waited_for():
    """A lane of 1 MiB per ms. X (2 MiB) leaves after op 1 (2 ms of copy, over
    at 4 ms) and is fetched after op 3 (ends at 4 ms): it is back at 6 ms, so
    op 5, ready at 5 ms, waits 1 ms for it, and the iteration takes 7 ms; in
    every iteration alike."""
    trace = _line()
    device = DeviceModel(tiny_hw(), Measured())
    plan = Plan("fp", (SwapOut(0, 1), SwapIn(0, 3, 5)))
    ev = sim_evaluator([trace], device, 1 << 30)([plan])
    (o,) = ev.op_times()
    assert o.start_us.tolist() == pytest.approx([0, 1000, 2000, 3000, 4000, 6000])
    assert o.end_us.tolist() == pytest.approx([1000, 2000, 3000, 4000, 5000, 7000])
    assert o.period_us == pytest.approx(7000)
    ((op, b, us),) = o.stalls
    assert (op, b, us) == (5, 0, pytest.approx(1000.0))


def test_prunes_without_room_in_the_simulated_run_are_not_scored():
    """Removing X's swap pair (out after op 0, back before op 5) brings its
    2 MiB back over ops 1-4: with 1 MiB of room at op 3 it cannot fit; with
    2 MiB everywhere it may. A Release alone ends no absence: always kept."""
    trace = _line()
    pair = (0, (SwapOut(0, 0), SwapIn(0, 2, 5)), ())
    lone = (0, (Release(3, 4),), ())
    mib = 1 << 20
    tight = np.full(6, 4 * mib)
    tight[3] = mib
    assert with_room([trace], [tight], [pair, lone]) == [lone]
    assert with_room([trace], [np.full(6, 2 * mib)], [pair, lone]) == [pair, lone]
    assert with_room([trace], [None], [pair, lone]) == [pair, lone]


def test_a_refused_move_is_not_scored_again():
    """NOTE [ Moves tried once ]: a round refuses the single move (it makes
    the plan slower); the next round offers it again and scores nothing."""
    events = (Release(0, 0),)

    def stub(plans):
        return Evaluation(
            fits=True, iteration_s=2.0 - len(plans[0].events), peak_bytes=0, iterations=2
        )

    plan = Plan("fp", events)
    search = Search([plan], stub([plan]), stub, lambda: False)
    move = (0, events, ())
    assert accept_batches(search, [move], strict=False) == 0
    assert search.evaluations == 1 and search.refused == {move}
    assert accept_batches(search, [move], strict=False) == 0
    assert search.evaluations == 1


def test_the_nets_starts_are_improved_first_each_group_fastest_first():
    def start(label, ms):
        return (Evaluation(True, ms * 1e-3, 0, 2), [], label)

    starts = [
        start("checkpoint@1", 50), start("release_only+dtrx1", 70),
        start("tensile+offload1", 40), start("capuchin@1+passivex2", 60),
        start("release_only+offload1+dtrx1", 70),
    ]  # fmt: skip
    assert [s[2] for s in start_order(starts)] == [
        "capuchin@1+passivex2", "release_only+dtrx1", "release_only+offload1+dtrx1",
        "tensile+offload1", "checkpoint@1",
    ]  # fmt: skip


def test_the_ops_peaks_bound_what_they_touch_and_reach_the_run_peak():
    """Each op's peak holds at least the buffers it reads and writes, and the
    largest of them is the run's peak (every iteration alike)."""
    trace = _line()
    device = DeviceModel(tiny_hw(), Measured())
    plan = Plan("fp", (SwapOut(0, 1), SwapIn(0, 3, 5)))
    ev = sim_evaluator([trace], device, 1 << 30)([plan])
    (o,) = ev.op_times()
    for i in range(trace.n_ops):
        touched = set(trace.op_reads(i).tolist()) | set(trace.op_writes(i).tolist())
        assert o.peak_bytes[i] >= sum(int(trace.nbytes[b]) for b in touched), i
    assert int(o.peak_bytes.max()) == ev.peak_bytes

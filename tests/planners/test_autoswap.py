"""AutoSwap on a hand trace: candidates, the four scores, selection and the
schedule worked out by hand (NOTE [ AutoSwap candidates ], [ AutoSwap
scores ], [ AutoSwap selection ], [ AutoSwap scheduling ])."""

from __future__ import annotations

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Measured
from memplan.planners import registry
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Status, SwapIn, SwapOut
from memplan.planners.heuristics.autoswap.planner import AutoSwapOptions, autoswap, scores_of
from memplan.planners.heuristics.autoswap.schedule import State, schedule, select
from memplan.planners.heuristics.autoswap.scores import AutoSwapJob, candidates, ranking
from memplan.sim.job import Job
from memplan.sim.simulate import simulate
from memplan.traces import synthetic as syn

from tests.planners.test_analysis import B, MiB, O, gpu, make


def hand():
    """Seven 1 ms ops; b1 4 MiB, b2 2, b3 1, b4 3, b0 b5 b6 b7 1 MiB:

        op0 b0 -> b1        op4 b4, b2 -> b5
        op1 b1 -> b2        op5 b5, b1 -> b6
        op2 b2 -> b3        op6 b6, b3 -> b7
        op3 b3 -> b4

    Load (every buffer freed after its last access): 5, 6, 7, 10, 11, 7, 3
    MiB; the peak is op 4 (11 MiB). Gaps around op 4: b1 (1, 5) and b3
    (3, 6); b2 and b4 are read by op 4 itself. Over 9 MiB are ops 3 and 4,
    which b2's gap (2, 4) holds too."""
    return make(
        [B(1, "input"), B(4), B(2), B(1), B(3), B(1), B(1), B(1)],
        [
            O([0], [1]),
            O([1], [2]),
            O([2], [3]),
            O([3], [4]),
            O([4, 2], [5]),
            O([5, 1], [6]),
            O([6, 3], [7]),
        ],
    )


def device(mib_per_ms: float) -> tuple:
    t, lat = hand()
    return t, DeviceModel(gpu(mib_per_ms=mib_per_ms), lat)


def gaps(cands):
    return [(c.buffer, c.prev, c.nxt, c.first, c.last) for c in cands]


def test_the_load_is_what_the_docstring_says():
    t, _ = hand()
    assert (t.memory_curve("framework") // MiB).tolist() == [5, 6, 7, 10, 11, 7, 3]


def test_candidates_span_the_peak_op_without_a_budget():
    t, dev = device(4)
    cands, _ = scores_of([t], dev, min_bytes=MiB)
    assert gaps(cands) == [(1, 1, 5, 4, 4), (3, 3, 6, 4, 4)]


def test_candidates_under_a_budget_span_the_ops_over_it():
    t, dev = device(4)
    cands, _ = scores_of([t], dev, min_bytes=MiB, budget_bytes=9 * MiB)
    assert gaps(cands) == [(1, 1, 5, 3, 4), (2, 2, 4, 3, 3), (3, 3, 6, 4, 4)]


def test_the_size_threshold_drops_small_buffers():
    t, dev = device(4)
    cands, _ = scores_of([t], dev, min_bytes=2 * MiB, budget_bytes=9 * MiB)
    assert [c.buffer for c in cands] == [1, 2]


def test_the_four_scores_by_hand():
    """4 MiB/ms: copies of b1 1 ms each way, b2 0.5, b3 0.25.
    DOA = span - copies: b1 (5 - 2) - 2 = 1 ms, b2 (4 - 3) - 1 = 0 ms,
    b3 (6 - 4) - 0.5 = 1.5 ms. AOA = DOA x size. WDOA = load x time over
    the gap: b1 ops 2-4 (7+10+11) MiB ms, b2 op 3 (10), b3 ops 4-5 (11+7).
    SWDOA: b1 first (28); load minus 4 MiB on ops 2-4 gives b3 (7+7) = 14,
    then minus 1 MiB on ops 4-5 leaves b2 at op 3: 6."""
    t, dev = device(4)
    _, table = scores_of([t], dev, min_bytes=MiB, budget_bytes=9 * MiB)
    ms = 1000.0
    doa = [1 * ms, 0.0, 1.5 * ms]
    expect = np.array(
        [
            doa,
            [doa[0] * 4 * MiB, doa[1] * 2 * MiB, doa[2] * MiB],
            [28 * MiB * ms, 10 * MiB * ms, 18 * MiB * ms],
            [28 * MiB * ms, 6 * MiB * ms, 14 * MiB * ms],
        ]
    ).T
    assert table == pytest.approx(expect, rel=1e-9)


def test_aoa_of_a_negative_doa_divides_by_the_size():
    """1 MiB/ms: b1 DOA = 3 - 8 = -5 ms, b2 1 - 4 = -3 ms: AOA = DOA / size;
    b3 2 - 2 = 0 ms: AOA = DOA x size = 0."""
    t, dev = device(1)
    _, table = scores_of([t], dev, min_bytes=MiB, budget_bytes=9 * MiB)
    assert table[:, 0] == pytest.approx([-5000.0, -3000.0, 0.0])
    assert table[:, 1] == pytest.approx([-5000.0 / (4 * MiB), -3000.0 / (2 * MiB), 0.0])


def state_of(t, dev, budget):
    from memplan.planners.analysis import predict_timelines

    jobs = (AutoSwapJob.of(t, predict_timelines([t], dev)[0], dev),)
    return State(jobs, tuple(candidates(jobs, MiB, budget)), dev.lanes)


def test_schedule_chains_copies_in_access_order_and_widens_to_the_peak_time():
    """DOA ranks b3 (1.5 ms), b1 (1), b2 (0). b3 alone: out [4, 4.25) ms,
    in from 5.75 ms: off op 4 only, ops 3-4 hold 10, 10 MiB: not yet. With
    b1: its out [2, 3) ms comes first; its in chains before b3's, due at
    op 5 (5 ms), from 4 ms: it would be off no op (op 3 runs [3, 4)), so
    the hole widens to its gap's ops over 9 MiB, 3-4; load 6, 6 there,
    peak 7 MiB (ops 2 and 5)."""
    t, dev = device(4)
    st = state_of(t, dev, 9 * MiB)
    alone = schedule(st, [2])
    assert [(s.lo, s.hi) for s in alone.swaps] == [(4, 4)]
    assert alone.peak_bytes == 10 * MiB
    both = schedule(st, [2, 0])
    assert [(st.cands[s.cand].buffer, s.lo, s.hi) for s in both.swaps] == [(1, 3, 4), (3, 4, 4)]
    assert [round(s.s_out, 6) for s in both.swaps] == [2000.0, 4000.0]
    assert (both.curves[0] // MiB).tolist() == [5, 6, 7, 6, 6, 7, 3]
    k, sched = select(st, ranking(_doa(st), st.cands), 9 * MiB)
    assert k == 2 and sched.peak_bytes == 7 * MiB


def _doa(st):
    from memplan.planners.heuristics.autoswap.scores import scores

    return scores(st.jobs, st.cands)[:, 0]


@pytest.mark.parametrize(
    ("score", "selected", "buffers"),
    [("doa", 2, {1, 3}), ("aoa", 1, {1}), ("wdoa", 1, {1}), ("swdoa", 1, {1})],
)
def test_selection_stops_when_the_budget_holds(score, selected, buffers):
    """AOA, WDOA and SWDOA rank b1 first, and b1 alone (off ops 3-4) leaves
    7 MiB; DOA ranks b3 first, which alone leaves 10 MiB, so it takes b1 too."""
    t, dev = device(4)
    res = autoswap([t], dev, budget_bytes=9 * MiB, options=AutoSwapOptions(score=score))
    assert res.status is Status.PLANNED
    assert res.stats["selected"] == selected and res.stats["peak_bytes"] == 7 * MiB
    plan = res.plans[0]
    check(plan, t)
    assert {ev.buffer for ev in plan.events} == buffers
    sim = simulate([Job(t, plan)], dev, budget=9 * MiB, oom="fail")
    assert not sim.oom and sim.peak_bytes <= 9 * MiB


def test_the_plan_of_one_swap():
    """b1 out after op 1 with op 3 as its deadline; in after op 4 (its
    chained start, 4 ms, would overlap op 4, which is over the budget), for
    op 5."""
    t, dev = device(4)
    res = autoswap([t], dev, budget_bytes=9 * MiB, options=AutoSwapOptions(score="aoa"))
    assert list(res.plans[0].events) == [SwapOut(1, 1, 0.0, 3), SwapIn(1, 4, 5, 0.0)]


def test_no_budget_swaps_every_candidate_and_a_tiny_budget_falls_short():
    t, dev = device(4)
    free = autoswap([t], dev, options=AutoSwapOptions(score="swdoa"))
    assert free.status is Status.PLANNED and free.stats["selected"] == 2
    short = autoswap([t], dev, budget_bytes=4 * MiB, options=AutoSwapOptions(score="swdoa"))
    assert short.status is Status.STOPPED and "over the budget" in short.detail
    check(short.plans[0], t)


def test_bo_without_an_evaluator_ranks_by_swdoa_and_says_so():
    """NOTE [ AutoSwap without an evaluator ]."""
    t, dev = device(4)
    res = autoswap([t], dev, budget_bytes=9 * MiB)
    assert res.stats["score"] == "swdoa" and "no evaluator" in res.stats["note"]
    assert res.stats["weights"] == [0.0, 0.0, 0.0, 1.0]


def test_options_from_the_command_line():
    spec = registry.get("autoswap")
    opts = registry.make_options(spec, ["score=wdoa", "trials=20", "weights=1,-0.5,0,0.25"])
    assert opts.score.value == "wdoa" and opts.trials == 20
    assert opts.fixed_weights == (1.0, -0.5, 0.0, 0.25)
    for bad in (
        ["score=best"],
        ["trials=0"],
        ["weights=1,2,0,0"],
        ["weights=1,0"],
        ["min_bytes=-1"],
        ["seed=-1"],
    ):
        with pytest.raises(PlanError, match="autoswap"):
            registry.make_options(spec, bad)


def test_given_weights_rank_as_their_score():
    """weights 0,1,0,0 are AOA's ranking."""
    t, dev = device(4)
    a = autoswap([t], dev, budget_bytes=9 * MiB, options=AutoSwapOptions(weights="0,1,0,0"))
    b = autoswap([t], dev, budget_bytes=9 * MiB, options=AutoSwapOptions(score="aoa"))
    assert a.plans == b.plans and a.stats["score"] == "weights"


def _synthetic():
    return [syn.residual(4, act_mib=3), syn.unet(3, act_mib=2), syn.chain(6, act_mib=2)]


@pytest.mark.parametrize("frac", [0.8, 0.6])
@pytest.mark.parametrize("score", ["doa", "aoa", "wdoa", "swdoa"])
def test_planned_plans_fit_in_the_simulator_however_the_lane_runs(score, frac):
    """NOTE [ AutoSwap scheduling ]: deadlines hold the swap-outs, swap-ins
    start no earlier than planned, so a plan predicted to fit never runs out
    of memory -- alone or two jobs on one lane, slow copies (1 MiB/ms) that
    cannot hide."""
    dev = DeviceModel(gpu(mib_per_ms=1), Measured())
    cases = [[t] for t in _synthetic()] + [_synthetic()[:2]]
    planned = 0
    for traces in cases:
        budget = int(frac * sum(t.peak("framework")[0] for t in traces))
        opts = AutoSwapOptions(score=score, min_bytes=0)
        res = autoswap(traces, dev, budget_bytes=budget, options=opts)
        for p, t in zip(res.plans, traces, strict=True):
            check(p, t)
        if not res.feasible:
            continue
        planned += 1
        sim = simulate(
            [Job(t, p) for t, p in zip(traces, res.plans, strict=True)], dev, budget=budget
        )
        assert not sim.oom and sim.peak_bytes <= res.stats["peak_bytes"], traces[0].meta.model
    assert planned >= 2

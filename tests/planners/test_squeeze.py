"""squeeze (planners/search): NOTE [ Squeeze ], NOTE [ From the net to a plan ],
NOTE [ Batched acceptance ]."""

from __future__ import annotations

import math
import random
import time

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Measured, Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners.analysis.optimes import op_durations_us, predict_timelines
from memplan.planners.core.check import check
from memplan.planners.core.evaluate import Evaluation, MoveKind, NetMove, OomPolicy
from memplan.planners.core.plan import Plan, Recompute, Release, Status, SwapIn, SwapOut
from memplan.planners.heuristics.vanilla import release_only_plan, vanilla_plan
from memplan.planners.registry import run
from memplan.planners.search.moves import Search, accept_batches, deadline_moves, prune_moves
from memplan.planners.search.netplan import plan_from_net
from memplan.planners.search.squeeze import POLISH, SPLIT, SqueezeOptions, _Run, squeeze
from memplan.sim import Job, simulate
from memplan.traces import synthetic
from memplan.traces.io import fingerprint

from memplan.evaluator import sim_evaluator
from tests.planners.bruteforce import B, MiB, Step, tiny_hw, tiny_trace


# ---- batched acceptance, against a stub evaluator --------------------------------------------
def test_batches_keep_exactly_the_moves_that_keep_the_plan_fitting():
    """Eight removable events, two of which the budget needs: the search must
    end with exactly those two, in few evaluations (delta debugging: each bad
    move costs about log2(8) = 3 splits)."""
    events = tuple(Release(b, 0) for b in range(8))
    needed = {events[2], events[5]}

    def stub(plans):
        evs = set(plans[0].events)
        return Evaluation(
            fits=needed <= evs, iteration_s=float(len(evs)), peak_bytes=0, iterations=2
        )

    plan = Plan("fp", events)
    search = Search([plan], stub([plan]), stub, lambda: False)
    moves = prune_moves([Plan("fp")], [plan], lambda j, e: 1.0, random.Random(0))
    kept = accept_batches(search, moves, strict=False)
    assert set(search.plans[0].events) == needed
    assert kept == 6
    assert search.evaluations <= 1 + 2 * 2 * 3


def test_strict_batches_need_a_gain():
    events = (Release(0, 0),)

    def stub(plans):
        return Evaluation(fits=True, iteration_s=1.0, peak_bytes=0, iterations=2)

    plan = Plan("fp", events)
    search = Search([plan], stub([plan]), stub, lambda: False)
    moves = prune_moves([Plan("fp")], [plan], lambda j, e: 1.0, random.Random(0))
    assert accept_batches(search, moves, strict=True) == 0
    assert search.plans[0].events == events


def test_a_capped_batch_scores_no_more_candidates_than_its_cap():
    """Eight moves that all slow the plan down: uncapped, delta debugging
    scores 15 candidates (every node of the halving tree); capped at 4, it
    stops after 4 and keeps nothing."""
    events = tuple(Release(b, 0) for b in range(8))

    def stub(plans):
        n = len(plans[0].events)
        return Evaluation(fits=True, iteration_s=float(8 - n), peak_bytes=0, iterations=2)

    for cap, scored in ((None, 15), (4, 4)):
        plan = Plan("fp", events)
        search = Search([plan], stub([plan]), stub, lambda: False)
        moves = prune_moves([Plan("fp")], [plan], lambda j, e: 1.0, random.Random(0))
        assert accept_batches(search, moves, strict=True, max_evaluations=cap) == 0
        assert search.evaluations == scored
        assert search.plans[0].events == events


def test_deadlines_that_make_ops_wait_longest_are_dropped_first():
    """Ops of 1 ms, a lane of 1 MiB per ms. X (2 MiB, made by op 0) copied out
    by op 2's start has 1 ms for a 2 ms copy: op 2 would wait 1 ms; Z (3 MiB,
    made by op 2) by op 4's start, 1 ms for 3: 2 ms; Y (1 MiB, made by op 1)
    by op 3's start, 1 ms for 1: no wait, not offered."""
    trace = tiny_trace(
        [B(2), B(1), B(3), B(1)],
        [Step((), (0,)), Step((0,), (1,)), Step((1,), (2,)), Step((2,), (3,)), Step((0, 1), ())],
    )
    device = DeviceModel(tiny_hw(), Measured())
    out_y, out_x = SwapOut(1, 1, before_op=3), SwapOut(0, 0, before_op=2)
    out_z = SwapOut(2, 2, before_op=4)
    plan = Plan("fp", (out_y, out_x, out_z))
    tl = predict_timelines([trace], device)
    assert deadline_moves([trace], device, tl, [plan]) == [
        (0, (out_z,), (SwapOut(2, 2),)), (0, (out_x,), (SwapOut(0, 0),)),
    ]  # fmt: skip


# ---- the net's choices as a plan, worked by hand ---------------------------------------------
def _evict_case():
    """X (buffer 0) is made by op 0, read by op 1 and op 4; A, C, D, E come and
    go in between; every op takes 1 ms and every buffer is 2 MiB; the lane moves
    1 MiB per ms. Under a 4 MiB budget op 2 (A and C) has no room for X: the
    passive net evicts X there (after its last use, op 1) and fetches it back
    for op 4."""
    trace = tiny_trace(
        [B(2), B(2), B(2), B(2), B(2)],
        [Step((), (0,)), Step((0,), (1,)), Step((1,), (2,)), Step((2,), (3,)), Step((0,), (4,))],
    )
    return trace, DeviceModel(tiny_hw(), Measured())


def test_the_net_evictions_become_a_swap_pair():
    trace, device = _evict_case()
    base = release_only_plan(trace)
    ev = sim_evaluator([trace], device, 4 * MiB)([base], OomPolicy.PASSIVE)
    assert ev.net_used and not ev.fits and ev.oom_at is None
    plan, added = plan_from_net(trace, base, ev.moves, 0, ev.iterations - 1)
    assert added == (SwapOut(0, 1, before_op=2), SwapIn(0, 3, 4))
    check(plan, trace)
    # op0 0-1, op1 1-2, X's copy out 2-4 (op 2 waits for it), op2 4-5, op3 5-6,
    # X's copy in 6-8, op4 8-9: 9 ms, as the net took, and now without it
    run_ = simulate([Job(trace, plan)], device, iterations=2, budget=4 * MiB)
    job = run_.jobs[0]
    assert not run_.oom and not job.net_used
    assert job.iteration_times_s[0] == pytest.approx(9e-3)
    witness = simulate([Job(trace, base)], device, iterations=2, budget=4 * MiB, oom="passive")
    assert witness.jobs[0].iteration_times_s[0] == pytest.approx(9e-3)


def test_a_parameter_the_net_discards_is_written_down_as_swapped_out():
    """P (buffer 0, a 2 MiB parameter, only ever read) is read by ops 0 and 3;
    X, Y, Z, W (2, 2, 2, 1 MiB) come and go; budget 5 MiB. Op 1 (X and Y) has
    no room for P: the passive net swaps it out in iteration 0 and, its host
    copy still valid, only discards it in iteration 1, fetching it back for
    op 3 each time. The discard is an eviction too (NOTE [ Net discards ]):
    the plan swaps P out after op 0, op 1 waiting for it, and back for op 3."""
    trace = tiny_trace(
        [B(2, "param"), B(2), B(2), B(2), B(1)],
        [Step((0,), (1,)), Step((1,), (2,)), Step((2,), (3,)), Step((3, 0), (4,))],
    )
    device = DeviceModel(tiny_hw(), Measured())
    base = release_only_plan(trace)
    ev = sim_evaluator([trace], device, 5 * MiB)([base], OomPolicy.PASSIVE)
    assert ev.net_used and ev.oom_at is None
    plan, added = plan_from_net(trace, base, ev.moves, 0, ev.iterations - 1)
    assert added == (SwapOut(0, 0, before_op=1), SwapIn(0, 2, 3))
    check(plan, trace)
    # iteration 0: op0 0-1, P out 1-3, op1 3-4, op2 4-5, P in 5-7, op3 7-8;
    # iteration 1: the host copy is valid, P is dropped at once: op0 8-9,
    # op1 9-10, op2 10-11, P in 11-13, op3 13-14
    run_ = simulate([Job(trace, plan)], device, iterations=2, budget=5 * MiB)
    assert not run_.oom and not run_.jobs[0].net_used
    assert run_.jobs[0].iteration_times_s == pytest.approx([8e-3, 6e-3])


def test_a_sibling_dtr_remakes_with_its_target_gets_its_own_recompute():
    """Op 1 writes A and I (2 MiB each, as max pooling writes its indices) from
    S (1 MiB, made by op 0 in 5 ms: dearer to remake than A or I). At op 3 (T1
    2 MiB, T2 3 MiB) a 7 MiB budget has no room for A and I: DTR drops both;
    op 5 needs A and DTR re-runs op 1, which makes I again too, kept for op 6.
    A plan's Recompute keeps only its target, so I gets one of its own
    before op 6 (NOTE [ From the net to a plan ])."""
    trace = tiny_trace(
        [B(1), B(2), B(2), B(2), B(3), B(1), B(1), B(1)],
        [
            Step((), (0,), ms=5),
            Step((0,), (1, 2)),
            Step((0,), (3,)),
            Step((3,), (4,)),
            Step((4,), (5,)),
            Step((1, 5), (6,)),
            Step((2, 0, 6), (7,)),
        ],
    )
    device = DeviceModel(tiny_hw(), Measured())
    base = release_only_plan(trace)
    ev = sim_evaluator([trace], device, 7 * MiB)([base], OomPolicy.DTR)
    assert ev.net_used and ev.oom_at is None
    it = ev.iterations - 1
    assert [(m.kind, m.op, m.buffer) for m in ev.moves if m.iteration == it] == [
        ("evict", 3, 1), ("evict", 3, 2), ("restore", 5, 1),
    ]  # fmt: skip
    plan, added = plan_from_net(trace, base, ev.moves, 0, it)
    assert set(added) == {
        Release(1, 1), Recompute(1, 5, (1,)), Release(2, 1), Recompute(2, 6, (1,)),
    }  # fmt: skip
    check(plan, trace)
    run_ = simulate([Job(trace, plan)], device, iterations=2, budget=7 * MiB)
    assert not run_.oom and not run_.jobs[0].net_used
    # 11 ms of ops and op 1 re-run twice (for A, then for I)
    assert run_.jobs[0].iteration_times_s == pytest.approx([13e-3, 13e-3])


def test_a_temporary_of_a_remake_joins_the_chain_that_reads_it():
    """S (0) is read by ops 1, 2 and 6; op 1 makes D (1, dead after op 3),
    op 2 makes L (2), op 3 reads D and L and makes X (3); op 6 reads X, L, S.
    DTR dropped L and X at op 4; for op 6 it remade D, then L, then X. D is a
    temporary of X's remake, not of L's: X's Recompute re-runs ops 1 and 3,
    L's op 2 alone, and the plan checks (NOTE [ From the net to a plan ])."""
    trace = tiny_trace(
        [B(1), B(1), B(1), B(1), B(1), B(1)],
        [
            Step((), (0,)),
            Step((0,), (1,)),
            Step((0,), (2,)),
            Step((1, 2), (3,)),
            Step((), (4,)),
            Step((4,), (5,)),
            Step((3, 2, 0), ()),
        ],
    )
    base = release_only_plan(trace)
    moves = [
        NetMove(0, 1, MoveKind.EVICT, 4, 2, False),
        NetMove(0, 1, MoveKind.EVICT, 4, 3, False),
        NetMove(0, 1, MoveKind.RESTORE, 6, 1, False, (1,)),
        NetMove(0, 1, MoveKind.RESTORE, 6, 2, False, (2,)),
        NetMove(0, 1, MoveKind.RESTORE, 6, 3, False, (3,)),
    ]
    plan, added = plan_from_net(trace, base, moves, 0, 1)
    assert set(added) == {
        Release(2, 3), Recompute(2, 6, (2,)), Release(3, 3), Recompute(3, 6, (1, 3)),
    }  # fmt: skip
    check(plan, trace)


# ---- the planner ----------------------------------------------------------------------------
DEV = DeviceModel(load_hardware("rtx-a6000"), Roofline())


def test_squeeze_without_a_budget_or_an_evaluator_or_below_the_floor():
    t = synthetic.chain(4)
    free = squeeze([t], DEV)
    assert free.status is Status.PLANNED and free.plans[0] == release_only_plan(t)
    blind = squeeze([t], DEV, budget_bytes=int(t.peak("framework")[0] * 0.7))
    assert blind.status is Status.STOPPED and "simulation" in blind.detail
    below = squeeze([t], DEV, budget_bytes=1 * MiB, evaluator=sim_evaluator([t], DEV, 1 * MiB))
    assert below.status is Status.INFEASIBLE


@pytest.fixture(scope="module")
def tight():
    t = synthetic.residual(3, act_mib=8)
    peak = simulate([Job(t, vanilla_plan(t))], DEV, iterations=2, budget=1 << 40).peak_bytes
    budget = int(peak * 0.55)
    opts = SqueezeOptions(max_evaluations=80, time_limit_s=600)
    r = run(
        "squeeze",
        [t],
        DEV,
        budget_bytes=budget,
        options=opts,
        evaluator=sim_evaluator([t], DEV, budget),
    )
    return t, budget, opts, r


def test_squeeze_fits_alone_and_beats_the_nets_and_the_seeds(tight):
    t, budget, _opts, r = tight
    assert r.status is Status.PLANNED, r.explain()
    check(r.plans[0], t)
    run_ = simulate([Job(t, r.plans[0])], DEV, iterations=3, budget=budget)
    assert not run_.oom and not run_.jobs[0].net_used
    mine = run_.jobs[0].iteration_time_s
    for net in ("passive", "dtr"):
        w = simulate([Job(t, release_only_plan(t))], DEV, iterations=3, budget=budget, oom=net)
        if not w.oom:
            assert mine <= w.jobs[0].iteration_time_s * (1 + 1e-9), net
    for name in ("tensile", "capuchin", "checkpoint", "vdnn"):
        seed = run(name, [t], DEV, budget_bytes=budget)
        if not seed.plans:
            continue
        s = simulate([Job(t, seed.plans[0])], DEV, iterations=3, budget=budget, check=False)
        if not s.oom and not s.jobs[0].net_used:
            assert mine <= s.jobs[0].iteration_time_s * (1 + 1e-9), name


def test_squeeze_is_deterministic_for_a_seed(tight):
    t, budget, opts, r = tight
    again = squeeze(
        [t], DEV, budget_bytes=budget, options=opts, evaluator=sim_evaluator([t], DEV, budget)
    )
    assert again.plans == r.plans
    assert again.stats["stopped_by"] != "time limit"
    assert math.isfinite(again.stats["predicted_iteration_s"])
    assert fingerprint(t) == r.plans[0].trace_fingerprint


def test_squeeze_stops_at_the_compute_floor():
    """NOTE [ Squeeze stops at the compute floor ]: with 95% of the peak a
    plan that hides its copies runs in the ops' summed durations; nothing
    beats it, so the search ends with it, long before its evaluation cap."""
    t = synthetic.residual(3, act_mib=8)
    peak = simulate([Job(t, vanilla_plan(t))], DEV, iterations=2, budget=1 << 40).peak_bytes
    budget = int(peak * 0.95)
    opts = SqueezeOptions(max_evaluations=500, time_limit_s=600)
    r = squeeze(
        [t], DEV, budget_bytes=budget, options=opts, evaluator=sim_evaluator([t], DEV, budget)
    )
    compute_s = sum(op_durations_us(t, DEV)) * 1e-6
    assert r.stats["stopped_by"] == "at the compute floor", r.stats
    assert r.stats["predicted_iteration_s"] == pytest.approx(compute_s, rel=1e-9)
    assert r.stats["evaluations"] < 500


def test_each_start_gets_its_share_of_the_evaluations_left():
    """NOTE [ Squeeze ], step 3: with 80 of 100 evaluations left and 9 starts
    to improve, the next may use a quarter of them (SPLIT = 4), 20; with 60
    left and 3 starts, a third, 20; the last start, all that is left."""
    t = synthetic.chain(4)
    run_ = _Run([t], DEV, 1 << 30, SqueezeOptions(max_evaluations=100), None, time.perf_counter())
    assert SPLIT == 4
    for used, starts_left in ((20, 9), (40, 3)):
        run_.evaluations = used
        out = run_.share(starts_left)
        run_.evaluations = used + 19
        assert not out()
        run_.evaluations = used + 20
        assert out()
    run_.evaluations = 50  # the start before stopped early: all 50 left for the last
    out = run_.share(1)
    run_.evaluations = 99
    assert not out()
    run_.evaluations = 100
    assert out()


def test_the_polish_keeps_a_share_of_the_evaluations_for_the_end():
    """NOTE [ Polish ]: while the starts are improved, 5% of 100 evaluations
    are held back (95 are all the starts may use, the last one included);
    given back, the search may go on to 100."""
    t = synthetic.chain(4)
    run_ = _Run([t], DEV, 1 << 30, SqueezeOptions(max_evaluations=100), None, time.perf_counter())
    run_.hold_back(POLISH)
    assert POLISH == 0.05
    run_.evaluations = 90
    out = run_.share(1)
    run_.evaluations = 94
    assert not out() and not run_.out_of_time()
    run_.evaluations = 95
    assert out() and run_.out_of_time()
    run_.hold_back(0.0)
    assert not run_.out_of_time()
    run_.evaluations = 100
    assert run_.out_of_time()

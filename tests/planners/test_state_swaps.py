"""NOTE [ State swaps across the boundary ] (planners/search/crossing.py), on
a case worked by hand."""

from __future__ import annotations

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Measured
from memplan.planners.analysis.optimes import predict_timelines
from memplan.planners.core.check import check
from memplan.planners.core.plan import Plan, Status, SwapIn, SwapOut
from memplan.planners.cpsat.planner import CpsatOptions, cpsat
from memplan.planners.heuristics.vanilla import release_only_plan
from memplan.planners.search.crossing import cross_candidates, cross_events, cross_moves
from memplan.planners.search.squeeze import SqueezeOptions, squeeze
from memplan.sim import Job, simulate

from memplan.evaluator import sim_evaluator
from tests.planners.bruteforce import B, MiB, Step, tiny_hw, tiny_trace

BUDGET = 4 * MiB


def _case():
    """P (buffer 0, 2 MiB) is persistent: op 0 reads it and makes A (1 MiB),
    op 1 reads A and updates P, as an optimizer does; op 2 makes C (3 MiB),
    op 3 reads C and makes D (1 MiB). Every op takes 1 ms, the lane moves 1
    MiB per ms. Release-only memory per op: 3, 3, 5, 6 MiB: under 4 MiB P
    must be off for ops 2 and 3, after its last access and before its next
    one, in the next iteration."""
    trace = tiny_trace(
        [B(2, "param"), B(1), B(3), B(1)],
        [Step((0,), (1,)), Step((1, 0), (0,)), Step((), (2,)), Step((2,), (3,))],
    )
    return trace, DeviceModel(tiny_hw(), Measured())


def test_the_parameter_goes_out_after_its_update_and_in_before_its_next_read():
    trace, device = _case()
    assert cross_candidates(trace, BUDGET) == [(1, 0, 0)]
    tl = predict_timelines([trace], device)[0]
    events = cross_events(trace, device, tl, cross_candidates(trace, BUDGET), 1.0, BUDGET)
    # out after op 1, op 2 (5 MiB with P) waits for it; in at the iteration start
    assert events == (SwapOut(0, 1, before_op=2), SwapIn(0, -1, 0))
    base = release_only_plan(trace)
    plan = Plan(base.trace_fingerprint, (*base.events, *events))
    check(plan, trace)
    # iteration 0 (P resident): op 0 0-1, op 1 1-2, P out 2-4, op 2 4-5, op 3
    # 5-6; then P in 6-8, op 0 8-9, op 1 9-10, P out 10-12, ops 2, 3 12-14
    run = simulate([Job(trace, plan)], device, iterations=3, budget=BUDGET)
    assert not run.oom and not run.jobs[0].net_used
    assert run.jobs[0].iteration_times_s == pytest.approx([6e-3, 8e-3, 8e-3])
    assert run.peak_bytes == BUDGET


def test_squeeze_finds_the_swap_across_the_boundary():
    """Without the crossed starts nothing fits 4 MiB; with them squeeze's
    plan is the one above, 8 ms an iteration: P must be off over ops 2 and 3
    (2 ms), and its copies out after op 1 and back before op 0 take 2 ms
    each on the one lane, with no op able to run beside either."""
    trace, device = _case()
    ev = sim_evaluator([trace], device, BUDGET)
    kw = {"nets": "", "offload": "", "max_evaluations": 60}
    plain = squeeze(
        [trace], device, budget_bytes=BUDGET, evaluator=ev,
        options=SqueezeOptions(cross="", **kw),
    )  # fmt: skip
    assert plain.status is Status.STOPPED
    r = squeeze([trace], device, budget_bytes=BUDGET, evaluator=ev, options=SqueezeOptions(**kw))
    assert r.status is Status.PLANNED, r.explain()
    assert r.stats["start"].endswith("+cross1")
    assert set(r.plans[0].events) >= {SwapOut(0, 1, before_op=2), SwapIn(0, -1, 0)}
    run = simulate([Job(trace, r.plans[0])], device, iterations=3, budget=BUDGET)
    assert not run.oom and not run.jobs[0].net_used
    assert run.jobs[0].iteration_time_s == pytest.approx(8e-3)


def test_the_move_is_offered_where_no_event_takes_the_buffer_off():
    trace, device = _case()
    tl = predict_timelines([trace], device)[0]
    base = release_only_plan(trace)
    moves = cross_moves([trace], device, [tl], BUDGET, [base])
    assert moves == [(0, (), (SwapOut(0, 1, before_op=2), SwapIn(0, -1, 0)))]
    done = Plan(base.trace_fingerprint, (*base.events, *moves[0][2]))
    assert cross_moves([trace], device, [tl], BUDGET, [done]) == []


def test_cross_shares_are_checked():
    with pytest.raises(ValueError, match="cross"):
        SqueezeOptions(cross="0,1")


# ---- CP-SAT: NOTE [ State at the iteration start ] in planners/cpsat/model.py ----------
def test_cpsat_takes_a_state_off_from_the_iteration_start():
    """P (buffer 0, 1 MiB) and O (buffer 1, 2 MiB) are persistent; O is read
    and updated by the last op only, as an optimizer state is. Op 0 (3 ms)
    makes A (2 MiB), op 1 C (2 MiB) from A, op 2 G (1 MiB) from C and P, op
    3 updates O from G. Release-only memory per op: 5, 7, 6, 4 MiB; under 5
    MiB O must be off for ops 1 and 2, which only a gap from the iteration
    start gives it (its last access is the last op). O goes out 0-2 ms under
    op 0 (0-3), op 1 runs 3-4, op 2 4-5, O comes back 5-7 (not before op 2
    ends: 6 MiB with it), op 3 7-8: 8 ms, every iteration alike."""
    trace = tiny_trace(
        [B(1, "param"), B(2, "param"), B(2), B(2), B(1)],
        [Step((0,), (2,), ms=3), Step((2,), (3,)), Step((3, 0), (4,)), Step((4, 1), (1,))],
    )
    device = DeviceModel(tiny_hw(), Measured())
    opts = CpsatOptions(hint=None, num_workers=1, time_limit_s=20.0)
    r = cpsat([trace], device, budget_bytes=5 * MiB, options=opts)
    assert r.feasible and r.stats["status"] == "OPTIMAL", r.explain()
    assert r.stats["iteration_time_s"] == pytest.approx(8e-3, abs=1e-9)
    # the copy in starts the 1 ns margin after op 2 ends (NOTE [ CP-SAT semantics ])
    assert r.plans[0].events == (SwapOut(1, -1), SwapIn(1, 2, 3, 0.001))
    check(r.plans[0], trace)
    run = simulate([Job(trace, r.plans[0])], device, iterations=3, budget=5 * MiB)
    assert not run.oom and not run.jobs[0].net_used
    assert run.jobs[0].iteration_times_s == pytest.approx([8e-3] * 3, abs=1e-8)


def test_cpsat_lets_an_op_wait_for_a_state_going_out():
    """O (buffer 0, 2 MiB) is persistent, read and updated by the last op
    only; op 0 makes X (1 MiB), op 1 A (2 MiB) from X, op 2 G (1 MiB) from
    A, op 3 updates O from G, 1 ms each. Release-only memory per op: 3, 5,
    5, 3 MiB; under 3 MiB O must be off for ops 1 and 2, and its copy out
    (2 ms) cannot end before op 0 does (1 ms), so op 1 waits for it (NOTE
    [ Swap-out deadlines in the model ]): O out 0-2 ms, op 0 0-1, op 1 2-3,
    op 2 3-4, O back 4-6 (not before op 2 ends: 5 MiB with it), op 3 6-7."""
    trace = tiny_trace(
        [B(2, "param"), B(1), B(2), B(1)],
        [Step((), (1,)), Step((1,), (2,)), Step((2,), (3,)), Step((3, 0), (0,))],
    )
    _optimal_in_7_ms(trace, (SwapOut(0, -1, before_op=1), SwapIn(0, 2, 3, 0.001)))


def test_cpsat_lets_the_first_op_wait_for_a_state_going_out():
    """O (buffer 0, 2 MiB) is persistent, read and updated by the last op
    only; op 0 makes A (2 MiB), op 1 G (1 MiB) from A, op 2 updates O from
    G, 1 ms each. Release-only memory per op: 4, 5, 3 MiB; under 3 MiB O
    must be off for op 0 already, so op 0 waits for its copy out: O out 0-2
    ms, op 0 2-3, op 1 3-4, O back 4-6 (not before op 1 ends: 5 MiB with
    it), op 2 6-7: 7 ms."""
    trace = tiny_trace(
        [B(2, "param"), B(2), B(1)],
        [Step((), (1,)), Step((1,), (2,)), Step((2, 0), (0,))],
    )
    _optimal_in_7_ms(trace, (SwapOut(0, -1, before_op=0), SwapIn(0, 1, 2, 0.001)))


def _optimal_in_7_ms(trace, events) -> None:
    """CP-SAT's optimum at 3 MiB is `events`, 7 ms; the checker takes it and
    the simulator runs it in 7 ms every iteration, alone."""
    device = DeviceModel(tiny_hw(), Measured())
    opts = CpsatOptions(hint=None, num_workers=1, time_limit_s=20.0)
    r = cpsat([trace], device, budget_bytes=3 * MiB, options=opts)
    assert r.feasible and r.stats["status"] == "OPTIMAL", r.explain()
    assert r.stats["iteration_time_s"] == pytest.approx(7e-3, abs=1e-8)
    assert r.plans[0].events == events
    check(r.plans[0], trace)
    run = simulate([Job(trace, r.plans[0])], device, iterations=3, budget=3 * MiB)
    assert not run.oom and not run.jobs[0].net_used
    assert run.jobs[0].iteration_times_s == pytest.approx([7e-3] * 3, abs=1e-8)

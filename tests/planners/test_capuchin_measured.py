"""Capuchin's measured start: the measured timeline and the in-trigger
feedback (§4.4), worked out by hand on a five-op timeline of 10 us ops."""

from __future__ import annotations

import numpy as np
import pytest
from memplan.planners.analysis.optimes import Timeline
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Plan, SwapIn, SwapOut
from memplan.planners.heuristics.capuchin.measured import (
    Late,
    advance_in_triggers,
    measured_timeline,
)

# ops 0..4 run [0,10), [10,20), ..., [40,50) us
TL = Timeline(np.arange(5) * 10.0, np.arange(1, 6) * 10.0, 50.0)


def plan(*events) -> Plan:
    return Plan("fp", tuple(events), "hand")


def rounded(p: Plan) -> tuple:
    """The events with delays rounded to 1 ns (float sums of us)."""
    return tuple(
        SwapIn(e.buffer, e.after_op, e.before_op, round(e.delay_us, 3), e.next_iteration)
        if isinstance(e, SwapIn)
        else e
        for e in p.events
    )


def test_measured_timeline_is_relative_to_the_iteration_start_in_us():
    tl = measured_timeline(np.array([2.0, 2.5, 2.75]), np.array([0.5, 0.25, 0.1]), 2.0, 1.0)
    assert tl.start_us.tolist() == [0.0, 0.5e6, 0.75e6]
    assert tl.end_us.tolist() == [0.5e6, 0.75e6, 0.85e6]
    assert tl.period_us == 1e6


@pytest.mark.parametrize(
    "starts, durs",
    [([1.0, 0.5], [0.1, 0.1]), ([1.0, np.nan], [0.1, 0.1]), ([1.0, 2.0], [0.1, -1.0])],
)
def test_measured_timeline_refuses_bad_times(starts, durs):
    with pytest.raises(PlanError, match="measured timeline"):
        measured_timeline(np.array(starts), np.array(durs), 1.0, 2.0)


def test_a_late_swap_in_moves_earlier_by_five_percent_of_its_copy_crossing_an_op_end():
    # trigger at end of op 3 (40 us) + 2 us = 42 us; copy 100 us -> 5 us
    # earlier = 37 us = end of op 2 (30 us) + 7 us
    p = plan(SwapOut(7, 0, 0.0), SwapIn(7, 3, 4, 2.0))
    out = advance_in_triggers(p, TL, [Late(7, 4, 100e-6)])
    assert rounded(out) == (SwapOut(7, 0, 0.0), SwapIn(7, 2, 4, 7.0))


def test_a_late_swap_in_moves_within_its_op():
    # 46 us - 0.05 * 100 us = 41 us = end of op 3 + 1 us
    p = plan(SwapOut(7, 0, 0.0), SwapIn(7, 3, 4, 6.0))
    out = advance_in_triggers(p, TL, [Late(7, 4, 100e-6)])
    assert rounded(out)[1] == SwapIn(7, 3, 4, 1.0)


def test_feedback_repeats_iteration_after_iteration_by_the_same_step():
    p = plan(SwapOut(7, 0, 0.0), SwapIn(7, 3, 4, 6.0))
    late = [Late(7, 4, 200e-6)]  # 10 us a step: 46 -> 36 -> 26 us
    p1 = advance_in_triggers(p, TL, late)
    p2 = advance_in_triggers(p1, TL, late)
    assert rounded(p1)[1] == SwapIn(7, 2, 4, 6.0)
    assert rounded(p2)[1] == SwapIn(7, 1, 4, 6.0)


def test_the_trigger_never_moves_before_the_eviction():
    # evicted after op 2 (30 us); 32 us - 5 us would be 27 us: stops at 30 us
    p = plan(SwapOut(7, 2, 0.0), SwapIn(7, 2, 4, 2.0))
    out = advance_in_triggers(p, TL, [Late(7, 4, 100e-6)])
    assert rounded(out)[1] == SwapIn(7, 2, 4, 0.0)
    # already at the eviction: nothing moves, the same plan comes back
    assert advance_in_triggers(out, TL, [Late(7, 4, 100e-6)]) is out


def test_only_the_named_swap_ins_move():
    p = plan(
        SwapOut(7, 0, 0.0),
        SwapIn(7, 3, 4, 2.0),
        SwapOut(8, 0, 0.0),
        SwapIn(8, 3, 4, 2.0),
        SwapIn(9, 3, 0, 0.0, next_iteration=True),
    )
    out = advance_in_triggers(p, TL, [Late(8, 4, 100e-6), Late(9, 0, 100e-6)])
    assert out.events[1] == p.events[1]
    assert rounded(out)[3] == SwapIn(8, 2, 4, 7.0)
    assert out.events[4] == p.events[4]
    assert advance_in_triggers(p, TL, []) is p

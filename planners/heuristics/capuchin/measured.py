"""Capuchin's measured start and its in-trigger feedback (§4.2, §4.4).

Capuchin does not predict: its first iteration runs with no plan (passive
mode catches what does not fit) while it records when each op ran; it then
plans from that measured timeline (`capuchin(..., timelines=...)`), and each
later iteration in which a swap-in arrived late moves that swap-in's
in-trigger earlier by a fraction of the copy's time (5%, §4.4).

Plain arrays and plans only: the app shell turns the simulator's reports
into these arguments (memplan/controllers.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from memplan.planners.analysis.optimes import Timeline
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Plan, SwapIn, SwapOut

# §4.4: "the in-trigger time of a tensor is moved forward by 5% of its swap time"
FEEDBACK_FRACTION = 0.05


def measured_timeline(
    op_start_s: np.ndarray, op_durations_s: np.ndarray, iteration_start_s: float, period_s: float
) -> Timeline:
    """The `Timeline` (microseconds from the iteration's start) of one
    observed iteration: op i started at `op_start_s[i]` and ran
    `op_durations_s[i]` seconds (simulation clock); the next iteration is
    taken to start `period_s` later. PlanError on times that are not finite,
    negative, or out of order."""
    start = np.asarray(op_start_s, np.float64)
    dur = np.asarray(op_durations_s, np.float64)
    if start.shape != dur.shape or start.ndim != 1:
        raise PlanError(f"measured timeline: {start.shape} starts but {dur.shape} durations")
    if not (np.isfinite(start).all() and np.isfinite(dur).all()) or (dur < 0).any():
        raise PlanError("measured timeline: op times must be finite, durations >= 0")
    rel = (start - iteration_start_s) * 1e6
    end = rel + dur * 1e6
    if len(rel) and (rel[0] < -1e-6 or (np.diff(rel) < -1e-6).any()):
        raise PlanError("measured timeline: op starts must follow the iteration start in order")
    # a zero-length op can end an ulp before the one before it: times are
    # made monotone, as the planners' searches over them need
    rel = np.maximum.accumulate(np.maximum(rel, 0.0)) if len(rel) else rel
    end = np.maximum.accumulate(np.maximum(end, rel)) if len(end) else end
    return Timeline(rel, end, max(period_s * 1e6, float(end[-1]) if len(end) else 0.0))


@dataclass(frozen=True, slots=True)
class Late:
    """A swap-in the compute waited for: `buffer` due before op `before_op`,
    its copy `copy_s` seconds long on the lane."""

    buffer: int
    before_op: int
    copy_s: float


# NOTE [ In-trigger feedback ]
# §4.4: a swap-in found late in iteration k starts earlier in iteration
# k + 1 by FEEDBACK_FRACTION of its swap time. A SwapIn's in-trigger is a
# time, the end of `after_op` plus `delay_us` on the measured timeline; the
# new trigger is that time less fraction x copy time, written again as
# (the latest op ending at or before it, the rest as delay). It never moves
# before the end of the access the buffer was evicted after (the SwapOut's
# `after_op`; the swap-out must be under way first); a trigger already there
# stays. Each late swap-in moves once per report; swap-ins not named, and
# `next_iteration` swap-ins (TENSILE's, not Capuchin's), are left alone.
def advance_in_triggers(
    plan: Plan, timeline: Timeline, late: Sequence[Late], fraction: float = FEEDBACK_FRACTION
) -> Plan:
    """`plan` with each late swap-in's in-trigger earlier by `fraction` of its
    copy time (NOTE [ In-trigger feedback ]); the same plan object when no
    event moves."""
    if not 0.0 < fraction <= 1.0:
        raise PlanError(f"feedback fraction={fraction!r} must be in (0, 1]")
    shift_us = {(x.buffer, x.before_op): x.copy_s * 1e6 * fraction for x in late}
    events = list(plan.events)
    moved = False
    for k, ev in enumerate(events):
        if not isinstance(ev, SwapIn) or ev.next_iteration:
            continue
        shift = shift_us.pop((ev.buffer, ev.before_op), None)
        if shift is None:
            continue
        floor = _evicted_after(events, ev)
        t_old = _at(timeline, ev.after_op) + ev.delay_us
        t_new = max(t_old - shift, _at(timeline, floor))
        if t_new >= t_old:
            continue
        after = int(np.searchsorted(timeline.end_us, t_new + 1e-9, "right")) - 1
        # a trigger the planner set past its deadline (an overhead it
        # accepted) keeps its op no later than the one before the deadline
        after = min(max(after, floor), ev.before_op - 1)
        delay = max(0.0, t_new - _at(timeline, after))
        events[k] = SwapIn(ev.buffer, after, ev.before_op, delay, ev.next_iteration)
        moved = True
    if not moved:
        return plan
    return Plan(plan.trace_fingerprint, tuple(events), plan.model)


def _at(tl: Timeline, after_op: int) -> float:
    """When a trigger after `after_op` fires (-1: the iteration's start)."""
    return 0.0 if after_op < 0 else float(tl.end_us[after_op])


def _evicted_after(events: list, swap_in: SwapIn) -> int:
    """The `after_op` of the latest SwapOut of the same buffer at or before
    the swap-in's trigger (-1 if none)."""
    best = -1
    for ev in events:
        if (
            isinstance(ev, SwapOut)
            and ev.buffer == swap_in.buffer
            and best < ev.after_op <= swap_in.after_op
        ):
            best = ev.after_op
    return best

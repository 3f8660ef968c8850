"""Between CP-SAT solutions and plans: the read-out of a solution as plan
events, and the gap decisions another planner's plan makes (for hints).

Every copy is pinned to its model start time by a (trigger op, delay) pair:
the trigger is the latest op that ends at or before the start (NOTE [ CP-SAT
semantics ] in `cpsat_model.py` explains why such an op always exists for a
swap-in, after its swap-out has ended).
"""

from __future__ import annotations

import bisect

from planners.cpsat_data import TICKS_PER_US, CpsatData, GapKind
from planners.cpsat_solution import KEEP, RECOMPUTE, SWAP, Solution
from planners.plan import Event, Plan, Recompute, Release, SwapIn, SwapOut, fingerprint_of
from planners.vanilla import release_only_plan

_RANK = {Release: 0, SwapOut: 1, SwapIn: 2}


def _trigger(end: list[int], t: int, lo: int) -> tuple[int, int]:
    """(op, delay ticks): the latest op >= `lo` ending at or before `t`, or
    `lo` itself (-1 = the iteration start, at 0)."""
    k = bisect.bisect_right(end, t) - 1
    k = max(k, lo)
    return k, t - (end[k] if k >= 0 else 0)


def _us(ticks: int) -> float:
    return ticks / TICKS_PER_US


def plan_from_solution(data: CpsatData, sol: Solution) -> Plan:
    """The plan that makes the simulator run `sol`: release-only releases,
    plus per gap a swap (SwapOut or, with a valid host copy, Release; then
    SwapIn) or a Release and a Recompute."""
    trace = data.trace
    end = list(sol.end)
    T = sol.iteration_ticks
    timed: list[Event] = list(release_only_plan(trace).events)
    recomputes: list[Recompute] = []
    for g in data.gaps:
        mode, b = sol.mode[g.id], g.buffer
        if mode == KEEP:
            continue
        if mode == RECOMPUTE:
            timed.append(Release(b, g.a))
            recomputes.append(Recompute(b, g.c, (g.recompute_op,)))
            continue
        assert mode == SWAP
        if sol.copy[g.id]:
            op, delay = _trigger(end, sol.out_start[g.id], g.a)
            timed.append(SwapOut(b, op, _us(delay)))
        else:
            timed.append(Release(b, g.a))
        t_in = sol.in_start[g.id]
        if g.kind is GapKind.CROSS and t_in >= T:
            # starts in the next iteration, before the first access there
            op, delay = _trigger(end, t_in - T, -1)
            timed.append(SwapIn(b, op, g.c, _us(delay)))
        else:
            op, delay = _trigger(end, t_in, g.a)
            timed.append(SwapIn(b, op, g.c, _us(delay), next_iteration=g.kind is GapKind.CROSS))
    timed.sort(key=lambda ev: (ev.after_op, _RANK[type(ev)], ev.buffer))
    recomputes.sort(key=lambda ev: (ev.before_op, ev.buffer))
    return Plan(fingerprint_of(trace), (*timed, *recomputes), trace.meta.model)


def modes_from_plan(data: CpsatData, plan: Plan) -> list[int]:
    """The gap decisions `plan` makes, as the model names them: a gap is
    swapped if a SwapIn brings its buffer back for the access that closes it,
    recomputed if a Recompute does, kept otherwise."""
    swapped: set[tuple[int, int, bool]] = set()
    recomputed: set[tuple[int, int]] = set()
    for ev in plan.events:
        if isinstance(ev, SwapIn):
            swapped.add((ev.buffer, ev.before_op, ev.next_iteration))
        elif isinstance(ev, Recompute):
            recomputed.add((ev.buffer, ev.before_op))
    modes = []
    for g in data.gaps:
        cross = g.kind is GapKind.CROSS
        if (g.buffer, g.c, cross) in swapped or (cross and (g.buffer, g.c, False) in swapped):
            modes.append(SWAP)
        elif g.recomputable and (g.buffer, g.c) in recomputed:
            modes.append(RECOMPUTE)
        else:
            modes.append(KEEP)
    return modes

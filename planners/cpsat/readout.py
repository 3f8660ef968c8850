"""Between CP-SAT solutions and plans: the read-out of a solution as plan
events, and the gap decisions another planner's plan makes (for hints).

Every copy is pinned to its model start time by a (trigger op, delay) pair:
the trigger is the latest op that ends at or before the start (NOTE [ CP-SAT
semantics ] in `cpsat/model.py` explains why such an op always exists for a
swap-in, after its swap-out has ended).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from memplan.planners.core.plan import (
    Event,
    Plan,
    Recompute,
    Release,
    SwapIn,
    SwapOut,
    fingerprint_of,
)
from memplan.planners.cpsat.data import TICKS_PER_US, CpsatData, GapKind
from memplan.planners.cpsat.spec import KEEP, RECOMPUTE, SWAP, Solution
from memplan.planners.heuristics.vanilla import release_only_plan

_RANK = {Release: 0, SwapOut: 1, SwapIn: 2}


def _trigger(end: list[int], t: int, lo: int, start: int) -> tuple[int, int]:
    """(op, delay ticks): the latest op >= `lo` ending at or before `t`, or
    `lo` itself (-1 = the iteration start, at `start`)."""
    k = bisect.bisect_right(end, t) - 1
    k = max(k, lo)
    return k, t - (end[k] if k >= 0 else start)


def _us(ticks: int) -> float:
    return ticks / TICKS_PER_US


def plans_from_solution(data: CpsatData, sol: Solution) -> tuple[Plan, ...]:
    """The plans (one per job) that make the simulator run `sol`: release-only
    releases, plus per gap a swap (SwapOut or, with a valid host copy,
    Release; then SwapIn) or a Release and a Recompute. Every event is
    triggered by an op of its own job (NOTE [ Several jobs ])."""
    T = sol.iteration_ticks
    timed: list[list[Event]] = [list(release_only_plan(t).events) for t in data.traces]
    recomputes: list[list[Recompute]] = [[] for _ in data.traces]
    ends = [[sol.end[p] for p in pos.tolist()] for pos in data.order.pos]
    # a job's iteration starts when its previous one ends (0 for one job)
    starts = [end[-1] - T for end in ends]
    op = data.order.op.tolist()
    for g in data.gaps:
        mode, j = sol.mode[g.id], g.job
        if mode == KEEP:
            continue
        b, end, start = g.buffer - int(data.buf0[j]), ends[j], starts[j]
        a = op[g.a] if g.a >= 0 else -1
        c = op[g.c]
        if mode == RECOMPUTE:  # NOTE [ Recompute chains ] in cpsat/chains.py
            timed[j].append(Release(b, a))
            recomputes[j].append(Recompute(b, op[sol.rec_at[g.id]], (op[g.recompute_op],)))
            continue
        assert mode == SWAP
        if sol.copy[g.id]:
            k, delay = _trigger(end, sol.out_start[g.id], a, start)
            # its first hot op waits for it (NOTE [ Swap-out deadlines in the model ])
            due = op[g.hot[0]] if sol.wait[g.id] else -1
            timed[j].append(SwapOut(b, k, _us(delay), before_op=due))
        else:
            timed[j].append(Release(b, a))
        t_in = sol.in_start[g.id]
        if g.kind is GapKind.CROSS and t_in >= T:
            # starts in the next iteration, before the first access there
            k, delay = _trigger(end, t_in - T, -1, start)
            timed[j].append(SwapIn(b, k, c, _us(delay)))
        else:
            k, delay = _trigger(end, t_in, a, start)
            timed[j].append(SwapIn(b, k, c, _us(delay), next_iteration=g.kind is GapKind.CROSS))
    plans = []
    for t, ev, rc in zip(data.traces, timed, recomputes, strict=True):
        ev.sort(key=lambda e: (e.after_op, _RANK[type(e)], e.buffer))
        rc.sort(key=lambda e: (e.before_op, e.buffer))
        plans.append(Plan(fingerprint_of(t), (*ev, *rc), t.meta.model))
    return tuple(plans)


def modes_from_plans(data: CpsatData, plans: Sequence[Plan]) -> tuple[list[int], list[int]]:
    """(mode, recompute position or -1) per gap for the decisions `plans` (one
    per job) make, as the model names them: a gap is swapped if a SwapIn
    brings its buffer back for the access that closes it, recomputed if a
    Recompute makes it before one of the gap's recompute points, kept
    otherwise; then made consistent with the model's rules (`_consistent`)."""
    swapped: set[tuple[int, int, int, bool]] = set()
    recomputed: set[tuple[int, int, int]] = set()
    at_start: set[tuple[int, int]] = set()  # (job, buffer) swapped out after op -1
    for j, plan in enumerate(plans):
        for ev in plan.events:
            if isinstance(ev, SwapIn):
                swapped.add((j, ev.buffer, ev.before_op, ev.next_iteration))
            elif isinstance(ev, Recompute):
                recomputed.add((j, ev.buffer, ev.before_op))
            elif isinstance(ev, SwapOut) and ev.after_op == -1:
                at_start.add((j, ev.buffer))
    persistent = [bool(x) for t in data.traces for x in t.persistent]
    op = data.order.op.tolist()
    modes, at = [], []
    for g in data.gaps:
        cross = g.kind is GapKind.CROSS
        b = g.buffer - int(data.buf0[g.job])
        key = (g.job, b, op[g.c])
        points = [p.op for p in g.rec_points if (g.job, b, op[p.op]) in recomputed]
        # a persistent buffer's swap-in before its first access closes its HEAD gap if
        # it went out at the iteration start, else its CROSS gap (NOTE [ State at the
        # iteration start ] in cpsat/model.py)
        head = (g.job, b) in at_start
        if persistent[g.buffer] and g.kind is GapKind.HEAD:
            hit = head and (*key, False) in swapped
        elif cross:
            hit = not head and ((*key, True) in swapped or (*key, False) in swapped)
        else:
            hit = (*key, False) in swapped
        if hit:
            modes.append(SWAP)
            at.append(-1)
        elif points:
            modes.append(RECOMPUTE)
            at.append(points[0])
        else:
            modes.append(KEEP)
            at.append(-1)
    _consistent(data, modes, at)
    return modes, at


def _consistent(data: CpsatData, modes: list[int], at: list[int]) -> None:
    """Make another planner's recomputations follow the model's rules (NOTE
    [ Recompute ] in cpsat/model.py), in place: a source that the plan made
    as a chain temporary is pulled to the recomputation that reads it where
    the model allows, else the recomputation is kept instead; a pulled one
    no recomputation reads goes back to its own access."""
    gaps = data.gaps
    for _ in range(len(gaps) + 1):
        changed = False
        for g in gaps:
            if modes[g.id] != RECOMPUTE:
                continue
            pt = g.rec_points[g.point_index(at[g.id])]
            for sid in pt.sources:
                if modes[sid] == RECOMPUTE and at[sid] > pt.op:
                    k = gaps[sid].point_index(pt.op)
                    if k >= 0 and g.id in gaps[sid].rec_points[k].pullers:
                        at[sid], changed = pt.op, True
            if any(
                modes[s] == SWAP or (modes[s] == RECOMPUTE and at[s] > pt.op) for s in pt.sources
            ):
                modes[g.id], at[g.id], changed = KEEP, -1, True
            elif pt.pullers and not any(
                modes[h] == RECOMPUTE and at[h] == pt.op for h in pt.pullers
            ):
                at[g.id], changed = g.c, True
        if not changed:
            return

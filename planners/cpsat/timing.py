"""The model's timing for another planner's decisions, following that
planner's own triggers: a complete start from which CP-SAT completes a hint
(NOTE [ Hints ] in cpsat/hints.py) at once, where it would otherwise search
for a first timing of many swaps on one lane.

The timing is the model's rules (NOTE [ CP-SAT semantics ] in
cpsat/model.py) played forward: ops back to back but for the swap-ins they
wait for and the copy-outs their first hot op waits for (where the plan set
a deadline and the copy would not end in time, NOTE [ Swap-out deadlines in
the model ]: the model's op waits at the gap's first hot op, the plan's
perhaps later, so both readings are timed and the better kept); each copy-out asked for when its gap opens, each copy-in when
the plan's SwapIn fires (or its copy-out ends, if later); copies served
first come, first served on their lane. Absence is then wherever both ends
allow it. Nothing here is trusted: the solver checks the start and repairs
what does not hold (a copy-in too early to leave a hole, a cross-iteration
copy-in that would stall).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from memplan.planners.core.plan import Plan, SwapIn, SwapOut
from memplan.planners.cpsat.data import TICKS_PER_US, CpsatData, Gap, GapKind
from memplan.planners.cpsat.solution import model_peak
from memplan.planners.cpsat.spec import KEEP, RECOMPUTE, SWAP, Solution

ROUNDS = 40  # rounds of keeping swaps that leave no hole


def plan_timing(
    data: CpsatData, modes: Sequence[int], rec_at: Sequence[int], plans: Sequence[Plan]
) -> Solution | None:
    """The model's solution for `modes` / `rec_at` timed after `plans` (one
    job; None for several). A swap that leaves no hole in this timing (its
    copy-in fires before a hot op could see it gone) is kept instead: the
    solution's modes are the ones to fix."""
    if data.n_jobs != 1:
        return None
    # waiting where the plan's deadline is (at or before the first hot op),
    # or wherever it set one: the first that fits the budget, else the lower
    timed = [_holes(data, modes, rec_at, plans, eager) for eager in (False, True)]
    timed = [t for t in timed if t is not None]
    if not timed:
        return None
    return min(timed, key=lambda t: (t.peak_bytes > data.threshold, t.peak_bytes, t.end[-1]))


def _holes(
    data: CpsatData, modes: Sequence[int], rec_at: Sequence[int], plans: Sequence[Plan], eager: bool
) -> Solution | None:
    """The timing with every swap that leaves no hole kept."""
    modes = list(modes)
    for _ in range(ROUNDS):
        sol = _timed(data, modes, rec_at, plans, eager)
        holeless = [g.id for g in data.gaps if sol.mode[g.id] == SWAP and sol.absent[g.id][0] < 0]
        if not holeless:
            return sol
        for gid in holeless:
            modes[gid] = KEEP
    return None


def _timed(
    data: CpsatData, modes: Sequence[int], rec_at: Sequence[int], plans: Sequence[Plan], eager: bool
) -> Solution:
    swapped = [g for g in data.gaps if modes[g.id] == SWAP]
    copy = {g.id: not any(modes[j] == SWAP for j in g.epoch_prev) for g in swapped}
    fire, deadline = _triggers(plans[0], swapped, eager)
    persistent = data.traces[0].persistent
    wants_wait = {
        g.id: copy[g.id] and deadline.get(g.id, False) and not persistent[g.buffer] for g in swapped
    }
    rec = np.zeros(data.n_ops, np.int64)
    for g in data.gaps:
        if modes[g.id] == RECOMPUTE:
            rec[rec_at[g.id]] += int(data.dur[g.recompute_op])
    fw = _Forward(data, swapped, copy, fire, wants_wait, rec)
    fw.run()
    times = {g.id: (fw.out.get(g.id, -1), fw.inn[g.id]) for g in swapped}
    return _solution(data, modes, rec_at, swapped, copy, times, fw.wait, fw.ready, fw.end)


def _triggers(
    plan: Plan, swapped: list[Gap], eager: bool
) -> tuple[dict[int, tuple[int, int, bool]], dict]:
    """Per swapped gap: its SwapIn's (after op, delay ticks, next iteration),
    and whether a SwapOut within it sets a deadline at or before the gap's
    first hot op, where the model's op waits (any deadline if `eager`; else
    a later one is left out, and the hole starts when the copy has ended)."""
    ins: dict[tuple[int, int], SwapIn] = {}
    outs: dict[int, list[SwapOut]] = {}
    for ev in plan.events:
        if isinstance(ev, SwapIn):
            ins.setdefault((ev.buffer, ev.before_op), ev)
        elif isinstance(ev, SwapOut):
            outs.setdefault(ev.buffer, []).append(ev)
    fire: dict[int, tuple[int, int, bool]] = {}
    deadline: dict[int, bool] = {}
    for g in swapped:
        ev = ins.get((g.buffer, g.c))
        if ev is not None:
            delay = int(round(ev.delay_us * TICKS_PER_US))
            wrapped = g.kind is GapKind.CROSS and ev.after_op < g.a
            fire[g.id] = (ev.after_op, delay, wrapped)
        deadline[g.id] = any(
            0 <= o.before_op <= (g.c if eager else g.hot[0])
            and g.a <= o.after_op < (g.c if g.c > g.a else 1 << 62)
            for o in outs.get(g.buffer, ())
        )
    return fire, deadline


class _Forward:
    """One pass over the ops in order (module docstring). Every copy is asked
    for by the end of an op (or the iteration start) and served first come,
    first served; an op's ready time needs only copies asked for before it,
    so the lane is played forward as far as each op needs."""

    def __init__(
        self,
        data: CpsatData,
        swapped: list[Gap],
        copy: dict[int, bool],
        fire: dict[int, tuple[int, int, bool]],
        wants_wait: dict[int, bool],
        rec: np.ndarray,
    ):
        self.data, self.copy, self.fire, self.rec = data, copy, fire, rec
        self.gap = {g.id: g for g in swapped}
        n = data.n_ops
        self.end = np.zeros(n, np.int64)
        self.ready = np.zeros(n, np.int64)
        self.out: dict[int, int] = {}  # copy-out start
        self.inn: dict[int, int] = {}  # copy-in start (a period later if wrapped)
        self.wait: dict[int, bool] = {}
        self.heap: list[tuple[int, int, int, int]] = []  # (request, seq, 0 out / 1 in, gap)
        self.free = [0, 0]  # when the lane is free: one lane, or one per direction
        self.trig: dict[int, int] = {}  # when a copy-in's trigger fired
        self.opens: dict[int, list[int]] = {}  # op -> gaps whose copy-out it asks for
        self.fires: dict[int, list[int]] = {}  # op -> gaps whose copy-in it triggers
        self.due_in: dict[int, list[int]] = {}  # op -> copy-ins it waits for
        self.wait_at: dict[int, list[int]] = {}  # op -> copy-outs it may wait for
        for g in swapped:
            after = fire.get(g.id, (g.hot[-1], data.margin, False))[0]
            self.fires.setdefault(after, []).append(g.id)
            self.opens.setdefault(g.a, []).append(g.id)
            if g.kind is not GapKind.CROSS:
                self.due_in.setdefault(g.c, []).append(g.id)
            if wants_wait[g.id]:
                self.wait_at.setdefault(g.hot[0], []).append(g.id)

    def run(self) -> None:
        data, m = self.data, self.data.margin
        self._done(-1, 0)
        prev = 0
        for k in range(data.n_ops):
            r = prev
            for gid in self.due_in.get(k, ()):
                r = max(r, self._start(gid, 1) + int(data.in_ticks[self.gap[gid].buffer]))
            for gid in self.wait_at.get(k, ()):
                out_end = self._start(gid, 0) + int(data.out_ticks[self.gap[gid].buffer])
                self.wait[gid] = out_end + m > prev
                if self.wait[gid]:
                    r = max(r, out_end)
            self.ready[k] = r
            prev = self.end[k] = r + int(self.rec[k]) + int(data.dur[k])
            self._done(k, prev)
        while self.heap:
            self._serve()
        T = int(self.end[-1])
        for gid in self.gap:  # a copy-in that fires in the next iteration
            if self.fire.get(gid, (0, 0, False))[2]:
                self.inn[gid] += T

    def _done(self, k: int, t: int) -> None:
        """Op k (-1: the iteration start) ended at t: the copies it asks for."""
        for gid in self.opens.get(k, ()):
            if self.copy[gid]:
                self._push(t, 0, gid)
            else:
                self.out[gid] = -1
                self._ask_in(gid)
        for gid in self.fires.get(k, ()):
            delay = self.fire.get(gid, (0, self.data.margin, False))[1]
            self.trig[gid] = t + delay
            self._ask_in(gid)

    def _ask_in(self, gid: int) -> None:
        """Ask for gid's copy-in once its trigger fired and its copy-out (if
        any, and in the same period) ended."""
        if gid not in self.trig or gid in self.inn:
            return
        wrapped = self.fire.get(gid, (0, 0, False))[2]
        if wrapped:
            self._push(self.trig[gid], 1, gid)
            return
        if gid not in self.out:
            return
        g = self.gap[gid]
        out_end = self.out[gid] + int(self.data.out_ticks[g.buffer]) if self.copy[gid] else 0
        self._push(max(self.trig[gid], out_end), 1, gid)

    def _push(self, request: int, kind: int, gid: int) -> None:
        heapq.heappush(self.heap, (request, len(self.heap), kind, gid))

    def _start(self, gid: int, kind: int) -> int:
        """The start of gid's copy (0 out, 1 in), serving the lane up to it."""
        done = self.inn if kind else self.out
        while gid not in done and self.heap:
            self._serve()
        return done.get(gid, 0)

    def _serve(self) -> None:
        req, _seq, kind, gid = heapq.heappop(self.heap)
        data = self.data
        lane = 0 if data.lanes == 1 else kind
        start = max(req, self.free[lane])
        b = self.gap[gid].buffer
        self.free[lane] = start + int((data.in_ticks if kind else data.out_ticks)[b])
        if kind:
            self.inn[gid] = start
        else:
            self.out[gid] = start
            self._ask_in(gid)


def _solution(
    data: CpsatData,
    modes: Sequence[int],
    rec_at: Sequence[int],
    swapped: list[Gap],
    copy: dict[int, bool],
    times: dict[int, tuple[int, int]],
    wait: dict[int, bool],
    ready: np.ndarray,
    end: np.ndarray,
) -> Solution:
    """The solution record, each swapped gap absent wherever both its copies
    allow (NOTE [ CP-SAT semantics ])."""
    n_g, m = len(data.gaps), data.margin
    out_s, in_s = [-1] * n_g, [-1] * n_g
    absent, cp, waits = [(-1, -1)] * n_g, [False] * n_g, [False] * n_g
    hot = data.hot.tolist()
    for g in swapped:
        o, i = times[g.id]
        out_s[g.id], in_s[g.id], cp[g.id] = o, i, copy[g.id]
        waits[g.id] = wait.get(g.id, False)
        o_end = o + int(data.out_ticks[g.buffer]) if copy[g.id] else -1
        inside = [
            h
            for h in g.hot_idx
            if (o_end + m <= (int(end[hot[h] - 1]) if hot[h] else 0) or not copy[g.id]
                or (waits[g.id] and h == g.hot_idx[0]))
            and i >= int(end[hot[h]]) + m
        ]  # fmt: skip
        if inside:
            absent[g.id] = (inside[0], inside[-1])
    for g in data.gaps:
        if modes[g.id] == RECOMPUTE:
            absent[g.id] = g.rec_span(rec_at[g.id])
    sol = Solution(
        tuple(modes),
        tuple(cp),
        tuple(out_s),
        tuple(in_s),
        tuple(absent),
        tuple(r if modes[k] == RECOMPUTE else -1 for k, r in enumerate(rec_at)),
        tuple(waits),
        tuple(int(x) for x in ready),
        tuple(int(x) for x in end),
        0,
    )
    return replace(sol, peak_bytes=model_peak(data, sol))

"""AutoSwap's selection (§IV-D) and swap scheduling (§IV-E).

- `schedule(state, chosen)`: the copies of a set of candidates in access
  order, the holes they cut and the memory that is left
  (NOTE [ AutoSwap scheduling ]).
- `select(state, order, budget)`: the candidates taken in score order until
  the scheduled peak fits (NOTE [ AutoSwap selection ]).
- `events(state, sched)`: the plan events of a schedule, per job.

Times are microseconds, sizes bytes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from memplan.planners.analysis import EPS_US
from memplan.planners.core.plan import Event, SwapIn, SwapOut
from memplan.planners.heuristics.autoswap.scores import AutoSwapJob, Candidate
from memplan.planners.heuristics.tensile.job import us


@dataclass(frozen=True, slots=True)
class State:
    """What a schedule is made from: the jobs, their candidates and the
    device's lane count."""

    jobs: tuple[AutoSwapJob, ...]
    cands: tuple[Candidate, ...]
    lanes: int


@dataclass(frozen=True, slots=True)
class Swap:
    """A scheduled candidate: its swap-out chained to start at `s_out`, its
    swap-in at `s_in` (us); off the device while ops lo..hi run."""

    cand: int
    s_out: float
    s_in: float
    lo: int
    hi: int


@dataclass(frozen=True, slots=True)
class Schedule:
    """The swaps of the chosen candidates, each job's memory per op and the
    peak (the sum of the jobs' peaks)."""

    swaps: tuple[Swap, ...]
    curves: tuple[np.ndarray, ...]
    peak_bytes: int


# NOTE [ AutoSwap scheduling ]
# §IV-E (Fig. 7): swap-outs in order of the access they follow, each starting when that
# access ends or when the swap-out before it ends; swap-ins by their next access, one at a
# time, chained back from the last (each ends when its access is ready or the next one
# starts, whichever is earlier). Both chains are computed on the predicted timeline, one
# stream per direction and job. The plan triggers each swap-out right after its access and
# each swap-in at its chained start (`delay_us` after the last op ending before it). The
# buffer is off the device for ops lo..hi, widened to hold the gap's ops in the peak time
# (NOTE [ AutoSwap candidates ]). A chain that runs late makes AutoSwap's malloc wait, so
# each swap-out's `before_op` is lo (planners.core.plan NOTE [ Swap-out deadlines ]) and a
# swap-in is triggered no earlier than after op hi: the op-grid memory holds however the
# lane runs, and late copies show as stall, the overhead BO minimises. Hence no `LaneSet`
# here: AutoSwap does not skip a copy that cannot hide, it queues it.
# Full text: docs/notes.md, "AutoSwap scheduling".
def schedule(state: State, chosen: Sequence[int]) -> Schedule:
    """Schedule the candidates `chosen` (NOTE [ AutoSwap scheduling ])."""
    jobs, cands = state.jobs, state.cands
    keep = list(dict.fromkeys(chosen))
    s_out: dict[int, float] = {}
    e_out: dict[int, float] = {}
    free = [0.0] * len(jobs)  # per job: when its swap-out stream is free
    for i in sorted(keep, key=lambda i: (cands[i].job, cands[i].prev, cands[i].buffer)):
        c = cands[i]
        jb = jobs[c.job]
        s_out[i] = max(jb.timeline.unrolled_end(c.prev), free[c.job])
        e_out[i] = free[c.job] = s_out[i] + float(jb.d_out[c.buffer])
    busy = [math.inf] * len(jobs)  # per job: when the next swap-in starts
    swaps: list[Swap] = []
    for i in sorted(keep, key=lambda i: (cands[i].job, -cands[i].nxt, cands[i].buffer)):
        c = cands[i]
        jb = jobs[c.job]
        tl = jb.timeline
        e_in = min(tl.unrolled_ready(c.nxt) - EPS_US, busy[c.job])
        s_in = busy[c.job] = e_in - float(jb.d_in[c.buffer])
        lo = int(np.searchsorted(tl.ready_us, e_out[i] + EPS_US, "left"))
        hi = int(np.searchsorted(tl.end_us, s_in - EPS_US, "right")) - 1
        swaps.append(Swap(i, s_out[i], s_in, min(lo, c.first), max(hi, c.last)))
    swaps.sort(key=lambda s: s.cand)
    curves = []
    for j, jb in enumerate(jobs):
        diff = np.zeros(len(jb.load) + 1, np.int64)
        for s in swaps:
            c = cands[s.cand]
            if c.job == j:
                diff[s.lo] -= c.nbytes
                diff[s.hi + 1] += c.nbytes
        curves.append(jb.load + np.cumsum(diff[:-1]))
    peak = sum(int(c.max()) if len(c) else 0 for c in curves)
    return Schedule(tuple(swaps), tuple(curves), peak)


# NOTE [ AutoSwap selection ]
# §IV-D takes the candidates in descending score and stops as soon as the
# peak memory load is within the limit. We hold the limit to the peak of the
# *scheduled* swaps (NOTE [ AutoSwap scheduling ]), which is what the plan
# will do, so the answer is the shortest prefix of the ranking whose
# schedule fits. Scheduling a prefix books all its copies again (adding a
# candidate can move the copies after it in access order), so instead of
# one schedule per candidate we search the prefix length: double it until
# the schedule fits, then bisect between the last two lengths. Where adding
# candidates only ever lowers the scheduled peak this is the shortest
# fitting prefix; where a longer prefix can peak higher (its swap-outs
# queue behind each other) it is a fitting prefix at most twice as long.
# With no prefix fitting, every candidate is taken: the plan then falls
# short and says so.
def select(state: State, order: Sequence[int], budget: int | None) -> tuple[int, Schedule]:
    """(prefix length taken, its schedule) for the ranking `order`
    (NOTE [ AutoSwap selection ]); without a budget, every candidate."""
    n = len(order)
    cache: dict[int, Schedule] = {}

    def at(k: int) -> Schedule:
        if k not in cache:
            cache[k] = schedule(state, order[:k])
        return cache[k]

    if budget is None or n == 0 or at(n).peak_bytes > budget:
        return n, at(n)
    if at(0).peak_bytes <= budget:
        return 0, at(0)
    lo, hi = 0, 1  # at(lo) does not fit
    while hi < n and at(hi).peak_bytes > budget:
        lo, hi = hi, min(2 * hi, n)
    while hi - lo > 1:  # at(hi) fits, at(lo) does not
        mid = (lo + hi) // 2
        if at(mid).peak_bytes <= budget:
            hi = mid
        else:
            lo = mid
    return hi, at(hi)


def events(state: State, sched: Schedule) -> list[list[Event]]:
    """The plan events of `sched`, per job, in trigger order."""
    out: list[list[Event]] = [[] for _ in state.jobs]
    for s in sched.swaps:
        c = state.cands[s.cand]
        tl = state.jobs[c.job].timeline
        delay_in = max(0.0, s.s_in - tl.unrolled_end(s.hi))  # within op hi + 1
        out[c.job].append(SwapOut(c.buffer, c.prev, before_op=s.lo))
        out[c.job].append(SwapIn(c.buffer, s.hi, c.nxt, us(delay_in)))
    for evs in out:
        evs.sort(key=lambda e: (e.after_op, isinstance(e, SwapIn), e.buffer))
    return out

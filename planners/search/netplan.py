"""The runtime safety net's choices as plan events.

A run under an OOM policy (passive: Capuchin's LRU swapping; dtr) that
finishes tells which buffers had to leave the device and when they came
back (`NetMove`s). Written down as plan events, the same choices fit without
the net, and the planner can then hide what the net could not: the net
copies synchronously and fetches on demand, a plan copies out right after
the last access and prefetches. See NOTE [ From the net to a plan ].
"""

from __future__ import annotations

from collections.abc import Sequence

from memplan.planners.analysis.accesses import access_table
from memplan.planners.core.evaluate import NetMove
from memplan.planners.core.plan import Event, Plan, Recompute, Release, SwapIn, SwapOut
from memplan.traces.model import Trace

# NOTE [ From the net to a plan ]
# The moves of the job's last simulated iteration (the steady one) are read
# per buffer in time order. An eviction at op k followed by a restore for op
# m becomes, with p the buffer's last access before k (-1: the iteration's
# start):
# - swapped (a host copy): SwapOut(after p, deadline k) -- the copy starts
#   right after the last use instead of when op k needs the room, and op k
#   waits for it as it waited for the net -- and SwapIn(after m - 1, before
#   m), which brings it back when the net did (on demand); `prefetch_moves`
#   then moves that trigger earlier where the search finds it pays;
# - dropped (DTR, no host copy): Release(after p) and Recompute(before m,
#   the ops the net re-ran).
# A restore with no eviction before it in the iteration pairs with the last
# eviction of that buffer (a persistent buffer evicted late in one iteration
# and needed early in the next): SwapIn(after the last op, before m,
# next_iteration). An eviction never restored in the iteration is a
# Release after p (nothing reads it again), or for a persistent buffer a swap
# back before its first access of the next iteration. Events the base plan
# already has stay; the result is checked by the caller.


def plan_from_net(
    trace: Trace, base: Plan, moves: Sequence[NetMove], job: int, iteration: int
) -> tuple[Plan, tuple[Event, ...]]:
    """`base` plus the net's moves of `job` in `iteration` as events (NOTE
    [ From the net to a plan ]); returns the plan and the events added."""
    table = access_table(trace)
    n = trace.n_ops
    per_buffer: dict[int, list[NetMove]] = {}
    for m in moves:
        if m.job == job and m.iteration == iteration:
            per_buffer.setdefault(m.buffer, []).append(m)
    added: list[Event] = []
    for b, seq in sorted(per_buffer.items()):
        acc = table.accesses(b).tolist()
        persistent = bool(trace.persistent[b])
        first_restore: NetMove | None = None
        evicted: NetMove | None = None
        for m in seq:
            if m.kind == "evict":
                evicted = m
            elif evicted is None:
                first_restore = first_restore or m
            else:
                added += _pair(b, evicted, m.op, m, acc, next_iteration=False, n=n)
                evicted = None
        if evicted is None:
            continue
        if persistent and acc:
            m_op = first_restore.op if first_restore else acc[0]
            added += _pair(b, evicted, m_op, first_restore, acc, next_iteration=True, n=n)
        elif not persistent:
            added.append(Release(b, _prev_access(acc, evicted.op)))
    events = (*base.events, *added)
    return Plan(base.trace_fingerprint, events, base.model), tuple(added)


def _prev_access(acc: list[int], op: int) -> int:
    prev = [a for a in acc if a < op]
    return prev[-1] if prev else -1


def _pair(
    b: int,
    evict: NetMove,
    restore_op: int,
    restore: NetMove | None,
    acc: list[int],
    *,
    next_iteration: bool,
    n: int,
) -> list[Event]:
    p = _prev_access(acc, evict.op)
    if not evict.swapped:
        ops = restore.ops if restore is not None and restore.ops else ()
        if not ops or next_iteration:
            return []
        return [Release(b, p), Recompute(b, restore_op, ops)]
    out: list[Event] = [SwapOut(b, p, before_op=evict.op if evict.op > p else -1)]
    if next_iteration:
        out.append(SwapIn(b, n - 1, restore_op, next_iteration=True))
    else:
        out.append(SwapIn(b, max(restore_op - 1, evict.op), restore_op))
    return out

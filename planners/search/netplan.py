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

from memplan.planners.analysis.accesses import AccessTable, access_table
from memplan.planners.core.evaluate import MoveKind, NetMove
from memplan.planners.core.plan import Event, Plan, Recompute, Release, SwapIn, SwapOut
from memplan.traces.model import Trace

# NOTE [ From the net to a plan ]
# The net's moves in the job's last (steady) simulated iteration, per buffer in time order.
# An eviction at op k restored for op m, with p the buffer's last access before k:
# - swapped: SwapOut(after p, deadline k) and SwapIn(after m - 1, before m), on demand as
#   the net did (`prefetch_moves` moves the trigger earlier where it pays);
# - dropped (DTR): Release(after p) and Recompute(before m, the ops the net re-ran). A remade
#   input still alive gets its own Recompute; a dead one is an intermediate op of the next
#   chain; siblings a remake kept get their own Recompute (`_siblings`).
# A restore with no eviction before it pairs with the buffer's last eviction
# (SwapIn(after the last op, before m, next_iteration)); an eviction never restored is a
# Release after p, or for a persistent buffer a swap back before its next-iteration access.
# Events the base plan has stay; the caller checks the result.
# Full text: docs/notes.md, "From the net to a plan".


def plan_from_net(
    trace: Trace, base: Plan, moves: Sequence[NetMove], job: int, iteration: int
) -> tuple[Plan, tuple[Event, ...]]:
    """`base` plus the net's moves of `job` in `iteration` as events (NOTE
    [ From the net to a plan ]); returns the plan and the events added."""
    table = access_table(trace)
    n = trace.n_ops
    planned = {(e.buffer, e.before_op) for e in base.events if isinstance(e, Recompute)}
    per_buffer: dict[int, list[NetMove]] = {}
    mine = [m for m in moves if m.job == job and m.iteration == iteration]
    for m in _siblings(trace, table, _chains(trace, mine)):
        per_buffer.setdefault(m.buffer, []).append(m)
    added: list[Event] = []
    for b, seq in sorted(per_buffer.items()):
        acc = table.accesses(b).tolist()
        persistent = bool(trace.persistent[b])
        first_restore: NetMove | None = None
        evicted: NetMove | None = None
        back = -1  # the op the buffer was last brought back for
        for m in seq:
            if m.kind == MoveKind.EVICT:
                evicted = m
            elif evicted is not None:
                added += _pair(b, evicted, m.op, m, _since(acc, evicted.op, back), n)
                evicted, back = None, m.op
            elif not m.swapped and m.ops and (b, m.op) not in planned:
                # remade as a source of another remake: its own Recompute
                added.append(Recompute(b, m.op, m.ops))
                back = m.op
            else:
                first_restore = first_restore or m
        if evicted is None:
            continue
        p = _since(acc, evicted.op, back)
        if persistent and acc and evicted.swapped:
            m_op = first_restore.op if first_restore else acc[0]
            added += [_out(b, evicted, p), SwapIn(b, n - 1, m_op, next_iteration=True)]
        elif not persistent:
            added.append(Release(b, p))
    seen = set(base.events)
    added = [e for e in added if not (e in seen or seen.add(e))]
    events = (*base.events, *added)
    return Plan(base.trace_fingerprint, events, base.model), tuple(added)


def _chains(trace: Trace, moves: list[NetMove]) -> list[NetMove]:
    """Remakes before one op, in the order they ran, folded into chains: a
    buffer remade that is dead at that op (released, or past its last access)
    was a temporary of the remake -- its producer (and the dead ones before
    it) joins the ops of each live buffer remade for that op whose producer
    reads it, as a Recompute chain's intermediate (NOTE [ From the net to a
    plan ])."""
    last = trace.last_access
    out: list[NetMove] = []
    dead: dict[int, frozenset[int]] = {}  # dead buffer remade -> the ops that made it
    at = None  # the op the remakes in `dead` were for
    for m in moves:
        if m.kind != MoveKind.RESTORE or m.swapped:
            out.append(m)
            continue
        if m.op != at:
            dead, at = {}, m.op
        ops = set(m.ops)
        for k in m.ops:
            for z in trace.op_reads(k).tolist():
                ops |= dead.get(z, frozenset())
        if not trace.persistent[m.buffer] and int(last[m.buffer]) < m.op:
            dead[m.buffer] = frozenset(ops)
            continue
        out.append(NetMove(m.job, m.iteration, m.kind, m.op, m.buffer, False, tuple(sorted(ops))))
    return out


def _siblings(trace: Trace, table: AccessTable, moves: list[NetMove]) -> list[NetMove]:
    """`moves` with the restores DTR makes without naming them: a remake
    re-runs a producer, and its other outputs that the net had dropped stay
    on the device (NOTE [ DTR ] in sim/remat.py). A plan's Recompute keeps
    only its target, so each such sibling gets a restore of its own, for its
    next access, by the chain up to its producer -- unless the net drops it
    again before that access (its own restore then follows). NOTE [ From the
    net to a plan ]."""
    dropped: set[int] = set()
    out: list[NetMove | None] = []
    pending: dict[int, int] = {}  # sibling -> index of its restore in `out`
    for m in moves:
        b = m.buffer
        if m.kind == MoveKind.EVICT:
            k = pending.pop(b, None)
            if k is not None and out[k].op >= m.op:
                out[k] = None  # dropped again before it was used
            if not m.swapped:
                dropped.add(b)
            out.append(m)
            continue
        dropped.discard(b)
        pending.pop(b, None)
        out.append(m)
        if m.swapped or not m.ops:
            continue
        for k in m.ops:
            for w in trace.op_writes(k).tolist():
                if w == b or w not in dropped:
                    continue
                acc = table.accesses(w)
                nxt = acc[acc >= m.op]
                dropped.discard(w)
                if len(nxt):
                    ops = tuple(o for o in m.ops if o <= k)
                    pending[w] = len(out)
                    out.append(
                        NetMove(m.job, m.iteration, MoveKind.RESTORE, int(nxt[0]), w, False, ops)
                    )
    return [m for m in out if m is not None]


def _since(acc: list[int], op: int, back: int) -> int:
    """The op after which the buffer was last used before `op`: its last
    access, or the op it was last brought back for (-1: the iteration's start)."""
    prev = [a for a in acc if a < op]
    last = prev[-1] if prev else -1
    return max(last, back if back < op else -1)


def _out(b: int, evict: NetMove, p: int) -> SwapOut:
    return SwapOut(b, p, before_op=evict.op if evict.op > p else -1)


def _pair(b: int, evict: NetMove, restore_op: int, restore: NetMove, p: int, n: int) -> list[Event]:
    if not evict.swapped:
        if not restore.ops:
            return []
        return [Release(b, p), Recompute(b, restore_op, restore.ops)]
    return [_out(b, evict, p), SwapIn(b, max(restore_op - 1, evict.op, p), restore_op)]

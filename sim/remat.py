"""DTR's rematerialisation: which buffers a job can make again by re-running
the op that produced them, until when, at what cost, and the process that
does it (`remake`). The pool that evicts by DTR's heuristic is `DtrPool` in
`sim/dtr.py`; both follow NOTE [ DTR ] below.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left
from typing import TYPE_CHECKING

import numpy as np
from memplan.hwmodels.device import Direction, TimeUnit
from memplan.planners.core.semantics import OpTable
from memplan.sim.errors import SimError
from memplan.sim.job import REL, CompiledJob
from memplan.sim.recompute import rerun
from memplan.sim.state import ARRIVING, DEV, OFF, Gen, JobState
from memplan.traces.model import Trace

if TYPE_CHECKING:
    from memplan.sim.model import GpuModel
    from memplan.sim.pcie import Pcie

# NOTE [ DTR ]
# The `dtr` OOM policy (Kirisame et al., ICLR 2021, applied to the shared
# pool): when an allocation does not fit, evict the resident buffer -- of any
# job, not used by its job's current op (`JobState.pinned`), no copy of it
# running, not empty -- with the least h = c / (m * s); repeat until it fits;
# with nothing to evict, behave as `stall` (NOTE [ Out of memory ]). m is its
# bytes, s the microseconds since its last use (an op start that accesses it,
# a re-run op's start included; its allocation; the end of a swap-in), at
# least `STALENESS_EPS_US`, and c the microseconds it costs to have it back,
# by how it is evicted:
# - host copy valid (a swap-out ran, nothing wrote it since): the device copy
#   is dropped (`discard`, no bytes move), and an op that needs it fetches it
#   on demand (`CopyEngine.fetch`); c = its H2D copy time.
# - droppable (below): the device copy is dropped (`drop`, no lane, no
#   time); an op that needs it re-runs its producer first (`remake`); c = the
#   producer's duration plus DTR's evicted neighbourhood e*: the costs of the
#   absent buffers that remaking it needs first, recursively (an absent input
#   with a host copy, or arriving, costs its fetch and ends the walk), each
#   buffer and each producer counted once. Only ancestors count: an evicted
#   consumer does not make it dearer (DTR's e* also adds evicted children;
#   the brief of issue 16 asks for the ancestors).
# - anything else (persistent buffers, inputs, buffers written in place, RNG
#   outputs, buffers whose inputs change before they die, buffers made again
#   for a recompute chain only): a synchronous swap-out on the lane, as
#   `passive` evicts; c = its D2H + H2D copy times.
# Ties in h go to the lower job, then the staler buffer, then the lower id.
# So `dtr` can evict every buffer `passive` can: it never runs out of memory
# for want of a victim where `passive` has one. A remake needs its producer's
# inputs and outputs on the device at once where a fetch needs the buffer
# alone, so a budget barely above an op's own needs can still stop `dtr`
# where `passive` goes on (none of the shipped traces, vanilla or
# release_only, at 10..95% of its liveness peak: either both run or both
# run out).
#
# Remakeable (`RematTable`, per job and plan, before the run). Buffer x
# created by op p can be remade by re-running p alone if p is pure: it
# consumes no RNG, every buffer it writes is created by it (no in-place write,
# so nothing persistent), and it reads none of them. A remake before op q
# also needs p's inputs to hold the values p read: `limit[x]` is the last q
# for which that is guaranteed, whatever the pool evicts meanwhile:
#   limit[x] = min(first op after p writing x or an input of p,
#                  over inputs z of p: avail(z, p)),
#   avail(z, p) = no bound if z is persistent (resident, or off with a host
#                 copy: its writes are the first term); else min(freed_after
#                 [z], the first plan Release of z after p or at p) -- while
#                 alive and not released, z is on the device or has a host
#                 copy, as the pool only drops droppable buffers -- raised to
#                 limit[z] if z is remakeable itself (recursively).
# x is droppable iff limit[x] >= freed_after[x]: it can be remade for every op
# that may need it while it lives (an op's access, a plan recompute reading
# it). A dead input z is made again for the remake only; that life ends when
# the remake ends, as a plan's recompute does with a dead source (NOTE
# [ Incarnations ]).
#
# Remaking (`remake`, from `GpuModel._ensure` when an op or a plan's
# Recompute needs an absent buffer with no plan Recompute for that op and no
# host copy): depth first over the absent inputs, iteratively (no recursion
# limit on long evicted runs); a plan Recompute, a swap-in or a host copy of
# an input is used as `_ensure` uses it. While a producer's inputs are being
# made, its accesses are pinned. Each producer re-runs on the compute stream
# for its duration, logged `recompute_start`/`recompute_end` (op = the
# producer, buffer = what it remakes), counted in `recompute_s` and
# `remat_s`; its absent outputs take their bytes when it starts. Outputs
# already on the device are not rewritten (as a plan's Recompute); an absent
# sibling output that the pool dropped (alive, no host copy, remakeable now)
# stays on the device, rematerialised together; any other absent sibling is
# a temporary, freed when the remake ends.
#
# Plan events meet dropped buffers as absent ones (NOTE [ Event semantics ]):
# a SwapOut or Release of one is a `skip`, a SwapIn finds no host copy and is
# a `skip` too, and the op that needs it remakes it -- unless the plan has a
# Recompute of it for that op, which runs instead. Plan Recomputes re-run as
# before; a source of theirs that the pool dropped is remade.

STALENESS_EPS_US = 1e-3  # s never below 1 ns: h stays finite at s = 0
ABSENT = (OFF, ARRIVING)  # what a neighbourhood walk counts
NEVER = 1 << 62  # an op index past any trace


class RematTable:
    """Per buffer of one job (lists indexed by buffer id): `prod` the op that
    remakes it (-1: not remakeable), `limit` the last op before which a
    remake is valid (NOTE [ DTR ]), `droppable`, `inputs` (what `prod` reads),
    and costs in microseconds: `redo` (the producer's duration), `fetch` (H2D
    copy), `swap` (D2H + H2D copy); `*_pb` the same per byte (0 for an empty
    buffer)."""

    __slots__ = (
        "prod",
        "limit",
        "droppable",
        "inputs",
        "redo",
        "fetch",
        "swap",
        "redo_pb",
        "fetch_pb",
        "swap_pb",
    )

    def __init__(self, c: CompiledJob, pcie: Pcie):
        t = c.trace
        nb = t.n_buffers
        pure, freed, persistent = _pure_ops(t)
        released: dict[int, list[int]] = {}  # buffer -> after_op of its releases, ascending
        for group in c.triggers:
            for ev in group:
                if ev[0] == REL:
                    released.setdefault(ev[1], []).append(ev[6])
        unloaded = set(t.exists_at_start.nonzero()[0].tolist()) - set(c.inputs) - set(c.persistent)
        prod, limit = [-1] * nb, [-1] * nb
        inputs: list[tuple[int, ...]] = [()] * nb
        for p, reads, outs, bound, own in pure:
            for z in reads:
                if persistent[z]:  # resident or on the host: its writes are in `bound`
                    continue
                avail = -1 if z in unloaded else freed[z]
                rel = released.get(z)
                if rel is not None:
                    avail = min(avail, _first_at_or_after(rel, p))
                if prod[z] >= 0 and limit[z] > avail:
                    avail = limit[z]
                if avail < bound:
                    bound = avail
            for w, next_write in zip(outs, own):
                prod[w], inputs[w], limit[w] = p, reads, min(bound, next_write)
        self.prod = prod
        self.limit = limit
        self.inputs = inputs
        self.droppable = [x >= 0 and limit[b] >= freed[b] for b, x in enumerate(prod)]
        dur = c.durations
        self.redo = [dur[x] if x >= 0 else 0.0 for x in prod]
        m = t.nbytes
        fetch = pcie.device.copy_time(m, Direction.H2D, TimeUnit.US)
        swap = fetch + pcie.device.copy_time(m, Direction.D2H, TimeUnit.US)
        per = np.divide(1.0, m, out=np.zeros(nb), where=m > 0)  # 0 for an empty buffer
        self.fetch, self.swap = fetch.tolist(), swap.tolist()
        # the same per byte, what the pool's scan divides by staleness
        self.redo_pb = (np.array(self.redo) * per).tolist()
        self.fetch_pb, self.swap_pb = (fetch * per).tolist(), (swap * per).tolist()

    def remakeable(self, b: int, i: int) -> bool:
        """`b` can be remade by re-running its producer before op `i`."""
        return self.prod[b] >= 0 and self.limit[b] >= i

    def neighbourhood_us(self, s: JobState, b: int, cap: float = float("inf")) -> float:
        """DTR's e* of droppable `b`: what having its absent inputs again
        costs, recursively, each buffer and producer once (NOTE [ DTR ]); an
        arriving input counts as absent (its fetch). Infinite once past `cap`
        (the walk stops there)."""
        where = s.where
        todo = [z for z in self.inputs[b] if where[z] in ABSENT]
        if not todo:
            return 0.0
        host, prod, inputs = s.host, self.prod, self.inputs
        seen, made = set(todo), {prod[b]}
        total = 0.0
        while todo:
            z = todo.pop()
            if host[z]:
                total += self.fetch[z]
            elif prod[z] >= 0 and prod[z] not in made:
                made.add(prod[z])
                total += self.redo[z]
                for y in inputs[z]:
                    if y not in seen and where[y] in ABSENT:
                        seen.add(y)
                        todo.append(y)
            if total > cap:
                return float("inf")
        return total


def _first_at_or_after(ops: list[int], p: int) -> int:
    """The first of ascending `ops` at or after `p` (NEVER if none)."""
    k = bisect_left(ops, p)
    return ops[k] if k < len(ops) else NEVER


_PURE: weakref.WeakKeyDictionary[Trace, tuple] = weakref.WeakKeyDictionary()


def _pure_ops(t: Trace) -> tuple[list[tuple], list[int], list[bool]]:
    """What of NOTE [ DTR ] depends on the trace alone, once per trace object:
    per pure op p (in order) (p, what it reads, what it writes, the first op
    after p writing one of its inputs, per output the first op after p
    writing it); per buffer the op after which the framework frees it, and
    whether it is persistent."""
    hit = _PURE.get(t)
    if hit is not None:
        return hit
    table = OpTable.of(t)
    n, nb = t.n_ops, t.n_buffers
    rp, rb = (a.tolist() for a in t.reads_csr)
    created = t.created_at.tolist()
    writers: list[list[int]] = [[] for _ in range(nb)]
    for i, ws in enumerate(table.writes):
        for b in ws:
            writers[b].append(i)
    pure = []
    for p, outs in enumerate(table.writes):
        reads = tuple(rb[rp[p] : rp[p + 1]])
        if not outs or t.ops[p].rng or any(created[w] != p or w in reads for w in outs):
            continue
        bound = min((_first_at_or_after(writers[z], p + 1) for z in reads), default=NEVER)
        own = tuple(_first_at_or_after(writers[w], p + 1) for w in outs)
        pure.append((p, reads, outs, bound, own))
    freed = [min(f, n - 1) for f in t.freed_after.tolist()]
    hit = _PURE[t] = (pure, freed, t.persistent.tolist())
    return hit


def remake(model: GpuModel, s: JobState, b: int, i: int) -> Gen:
    """Make absent `b` (remakeable before op `i`) present for op `i` by
    re-running producers, its absent inputs first (NOTE [ DTR ])."""
    c, mem = s.c, model.mem
    table: RematTable = mem.tables[c.index]
    where, host, alive = s.where, s.host, s.alive
    prod, limit, accs, recompute = table.prod, table.limit, c.accs, c.recompute
    base = s.pinned
    marks: list[int] = []
    done: dict[int, None] = {}  # made for this remake: temporaries, dead buffers
    stack = [(b, False)]
    while stack:
        x, ready = stack.pop()
        p = prod[x]
        if not ready:
            if where[x] != OFF:  # made meanwhile (a sibling's producer ran)
                continue
            marks.append(len(s.pinned))
            s.pinned = s.pinned + accs[p]
            stack.append((x, True))
            for z in table.inputs[x]:
                w = where[z]
                if w == DEV:
                    continue
                if w != OFF or host[z] or (z, i) in recompute:
                    yield from model._ensure(s, z, i)  # its swap, fetch or plan recompute
                elif prod[z] >= 0 and limit[z] >= i:
                    stack.append((z, False))
                else:  # the limits of NOTE [ DTR ] rule this out
                    raise SimError(
                        f"dtr: job {c.index} ({c.name}), op {i}: buffer {z}, an input of "
                        f"op {p}, is absent and cannot be made again"
                    )
            continue
        outs = [w for w in c.writes[p] if where[w] == OFF]
        nbytes = sum(c.nbytes[w] for w in outs)
        if nbytes and not mem.fits(nbytes):
            yield from mem.get(s, nbytes, i, x, True)
            outs = [w for w in outs if where[w] == OFF]  # as they are after the wait
        for w in outs:
            mem.take(s, w)
            if w == x:
                if w != b and not alive[w]:
                    done[w] = None
            elif not (alive[w] and not host[w] and limit[w] >= i):
                done[w] = None
        s.remat_us += yield from rerun(model, s, p, x)
        s.pinned = s.pinned[: marks.pop()]
    s.pinned = base
    for w in done:
        if not alive[w]:  # that life ends with the remake (NOTE [ Incarnations ])
            model._framework_free(s, w)
        elif where[w] == DEV:
            mem.drop(s, w)

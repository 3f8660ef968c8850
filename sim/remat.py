"""DTR's rematerialisation: which buffers a job can make again by re-running
the op that produced them, until when, at what cost, and the process that
does it (`remake`). The pool that evicts by DTR's heuristic is `DtrPool` in
`sim/dtr.py`; both follow NOTE [ DTR ] below.
"""

from __future__ import annotations

import weakref
from bisect import bisect_left

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction, TimeUnit
from memplan.planners.core.lifecycle import Event
from memplan.planners.core.semantics import OpTable
from memplan.sim.errors import SimError
from memplan.sim.job import REL, CompiledJob
from memplan.sim.ports import Runner
from memplan.sim.recompute import rerun
from memplan.sim.state import ARRIVING, DEV, OFF, Gen, JobState
from memplan.traces.model import Trace

# NOTE [ DTR ]
# The `dtr` OOM policy (Kirisame et al., ICLR 2021, on the shared pool): until an allocation
# fits, evict, of all jobs' resident non-empty buffers that no copy moves and their job's current
# op does not pin (`JobState.pinned`), the one with the least h = c / (m * s) (ties: the lower
# job, the staler buffer, the lower id); with none, act as `stall` (NOTE [ Out of memory ]).
# m: its bytes; s: us since its last use (an op or remake start accessing it, its allocation,
# a swap-in's end), >= `STALENESS_EPS_US`; c: what having it back costs, by how it is evicted:
# - a valid host copy: `discard`, fetched on demand (`CopyEngine.fetch`); c = its H2D time;
# - droppable (`RematTable`: remade by re-running its pure producer, valid while it lives):
#   `drop`, remade by `remake`; c = the producer's time plus e*, its absent ancestors' costs
#   (each buffer and producer once; evicted children are not counted, as issue 16 asks);
# - else a synchronous swap-out on the lane, as `passive` evicts; c = its D2H + H2D times.
# Plan events meet dropped buffers as absent ones (a `skip`), and a plan Recompute of one for
# the op that needs it runs instead of a remake; a plan's dropped source is remade.
# Remakeable: `RematTable`; remaking: `remake`. Full text: docs/notes.md, "DTR".

STALENESS_EPS_US = 1e-3  # s never below 1 ns: h stays finite at s = 0
ABSENT = (OFF, ARRIVING)  # what a neighbourhood walk counts
NEVER = 1 << 62  # an op index past any trace


class RematTable:
    """Per buffer of one job (lists indexed by buffer id): `prod` the op that
    remakes it (-1: not remakeable), `limit` the last op before which a
    remake is valid (NOTE [ DTR ]), `droppable`, `inputs` (what `prod` reads),
    and costs in microseconds: `redo` (the producer's duration), `fetch` (H2D
    copy), `swap` (D2H + H2D copy); `*_pb` the same per byte (0 for an empty
    buffer).

    Buffer x created by op p is remakeable if p is pure: it consumes no RNG,
    every buffer it writes is created by it, and it reads none of them.
    `limit[x]`, the last op before which p's inputs surely hold the values p
    read whatever the pool evicts, is the least of the first op after p
    writing x or an input of p and, per input z of p, avail(z, p): no bound
    if z is persistent (its writes are the first term), else the lesser of
    `freed_after[z]` and the first plan Release of z at or after p, raised to
    `limit[z]` if z is remakeable itself. x is droppable iff `limit[x]` >=
    `freed_after[x]`: it can be remade for every op that may need it while it
    lives."""

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

    def __init__(self, c: CompiledJob, device: DeviceModel):
        t = c.trace
        nb = t.n_buffers
        pure, freed, persistent = _pure_ops(t)
        released: dict[int, list[int]] = {}  # buffer -> after_op of its releases, ascending
        for group in c.triggers:
            for ev in group:
                if ev.code == REL:
                    released.setdefault(ev.buffer, []).append(ev.after_op)
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
        fetch = device.copy_time(m, Direction.H2D, TimeUnit.US)
        swap = fetch + device.copy_time(m, Direction.D2H, TimeUnit.US)
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


def remake(run: Runner, table: RematTable, s: JobState, b: int, i: int) -> Gen:
    """Make absent `b` (remakeable before op `i`) present for op `i` by
    re-running producers, its absent inputs first (NOTE [ DTR ]): depth first,
    iteratively; a plan Recompute, a swap-in or a host copy of an input is
    used as `ensure` uses it, and a producer's accesses are pinned while its
    inputs are made. Each producer re-runs on the compute stream for its
    duration (logged `recompute_start`/`recompute_end`, counted in
    `recompute_s` and `remat_s`); its absent outputs take their bytes when it
    starts, and outputs already on the device are not rewritten. An absent
    sibling output the pool dropped (alive, no host copy, remakeable now)
    stays on the device; any other absent sibling, and a dead input made
    again for this remake only, is freed when the remake ends. `table` is
    the job's (`DtrPool.tables`)."""
    c, mem = s.c, run.mem
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
                    yield from run.ensure(s, z, i)  # its swap, fetch or plan recompute
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
            mem.act(s, w, s.apply(w, Event.REMAKE))
            if w == x:
                if w != b and not alive[w]:
                    done[w] = None
            elif not (alive[w] and not host[w] and limit[w] >= i):
                done[w] = None
        s.remat_us += yield from rerun(run, s, p, x)
        s.pinned = s.pinned[: marks.pop()]
    s.pinned = base
    for w in done:
        if not alive[w]:  # that life ends with the remake (NOTE [ Incarnations ])
            run.framework_free(s, w)
        elif where[w] == DEV:
            mem.act(s, w, s.apply(w, Event.DROP))

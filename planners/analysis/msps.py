"""Recompute candidates valued by MSPS, memory saving per second (Capuchin
§4.3, reused by TENSILE §IV-D).

A candidate frees buffer `b` after an access (`release_after`) and re-runs a
chain of ops just before its next access (`before_op`), the way
`planners.core.plan.Recompute` does it on demand. `chain` finds the ops: b's
producer, and the producers of any of its inputs that are not available
then, up to `max_ops` ops. What "available" means is the caller's: TENSILE
takes only buffers that are on the device then and never released; Capuchin
also lets a source be recomputed itself.

    MSPS = saving_bytes / recompute_time_s

A chain with no duration (view ops) has infinite MSPS.

See NOTE [ What can be recomputed ] above `producer`.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from memplan.planners.analysis import AccessTable, access_table
from memplan.planners.core.plan import Recompute, Release
from memplan.traces.model import Trace


@dataclass(frozen=True, slots=True)
class RecomputeCandidate:
    """Free `buffer` after `release_after`, recompute it by `ops` before
    `before_op`. `sources` are the buffers the chain reads from outside
    itself, `temp_bytes` the bytes of the chain's other outputs, `time_us`
    the chain's predicted compute time."""

    job: int
    buffer: int
    release_after: int
    before_op: int
    ops: tuple[int, ...]
    sources: tuple[int, ...]
    saving_bytes: int
    time_us: float
    temp_bytes: int = 0
    restore_rng: bool = False

    @property
    def msps(self) -> float:
        """Memory saving per second of recompute time (bytes/s)."""
        if self.time_us <= 0:
            return math.inf
        return self.saving_bytes / (self.time_us * 1e-6)

    def events(self) -> tuple[Release, Recompute]:
        """The plan events that carry it out."""
        return (
            Release(self.buffer, self.release_after),
            Recompute(self.buffer, self.before_op, self.ops, self.restore_rng),
        )


# NOTE [ What can be recomputed ]
# - Only a buffer with exactly one writing access (its creating op) can be recomputed: one
#   updated in place has no single op that makes its current value (parameters, inputs and
#   optimizer state, with no producer in the iteration, never are).
# - The producer must not read what it writes, nor write a persistent buffer (BatchNorm's
#   running statistics, an optimizer update): re-running it would apply that update twice.
# - A chain op may write other buffers too (convolution_backward writes two grads): the
#   simulator allocates the absent ones as temporaries for the chain and does not redo writes
#   to those on the device; the planner counts the temporaries' bytes at `before_op`.
# - A source (a buffer a chain op reads that no earlier chain op writes) must not be written
#   between the chain op's original run and `before_op`, or the recomputed value would differ
#   (`planners.core.check` rejects that).
# - A chain with an RNG op (dropout) sets `restore_rng`.
# Full text: docs/notes.md, "What can be recomputed".
def producer(trace: Trace, b: int, table: AccessTable | None = None) -> int:
    """The op that makes buffer `b`'s value, or -1 if it cannot be recomputed
    (NOTE [ What can be recomputed ]). `table` is b's trace's (`access_table`)."""
    return int(producers(trace)[b])


def producers(trace: Trace) -> np.ndarray:
    """int64[n_buffers]: `producer` of every buffer, worked out once per trace."""
    out = _PRODUCERS.get(trace)
    if out is None:
        out = _PRODUCERS[trace] = _producers(trace, access_table(trace))
    return out


def _producers(trace: Trace, table: AccessTable) -> np.ndarray:
    nb = trace.n_buffers
    if len(table.ops) == 0:
        return np.full(nb, -1, np.int64)
    lo, hi = table.ptr[:-1], table.ptr[1:]
    written = np.concatenate([[0], np.cumsum(table.writes, dtype=np.int64)])
    first = np.minimum(lo, len(table.ops) - 1)  # b's first access (any, if it has none)
    op = table.ops[first]
    ok = (hi > lo) & (written[hi] - written[lo] == 1) & table.writes[first]
    ok &= ~trace.exists_at_start & ~trace.persistent & ~trace.writes_persistent[op]
    rp, rb = trace.reads_csr
    read_by = np.repeat(np.arange(trace.n_ops, dtype=np.int64), np.diff(rp))
    reads_itself = np.isin(op * nb + np.arange(nb), read_by * nb + rb)
    return np.where(ok & ~reads_itself, op, -1).astype(np.int64)


_PRODUCERS: weakref.WeakKeyDictionary[Trace, np.ndarray] = weakref.WeakKeyDictionary()


# NOTE [ In-place chains ]
# A buffer written more than once -- a convolution's output that an in-place
# ReLU (`relu_`) overwrites, a dropout mask made by `empty_like`, filled by
# `bernoulli_` and scaled by `div_` -- has no single producer, but its value
# as op x reads it is made again by re-running, in order, every op that
# wrote it before x (`makers`). With `in_place=True` a chain does that for
# the buffer and for every input it must remake: an input read by chain op
# k gets its writers before k. Rejected as for one producer (NOTE [ What
# can be recomputed ]): a buffer that exists at the start or is persistent,
# whose first access is not its creating write, or whose first writer reads
# it; a writer that updates a persistent buffer (batch norm's running
# statistics), or that updates in place a buffer other than this one (it
# would be applied twice). Capuchin keeps single producers (`in_place=False`).
def makers(
    trace: Trace, b: int, before_op: int, table: AccessTable | None = None
) -> tuple[int, ...]:
    """The ops, ascending, that make buffer `b`'s value as op `before_op`
    reads it: its writes before `before_op`; () if it cannot be remade
    (NOTE [ In-place chains ])."""
    if trace.exists_at_start[b] or trace.persistent[b]:
        return ()
    table = table or access_table(trace)
    p0, p1 = int(table.ptr[b]), int(table.ptr[b + 1])
    if p1 == p0 or not table.writes[p0]:
        return ()
    acc, w = table.ops[p0:p1], table.writes[p0:p1]
    ks = acc[w & (acc < before_op)].tolist()
    if not ks or b in trace.op_reads(ks[0]):
        return ()
    for k in ks:
        if trace.writes_persistent[k]:
            return ()
        reads = trace.op_reads(k)
        if any(int(x) != b and x in reads for x in trace.op_writes(k)):
            return ()
    return tuple(ks)


def chain(
    trace: Trace,
    b: int,
    before_op: int,
    available: Callable[[int], bool],
    *,
    max_ops: int = 1,
    table: AccessTable | None = None,
    in_place: bool = False,
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """(ops ascending, sources) that recompute `b` just before `before_op`, or
    None. `available(s)` says whether buffer `s` may be read from the device
    at `before_op`; unavailable inputs are recomputed in turn, as long as the
    chain stays within `max_ops` ops. With `in_place`, buffers written more
    than once are remade by all their writes (NOTE [ In-place chains ])."""
    table = table or access_table(trace)
    if in_place:
        return _in_place_chain(trace, b, before_op, available, max_ops, table)
    ops: set[int] = set()
    made: set[int] = set()
    todo = [b]
    while todo:
        x = todo.pop()
        if x in made:
            continue
        k = producer(trace, x, table)
        if k < 0 or k >= before_op:
            return None
        if k not in ops:
            ops.add(k)
            if len(ops) > max_ops:
                return None
            for w in trace.op_writes(k).tolist():
                made.add(int(w))
            for s in trace.op_reads(k).tolist():
                if s in made or s == b:
                    continue
                if not available(s):
                    todo.append(s)
        made.add(x)
    return _ordered(trace, ops, before_op, available, table)


def _in_place_chain(
    trace: Trace,
    b: int,
    before_op: int,
    available: Callable[[int], bool],
    max_ops: int,
    table: AccessTable,
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """`chain` with `in_place`: each buffer to remake for a reader k gets
    all its writes before k (NOTE [ In-place chains ])."""
    ops: set[int] = set()
    made: set[int] = set()
    todo = [(b, before_op)]
    seen: set[tuple[int, int]] = set()
    while todo:
        x, at = todo.pop()
        if (x, at) in seen:
            continue
        seen.add((x, at))
        ks = makers(trace, x, at, table)
        if not ks:
            return None
        for k in ks:
            if k in ops:
                continue
            ops.add(k)
            if len(ops) > max_ops:
                return None
            made.update(int(w) for w in trace.op_writes(k).tolist())
            for s in trace.op_reads(k).tolist():
                if s != x and (s in made or not available(s)):
                    todo.append((s, k))
    return _ordered(trace, ops, before_op, available, table)


def _ordered(
    trace: Trace,
    ops: set[int],
    before_op: int,
    available: Callable[[int], bool],
    table: AccessTable,
) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
    """The chain's ops ascending and the buffers it reads from outside, in
    first-read order; None if one of those is absent or overwritten before
    `before_op`."""
    order = tuple(sorted(ops))
    made_so_far: set[int] = set()
    sources: list[int] = []
    for k in order:
        for s in trace.op_reads(k).tolist():
            if s not in made_so_far and s not in sources:
                if not available(s) or _overwritten(table, s, k, before_op):
                    return None
                sources.append(s)
        made_so_far.update(int(w) for w in trace.op_writes(k).tolist())
    return order, tuple(sources)


def _overwritten(table: AccessTable, s: int, k: int, before_op: int) -> bool:
    """Whether an op strictly between `k` and `before_op` writes `s`."""
    p0, p1 = int(table.ptr[s]), int(table.ptr[s + 1])
    acc = table.ops[p0:p1]
    sel = (acc > k) & (acc < before_op)
    return bool(table.writes[p0:p1][sel].any())


def candidate(
    trace: Trace,
    job: int,
    b: int,
    release_after: int,
    before_op: int,
    durations_us: np.ndarray,
    available: Callable[[int], bool],
    *,
    max_ops: int = 1,
    saving_bytes: int | None = None,
    in_place: bool = False,
) -> RecomputeCandidate | None:
    """The candidate that frees `b` between `release_after` and `before_op`,
    or None if no chain within `max_ops` can make it (`in_place`: NOTE [
    In-place chains ]). `saving_bytes` defaults to b's size."""
    table = access_table(trace)
    found = chain(trace, b, before_op, available, max_ops=max_ops, table=table, in_place=in_place)
    if found is None:
        return None
    ops, sources = found
    temps = {int(w) for k in ops for w in trace.op_writes(k).tolist()} - {b}
    temps = {w for w in temps if not available(w)}
    return RecomputeCandidate(
        job=job,
        buffer=b,
        release_after=release_after,
        before_op=before_op,
        ops=ops,
        sources=sources,
        saving_bytes=int(trace.nbytes[b]) if saving_bytes is None else saving_bytes,
        time_us=float(durations_us[list(ops)].sum()),
        temp_bytes=int(sum(int(trace.nbytes[w]) for w in temps)),
        restore_rng=any(trace.ops[k].rng for k in ops),
    )


def best(candidates: list[RecomputeCandidate]) -> RecomputeCandidate | None:
    """The candidate with the highest MSPS (ties: larger saving, then lower
    job, buffer), or None."""
    if not candidates:
        return None
    return max(candidates, key=lambda c: (c.msps, c.saving_bytes, -c.job, -c.buffer))

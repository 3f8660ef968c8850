"""Which op orders a trace allows: a permutation of its ops that computes
the same results as the trace's own order.

`check_order(trace, order)` returns nothing for an allowed order and raises
`OrderError` naming the first violation, in the order's positions:
"order: op 12 (aten.relu_) at position 3 before op 9 that writes buffer 4
it reads". `dependencies(trace)` is the list the check walks, per op the
ops that must come before it (NOTE [ Allowed orders ]).
"""

from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Sequence
from typing import NamedTuple

from memplan.planners.core.errors import PlanError
from memplan.traces.model import Trace


class OrderError(PlanError):
    """An op order that is not a permutation of the trace's ops or would change results."""


# NOTE [ Allowed orders ]
# An order is allowed when every op comes after each op it depends on in the trace's order
# (SwapAdvisor's schedule is a topological order of the dataflow graph). Dependencies are per
# buffer, never per view (views alias one storage; an in-place op writes its input's buffer).
# Walking a buffer's accesses in trace order (an in-place op is a writer that also reads):
# - read after write: an op reading it comes after the last op that wrote it;
# - write after read: an op writing it comes after every op that read it since the last write;
# - write after write: an op writing it comes after the last writer.
# Across buffers: ops that draw random numbers (`Op.rng`) keep their relative order (the k-th
# draw must see the generator state the trace's k-th draw saw); and each op stays in its
# segment of consecutive ops of one phase (forward, backward, optimizer; several with gradient
# accumulation), every op of an earlier segment first, as a real training loop runs them and
# as cross-iteration swaps need (NOTE [ Cross-iteration swaps ]). Within a segment independent
# branches may interleave freely.
# Full text: docs/notes.md, "Allowed orders".


class Dependency(NamedTuple):
    """Op `before` must precede the op that owns this entry; `why` says which
    rule: "writes buffer 4 it reads", "draws random numbers", ..."""

    before: int
    why: str


_DEPS: weakref.WeakKeyDictionary[Trace, tuple[tuple[Dependency, ...], ...]] = (
    weakref.WeakKeyDictionary()
)


def dependencies(trace: Trace) -> tuple[tuple[Dependency, ...], ...]:
    """Per op, the ops that must come before it in any allowed order (NOTE
    [ Allowed orders ]), each with the rule; built once per trace object.
    Phase segments are not listed here: `segments(trace)` gives them."""
    deps = _DEPS.get(trace)
    if deps is None:
        deps = _DEPS[trace] = _build_dependencies(trace)
    return deps


def _build_dependencies(t: Trace) -> tuple[tuple[Dependency, ...], ...]:
    out: list[list[Dependency]] = [[] for _ in range(t.n_ops)]
    last_writer: dict[int, int] = {}
    readers: dict[int, list[int]] = {}
    last_rng = -1
    for i in range(t.n_ops):
        reads = {int(b) for b in t.op_reads(i)}
        writes = {int(b) for b in t.op_writes(i)}
        for b in sorted(reads | writes):
            w = last_writer.get(b)
            if w is not None and b in reads:
                out[i].append(Dependency(w, f"writes buffer {b} it reads"))
            if b in writes:
                if w is not None and b not in reads:
                    out[i].append(Dependency(w, f"writes buffer {b} it overwrites"))
                for r in readers.get(b, ()):
                    if r != i:
                        out[i].append(Dependency(r, f"reads buffer {b} it overwrites"))
        for b in reads - writes:
            readers.setdefault(b, []).append(i)
        for b in writes:
            last_writer[b] = i
            readers[b] = []
        if t.ops[i].rng:
            if last_rng >= 0:
                out[i].append(Dependency(last_rng, "draws random numbers earlier in the trace"))
            last_rng = i
    return tuple(tuple(d) for d in out)


def segments(trace: Trace) -> tuple[int, ...]:
    """Per op, the index of its phase segment: runs of consecutive ops of
    one phase, numbered from 0 in trace order (NOTE [ Allowed orders ])."""
    out: list[int] = []
    seg = 0
    for i, op in enumerate(trace.ops):
        if i and op.phase is not trace.ops[i - 1].phase:
            seg += 1
        out.append(seg)
    return tuple(out)


def as_order(order: Sequence[int], n_ops: int, where: str = "order") -> tuple[int, ...]:
    """`order` as a tuple of ints, if it is a permutation of 0..n_ops-1;
    else `OrderError` naming the first bad entry."""
    out: list[int] = []
    seen = [False] * n_ops
    for p, k in enumerate(order):
        try:
            k = operator.index(k)
        except TypeError:
            raise OrderError(f"{where}[{p}]: {k!r} is not an op id") from None
        if isinstance(k, bool) or not 0 <= k < n_ops:
            raise OrderError(f"{where}[{p}]: {k!r} is not an op of the trace (0..{n_ops - 1})")
        if seen[k]:
            raise OrderError(f"{where}[{p}]: op {k} appears twice")
        seen[k] = True
        out.append(k)
    if len(out) != n_ops:
        raise OrderError(f"{where}: {len(out)} ops, the trace has {n_ops}")
    return tuple(out)


def positions(order: Sequence[int]) -> tuple[int, ...]:
    """Per op id, its position in `order` (a permutation)."""
    pos = [0] * len(order)
    for p, k in enumerate(order):
        pos[k] = p
    return tuple(pos)


def check_order(trace: Trace, order: Sequence[int], where: str = "order") -> tuple[int, ...]:
    """The order as a tuple, if `trace` allows it (NOTE [ Allowed orders ]);
    else `OrderError` naming the first op, by position, that comes before
    one it depends on."""
    order = as_order(order, trace.n_ops, where)
    pos = positions(order)
    seg = segments(trace)
    deps = dependencies(trace)
    for p, i in enumerate(order):
        name = f"op {i} ({trace.ops[i].target}) at position {p}"
        if p and seg[order[p - 1]] > seg[i]:
            k = order[p - 1]
            raise OrderError(
                f"{where}: {name} after op {k} of a later phase segment "
                f"({trace.ops[k].phase.value}); ops stay in their phase segment"
            )
        for d in deps[i]:
            if pos[d.before] > p:
                raise OrderError(
                    f"{where}: {name} before op {d.before} ({trace.ops[d.before].target}) "
                    f"that {d.why}"
                )
    return order


def topological_order(trace: Trace, priority: Sequence[float]) -> tuple[int, ...]:
    """The allowed order that runs, whenever several ops are ready, the one
    of least `priority[op]` (ties: least id): list scheduling over the
    dependencies, one phase segment after another. Every allowed order is
    the result of some priority (its own positions)."""
    n = trace.n_ops
    if len(priority) != n:
        raise OrderError(f"priority: {len(priority)} values, the trace has {n} ops")
    return ready_walk(trace, lambda ready: min(ready, key=lambda i: (priority[i], i)))


def ready_walk(trace: Trace, pick: Callable[[list[int]], int]) -> tuple[int, ...]:
    """An allowed order built op by op: `pick(ready)` chooses the next among
    the ready ops of the current phase segment (a list in a deterministic
    order: ascending at a segment's start, then as they became ready).
    SwapAdvisor's mutation walks orders so (planners/search/genome.py)."""
    n = trace.n_ops
    deps, seg = dependencies(trace), segments(trace)
    waiting = [len({d.before for d in deps[i]}) for i in range(n)]
    after: list[list[int]] = [[] for _ in range(n)]
    for i in range(n):
        for k in sorted({d.before for d in deps[i]}):
            after[k].append(i)
    out: list[int] = []
    start = 0
    while start < n:
        end = start
        while end < n and seg[end] == seg[start]:
            end += 1
        ready = [i for i in range(start, end) if not waiting[i]]
        while ready:
            i = pick(ready)
            ready.remove(i)
            out.append(i)
            for j in after[i]:
                waiting[j] -= 1
                if not waiting[j] and start <= j < end:
                    ready.append(j)
        start = end
    return tuple(out)

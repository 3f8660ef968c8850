"""SwapAdvisor's individuals and operators (SwapAdvisor §4-5; notes in
shared/papers/swapadvisor_notes_zh.txt): an op order, a memory allocation
(size classes and how many slots of each), and the swap plan that follows
from the two. NOTE [ SwapAdvisor operators ] says where we chose.
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from memplan.planners.core.order import positions, ready_walk
from memplan.planners.core.plan import Event, Plan, Release, SwapIn, SwapOut, fingerprint_of
from memplan.planners.core.semantics import OpTable
from memplan.traces.model import Trace


@dataclass(frozen=True, slots=True)
class Allocation:
    """`split[i]` (i >= 1): the i-th smallest distinct buffer size starts a
    new size class (SwapAdvisor's non-decreasing CLS, as its steps);
    `counts[c]`: the slots of class c. A class's slot is as large as the
    largest size mapped to it."""

    split: tuple[bool, ...]
    counts: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Individual:
    order: tuple[int, ...]
    alloc: Allocation


# NOTE [ SwapAdvisor operators ]
# Where the paper leaves a choice, memplan's:
# - Only non-persistent buffers get slots; parameters and optimizer state stay resident and
#   come off the budget first (no double pass over parameters).
# - Order crossover: the first CR ops of one parent, then the rest in the other's order (an
#   allowed order's prefix keeps the child allowed); allocations take one parent's classes
#   and counts up to CR, the other's after. Two parents give 2 x 2 = 4 children.
# - Mutation: with probability P the next op is a random ready op; each split flag flips and
#   each count is redrawn from a normal around it (sigma half the count, at least 1).
# - Over the budget, every class gives up the same bytes, one slot kept per class.
# - Swap plan: walking the order, a buffer takes a free slot of its class or evicts the
#   resident one not used by the op whose next use is farthest; evicted buffers with a later
#   use are swapped (deadline: the evicting op), others released. No slot: no plan. The
#   paper's recency threshold is not applied. Full text: docs/notes.md.


def distinct_sizes(trace: Trace) -> tuple[int, ...]:
    """The sorted distinct sizes of the non-persistent buffers (SwapAdvisor's TS)."""
    nb = trace.nbytes[~trace.persistent]
    return tuple(int(x) for x in np.unique(nb))


def class_of_size(alloc: Allocation) -> list[int]:
    """Per distinct size, its class (SwapAdvisor's CLS, from 0)."""
    out, c = [], 0
    for i, new in enumerate(alloc.split):
        c += 1 if i and new else 0
        out.append(c)
    return out


def slot_bytes(alloc: Allocation, sizes: Sequence[int]) -> list[int]:
    """Per class, its slot size: the largest size mapped to it."""
    cls = class_of_size(alloc)
    out = [0] * (cls[-1] + 1 if cls else 0)
    for i, c in enumerate(cls):
        out[c] = max(out[c], sizes[i])
    return out


@dataclass(frozen=True, slots=True)
class Sizes:
    """What allocations are made for: the distinct sizes (TS), per size the
    most buffers of it alive at once (`live`) and accessed by one op
    (`per_op`) in the trace's order, and the bytes the slots may take."""

    sizes: tuple[int, ...]
    live: tuple[int, ...]
    per_op: tuple[int, ...]
    budget: int

    @staticmethod
    def of(trace: Trace, budget: int) -> Sizes:
        sizes = distinct_sizes(trace)
        index = {s: i for i, s in enumerate(sizes)}
        nbytes, persistent = trace.nbytes.tolist(), trace.persistent.tolist()
        size_of = [-1 if persistent[b] else index[nbytes[b]] for b in range(len(nbytes))]
        table = OpTable.of(trace)
        live, alive, per_op = [0] * len(sizes), [0] * len(sizes), [0] * len(sizes)
        for b in table.inputs:
            alive[size_of[b]] += 1
        for i in range(trace.n_ops):
            here = [0] * len(sizes)
            for b in table.accesses[i]:
                if size_of[b] >= 0:
                    here[size_of[b]] += 1
            for b in table.creates[i]:
                alive[size_of[b]] += 1
            for k in range(len(sizes)):
                live[k] = max(live[k], alive[k])
                per_op[k] = max(per_op[k], here[k])
            for b in table.frees[i]:
                alive[size_of[b]] -= 1
        return Sizes(sizes, tuple(live), tuple(per_op), budget)

    def per_class(self, alloc: Allocation, of: Sequence[int]) -> list[int]:
        """`of` (per size) summed per class of `alloc`."""
        cls = class_of_size(alloc)
        out = [0] * (cls[-1] + 1 if cls else 0)
        for i, c in enumerate(cls):
            out[c] += of[i]
        return out

    def fit(self, split: tuple[bool, ...], counts: Sequence[int]) -> Allocation:
        """An allocation of classes `split` with `counts` lowered until the
        slots' bytes fit the budget: every class gives up the same bytes (so
        counts fall in inverse proportion to slot size), none below the most
        buffers of it one op accesses (NOTE [ SwapAdvisor operators ])."""
        alloc = Allocation(split, ())
        slots = slot_bytes(alloc, self.sizes)
        floor = [max(1, f) for f in self.per_class(alloc, self.per_op)]
        cnt = [max(f, int(c)) for c, f in zip(counts, floor, strict=True)]
        for _round in range(64):
            excess = sum(c * s for c, s in zip(cnt, slots, strict=True)) - self.budget
            shrinkable = [k for k, c in enumerate(cnt) if c > floor[k]]
            if excess <= 0 or not shrinkable:
                break
            share = excess / len(shrinkable)
            for k in shrinkable:
                cnt[k] = max(floor[k], cnt[k] - max(1, math.ceil(share / max(1, slots[k]))))
        return Allocation(split, tuple(cnt))


def crossover_order(first: Sequence[int], second: Sequence[int], cr: int) -> tuple[int, ...]:
    """The first `cr` ops of `first`, then the others in `second`'s order."""
    head = tuple(first[:cr])
    taken = set(head)
    return head + tuple(k for k in second if k not in taken)


def mutate_order(trace: Trace, order: Sequence[int], p: float, rng: np.random.Generator):
    """`order` walked again: the next op is its next ready one, or with
    probability `p` a ready op drawn at random."""
    pos = positions(order)

    def pick(ready: list[int]) -> int:
        if rng.random() < p:
            return ready[int(rng.integers(len(ready)))]
        return min(ready, key=pos.__getitem__)

    return ready_walk(trace, pick)


def crossover_alloc(a: Allocation, b: Allocation, cr: int, sz: Sizes) -> Allocation:
    """A child keeping `a`'s classes, with extended counts a[:cr] + b[cr:]."""
    ext_a = [a.counts[c] for c in class_of_size(a)]
    ext_b = [b.counts[c] for c in class_of_size(b)]
    ext = ext_a[:cr] + ext_b[cr:]
    cls = class_of_size(a)
    sums: dict[int, list[int]] = {}
    for i, c in enumerate(cls):
        sums.setdefault(c, []).append(ext[i])
    counts = [math.ceil(sum(v) / len(v)) for _c, v in sorted(sums.items())]
    return sz.fit(a.split, counts)


def mutate_alloc(a: Allocation, p: float, rng: np.random.Generator, sz: Sizes) -> Allocation:
    """Flip split flags and redraw counts, each with probability `p`."""
    old_cls = class_of_size(a)
    split = [bool(s) if i == 0 or rng.random() >= p else not s for i, s in enumerate(a.split)]
    new = Allocation(tuple(split), ())
    cls = class_of_size(new)
    counts = [1] * (cls[-1] + 1 if cls else 0)
    for i, c in enumerate(cls):  # a class starts from the count of its first size's old class
        if i == 0 or cls[i - 1] != c:
            counts[c] = a.counts[old_cls[i]]
    for c, k in enumerate(counts):
        if rng.random() < p:
            counts[c] = max(1, round(rng.normal(k, max(1.0, k / 2))))
    return sz.fit(new.split, counts)


def swap_plan(trace: Trace, ind: Individual, sizes: Sequence[int]) -> Plan | None:
    """The plan that follows from `ind` (NOTE [ SwapAdvisor operators ]);
    None when some op finds no slot."""
    order, n = ind.order, trace.n_ops
    table = OpTable.of(trace, order)
    size_index = {s: i for i, s in enumerate(sizes)}
    cls_of = class_of_size(ind.alloc)
    nbytes, persistent = trace.nbytes.tolist(), trace.persistent.tolist()
    klass = [-1 if persistent[b] else cls_of[size_index[nbytes[b]]] for b in range(len(nbytes))]
    uses: list[list[int]] = [[] for _ in nbytes]  # per buffer, its positions ascending
    for p, i in enumerate(order):
        for b in table.accesses[i]:
            uses[b].append(p)
    free: list[list[int]] = [[0] * k for k in ind.alloc.counts]  # heaps of free-since stamps
    for h in free:
        heapq.heapify(h)
    resident: list[set[int]] = [set() for _ in ind.alloc.counts]
    last_use = {}
    out_at: dict[int, int] = {}
    events: list[Event] = []

    def take(b: int, p: int, pinned: tuple[int, ...]) -> int | None:
        """Give `b` a slot for the op at position p; the stamp since which it was free."""
        c = klass[b]
        if not free[c]:
            victims = [v for v in resident[c] if v not in pinned]
            if not victims:
                return None
            v = max(victims, key=lambda v: (_next_use(uses[v], p), -v))
            resident[c].discard(v)
            a = last_use.get(v, -1)
            after = order[a] if a >= 0 else -1
            nxt = _next_use(uses[v], p)
            if nxt < math.inf:
                events.append(SwapOut(v, after, 0.0, order[p]))
                out_at[v] = p
            else:
                events.append(Release(v, after))
            heapq.heappush(free[c], p)
        resident[c].add(b)
        return heapq.heappop(free[c])

    first = table.accesses[order[0]] if n else ()
    for b in table.inputs:  # loaded at the start: one the first op needs is never evicted
        if klass[b] >= 0 and take(b, 0, first) is None:
            return None
    for p, i in enumerate(order):
        pinned = table.accesses[i]
        for b in (*table.need[i], *table.creates[i]):
            if klass[b] < 0 or b in resident[klass[b]]:
                continue
            stamp = take(b, p, pinned)
            if stamp is None:
                return None
            if b in out_at:  # swapped out before: back in, as early as its slot allows
                start = max(stamp, out_at.pop(b) + 1)  # <= p: b is not evicted by its own op
                events.append(SwapIn(b, order[start - 1] if start > 0 else -1, i))
        for b in pinned:
            last_use[b] = p
        for b in table.frees[i]:
            c = klass[b]
            if c >= 0 and b in resident[c]:
                resident[c].discard(b)
                heapq.heappush(free[c], p + 1)
    identity = order == tuple(range(n))
    return Plan(fingerprint_of(trace), tuple(events), trace.meta.model, None if identity else order)


def _next_use(uses: list[int], p: int) -> float:
    """The first position after `p` in `uses` (ascending); inf if none."""
    k = bisect.bisect_right(uses, p)
    return uses[k] if k < len(uses) else math.inf

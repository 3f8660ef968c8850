"""Where a recomputed gap may be recomputed: its recompute points, chained
through the recomputations that read it (NOTE [ Recompute chains ]).

A data-section helper of the CP-SAT planner for one job: it works on op
indices and gap ids and imports nothing of the model.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from memplan.traces.model import Trace

# NOTE [ Recompute chains ]
# A WITHIN gap of buffer b (accesses a < c) may release b after a and re-run
# b's producer p once, just before an op r of the gap (a < r <= c): at its
# own access (r = c, on demand, as Capuchin), or earlier, when another
# recomputation before r reads b. b is then absent at the hot ops a < k < r
# and resident from r on (a recomputed buffer stays until its next free,
# NOTE [ Event semantics ] in sim/model.py). The plan is
# `Release(b, a), Recompute(b, r, (p,))`: when op r (or a recomputation
# before it) needs b, the simulator re-runs p, first making p's absent
# sources present by their own Recompute before r -- a chain. Each gap has
# its own points:
# - its own access c;
# - every point r of a recomputable gap h whose producer reads b, where
#   a < r < c (h "pulls" b to r), up to `depth` pulls from an own access.
# A point r needs every source s of p alive at r and not overwritten since
# p read it (checked at c, which implies it at r < c), and present at r:
# accessed by op r, or in a gap at r that is kept, or recomputed at a point
# <= r (a point < r: it stayed; = r: the same chain). A point r < c is
# chosen only when some gap recomputed at r reads b (else nothing would
# trigger the Recompute and b would still be absent at c). A pulled point
# is kept only if the gap has a hot op before it: otherwise it saves no
# memory that keeping b would not, and costs p's time.
# Each gap is recomputed at most once, by its producer alone: no chain
# temporaries (`Recompute.ops` of one op), and no buffer recomputed twice
# in one gap. So the model covers rematerialisation in which every dropped
# value is recomputed once -- Checkmate's linear chain at B = (n + 2) // 2
# and every budget where one recomputation per unit below the peak
# suffices -- but not the tight budgets below about n / 2 where the best
# schedules recompute a value again (tests/planners/test_checkmate_chain.py
# brute-forces both). Recomputation needs one job (NOTE [ Several jobs ] in
# cpsat/data.py). `depth` bounds how far a pull reaches: on the chain a run
# of d consecutive dropped buffers needs depth d - 1; the default
# (`CpsatOptions.chain_depth`) reaches that for every one-recompute
# schedule of the chain up to n = 64 at B, and keeps the shipped traces'
# models small (benchmarks/checkmate.py prints the points per gap).


@dataclass(frozen=True, slots=True)
class RecPoint:
    """Recompute a gap's buffer just before op `op`. `sources`: gaps of the
    producer's sources that contain `op` (each must be present there);
    `pullers`: gaps whose recomputation at `op` reads the buffer (empty at
    the gap's own access, where the access itself triggers it)."""

    op: int
    sources: tuple[int, ...]
    pullers: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ChainGap:
    """What `recompute_points` needs of a recomputable gap."""

    id: int
    buffer: int
    a: int
    c: int
    producer: int
    first_hot: int  # the first hot op inside the gap


class GapIndex:
    """Which gap of a buffer holds an op in its interior, from (id, buffer,
    first op, last op) interiors."""

    def __init__(self, spans: Sequence[tuple[int, int, int, int]]):
        self._by_buffer: dict[int, list[tuple[int, int, int]]] = {}
        for gid, b, lo, hi in spans:
            self._by_buffer.setdefault(b, []).append((lo, hi, gid))
        for v in self._by_buffer.values():
            v.sort()

    def at(self, b: int, k: int) -> int | None:
        spans = self._by_buffer.get(b)
        if not spans:
            return None
        i = bisect.bisect_right(spans, (k, 1 << 62, 0)) - 1
        if i >= 0 and spans[i][0] <= k <= spans[i][1]:
            return spans[i][2]
        return None


def source_gaps(
    trace: Trace, writes: Sequence[set[int]], producer: int, r: int, index: GapIndex
) -> tuple[int, ...] | None:
    """The gaps (ids) of `producer`'s sources that contain op `r`, or None if
    a source is dead at r or overwritten between `producer` and r."""
    out: list[int] = []
    for s in trace.op_reads(producer).tolist():
        acc = trace.accesses_of(s)
        if not trace.persistent[s] and int(acc[-1]) < r:
            return None  # freed after its last access before r
        between = acc[(acc > producer) & (acc < r)].tolist()
        if any(s in writes[k] for k in between):
            return None  # overwritten since the producer read it
        g = index.at(s, r)
        if g is not None:
            out.append(g)
    return tuple(out)


def recompute_points(
    trace: Trace,
    writes: Sequence[set[int]],
    gaps: Sequence[ChainGap],
    index: GapIndex,
    depth: int,
) -> dict[int, tuple[RecPoint, ...]]:
    """Per recomputable gap id, its points ascending (the own access last);
    a gap whose producer cannot re-run at its own access has none."""
    by_id = {g.id: g for g in gaps}
    srcs: dict[tuple[int, int], tuple[int, ...]] = {}
    pullers: dict[tuple[int, int], set[int]] = {}
    todo: deque[tuple[int, int, int]] = deque()  # (gap, op, pulls so far)
    for g in gaps:
        s = source_gaps(trace, writes, g.producer, g.c, index)
        if s is not None:
            srcs[(g.id, g.c)] = s
            todo.append((g.id, g.c, 0))
    reached: dict[tuple[int, int], int] = {key: 0 for key in srcs}
    while todo:
        gid, r, d = todo.popleft()
        if d >= depth:
            continue
        for sid in srcs[(gid, r)]:
            s = by_id.get(sid)
            if s is None or not (s.a < r < s.c) or s.first_hot >= r:
                continue  # not recomputable, or nothing saved before r
            if (s.id, s.c) not in srcs:
                continue  # cannot re-run even at its own access
            key = (s.id, r)
            if key not in srcs:
                got = source_gaps(trace, writes, s.producer, r, index)
                if got is None:
                    continue
                srcs[key] = got
            pullers.setdefault(key, set()).add(gid)
            if d + 1 < reached.get(key, depth + 1):
                reached[key] = d + 1
                todo.append((s.id, r, d + 1))
    out: dict[int, list[RecPoint]] = {}
    for (gid, r), s in srcs.items():
        out.setdefault(gid, []).append(RecPoint(r, s, tuple(sorted(pullers.get((gid, r), ())))))
    return {gid: tuple(sorted(ps, key=lambda p: p.op)) for gid, ps in out.items()}

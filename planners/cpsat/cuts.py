"""Redundant constraints of the CP-SAT model: implied by its other
constraints, stated so that the LP relaxation sees them.
"""

from __future__ import annotations

from memplan.planners.cpsat.data import CpsatData, GapKind
from memplan.planners.cpsat.spec import BuiltModel
from ortools.sat.python import cp_model

# NOTE [ Lane windows ]
# A copy-out of a buffer absent at hot op h runs between the end of the
# access that opens its gap (E_a; 0 for a HEAD gap of one job) and E_{h-1} -
# margin, or R_h if h waits for it (NOTE [ Swap-out deadlines in the model ]
# in cpsat/model.py; R_h >= E_{h-1} either way); a copy-in of it (but a cross-iteration one, which may wrap into the
# next period) between E_h + margin and the ready time of the access that
# closes it, R_c <= E_c - d_c. Copies in one direction never overlap (one
# lane, or one lane per direction), so for every hot op h and every k
#     sum of out_ticks over gaps absent at h with a >= k <= R_h - E_k
#     sum of in_ticks over gaps absent at h with c <= k  <= E_k - d_k - E_h
# (without the margin: with no gap absent the window may be shorter than it).
# The lane's no-overlap implies them once the times are fixed, but its
# linear relaxation knows nothing of it: only the memory rows say which
# buffers must leave, and the LP lets them all leave at once. On chain(13)
# at a tight budget (benchmarks/cpsat.py --solve-times) the LP bound goes
# from 2.073 to 2.145 ms in the first 0.2 s (optimum 2.183 ms) and the proof
# from 21-28 s to 4-9 s with two workers. Only gaps certain to copy out (no
# earlier host copy to reuse) enter the first sum, and only free gaps
# (dropping terms keeps an inequality valid). Each window sums a prefix of
# the gaps sorted by a (or c), so the terms grow as hot ops x gaps^2; above
# WINDOW_TERMS_MAX only the widest window of each hot op is kept (from the
# earliest a, up to the latest c).


WINDOW_TERMS_MAX = 60_000

# (threshold op, ticks, absence literal)
_Item = tuple[int, int, cp_model.LinearExprT]


def add_lane_windows(
    model: cp_model.CpModel,
    data: CpsatData,
    bm: BuiltModel,
    free: list[bool],
) -> None:
    """NOTE [ Lane windows ] for every hot op."""
    hot, end = data.hot.tolist(), bm.end
    dur = data.dur.tolist()
    outs: list[list[_Item]] = [[] for _ in hot]
    ins: list[list[_Item]] = [[] for _ in hot]
    for g in data.gaps:
        if not free[g.id]:
            continue
        ot, it = int(data.out_ticks[g.buffer]), int(data.in_ticks[g.buffer])
        certain = bm.copy[g.id] is bm.swap[g.id]  # no host copy to reuse: a swap copies out
        for h0, h1, z in bm.segments[g.id]:
            for h in range(h0, h1 + 1):
                if certain:
                    outs[h].append((g.a, ot, z))
                if g.kind is not GapKind.CROSS:
                    ins[h].append((g.c, it, z))
    nested = sum(len(x) ** 2 for x in outs) + sum(len(x) ** 2 for x in ins) <= 2 * WINDOW_TERMS_MAX
    for h, k in enumerate(hot):
        # copies-out, latest openers first: each prefix starts no earlier than E_a
        for a, terms in _prefixes(sorted(outs[h], key=lambda x: -x[0]), nested):
            start: cp_model.LinearExprT = end[a] if a >= 0 else 0
            model.add(terms <= bm.ready[k] - start)
        # copies-in, earliest closers first: each prefix is back by R_c <= E_c - d_c
        for c, terms in _prefixes(sorted(ins[h], key=lambda x: x[0]), nested):
            model.add(terms <= end[c] - dur[c] - end[k])


def _prefixes(items: list[_Item], nested: bool) -> list[tuple[int, cp_model.LinearExprT]]:
    """(threshold, sum of ticks x literal) of each prefix of `items` that ends
    where the threshold changes (only the whole list unless `nested`). A
    single item counts too: its absence rule leaves the op free to wait for
    it (NOTE [ Swap-out deadlines in the model ]), and the relaxation would
    not see what that wait costs."""
    out: list[tuple[int, cp_model.LinearExprT]] = []
    for i, (key, _, _) in enumerate(items):
        last = i + 1 == len(items)
        if last or (nested and items[i + 1][0] != key):
            out.append((key, sum(w * z for _, w, z in items[: i + 1])))
    return out

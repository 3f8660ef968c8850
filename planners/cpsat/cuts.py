"""Redundant constraints of the CP-SAT model: implied by its other
constraints, stated so that the LP relaxation sees them.
"""

from __future__ import annotations

from memplan.planners.cpsat.data import CpsatData, GapKind
from memplan.planners.cpsat.spec import BuiltModel
from ortools.sat.python import cp_model

# NOTE [ Lane windows ]
# A copy-out of a buffer absent at hot op h runs between E_a and E_{h-1} - margin (or R_h
# if h waits for it, NOTE [ Swap-out deadlines in the model ] in cpsat/model.py); a copy-in
# (not a cross-iteration one) between E_h + margin and R_c <= E_c - d_c. Copies of one
# direction never overlap, so for every hot op h and every k
#     sum of out_ticks over gaps absent at h with a >= k <= R_h - E_k
#     sum of in_ticks over gaps absent at h with c <= k  <= E_k - d_k - E_h
# (without the margin). The lane's no-overlap implies them once times are fixed, but its LP
# relaxation lets every buffer leave at once; the cuts tighten the bound and shorten the
# proof. Only gaps certain to copy out enter the first sum, only free gaps either (dropping
# terms keeps them valid). Terms grow as hot ops x gaps^2: above WINDOW_TERMS_MAX only each
# hot op's widest window is kept. Measurements: docs/notes.md, "Lane windows".


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

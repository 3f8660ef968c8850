"""The memory sections of the CP-SAT model: when a gap's buffer counts as
absent (segment by segment), and the budget (or the peak) at every hot op.
The rules are NOTE [ CP-SAT semantics ] in `cpsat/model.py`; the soft budget
is NOTE [ Soft budget ] in `cpsat/search.py`.
"""

from __future__ import annotations

import numpy as np
from memplan.planners.cpsat.data import CpsatData, Gap, gcd_bytes
from memplan.planners.cpsat.spec import RECOMPUTE, SWAP, BuiltModel, Objective
from ortools.sat.python import cp_model

DIRECT_TERMS_MAX = 200_000  # memory rows as direct sums up to this many terms, else a chain

# (first hot position, last hot position, weight in units, literal)
_Item = tuple[int, int, int, cp_model.LinearExprT]
_Terms = list[tuple[int, cp_model.LinearExprT]]


def segments_of(
    gap: Gap,
    block: int,
    fine: tuple[int, int] | None = None,
    cut: tuple[int, int] = (-1, -1),
) -> list[tuple[int, int]]:
    """(first, last) hot positions of each absence segment of `gap`: runs of
    its hot positions within one block of `block` consecutive hot ops, one
    op each inside `fine`, never straddling the ends of `cut` (an incumbent's
    absence span, which must stay a union of segments)."""
    out: list[tuple[int, int]] = []
    f0, f1 = fine if fine is not None else (0, -1)

    def key(h: int) -> tuple[int, int, bool]:
        inside = cut[0] <= h <= cut[1]
        return (1, h, inside) if f0 <= h <= f1 else (0, h // block, inside)

    for h in gap.hot_idx:
        if out and key(h) == key(out[-1][0]):
            out[-1] = (out[-1][0], h)
        else:
            out.append((h, h))
    return out


def _holds_own_end(data: CpsatData, g: Gap, lo: int, hi: int) -> bool:
    """An op of `g`'s job ends between the window before position `lo` and
    that of `hi`: a hole over lo..hi leaves room for the job's SwapIn trigger."""
    return data.n_jobs == 1 or bool((data.order.job[lo - 1 : hi + 1] == g.job).any())


# ---- constraints: absence, segment by segment ----------------------------------------------
def add_absence(bm: BuiltModel, free: list[bool]) -> None:
    """Per free gap one literal `absent_g{g}_h{h0}` per segment: absent over it
    needs the copy-out done `margin` before its first op's window and the
    copy-in started `margin` after its last; a swap is absent over at least
    one segment that holds the end of one of its job's own ops. A fixed
    swapped gap is absent over its incumbent's span."""
    model, data, spec, end = bm.model, bm.data, bm.spec, bm.end
    hot, m = data.hot.tolist(), data.margin
    for g in data.gaps:
        s, cp = bm.swap[g.id], bm.copy[g.id]
        os_, is_, ot = bm.out_start[g.id], bm.in_start[g.id], int(data.out_ticks[g.buffer])
        segs = []
        if free[g.id]:
            inc = spec.incumbent
            cut = inc.absent[g.id] if inc is not None else (-1, -1)
            y = bm.wait.get(g.id)
            for h0, h1 in segments_of(g, spec.block, spec.fine, cut):
                z = model.new_bool_var(f"absent_g{g.id}_h{h0}")
                lo, hi = hot[h0], hot[h1]
                model.add_implication(z, s)
                e_prev = end[lo - 1] if lo else 0  # op 0: the iteration start
                if y is not None and h0 == g.hot_idx[0]:  # or op lo waits for it
                    model.add_implication(y, z)
                    model.add(os_ + ot + m <= e_prev).only_enforce_if([z, cp, ~y])
                else:
                    model.add(os_ + ot + m <= e_prev).only_enforce_if([z, cp])
                model.add(is_ >= end[hi] + m).only_enforce_if(z)
                segs.append((h0, h1, z))
            # a hole that holds the end of one of the job's own ops (NOTE [ Several jobs ])
            model.add_bool_or(
                [z for h0, h1, z in segs if _holds_own_end(data, g, hot[h0], hot[h1])]
            ).only_enforce_if(s)
        else:
            inc = bm.fixed()
            u, v = inc.absent[g.id]
            if inc.mode[g.id] == SWAP:
                if not inc.wait[g.id]:  # (else its first hot op waits for the copy)
                    e_prev = end[hot[u] - 1] if hot[u] else 0
                    model.add(os_ + ot + m <= e_prev).only_enforce_if(cp)
                model.add(is_ >= end[hot[v]] + m)
        bm.segments[g.id] = segs


# ---- constraints: memory at every hot op ---------------------------------------------------
def add_memory(bm: BuiltModel, free: list[bool]) -> None:
    """At every hot op the bytes kept off the device bring it under the budget
    (time objective) or under `peak_units` (peak objective), in units of
    `gcd_bytes`; with a soft budget each row may exceed it by its excess."""
    data, spec = bm.data, bm.spec
    unit = gcd_bytes(data, spec.objective is Objective.PEAK)
    bm.objective_unit = unit
    items, fixed_absent = _absence_items(bm, free, unit)
    slack: cp_model.LinearExprT = 0
    if spec.objective is Objective.PEAK:
        lo_p = -(-max(spec.peak_floor, 0) // unit)
        hi_p = spec.budget // unit
        slack = bm.peak = bm.model.new_int_var(min(lo_p, hi_p), hi_p, "peak_units")
    need = _needs(bm, data.mem0[data.hot], fixed_absent, unit)
    need_expr = _soft_excess(bm, need) if spec.soft else list(need)
    bm.n_terms = sum(h1 - h0 + 1 for h0, h1, _, _ in items)
    if bm.n_terms <= DIRECT_TERMS_MAX:
        rows = _direct_rows(bm, items, slack, need_expr)
    else:
        rows = _chained_rows(bm, items, slack, need_expr)
    # while an op waits for copy-outs, its new outputs are not made yet
    wait_mem = (data.mem0 - data.created)[data.hot]
    need_w = _needs(bm, wait_mem, fixed_absent, unit)
    if spec.soft:
        k = bm.excess_step
        need_w = [x - k * o for x, o in zip(need_w, bm.row_excess, strict=True)]
    _wait_rows(bm, unit, rows, slack, need_w)
    _temporaries(bm, unit, rows, slack, need_expr)


def _temporaries(
    bm: BuiltModel,
    unit: int,
    rows: list[cp_model.LinearExprT],
    slack: cp_model.LinearExprT,
    need: list[cp_model.LinearExprT],
) -> None:
    """A recomputation's temporaries on top of its op's window (NOTE
    [ Recompute ] in cpsat/model.py): its row at a hot op, its keep-all
    memory elsewhere."""
    data, spec = bm.data, bm.spec
    hot_at = {k: h for h, k in enumerate(data.hot.tolist())}
    at_hot: dict[int, list[cp_model.LinearExprT]] = {}
    at_cold: dict[int, list[cp_model.LinearExprT]] = {}
    for g in data.gaps:
        if not g.temp_bytes:
            continue
        for x, pt in zip(bm.rec_at.get(g.id, ()), g.rec_points):
            h = hot_at.get(pt.op)
            if h is not None:
                at_hot.setdefault(h, []).append(-(-g.temp_bytes // unit) * x)
            else:
                at_cold.setdefault(pt.op, []).append(g.temp_bytes * x)
    for h, terms in at_hot.items():
        bm.model.add(slack + rows[h] - sum(terms) >= need[h])
    for k, terms in at_cold.items():
        mem = int(data.mem0[k])
        if spec.objective is Objective.PEAK:
            bm.model.add(unit * slack >= mem + sum(terms))
        else:
            bm.model.add(mem + sum(terms) <= spec.budget)


def _needs(bm: BuiltModel, mem: np.ndarray, fixed_absent: np.ndarray, unit: int) -> list[int]:
    """Per hot position, the units the free part must keep off the device for
    `mem` bytes: unit * (peak + absent) >= mem in peak mode, unit * absent >=
    mem - budget in time mode."""
    cap = 0 if bm.spec.objective is Objective.PEAK else bm.spec.budget
    return [-(-(int(x) - cap) // unit) - int(f) for x, f in zip(mem, fixed_absent, strict=True)]


def _wait_rows(
    bm: BuiltModel,
    unit: int,
    rows: list[cp_model.LinearExprT],
    slack: cp_model.LinearExprT,
    need: list[cp_model.LinearExprT],
) -> None:
    """While a hot op waits for copy-outs its outputs are not made yet and the
    buffers it waits for are still there (NOTE [ Swap-out deadlines in the
    model ] in cpsat/model.py): its absent units less those, against `need`
    (its row's, less its new outputs)."""
    data = bm.data
    back: dict[int, list[cp_model.LinearExprT]] = {}
    for g in data.gaps:
        if g.id in bm.wait:  # absent at its first hot op in `rows`, but still there
            w = int(data.nbytes[g.buffer]) // unit
            back.setdefault(g.hot_idx[0], []).append(w * bm.wait[g.id])
    for h, terms in back.items():
        bm.model.add(slack + rows[h] - sum(terms) >= need[h])


def _absence_items(bm: BuiltModel, free: list[bool], unit: int) -> tuple[list[_Item], np.ndarray]:
    """(the free part: one item per absence segment and per recompute point;
    the fixed part: units absent at each hot position)."""
    data = bm.data
    fixed_absent = np.zeros(len(data.hot), np.int64)
    items: list[_Item] = []
    for g in data.gaps:
        w = int(data.nbytes[g.buffer]) // unit
        if free[g.id]:
            items.extend((h0, h1, w, z) for h0, h1, z in bm.segments[g.id])
            bm.items.extend((h0, h1, w, g.id, -1) for h0, h1, _ in bm.segments[g.id])
            for i, (x, pt) in enumerate(zip(bm.rec_at.get(g.id, ()), g.rec_points)):
                h0, h1 = g.rec_span(pt.op)
                items.append((h0, h1, w, x))
                bm.items.append((h0, h1, w, g.id, i))
        else:
            inc = bm.fixed()
            if inc.mode[g.id] in (SWAP, RECOMPUTE):
                u, v = inc.absent[g.id]
                fixed_absent[u : v + 1] += w
    return items, fixed_absent


def _soft_excess(bm: BuiltModel, need: list[int]) -> list[cp_model.LinearExprT]:
    """Per-row excess variables, summed into `bm.excess` (every row that
    improves counts); the rows' needs less their excess."""
    model = bm.model
    # in steps of `k` units (about a MiB) so that weight * excess fits in int64
    k = max(1, -(-(1 << 20) // bm.objective_unit))
    top = sum(-(-max(x, 0) // k) for x in need)
    k *= max(1, -(-(top * (bm.horizon + 1)) // (1 << 60)))
    over = [model.new_int_var(0, -(-max(x, 0) // k), f"excess_h{h}") for h, x in enumerate(need)]
    bm.row_excess, bm.excess_step = over, k
    bm.excess = model.new_int_var(0, sum(-(-max(x, 0) // k) for x in need), "excess_steps")
    model.add(bm.excess == sum(over))
    return [x - k * o for x, o in zip(need, over, strict=True)]


def _direct_rows(
    bm: BuiltModel,
    items: list[_Item],
    slack: cp_model.LinearExprT,
    need: list[cp_model.LinearExprT],
) -> list[cp_model.LinearExprT]:
    """One linear row per hot position over the items absent there; the absent
    units per hot position."""
    rows: list[_Terms] = [[] for _ in range(len(bm.data.hot))]
    for h0, h1, w, lit in items:
        for h in range(h0, h1 + 1):
            rows[h].append((w, lit))
    sums: list[cp_model.LinearExprT] = [sum(w * x for w, x in row) for row in rows]
    for h, absent in enumerate(sums):
        bm.model.add(slack + absent >= need[h])
    return sums


def _chained_rows(
    bm: BuiltModel,
    items: list[_Item],
    slack: cp_model.LinearExprT,
    need: list[cp_model.LinearExprT],
) -> list[cp_model.LinearExprT]:
    """A running sum over hot positions: each item enters and leaves once; the
    sums."""
    model, n_hot = bm.model, len(bm.data.hot)
    starts: list[_Terms] = [[] for _ in range(n_hot + 1)]
    stops: list[_Terms] = [[] for _ in range(n_hot + 1)]
    for h0, h1, w, lit in items:
        starts[h0].append((w, lit))
        stops[h1 + 1].append((w, lit))
    total = sum(w for _, _, w, _ in items)
    covered: cp_model.LinearExprT = 0
    for h in range(n_hot):
        y = model.new_int_var(0, total, f"absent_units_h{h}")
        model.add(y == covered + sum(w * x for w, x in starts[h]) - sum(w * x for w, x in stops[h]))
        covered = y
        bm.chain.append(y)
        model.add(slack + y >= need[h])
    return list(bm.chain)

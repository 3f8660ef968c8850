"""CP-SAT solutions (`spec.Solution`, plain integers): the read-out of a
solver's values, hints from a solution, the keep-everything start, and the
memory a solution accounts for (NOTE [ CP-SAT semantics ] in `cpsat/model.py`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from memplan.planners.cpsat.data import CpsatData
from memplan.planners.cpsat.spec import KEEP, RECOMPUTE, SWAP, BuiltModel, Solution
from ortools.sat.python import cp_model


# ---- hints and read-out -----------------------------------------------------------------------
def add_hint(bm: BuiltModel, sol: Solution) -> None:
    """Warm-start from `sol` (every decision and time of the free part)."""
    model, data = bm.model, bm.data
    model.clear_hints()
    seen: set[int] = set()

    class _Once:  # every variable hinted once (aliases such as ready = end[k-1] share one)
        @staticmethod
        def add_hint(var: cp_model.IntVar, value: int) -> None:
            if var.index not in seen:
                seen.add(var.index)
                model.add_hint(var, value)

    hints = _Once()
    for k, e in enumerate(bm.end):
        hints.add_hint(e, sol.end[k])
    for k, r in enumerate(bm.ready):
        if isinstance(r, cp_model.IntVar):
            hints.add_hint(r, sol.ready[k])
    T = sol.iteration_ticks
    for g in data.gaps:
        swapped = sol.mode[g.id] == SWAP
        t_in = sol.in_start[g.id] if swapped else 0
        if g.id in bm.in_end:
            hints.add_hint(bm.in_end[g.id], t_in + int(data.in_ticks[g.buffer]) if swapped else 0)
        if g.id in bm.in_wrapped:
            hints.add_hint(bm.in_wrapped[g.id], t_in - T)
        if not swapped:  # an absent interval's start is free: keep it in its domain
            hints.add_hint(bm.in_start[g.id], 0)
            hints.add_hint(bm.out_start[g.id], 0)
        elif not sol.copy[g.id]:
            hints.add_hint(bm.out_start[g.id], 0)
    for g in data.gaps:
        if not bm.is_free(g.id):
            continue
        mode = sol.mode[g.id]
        hints.add_hint(bm.swap[g.id], int(mode == SWAP))
        if g.id in bm.rec:
            hints.add_hint(bm.rec[g.id], int(mode == RECOMPUTE))
            for x, pt in zip(bm.rec_at[g.id], g.rec_points, strict=True):
                hints.add_hint(x, int(mode == RECOMPUTE and sol.rec_at[g.id] == pt.op))
        cp = bm.copy[g.id]
        if isinstance(cp, cp_model.IntVar) and cp is not bm.swap[g.id]:
            hints.add_hint(cp, int(sol.copy[g.id]))
        if g.id in bm.wait:
            w = sol.wait[g.id]
            hints.add_hint(bm.wait[g.id], int(w))
            t_end = sol.out_start[g.id] + int(data.out_ticks[g.buffer])
            hints.add_hint(bm.wait_end[g.id], t_end if w else 0)
        if sol.out_start[g.id] >= 0:
            hints.add_hint(bm.out_start[g.id], sol.out_start[g.id])
        if sol.in_start[g.id] >= 0:
            hints.add_hint(bm.in_start[g.id], sol.in_start[g.id])
        u, v = sol.absent[g.id]
        for h0, h1, z in bm.segments[g.id]:
            hints.add_hint(z, int(mode == SWAP and u <= h0 and h1 <= v))
    unit = bm.objective_unit
    peak_units = -(-sol.peak_bytes // unit)
    if bm.chain:
        covered = np.zeros(len(data.hot) + 1, np.int64)
        for h0, h1, w, gid, point in bm.items:
            u, v = sol.absent[gid]
            if point >= 0:
                pt = data.gaps[gid].rec_points[point]
                on = sol.mode[gid] == RECOMPUTE and sol.rec_at[gid] == pt.op
            else:
                on = sol.mode[gid] == SWAP and u <= h0 and h1 <= v
            if on:
                covered[h0] += w
                covered[h1 + 1] -= w
        for y, c in zip(bm.chain, np.cumsum(covered)[:-1].tolist(), strict=True):
            hints.add_hint(y, c)
    if bm.peak is not None:
        hints.add_hint(bm.peak, min(peak_units, bm.spec.budget // unit))
    if bm.excess is not None:
        over = [-(-x // bm.excess_step) for x in row_excess(bm, sol)]
        for x, v in zip(bm.row_excess, over, strict=True):
            hints.add_hint(x, v)
        hints.add_hint(bm.excess, sum(over))


def row_excess(bm: BuiltModel, sol: Solution) -> list[int]:
    """Per hot position, the units by which `sol` exceeds the memory cap, in
    its row or, where an op waits for copy-outs, in its wait row (NOTE
    [ Swap-out deadlines in the model ] in cpsat/model.py)."""
    data, unit = bm.data, bm.objective_unit
    absent = absent_bytes(data, sol) // unit
    back = np.zeros(len(data.hot), np.int64)
    temps = np.zeros(len(data.hot), np.int64)  # recomputations' temporaries (NOTE [ Recompute ])
    hot_at = {k: h for h, k in enumerate(data.hot.tolist())}
    for g in data.gaps:
        if sol.mode[g.id] == SWAP and sol.wait[g.id]:
            back[g.hot_idx[0]] += int(data.nbytes[g.buffer]) // unit
        elif sol.mode[g.id] == RECOMPUTE and g.temp_bytes and sol.rec_at[g.id] in hot_at:
            temps[hot_at[sol.rec_at[g.id]]] += -(-g.temp_bytes // unit)
    peak = bm.peak is not None
    cap = 0 if peak else bm.spec.budget
    top = bm.spec.budget // unit if peak else 0  # the peak variable's largest value
    out = []
    mem0, created = data.mem0[data.hot].tolist(), data.created[data.hot].tolist()
    rows = zip(mem0, created, absent.tolist(), back.tolist(), temps.tolist(), strict=True)
    for x, c, a, w, tmp in rows:
        row = -(-(x - cap) // unit) - a - top
        wait_row = -(-(x - c - cap) // unit) - a + w - top if w else row
        out.append(max(0, row + tmp, wait_row))
    return out


def read_solution(
    bm: BuiltModel, solver: cp_model.CpSolver | cp_model.CpSolverSolutionCallback
) -> Solution:
    """The solver's current solution as plain integers."""
    data = bm.data
    val = solver.value
    modes, copies, outs, ins, absent, rec_at, wait = [], [], [], [], [], [], []
    for g in data.gaps:
        at = [pt.op for x, pt in zip(bm.rec_at.get(g.id, ()), g.rec_points) if val(x)]
        if val(bm.swap[g.id]):
            mode = SWAP
        elif at:
            mode = RECOMPUTE
        else:
            mode = KEEP
        rec_at.append(at[0] if mode == RECOMPUTE else -1)
        cp = mode == SWAP and bool(val(bm.copy[g.id]))
        waits = cp and g.id in bm.wait and bool(val(bm.wait[g.id]))
        if waits:  # a copy that ends `margin` before the op's window needs no wait
            h = g.hot[0]
            waits = val(bm.out_start[g.id]) + int(data.out_ticks[g.buffer]) + data.margin > (
                val(bm.end[h - 1]) if h > 0 else 0
            )
        wait.append(waits)
        modes.append(mode)
        copies.append(cp)
        outs.append(int(val(bm.out_start[g.id])) if cp else -1)
        ins.append(int(val(bm.in_start[g.id])) if mode == SWAP else -1)
        if mode == SWAP:
            if bm.is_free(g.id):
                chosen = [(h0, h1) for h0, h1, z in bm.segments[g.id] if val(z)]
                absent.append((chosen[0][0], chosen[-1][1]))
            else:
                assert bm.spec.incumbent is not None
                absent.append(bm.spec.incumbent.absent[g.id])
        elif mode == RECOMPUTE:
            absent.append(g.rec_span(rec_at[-1]))
        else:
            absent.append((-1, -1))
    end = tuple(int(val(e)) for e in bm.end)
    ready = tuple(int(val(r)) if not isinstance(r, int) else r for r in bm.ready)
    sol = Solution(
        tuple(modes),
        tuple(copies),
        tuple(outs),
        tuple(ins),
        tuple(absent),
        tuple(rec_at),
        tuple(wait),
        ready,
        end,
        0,
    )
    return _with_peak(data, sol)


def _with_peak(data: CpsatData, sol: Solution) -> Solution:
    return replace(sol, peak_bytes=model_peak(data, sol))


def absent_bytes(data: CpsatData, sol: Solution) -> np.ndarray:
    """int64[n_hot]: bytes `sol` keeps off the device at each hot op."""
    absent = np.zeros(len(data.hot), np.int64)
    for g in data.gaps:
        w = int(data.nbytes[g.buffer])
        if sol.mode[g.id] != KEEP:
            u, v = sol.absent[g.id]
            absent[u : v + 1] += w
    return absent


def model_peak(data: CpsatData, sol: Solution) -> int:
    """The peak bytes the model accounts for `sol` (closed op windows)."""
    mem = data.mem0.copy()
    mem[data.hot] -= absent_bytes(data, sol)
    return int(mem.max())


def keep_all(data: CpsatData) -> Solution:
    """Every gap kept: the release-only plan (over the budget at the hot ops)."""
    g = len(data.gaps)
    end = tuple(np.cumsum(data.dur).tolist())
    ready = (0, *end[:-1])
    none = (-1,) * g
    no = (False,) * g
    sol = Solution((KEEP,) * g, no, none, none, ((-1, -1),) * g, none, no, ready, end, 0)
    return _with_peak(data, sol)

"""The large neighbourhood search for traces too large for the exact model:
a coarse model, then windows around the memory peaks (NOTE [ Windows ]).
`cpsat/search.py` decides when it runs.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import numpy as np
from memplan.planners.cpsat.data import CpsatData
from memplan.planners.cpsat.model import build
from memplan.planners.cpsat.options import CpsatOptions
from memplan.planners.cpsat.solution import absent_bytes
from memplan.planners.cpsat.solve import solve, time_left
from memplan.planners.cpsat.spec import ModelSpec, Objective, Solution

# NOTE [ Windows ]
# The exact model has one absence literal per (gap, hot op). Above `max_exact_terms` the
# planner 1. solves a coarsened model (a gap absent over whole blocks of hot ops, at most
# `lns_coarse_segments` literals: a restriction, so every solution is a valid plan), then
# 2. re-opens windows of `lns_window_hot_ops` hot ops around the incumbent's tightest op:
# the gaps with hot ops inside (at most `lns_max_free_gaps`) become free, every other gap
# keeps its decision and span, all times free; a strictly better solution replaces the
# incumbent. An infeasible coarse model is refined (blocks a quarter as long); at one hot op
# per block its infeasibility is a proof. Otherwise the reported bound is the analytic one
# (planners/analysis/bounds.py; stats `search: "lns"`). Model builds take time the solver's
# limit does not see, so a window starts only while the time left exceeds the slowest build
# so far plus 0.5 s, and a refinement only while it exceeds its build plus 1 s
# (NOTE [ The time limit is the planner's ] in cpsat/search.py).
# Measurements: docs/notes.md, "Windows".


COARSE_SHARE = 0.4  # of what is left, for the coarse model before the windows
COARSE_SHARE_COLD = 0.75  # the same when there is no incumbent yet


def exact_terms(data: CpsatData) -> int:
    """Absence literals of the exact model: one per (gap, hot op)."""
    return sum(len(g.hot_idx) for g in data.gaps)


def block_size(data: CpsatData, target: int) -> int:
    """The smallest block size whose coarse model has at most `target` literals."""
    total = exact_terms(data)
    return max(1, int(math.ceil(total / max(target, 1))))


def _better(a: Solution | None, b: Solution | None, peak_mode: bool) -> bool:
    """`a` strictly better than `b`."""
    if a is None:
        return False
    if b is None:
        return True
    ka = (a.peak_bytes, a.iteration_ticks) if peak_mode else (a.iteration_ticks, a.peak_bytes)
    kb = (b.peak_bytes, b.iteration_ticks) if peak_mode else (b.iteration_ticks, b.peak_bytes)
    return ka < kb


def slack(data: CpsatData, sol: Solution, cap: int) -> np.ndarray:
    """int64[n_hot]: bytes under `cap` at each hot op under `sol`."""
    return cap - (data.mem0[data.hot] - absent_bytes(data, sol))


def lns(
    data: CpsatData,
    spec: ModelSpec,
    opts: CpsatOptions,
    hint: Solution | None,
    deadline: float,
    soft_start: Solution | None,
) -> tuple[Solution | None, float | None, dict[str, Any]]:
    """(best solution, None, stats) of NOTE [ Windows ]; with `soft_start`
    the coarse model has a soft budget and starts there (NOTE [ Soft budget ]
    in cpsat/search.py). `stats["status"]` is "INFEASIBLE" when the coarse
    model refined down to the exact one proved it."""
    info: dict[str, Any] = {"block": spec.block, "windows": 0, "windows_improved": 0}
    coarse = _coarse(data, spec, opts, hint, deadline, soft_start, info)
    inc = coarse if _better(coarse, hint, spec.objective is Objective.PEAK) else hint
    if inc is None:
        return None, None, info
    return _windows(data, spec, opts, inc, deadline, info), None, info


def _coarse(
    data: CpsatData,
    spec: ModelSpec,
    opts: CpsatOptions,
    hint: Solution | None,
    deadline: float,
    soft_start: Solution | None,
    info: dict[str, Any],
) -> Solution | None:
    """The coarse model's best solution, refined while it is infeasible and
    there is no hint and time left."""
    # without an incumbent the windows have nothing to refine: the coarse model
    # gets most of the time to find one
    coarse_t = (COARSE_SHARE if hint is not None else COARSE_SHARE_COLD) * time_left(deadline)
    block = spec.block
    while True:
        # segments cut at the hint's holes, so that the hint is a solution here too
        cspec = replace(
            spec, block=block, soft=soft_start is not None, incumbent=hint or soft_start
        )
        t = time.perf_counter()
        bm = build(data, cspec)
        built_s = time.perf_counter() - t  # NOTE [ Windows ]: a finer one builds no faster
        info["model_terms"] = bm.n_terms
        out = solve(bm, opts, coarse_t, hint or soft_start, "cpsat coarse")
        info["coarse_status"], info["block"] = out.status, block
        if out.status != "INFEASIBLE" or hint is not None or time_left(deadline) < 1.0 + built_s:
            break
        if block == 1:  # the coarsening was no restriction: a proof
            info["status"] = "INFEASIBLE"
            break
        block = max(1, block // 4)  # too coarse to fit: refine and try again
        coarse_t = COARSE_SHARE_COLD * time_left(deadline)
    if out.excess and out.over_budget is not None:  # its peak, over the budget
        info["excess_bytes"] = out.over_budget.peak_bytes - spec.budget
    return out.solution


def _windows(
    data: CpsatData,
    spec: ModelSpec,
    opts: CpsatOptions,
    inc: Solution,
    deadline: float,
    info: dict[str, Any],
) -> Solution:
    """Re-open windows around the tightest hot ops of the incumbent until the
    time is up or it meets the analytic bound; the best incumbent."""
    peak_mode = spec.objective is Objective.PEAK
    n_hot, half = len(data.hot), max(opts.lns_window_hot_ops // 2, 1)
    visited = np.zeros(n_hot, bool)
    target = spec.peak_floor if peak_mode else spec.time_floor
    built_s = 0.0  # the slowest window build so far (NOTE [ Windows ])
    while time_left(deadline) > 0.5 + built_s:
        if (inc.peak_bytes if peak_mode else inc.iteration_ticks) <= target:
            break  # at the analytic bound: nothing to gain
        cap = inc.peak_bytes if peak_mode else spec.budget
        order = np.argsort(slack(data, inc, cap), kind="stable")
        centre = next((int(h) for h in order if not visited[h]), None)
        if centre is None:
            visited[:] = False
            continue
        w0, w1 = max(centre - half, 0), min(centre + half, n_hot - 1)
        visited[w0 : w1 + 1] = True
        free = _window_gaps(data, w0, w1, opts.lns_max_free_gaps)
        t = time.perf_counter()
        wbm = build(data, replace(spec, free=free, incumbent=inc, fine=(w0, w1)))
        built_s = max(built_s, time.perf_counter() - t)
        limit = min(opts.lns_window_time_s, time_left(deadline))
        wout = solve(wbm, opts, limit, inc, "cpsat window")
        info["windows"] += 1
        if _better(wout.solution, inc, peak_mode):
            assert wout.solution is not None
            inc = wout.solution
            info["windows_improved"] += 1
            visited[:] = False
            visited[w0 : w1 + 1] = True
    return inc


def _window_gaps(data: CpsatData, w0: int, w1: int, most: int) -> frozenset[int]:
    """The (at most `most`) gaps with the most hot ops in positions w0..w1."""
    overlap = [
        (sum(1 for h in g.hot_idx if w0 <= h <= w1), g.id)
        for g in data.gaps
        if g.hot_idx[0] <= w1 and g.hot_idx[-1] >= w0
    ]
    overlap.sort(reverse=True)
    return frozenset(gid for _, gid in overlap[:most])

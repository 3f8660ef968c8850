"""Running the CP-SAT planner: the exact model when it is small enough, else a
large neighbourhood search in windows around the memory peaks.

# NOTE [ Windows ]
# The exact model has one absence literal per (gap, hot op): up to a million
# on the shipped traces. Above `max_exact_terms` of them the planner
# 1. solves a coarsened model, in which a gap is absent over whole blocks of
#    consecutive hot ops (`lns_coarse_segments` literals at most) -- a
#    restriction of the exact model, so every solution is a valid plan;
# 2. then repeatedly re-opens a window of `lns_window_hot_ops` hot ops around
#    the tightest op of the incumbent (least memory slack first): the gaps
#    with hot ops in the window (at most `lns_max_free_gaps`) become free,
#    with one literal per hot op inside the window; every other gap keeps the
#    incumbent's decision and absence span, and all times stay free. A window
#    solution replaces the incumbent when it is strictly better.
# A coarse model that turns out infeasible is refined (blocks a quarter as
# long) and solved again; at one hot op per block it is the exact model and
# its infeasibility a proof. Otherwise a restricted model proves nothing
# globally, so the reported best bound is the analytic one of
# `planners/analysis/bounds.py`; the stats say `search: "lns"`.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Any

import numpy as np
from memplan.hwmodels.latency import LatencyModel
from memplan.hwmodels.profile import Hardware
from memplan.planners.core.plan import PlanResult
from memplan.planners.cpsat.data import TICKS_PER_S, CpsatData, gcd_bytes
from memplan.planners.cpsat.model import ModelSpec, Objective, build
from memplan.planners.cpsat.planner import (
    CpsatOptions,
    analytic_bounds,
    data_for,
    hint_solution,
    result,
    solve,
    trivial_plans,
)
from memplan.planners.cpsat.readout import plans_from_solution
from memplan.planners.cpsat.solution import MODE_NAMES, Solution, absent_bytes, keep_all
from memplan.traces.model import Trace

HINT_SHARE = 0.2  # of the time limit, at most, to complete the hint's timing
SOFT_TERMS = 2_000  # below this the hard model finds first plans (or proofs) quickly
HARD_SHARE = 0.5  # of the time for the hard model of a small instance before going soft
COARSE_SHARE = 0.4  # of what is left, for the coarse model before the windows
COARSE_SHARE_COLD = 0.75  # the same when there is no incumbent yet


def exact_terms(data: CpsatData) -> int:
    return sum(len(g.hot_idx) for g in data.gaps)


def run(
    traces: tuple[Trace, ...],
    hw: Hardware,
    latency: LatencyModel,
    budget: int,
    opts: CpsatOptions,
    t0: float,
) -> PlanResult:
    """Plan `traces` under `budget` bytes within `opts.time_limit_s`."""
    deadline = t0 + opts.time_limit_s
    peak_lb, time_lb_s = analytic_bounds(traces, hw, latency, budget, opts)
    base = {"peak_bound_bytes": peak_lb, "analytic_bound_s": _num(time_lb_s)}
    if budget < peak_lb:
        return result(
            opts,
            budget,
            t0,
            "INFEASIBLE",
            None,
            {
                **base,
                "reason": f"budget {budget} B is below the peak lower bound {peak_lb} B",
                "objective": None,
                "best_bound": None,
            },
        )
    peak_mode = opts.objective is Objective.PEAK
    threshold = peak_lb if peak_mode else budget
    data = data_for(traces, hw, latency, threshold, opts)
    compute = data.compute_ticks
    time_cap = int(math.floor(opts.max_eor * compute)) if peak_mode else None
    # T is whole ticks: T >= bound  <=>  T >= ceil(bound) (less float noise)
    floor = math.ceil(time_lb_s * TICKS_PER_S - 1e-3) if math.isfinite(time_lb_s) else 0
    spec = ModelSpec(
        opts.objective, budget, time_cap, peak_floor=peak_lb, time_floor=0 if peak_mode else floor
    )
    info: dict[str, Any] = {
        **base,
        "ops": data.n_ops,
        "jobs": data.n_jobs,
        "hot_ops": len(data.hot),
        "gaps": len(data.gaps),
        "exact_terms": exact_terms(data),
        "exact_transfers": data.exact_transfers,
        "compute_s": compute / TICKS_PER_S,
    }
    if len(data.hot) == 0:  # nothing exceeds the threshold: release-only is optimal
        obj = float(data.mem0.max()) if peak_mode else compute / TICKS_PER_S
        return result(
            opts,
            budget,
            t0,
            "OPTIMAL",
            trivial_plans(traces),
            {
                **info,
                "search": "none",
                "objective": obj,
                "best_bound": obj,
                "iteration_time_s": compute / TICKS_PER_S,
                "model_peak_bytes": int(data.mem0.max()),
                "hint": "none",
                "decisions": dict.fromkeys(MODE_NAMES, 0),
            },
        )

    exact = info["exact_terms"] <= opts.max_exact_terms
    block = 1 if exact else _block(data, opts.lns_coarse_segments)
    spec = replace(spec, block=block)
    hint, start, hint_name = hint_solution(
        data,
        traces,
        hw,
        latency,
        budget,
        opts,
        spec,
        min(HINT_SHARE * opts.time_limit_s, _left(deadline)),
    )
    info["hint"] = hint_name
    # NOTE [ Soft budget ]: with no hint, a large model starts from keep-all
    soft = hint is None and info["exact_terms"] > SOFT_TERMS
    info["soft_budget"] = soft
    info["soft_start"] = opts.hint if start is not None else "keep-all"
    start = start or keep_all(data)
    if exact:
        bm = build(data, replace(spec, soft=soft))
        info["model_terms"] = bm.n_terms
        limit = _left(deadline) * (1.0 if soft or hint is not None else HARD_SHARE)
        out = solve(bm, opts, limit, hint or (start if soft else None), "cpsat")
        if out.status == "UNKNOWN" and not soft and hint is None and _left(deadline) > 1.0:
            # no plan and no proof: the rest of the time goes to the soft budget
            soft = info["soft_budget"] = True
            bm = build(data, replace(spec, soft=True))
            out = solve(bm, opts, _left(deadline), start, "cpsat soft")
        elif out.status == "FEASIBLE" and not soft and hint is None and _left(deadline) > 1.0:
            # a plan but no proof yet: the rest of the time, from that plan
            out = _resolve(bm, opts, _left(deadline), out)
        status, sol, model_bound = out.status, out.solution, out.bound
        if out.excess:
            info["excess_bytes"] = out.excess * bm.excess_step * bm.objective_unit
        info["search"] = "exact"
        if sol is None and hint is not None:
            sol, status = hint, "FEASIBLE"
    else:
        sol, model_bound, lns_info = lns(data, spec, opts, hint, deadline, start if soft else None)
        status = "FEASIBLE" if sol is not None else lns_info.pop("status", "UNKNOWN")
        info.update(lns_info, search="lns")
    return _finish(opts, budget, t0, data, spec, status, sol, model_bound, time_lb_s, info)


def _resolve(bm: Any, opts: CpsatOptions, time_limit_s: float, first: Any) -> Any:
    """Solve `bm` again from `first`'s solution; the better plan and bound of both."""
    again = solve(bm, opts, time_limit_s, first.solution, "cpsat")
    if again.solution is None or again.objective > first.objective:
        return replace(first, bound=max(first.bound, again.bound))
    return replace(again, bound=max(first.bound, again.bound))


def _finish(
    opts: CpsatOptions,
    budget: int,
    t0: float,
    data: CpsatData,
    spec: ModelSpec,
    status: str,
    sol: Solution | None,
    model_bound: float | None,
    time_lb_s: float,
    info: dict[str, Any],
) -> PlanResult:
    peak_mode = spec.objective is Objective.PEAK
    unit = _unit(data) if peak_mode else 1
    if model_bound is not None and (not math.isfinite(model_bound) or status == "INFEASIBLE"):
        model_bound = None
    if peak_mode:
        model_b = None if model_bound is None else model_bound * unit
        bound = max(float(spec.peak_floor), model_b or 0.0)
        info["model_bound_bytes"] = model_b
    else:
        model_b = None if model_bound is None else model_bound / TICKS_PER_S
        bound = max(time_lb_s, model_b or 0.0)
        info["model_bound_s"] = model_b
    if sol is None:
        return result(
            opts,
            budget,
            t0,
            status,
            None,
            {
                **info,
                "objective": None,
                "best_bound": bound if status != "INFEASIBLE" else None,
            },
        )
    obj = float(sol.peak_bytes) if peak_mode else sol.iteration_ticks / TICKS_PER_S
    # proven optimal when the objective meets a bound valid for the model's plans
    tol = 1.0 if peak_mode else 1.0 / TICKS_PER_S
    if (
        status == "FEASIBLE"
        and obj <= bound + tol
        and (info.get("search") == "exact" or (not peak_mode and obj <= time_lb_s + tol))
    ):
        status = "OPTIMAL"
    if status == "OPTIMAL":
        bound = obj
    counts = dict.fromkeys(MODE_NAMES, 0)
    for mode in sol.mode:
        counts[MODE_NAMES[mode]] += 1
    plans = plans_from_solution(data, sol)
    return result(
        opts,
        budget,
        t0,
        status,
        plans,
        {
            **info,
            "objective": obj,
            "best_bound": bound,
            "iteration_time_s": sol.iteration_ticks / TICKS_PER_S,
            "model_peak_bytes": sol.peak_bytes,
            "decisions": counts,
            "d2h_copies": sum(sol.copy),
        },
    )


def _unit(data: CpsatData) -> int:
    return gcd_bytes(data, peak=True)


def _num(x: float) -> float | None:
    return None if math.isinf(x) else x


def _left(deadline: float) -> float:
    return max(deadline - time.perf_counter(), 0.05)


def _block(data: CpsatData, target: int) -> int:
    """The smallest block size whose coarse model has at most `target` literals."""
    total = exact_terms(data)
    return max(1, int(math.ceil(total / max(target, 1))))


# NOTE [ Soft budget ]
# Without a hint, a large model may spend the whole time limit looking for a
# first plan: every op's memory, the lane and the no-idle timing interlock.
# The planner then solves it with a soft budget instead: every memory row
# may exceed its cap by its own `excess_h` units, and the objective is
#     (H + 1) * sum(excess_h) + T
# (H the horizon, so any excess outweighs every iteration time), starting
# from the keep-everything solution, which is feasible for it. CP-SAT's local
# search improves that incumbent until the excess is 0 -- from then on each
# solution is a plan and the search minimises T as usual. A best bound above
# H + 1 proves that no plan of the model fits (INFEASIBLE); a solution still
# over the budget at the time limit is no plan (UNKNOWN). Small models (up to
# SOFT_TERMS absence literals) propagate and prove much better hard: they get
# HARD_SHARE of the time without the soft budget first, and the rest with it
# only if that found neither a plan nor a proof.


# ---- large neighbourhood search ---------------------------------------------------------------
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
    the coarse model has a soft budget and starts there (NOTE [ Soft budget ])."""
    peak_mode = spec.objective is Objective.PEAK
    info: dict[str, Any] = {"block": spec.block, "windows": 0, "windows_improved": 0}
    # without an incumbent the windows have nothing to refine: the coarse model
    # gets most of the time to find one
    coarse_t = (COARSE_SHARE if hint is not None else COARSE_SHARE_COLD) * _left(deadline)
    block = spec.block
    while True:
        # segments cut at the hint's holes, so that the hint is a solution here too
        cspec = replace(
            spec, block=block, soft=soft_start is not None, incumbent=hint or soft_start
        )
        bm = build(data, cspec)
        info["model_terms"] = bm.n_terms
        out = solve(bm, opts, coarse_t, hint or soft_start, "cpsat coarse")
        info["coarse_status"], info["block"] = out.status, block
        if out.status != "INFEASIBLE" or hint is not None or _left(deadline) < 1.0:
            break
        if block == 1:  # the coarsening was no restriction: a proof
            info["status"] = "INFEASIBLE"
            break
        block = max(1, block // 4)  # too coarse to fit: refine and try again
        coarse_t = COARSE_SHARE_COLD * _left(deadline)
    if out.excess:
        info["excess_bytes"] = out.excess * bm.excess_step * bm.objective_unit
    inc = out.solution if _better(out.solution, hint, peak_mode) else hint
    if inc is None:
        return None, None, info
    n_hot, half = len(data.hot), max(opts.lns_window_hot_ops // 2, 1)
    visited = np.zeros(n_hot, bool)
    target = spec.peak_floor if peak_mode else spec.time_floor
    while _left(deadline) > 0.5:
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
        overlap = [
            (sum(1 for h in g.hot_idx if w0 <= h <= w1), g.id)
            for g in data.gaps
            if g.hot_idx[0] <= w1 and g.hot_idx[-1] >= w0
        ]
        overlap.sort(reverse=True)
        free = frozenset(gid for _, gid in overlap[: opts.lns_max_free_gaps])
        wspec = replace(spec, free=free, incumbent=inc, fine=(w0, w1))
        wbm = build(data, wspec)
        wout = solve(wbm, opts, min(opts.lns_window_time_s, _left(deadline)), inc, "cpsat window")
        info["windows"] += 1
        if _better(wout.solution, inc, peak_mode):
            inc = wout.solution
            info["windows_improved"] += 1
            visited[:] = False
            visited[w0 : w1 + 1] = True
    return inc, None, info

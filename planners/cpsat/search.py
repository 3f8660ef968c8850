"""How a CP-SAT run goes, from the analytic bounds to the result: the data,
the hint planner's choices completed by the model, then the exact model
(with the soft budget when there is no hint, NOTE [ Soft budget ]) or, for
large traces, the coarse model refined in windows (`cpsat/lns.py`).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from memplan.hwmodels.device import DeviceModel
from memplan.planners.analysis.bounds import (
    joint_peak_lower_bound,
    joint_time_lower_bound,
    peak_lower_bound,
    time_lower_bound,
)
from memplan.planners.core.plan import PlanResult
from memplan.planners.cpsat.data import TICKS_PER_S, CpsatData, build_data
from memplan.planners.cpsat.hints import hint_solution
from memplan.planners.cpsat.lns import block_size, exact_terms, lns
from memplan.planners.cpsat.model import build
from memplan.planners.cpsat.options import CpsatOptions
from memplan.planners.cpsat.outcome import finish, result, trivial_plans
from memplan.planners.cpsat.solution import keep_all
from memplan.planners.cpsat.solve import resolve, solve, time_left
from memplan.planners.cpsat.spec import MODE_NAMES, ModelSpec, Objective, Solution
from memplan.traces.model import Trace

HINT_SHARE = 0.2  # of the time limit, at most, to complete the hint's timing
SOFT_TERMS = 2_000  # below this the hard model finds first plans (or proofs) quickly
HARD_SHARE = 0.5  # of the time for the hard model of a small instance before going soft
RESERVE_SHARE, RESERVE_MAX_S = 0.02, 1.5  # NOTE [ The time limit is the planner's ]


# NOTE [ The time limit is the planner's ]
# `time_limit_s` bounds the planner's whole run, as `--time-limit` promises
# and issue 16's table checks (at most 60 s per cell), not only the solver's
# calls. The searches used to run to the limit itself, and the planner
# overshot it: CP-SAT stops a little after its `max_time_in_seconds` (its
# workers finish their current step; a call also gets at least 0.05 s) and
# reading the solution out into plans comes after the last call. Measured in
# `benchmarks/pressure.py` at a 60 s limit, two processes on 2 cores:
# 60.09-60.67 s in 17 of its 29 cells (the most at densenet121 60%, which
# ended with no plan). The searches now end RESERVE_SHARE of the limit
# before it, at most RESERVE_MAX_S (1.2 s of a 60 s limit, 0.1 s of the 5 s
# a `capacity` probe gets): 58.24-59.31 s on 12 of those cells re-run.
def _deadline(t0: float, time_limit_s: float) -> float:
    return t0 + time_limit_s - min(RESERVE_SHARE * time_limit_s, RESERVE_MAX_S)


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


def run(
    traces: tuple[Trace, ...],
    device: DeviceModel,
    budget: int,
    opts: CpsatOptions,
    t0: float,
) -> PlanResult:
    """Plan `traces` on `device` under `budget` bytes within `opts.time_limit_s`
    of `t0` (a `time.perf_counter()`)."""
    deadline = _deadline(t0, opts.time_limit_s)
    peak_lb, time_lb_s = analytic_bounds(traces, device, budget)
    base = {
        "peak_bound_bytes": peak_lb,
        "analytic_bound_s": None if math.isinf(time_lb_s) else time_lb_s,
    }
    if budget < peak_lb:
        stats = {**base, "objective": None, "best_bound": None}
        return result(opts, budget, t0, "INFEASIBLE", None, stats, below_bound=peak_lb)
    peak_mode = opts.objective is Objective.PEAK
    threshold = peak_lb if peak_mode else budget
    data = build_data(
        traces, device, threshold, margin=opts.margin_ns, chain_depth=opts.chain_depth
    )
    spec = _spec(data, opts, budget, peak_lb, time_lb_s)
    info: dict[str, Any] = {
        **base,
        "ops": data.n_ops,
        "jobs": data.n_jobs,
        "hot_ops": len(data.hot),
        "gaps": len(data.gaps),
        "exact_terms": exact_terms(data),
        "exact_transfers": data.exact_transfers,
        "compute_s": data.compute_ticks / TICKS_PER_S,
    }
    if len(data.hot) == 0:
        return _nothing_hot(traces, data, opts, budget, t0, info)
    exact = info["exact_terms"] <= opts.max_exact_terms
    spec = replace(spec, block=1 if exact else block_size(data, opts.lns_coarse_segments))
    hint_time = min(HINT_SHARE * opts.time_limit_s, time_left(deadline))
    h = hint_solution(data, traces, device, budget, opts, spec, hint_time)
    hint, start, info["hint"], info["hint_fits"] = h.solution, h.start, h.source, list(h.fitting)
    if hint is not None:
        info["hint_iteration_s"] = hint.iteration_ticks / TICKS_PER_S
    # NOTE [ Soft budget ]: with no hint, a large model starts from keep-all
    soft = hint is None and info["exact_terms"] > SOFT_TERMS
    info["soft_budget"] = soft
    info["soft_start"] = h.source if start is not None else "keep-all"
    start = start or keep_all(data)
    if exact:
        status, sol, model_bound = _exact(data, spec, opts, hint, start, deadline, info)
    else:
        sol, model_bound, lns_info = lns(data, spec, opts, hint, deadline, start if soft else None)
        status = "FEASIBLE" if sol is not None else lns_info.pop("status", "UNKNOWN")
        info.update(lns_info, search="lns")
    return finish(opts, budget, t0, data, spec, status, sol, model_bound, time_lb_s, info)


def analytic_bounds(
    traces: tuple[Trace, ...], device: DeviceModel, budget: int
) -> tuple[int, float]:
    """(peak bound bytes, time bound seconds) in the simulator's accounting
    (no workspace: the simulator does not allocate it); for several jobs the
    bounds of NOTE [ Jobs in step ] in planners/analysis/bounds.py."""
    if len(traces) == 1:
        peak = peak_lower_bound(traces[0], workspace=False).nbytes
        tb = time_lower_bound(traces[0], device, budget, workspace=False)
        return peak, tb.seconds
    peak = joint_peak_lower_bound(traces, workspace=False).nbytes
    tb = joint_time_lower_bound(traces, device, budget, workspace=False)
    return peak, tb.seconds


def _spec(
    data: CpsatData, opts: CpsatOptions, budget: int, peak_lb: int, time_lb_s: float
) -> ModelSpec:
    """The exact model's spec: the budget, the time cap in peak mode, and the
    analytic bound as a floor of the objective."""
    peak_mode = opts.objective is Objective.PEAK
    time_cap = int(math.floor(opts.max_eor * data.compute_ticks)) if peak_mode else None
    # T is whole ticks: T >= bound  <=>  T >= ceil(bound) (less float noise)
    floor = math.ceil(time_lb_s * TICKS_PER_S - 1e-3) if math.isfinite(time_lb_s) else 0
    return ModelSpec(
        opts.objective,
        budget,
        time_cap,
        peak_floor=peak_lb,
        time_floor=0 if peak_mode else floor,
        waits=opts.swap_waits,
    )


def _nothing_hot(
    traces: tuple[Trace, ...],
    data: CpsatData,
    opts: CpsatOptions,
    budget: int,
    t0: float,
    info: dict[str, Any],
) -> PlanResult:
    """Nothing exceeds the threshold: release-only is optimal, no solve."""
    compute_s = data.compute_ticks / TICKS_PER_S
    obj = float(data.mem0.max()) if opts.objective is Objective.PEAK else compute_s
    stats = {
        **info,
        "search": "none",
        "objective": obj,
        "best_bound": obj,
        "iteration_time_s": compute_s,
        "model_peak_bytes": int(data.mem0.max()),
        "hint": "none",
        "decisions": dict.fromkeys(MODE_NAMES, 0),
    }
    return result(opts, budget, t0, "OPTIMAL", trivial_plans(traces), stats)


def _exact(
    data: CpsatData,
    spec: ModelSpec,
    opts: CpsatOptions,
    hint: Solution | None,
    start: Solution,
    deadline: float,
    info: dict[str, Any],
) -> tuple[str, Solution | None, float | None]:
    """(solver status, best solution, model bound) of the exact model; a
    hard solve first for small models without a hint (NOTE [ Soft budget ])."""
    soft = info["soft_budget"]
    bm = build(data, replace(spec, soft=soft))
    info["model_terms"] = bm.n_terms
    limit = time_left(deadline) * (1.0 if soft or hint is not None else HARD_SHARE)
    out = solve(bm, opts, limit, hint or (start if soft else None), "cpsat")
    if out.status == "UNKNOWN" and not soft and hint is None and time_left(deadline) > 1.0:
        # no plan and no proof: the rest of the time goes to the soft budget
        info["soft_budget"] = True
        bm = build(data, replace(spec, soft=True))
        out = solve(bm, opts, time_left(deadline), start, "cpsat soft")
    elif out.status == "FEASIBLE" and not soft and hint is None and time_left(deadline) > 1.0:
        # a plan but no proof yet: the rest of the time, from that plan
        out = resolve(bm, opts, time_left(deadline), out)
    status, sol, model_bound = out.status, out.solution, out.bound
    if out.excess and out.over_budget is not None:  # its peak, over the budget
        info["excess_bytes"] = out.over_budget.peak_bytes - spec.budget
    info["search"] = "exact"
    if sol is None and hint is not None:
        sol, status = hint, "FEASIBLE"
    return status, sol, model_bound

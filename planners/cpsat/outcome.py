"""What a CP-SAT run comes to: its `PlanResult`, with the typed status of
NOTE [ Planner outcomes ] (planners/core/plan.py) and the solver's own
status name kept as a figure in `stats["status"]`:

| solver says            | status     | reason             |
| ---------------------- | ---------- | ------------------ |
| OPTIMAL / FEASIBLE     | PLANNED    | NONE               |
| (budget < peak bound)  | INFEASIBLE | BELOW_BOUND        |
| INFEASIBLE             | STOPPED    | MODEL_INFEASIBLE   |
| UNKNOWN                | STOPPED    | TIME_LIMIT         |

Only the first INFEASIBLE row is said of the problem: the peak lower bound
of `planners/analysis/bounds.py` proves that no plan of any planner fits.
The solver proving its model infeasible is not a proof for every plan: the
model's moves are a subset of them (one swap or one recompute per gap, each
recompute re-running one op, NOTE [ Recompute chains ] in `cpsat/chains.py`),
so the run STOPPED, and `detail` says what was proved. UNKNOWN -- no plan
and no proof when the time ran out -- is STOPPED with TIME_LIMIT, never
INFEASIBLE. `stats["proof"]` says what the run proved: "peak bound", "model"
(infeasible or optimal within the model's moves, or an objective bound from
it), "analytic bound" (the plan meets the analytic time bound) or None.
"""

from __future__ import annotations

import math
import time
from typing import Any

from memplan.planners.core.options import options_dict
from memplan.planners.core.plan import Plan, PlanResult, Reason, Status, empty_plan
from memplan.planners.cpsat.data import TICKS_PER_S, CpsatData, gcd_bytes
from memplan.planners.cpsat.options import CpsatOptions
from memplan.planners.cpsat.readout import plans_from_solution
from memplan.planners.cpsat.spec import MODE_NAMES, ModelSpec, Objective, Solution
from memplan.planners.heuristics.vanilla import release_only_plan
from memplan.traces.model import Trace

PLANNED = ("OPTIMAL", "FEASIBLE")


def result(
    opts: CpsatOptions,
    budget: int,
    t0: float,
    status: str,
    plans: tuple[Plan, ...] | None,
    stats: dict[str, Any],
    *,
    below_bound: int | None = None,
) -> PlanResult:
    """The `PlanResult` of a finished run whose solver status is `status`;
    `below_bound`: the peak lower bound the budget is below (a proof, no
    solve). `stats` gets the common figures."""
    planned = status in PLANNED and bool(plans) and below_bound is None
    stats = {"status": status, **stats}
    obj, bound = stats.get("objective"), stats.get("best_bound")
    if obj is not None and bound is not None and bound > 0 and math.isfinite(obj):
        stats["relative_gap"] = (obj - bound) / bound
    else:
        stats.setdefault("relative_gap", None)
    kind, reason, detail = _status(opts, budget, status, planned, below_bound, stats)
    return PlanResult(
        planner="cpsat",
        status=kind,
        plans=plans if planned and plans else (),
        reason=reason,
        detail=detail,
        solve_time_s=time.perf_counter() - t0,
        options={"budget_bytes": budget, **options_dict(opts)},
        stats=stats,
    )


def _status(
    opts: CpsatOptions,
    budget: int,
    status: str,
    planned: bool,
    below_bound: int | None,
    stats: dict[str, Any],
) -> tuple[Status, Reason, str]:
    """The table of the module docstring, with the numbers in `detail`."""
    if below_bound is not None:
        stats["proof"] = "peak bound"
        why = (
            f"budget {budget} B is below the peak lower bound {below_bound} B: "
            f"no plan of any planner fits"
        )
        return Status.INFEASIBLE, Reason.BELOW_BOUND, why
    if planned:
        return Status.PLANNED, Reason.NONE, ""
    if status == "INFEASIBLE":
        stats["proof"] = "model"
        within = f"{budget} B"
        if opts.objective is Objective.PEAK:
            within += f" within {opts.max_eor:g} x the compute time"
        why = (
            f"CP-SAT proved that no plan of its model fits {within}; plans beyond its moves "
            f"(a buffer recomputed twice, chain temporaries) may"
        )
        return Status.STOPPED, Reason.MODEL_INFEASIBLE, why
    stats["proof"] = None
    why = f"no plan within the time limit of {opts.time_limit_s:g} s, nothing proved"
    if stats.get("excess_bytes"):
        why += f" (the best solution peaked {stats['excess_bytes']} B over the budget)"
    return Status.STOPPED, Reason.TIME_LIMIT, why


def trivial_plans(traces: tuple[Trace, ...]) -> tuple[Plan, ...]:
    """Release after the last access: optimal when no op exceeds the budget."""
    return tuple(release_only_plan(t) if t.n_ops else empty_plan(t) for t in traces)


def finish(
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
    """The result of a search that ended with `sol` (or none) and the model's
    best bound (model units; None when it proves nothing): the objective, the
    best bound valid for the model's plans, and OPTIMAL when they meet."""
    peak_mode = spec.objective is Objective.PEAK
    unit = gcd_bytes(data, peak=True) if peak_mode else 1
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
        stats = {**info, "objective": None, "best_bound": bound if status != "INFEASIBLE" else None}
        return result(opts, budget, t0, status, None, stats)
    obj = float(sol.peak_bytes) if peak_mode else sol.iteration_ticks / TICKS_PER_S
    # proven optimal when the objective meets a bound valid for the model's plans
    tol = 1.0 if peak_mode else 1.0 / TICKS_PER_S
    if (
        status == "FEASIBLE"
        and obj <= bound + tol
        and (info.get("search") == "exact" or (not peak_mode and obj <= time_lb_s + tol))
    ):
        status = "OPTIMAL"
    analytic = float(spec.peak_floor) if peak_mode else time_lb_s
    if status == "OPTIMAL":  # for every plan if it meets the analytic bound
        info["proof"] = "analytic bound" if obj <= analytic + tol else "model"
        bound = obj
    else:  # a bound on the model's plans, if the solver's beats the analytic one
        info["proof"] = "model" if (model_b or 0.0) > analytic else None
    counts = dict.fromkeys(MODE_NAMES, 0)
    for mode in sol.mode:
        counts[MODE_NAMES[mode]] += 1
    stats = {
        **info,
        "objective": obj,
        "best_bound": bound,
        "iteration_time_s": sol.iteration_ticks / TICKS_PER_S,
        "model_peak_bytes": sol.peak_bytes,
        "decisions": counts,
        "d2h_copies": sum(sol.copy),
    }
    return result(opts, budget, t0, status, plans_from_solution(data, sol), stats)

"""The exact baseline: a CP-SAT planner for one job, or several in step.

For every gap of every buffer (a stretch of ops that do not touch it) the
model chooses keep / swap (out then in, both timed on the lane) / release and
recompute, with the op order fixed, durations from the latency model and a
memory budget; it minimises the iteration time (or the peak under a time
cap). See NOTE [ CP-SAT semantics ] in `planners/cpsat/model.py` for exactly
what the model assumes, and `planners/cpsat/lns.py` for how a run goes: the
hint planner's choices completed by the model, the soft budget when there is
no hint, and windows around the memory peaks for large traces.

Several jobs share the compute, the lane(s) and the budget; the model keeps
them in step, one iteration of each per period (NOTE [ Several jobs ] in
`planners/cpsat/data.py`), and its objective is that period: every job's
steady iteration time.

The result is an ordinary `PlanResult` (one plan per job) whose `stats` carry
the solver status (OPTIMAL / FEASIBLE / INFEASIBLE / UNKNOWN), the objective,
the best bound and the relative gap.
"""

from __future__ import annotations

import dataclasses
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from memplan.hwmodels.latency import LatencyModel
from memplan.hwmodels.profile import Hardware
from memplan.planners.analysis import as_traces
from memplan.planners.analysis.bounds import (
    joint_peak_lower_bound,
    joint_time_lower_bound,
    peak_lower_bound,
    time_lower_bound,
)
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Plan, PlanResult, empty_plan
from memplan.planners.cpsat.data import TICKS_PER_S, CpsatData, build_data, check_budget_type
from memplan.planners.cpsat.model import ModelSpec, Objective, build
from memplan.planners.cpsat.readout import modes_from_plans
from memplan.planners.cpsat.solution import Solution, add_hint, keep_all, read_solution
from memplan.planners.heuristics.vanilla import release_only_plan
from memplan.traces.errors import MemplanError
from memplan.traces.model import Trace
from ortools.sat.python import cp_model

STATUSES = ("OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN")
LIGHT_PRESOLVE_TERMS = 5_000


@dataclass(frozen=True, slots=True)
class CpsatOptions:
    """- `objective`: "time" (iteration time under the budget) or "peak" (peak
      bytes with the iteration at most `max_eor` times the compute time).
    - `time_limit_s`, `num_workers`, `seed`: the solver's (deterministic for
      `num_workers=1`).
    - `hint`: a registered planner whose plan warm-starts the search, or None.
    - `lanes`: 1 (one lane shared by both directions) or 2.
    - `margin_ns`: how long before an allocation a copy's free must happen.
    - `max_exact_terms`: above this many (gap, hot op) pairs the model is
      solved coarsened and refined in windows (`lns_*`, see cpsat/lns.py).
    - `progress`: a progress line on stderr (None: when it is a terminal)."""

    objective: Objective = Objective.TIME
    time_limit_s: float = 60.0
    num_workers: int = 2
    seed: int = 0
    max_eor: float = 1.2
    hint: str | None = "tensile"
    lanes: int = 1
    margin_ns: int = 1
    max_exact_terms: int = 40_000
    lns_coarse_segments: int = 12_000
    lns_window_hot_ops: int = 48
    lns_max_free_gaps: int = 160
    lns_window_time_s: float = 4.0
    progress: bool | None = None
    log_search: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.objective, str):
            try:
                object.__setattr__(self, "objective", Objective(self.objective))
            except ValueError:
                raise PlanError(
                    f"cpsat: objective={self.objective!r} must be 'time' or 'peak'"
                ) from None
        positive = {
            "time_limit_s": self.time_limit_s,
            "max_eor": self.max_eor,
            "lns_window_time_s": self.lns_window_time_s,
        }
        for name, v in positive.items():
            if not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                raise PlanError(f"cpsat: {name}={v!r} must be a number > 0")
        counts = {
            "num_workers": self.num_workers,
            "max_exact_terms": self.max_exact_terms,
            "lns_coarse_segments": self.lns_coarse_segments,
            "lns_window_hot_ops": self.lns_window_hot_ops,
            "lns_max_free_gaps": self.lns_max_free_gaps,
        }
        for name, v in counts.items():
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise PlanError(f"cpsat: {name}={v!r} must be an integer >= 1")
        if self.lanes not in (1, 2):
            raise PlanError(f"cpsat: lanes={self.lanes!r} must be 1 or 2")
        if (
            isinstance(self.margin_ns, bool)
            or not isinstance(self.margin_ns, int)
            or self.margin_ns < 1
        ):
            raise PlanError(f"cpsat: margin_ns={self.margin_ns!r} must be an integer >= 1")

    def to_json(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["objective"] = self.objective.value
        return d


def options_from(kwargs: dict[str, Any]) -> CpsatOptions:
    """`CpsatOptions` from keyword arguments; a one-line PlanError names an unknown one."""
    known = {f.name for f in dataclasses.fields(CpsatOptions)}
    for key in kwargs:
        if key not in known:
            raise PlanError(f"cpsat: unknown option {key!r} (known: {', '.join(sorted(known))})")
    return CpsatOptions(**kwargs)


# ---- solving one model -------------------------------------------------------------------
class Progress(cp_model.CpSolverSolutionCallback):
    """Solution logging: one updating stderr line per improving solution."""

    def __init__(self, label: str, unit: str, scale: float, enabled: bool, bm: Any = None):
        super().__init__()
        self.label, self.unit, self.scale, self.enabled = label, unit, scale, enabled
        self.solutions = 0
        self.bm = bm  # with a soft budget: show the excess until it is gone

    def on_solution_callback(self) -> None:
        self.solutions += 1
        if not self.enabled:
            return
        bm = self.bm
        if bm is not None and bm.excess is not None and self.value(bm.excess) > 0:
            over = self.value(bm.excess) * bm.excess_step * bm.objective_unit / 2**20
            text = f"{over:.6g} MiB over the budget"
        else:
            w = bm.excess_weight if bm is not None and bm.excess is not None else 0
            obj = self.objective_value * self.scale
            bound = self.best_objective_bound
            b = "-" if w and bound >= w else f"{bound * self.scale:.6g}"
            text = f"{obj:.6g} {self.unit}  bound {b}"
        sys.stderr.write(
            f"\r{self.label}: solution {self.solutions}  {text}  {self.wall_time:.1f}s   "
        )
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled and self.solutions:
            sys.stderr.write("\n")
            sys.stderr.flush()


@dataclass(frozen=True, slots=True)
class SolveOutcome:
    """`objective` and `bound` in model units (ticks, or units of bytes in
    peak mode) of the plan's own objective; with a soft budget `excess` is
    the memory excess of the solution (units) and a solution with excess > 0
    is not a plan (`solution` is None then)."""

    status: str
    solution: Solution | None
    objective: float
    bound: float
    wall_s: float
    excess: int | None = None
    proven_excess: bool = False  # a soft solve proved that every solution exceeds the budget
    over_budget: Solution | None = None  # a soft solve's best solution while excess > 0


def solve(
    bm: Any, options: CpsatOptions, time_limit_s: float, hint: Solution | None, label: str
) -> SolveOutcome:
    """Parameters, solve, status check, read-out of one built model."""
    # ---- parameters
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.max_time_in_seconds = max(time_limit_s, 0.05)
    p.num_workers = options.num_workers
    p.random_seed = options.seed
    p.log_search_progress = options.log_search
    if bm.n_terms > LIGHT_PRESOLVE_TERMS:  # presolve probing alone can eat a minute here
        p.cp_model_probing_level = 0
    if hint is not None:
        add_hint(bm, hint)
    # ---- solve
    peak = bm.spec.objective is Objective.PEAK
    enabled = sys.stderr.isatty() if options.progress is None else options.progress
    scale = bm.objective_unit / 2**20 if peak else 1e3 / TICKS_PER_S
    cb = Progress(label, "MiB" if peak else "ms", scale, enabled, bm)
    status = solver.solve(bm.model, cb)
    cb.close()
    # ---- status check
    name = solver.status_name(status)
    if status == cp_model.MODEL_INVALID:  # a bug in the model builder, never the user's input
        raise RuntimeError(f"cpsat: the model is invalid: {bm.model.validate()}")
    if name not in STATUSES:
        raise RuntimeError(f"cpsat: unexpected solver status {name}")
    # ---- read-out
    sol = read_solution(bm, solver) if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
    obj = solver.objective_value if sol is not None else math.nan
    bound = solver.best_objective_bound
    if bm.excess is None:
        return SolveOutcome(name, sol, obj, bound, solver.wall_time)
    w = bm.excess_weight
    excess = int(solver.value(bm.excess)) if sol is not None else None
    proven = bound >= w or name == "INFEASIBLE"
    if excess:  # not a plan: report it as no solution
        return SolveOutcome(
            "UNKNOWN" if not proven else "INFEASIBLE",
            None,
            math.nan,
            math.nan,
            solver.wall_time,
            excess,
            proven,
            sol,
        )
    status_name = name if not proven else "INFEASIBLE"
    main_bound = bound if bound < w else math.nan
    return SolveOutcome(status_name, sol, obj, main_bound, solver.wall_time, excess, proven)


def fix_modes(bm: Any, modes: Sequence[int]) -> None:
    """Constrain every free gap of `bm` to `modes` (to complete a hint)."""
    for g in bm.data.gaps:
        if not bm.is_free(g.id):
            continue
        bm.model.add(bm.swap[g.id] == int(modes[g.id] == 1))
        if g.id in bm.rec:
            bm.model.add(bm.rec[g.id] == int(modes[g.id] == 2))


# ---- the planner --------------------------------------------------------------------------
def cpsat(
    traces: Sequence[Trace],
    hw: Hardware,
    latency: LatencyModel,
    *,
    budget_bytes: int | None = None,
    **options: Any,
) -> PlanResult:
    """Plan the jobs with CP-SAT under `budget_bytes` shared by all of them
    (default: the device's memory). Options: `CpsatOptions` fields. Several
    jobs are planned in step (NOTE [ Several jobs ] in cpsat/data.py): they
    must have the same number of ops, else a PlanError says so."""
    t0 = time.perf_counter()
    opts = options_from(options)
    jobs = as_traces(traces)
    budget = check_budget_type(hw.memory_bytes if budget_bytes is None else budget_bytes)
    if len({t.n_ops for t in jobs}) > 1:
        raise PlanError(
            f"cpsat: plans several jobs in step only when they have the same number of ops "
            f"(got {[t.n_ops for t in jobs]})"
        )
    from memplan.planners.cpsat.lns import run

    return run(jobs, hw, latency, budget, opts, t0)


def result(
    opts: CpsatOptions,
    budget: int,
    t0: float,
    status: str,
    plans: tuple[Plan, ...] | None,
    stats: dict[str, Any],
) -> PlanResult:
    """The `PlanResult` of a finished run; `stats` gets the common fields."""
    feasible = status in ("OPTIMAL", "FEASIBLE") and bool(plans)
    stats = {"status": status, **stats}
    obj, bound = stats.get("objective"), stats.get("best_bound")
    if obj is not None and bound is not None and bound > 0 and math.isfinite(obj):
        stats["relative_gap"] = (obj - bound) / bound
    else:
        stats.setdefault("relative_gap", None)
    return PlanResult(
        planner="cpsat",
        feasible=feasible,
        plans=plans if feasible and plans else (),
        solve_time_s=time.perf_counter() - t0,
        options={"budget_bytes": budget, **opts.to_json()},
        stats=stats,
    )


def hint_solution(
    data: CpsatData,
    traces: tuple[Trace, ...],
    hw: Hardware,
    latency: LatencyModel,
    budget: int,
    opts: CpsatOptions,
    spec: ModelSpec,
    time_limit_s: float,
) -> tuple[Solution | None, Solution | None, str]:
    """The hint planner's gap decisions with the model's best timing for them:
    (a plan of the model, or None; else the same decisions as a start over
    the budget for a soft solve, or None; a description)."""
    if opts.hint is None:
        return None, None, "none"
    from memplan.planners import registry  # the registry imports planners lazily, this one too

    if opts.hint == "cpsat":
        raise PlanError("cpsat: hint='cpsat' would call itself; name another planner")
    planner = registry.get(opts.hint)  # an unknown name is the caller's error
    try:
        res = planner(list(traces), hw, latency, budget_bytes=budget)
    except MemplanError as e:  # the hint is a convenience: plan without it
        return None, None, f"none ({opts.hint} failed: {e})"
    if len(res.plans) != len(traces):
        return None, None, f"none ({opts.hint} found no plan)"
    modes = modes_from_plans(data, res.plans)
    # only the hint's swapped and recomputed gaps are free (their modes then
    # fixed), with one segment per hot op: a hint's holes need not fill blocks
    moved = frozenset(g.id for g in data.gaps if modes[g.id] != 0)
    repair = replace(spec, soft=True, block=1, free=moved, incumbent=keep_all(data))
    bm = build(data, repair)
    fix_modes(bm, modes)
    out = solve(bm, opts, time_limit_s, keep_all(data), f"cpsat hint ({opts.hint})")
    if out.solution is not None:
        return out.solution, None, opts.hint
    why = "over the budget in the model" if out.over_budget is not None else out.status
    return None, out.over_budget, f"none ({opts.hint}'s choices: {why})"


def trivial_plans(traces: tuple[Trace, ...]) -> tuple[Plan, ...]:
    """Release after the last access: optimal when no op exceeds the budget."""
    return tuple(release_only_plan(t) if t.n_ops else empty_plan(t) for t in traces)


def analytic_bounds(
    traces: tuple[Trace, ...],
    hw: Hardware,
    latency: LatencyModel,
    budget: int,
    opts: CpsatOptions,
) -> tuple[int, float]:
    """(peak bound bytes, time bound seconds) in the simulator's accounting
    (no workspace: the simulator does not allocate it); for several jobs the
    bounds of NOTE [ Jobs in step ] in planners/analysis/bounds.py."""
    if len(traces) == 1:
        peak = peak_lower_bound(traces[0], workspace=False).nbytes
        tb = time_lower_bound(traces[0], hw, latency, budget, lanes=opts.lanes, workspace=False)
        return peak, tb.seconds
    peak = joint_peak_lower_bound(traces, workspace=False).nbytes
    tb = joint_time_lower_bound(traces, hw, latency, budget, lanes=opts.lanes, workspace=False)
    return peak, tb.seconds


def data_for(
    traces: tuple[Trace, ...],
    hw: Hardware,
    latency: LatencyModel,
    threshold: int,
    opts: CpsatOptions,
) -> CpsatData:
    return build_data(traces, hw, latency, threshold, lanes=opts.lanes, margin=opts.margin_ns)

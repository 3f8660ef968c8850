"""Solving one built CP-SAT model, in the sections of the OR-Tools examples:
parameters, solve, status check, read-out. OPTIMAL, FEASIBLE, INFEASIBLE and
UNKNOWN are four outcomes; with a soft budget (NOTE [ Soft budget ] in
`cpsat/search.py`) a solution still over the budget is no plan.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

from memplan.planners.cpsat.data import TICKS_PER_S
from memplan.planners.cpsat.options import CpsatOptions
from memplan.planners.cpsat.solution import add_hint, read_solution
from memplan.planners.cpsat.spec import RECOMPUTE, SWAP, BuiltModel, Objective, Solution
from ortools.sat.python import cp_model

STATUSES = ("OPTIMAL", "FEASIBLE", "INFEASIBLE", "UNKNOWN")
LIGHT_PRESOLVE_TERMS = 5_000


class Progress(cp_model.CpSolverSolutionCallback):
    """Solution logging: one updating stderr line per improving solution."""

    def __init__(
        self, label: str, unit: str, scale: float, enabled: bool, bm: BuiltModel | None = None
    ):
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
    bm: BuiltModel,
    options: CpsatOptions,
    time_limit_s: float,
    hint: Solution | None,
    label: str,
) -> SolveOutcome:
    """Parameters, solve, status check, read-out of one built model."""
    solver = _parameters(bm, options, time_limit_s)
    if hint is not None:
        add_hint(bm, hint)
    status = _solve(solver, bm, options, label)
    name = _check_status(solver, status, bm)
    return _read_out(solver, status, name, bm)


# ---- parameters ---------------------------------------------------------------------------
def _parameters(bm: BuiltModel, options: CpsatOptions, time_limit_s: float) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    p = solver.parameters
    p.max_time_in_seconds = max(time_limit_s, 0.05)
    p.num_workers = options.num_workers
    p.random_seed = options.seed
    p.log_search_progress = options.log_search
    if bm.n_terms > LIGHT_PRESOLVE_TERMS:  # presolve probing alone can eat a minute here
        p.cp_model_probing_level = 0
    return solver


# ---- solve --------------------------------------------------------------------------------
def _solve(solver: cp_model.CpSolver, bm: BuiltModel, options: CpsatOptions, label: str) -> int:
    peak = bm.spec.objective is Objective.PEAK
    enabled = sys.stderr.isatty() if options.progress is None else options.progress
    scale = bm.objective_unit / 2**20 if peak else 1e3 / TICKS_PER_S
    cb = Progress(label, "MiB" if peak else "ms", scale, enabled, bm)
    status = solver.solve(bm.model, cb)
    cb.close()
    return status


# ---- status check -------------------------------------------------------------------------
def _check_status(solver: cp_model.CpSolver, status: int, bm: BuiltModel) -> str:
    """The status name; RuntimeError for what is never the user's input."""
    name = solver.status_name(status)
    if status == cp_model.MODEL_INVALID:  # a bug in the model builder
        raise RuntimeError(f"cpsat: the model is invalid: {bm.model.validate()}")
    if name not in STATUSES:
        raise RuntimeError(f"cpsat: unexpected solver status {name}")
    return name


# ---- read-out -----------------------------------------------------------------------------
# NOTE [ Soft statuses ]
# With a soft budget the solver's status is about the soft model, where
# every keep-all solution is feasible; what it says of the plan is read off
# the excess and the bound (objective = w * excess + T, w = H + 1 > T):
#   solver says               excess of its solution   bound      reported
#   OPTIMAL / FEASIBLE        0                        any        as the solver said
#   OPTIMAL / FEASIBLE        > 0                      < w        UNKNOWN (no plan, no proof)
#   any                       > 0 or none              >= w       INFEASIBLE (every solution
#                                                                 of the model has excess)
#   UNKNOWN                   none                     < w        UNKNOWN
#   INFEASIBLE                none                     -          INFEASIBLE (the model's own proof)
# So INFEASIBLE is reported only with a proof; UNKNOWN -- the time ran out
# with neither a plan nor a proof -- stays UNKNOWN.
def _read_out(solver: cp_model.CpSolver, status: int, name: str, bm: BuiltModel) -> SolveOutcome:
    sol = read_solution(bm, solver) if status in (cp_model.OPTIMAL, cp_model.FEASIBLE) else None
    obj = solver.objective_value if sol is not None else math.nan
    bound = solver.best_objective_bound
    if bm.excess is None:
        return SolveOutcome(name, sol, obj, bound, solver.wall_time)
    w = bm.excess_weight
    excess = int(solver.value(bm.excess)) if sol is not None else None
    proven = bound >= w or name == "INFEASIBLE"  # NOTE [ Soft statuses ]
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


def time_left(deadline: float) -> float:
    """Seconds to `deadline` (a `time.perf_counter()`), at least 0.05."""
    return max(deadline - time.perf_counter(), 0.05)


# ---- follow-ups ---------------------------------------------------------------------------
def resolve(
    bm: BuiltModel, opts: CpsatOptions, time_limit_s: float, first: SolveOutcome
) -> SolveOutcome:
    """Solve `bm` again from `first`'s solution; the better plan and bound of both."""
    again = solve(bm, opts, time_limit_s, first.solution, "cpsat")
    if again.solution is None or again.objective > first.objective:
        return replace(first, bound=max(first.bound, again.bound))
    return replace(again, bound=max(first.bound, again.bound))


def fix_modes(bm: BuiltModel, modes: Sequence[int], rec_at: Sequence[int]) -> None:
    """Constrain every free gap of `bm` to `modes` and its recomputations to
    the points `rec_at` (to complete a hint)."""
    for g in bm.data.gaps:
        if not bm.is_free(g.id):
            continue
        bm.model.add(bm.swap[g.id] == int(modes[g.id] == SWAP))
        if g.id in bm.rec:
            bm.model.add(bm.rec[g.id] == int(modes[g.id] == RECOMPUTE))
            for x, pt in zip(bm.rec_at[g.id], g.rec_points, strict=True):
                bm.model.add(x == int(modes[g.id] == RECOMPUTE and rec_at[g.id] == pt.op))

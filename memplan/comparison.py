"""Planners side by side: plan, check, simulate, and score against vanilla.

The app shell owns this loop because it is the one place allowed to import
both `planners` and `sim`: each planner plans the jobs, `check` verifies
every plan, the simulator runs the plans and the vanilla baseline on the
same hardware, and TENSILE's metrics (MSR, EOR, CBR) compare the two.

See NOTE [ Budgets in a comparison ] above `compare_planners`.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memplan.hwmodels.device import DeviceModel
from memplan.planners import registry
from memplan.planners.analysis.bounds import gap_to_bound, joint_bounds
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import PlanResult
from memplan.planners.heuristics.vanilla import vanilla_plan
from memplan.sim import Job, SimResult, savings, simulate
from memplan.traces.errors import MemplanError
from memplan.traces.model import Trace

UNLIMITED_BYTES = 1 << 62
NEEDS_BUDGET = ("capuchin",)


@dataclass(frozen=True, slots=True)
class Row:
    """One planner's outcome. Times in seconds, sizes in bytes; metrics are
    NaN when the planned run did not finish."""

    planner: str
    feasible: bool
    reason: str
    budget_bytes: int | None
    peak_bytes: int | None
    msr: float
    eor: float
    cbr: float
    iteration_time_s: float
    stall_s: float
    recompute_s: float
    bytes_h2d: int
    bytes_d2h: int
    plan_time_s: float
    events: dict[str, int] = field(default_factory=dict)
    gap: float = math.nan
    result: PlanResult | None = None
    sim: SimResult | None = None

    def to_dict(self) -> dict[str, Any]:
        def num(x: float) -> float | None:
            return None if x is None or math.isnan(x) else x

        return {
            "planner": self.planner,
            "feasible": self.feasible,
            "reason": self.reason,
            "budget_bytes": self.budget_bytes,
            "peak_bytes": self.peak_bytes,
            "msr": num(self.msr),
            "eor": num(self.eor),
            "cbr": num(self.cbr),
            "iteration_time_s": num(self.iteration_time_s),
            "stall_s": self.stall_s,
            "recompute_s": self.recompute_s,
            "bytes_h2d": self.bytes_h2d,
            "bytes_d2h": self.bytes_d2h,
            "plan_time_s": self.plan_time_s,
            "events": self.events,
            "gap": num(self.gap),
        }


@dataclass(frozen=True, eq=False)
class Comparison:
    vanilla: SimResult
    rows: tuple[Row, ...]

    def to_dict(self) -> dict[str, Any]:
        v = self.vanilla
        return {
            "hardware": v.hardware,
            "lanes": list(v.lanes),
            "jobs": [j.name for j in v.jobs],
            "vanilla": {
                "peak_bytes": v.peak_bytes,
                "iteration_time_s": _mean_iteration(v),
                "makespan_s": v.makespan_s,
            },
            "rows": [r.to_dict() for r in self.rows],
        }


def _mean_iteration(result: SimResult) -> float:
    times = [j.iteration_time_s for j in result.jobs]
    return math.nan if any(math.isnan(t) for t in times) else sum(times) / len(times)


def _jobs(traces: Sequence[Trace], plans: Sequence[Any]) -> list[Job]:
    return [
        Job(t, p, name=f"{t.meta.model or 'job'}#{i}")
        for i, (t, p) in enumerate(zip(traces, plans, strict=True))
    ]


def run_planner(
    name: str,
    traces: Sequence[Trace],
    device: DeviceModel,
    vanilla: SimResult,
    *,
    budget: int | None,
    iterations: int = 3,
    options: object = None,
) -> Row:
    """Plan with `name`, check, simulate under the budget, score against `vanilla`."""
    sim_budget = budget if budget is not None else device.hw.memory_bytes
    t0 = time.perf_counter()
    try:
        result = registry.run(name, traces, device, budget_bytes=budget, options=options)
    except MemplanError as e:
        return _failed(name, budget, f"planner error: {e}", time.perf_counter() - t0)
    plan_time = time.perf_counter() - t0
    events: dict[str, int] = {}
    for p in result.plans:
        for k, n in p.counts().items():
            events[k] = events.get(k, 0) + n
    if not result.plans:
        return _failed(name, budget, result.explain(), plan_time, result)
    try:
        for p, t in zip(result.plans, traces, strict=True):
            check(p, t)
    except MemplanError as e:
        return _failed(name, budget, f"check: {e}", plan_time, result)
    sim = simulate(
        _jobs(traces, result.plans),
        device,
        iterations=iterations,
        budget=sim_budget,
        oom="fail",
        check=False,
    )
    metrics = savings(vanilla, sim).total
    reasons = []
    if not result.feasible:
        reasons.append(result.explain())
    if sim.oom:
        reasons.append(f"out of memory in simulation (budget {sim_budget} bytes)")
    return Row(
        planner=name,
        feasible=result.feasible and not sim.oom,
        reason="; ".join(reasons),
        budget_bytes=budget,
        peak_bytes=sim.peak_bytes,
        msr=metrics.msr,
        eor=metrics.eor,
        cbr=metrics.cbr,
        iteration_time_s=_mean_iteration(sim),
        stall_s=sum(j.stall_s for j in sim.jobs),
        recompute_s=sum(j.recompute_s for j in sim.jobs),
        bytes_h2d=sum(j.bytes_h2d for j in sim.jobs),
        bytes_d2h=sum(j.bytes_d2h for j in sim.jobs),
        plan_time_s=plan_time,
        events=events,
        result=result,
        sim=sim,
    )


def _failed(
    name: str, budget: int | None, reason: str, plan_time: float, result: PlanResult | None = None
) -> Row:
    nan = math.nan
    return Row(
        name,
        False,
        reason,
        budget,
        None,
        nan,
        nan,
        nan,
        nan,
        0.0,
        0.0,
        0,
        0,
        plan_time,
        result=result,
    )


# NOTE [ Budgets in a comparison ]
# - The vanilla reference runs without a budget: its peak (VMP) is what the
#   jobs need when nothing is planned, even where that exceeds the card.
# - A planner is feasible when it says so, its plans pass `check`, and the
#   simulated run finishes without OOM under the budget (the `--budget`, or the
#   GPU's memory when none is given).
# - Capuchin saves only what a budget asks for, so without `--budget` it gets
#   the peak TENSILE reached in the same comparison (as the TENSILE paper did).
# - A planner that raises a `MemplanError` instead of returning infeasible is
#   reported as infeasible with the message: one planner never stops a sweep.
def compare_planners(
    traces: Sequence[Trace],
    device: DeviceModel,
    planners: Sequence[str],
    *,
    budget: int | None = None,
    iterations: int = 3,
    options: dict[str, Sequence[str]] | None = None,
    progress: Callable[[str], None] | None = None,
) -> Comparison:
    """Every planner in `planners` on the same jobs; see NOTE [ Budgets in a comparison ]."""
    if not traces:
        raise MemplanError("compare: no traces given")
    options = options or {}
    for name in planners:  # unknown names and bad options fail before any work
        registry.make_options(name, options.get(name))
    for name in options:
        if name not in planners and not (name == "tensile" and set(NEEDS_BUDGET) & set(planners)):
            raise MemplanError(f"--option {name}.*: planner {name!r} is not being compared")
    vanilla = simulate(
        _jobs(traces, [vanilla_plan(t) for t in traces]),
        device,
        iterations=iterations,
        budget=UNLIMITED_BYTES,
        check=False,
    )
    rows: dict[str, Row] = {}
    order = sorted(planners, key=lambda n: n in NEEDS_BUDGET)  # tensile before capuchin
    for name in order:
        own_budget = budget
        if own_budget is None and name in NEEDS_BUDGET:
            tensile = rows.get("tensile")
            if tensile is None:
                if progress:
                    progress(f"{name}: planning tensile for its default budget")
                tensile = run_planner(
                    "tensile",
                    traces,
                    device,
                    vanilla,
                    budget=None,
                    iterations=iterations,
                    options=options.get("tensile"),
                )
            own_budget = tensile.peak_bytes
        if progress:
            progress(f"planning {name}")
        rows[name] = run_planner(
            name,
            traces,
            device,
            vanilla,
            budget=own_budget,
            iterations=iterations,
            options=options.get(name),
        )
    ordered = [rows[n] for n in planners]
    ordered = [_with_gap(r, traces, device) for r in ordered]
    return Comparison(vanilla, tuple(ordered))


# NOTE [ Gap to the bound ]
# gap = (simulated iteration time - bound) / bound, with the analytic lower
# bound at the same budget (`planners.analysis.bounds`). For one job it holds
# for every plan. For several jobs it is the bound on the period of jobs in
# step (NOTE [ Jobs in step ] in planners/analysis/bounds.py), the mean
# iteration time of a run that keeps them in step; none when their op counts
# differ.
def _with_gap(row: Row, traces: Sequence[Trace], device: DeviceModel) -> Row:
    """`row` with its gap to the lower bound (NOTE [ Gap to the bound ])."""
    if not row.feasible:
        return row
    budget = row.budget_bytes if row.budget_bytes is not None else device.hw.memory_bytes
    try:
        b = joint_bounds(traces, device, budget_bytes=budget)
    except PlanError:  # jobs that cannot be in step: no bound to compare with
        return row
    return dataclasses.replace(row, gap=gap_to_bound(row.iteration_time_s, b.best_time_s))

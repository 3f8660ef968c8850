"""Planners side by side: plan, check, simulate, and score against vanilla.

The app shell owns this loop because it is the one place allowed to import
both `planners` and `sim`: each planner plans the jobs, `check` verifies
every plan, the simulator runs the plans and the vanilla baseline on the
same hardware, and TENSILE's metrics (MSR, EOR, CBR) compare the two.

See NOTE [ Budgets in a comparison ] above `compare_planners` and NOTE [ The
safety net ] above `run_planner`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memplan.evaluator import sim_evaluator
from memplan.hwmodels.device import DeviceModel
from memplan.planners import registry
from memplan.planners.analysis.bounds import gap_to_bound, joint_bounds
from memplan.planners.analysis.window_bound import best_time_bound
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import PlanResult
from memplan.planners.heuristics.vanilla import vanilla_plan
from memplan.plannerview import net_for, planner_view, rebound_result
from memplan.runconfig import DEFAULT_RUN, Fallback, RunConfig
from memplan.scenario import JobMix, jobs_for
from memplan.sim import Job, SimResult, savings, simulate
from memplan.traces.errors import MemplanError
from memplan.traces.fields import record
from memplan.traces.model import Trace

UNLIMITED_BYTES = 1 << 62
# Rows with no plan at all: the online policy alone (NOTE [ The safety net ]).
WITNESSES = (Fallback.PASSIVE.value, Fallback.DTR.value)


def _budget_from(name: str) -> str | None:
    """The planner whose peak is `name`'s budget when none is given (its
    registry traits); None for the witnesses and planners that need none."""
    return None if name in WITNESSES else registry.traits(name).budget_from


class Fit(enum.StrEnum):
    """How a row's run went (NOTE [ The safety net ])."""

    ALONE = "alone"  # the plan fit the budget on its own
    NET = "net"  # it finished because the safety net evicted
    OOM = "oom"  # it ran out of memory even so
    NO_PLAN = "no plan"  # the planner gave no plan, or its plan failed the check
    BOUND = "bound"  # a capacity probe: the peak lower bound is above the budget, not planned


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
    bound: str | None = None  # the name of the bound `gap` is measured against
    result: PlanResult | None = None
    sim: SimResult | None = None
    fit: Fit = Fit.NO_PLAN
    fallback: Fallback = Fallback.NONE
    evictions: int = 0
    evicted_bytes: int = 0
    remat_s: float = 0.0
    # NOTE [ Device peaks ] in sim/metrics.py; `peak_bytes` is the device peak
    allocated_peak_bytes: int | None = None
    reserved_peak_bytes: int | None = None
    fragmentation_bytes: int | None = None
    pinned_peak_bytes: int | None = None

    @property
    def finished(self) -> bool:
        """The run ended without OOM, on its own or with the net."""
        return self.fit in (Fit.ALONE, Fit.NET)

    def to_dict(self) -> dict[str, Any]:
        """Every field but the plans and the run, NaN as None."""
        return record(self, omit=("result", "sim"))


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
            "allocator": v.allocator.value,
            "context_reserve_bytes": v.context_reserve_bytes,
            "vanilla": {
                "peak_bytes": v.device_peak_bytes,
                "allocated_peak_bytes": v.allocated_peak_bytes,
                "reserved_peak_bytes": v.reserved_peak_bytes,
                "fragmentation_bytes": v.fragmentation_bytes,
                "iteration_time_s": _mean_iteration(v),
                "makespan_s": v.makespan_s,
            },
            "rows": [r.to_dict() for r in self.rows],
        }


def fit_of(sim: SimResult) -> Fit:
    """`Fit` of a finished simulation (NOTE [ The safety net ])."""
    return Fit.OOM if sim.oom else Fit.NET if any(j.net_used for j in sim.jobs) else Fit.ALONE


def vanilla_peak(
    traces: Sequence[Trace],
    device: DeviceModel,
    config: RunConfig = DEFAULT_RUN,
) -> int:
    """Device bytes the jobs peak at with no plan and no budget (simulated
    under `config`'s allocator, contexts included: NOTE [ Context reserve ])."""
    run = simulate(
        planned_jobs(traces, [vanilla_plan(t) for t in traces]),
        device,
        iterations=2,
        budget=UNLIMITED_BYTES,
        check=False,
        **config.memory,
    )
    return run.device_peak_bytes


def _mean_iteration(result: SimResult) -> float:
    times = [j.iteration_time_s for j in result.jobs]
    return math.nan if any(math.isnan(t) for t in times) else sum(times) / len(times)


def planned_jobs(traces: Sequence[Trace], plans: Sequence[Any]) -> list[Job]:
    return [
        Job(t, p, name=f"{t.meta.model or 'job'}#{i}")
        for i, (t, p) in enumerate(zip(traces, plans, strict=True))
    ]


# NOTE [ The safety net ]
# TENSILE's and Capuchin's real systems fall back on passive swapping when a
# plan leaves memory short, and their reported overheads include it. A row
# is simulated under its `Fallback` (none = the simulator's `fail`
# policy, passive = Capuchin's LRU swapping, dtr = DTR's eviction with
# rematerialisation) and says how it went (`Fit`): `alone` when the net never
# acted (the run is then the same as under `fail`), `net` when it finished
# because the net evicted (`evictions`, `evicted_bytes`, `remat_s`; its
# stalls are in `stall_s`), `oom` when it ran out even so. `feasible` means
# fits alone: a plan the simulator runs out of memory on, or rescues with
# the net, is never reported as fitting. The witnesses (`WITNESSES`) are
# rows with no plan at all -- the vanilla job under the online policy alone.
def run_planner(
    name: str,
    traces: Sequence[Trace],
    device: DeviceModel,
    vanilla: SimResult,
    *,
    budget: int | None,
    iterations: int = 3,
    options: object = None,
    config: RunConfig = DEFAULT_RUN,
    view: tuple[list[Trace], int | None] | None = None,
    mix: JobMix | None = None,
) -> Row:
    """Plan with `name`, check, simulate under the budget with `config`'s
    net, score against `vanilla` (NOTE [ The safety net ]). Planners see
    `view`, by default `planner_view` of the jobs (NOTE [ The planners' view
    of the caching allocator ]); the simulator runs the jobs themselves."""
    if name in WITNESSES:
        return run_witness(name, traces, device, vanilla, budget=budget, iterations=iterations,
                           config=config, mix=mix)  # fmt: skip
    t0 = time.perf_counter()
    sim_budget = budget if budget is not None else device.hw.memory_bytes
    evaluator = sim_evaluator(traces, device, sim_budget, config=config)
    try:
        seen, plan_budget = view or planner_view(traces, device, budget, config)
        result = registry.run(
            name, seen, device, budget_bytes=plan_budget, options=options, evaluator=evaluator
        )
        result = rebound_result(result, traces)
    except MemplanError as e:
        return _failed(name, budget, f"planner error: {e}", time.perf_counter() - t0)
    plan_time = time.perf_counter() - t0
    if not result.plans:
        return _failed(name, budget, result.explain(), plan_time, result)
    try:
        for p, t in zip(result.plans, traces, strict=True):
            check(p, t)
    except MemplanError as e:
        return _failed(name, budget, f"check: {e}", plan_time, result)
    net, why = net_for(result.plans, traces, config.fallback)
    reasons = ([] if result.feasible else [result.explain()]) + ([why] if why else [])
    return _simulated(
        name, traces, device, vanilla, result.plans, budget, iterations, reasons,
        config=config.with_fallback(net), plan_time_s=plan_time, result=result, mix=mix,
    )  # fmt: skip


def run_witness(
    policy: str,
    traces: Sequence[Trace],
    device: DeviceModel,
    vanilla: SimResult,
    *,
    budget: int | None,
    iterations: int = 3,
    config: RunConfig = DEFAULT_RUN,
    mix: JobMix | None = None,
) -> Row:
    """The jobs with no plan under the online `policy` alone (a witness row:
    `config`'s memory model, `policy` its net)."""
    plans = [vanilla_plan(t) for t in traces]
    reasons = [f"no plan: the {policy} policy alone"]
    return _simulated(policy, traces, device, vanilla, plans, budget, iterations, reasons,
                      config=config.with_fallback(policy), mix=mix)  # fmt: skip


def _simulated(
    name: str,
    traces: Sequence[Trace],
    device: DeviceModel,
    vanilla: SimResult,
    plans: Sequence[Any],
    budget: int | None,
    iterations: int,
    reasons: list[str],
    *,
    config: RunConfig,
    plan_time_s: float = 0.0,
    result: PlanResult | None = None,
    mix: JobMix | None = None,
) -> Row:
    """Simulate `plans` (`result`'s, when given) under `config` and score
    them (NOTE [ The safety net ])."""
    fallback = config.fallback
    sim_budget = budget if budget is not None else device.hw.memory_bytes
    sim = simulate(
        jobs_for(mix, traces, plans),  # arrivals, departures: memplan/scenario.py
        device,
        iterations=iterations,
        budget=sim_budget,
        oom=fallback.policy,
        check=False,
        **config.memory,
        **(mix.options() if mix is not None else {}),
    )
    metrics = savings(vanilla, sim).total
    jobs = sim.jobs
    evictions = sum(j.evictions for j in jobs)
    fit = fit_of(sim)
    if fit == Fit.OOM:
        net = "" if fallback == Fallback.NONE else f" with the {fallback} net"
        reasons.append(f"out of memory in simulation{net} (budget {sim_budget} bytes)")
    elif fit == Fit.NET:
        reasons.append(f"fits with the {fallback} net: {evictions} evictions")
    return Row(
        planner=name,
        feasible=fit == Fit.ALONE,
        reason="; ".join(reasons),
        budget_bytes=budget,
        peak_bytes=sim.device_peak_bytes,
        msr=metrics.msr,
        eor=metrics.eor,
        cbr=metrics.cbr,
        iteration_time_s=_mean_iteration(sim),
        stall_s=sum(j.stall_s for j in jobs),
        recompute_s=sum(j.recompute_s for j in jobs),
        bytes_h2d=sum(j.bytes_h2d for j in jobs),
        bytes_d2h=sum(j.bytes_d2h for j in jobs),
        sim=sim,
        fit=fit,
        fallback=fallback,
        evictions=evictions,
        evicted_bytes=sum(j.evicted_bytes for j in jobs),
        remat_s=sum(j.remat_s for j in jobs),
        plan_time_s=plan_time_s,
        events=_event_counts(result),
        result=result,
        allocated_peak_bytes=sim.allocated_peak_bytes,
        reserved_peak_bytes=sim.reserved_peak_bytes,
        fragmentation_bytes=sim.fragmentation_bytes,
        pinned_peak_bytes=sim.pinned_peak_bytes,
    )


def _event_counts(result: PlanResult | None) -> dict[str, int]:
    """Plan events of `result` by kind, over all jobs (none without a result)."""
    events: dict[str, int] = {}
    for p in result.plans if result is not None else ():
        for k, n in p.counts().items():
            events[k] = events.get(k, 0) + n
    return events


def _failed(
    name: str, budget: int | None, reason: str, plan_time: float, result: PlanResult | None = None
) -> Row:
    nan = math.nan
    row = (name, False, reason, budget, None, nan, nan, nan, nan, 0.0, 0.0, 0, 0, plan_time)
    return Row(*row, result=result)


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
    config: RunConfig = DEFAULT_RUN,
    mix: JobMix | None = None,
) -> Comparison:
    """Every planner in `planners` (and witness in `WITNESSES`) on the same
    jobs (`mix`: as they arrive and leave), each simulated under `config`:
    its net and allocator (a share of the vanilla peak is resolved by the
    caller: `vanilla_peak`). See NOTE [ Budgets in a comparison ], NOTE
    [ The safety net ] and NOTE [ The planners' view of the caching
    allocator ]."""
    if not traces:
        raise MemplanError("compare: no traces given")
    options = options or {}
    for name in planners:  # unknown names and bad options fail before any work
        if name not in WITNESSES:
            registry.make_options(name, options.get(name))
    lenders = {_budget_from(n) for n in planners} - {None}  # their options count too
    for name in options:
        if name not in planners and name not in lenders:
            raise MemplanError(f"--option {name}.*: planner {name!r} is not being compared")
    vanilla = simulate(
        jobs_for(mix, traces, [vanilla_plan(t) for t in traces]),
        device,
        iterations=iterations,
        budget=UNLIMITED_BYTES,
        check=False,
        **config.memory,
        **(mix.options() if mix is not None else {}),
    )
    seen = planner_view(traces, device, budget, config)[0]  # rounded once for every planner
    rows: dict[str, Row] = {}
    order = sorted(planners, key=lambda n: _budget_from(n) is not None)  # lenders first
    for name in order:
        own_budget = budget
        lender = _budget_from(name) if own_budget is None else None
        if lender is not None:
            lent = rows.get(lender)
            if lent is None:
                if progress:
                    progress(f"{name}: planning {lender} for its default budget")
                lent = run_planner(
                    lender,
                    traces,
                    device,
                    vanilla,
                    budget=None,
                    iterations=iterations,
                    options=options.get(lender),
                    config=config,
                    view=(seen, None),
                    mix=mix,
                )
            own_budget = lent.peak_bytes
        if progress:
            progress(f"planning {name}")
        try:
            view = (seen, planner_view(traces, device, own_budget, config)[1])
        except MemplanError as e:  # a budget all contexts: no row plans, each says so
            rows[name] = _failed(name, own_budget, str(e), 0.0)
            continue
        rows[name] = run_planner(
            name,
            traces,
            device,
            vanilla,
            budget=own_budget,
            iterations=iterations,
            options=options.get(name),
            config=config,
            view=view,
            mix=mix,
        )
    ordered = [rows[n] for n in planners]
    known: dict[int, tuple[float, str] | None] = {}
    reserve = config.context_bytes(device.hw) * len(traces)
    if mix is None or mix.static:  # the bounds are of jobs in step, not of a scenario
        ordered = [_with_gap(r, traces, device, known, reserve) for r in ordered]
    return Comparison(vanilla, tuple(ordered))


# NOTE [ Gap to the bound ]
# gap = (simulated iteration time - bound) / bound, with the analytic lower
# bound at the same budget (`planners.analysis.bounds`). For one job it holds
# for every plan. For several jobs it is the bound on the period of jobs in
# step (NOTE [ Jobs in step ] in planners/analysis/bounds.py), the mean
# iteration time of a run that keeps them in step; none when their op counts
# differ.
def _with_gap(
    row: Row,
    traces: Sequence[Trace],
    device: DeviceModel,
    known: dict[int, tuple[float, str] | None],
    reserve: int = 0,
) -> Row:
    """`row` with its gap to the lower bound (NOTE [ Gap to the bound ]);
    `known` caches the bound per budget. The bound is at the budget less the
    contexts (`reserve` in all): no allocator gives buffers less than their
    bytes, so a run under it is a run of exact bytes in that budget."""
    if not row.finished:
        return row
    budget = row.budget_bytes if row.budget_bytes is not None else device.hw.memory_bytes
    budget -= reserve
    if budget not in known:
        known[budget] = best_bound(traces, device, budget)
    bound = known[budget]
    if bound is None:
        return row
    seconds, name = bound
    return dataclasses.replace(row, gap=gap_to_bound(row.iteration_time_s, seconds), bound=name)


def best_bound(
    traces: Sequence[Trace], device: DeviceModel, budget: int
) -> tuple[float, str] | None:
    """(seconds, name) of the strongest lower bound on the iteration time
    proven for every plan at `budget` (one job: the best of
    `planners.analysis.window_bound`; several: the joint single-op bound of
    jobs in step); None for jobs that cannot be in step."""
    if len(traces) == 1:
        b = best_time_bound(traces[0], device, budget)
        return b.seconds, b.name
    try:
        joint = joint_bounds(traces, device, budget_bytes=budget)
    except PlanError:  # jobs that cannot be in step: no bound to compare with
        return None
    return joint.best_time_s, "jobs in step"

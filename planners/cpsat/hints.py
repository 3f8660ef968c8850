"""Warm starts for the CP-SAT search: other planners' plans, as the model's
decisions with the model's best timing for them (NOTE [ Hints ]).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction, TimeUnit
from memplan.planners.analysis.opgrid import memory_of_plan
from memplan.planners.analysis.optimes import predict_timeline
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import PlanResult, Recompute, SwapIn
from memplan.planners.cpsat.data import TICKS_PER_US, CpsatData
from memplan.planners.cpsat.model import build
from memplan.planners.cpsat.options import CpsatOptions
from memplan.planners.cpsat.readout import modes_from_plans
from memplan.planners.cpsat.solution import keep_all
from memplan.planners.cpsat.solve import SolveOutcome, fix_modes, solve, time_left
from memplan.planners.cpsat.spec import KEEP, ModelSpec, Solution
from memplan.planners.cpsat.timing import plan_timing
from memplan.traces.errors import MemplanError
from memplan.traces.model import Trace

BEST = "best"  # `CpsatOptions.hint`: every heuristic planner, the fastest that fits
HEURISTICS = "memplan.planners.heuristics."

# NOTE [ Hints ]
# With `hint="best"` every registered heuristic planner (but vanilla's no-move ones) plans
# the jobs at the budget while the hint's share of the time limit lasts. A plan is a
# candidate when it fits by the planners' view (one job: its op-grid peak; several: the
# planner's word). Candidates, cheapest first by a lower bound on their time in the model,
# become the model's fixed decisions (`readout.modes_from_plans`), timed by the model under
# a soft budget (NOTE [ Soft budget ] in cpsat/search.py), until the fastest plan found is
# no slower than the next candidate's bound or the time left would not cover another repair
# as long as the last (builds are not bounded by the solver's limit): that plan is the hint.
# With none, the candidate (or plan of least op-grid peak) least over the budget starts the
# soft search. A planner that raises is skipped; `hint=NAME` asks one planner, fitting or
# not. Full text and measurements: docs/notes.md, "Hints".


@dataclass(frozen=True, slots=True)
class _Candidate:
    name: str
    result: PlanResult
    peak_bytes: float  # op-grid peak (one job), inf when not measured
    fits: bool
    cost_us: float  # a lower bound on its iteration time in the model (`_candidate`)


@dataclass(frozen=True, slots=True)
class Hint:
    """What the hint phase found: `solution`, a plan of the model (or None);
    else `start`, a solution over the budget for a soft solve (or None);
    `source` says whose choices and why; `fitting` the planners whose plans
    fit the budget by the op-grid view (NOTE [ Hints ])."""

    solution: Solution | None
    start: Solution | None
    source: str
    fitting: tuple[str, ...] = ()


def hint_solution(
    data: CpsatData,
    traces: tuple[Trace, ...],
    device: DeviceModel,
    budget: int,
    opts: CpsatOptions,
    spec: ModelSpec,
    time_limit_s: float,
) -> Hint:
    """NOTE [ Hints ], within `time_limit_s` (every planner asked runs to its end)."""
    if opts.hint is None:
        return Hint(None, None, "none")
    if opts.hint == "cpsat":
        raise PlanError("cpsat: hint='cpsat' would call itself; name another planner")
    deadline = time.perf_counter() + time_limit_s
    names = _heuristics() if opts.hint == BEST else [opts.hint]
    cands, failed = [], []
    for name in names:
        if cands and time.perf_counter() >= deadline:
            break
        c = _candidate(name, traces, device, budget)
        if isinstance(c, str):
            failed.append(c)
        else:
            cands.append(c)
    if not cands:
        return Hint(None, None, f"none ({'; '.join(failed) or 'no planner'})")
    fitting = sorted((c for c in cands if c.fits), key=lambda c: c.cost_us)
    names_fit = tuple(c.name for c in fitting)
    if opts.hint != BEST or not fitting:  # the closest plan, as a start over the budget
        fitting = [min(cands, key=lambda c: c.peak_bytes)]
    best: tuple[int, Solution, str] | None = None
    over: tuple[int, Solution, str] | None = None
    repair_s = 0.0  # the last repair's wall time, its model's build included
    for i, c in enumerate(fitting):
        if best is not None and best[0] <= c.cost_us * TICKS_PER_US:
            break  # this one and the rest cannot be faster
        if i and time_left(deadline) <= repair_s:
            break  # another repair would run past the hints' time (NOTE [ Hints ])
        share = time_left(deadline) / (len(fitting) - i)
        t = time.perf_counter()
        out = _repair(data, opts, spec, c.result, share, c.name)
        repair_s = time.perf_counter() - t
        sol, start = out.solution, out.over_budget
        if sol is not None and (best is None or sol.iteration_ticks < best[0]):
            best = (sol.iteration_ticks, sol, c.name)
        elif (
            start is not None and out.excess is not None and (over is None or out.excess < over[0])
        ):
            over = (out.excess, start, c.name)
    of = f"{len(names_fit)} of {len(cands)} plans fit"
    if best is not None:
        return Hint(best[1], None, best[2] if opts.hint != BEST else f"{best[2]} ({of})", names_fit)
    if over is not None:
        why = f"none ({over[2]}'s choices: over the budget in the model; {of})"
        return Hint(None, over[1], why, names_fit)
    return Hint(None, None, f"none ({of}; the model found no timing for them)", names_fit)


def _heuristics() -> list[str]:
    """The registered heuristic planners that move something."""
    from memplan.planners import registry  # lazily: the registry imports planners, this one too

    out = []
    for name in registry.names():
        try:
            module = registry.get(name).fn.__module__
        except MemplanError:
            continue
        if module.startswith(HEURISTICS) and not module.endswith(".vanilla"):
            out.append(name)
    return out


def _candidate(
    name: str, traces: tuple[Trace, ...], device: DeviceModel, budget: int
) -> _Candidate | str:
    """`name`'s plans at `budget` with their op-grid peak, or why there are none."""
    from memplan.planners import registry

    try:
        res = registry.get(name)(list(traces), device, budget_bytes=budget)
    except MemplanError as e:
        return f"{name} failed: {e}"
    if len(res.plans) != len(traces):
        return f"{name} found no plan"
    cost, peak = 0.0, math.inf
    lane = 0.0
    for t, plan in zip(traces, res.plans, strict=True):
        tl = predict_timeline(t, device)
        d = tl.duration_us
        cost += tl.period_us
        cost += sum(float(d[k]) for ev in plan.events if isinstance(ev, Recompute) for k in ev.ops)
        ins = [ev.buffer for ev in plan.events if isinstance(ev, SwapIn)]
        lane += float(np.sum(device.copy_time(t.nbytes[ins], Direction.H2D, TimeUnit.US)))
        if len(traces) == 1:
            try:
                peak = float(memory_of_plan(t, tl, plan, device).peak()[0])
            except MemplanError:
                return f"{name}'s plan is not valid"
    fits = peak <= budget if len(traces) == 1 else res.feasible
    # the model's iteration is its compute and recomputation, and holds every copy
    return _Candidate(name, res, peak, fits, max(cost, lane))


def _repair(
    data: CpsatData,
    opts: CpsatOptions,
    spec: ModelSpec,
    result: PlanResult,
    time_limit_s: float,
    name: str,
) -> SolveOutcome:
    """The model's best timing for `result`'s decisions, under a soft budget:
    only the gaps it moves are free (their modes then fixed), with one
    segment per hot op, since its holes need not fill blocks."""
    modes, rec_at = modes_from_plans(data, result.plans)
    start = plan_timing(data, modes, rec_at, result.plans)
    if start is not None:  # (a swap that leaves no hole there is kept)
        modes, rec_at = list(start.mode), list(start.rec_at)
    moved = frozenset(g.id for g in data.gaps if modes[g.id] != KEEP)
    repair = replace(spec, soft=True, block=1, free=moved, incumbent=keep_all(data))
    bm = build(data, repair)
    fix_modes(bm, modes, rec_at)
    return solve(bm, opts, time_limit_s, start or keep_all(data), f"cpsat hint ({name})")

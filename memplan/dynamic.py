"""Dynamic workloads: run a scenario (jobs arriving and leaving) under each
method's scheduler and score it per phase against vanilla.

`run_dynamic(jobs, device, methods, ...)` simulates the vanilla reference
and one run per method (memplan/controllers.py), each with the same jobs,
seed, jitter, usage and lane slowdowns; `phases(run)` cuts every run into
the phases of NOTE [ Phases of a dynamic run ] and scores each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from memplan.controllers import Method, Observer, Record, controller_for
from memplan.hwmodels.device import DeviceModel
from memplan.planners.core.evaluate import OomPolicy
from memplan.planners.heuristics.tensile.update import PlanningTime, UpdateOptions
from memplan.runconfig import DEFAULT_RUN, RunConfig
from memplan.sim import Job, SimResult, simulate
from memplan.sim.dynamics import LaneSlowdown
from memplan.sim.errors import SimError
from memplan.sim.metrics import Metrics

UNLIMITED_BYTES = 1 << 62

# NOTE [ Budget of a dynamic run ]
# Every method of a scenario runs under one budget: `budget_fraction` of the
# vanilla run's device peak (default 0.7), or the bytes given. TENSILE plans
# for it, Capuchin saves what it needs, vDNN ignores it; what a plan leaves
# over it is caught by the passive net (`oom="passive"`, Capuchin's own
# runtime and TENSILE's, NOTE [ Short of the budget ] in tensile/planner.py), whose
# transfers are the phase's passive swaps. The vanilla reference runs with
# no budget (nothing is evicted): its peak and times are what the metrics
# divide by.
DEFAULT_BUDGET_FRACTION = 0.7


@dataclass(frozen=True, slots=True)
class MethodRun:
    """One method's run of a scenario (`record`: what its controller saw)."""

    method: str
    result: SimResult
    record: Record


@dataclass(frozen=True, slots=True)
class DynamicRun:
    """The vanilla reference and one run per method of one scenario."""

    jobs: tuple[Job, ...]
    budget_bytes: int
    vanilla: MethodRun
    runs: tuple[MethodRun, ...]


def run_dynamic(
    jobs: Sequence[Job],
    device: DeviceModel,
    methods: Sequence[Method | str],
    *,
    predictor: DeviceModel | None = None,
    budget_bytes: int | None = None,
    budget_fraction: float = DEFAULT_BUDGET_FRACTION,
    iterations: int = 3,
    seed: int = 0,
    jitter: float = 0.0,
    usage: float = 0.0,
    lane_slowdowns: Sequence[LaneSlowdown] = (),
    update: UpdateOptions | None = None,
    planning: PlanningTime | None = None,
    config: RunConfig = DEFAULT_RUN,
) -> DynamicRun:
    """Simulate `jobs` on `device` under vanilla and each of `methods`.
    `predictor`: the device model the schedulers plan with (its latency
    model: TENSILE's prediction; default `device`'s own). Plans in `jobs`
    are dropped: each method makes its own. `config`'s memory model holds
    for every run; its fallback does not: every method runs under the
    passive net."""
    if not jobs:
        raise SimError("dynamic run: no jobs")
    if not 0 < budget_fraction <= 10 or not math.isfinite(budget_fraction):
        raise SimError(f"budget fraction={budget_fraction!r} must be in (0, 10]")
    ms = [Method(m) for m in methods]
    bare = tuple(replace(j, plan=None) for j in jobs)
    traces = [j.trace for j in bare]
    common = dict(
        iterations=iterations,
        seed=seed,
        jitter=jitter,
        usage=usage,
        lane_slowdowns=lane_slowdowns,
        **config.memory,
    )
    obs = Observer(traces)
    van = simulate(bare, device, budget=UNLIMITED_BYTES, controller=obs, **common)
    budget = budget_bytes or max(1, int(van.device_peak_bytes * budget_fraction))
    budget = min(budget, device.hw.memory_bytes)
    pred = predictor or device
    runs = []
    for m in ms:
        ctl = controller_for(m, traces, pred, budget, update=update, planning=planning)
        res = simulate(bare, device, budget=budget, oom=OomPolicy.PASSIVE, controller=ctl, **common)
        runs.append(MethodRun(m.value, res, ctl.record))
    return DynamicRun(bare, budget, MethodRun("vanilla", van, obs.record), tuple(runs))


# NOTE [ Phases of a dynamic run ]
# Each iteration of each job falls in one phase:
# - "cold start": the first iteration of every job (Capuchin measures in it);
# - "n jobs, after arrival k" (or "after departure"): the steady stretch between two such
#   events (k = 1 is before the second arrival);
# - the same with ", updated": an iteration of that stretch whose plan (`plan_versions`)
#   differs from the one its job started it with (a re-plan or Capuchin's feedback).
# A phase is scored against vanilla's iterations of the same stretch (the label without
# ", updated"): MSR from the most device bytes of all jobs over the phase's iterations, EOR
# from their mean time, CBR = MSR / EOR; passive swaps and stalls are the phase's sums.
@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of one method's run (NOTE [ Phases of a dynamic run ])."""

    method: str
    label: str
    iterations: int
    peak_bytes: int
    mean_iteration_s: float
    metrics: Metrics
    passive_swaps: int
    stall_s: float


def phases(run: DynamicRun) -> list[Phase]:
    """Every method's phases, in order of first appearance, vanilla's first
    (its metrics against itself)."""
    ref = _groups(run.vanilla, run)
    out = []
    for mr in (run.vanilla, *run.runs):
        for label, its in _groups(mr, run).items():
            base = ref.get(label.removesuffix(", updated"))
            out.append(_score(mr, label, its, run.vanilla, base))
    return out


def _events(res: SimResult) -> list[tuple[float, str]]:
    ev = [(j.start_s, "arrival") for j in res.jobs]
    ev += [(j.end_s, "departure") for j in res.jobs]
    return sorted(ev)


def _groups(mr: MethodRun, run: DynamicRun) -> dict[str, list]:
    res = mr.result
    events = _events(res)
    first_version: dict[tuple[int, int, int], int] = {}
    groups: dict[str, list] = {}
    for rep in sorted(mr.record.reports, key=lambda r: (r.start_s, r.job)):
        if rep.iteration == 0:
            groups.setdefault("cold start", []).append(rep)
            continue
        arr = sum(1 for t, k in events if k == "arrival" and t <= rep.start_s)
        dep = sum(1 for t, k in events if k == "departure" and t <= rep.start_s)
        n = arr - dep
        label = f"{n} job{'' if n == 1 else 's'}, after arrival {arr}" + (
            f", departure {dep}" if dep else ""
        )
        versions = res.jobs[rep.job].plan_versions
        v = versions[rep.iteration] if rep.iteration < len(versions) else 0
        v0 = first_version.setdefault((rep.job, arr, dep), v)
        groups.setdefault(label + (", updated" if v != v0 else ""), []).append(rep)
    return groups


def _peak_within(res: SimResult, spans: Sequence[tuple[float, float]]) -> int:
    """Most device bytes of all jobs (the memory curve) within any of `spans`."""
    t, b = res.memory.t_s, res.memory.bytes
    best = 0
    for t0, t1 in spans:
        i0 = int(np.searchsorted(t, t0, "right")) - 1
        i1 = int(np.searchsorted(t, t1, "right"))
        seg = b[max(i0, 0) : max(i1, i0 + 1)]
        if len(seg):
            best = max(best, int(seg.max()))
    return best


def _mean_time(reps: Sequence) -> float:
    return float(np.mean([r.end_s - r.start_s for r in reps])) if reps else math.nan


def _score(mr: MethodRun, label: str, reps: list, vanilla: MethodRun, base: list | None) -> Phase:
    peak = _peak_within(mr.result, [(r.start_s, r.end_s) for r in reps])
    mean = _mean_time(reps)
    if base:
        vpeak = _peak_within(vanilla.result, [(r.start_s, r.end_s) for r in base])
        m = Metrics.of(vpeak, peak, _mean_time(base), mean, not mr.result.oom)
    else:
        m = Metrics.of(0, peak, math.nan, mean, False)
    return Phase(
        mr.method,
        label,
        len(reps),
        peak,
        mean,
        m,
        sum(r.passive_swaps for r in reps),
        float(sum(r.stall_s for r in reps)),
    )

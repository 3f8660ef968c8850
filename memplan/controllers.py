"""The scheduler processes of the dynamic-workload methods (`sim.control.Controller`).

One controller per simulation sees every job arrive, leave and end an
iteration, and answers with plan changes the simulator applies at the job's
next iteration boundary after the change is ready:

- `TensileController`: TENSILE_cs plans all running jobs together at each
  arrival and departure from predicted latencies; TENSILE_up also folds the
  observed latencies into an EWMA and re-plans when their average change
  rate passes the threshold (§IV-E).
- `CapuchinController`: each job's first iteration runs with no plan (the
  passive net underneath) while its access times are measured; it is then
  planned alone from that measurement, and late swap-ins move their
  in-triggers earlier (§4.2, §4.4).
- `PerJobController`: a planner that plans each job alone, once, before it
  starts (vDNN, as the paper ran it).

The planner-side logic is planners/heuristics/tensile/update.py and
capuchin/measured.py; this module converts the simulator's reports.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memplan.hwmodels.device import DeviceModel
from memplan.planners.analysis.optimes import Timeline
from memplan.planners.core.plan import Plan, PlanResult
from memplan.planners.heuristics.capuchin.measured import (
    Late,
    advance_in_triggers,
    measured_timeline,
)
from memplan.planners.heuristics.capuchin.planner import capuchin
from memplan.planners.heuristics.tensile.planner import tensile
from memplan.planners.heuristics.tensile.update import (
    LatencyTracker,
    PlanningTime,
    UpdateOptions,
)
from memplan.planners.heuristics.vdnn import vdnn
from memplan.sim.control import IterationReport, PlanChange
from memplan.traces.model import Trace


class Method(enum.Enum):
    """The dynamic-workload methods (issue 19)."""

    TENSILE_CS = "tensile_cs"
    TENSILE_UP = "tensile_up"
    CAPUCHIN = "capuchin"
    VDNN = "vdnn"


@dataclass(slots=True)
class Record:
    """What a controller saw: every iteration report, and every change it
    made (job, ready_s, reason), in order."""

    reports: list[IterationReport] = field(default_factory=list)
    changes: list[tuple[int, float, str]] = field(default_factory=list)


# NOTE [ Plans at arrival ]
# A job's first plan is made when it is submitted, before it launches (the
# paper's Memory Scheduler "generates the initial scheduling plan and
# distributes it", §III), so the arriving job's change is ready at its
# arrival and takes its first iteration; the re-plans of the jobs already
# running are ready after the modelled planning time (NOTE [ Modelled
# planning time ] in planners/heuristics/tensile/update.py) and taken at each
# one's next boundary after that. A planner that returns no plan (nothing it
# can do) changes nothing: the jobs keep the plans they have.
class _Base:
    def __init__(self, traces: Sequence[Trace], planning: PlanningTime | None):
        self.traces = tuple(traces)
        self.planning = planning or PlanningTime()
        self.record = Record()

    def _change(self, job: int, plan: Plan | None, ready_s: float, reason: str) -> PlanChange:
        self.record.changes.append((job, ready_s, reason))
        return PlanChange(job, plan, ready_s, reason)

    def job_left(self, job: int, now_s: float, jobs: Sequence[int]) -> Sequence[PlanChange]:
        return ()

    def iteration_ended(self, report: IterationReport) -> Sequence[PlanChange]:
        self.record.reports.append(report)
        return ()


# NOTE [ One re-plan at a time ]
# TENSILE's scheduler is one process: a drift re-plan is not started while
# the last plan is still being made or waits for a job's boundary -- until
# every running job has started an iteration under its latest change. A
# change still pending is replaced by a later one (sim NOTE [ Plan changes
# at a boundary ]), and the report of the iteration that ends at a boundary
# comes before that boundary, so re-planning on every report could replace
# each ready plan just before it is taken and none would ever run. The EWMA
# keeps folding observations meanwhile; arrivals and departures always
# re-plan (a new job needs its plan).
class TensileController(_Base):
    """TENSILE over all running jobs; with `update` (TENSILE_up) the EWMA
    re-plans of §IV-E, without (TENSILE_cs) only at arrivals and departures."""

    def __init__(
        self,
        traces: Sequence[Trace],
        device: DeviceModel,
        budget_bytes: int | None,
        *,
        update: UpdateOptions | None = None,
        planning: PlanningTime | None = None,
    ):
        super().__init__(traces, planning)
        self.device, self.budget = device, budget_bytes
        self.tracker = LatencyTracker(device.latency, device.hw, update) if update else None
        self.running: tuple[int, ...] = ()
        # job -> ready_s of its latest change, until an iteration under it starts
        self.untaken: dict[int, float] = {}

    def _plan(self, jobs: Sequence[int], now_s: float, reason: str, arriving: int = -1):
        ts = [self.traces[j] for j in jobs]
        dev = self.device if self.tracker is None else self.tracker.device(self.device)
        res = tensile(ts, dev, budget_bytes=self.budget)
        if self.tracker is not None:
            self.tracker.mark_planned(ts)
        if not res.plans:
            return ()
        ready = now_s + self.planning.of(ts)
        out = []
        for j, p in zip(jobs, res.plans, strict=True):
            at = now_s if j == arriving else ready
            self.untaken[j] = at
            out.append(self._change(j, p, at, reason))
        return tuple(out)

    def job_arrived(self, job: int, now_s: float, jobs: Sequence[int]) -> Sequence[PlanChange]:
        self.running = tuple(jobs)
        return self._plan(jobs, now_s, f"arrival of job {job}", arriving=job)

    def job_left(self, job: int, now_s: float, jobs: Sequence[int]) -> Sequence[PlanChange]:
        self.running = tuple(jobs)
        self.untaken.pop(job, None)
        return self._plan(jobs, now_s, f"departure of job {job}") if jobs else ()

    def iteration_ended(self, report: IterationReport) -> Sequence[PlanChange]:
        super().iteration_ended(report)
        j = report.job
        if j in self.untaken and report.start_s >= self.untaken[j]:
            del self.untaken[j]
        if self.tracker is None or j not in self.running:
            return ()
        self.tracker.observe(self.traces[j], report.op_durations_s)
        # one re-plan at a time: NOTE [ One re-plan at a time ]
        due, rate = self.tracker.due([self.traces[k] for k in self.running])
        if not due or any(k in self.untaken for k in self.running):
            return ()
        thr = self.tracker.options.threshold
        return self._plan(self.running, report.end_s, f"latency change rate {rate:.3g} > {thr:g}")


@dataclass(slots=True)
class _Measured:
    timeline: Timeline
    plan: Plan


class CapuchinController(_Base):
    """Capuchin per job: measure iteration 0, plan from it, then feedback.
    Each job is planned against a share of `budget_bytes` proportional to its
    vanilla peak among the jobs running when it is planned (as `capuchin`
    shares a budget)."""

    def __init__(
        self,
        traces: Sequence[Trace],
        device: DeviceModel,
        budget_bytes: int,
        *,
        planning: PlanningTime | None = None,
    ):
        super().__init__(traces, planning)
        self.device, self.budget = device, budget_bytes
        self.running: tuple[int, ...] = ()
        self.measured: dict[int, _Measured] = {}
        self._vanilla = [t.peak("framework")[0] for t in self.traces]

    def job_arrived(self, job: int, now_s: float, jobs: Sequence[int]) -> Sequence[PlanChange]:
        self.running = tuple(jobs)
        return ()

    def job_left(self, job: int, now_s: float, jobs: Sequence[int]) -> Sequence[PlanChange]:
        self.running = tuple(jobs)
        return ()

    def iteration_ended(self, report: IterationReport) -> Sequence[PlanChange]:
        super().iteration_ended(report)
        j = report.job
        m = self.measured.get(j)
        if m is None:
            return self._plan_measured(report)
        late = [Late(x.buffer, x.before_op, x.copy_s) for x in report.late_swap_ins]
        new = advance_in_triggers(m.plan, m.timeline, late) if late else m.plan
        if new is m.plan:
            return ()
        m.plan = new
        return (self._change(j, new, report.end_s, f"in-trigger feedback ({len(late)} late)"),)

    def _plan_measured(self, report: IterationReport) -> Sequence[PlanChange]:
        j = report.job
        t = self.traces[j]
        tl = measured_timeline(
            report.op_start_s, report.op_durations_s, report.start_s, report.end_s - report.start_s
        )
        total = sum(self._vanilla[k] for k in self.running) or self._vanilla[j]
        share = self.budget if len(self.running) <= 1 else self.budget * self._vanilla[j] // total
        res = capuchin([t], self.device, budget_bytes=max(int(share), 1), timelines=[tl])
        if not res.plans:
            return ()
        self.measured[j] = _Measured(tl, res.plans[0])
        ready = report.end_s + self.planning.of([t])
        return (self._change(j, res.plans[0], ready, "planned from measured iteration 0"),)


class PerJobController(_Base):
    """`planner` on each job alone, once, before it starts (NOTE [ Plans at arrival ])."""

    def __init__(
        self,
        traces: Sequence[Trace],
        planner: Callable[[Sequence[Trace]], PlanResult],
        name: str,
    ):
        super().__init__(traces, None)
        self.planner, self.name = planner, name
        self.plans: dict[int, Plan] = {}

    def job_arrived(self, job: int, now_s: float, jobs: Sequence[int]) -> Sequence[PlanChange]:
        res = self.planner([self.traces[job]])
        if not res.plans:
            return ()
        return (self._change(job, res.plans[0], now_s, f"{self.name} at arrival"),)


class Observer(_Base):
    """No plan changes: records the reports of a run (the vanilla reference)."""

    def __init__(self, traces: Sequence[Trace]):
        super().__init__(traces, None)

    def job_arrived(self, job: int, now_s: float, jobs: Sequence[int]) -> Sequence[PlanChange]:
        return ()


def controller_for(
    method: Method | str,
    traces: Sequence[Trace],
    device: DeviceModel,
    budget_bytes: int,
    *,
    update: UpdateOptions | None = None,
    planning: PlanningTime | None = None,
) -> _Base:
    """The controller of `method` for jobs running `traces` (by job index);
    `device` is what the scheduler predicts with (its latency model),
    `budget_bytes` what all jobs together may use."""
    m = Method(method)
    if m is Method.TENSILE_CS:
        return TensileController(traces, device, budget_bytes, planning=planning)
    if m is Method.TENSILE_UP:
        up = update or UpdateOptions()
        return TensileController(traces, device, budget_bytes, update=up, planning=planning)
    if m is Method.CAPUCHIN:
        return CapuchinController(traces, device, budget_bytes, planning=planning)
    # vDNN's plan does not depend on the budget: asked without one, it always plans
    return PerJobController(traces, lambda ts: vdnn(ts, device), "vdnn")

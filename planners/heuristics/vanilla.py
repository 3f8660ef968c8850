"""The two baselines every other planner is measured against.

- `vanilla`: the empty plan. The framework frees each buffer where it did at
  capture (`Buffer.freed_after`); its peak is `Trace.peak("framework")`.
- `release_only`: TENSILE's activity analysis. Free every non-persistent
  buffer right after its last access; its peak is `Trace.peak("liveness")`.
  Nothing is swapped or recomputed, so nothing costs time.

Both follow the planners' shared signature
`planner(traces, device, *, budget_bytes=None, options=None) -> PlanResult`;
neither needs the device or has options.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from memplan.hwmodels.device import DeviceModel
from memplan.planners.core.options import NoOptions
from memplan.planners.core.plan import (
    Plan,
    PlanResult,
    Release,
    empty_plan,
    fingerprint_of,
    fit_result,
)
from memplan.traces.model import MemoryPolicy, Trace


def vanilla_plan(trace: Trace) -> Plan:
    """No events: the framework's own frees."""
    return empty_plan(trace)


def release_only_plan(trace: Trace) -> Plan:
    """A `Release` after the last access of every non-persistent buffer that
    the framework frees later than that. An input no op reads is released at
    the start of the iteration (after_op=-1), so it is never loaded."""
    n = trace.n_ops
    last = trace.last_access.tolist()
    freed = trace.freed_after.tolist()
    events = []
    for b in trace.buffers:
        if b.persistent or n == 0:
            continue
        if last[b.id] < 0:
            if b.exists_at_start:
                events.append(Release(b.id, -1))
        elif last[b.id] < min(freed[b.id], n - 1):
            events.append(Release(b.id, last[b.id]))
    events.sort(key=lambda ev: (ev.after_op, ev.buffer))
    return Plan(fingerprint_of(trace), tuple(events), trace.meta.model)


def _result(
    name: str,
    plans: list[Plan],
    traces: Sequence[Trace],
    policy: MemoryPolicy,
    budget_bytes: int | None,
    t0: float,
) -> PlanResult:
    peaks = [t.peak(policy)[0] for t in traces]
    total = sum(peaks)
    return fit_result(
        name,
        plans,
        total,
        budget_bytes,
        t0,
        options={"budget_bytes": budget_bytes},
        stats={"peak_bytes": total, "job_peak_bytes": peaks},
    )


def vanilla(
    traces: Sequence[Trace],
    device: DeviceModel | None = None,
    *,
    budget_bytes: int | None = None,
    options: NoOptions | None = None,
) -> PlanResult:
    """Empty plans; feasible when the framework peaks of all jobs together
    (TENSILE's global peak, the sum of the jobs' peaks) fit `budget_bytes`."""
    t0 = time.perf_counter()
    plans = [vanilla_plan(t) for t in traces]
    return _result("vanilla", plans, traces, "framework", budget_bytes, t0)


def release_only(
    traces: Sequence[Trace],
    device: DeviceModel | None = None,
    *,
    budget_bytes: int | None = None,
    options: NoOptions | None = None,
) -> PlanResult:
    """`release_only_plan` per job; feasible when the liveness peaks fit."""
    t0 = time.perf_counter()
    plans = [release_only_plan(t) for t in traces]
    return _result("release_only", plans, traces, "liveness", budget_bytes, t0)

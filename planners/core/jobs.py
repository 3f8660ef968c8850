"""What every planner checks first: the jobs it is given and its budget.

Planners share one signature (`planners.registry`); these two turn its
`traces` and `budget_bytes` arguments into what the planners work on, or
raise `PlanError` naming the bad value.
"""

from __future__ import annotations

from collections.abc import Sequence

from memplan.planners.core.errors import PlanError
from memplan.traces.model import Trace


def as_traces(jobs: object) -> tuple[Trace, ...]:
    """The traces of `jobs`: a `Trace`, or a sequence of traces or of objects
    with a `.trace` (such as `sim.Job`; planners never import `sim`)."""
    if isinstance(jobs, Trace):
        return (jobs,)
    if not isinstance(jobs, Sequence) or isinstance(jobs, str | bytes):
        raise PlanError(f"jobs: expected a sequence of traces, got {type(jobs).__name__}")
    out = []
    for j, job in enumerate(jobs):
        t = job if isinstance(job, Trace) else getattr(job, "trace", None)
        if not isinstance(t, Trace):
            raise PlanError(f"jobs[{j}]: expected a Trace (or a job with .trace), got {job!r}")
        out.append(t)
    if not out:
        raise PlanError("jobs: no jobs to plan")
    return tuple(out)


def check_budget(budget_bytes: object) -> int | None:
    """`budget_bytes` must be None or a positive integer; PlanError otherwise."""
    if budget_bytes is None:
        return None
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes <= 0:
        raise PlanError(f"budget_bytes={budget_bytes!r} must be a positive number of bytes")
    return budget_bytes

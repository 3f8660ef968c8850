"""The exact baseline: a CP-SAT planner for one job, or several in step.

For every gap of every buffer (a stretch of ops that do not touch it) the
model chooses keep / swap (out then in, both timed on the lane) / release and
recompute (before its next access, or earlier in a chain), with the op order fixed, durations and copy times from the
`DeviceModel` and a memory budget; it minimises the iteration time (or the
peak under a time cap). See NOTE [ CP-SAT semantics ] in
`planners/cpsat/model.py` for exactly what the model assumes, and
`planners/cpsat/search.py` for how a run goes: the fastest fitting plan of
the heuristic planners completed by the model (NOTE [ Hints ] in
`planners/cpsat/hints.py`), the soft budget when there is no hint, and
windows around the memory peaks for large traces (`planners/cpsat/lns.py`).
A recomputation may pull its absent sources along, recomputed before the
same op (NOTE [ Recompute chains ] in `planners/cpsat/chains.py`), so
Checkmate's rematerialisation is a special case.

Several jobs share the compute, the lane(s) and the budget; the model keeps
them in step, one iteration of each per period (NOTE [ Several jobs ] in
`planners/cpsat/data.py`), and its objective is that period: every job's
steady iteration time.

The result is an ordinary `PlanResult` (one plan per job) with the typed
status of `planners/cpsat/outcome.py`; its `stats` carry the solver status
(OPTIMAL / FEASIBLE / INFEASIBLE / UNKNOWN), the objective, the best bound and
the relative gap.

Modules, each importing only modules after it in this order: `planner`
(this entry), `search` (a run), `hints` (other planners' plans as warm
starts), `lns` (windows), `outcome` (the result), `solve` (parameters,
solve, status check, read-out), `model` (variables, constraints,
objective), `memory` and `cuts` (its memory and redundant sections),
`solution` and `readout` (solutions as integers and as plans), `options`
(`CpsatOptions`), `spec` (the records), `data`, `chains` (where a gap may be
recomputed).
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from memplan.hwmodels.device import DeviceModel
from memplan.planners.core.errors import PlanError
from memplan.planners.core.jobs import as_traces
from memplan.planners.core.plan import PlanResult
from memplan.planners.cpsat.data import check_budget_type
from memplan.planners.cpsat.options import CpsatOptions
from memplan.planners.cpsat.search import run
from memplan.traces.model import Trace

__all__ = ["CpsatOptions", "cpsat"]


def cpsat(
    traces: Sequence[Trace],
    device: DeviceModel,
    *,
    budget_bytes: int | None = None,
    options: CpsatOptions | None = None,
) -> PlanResult:
    """Plan the jobs on `device` with CP-SAT under `budget_bytes` shared by
    all of them (default: the device's memory). Several jobs are planned in
    step (NOTE [ Several jobs ] in cpsat/data.py): they must have the same
    number of ops, else a PlanError says so."""
    t0 = time.perf_counter()
    opts = options if options is not None else CpsatOptions()
    jobs = as_traces(traces)
    hw_bytes = device.hw.memory_bytes
    budget = check_budget_type(hw_bytes if budget_bytes is None else budget_bytes)
    if len({t.n_ops for t in jobs}) > 1:
        raise PlanError(
            f"cpsat: plans several jobs in step only when they have the same number of ops "
            f"(got {[t.n_ops for t in jobs]})"
        )
    return run(jobs, device, budget, opts, t0)

"""`simulate`: score plans by running their jobs on a model of one GPU."""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Iterator, Sequence

from memplan.hwmodels.device import DeviceModel
from memplan.planners.core.check import check as check_plan
from memplan.planners.core.plan import validate
from memplan.sim.errors import SimError
from memplan.sim.job import CompiledJob, Job
from memplan.sim.metrics import SimResult, build_result
from memplan.sim.model import GpuModel
from memplan.sim.state import OomPolicy
from memplan.traces.model import Trace


def simulate(
    jobs: Sequence[Job | Trace],
    device: DeviceModel,
    *,
    iterations: int = 3,
    budget: int | None = None,
    oom: OomPolicy | str = OomPolicy.FAIL,
    seed: int = 0,
    check: bool = True,
) -> SimResult:
    """Run `jobs` (a bare `Trace` is a vanilla job arriving at 0) together on
    `device` and return what happened.

    - `device`: op durations, copy times and lanes (`DeviceModel`): 1 lane
      is one PCIe lane shared by both directions and all jobs; 2 is one lane
      per direction with the profile's H2D duplex slowdown.
    - `iterations`: per job, unless the job says otherwise.
    - `budget`: device bytes the jobs may use (default: the profile's
      `memory_bytes`).
    - `oom`: what an allocation that does not fit does -- "fail", "stall",
      "passive" or "dtr" (NOTE [ Out of memory ] in `sim/memory.py`).
    - `seed`: recorded in the result; the model itself is deterministic (ties
      are broken by job index and plan order), so the same inputs always give
      the same result.
    - `check`: run `planners.core.check` on every plan first (a bad plan is a
      `PlanError`); with False only the cheap structural `validate` runs.

    Bad arguments raise `SimError`.
    """
    policy = _policy(oom)
    if not jobs:
        raise SimError("simulate: no jobs")
    if not isinstance(iterations, int) or iterations < 1:
        raise SimError(f"iterations={iterations!r} must be an integer >= 1")
    hw = device.hw
    if device.lanes == 2 and hw.copy_engines < 2:
        raise SimError(f"lanes=2 needs two copy engines; {hw.name} has {hw.copy_engines}")
    if budget is None:
        budget = hw.memory_bytes
    if not isinstance(budget, int) or budget <= 0:
        raise SimError(f"budget={budget!r} must be a positive number of bytes")
    with _collector_paused():
        return _run(jobs, device, iterations, budget, policy, seed, check)


# NOTE [ Garbage collection in simulate ]
# A simulation allocates many objects that live for the whole run (log
# entries, memory samples, SimPy events), so CPython's cyclic collector runs
# often during it, and each collection of the older generations walks every
# tracked object alive: the caller's traces, plans and compiled jobs, and
# the run's own log, which grow with the trace. Measured on densenet121
# (4130 ops) x 4 jobs x 3 iterations: 630-1900 ms with the collector as is,
# 360-420 ms with the caller's objects frozen (`gc.freeze`); on a 30k-op
# synthetic step, 198k events/s with them frozen and 241-245k with the
# collector off during the run, at the same peak resident memory (393 MB:
# the run makes almost no cyclic garbage; its objects die with the model,
# by reference count or in the collection that follows). `simulate`
# therefore pauses the collector for the run and restores it after
# (benchmarks/sim.py prints events per second from 1k to 30k ops).


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _run(
    jobs: Sequence[Job | Trace],
    device: DeviceModel,
    iterations: int,
    budget: int,
    policy: OomPolicy,
    seed: int,
    check: bool,
) -> SimResult:
    compiled = []
    for j, job in enumerate(jobs):
        job = job if isinstance(job, Job) else Job(job)
        if not math.isfinite(job.arrival_s) or job.arrival_s < 0:
            raise SimError(f"jobs[{j}]: arrival_s={job.arrival_s!r} must be >= 0")
        n_it = iterations if job.iterations is None else job.iterations
        if not isinstance(n_it, int) or n_it < 1:
            raise SimError(f"jobs[{j}]: iterations={n_it!r} must be an integer >= 1")
        if job.plan is not None:
            (check_plan if check else validate)(job.plan, job.trace)
        compiled.append(CompiledJob(j, job, n_it, device))
    model = GpuModel(compiled, device, budget, policy)
    model.run()
    result = build_result(model, device.hw.name, seed)
    if not math.isfinite(result.makespan_s):  # NOTE [ Trace sanity ranges ]: an error, not a result
        raise SimError(
            f"the simulated makespan is not finite ({result.makespan_s} s): the op or copy "
            f"times on {device.hw.name} overflow (check the trace's flops and durations, "
            "and the profile or latency model)"
        )
    return result


def _policy(oom: OomPolicy | str) -> OomPolicy:
    if isinstance(oom, OomPolicy):
        return oom
    try:
        return OomPolicy(oom)
    except ValueError:
        allowed = ", ".join(p.value for p in OomPolicy)
        raise SimError(f"oom={oom!r} must be one of {allowed}") from None

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
    with _old_objects_frozen():
        return _run(jobs, device, iterations, budget, policy, seed, check)


# NOTE [ Garbage collection in simulate ]
# A simulation allocates many short-lived objects (SimPy events, log
# entries), so CPython's cyclic collector runs often during it, and each
# collection of the older generations walks every tracked object alive:
# the traces, plans and compiled jobs of the caller, which grow with the
# trace. Measured on densenet121 (4130 ops) x 4 jobs x 3 iterations:
# 630-1900 ms with the collector as is, 360-420 ms with it disabled or with
# the older objects frozen (benchmarks/sim.py). `simulate` therefore
# freezes what exists when it starts (`gc.freeze`: moved to a permanent
# generation the collector skips, in O(1)) and unfreezes it when done, so
# garbage made during the run is still collected (memory stays bounded)
# while the caller's object graph is not walked. A caller that froze objects
# itself keeps them frozen: only a freeze made here is undone.


@contextlib.contextmanager
def _old_objects_frozen() -> Iterator[None]:
    ours = gc.get_freeze_count() == 0
    gc.freeze()
    try:
        yield
    finally:
        if ours:
            gc.unfreeze()


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
    return build_result(model, device.hw.name, seed)


def _policy(oom: OomPolicy | str) -> OomPolicy:
    if isinstance(oom, OomPolicy):
        return oom
    try:
        return OomPolicy(oom)
    except ValueError:
        allowed = ", ".join(p.value for p in OomPolicy)
        raise SimError(f"oom={oom!r} must be one of {allowed}") from None

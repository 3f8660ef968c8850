"""`simulate`: score plans by running their jobs on a model of one GPU."""

from __future__ import annotations

import contextlib
import gc
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.latency import check_usage
from memplan.hwmodels.profile import Hardware
from memplan.planners.core.check import check as check_plan
from memplan.planners.core.plan import validate
from memplan.sim.control import Controller
from memplan.sim.dynamics import UNBOUNDED, Dynamics, LaneSlowdown, check_jitter, slow_lanes
from memplan.sim.errors import SimError
from memplan.sim.job import CompiledJob, Job
from memplan.sim.metrics import SimResult, build_result
from memplan.sim.model import GpuModel
from memplan.sim.state import Allocator, OomPolicy
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
    allocator: Allocator | str = Allocator.EXACT,
    context_reserve: int | None = None,
    controller: Controller | None = None,
    jitter: float = 0.0,
    usage: float = 0.0,
    lane_slowdowns: Sequence[LaneSlowdown] = (),
    progress: Callable[[int], None] | None = None,
) -> SimResult:
    """Run `jobs` (a bare `Trace` is a vanilla job arriving at 0) together on
    `device` and return what happened.

    - `device`: op durations, copy times and lanes (`DeviceModel`): 1 lane
      is one PCIe lane shared by both directions and all jobs; 2 is one lane
      per direction with the profile's H2D duplex slowdown.
    - `iterations`: per job, unless the job says otherwise.
    - `budget`: device bytes the jobs may use, their CUDA contexts included
      (default: the profile's `memory_bytes`; NOTE [ Context reserve ]).
    - `oom`: what an allocation that does not fit does -- "fail", "stall",
      "passive" or "dtr" (NOTE [ Out of memory ] in `sim/memory.py`).
    - `seed`: seeds the jitter (NOTE [ Usage and jitter ] in sim/dynamics.py);
      the model is otherwise deterministic (ties are broken by job index and
      plan order), so the same inputs and seed always give the same result.
    - `check`: run `planners.core.check` on every plan first (a bad plan is a
      `PlanError`); with False only the cheap structural `validate` runs.
    - `allocator`: "exact", "caching" or "smartpool" (NOTE [ The memory a
      GPU really uses ]).
    - `context_reserve`: bytes of each job's CUDA context; None: the
      profile's `context_reserve_bytes` with caching or smartpool, 0 with
      exact (NOTE [ Context reserve ]).
    - `controller`: the scheduler (sim/control.py), told of arrivals,
      departures and every iteration's end; its `PlanChange`s take effect at
      iteration boundaries (NOTE [ Plan changes at a boundary ] in sim/boundary.py).
    - `jitter`: sigma of a log-normal factor on every kernel; `usage`: load
      from outside the jobs, a fraction of the device (NOTE [ Usage and jitter ]).
    - `lane_slowdowns`: windows in which the lanes move bytes slower
      (NOTE [ Lane slowdowns ]).
    - `progress`: called with the number of iterations done (all jobs) at
      the end of each.
    A job leaves at its `departure_s` (NOTE [ Departures ]).

    Bad arguments raise `SimError`.
    """
    policy = _policy(oom)
    alloc = allocator_of(allocator)
    if not jobs:
        raise SimError("simulate: no jobs")
    if policy is OomPolicy.DTR:
        _dtr_keeps_order(jobs)
    if not isinstance(iterations, int) or iterations < 1:
        raise SimError(f"iterations={iterations!r} must be an integer >= 1")
    hw = device.hw
    if device.lanes == 2 and hw.copy_engines < 2:
        raise SimError(f"lanes=2 needs two copy engines; {hw.name} has {hw.copy_engines}")
    if budget is None:
        budget = hw.memory_bytes
    if not isinstance(budget, int) or budget <= 0:
        raise SimError(f"budget={budget!r} must be a positive number of bytes")
    reserve = context_bytes(hw, alloc, context_reserve)
    if reserve >= budget:
        raise SimError(
            f"a job's CUDA context ({reserve} bytes: context_reserve, by default the profile's "
            f"estimate; --context-reserve) leaves nothing of the budget ({budget} bytes)"
        )
    moves = Moves(
        controller, check_jitter(jitter), _usage(usage), _windows(lane_slowdowns), seed, progress
    )
    with _collector_paused():
        return _run(jobs, device, iterations, budget, policy, check, alloc, reserve, moves)


@dataclass(frozen=True, slots=True)
class Moves:
    """What moves during a run (sim/dynamics.py); `static` when nothing does."""

    controller: Controller | None
    jitter: float
    usage: float
    lanes: tuple[LaneSlowdown, ...]
    seed: int
    progress: Callable[[int], None] | None = None

    def dynamic(self, jobs: Sequence[Job]) -> bool:
        departs = any(j.departure_s is not None for j in jobs)
        return departs or self.controller is not None or bool(self.jitter) or bool(self.progress)


def _dtr_keeps_order(jobs: Sequence[Job | Trace]) -> None:
    """DTR's remakes reason in the trace's op order (sim/remat.py): refuse a
    plan with another (NOTE [ Plans under another order ] in planners/core/plan.py)."""
    for j, job in enumerate(jobs):
        plan = job.plan if isinstance(job, Job) else None
        if plan is not None and plan.order not in (None, tuple(range(job.trace.n_ops))):
            raise SimError(
                f"job {j}: oom=dtr remakes buffers in the trace's op order; a plan that "
                f"reorders ops runs under fail, stall or passive"
            )


def _usage(usage: float) -> float:
    try:
        return check_usage(usage)
    except LatencyError as e:
        raise SimError(str(e)) from None


def _windows(windows: Sequence[LaneSlowdown]) -> tuple[LaneSlowdown, ...]:
    out = tuple(windows)
    for w in out:
        if not isinstance(w, LaneSlowdown):
            raise SimError(f"lane_slowdowns: {w!r} is not a LaneSlowdown")
    return out


# NOTE [ The memory a GPU really uses ]
# `allocator` picks the model of device memory (`Allocator`):
# - exact: tensor bytes, each buffer exactly its size, nothing else unless a context reserve
#   is asked for -- the model planners and papers count in, and memplan's default, so figures
#   stay comparable.
# - caching: what a PyTorch process holds on a real GPU: each job's CUDA context
#   (NOTE [ Context reserve ]), op workspaces (NOTE [ Workspaces ] in hwmodels/device.py), and
#   every buffer a block of its job's caching allocator (NOTE [ The caching allocator ] in
#   sim/allocator.py). The reserved segments and the contexts meet the budget: an allocation
#   whose new segment does not fit is out of memory (or calls the safety net) even when the
#   tensor bytes would fit. Outputs of an op are allocated one by one, as PyTorch does.
# - smartpool: contexts and workspaces as with caching, each job's buffers in one pool laid
#   out offline (NOTE [ SmartPool in the simulator ]).
#
# NOTE [ Context reserve ]
# A job is a process of its own (NOTE [ One process per job ] in
# sim/ledger.py): its CUDA context takes `context_reserve` bytes from its
# arrival to its end, counted in the memory curve (kind `other`). The
# budget is the device share of the jobs, their contexts inside it -- what
# nvidia-smi shows for their processes -- so no budget defaults to the
# whole device, and a share of the vanilla peak (`--budget 60%`) is of the
# vanilla peak with the same contexts. A context that does not fit when its
# job arrives is out of memory at once: no safety net evicts for a process
# that does not exist yet. Planners plan for the budget less the contexts
# (memplan/comparison.py `planner_view`).
#
# NOTE [ SmartPool in the simulator ]
# SmartPool lays out lifetimes known in advance, so a run under it has two
# steps. The run itself counts bytes exactly (contexts and workspaces
# included; the safety net acts on those counts) and records, per job, the
# lifetime of every allocation (buffers, copies in flight, workspaces) in
# the job's order of events. After it, each job's lifetimes are laid out
# (sim/smartpool.py); its pool, the footprint, is held from its arrival to
# its end, beside its context. Jobs are then admitted in order of arrival:
# one whose pool and context do not fit beside those of the jobs still
# running is out of memory at the start of its first iteration (the other
# jobs' times stay those of the run it took part in).
def allocator_of(allocator: Allocator | str) -> Allocator:
    """`allocator` as an `Allocator`; SimError naming the choices."""
    if isinstance(allocator, Allocator):
        return allocator
    try:
        return Allocator(allocator)
    except ValueError:
        allowed = ", ".join(a.value for a in Allocator)
        raise SimError(f"allocator={allocator!r} must be one of {allowed}") from None


def context_bytes(hw: Hardware, allocator: Allocator | str, reserve: int | None) -> int:
    """Bytes of one job's CUDA context (NOTE [ Context reserve ]): `reserve`,
    or by default the profile's with an allocator model, none with exact."""
    if reserve is None:
        return 0 if allocator_of(allocator) is Allocator.EXACT else hw.context_reserve_bytes
    if not isinstance(reserve, int) or isinstance(reserve, bool) or reserve < 0:
        raise SimError(f"context_reserve={reserve!r} must be a whole number of bytes >= 0")
    return reserve


# NOTE [ Garbage collection in simulate ]
# A run allocates many objects that live for all of it (log entries, samples, SimPy events), so
# CPython's cyclic collector runs often, and each collection of the older generations walks
# every tracked object alive: the caller's traces, plans and compiled jobs, and the growing
# log. The run makes almost no cyclic garbage, so `simulate` pauses the collector for the run
# and restores it after (benchmarks/sim.py prints events per second from 1k to 30k ops). The
# model is a reference cycle (SimPy's environment; the pool and the copy engine), so
# `GpuModel.close` lets go of its per-buffer lists, compiled tables and log once the result is
# built and they go by reference count; and the log and samples are flat lists
# (NOTE [ A flat log ] in sim/log.py): a result the caller keeps is one object to walk.
# Measurements: docs/notes.md, "Garbage collection in simulate".


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
    check: bool,
    alloc: Allocator,
    reserve: int,
    moves: Moves,
) -> SimResult:
    compiled = []
    given = [job if isinstance(job, Job) else Job(job) for job in jobs]
    for j, job in enumerate(given):
        if not math.isfinite(job.arrival_s) or job.arrival_s < 0:
            raise SimError(f"jobs[{j}]: arrival_s={job.arrival_s!r} must be >= 0")
        n_it = _iterations(j, job, iterations)
        if job.plan is not None:
            (check_plan if check else validate)(job.plan, job.trace)
        workspaces = alloc is not Allocator.EXACT
        compiled.append(CompiledJob(j, job, n_it, device, workspaces, moves.usage))
    slow = slow_lanes(moves.lanes) if moves.lanes else None
    model = GpuModel(compiled, device, budget, policy, alloc, reserve, slow)
    if moves.dynamic(given):
        model.dyn = Dynamics(model, device, moves.seed, moves.jitter, moves.controller, check)
        model.dyn.progress = moves.progress
    model.run()
    try:
        result = build_result(model, device.hw.name, moves.seed)
    finally:
        model.close()
    if not math.isfinite(result.makespan_s):  # NOTE [ Trace sanity ranges ]: an error, not a result
        raise SimError(
            f"the simulated makespan is not finite ({result.makespan_s} s): the op or copy "
            f"times on {device.hw.name} overflow (check the trace's flops and durations, "
            "and the profile or latency model)"
        )
    return result


def _iterations(j: int, job: Job, iterations: int) -> int:
    """The job's iterations (NOTE [ Departures ] in sim/dynamics.py)."""
    dep = job.departure_s
    if dep is not None:
        if not isinstance(dep, int | float) or not math.isfinite(dep) or dep <= job.arrival_s:
            raise SimError(
                f"jobs[{j}]: departure_s={dep!r} must be a finite time after its arrival "
                f"({job.arrival_s} s)"
            )
        if job.iterations is None:
            return UNBOUNDED
    n_it = iterations if job.iterations is None else job.iterations
    if not isinstance(n_it, int) or isinstance(n_it, bool) or n_it < 1:
        raise SimError(f"jobs[{j}]: iterations={n_it!r} must be an integer >= 1")
    return n_it


def _policy(oom: OomPolicy | str) -> OomPolicy:
    if isinstance(oom, OomPolicy):
        return oom
    try:
        return OomPolicy(oom)
    except ValueError:
        allowed = ", ".join(p.value for p in OomPolicy)
        raise SimError(f"oom={oom!r} must be one of {allowed}") from None

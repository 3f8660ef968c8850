"""The scheduler's hook into a simulation: what it observes, what it returns.

A `Controller` is the scheduler process of TENSILE (§IV-E): one per
simulation, it sees every job arrive, leave and end an iteration, and may
answer each with `PlanChange`s. `simulate(..., controller=)` calls it
synchronously inside the model at those instants (the run stays
deterministic) and applies each change at the job's first iteration boundary
at or after its `ready_s` (NOTE [ Plan changes at a boundary ] in
sim/boundary.py). Controllers live in the app shell; planners never import
sim, so planner-side logic works on the plain arrays of `IterationReport`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from memplan.planners.core.plan import Plan


@dataclass(frozen=True, slots=True)
class LateSwapIn:
    """A swap-in the compute waited for: `buffer`, needed by `before_op`,
    waited `wait_s` seconds; the copy held its lane `copy_s` seconds."""

    buffer: int
    before_op: int
    wait_s: float
    copy_s: float


@dataclass(frozen=True, slots=True, eq=False)
class IterationReport:
    """What the scheduler observes when one of a job's iterations ends.
    Times in seconds of the simulation clock.

    - `op_start_s[i]`: when op i started (Capuchin's access times);
    - `op_durations_s[i]`: how long its kernel ran, jitter and usage
      included (TENSILE's EWMA input);
    - `op_queue_s[i]`: how long op i waited for the compute stream behind
      other jobs' kernels (0 alone): the time-slicing an arrival brings
      (NOTE [ Usage and jitter ] in sim/dynamics.py); a job that times its ops
      from launch to end sees `op_queue_s + op_durations_s`;
    - `late_swap_ins`: the swap-ins the compute waited for;
    - `passive_swaps`: the OOM policy's transfers of this job's buffers;
    - `stall_s`: compute waiting in this iteration (copies, memory);
    - `peak_bytes`: the job's most device bytes during it (the memory
      curve's count: buffers, workspaces, its context)."""

    job: int
    iteration: int
    start_s: float
    end_s: float
    op_start_s: np.ndarray
    op_durations_s: np.ndarray
    late_swap_ins: tuple[LateSwapIn, ...]
    passive_swaps: int
    stall_s: float
    peak_bytes: int
    op_queue_s: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class PlanChange:
    """Put `plan` (None: the vanilla empty plan) in force for `job` from its
    first iteration boundary at or after `ready_s` (simulated seconds). A
    later change for the same job replaces one still pending. `reason` is
    recorded with the change (`JobResult.plan_changes`)."""

    job: int
    plan: Plan | None
    ready_s: float
    reason: str


class Controller(Protocol):
    """The scheduler: one per simulation, sees every job. `jobs` are the
    indices of the jobs running at `now_s` (an arriving job included, a
    leaving one not)."""

    def job_arrived(self, job: int, now_s: float, jobs: Sequence[int]) -> Sequence[PlanChange]: ...

    def job_left(self, job: int, now_s: float, jobs: Sequence[int]) -> Sequence[PlanChange]: ...

    def iteration_ended(self, report: IterationReport) -> Sequence[PlanChange]: ...

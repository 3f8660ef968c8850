"""What a search planner asks of a simulation, without importing one.

Planners never import `sim` (docs/design.md, "Layers"). A planner that scores
candidate plans by simulating them takes an `Evaluator` -- a callable the app
shell builds around the simulator for one set of jobs, device, budget and
OOM policy -- and reads back an `Evaluation`: whether the plans fit, how fast
the jobs ran, and what the runtime safety net did (`NetMove`s), which is
enough to turn the net's choices into plan events.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from memplan.planners.core.plan import Plan


class OomPolicy(enum.StrEnum):
    """What an allocation that does not fit does in a simulated run: the
    job stops (FAIL), waits for swap-outs in flight (STALL), or a runtime
    net makes room (PASSIVE: Capuchin's LRU swapping; DTR). The simulator
    takes it (`sim.OomPolicy` is this one)."""

    FAIL = "fail"
    STALL = "stall"
    PASSIVE = "passive"
    DTR = "dtr"


class MoveKind(enum.StrEnum):
    """What the net did to a buffer (`NetMove.kind`)."""

    EVICT = "evict"  # the device copy went away to make room
    RESTORE = "restore"  # it came back: fetched, or rematerialised


@dataclass(frozen=True, slots=True)
class NetMove:
    """One act of the runtime safety net in iteration `iteration` of job
    `job`: `kind` EVICT (the device copy of `buffer` went away while op
    `op` made room; `swapped`: a host copy was made or kept, else it was
    dropped to be recomputed) or RESTORE (the buffer came back for op `op`:
    fetched from the host, or rematerialised by re-running `ops`)."""

    job: int
    iteration: int
    kind: MoveKind
    op: int
    buffer: int
    swapped: bool = True
    ops: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class OpTimes:
    """When each op of one job ran in the last simulated iteration, in
    microseconds from that iteration's start (`start_us`, `end_us`), and that
    iteration's length `period_us`: stalls and lane waits included, which a
    prediction from op durations alone does not see. `stalls`: (op, buffer,
    microseconds) where op waited for buffer (a swap-in, a swap-out's
    deadline, or room for it); `peak_bytes`: the device's bytes at most
    from the end of op i-1 to the end of op i."""

    start_us: np.ndarray
    end_us: np.ndarray
    period_us: float
    stalls: tuple[tuple[int, int, float], ...] = ()
    peak_bytes: np.ndarray | None = None  # device bytes at most while op i waited or ran


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A simulated run of candidate plans. `iteration_s`: the mean steady
    iteration time over jobs (inf when it ran out of memory); `oom_at`:
    (job, iteration, op) of the failed allocation, op -1 at an iteration's
    start; `moves`: what the net did, in time order; `op_times`: when the
    ops ran, per job, computed when called (None if the run did not finish)."""

    fits: bool
    iteration_s: float
    peak_bytes: int
    iterations: int
    oom_at: tuple[int, int, int] | None = None
    net_used: bool = False
    moves: tuple[NetMove, ...] = ()
    op_times: Callable[[], tuple[OpTimes, ...]] | None = field(
        default=None, compare=False, repr=False
    )


class Evaluator(Protocol):
    """Simulate one plan per job under the OOM `policy` (FAIL, or a net:
    PASSIVE, DTR)."""

    def __call__(self, plans: Sequence[Plan], policy: OomPolicy = OomPolicy.FAIL) -> Evaluation: ...

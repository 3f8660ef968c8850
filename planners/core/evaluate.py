"""What a search planner asks of a simulation, without importing one.

Planners never import `sim` (DESIGN.md, the layers). A planner that scores
candidate plans by simulating them takes an `Evaluator` -- a callable the app
shell builds around the simulator for one set of jobs, device, budget and
OOM policy -- and reads back an `Evaluation`: whether the plans fit, how fast
the jobs ran, and what the runtime safety net did (`NetMove`s), which is
enough to turn the net's choices into plan events.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from memplan.planners.core.plan import Plan


@dataclass(frozen=True, slots=True)
class NetMove:
    """One act of the runtime safety net in iteration `iteration` of job
    `job`: `kind` "evict" (the device copy of `buffer` went away while op
    `op` made room; `swapped`: a host copy was made or kept, else it was
    dropped to be recomputed) or "restore" (the buffer came back for op `op`:
    fetched from the host, or rematerialised by re-running `ops`)."""

    job: int
    iteration: int
    kind: str
    op: int
    buffer: int
    swapped: bool = True
    ops: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Evaluation:
    """A simulated run of candidate plans. `iteration_s`: the mean steady
    iteration time over jobs (inf when it ran out of memory); `oom_at`:
    (job, iteration, op) of the failed allocation, op -1 at an iteration's
    start; `moves`: what the net did, in time order."""

    fits: bool
    iteration_s: float
    peak_bytes: int
    iterations: int
    oom_at: tuple[int, int, int] | None = None
    net_used: bool = False
    moves: tuple[NetMove, ...] = ()


class Evaluator(Protocol):
    """Simulate one plan per job; `policy` is the OOM policy ("fail", or a
    net: "passive", "dtr")."""

    def __call__(self, plans: Sequence[Plan], policy: str = "fail") -> Evaluation: ...

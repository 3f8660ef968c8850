"""Capuchin's options and the records its planner keeps: candidates (an
access pair of one buffer), the lane slots of a swap, and a chosen eviction."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

NO_BUDGET = "capuchin saves only what a budget needs: give budget_bytes"


@dataclass(frozen=True, slots=True)
class CapuchinOptions:
    """- `recompute`: consider recomputation (False: swap only).
    - `max_recompute_ops`: longest recompute chain (lineage) in ops.
    - `max_rounds`: cap on Algorithm 1 rounds per job
      (NOTE [ Capuchin candidates and rounds ])."""

    recompute: bool = True
    max_recompute_ops: int = 32
    max_rounds: int = 1000

    def __post_init__(self) -> None:
        if self.max_recompute_ops < 1:
            raise ValueError(f"max_recompute_ops={self.max_recompute_ops!r} must be >= 1")
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds={self.max_rounds!r} must be >= 1")


@dataclass(slots=True)
class Candidate:
    """One access pair of one buffer: evicted after op `evict`, needed again
    by op `back`. Swap and Algorithm 2 state."""

    buffer: int
    evict: int
    back: int
    nbytes: int
    ft_us: float
    srcs: set[int] = field(default_factory=set)
    rp_us: float = math.inf  # inf: not recomputable
    ext_us: float = 0.0
    version: int = 0

    @property
    def recompute_us(self) -> float:
        return self.rp_us + self.ext_us

    @property
    def msps(self) -> float:
        t = self.recompute_us
        if math.isinf(t):
            return 0.0
        return math.inf if t <= 0 else self.nbytes / (t * 1e-6)

    def covers(self, op: int) -> bool:
        """Whether the buffer is off the device while `op` runs, once evicted."""
        return self.evict < op < self.back


@dataclass(frozen=True, slots=True)
class SwapSlots:
    overhead_us: float
    out_start: float
    in_start: float
    in_after: int
    in_delay: float


@dataclass(slots=True)
class Choice:
    cand: Candidate
    swap: SwapSlots | None = None  # None: recompute
    ops: tuple[int, ...] = ()
    rng: bool = False

"""How the jobs of a run are simulated, apart from what is planned: the
memory model (`allocator`, `context_reserve`) and the safety net under a
plan (`fallback`), one `RunConfig`.

A command builds it once from its arguments (`commands/machine.py`
`run_config`) and passes it down to the comparison, capacity, sweeps and
the planners' evaluator; where memplan calls the simulator it becomes
`simulate`'s keywords (`memory`, `Fallback.policy`).
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any

from memplan.hwmodels.profile import Hardware
from memplan.planners.core.evaluate import OomPolicy
from memplan.sim.simulate import allocator_of, context_bytes
from memplan.sim.state import Allocator
from memplan.traces.errors import MemplanError


class Fallback(enum.StrEnum):
    """The runtime safety net under a plan (`--fallback`; NOTE [ The safety
    net ] in memplan/comparison.py)."""

    NONE = "none"
    PASSIVE = "passive"  # Capuchin's LRU swapping to host
    DTR = "dtr"  # DTR's eviction with rematerialisation

    @property
    def policy(self) -> OomPolicy:
        """The simulator's OOM policy for this net (none: the run fails)."""
        return OomPolicy.FAIL if self is Fallback.NONE else OomPolicy(self.value)


def fallback_of(fallback: Fallback | str) -> Fallback:
    """`fallback` as a `Fallback`; a one-line MemplanError naming the choices."""
    try:
        return Fallback(fallback)
    except ValueError:
        allowed = ", ".join(Fallback)
        raise MemplanError(f"--fallback={fallback!r} must be one of {allowed}") from None


@dataclass(frozen=True, slots=True)
class RunConfig:
    """`allocator`: the simulator's memory model (NOTE [ The memory a GPU
    really uses ] in sim/simulate.py); `context_reserve`: bytes of each
    job's CUDA context, None for the profile's with an allocator model and
    none with exact (NOTE [ Context reserve ]); `fallback`: the net. Names
    are taken as strings too, and a bad one is a one-line error."""

    allocator: Allocator = Allocator.EXACT
    context_reserve: int | None = None
    fallback: Fallback = Fallback.NONE

    def __post_init__(self) -> None:
        object.__setattr__(self, "allocator", allocator_of(self.allocator))
        object.__setattr__(self, "fallback", fallback_of(self.fallback))

    @property
    def memory(self) -> dict[str, Any]:
        """`simulate`'s keywords for the memory model."""
        return {"allocator": self.allocator, "context_reserve": self.context_reserve}

    def context_bytes(self, hw: Hardware) -> int:
        """Bytes of one job's CUDA context on `hw` in this run."""
        return context_bytes(hw, self.allocator, self.context_reserve)

    def with_fallback(self, fallback: Fallback | str) -> RunConfig:
        """This run under another net."""
        return dataclasses.replace(self, fallback=fallback_of(fallback))


DEFAULT_RUN = RunConfig()  # exact bytes, no context reserve, no net

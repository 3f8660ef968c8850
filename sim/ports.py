"""What the model's parts see of it. The parts that act on a run as a whole
(sim/dynamics.py, sim/boundary.py) and those that run inside a job's
process (sim/recompute.py, sim/remat.py) receive one of these, which
`GpuModel` satisfies; none of them imports sim/model.py, so the import graph
has no circle through it (tests/app/test_layout.py)."""

from __future__ import annotations

from typing import Protocol

from memplan.sim.clock import Clock
from memplan.sim.errors import OutOfMemory
from memplan.sim.log import Log
from memplan.sim.memory import MemoryPool
from memplan.sim.state import Gen, JobState
from memplan.sim.stream import ComputeStream


class Gpu(Protocol):
    """The run as its dynamics and iteration boundaries see it: the clock, the
    jobs, the log, the memory pool, whether jobs share the compute stream,
    and how a job is stopped (NOTE [ Stopping a job ] in sim/model.py)."""

    env: Clock
    jobs: list[JobState]
    log: Log
    mem: MemoryPool
    shared: bool

    def stop(self, s: JobState, oom: OutOfMemory | None = None) -> None: ...


class Runner(Protocol):
    """A job's process as a recompute chain or a DTR remake runs inside it:
    they re-run ops on its compute stream and make their own inputs present
    as its ops do (NOTE [ Event semantics ] in sim/model.py)."""

    env: Clock
    log: Log
    mem: MemoryPool
    compute: ComputeStream
    shared: bool

    def ensure(self, s: JobState, b: int, i: int) -> Gen:
        """Make buffer `b`, which op `i` needs, usable."""
        ...

    def framework_free(self, s: JobState, b: int) -> None:
        """End this incarnation of `b` (NOTE [ Incarnations ] in sim/model.py)."""
        ...

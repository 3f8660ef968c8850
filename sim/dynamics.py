"""What moves during a run: departures, jitter, lane slowdowns, and the
scheduler's plan changes (`sim/control.py`).

`Dynamics` is the model's one hook for all of it; a run with none of it has
no `Dynamics` (`GpuModel.dyn` is None) and its hot loop is the static one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import simpy
from memplan.hwmodels.device import DeviceModel
from memplan.sim.boundary import Boundaries
from memplan.sim.control import Controller
from memplan.sim.errors import SimError
from memplan.sim.log import LogEntry, LogKind
from memplan.sim.pcie import SlowLanes
from memplan.sim.ports import Gpu
from memplan.sim.state import Gen, JobState

MAX_JITTER = 2.0  # sigma of the log-normal factor; beyond it a kernel may run 1000x long
MAX_SLOWDOWN = 1e6


# NOTE [ Usage and jitter ]
# Op latency moves in two ways, both seeded and so deterministic per seed:
# - `usage` is load from *outside* the simulated jobs (another tenant, a display): every kernel
#   of every job is predicted at that usage by the latency model (`DeviceModel.op_durations(
#   usage=)`: 1 / (1 - usage), or what the MLP learned). The other simulated jobs' load is no
#   usage: their kernels queue FIFO with this job's on the one compute stream
#   (hwmodels NOTE [ Usage under a compute queue ]), so an arrival slows a running job through
#   the queue (`IterationReport.op_queue_s`), and counting it as usage too would count it twice.
# - `jitter` is noise: each kernel run (a recompute too) of iteration k of job j takes its
#   predicted duration times a log-normal factor exp(sigma * Z - sigma^2 / 2) (mean 1), rounded
#   to 1 ns, drawn at the iteration's start from job j's own generator (`numpy.random.
#   SeedSequence(seed).spawn`): one job's draws do not depend on how the others interleave,
#   and the same seed gives the same run. sigma = 0 draws nothing.
# Full text: docs/notes.md, "Usage and jitter".
#
# NOTE [ Lane slowdowns ]
# `LaneSlowdown(factor, start_s, end_s)`: between start_s and end_s every
# lane moves bytes `factor` times slower (a congested PCIe switch, a host
# under memory pressure). A copy that spans a window's edge moves at full
# speed outside it and slowly inside: its bytes are counted as microseconds
# of full-speed work, done at rate 1 / factor inside the window. A copy's
# fixed cost is latency, not bandwidth, and is not slowed (sim/pcie.py).
# Windows may overlap: their factors multiply.
@dataclass(frozen=True, slots=True)
class LaneSlowdown:
    """Lanes `factor` times slower from `start_s` to `end_s` (seconds)."""

    factor: float
    start_s: float
    end_s: float

    def __post_init__(self) -> None:
        f, a, b = self.factor, self.start_s, self.end_s
        if not isinstance(f, int | float) or not math.isfinite(f) or not 1 <= f <= MAX_SLOWDOWN:
            raise SimError(f"lane slowdown factor={f!r} must be a number in [1, {MAX_SLOWDOWN:g}]")
        for name, x in (("start_s", a), ("end_s", b)):
            if not isinstance(x, int | float) or not math.isfinite(x) or x < 0:
                raise SimError(f"lane slowdown {name}={x!r} must be a finite time >= 0")
        if b <= a:
            raise SimError(f"lane slowdown window {a}s-{b}s: the end must be after the start")


def slow_lanes(windows: Sequence[LaneSlowdown]) -> SlowLanes:
    """The lanes' piecewise rate under `windows` (NOTE [ Lane slowdowns ])."""
    edges = sorted({0.0, *(w.start_s * 1e6 for w in windows), *(w.end_s * 1e6 for w in windows)})
    rates = []
    for a in edges:
        f = 1.0
        for w in windows:
            if w.start_s * 1e6 <= a < w.end_s * 1e6:
                f *= w.factor
        rates.append(1.0 / f)
    return SlowLanes(edges, rates)


# NOTE [ Departures ]
# A job with `departure_s` leaves at that instant, whatever it is doing
# (a user's Ctrl-C, a scheduler's preemption): it stops as a job that ends
# (NOTE [ Stopping a job ] in sim/model.py), logged `depart`. Its memory comes
# back at once -- buffers, workspace, context -- except the bytes a copy in
# flight reads or writes: a DMA that has started runs to its end on its lane
# (the driver cannot take memory back from under it), and those bytes return
# when it ends, as a running kernel holds the compute stream to its end. A
# copy still waiting for its lane is dropped. The iterations it completed are
# its iteration times; the one it left is not. `iterations` and
# `departure_s` together: whichever comes first. `departure_s` alone: it
# iterates until it leaves (an iteration that takes no time is an error, or
# it would never reach its departure).
UNBOUNDED = 1 << 62


class Dynamics:
    """The model's hook for departures, jitter, usage and the controller."""

    def __init__(
        self,
        gpu: Gpu,
        device: DeviceModel,
        seed: int,
        jitter: float,
        controller: Controller | None,
        check: bool,
    ):
        self.gpu = gpu
        self.jitter = jitter
        n = len(gpu.jobs)
        seqs = np.random.SeedSequence(seed).spawn(n) if jitter else []
        self.rngs = [np.random.default_rng(q) for q in seqs]
        self.bounds = Boundaries(gpu, device, controller, check)
        self.progress: Callable[[int], None] | None = None
        self.done = 0  # iterations ended, all jobs

    def start(self) -> None:
        """Start the departure processes (before the run)."""
        env = self.gpu.env
        for s in self.gpu.jobs:
            if s.c.departure_us is not None:
                s.depart_proc = env.process(self._depart(s))

    def _depart(self, s: JobState) -> Gen:
        try:
            yield self.gpu.env.timeout(s.c.departure_us)
        except simpy.Interrupt:
            return  # it ended first
        if not s.stopped:
            m = self.gpu
            m.log.append(LogEntry(m.env.now, s.c.index, s.iteration, LogKind.DEPART))
            s.departed = True
            m.stop(s)

    def arrived(self, s: JobState) -> None:
        self.bounds.arrived(s)

    def left(self, s: JobState) -> None:
        self.bounds.left(s)

    def iteration_starts(self, s: JobState, it: int) -> None:
        """The boundary before iteration `it`: a pending plan change, the
        iteration's jittered durations (NOTE [ Usage and jitter ])."""
        self.bounds.starts(s, it)
        if self.jitter:
            sigma = self.jitter
            base = np.asarray(s.c.durations)
            z = self.rngs[s.c.index].standard_normal(len(base))
            s.dur = np.round(base * np.exp(sigma * z - sigma * sigma / 2), 3).tolist()
        else:
            s.dur = s.c.durations

    def iteration_ended(self, s: JobState, it: int) -> None:
        c = s.c
        if c.iterations == UNBOUNDED and s.iter_end_us[-1] <= s.iter_start_us[-1]:
            raise SimError(
                f"job {c.index} ({c.name}): an iteration takes no time, so it never reaches "
                "its departure; give it a number of iterations"
            )
        self.bounds.ended(s, it)
        self.done += 1
        if self.progress is not None:
            self.progress(self.done)


def check_jitter(jitter: float) -> float:
    if (
        not isinstance(jitter, int | float)
        or isinstance(jitter, bool)
        or not math.isfinite(jitter)
        or not 0 <= jitter <= MAX_JITTER
    ):
        raise SimError(f"jitter={jitter!r} must be a sigma in [0, {MAX_JITTER:g}]")
    return float(jitter)

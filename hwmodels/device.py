"""What the device costs: op durations and copy times, in one place.

A `DeviceModel` is a hardware profile, a latency model, the number of copy
lanes and a per-transfer cost on the compute stream. Planners, bounds, the
CP-SAT model and the simulator all take one, so an op lasts as long, and a
copy holds its lane as long, wherever it is costed; `memplan.validate`
measures one on the replay device.

Units: `TimeUnit` scales seconds. Op durations follow one rounding rule
(NOTE [ One rounding rule ]); copy times are exact (a caller that needs
integer ticks, such as CP-SAT, rounds them up itself).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

import numpy as np
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.latency import LatencyModel
from memplan.hwmodels.opclass import OpClass, classify
from memplan.hwmodels.profile import Hardware
from memplan.traces.model import Trace


class Direction(enum.Enum):
    """Which way a copy goes: host to device or device to host."""

    H2D = "h2d"
    D2H = "d2h"


class TimeUnit(enum.Enum):
    """A unit of time, valued by how many of it make one second."""

    S = 1.0
    US = 1e6
    NS = 1e9


# NOTE [ One rounding rule ]
# Latency models predict seconds as float64. Every consumer rounds a duration
# to 1 ns once, in microseconds (`np.round(us, 3)`), and converts from there:
# the simulator adds microseconds, CP-SAT counts whole nanoseconds, bounds
# sum seconds. Rounding once, in one unit, keeps the planners' predicted
# timeline of one job equal to the simulator's to the last bit, and the
# CP-SAT objective equal to the simulated time.


@dataclass(frozen=True, slots=True)
class DeviceModel:
    """A GPU as planners and the simulator cost it.

    `lanes`: 1 = one copy lane shared by both directions, 2 = one per
    direction (full duplex; H2D slowed by `hw.h2d_duplex_factor` while a D2H
    copy runs). `extra_per_transfer_s`: seconds the compute stream spends
    issuing each planned copy (measured on a replay device; 0 on a profile)."""

    hw: Hardware
    latency: LatencyModel
    lanes: int = 1
    extra_per_transfer_s: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.lanes, bool) or self.lanes not in (1, 2):
            raise LatencyError(f"lanes={self.lanes!r} must be 1 (shared) or 2 (one per direction)")
        x = self.extra_per_transfer_s
        if not isinstance(x, int | float) or not math.isfinite(x) or x < 0:
            raise LatencyError(f"extra_per_transfer_s={x!r} must be a finite number >= 0")

    # ---- compute ------------------------------------------------------------------
    # NOTE [ Usage under a compute queue ]
    # `usage` (LatencyModel.predict_all) is a time share: a model stretches an op
    # by 1 / (1 - usage) because the device is shared while the op runs. The
    # simulator (and the planners, which replay its timing) model that sharing
    # explicitly: kernels of all jobs queue FIFO on one compute resource and each
    # holds the device alone while it runs. Passing 1 - 1/n as the usage there
    # would count the sharing twice -- n jobs would each run about n^2 times
    # slower per iteration instead of n times (docs/latency.md). So a queued
    # kernel is predicted at the usage it sees while it holds the device: none
    # from the other jobs; `op_durations` takes only load from outside the
    # modelled jobs.
    def op_durations(
        self, trace: Trace, unit: TimeUnit = TimeUnit.US, *, usage: float = 0.0
    ) -> np.ndarray:
        """float64[n_ops]: each op's predicted duration in `unit`, rounded to
        1 ns (NOTE [ One rounding rule ]). `usage` is load from outside the
        modelled jobs. LatencyError if the model returns anything but one
        finite duration >= 0 per op."""
        s = np.asarray(self.latency.predict_all(trace, self.hw, usage), np.float64)
        if s.shape != (trace.n_ops,) or not np.isfinite(s).all() or (s < 0).any():
            raise LatencyError(
                f"latency model {self.latency.name!r} returned bad durations for "
                f"{trace.meta.model or 'the trace'} (need {trace.n_ops} finite values >= 0)"
            )
        us = np.round(s * 1e6, 3)
        if unit is TimeUnit.US:
            return us
        if unit is TimeUnit.NS:
            return np.rint(us * 1e3)
        return us * 1e-6

    # ---- copies -------------------------------------------------------------------
    @property
    def fixed_s(self) -> float:
        """Seconds every copy holds its lane before its bytes move."""
        return self.hw.transfer_fixed_s

    def bandwidth(self, direction: Direction, *, duplex: bool = False) -> float:
        """Bytes/s of one copy; `duplex`: an H2D copy while a D2H copy runs on
        the other lane (only with two lanes)."""
        if direction is Direction.H2D:
            bw = self.hw.h2d_bytes_per_s
            if duplex and self.lanes == 2:
                bw *= self.hw.h2d_duplex_factor
            return bw
        if direction is Direction.D2H:
            return self.hw.d2h_bytes_per_s
        raise LatencyError(f"direction={direction!r} must be a Direction")

    def copy_time(
        self,
        nbytes: int | np.ndarray,
        direction: Direction,
        unit: TimeUnit = TimeUnit.US,
        *,
        duplex: bool = False,
    ) -> float | np.ndarray:
        """How long one copy of `nbytes` holds its lane, in `unit`: the fixed
        cost plus bytes over the bandwidth (`duplex`: see `bandwidth`). An
        array of sizes gives an array of times."""
        scale = unit.value
        bw = self.bandwidth(direction, duplex=duplex)
        if isinstance(nbytes, int | np.integer):  # hot paths: one size, no numpy array
            return self.fixed_s * scale + float(nbytes) * scale / bw
        t = self.fixed_s * scale + np.asarray(nbytes, np.float64) * scale / bw
        return float(t) if np.ndim(t) == 0 else t

    def transfer_cost(self, unit: TimeUnit = TimeUnit.US) -> float:
        """`extra_per_transfer_s` in `unit`: compute-stream time per planned copy."""
        return self.extra_per_transfer_s * unit.value


# NOTE [ Workspaces ]
# An op's workspace is device memory it takes for its own duration beside
# its inputs and outputs. The op's own `workspace_bytes` from its trace wins
# (a capture that recorded it); an op without one gets its profile's estimate
# for its class -- `conv_workspace_bytes` for convolutions (cuDNN),
# `matmul_workspace_bytes` for matmuls (cuBLAS) -- and every other op none.
# PyTorch keeps the cuBLAS workspace per handle and stream once made, so
# counting it per matmul misses it between matmuls: at most one workspace.
# The analytic bounds count the trace's own (`op_workspace_bytes(trace)`,
# planners/analysis/bounds.py `working_sets`), which the estimates only add
# to; the simulator allocates these with an allocator model (sim/job.py).
def op_workspace_bytes(trace: Trace, hw: Hardware | None = None) -> np.ndarray:
    """int64[n_ops]: each op's workspace bytes (NOTE [ Workspaces ]): its
    trace's, or with `hw` its class's estimate where the trace has none."""
    ws = np.fromiter((op.workspace_bytes for op in trace.ops), np.int64, trace.n_ops)
    if hw is None or not (hw.conv_workspace_bytes or hw.matmul_workspace_bytes):
        return ws
    per_class = {OpClass.CONV: hw.conv_workspace_bytes, OpClass.MATMUL: hw.matmul_workspace_bytes}
    for i, op in enumerate(trace.ops):
        if not ws[i]:
            ws[i] = per_class.get(classify(op.target), 0)
    return ws

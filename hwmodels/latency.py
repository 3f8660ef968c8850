"""Latency models: how long an op takes on a device.

One interface for all: `predict(op, trace, hw, usage=0.0) -> seconds` and its
vectorised form `predict_all(trace, hw, usage=0.0) -> float64[n_ops]`, which
planners call on whole traces. `usage` is the fraction of the device busy
with other work (0 = alone, 1 = fully shared).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hwmodels.errors import LatencyError
from hwmodels.profile import Hardware
from traces.model import Op, Trace


class LatencyModel:
    """Base class. Subclasses implement `predict_all`; `predict` defaults to it."""

    name = "latency"

    def predict_all(self, trace: Trace, hw: Hardware, usage: float = 0.0) -> np.ndarray:
        raise NotImplementedError

    def predict(self, op: Op, trace: Trace, hw: Hardware, usage: float = 0.0) -> float:
        return float(self.predict_all(trace, hw, usage)[op.id])


class Fixed(LatencyModel):
    """Given durations, one per op, in seconds: for hand-worked tests and for
    replaying latencies measured elsewhere. Ignores `usage`."""

    name = "fixed"

    def __init__(self, durations_s: Sequence[float] | np.ndarray):
        self.durations_s = np.asarray(durations_s, dtype=np.float64)
        if (self.durations_s < 0).any():
            raise LatencyError("Fixed: durations must be >= 0 seconds")

    def predict_all(self, trace: Trace, hw: Hardware, usage: float = 0.0) -> np.ndarray:
        if len(self.durations_s) != trace.n_ops:
            raise LatencyError(
                f"Fixed: {len(self.durations_s)} durations for a trace of {trace.n_ops} ops"
            )
        return self.durations_s

    def predict(self, op: Op, trace: Trace, hw: Hardware, usage: float = 0.0) -> float:
        return float(self.durations_s[op.id])


class Measured(LatencyModel):
    """The trace's own measured durations (`Op.duration_us`)."""

    name = "measured"

    def predict_all(self, trace: Trace, hw: Hardware, usage: float = 0.0) -> np.ndarray:
        out = np.empty(trace.n_ops, np.float64)
        for op in trace.ops:
            if op.duration_us is None:
                raise LatencyError(
                    f"measured latency: ops[{op.id}] ({op.target}) has no duration; "
                    f"capture with --measure on a real device, or use --latency roofline"
                )
            out[op.id] = op.duration_us * 1e-6
        return out

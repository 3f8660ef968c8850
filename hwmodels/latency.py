"""Latency models: how long an op takes on a device.

One interface for all: `predict(op, trace, hw, usage=0.0) -> seconds` and its
vectorised form `predict_all(trace, hw, usage=0.0) -> float64[n_ops]`, which
planners call on whole traces, and `predict_ops(trace, hw, ops, usage)` for
chosen ops each under its own usage. `usage` is the share of the device's
time other work takes while the op runs (0 = alone); see NOTE [ Usage ].
"""

from __future__ import annotations

import abc
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.features import DTYPE_NAMES, op_costs, single_op_cost
from memplan.hwmodels.opclass import OP_CLASSES, OpClass
from memplan.hwmodels.profile import Hardware
from memplan.traces.model import Op, Trace


class LatencyModel(abc.ABC):
    """Base class. Subclasses implement `predict_all`; `predict` defaults to it."""

    name = "latency"

    @abc.abstractmethod
    def predict_all(self, trace: Trace, hw: Hardware, usage: float = 0.0) -> np.ndarray:
        """Seconds per op of `trace` on `hw` at `usage` (float64[n_ops])."""

    def predict(self, op: Op, trace: Trace, hw: Hardware, usage: float = 0.0) -> float:
        return float(self.predict_all(trace, hw, usage)[op.id])

    def predict_ops(
        self, trace: Trace, hw: Hardware, ops: np.ndarray, usage: np.ndarray
    ) -> np.ndarray:
        """Seconds for `ops[i]` under `usage[i]` (one `predict_all` per distinct usage)."""
        ops = np.asarray(ops, np.int64)
        usage = np.broadcast_to(np.asarray(usage, np.float64), ops.shape)
        out = np.empty(len(ops), np.float64)
        for u in np.unique(usage):
            sel = usage == u
            out[sel] = self.predict_all(trace, hw, float(u))[ops[sel]]
        return out


# NOTE [ Usage ]
# TENSILE feeds its predictor the device's current utilisation. Here `usage`
# is the share of the device's time other work takes while an op runs, so an
# op that needs t seconds alone gets (1 - usage) of the device and takes
# t / (1 - usage) on a perfectly time-shared device (`usage_stretch`). The
# stretch is capped at usage = MAX_USAGE (10x): a device fully taken by others
# would never finish anything. On CPU this is what the microbenchmark
# observes (NOTE [ Observed usage ] in `hwmodels.microbench`); the MLP learns
# the real curve and uses this one only beyond the usage it was trained on.
MAX_USAGE = 0.9


def usage_stretch(usage: float | np.ndarray) -> float | np.ndarray:
    """1 / (1 - usage), usage capped at `MAX_USAGE`."""
    return 1.0 / (1.0 - np.minimum(usage, MAX_USAGE))


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


def check_usage(usage: float) -> float:
    """`usage` must be a fraction in [0, 1]; one-line LatencyError otherwise."""
    if not isinstance(usage, int | float) or not 0.0 <= float(usage) <= 1.0:
        raise LatencyError(f"usage={usage!r} must be a fraction of the device in [0, 1]")
    return float(usage)


# NOTE [ Roofline assumptions ]
# An estimate, not a measurement. Per op:
#     t = (launch + max(flops / (peak[dtype] * eff[cls]), bytes / (bw * eff[cls]))) * stretch(usage)
# - FLOPs are the trace's (torch.utils.flop_counter), or an analytic count for conv/matmul
#   ops without one; other ops are memory-bound unless given.
# - bytes: each distinct view read and written once (a lower bound on traffic).
# - `eff[cls]`: the fraction of peak an op class reaches (cuDNN convs ~50%, GEMMs ~70%,
#   bandwidth-bound 50-70%); a profile's [roofline_efficiency] overrides (cpu-local's fitted).
# - fp32 convs run on TF32 where the profile lists `tfloat32`, fp32 matmuls do not (both
#   options); `usage` stretches the op (NOTE [ Usage ]); VIEW ops cost 0.
# - Launch overhead is per kernel and never overlaps (eager, one stream, never host-starved).
# Full text: docs/notes.md, "Roofline assumptions".

DEFAULT_EFFICIENCY: dict[OpClass, float] = {
    OpClass.CONV: 0.5,
    OpClass.MATMUL: 0.7,
    OpClass.NORM: 0.6,
    OpClass.ELEMENTWISE: 0.7,
    OpClass.REDUCTION: 0.5,
    OpClass.OPTIMIZER: 0.7,
    OpClass.OTHER: 0.5,
    OpClass.VIEW: 1.0,
}


@dataclass(frozen=True, slots=True)
class RooflineOptions:
    """`efficiency` per op class (a profile's table wins over it); TF32 use for
    float32 convs and matmuls on profiles that list a `tfloat32` rate."""

    efficiency: dict[OpClass, float] = field(default_factory=lambda: dict(DEFAULT_EFFICIENCY))
    tf32_conv: bool = True
    tf32_matmul: bool = False


class Roofline(LatencyModel):
    """FLOPs and bytes against the profile's peaks (see NOTE [ Roofline assumptions ])."""

    name = "roofline"

    def __init__(self, options: RooflineOptions | None = None):
        self.options = options or RooflineOptions()

    def efficiency(self, hw: Hardware) -> dict[OpClass, float]:
        eff = dict(self.options.efficiency)
        for key, v in hw.roofline_efficiency.items():
            try:
                eff[OpClass(key)] = v
            except ValueError:
                known = ", ".join(c.value for c in OP_CLASSES)
                raise LatencyError(
                    f"hardware {hw.name}: roofline_efficiency.{key}: unknown op class "
                    f"(known: {known})"
                ) from None
        return eff

    def _peak(self, hw: Hardware, dtype: str, cls: OpClass) -> float:
        tf32 = (cls is OpClass.CONV and self.options.tf32_conv) or (
            cls is OpClass.MATMUL and self.options.tf32_matmul
        )
        if dtype == "float32" and tf32 and "tfloat32" in hw.peak_flops:
            return hw.peak_flops["tfloat32"]
        return hw.flops_for(_FLOPS_KEY.get(dtype, dtype))

    def predict_all(self, trace: Trace, hw: Hardware, usage: float = 0.0) -> np.ndarray:
        usage = check_usage(usage)
        return self._alone(trace, hw) * usage_stretch(usage)

    def predict_ops(
        self, trace: Trace, hw: Hardware, ops: np.ndarray, usage: np.ndarray
    ) -> np.ndarray:
        ops = np.asarray(ops, np.int64)
        usage = np.broadcast_to(np.asarray(usage, np.float64), ops.shape)
        if len(usage) and (usage.min() < 0 or usage.max() > 1):
            raise LatencyError("usage values must be fractions of the device in [0, 1]")
        return self._alone(trace, hw)[ops] * usage_stretch(usage)

    def _alone(self, trace: Trace, hw: Hardware) -> np.ndarray:
        c = op_costs(trace)
        eff_by_cls = self.efficiency(hw)
        eff = np.array([eff_by_cls[k] for k in OP_CLASSES])[c.cls]
        # peak FLOP/s per (class, dtype) pair: a small table, then one gather
        peak_tab = np.array(
            [[self._peak(hw, d, k) for d in DTYPE_NAMES] for k in OP_CLASSES], np.float64
        )
        peak = peak_tab[c.cls, c.dtype]
        compute = c.flops / (peak * eff)
        memory = (c.bytes_read + c.bytes_written) / (hw.mem_bw_bytes_per_s * eff)
        t = hw.launch_overhead_s + np.maximum(compute, memory)
        t[c.cls == _VIEW_INDEX] = 0.0
        return t

    def predict(self, op: Op, trace: Trace, hw: Hardware, usage: float = 0.0) -> float:
        usage = check_usage(usage)
        cls, flops, rd, wr, dtype = single_op_cost(op, trace)
        if cls is OpClass.VIEW:
            return 0.0
        eff = self.efficiency(hw)[cls]
        compute = flops / (self._peak(hw, dtype, cls) * eff)
        memory = (rd + wr) / (hw.mem_bw_bytes_per_s * eff)
        return (hw.launch_overhead_s + max(compute, memory)) * float(usage_stretch(usage))


_VIEW_INDEX = OP_CLASSES.index(OpClass.VIEW)
_FLOPS_KEY = {"float8_e4m3fn": "float8", "float8_e5m2": "float8"}


# NOTE [ EWMA plan updating ]
# TENSILE §IV-E: a plan is built from predicted latencies; while the job runs,
# each observed latency x of op i folds into its estimate,
#     s_i <- alpha * x + (1 - alpha) * s_i      (s_i starts at the base model's),
# and a re-plan is due when the average latency change rate |s' - s| / s
# exceeds a threshold, s being the sum of latencies the current plan was made
# from (`mark_planned`) and s' the current sum. Ops never observed keep the
# base model's prediction (at the usage asked for). State is per trace (one
# job on one device).


@dataclass(slots=True)
class _EWMAState:
    estimate: np.ndarray
    observed: np.ndarray
    planned_sum_s: float | None = None


class EWMA(LatencyModel):
    """Folds observed latencies into a base model (see NOTE [ EWMA plan updating ])."""

    name = "ewma"

    def __init__(self, base: LatencyModel, alpha: float = 0.3):
        if not isinstance(alpha, int | float) or not 0.0 < alpha <= 1.0:
            raise LatencyError(f"EWMA: alpha={alpha!r} must be in (0, 1]")
        self.base = base
        self.alpha = float(alpha)
        self._state: weakref.WeakKeyDictionary[Trace, _EWMAState] = weakref.WeakKeyDictionary()

    def observe(
        self,
        trace: Trace,
        hw: Hardware,
        op_ids: int | Sequence[int] | np.ndarray,
        latencies_s: float | Sequence[float] | np.ndarray,
        usage: float = 0.0,
    ) -> None:
        """Fold measured latencies (seconds) of `op_ids` into their estimates,
        in order (an op observed twice in one call is folded twice)."""
        ids = np.atleast_1d(np.asarray(op_ids, np.int64))
        lat = np.atleast_1d(np.asarray(latencies_s, np.float64))
        if ids.shape != lat.shape:
            raise LatencyError(f"EWMA: {len(ids)} op ids but {len(lat)} latencies")
        if len(ids) and (ids.min() < 0 or ids.max() >= trace.n_ops):
            raise LatencyError(f"EWMA: op ids must be in 0..{trace.n_ops - 1}")
        if not np.isfinite(lat).all() or (lat < 0).any():
            raise LatencyError("EWMA: latencies must be finite and >= 0 seconds")
        st = self._state.get(trace)
        if st is None:
            est = np.array(self.base.predict_all(trace, hw, usage), np.float64, copy=True)
            st = self._state[trace] = _EWMAState(est, np.zeros(trace.n_ops, bool))
        a = self.alpha
        if len(np.unique(ids)) == len(ids):
            st.estimate[ids] = a * lat + (1.0 - a) * st.estimate[ids]
        else:
            for i, x in zip(ids, lat, strict=True):
                st.estimate[i] = a * x + (1.0 - a) * st.estimate[i]
        st.observed[ids] = True

    def observe_iteration(self, trace: Trace, hw: Hardware, latencies_s: np.ndarray) -> None:
        """Fold one whole iteration's measured latencies (one per op)."""
        self.observe(trace, hw, np.arange(trace.n_ops), latencies_s)

    def predict_all(self, trace: Trace, hw: Hardware, usage: float = 0.0) -> np.ndarray:
        out = np.array(self.base.predict_all(trace, hw, usage), np.float64, copy=True)
        st = self._state.get(trace)
        if st is not None:
            out[st.observed] = st.estimate[st.observed]
        return out

    def predict(self, op: Op, trace: Trace, hw: Hardware, usage: float = 0.0) -> float:
        st = self._state.get(trace)
        if st is not None and st.observed[op.id]:
            return float(st.estimate[op.id])
        return self.base.predict(op, trace, hw, usage)

    def mark_planned(self, trace: Trace, hw: Hardware, usage: float = 0.0) -> float:
        """Record the latency sum a new plan is built from; returns it (seconds)."""
        s = float(self.predict_all(trace, hw, usage).sum())
        st = self._state.get(trace)
        if st is None:
            st = self._state[trace] = _EWMAState(
                self.predict_all(trace, hw, usage), np.zeros(trace.n_ops, bool)
            )
        st.planned_sum_s = s
        return s

    def change_rate(self, trace: Trace, hw: Hardware, usage: float = 0.0) -> float:
        """|s' - s| / s: s the sum the plan was made from (`mark_planned`, else
        the base model's), s' the current sum of estimates."""
        st = self._state.get(trace)
        s = st.planned_sum_s if st is not None else None
        if s is None:
            s = float(self.base.predict_all(trace, hw, usage).sum())
        s_new = float(self.predict_all(trace, hw, usage).sum())
        if s <= 0:
            return 0.0 if s_new == s else float("inf")
        return abs(s_new - s) / s

    def is_stale(self, trace: Trace, hw: Hardware, threshold: float, usage: float = 0.0) -> bool:
        """True when the change rate exceeds `threshold`: time to re-plan."""
        return self.change_rate(trace, hw, usage) > threshold

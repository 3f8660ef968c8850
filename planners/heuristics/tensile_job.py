"""TENSILE's per-job planning state, and how its events are written out."""

from __future__ import annotations

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction
from memplan.planners.analysis import MemoryState, Timeline, access_table
from memplan.planners.core.plan import Event, Recompute, Release, SwapIn, SwapOut
from memplan.planners.heuristics.tensile_options import TensileOptions
from memplan.planners.heuristics.vanilla import release_only_plan
from memplan.traces.model import Trace


class JobState:
    """Per-job planning state."""

    def __init__(
        self, j: int, trace: Trace, tl: Timeline, device: DeviceModel, opts: TensileOptions
    ):
        self.j = j
        self.trace = trace
        self.tl = tl
        self.n = trace.n_ops
        self.table = access_table(trace)
        self.state = MemoryState(
            trace, "liveness", count_first_iteration=opts.count_first_iteration
        )
        self.events: list[Event] = list(release_only_plan(trace).events)
        # with two lanes an H2D copy is costed at the duplex rate, as in CP-SAT
        self.d_out = np.asarray(device.copy_time(trace.nbytes, Direction.D2H), np.float64)
        self.d_in = np.asarray(
            device.copy_time(trace.nbytes, Direction.H2D, duplex=True), np.float64
        )
        self.durations = tl.end_us - tl.start_us
        t = self.table
        n_acc = len(t.ops)
        self.acc_buffer = np.repeat(np.arange(trace.n_buffers, dtype=np.int64), np.diff(t.ptr))
        self.acc_key = self.acc_buffer * (self.n + 1) + t.ops
        # per gap, keyed by the global index of the access that opens it:
        # the hole last computed for it (NaN: never), and whether it is used
        self.hole_te = np.full(n_acc, np.nan)
        self.hole_ts = np.full(n_acc, np.nan)
        self.done = np.zeros(n_acc, bool)
        self.out_gaps: dict[int, list[int]] = {}  # buffer -> gaps with a swap-out
        self.swaps = 0

    # unrolled op times: op index x may be >= n (the next iteration)
    def t_end(self, x: int) -> float:
        return float(self.tl.end_us[x % self.n]) + (x // self.n) * self.tl.period_us

    def t_ready(self, x: int) -> float:
        return self.tl.unrolled_ready(x % self.n, x // self.n)


def us(x: float) -> float:
    """A delay in microseconds, rounded to 1 ps so that plan files stay short
    and never negative."""
    return max(0.0, round(x, 6))


KIND_ORDER = {Release: 0, SwapOut: 1, SwapIn: 2, Recompute: 3}


def event_order(ev: Event) -> tuple:
    after = getattr(ev, "after_op", None)
    if after is None:
        return (1, ev.before_op, 0, 0.0, ev.buffer)  # type: ignore[union-attr]
    return (0, after, KIND_ORDER[type(ev)], getattr(ev, "delay_us", 0.0), ev.buffer)

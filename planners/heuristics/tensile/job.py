"""TENSILE's per-job planning state, and how its events are written out."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction
from memplan.planners.analysis import MemoryState, PeakAnalysis, Timeline, access_table
from memplan.planners.core.plan import Event, Recompute, Release, SwapIn, SwapOut
from memplan.planners.heuristics.tensile.options import TensileOptions
from memplan.planners.heuristics.vanilla import release_only_plan
from memplan.traces.model import Trace


class JobPlanning:
    """One job as TENSILE plans it: its op-grid memory, accesses and copy
    times, the events chosen so far and the hole last found per gap."""

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
        # copy times per buffer (us), as lists for the rounds' scalar look-ups;
        # with two lanes an H2D copy is costed at the duplex rate, as in CP-SAT
        self.d_out: list[float] = np.asarray(
            device.copy_time(trace.nbytes, Direction.D2H), np.float64
        ).tolist()
        self.d_in_us = np.asarray(
            device.copy_time(trace.nbytes, Direction.H2D, duplex=True), np.float64
        )
        self.d_in: list[float] = self.d_in_us.tolist()
        # `t_ready(x)` of every unrolled op index 0 <= x < 2n, for array look-ups
        later = np.concatenate([[tl.iteration_start(1)], tl.end_us[:-1] + tl.period_us])
        self.unrolled_ready_us = np.concatenate([tl.ready_us, later])[: 2 * self.n]
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
        return self.tl.unrolled_end(x % self.n, x // self.n)

    def t_ready(self, x: int) -> float:
        return self.tl.unrolled_ready(x % self.n, x // self.n)


class PickOrder:
    """The buffers of all jobs in TENSILE's pick order (largest first; ties:
    lower job, then lower buffer), built once (NOTE [ Candidates in pick
    order ] in tensile/planner.py)."""

    def __init__(self, traces: Sequence[Trace]):
        counts = [t.n_buffers for t in traces]
        self.offset = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.job = np.repeat(np.arange(len(traces), dtype=np.int64), counts)
        self.buffer = np.concatenate([np.arange(k, dtype=np.int64) for k in counts])
        size = np.concatenate([t.nbytes for t in traces]) if traces else np.zeros(0, np.int64)
        self.order = np.lexsort((self.buffer, self.job, -size))

    def resident_blocks(
        self, pa: PeakAnalysis, jobs: Sequence[JobPlanning]
    ) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """(job, buffer) of every buffer resident at its job's peak op and not
        accessed by it, in pick order, found block by block along the order
        (256, 512, ... buffers of all jobs): a round that stops early looks
        only at the head of the order. Jobs without ops have none."""
        peaks = [(jb, pa.job_peak_op[jb.j]) for jb in jobs if pa.job_peak_op[jb.j] >= 0]
        used = {jb.j: jb.trace.op_accesses(p) for jb, p in peaks}
        at, size = 0, 256
        while at < len(self.order) and peaks:
            picked = self.order[at : at + size]
            job, buf = self.job[picked], self.buffer[picked]
            keep = np.zeros(len(picked), bool)
            for jb, p in peaks:
                mine = np.flatnonzero(job == jb.j) if len(jobs) > 1 else np.arange(len(job))
                bufs = buf[mine]
                ok = jb.state.resident_among(p, bufs)
                for b in used[jb.j].tolist():  # a handful: cheaper than np.isin
                    ok &= bufs != b
                keep[mine] = ok
            yield job[keep], buf[keep]
            at, size = at + size, 2 * size


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

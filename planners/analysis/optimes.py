"""When each op of a job runs (what a copy costs is `DeviceModel.copy_time`).

TENSILE's time model (§III-A), shared by every planner; numpy over the
trace's cached arrays:

- `predict_timelines(traces, device)`: per job a `Timeline` of op start
  and end times (microseconds) as the simulator will run them together
  (NOTE [ Jobs on one GPU ]); `predict_timeline` for one job alone.
- `Timeline.trigger`: the (after_op, delay_us, iteration) a plan event uses
  to fire at a given time.

Times are microseconds throughout (what `delay_us` in a plan is).
"""

from __future__ import annotations

import bisect
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from memplan.hwmodels.device import DeviceModel, TimeUnit
from memplan.hwmodels.errors import LatencyError
from memplan.planners.core.errors import PlanError
from memplan.traces.model import Trace

# Slack (microseconds) kept between events whose order must not depend on
# floating-point ties: the simulator rounds op durations to 1 ns.
EPS_US = 1e-3


# NOTE [ Jobs on one GPU ]
# Planners see traces, not arrival times: every job is taken to arrive at
# time 0 and to run until the end, as `sim.simulate` runs jobs by default.
# The simulator predicts each op at usage 0 (hwmodels
# NOTE [ Usage under a compute queue ]) and queues the kernels of all jobs
# FIFO on one compute resource, so n jobs that are always ready interleave op
# by op.
# `predict_timelines` replays exactly that queue (a heap of request times,
# ties in the order the requests were made) until every job has run two
# iterations, and keeps iteration 0 of each; a job's `period_us` is the
# distance between the starts of its op 0 in iterations 0 and 1. Planning
# assumes iterations repeat with that period: exact for one job and for
# identical jobs that start together (their plans simulate with no stall and
# exactly the predicted per-job peaks). Jobs of different lengths drift
# against each other, and the one that finishes last runs its final
# iterations alone (its kernels queue behind no other job's: iterations
# shorter than planned), so their copies
# can collide or arrive late (a measured case: docs/planners.md). That is the
# limit of any fixed schedule for asynchronous jobs, and why TENSILE caps each
# job's share of swaps. Durations are rounded to 1 ns as the simulator rounds
# them, so one job's plan times match it exactly.
# A job is *ready* for op i when op i-1 ends (op 0: when its iteration
# starts); in the simulator it then waits for the op's swap-ins and
# allocates the op's outputs, and only then queues for compute. So a swap-in
# hides only if it ends by the op's ready time, and a swap-out lowers an op's
# memory only if its copy ends by then; alone on the device, ready = start.


@dataclass(frozen=True, eq=False)
class Timeline:
    """Predicted times of one iteration of one job, in microseconds from the
    start of that iteration: op i runs [start_us[i], end_us[i]). Iteration r
    runs the same ops shifted by r * `period_us` (see NOTE [ Jobs on one GPU ])."""

    start_us: np.ndarray
    end_us: np.ndarray
    period_us: float

    @property
    def n_ops(self) -> int:
        return len(self.start_us)

    @cached_property
    def ready_us(self) -> np.ndarray:
        """float64[n_ops]: when the job is ready for op i in iteration 0 (the
        end of op i-1; 0 for op 0). See NOTE [ Jobs on one GPU ]."""
        out = np.empty_like(self.start_us)
        if len(out):
            out[0] = 0.0
            out[1:] = self.end_us[:-1]
        return out

    @cached_property
    def _ready_later_us(self) -> np.ndarray:
        """`ready_us` of iterations >= 1, minus their shift: op 0 is ready
        when the previous iteration's last op ends."""
        out = self.ready_us.copy()
        if len(out):
            out[0] = float(self.end_us[-1]) - self.period_us
        return out

    # Python lists of the arrays, for the scalar look-ups planners make per
    # event (bisect on a list and list indexing beat numpy calls on one value)
    @cached_property
    def _ends(self) -> list[float]:
        return self.end_us.tolist()

    @cached_property
    def _readies(self) -> tuple[list[float], list[float]]:
        return self.ready_us.tolist(), self._ready_later_us.tolist()

    def unrolled_ready(self, op: int, iteration: int = 0) -> float:
        """When the job is ready for `op` of `iteration` (unrolled)."""
        if op == 0:
            return self.iteration_start(iteration)
        return self._ends[op - 1] + iteration * self.period_us

    @property
    def duration_us(self) -> np.ndarray:
        return self.end_us - self.start_us

    def unrolled_start(self, op: int, iteration: int = 0) -> float:
        return float(self.start_us[op]) + iteration * self.period_us

    def unrolled_end(self, op: int, iteration: int = 0) -> float:
        return self._ends[op] + iteration * self.period_us

    def iteration_start(self, iteration: int) -> float:
        """When `after_op=-1` of `iteration` fires: iteration 0 starts at 0,
        iteration r >= 1 when the last op of iteration r - 1 ends."""
        if iteration == 0 or self.n_ops == 0:
            return iteration * self.period_us
        return float(self.end_us[-1]) + (iteration - 1) * self.period_us

    def ops_within(self, t0_us: float, t1_us: float) -> list[tuple[int, int, int]]:
        """Ops whose whole span from ready to end lies inside [t0, t1]
        (unrolled times, iterations 0 and 1), as (first op, last op,
        iteration) ranges, ends inclusive."""
        out = []
        ends = self._ends
        for r, ready in enumerate(self._readies):
            shift = r * self.period_us
            lo = bisect.bisect_left(ready, t0_us - shift)
            hi = bisect.bisect_right(ends, t1_us - shift) - 1
            if lo <= hi:
                out.append((lo, hi, r))
        return out

    def trigger(self, t_us: float, not_before_us: float = -math.inf) -> tuple[int, float, int]:
        """The (after_op, delay_us, iteration) of the latest trigger at or
        before unrolled time `t_us` (iterations 0 and 1): the end of an op,
        or the start of an iteration (after_op -1). Raise ValueError if that
        trigger is earlier than `not_before_us`."""
        for r in (1, 0):
            shift = r * self.period_us
            i = int(np.searchsorted(self.end_us, t_us - shift + 1e-9, "right")) - 1
            if i >= 0:
                t, op = float(self.end_us[i]) + shift, i
            elif self.iteration_start(r) <= t_us + 1e-9:
                t, op = self.iteration_start(r), -1
            else:
                continue
            if t < not_before_us:
                break
            return op, max(0.0, t_us - t), r
        raise ValueError(f"no trigger at or before t={t_us} us and after {not_before_us} us")


def op_durations_us(trace: Trace, device: DeviceModel, usage: float = 0.0) -> np.ndarray:
    """float64[n_ops]: predicted durations in microseconds, rounded as the
    simulator rounds them (`DeviceModel.op_durations`). PlanError if the
    latency model returns bad values."""
    try:
        return device.op_durations(trace, TimeUnit.US, usage=usage)
    except LatencyError as e:
        raise PlanError(str(e)) from None


def predict_timeline(trace: Trace, device: DeviceModel, *, usage: float = 0.0) -> Timeline:
    """One job alone on the device (or at a given `usage`): ops back to back."""
    return _timeline_from_durations(op_durations_us(trace, device, usage))


def _timeline_from_durations(d: np.ndarray) -> Timeline:
    end = np.cumsum(d)
    start = end - d
    # cumsum's start = end - d can differ from the running sum by an ulp
    start[1:] = end[:-1]
    return Timeline(start, end, float(end[-1]) if len(end) else 0.0)


def predict_timelines(traces: Sequence[Trace], device: DeviceModel) -> tuple[Timeline, ...]:
    """Per job, iteration 0 as the jobs run together (NOTE [ Jobs on one GPU ]):
    every kernel predicted at usage 0 (hwmodels
    NOTE [ Usage under a compute queue ]), the jobs interleaved on the FIFO
    compute queue."""
    durs = [op_durations_us(t, device) for t in traces]
    if len(traces) == 1:
        return (_timeline_from_durations(durs[0]),)
    return tuple(_interleave(durs))


def _interleave(durs: list[np.ndarray]) -> list[Timeline]:
    """FIFO compute shared by jobs that are always ready: replay the queue
    until every job has run two iterations (a job that gets there first
    keeps running, as it would)."""
    lists = [d.tolist() for d in durs]
    n = [len(d) for d in lists]
    starts = [[0.0] * (2 * k + 1) for k in n]
    ends = [[0.0] * (2 * k + 1) for k in n]
    # (request time, request order, job, op index unrolled over iterations):
    # the compute queue is FIFO in the order requests are made, and a job
    # asks for its next op the moment its op ends
    heap = [(0.0, j, j, 0) for j in range(len(lists)) if n[j]]
    heapq.heapify(heap)
    free_at, seq = 0.0, len(lists)
    pending = sum(1 for k in n if k)  # jobs still short of two iterations and a start
    while pending:
        t, _, j, k = heapq.heappop(heap)
        s = max(t, free_at)
        e = s + lists[j][k % n[j]]
        if k <= 2 * n[j]:
            starts[j][k], ends[j][k] = s, e
            pending -= k == 2 * n[j]
        free_at = e
        heapq.heappush(heap, (e, seq, j, k + 1))
        seq += 1
    out = []
    for j, k in enumerate(n):
        if k == 0:
            out.append(Timeline(np.zeros(0), np.zeros(0), 0.0))
            continue
        s = np.asarray(starts[j][:k])
        e = np.asarray(ends[j][:k])
        out.append(Timeline(s, e, starts[j][k] - starts[j][0]))
    return out

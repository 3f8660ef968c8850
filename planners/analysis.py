"""What every planner needs to know about its jobs: when each op runs, what a
copy costs, where the memory peaks and which lane time is still free.

This is TENSILE's machinery (§III-A, §IV-B Algorithm 1, §IV-C feasible
intervals), shared by every planner; all of it is numpy over the trace's
cached arrays, built once per plan call and updated in place:

- `predict_timelines(traces, hw, latency)`: per job a `Timeline` of op start
  and end times (microseconds) as the simulator will run them together.
- `transfer_us(hw, nbytes, direction)`: a copy's lane time, fixed cost +
  bytes / bandwidth.
- `AccessTable`: per-buffer access lists (`Trace.buffer_accesses`) with a
  write flag per access, and the gap between two accesses around an op.
- `MemoryState`: one job's residency on the op grid -- lifetimes minus the
  holes that swaps, releases and recomputes cut into them -- and its memory
  curves, updated in place by slice arithmetic as holes are cut.
- `peak_analysis(states, timelines)`: Algorithm 1 over all jobs: the global
  peak, each job's peak op and time, the buffers resident there and the last
  op reading inputs before it.
- `LaneSet`: the PCIe lane timeline(s): free intervals, earliest and latest
  free slot of a given length in a window, booking.
- `memory_of_plan(trace, timeline, plan, hw)`: the `MemoryState` a finished
  plan predicts (for planners that build plans another way, and for tests).

Times are microseconds throughout (what `delay_us` in a plan is), sizes bytes.
"""

from __future__ import annotations

import bisect
import heapq
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from hwmodels.latency import LatencyModel
from hwmodels.profile import Hardware
from planners.errors import PlanError
from planners.plan import Plan, Recompute, Release, SwapIn, SwapOut
from traces.model import MemoryPolicy, Trace

# Slack (microseconds) kept between events whose order must not depend on
# floating-point ties: the simulator rounds op durations to 1 ns.
EPS_US = 1e-3


# ---- jobs --------------------------------------------------------------------
def as_traces(jobs: object) -> tuple[Trace, ...]:
    """The traces of `jobs`: a `Trace`, or a sequence of traces or of objects
    with a `.trace` (such as `sim.Job`; planners never import `sim`)."""
    if isinstance(jobs, Trace):
        return (jobs,)
    if not isinstance(jobs, Sequence) or isinstance(jobs, str | bytes):
        raise PlanError(f"jobs: expected a sequence of traces, got {type(jobs).__name__}")
    out = []
    for j, job in enumerate(jobs):
        t = job if isinstance(job, Trace) else getattr(job, "trace", None)
        if not isinstance(t, Trace):
            raise PlanError(f"jobs[{j}]: expected a Trace (or a job with .trace), got {job!r}")
        out.append(t)
    if not out:
        raise PlanError("jobs: no jobs to plan")
    return tuple(out)


def check_budget(budget_bytes: object) -> int | None:
    """`budget_bytes` must be None or a positive integer; PlanError otherwise."""
    if budget_bytes is None:
        return None
    if isinstance(budget_bytes, bool) or not isinstance(budget_bytes, int) or budget_bytes <= 0:
        raise PlanError(f"budget_bytes={budget_bytes!r} must be a positive number of bytes")
    return budget_bytes


# ---- time ----------------------------------------------------------------------
# NOTE [ Jobs on one GPU ]
# Planners see traces, not arrival times: every job is taken to arrive at
# time 0 and to run until the end, as `sim.simulate` runs jobs by default.
# The simulator (NOTE [ Usage ] in sim/model.py) predicts each op at
# usage = 1 - 1/n_jobs and queues the kernels of all jobs FIFO on one compute
# resource, so n jobs that are always ready interleave op by op.
# `predict_timelines` replays exactly that queue (a heap of request times,
# ties in the order the requests were made) until every job has run two
# iterations, and keeps iteration 0 of each; a job's `period_us` is the
# distance between the starts of its op 0 in iterations 0 and 1. Planning
# assumes iterations repeat with that period: exact for one job and for
# identical jobs that start together (their plans simulate with no stall and
# exactly the predicted per-job peaks). Jobs of different lengths drift
# against each other, and the one that finishes last runs its final
# iterations alone (at usage 0, ops faster than planned), so their copies
# can collide or arrive late: resnet50 + bert_base on rtx-a6000 simulate at
# EOR 1.10 with a global peak 1% above the prediction. That is the limit of
# any fixed schedule for asynchronous jobs, and why TENSILE caps each job's
# share of swaps. Durations are rounded to 1 ns as the simulator rounds
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

    def unrolled_ready(self, op: int, iteration: int = 0) -> float:
        """When the job is ready for `op` of `iteration` (unrolled)."""
        if op == 0:
            return self.iteration_start(iteration)
        return float(self.end_us[op - 1]) + iteration * self.period_us

    @property
    def duration_us(self) -> np.ndarray:
        return self.end_us - self.start_us

    def unrolled_start(self, op: int, iteration: int = 0) -> float:
        return float(self.start_us[op]) + iteration * self.period_us

    def unrolled_end(self, op: int, iteration: int = 0) -> float:
        return float(self.end_us[op]) + iteration * self.period_us

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
        for r in (0, 1):
            shift = r * self.period_us
            ready = self.ready_us if r == 0 else self._ready_later_us
            lo = int(np.searchsorted(ready, t0_us - shift, "left"))
            hi = int(np.searchsorted(self.end_us, t1_us - shift, "right")) - 1
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


def op_durations_us(
    trace: Trace, hw: Hardware, latency: LatencyModel, usage: float = 0.0
) -> np.ndarray:
    """float64[n_ops]: predicted durations in microseconds, rounded to 1 ns
    as the simulator rounds them."""
    s = np.asarray(latency.predict_all(trace, hw, usage), np.float64)
    if s.shape != (trace.n_ops,) or not np.isfinite(s).all() or (s < 0).any():
        raise PlanError(
            f"latency model {latency.name!r} returned bad durations for {trace.meta.model} "
            f"(need {trace.n_ops} finite values >= 0)"
        )
    return np.round(s * 1e6, 3)


def predict_timeline(
    trace: Trace, hw: Hardware, latency: LatencyModel, *, usage: float = 0.0
) -> Timeline:
    """One job alone on the device (or at a given `usage`): ops back to back."""
    return _timeline_from_durations(op_durations_us(trace, hw, latency, usage))


def _timeline_from_durations(d: np.ndarray) -> Timeline:
    end = np.cumsum(d)
    start = end - d
    # cumsum's start = end - d can differ from the running sum by an ulp
    start[1:] = end[:-1]
    return Timeline(start, end, float(end[-1]) if len(end) else 0.0)


def job_usage(n_jobs: int) -> float:
    """The device share other jobs take while `n_jobs` run (sim's NOTE [ Usage ])."""
    return 1.0 - 1.0 / n_jobs


def predict_timelines(
    traces: Sequence[Trace], hw: Hardware, latency: LatencyModel
) -> tuple[Timeline, ...]:
    """Per job, iteration 0 as the jobs run together (NOTE [ Jobs on one GPU ])."""
    usage = job_usage(len(traces))
    durs = [op_durations_us(t, hw, latency, usage) for t in traces]
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


def transfer_us(hw: Hardware, nbytes: int | np.ndarray, direction: str) -> float | np.ndarray:
    """Microseconds one copy holds its lane: fixed cost + bytes / bandwidth
    (as `sim.pcie.Pcie.full_speed_us`). `direction` is "h2d" or "d2h"."""
    if direction == "h2d":
        bw = hw.h2d_bytes_per_s
    elif direction == "d2h":
        bw = hw.d2h_bytes_per_s
    else:
        raise ValueError(f"direction={direction!r} must be 'h2d' or 'd2h'")
    return hw.transfer_fixed_s * 1e6 + np.asarray(nbytes, np.float64) * 1e6 / bw


# ---- accesses -------------------------------------------------------------------
class AccessTable:
    """Per-buffer access lists of one trace: the ops accessing buffer b are
    `ops[ptr[b]:ptr[b+1]]` (ascending), `writes[k]` says whether access k
    writes the buffer. Built once per trace (`access_table`)."""

    __slots__ = ("trace", "ptr", "ops", "writes", "n_ops")

    def __init__(self, trace: Trace):
        self.trace = trace
        self.n_ops = trace.n_ops
        self.ptr, self.ops = trace.buffer_accesses
        wp, wb = trace.writes_csr
        w_op = np.repeat(np.arange(trace.n_ops, dtype=np.int64), np.diff(wp))
        w_key = w_op * max(trace.n_buffers, 1) + wb
        b_of = np.repeat(np.arange(trace.n_buffers, dtype=np.int64), np.diff(self.ptr))
        a_key = self.ops * max(trace.n_buffers, 1) + b_of
        self.writes = np.isin(a_key, w_key)

    def accesses(self, b: int) -> np.ndarray:
        return self.ops[self.ptr[b] : self.ptr[b + 1]]

    def count(self, b: int) -> int:
        return int(self.ptr[b + 1] - self.ptr[b])

    def gap_around(self, b: int, op: int) -> tuple[int, int, int] | None:
        """The gap of `b`'s accesses that strictly contains `op`: (k, prev, next)
        with prev = k-th access < op < next = (k+1)-th access. For a
        persistent buffer the gap after its last access wraps into the next
        iteration: next is then `first access + n_ops` (and if `op` is before
        the first access, prev is `last access - n_ops`). None if `op` is an
        access of `b` or outside its accessed range."""
        acc = self.accesses(b)
        m = len(acc)
        if m == 0:
            return None
        k = int(np.searchsorted(acc, op, "right")) - 1
        if k >= 0 and acc[k] == op:
            return None
        persistent = bool(self.trace.persistent[b])
        if k < 0:
            if not persistent:
                return None
            return m - 1, int(acc[-1]) - self.n_ops, int(acc[0])
        if k == m - 1:
            if not persistent:
                return None
            return k, int(acc[k]), int(acc[0]) + self.n_ops
        return k, int(acc[k]), int(acc[k + 1])

    def written_between(self, b: int, k0: int, k1: int) -> bool:
        """Whether any of `b`'s accesses k0+1 .. k1 (indices into its list) writes it."""
        p = int(self.ptr[b])
        return bool(self.writes[p + k0 + 1 : p + k1 + 1].any())


_ACCESS_TABLES: weakref.WeakKeyDictionary[Trace, AccessTable] = weakref.WeakKeyDictionary()


def access_table(trace: Trace) -> AccessTable:
    """The `AccessTable` of `trace`, built once per trace object."""
    table = _ACCESS_TABLES.get(trace)
    if table is None:
        table = _ACCESS_TABLES[trace] = AccessTable(trace)
    return table


# ---- memory on the op grid -----------------------------------------------------------
# NOTE [ Peak analysis on the op grid ]
# TENSILE's Algorithm 1 walks a time axis of accesses and swap events. We
# evaluate memory per op instead -- bytes resident while op i runs, as
# `Trace.memory_curve` does -- and count a buffer as resident during an op if
# it is on the device at any moment of it: a swap-out frees its bytes for the
# ops that start after the copy ends, a swap-in takes them from the op during
# which its copy starts (the simulator takes H2D bytes when the copy starts,
# not when it ends as the paper's analysis does). So the op-grid peak bounds
# the simulator's peak from above when the timeline is right.
# A job's curve is its lifetimes curve (activity analysis: `liveness`) minus
# its holes. Two curves are kept: `first` for iteration 0 and `steady` for
# every later one. They differ by cross-iteration holes: iteration 0 starts
# with every persistent buffer resident (NOTE [ Cross-iteration swaps ]), so
# the part of a hole that lies in the *next* iteration (a parameter swapped
# out in the optimizer phase, back before its first forward use) only lowers
# `steady`. The simulator's peak counts every iteration, so `peak()` is that
# of `first` unless the state is made with `count_first_iteration=False`.


# Which curves a hole lowers.
FIRST, STEADY, BOTH = 1, 2, 3


class MemoryState:
    """Residency of one job's buffers on the op grid (NOTE [ Peak analysis on
    the op grid ]). Buffers live over `lifetimes(policy)`; `add_hole` takes a
    buffer off the device for a range of ops and updates the curves."""

    def __init__(
        self,
        trace: Trace,
        policy: MemoryPolicy = "liveness",
        *,
        count_first_iteration: bool = True,
    ):
        self.trace = trace
        self.n_ops = trace.n_ops
        self.nbytes = trace.nbytes
        self.start, self.end = trace.lifetimes(policy)
        base = trace.memory_curve(policy)
        self.first = base.copy()
        self.steady = base.copy()
        self.count_first_iteration = count_first_iteration
        self.holes: dict[int, list[tuple[int, int, int]]] = {}
        self.holed = np.zeros(trace.n_buffers, bool)

    @property
    def curve(self) -> np.ndarray:
        """int64[n_ops]: the curve the peak is taken over (`first` or `steady`)."""
        return self.first if self.count_first_iteration else self.steady

    def add_hole(self, b: int, lo: int, hi: int, which: int = BOTH) -> bool:
        """Buffer `b` is off the device while ops lo..hi run (inclusive) in
        iteration 0 (`FIRST`), in later iterations (`STEADY`) or in all
        (`BOTH`). Clipped to b's lifetime; False if nothing is left. Holes of
        one buffer must not overlap."""
        lo = max(lo, int(self.start[b]))
        hi = min(hi, int(self.end[b]))
        if lo > hi:
            return False
        nb = self.nbytes[b]
        if which & FIRST:
            self.first[lo : hi + 1] -= nb
        if which & STEADY:
            self.steady[lo : hi + 1] -= nb
        self.holes.setdefault(b, []).append((lo, hi, which))
        self.holed[b] = True
        return True

    def add_bytes(self, op: int, nbytes: int) -> None:
        """Transient bytes while op `op` runs (a recompute chain's temporaries)."""
        self.first[op] += nbytes
        self.steady[op] += nbytes

    def live_at(self, op: int) -> np.ndarray:
        """Buffers alive at `op` by their lifetimes, ignoring holes."""
        return np.flatnonzero((self.start <= op) & (self.end >= op) & (self.nbytes > 0))

    def absent_at(self, b: int, op: int, steady: bool | None = None) -> bool:
        """Whether a hole of `b` covers `op` in the curve the peak is taken
        over (or, given `steady`, in later iterations / iteration 0)."""
        if steady is None:
            steady = not self.count_first_iteration
        bit = STEADY if steady else FIRST
        return any(lo <= op <= hi and w & bit for lo, hi, w in self.holes.get(b, ()))

    def resident_at(self, op: int, steady: bool | None = None) -> np.ndarray:
        """Buffers on the device while `op` runs (ascending ids)."""
        live = self.live_at(op)
        sub = live[self.holed[live]]
        if len(sub) == 0:
            return live
        gone = [b for b in sub.tolist() if self.absent_at(b, op, steady)]
        return live[~np.isin(live, gone)] if gone else live

    def peak(self) -> tuple[int, int]:
        """(bytes, first op where the curve peaks); (bytes resident at the
        start, -1) for a trace without ops."""
        c = self.curve
        if len(c) == 0:
            return int(self.nbytes[self.trace.exists_at_start].sum()), -1
        i = int(np.argmax(c))
        return int(c[i]), i


@dataclass(frozen=True, slots=True)
class PeakAnalysis:
    """TENSILE Algorithm 1 over all jobs. `peak_bytes` is the global memory
    footprint peak MP = sum of the jobs' peaks (the jobs run asynchronously,
    so their peaks may coincide). Per job: the peak in bytes, the first op
    where it happens (-1 for a job without ops), its predicted start time
    (us), the buffers resident then, and `last_input_op`, the last op at or
    before the peak that reads a buffer (the deadline of a swap-out that is
    to lower this peak is the start of the peak op)."""

    peak_bytes: int
    job_peak_bytes: tuple[int, ...]
    job_peak_op: tuple[int, ...]
    job_peak_time_us: tuple[float, ...]
    resident: tuple[np.ndarray, ...]
    last_input_op: tuple[int, ...]


def peak_analysis(
    states: Sequence[MemoryState], timelines: Sequence[Timeline] | None = None
) -> PeakAnalysis:
    """Algorithm 1 over the jobs' current `MemoryState`s."""
    peaks, ops, times, res, lua = [], [], [], [], []
    for j, st in enumerate(states):
        p_bytes, p = st.peak()
        peaks.append(p_bytes)
        ops.append(p)
        tl = timelines[j] if timelines is not None else None
        times.append(float(tl.start_us[p]) if tl is not None and p >= 0 else math.nan)
        res.append(st.resident_at(p) if p >= 0 else np.flatnonzero(st.trace.persistent))
        lua.append(_last_reader(st.trace, p))
    return PeakAnalysis(sum(peaks), tuple(peaks), tuple(ops), tuple(times), tuple(res), tuple(lua))


def _last_reader(trace: Trace, p: int) -> int:
    if p < 0:
        return -1
    rp = trace.reads_csr[0]
    has = np.flatnonzero(np.diff(rp[: p + 2]) > 0)
    return int(has[-1]) if len(has) else -1


# ---- the PCIe lane(s) ---------------------------------------------------------------------
# NOTE [ Lane timelines ]
# TENSILE moves one tensor at a time over PCIe (§IV-C): a swap may only use
# lane time no other swap holds. A lane is a circle of `period` microseconds
# (the iteration repeats), holding disjoint busy intervals. By default all
# jobs share one lane, as the simulator's `lanes=1` does: its period is the
# longest job's, and a job with a shorter period holds each booking once per
# repetition of its own iteration within that circle (`ceil(P / period_j)`
# replicas), so a slot is free for it only if every replica is. With
# `per_job_lane=True` each job gets its own circle of its own period -- the
# authors' simplification, which lets two jobs' copies collide at run time.
# Transfers of both directions share the lane (the paper's single channel).


# Intervals that overlap by less than this (us) only touch: rounding in the
# circle's modular arithmetic must not make a slot that ends where a busy
# interval starts look taken.
_TOUCH = 1e-7


class _Circle:
    """Disjoint busy intervals on [0, period), sorted."""

    __slots__ = ("period", "starts", "ends")

    def __init__(self, period: float):
        self.period = period
        self.starts: list[float] = []
        self.ends: list[float] = []

    def add(self, a: float, b: float) -> None:
        """Mark [a, b) busy (unrolled times; b - a <= period)."""
        P = self.period
        if b - a >= P:
            self.starts, self.ends = [0.0], [P]
            return
        k = math.floor(a / P)
        a, b = a - k * P, b - k * P
        if b > P:
            self._add(a, P)
            self._add(0.0, b - P)
        else:
            self._add(a, b)

    def _add(self, a: float, b: float) -> None:
        if b <= a:
            return
        S, E = self.starts, self.ends
        i = bisect.bisect_left(E, a)  # first interval ending at or after a
        j = bisect.bisect_right(S, b)  # intervals starting at or before b
        if i < j:
            a = min(a, S[i])
            b = max(b, E[j - 1])
        S[i:j] = [a]
        E[i:j] = [b]

    def conflict(self, a: float, b: float) -> tuple[float, float] | None:
        """A busy interval overlapping [a, b) in unrolled time (b - a < period),
        returned in unrolled coordinates: the last-ending one for `a`..`b`."""
        P = self.period
        k = math.floor(a / P)
        a0, b0 = a - k * P, b - k * P
        best = None
        for lo, hi, shift in ((a0, min(b0, P), k * P), (0.0, b0 - P, (k + 1) * P)):
            if hi <= lo:
                continue
            j = bisect.bisect_left(self.starts, hi - _TOUCH) - 1
            if j >= 0 and self.ends[j] > lo + _TOUCH:
                cand = (self.starts[j] + shift, self.ends[j] + shift)
                if best is None or cand[1] > best[1]:
                    best = cand
        return best

    def first_conflict(self, a: float, b: float) -> tuple[float, float] | None:
        """The earliest-starting busy interval overlapping [a, b)."""
        P = self.period
        k = math.floor(a / P)
        a0, b0 = a - k * P, b - k * P
        for lo, hi, shift in ((a0, min(b0, P), k * P), (0.0, b0 - P, (k + 1) * P)):
            if hi <= lo:
                continue
            j = bisect.bisect_right(self.ends, lo + _TOUCH)  # first one ending after lo
            if j < len(self.starts) and self.starts[j] < hi - _TOUCH:
                return self.starts[j] + shift, self.ends[j] + shift
        return None

    def busy_in(self, a: float, b: float) -> list[tuple[float, float]]:
        """Busy intervals overlapping [a, b), unrolled and clipped to it."""
        P = self.period
        out = []
        if P <= 0:
            return out
        k = math.floor(a / P)
        while k * P < b:
            shift = k * P
            lo, hi = a - shift, b - shift
            i = bisect.bisect_right(self.ends, lo)
            while i < len(self.starts) and self.starts[i] < hi:
                out.append((max(a, self.starts[i] + shift), min(b, self.ends[i] + shift)))
                i += 1
            k += 1
        return out


class LaneSet:
    """The lane timeline(s) of a set of jobs (NOTE [ Lane timelines ]). All
    times are job-local unrolled microseconds (iteration r of job j at
    r * timelines[j].period_us)."""

    def __init__(self, timelines: Sequence[Timeline], *, per_job_lane: bool = False):
        periods = [max(t.period_us, EPS_US) for t in timelines]
        self.per_job_lane = per_job_lane
        self.periods = periods
        if per_job_lane or len(timelines) == 1:
            self.circles = [_Circle(p) for p in periods]
            self.lane_of = list(range(len(timelines)))
            self.offsets = [[0.0] for _ in periods]
        else:
            big = max(periods)
            self.circles = [_Circle(big)]
            self.lane_of = [0] * len(timelines)
            self.offsets = [
                [r * p for r in range(max(1, math.ceil(big / p - 1e-9)))] for p in periods
            ]
        self.bookings: list[tuple[int, float, float]] = []

    def _circle(self, job: int) -> _Circle:
        return self.circles[self.lane_of[job]]

    def is_free(self, job: int, start: float, dur: float) -> bool:
        c = self._circle(job)
        return all(c.conflict(start + o, start + o + dur) is None for o in self.offsets[job])

    def earliest(self, job: int, lo: float, hi: float, dur: float) -> float | None:
        """The earliest start s >= lo with [s, s + dur) free and s + dur <= hi."""
        c, offs = self._circle(job), self.offsets[job]
        if dur >= c.period:
            return None
        s = lo
        while s + dur <= hi + 1e-9:
            bumped = False
            for o in offs:
                hit = c.conflict(s + o, s + o + dur)
                if hit is not None:
                    s = max(hit[1] - o, s + _TOUCH)
                    bumped = True
            if not bumped:
                return s
        return None

    def latest(self, job: int, lo: float, hi: float, dur: float) -> float | None:
        """The latest start s >= lo with [s, s + dur) free and s + dur <= hi."""
        c, offs = self._circle(job), self.offsets[job]
        if dur >= c.period:
            return None
        s = hi - dur
        while s >= lo - 1e-9:
            bumped = False
            for o in offs:
                hit = c.first_conflict(s + o, s + o + dur)
                if hit is not None:
                    s = min(hit[0] - o - dur, s - _TOUCH)
                    bumped = True
            if not bumped:
                return max(s, lo)
        return None

    def book(self, job: int, start: float, dur: float) -> None:
        """Hold the lane for [start, start + dur) in every replica."""
        c = self._circle(job)
        for o in self.offsets[job]:
            c.add(start + o, start + o + dur)
        self.bookings.append((job, start, dur))

    def free_intervals(self, job: int, lo: float, hi: float) -> list[tuple[float, float]]:
        """TENSILE's feasible intervals: the maximal free stretches of [lo, hi)
        for `job` (free in every replica), ascending."""
        c = self._circle(job)
        busy: list[tuple[float, float]] = []
        for o in self.offsets[job]:
            busy.extend((a - o, b - o) for a, b in c.busy_in(lo + o, hi + o))
        busy.sort()
        out, t = [], lo
        for a, b in busy:
            if a > t:
                out.append((t, a))
            t = max(t, b)
        if t < hi:
            out.append((t, hi))
        return out


# ---- the memory a finished plan predicts ----------------------------------------------------
def memory_of_plan(
    trace: Trace,
    timeline: Timeline,
    plan: Plan,
    hw: Hardware,
    *,
    policy: MemoryPolicy = "framework",
    count_first_iteration: bool = True,
) -> MemoryState:
    """The op-grid residency `plan` predicts for one job, every copy starting
    at its trigger (lane queueing is not modelled): a SwapOut frees after its
    copy ends, a Release at once, a SwapIn takes the bytes when its copy
    starts (at the latest when `before_op` starts), a Recompute just before
    its op (its chain's temporaries counted at that op). The base lifetimes
    are `policy`'s (the framework's frees by default, so a plan must carry
    its own Releases). Iteration 0 starts with every persistent buffer
    resident; later iterations with what the previous one left."""
    st = MemoryState(trace, policy, count_first_iteration=count_first_iteration)
    if trace.n_ops == 0:
        return st
    per_buf: dict[int, list] = {}
    for ev in plan.events:
        per_buf.setdefault(ev.buffer, []).append(ev)
    for b, evs in per_buf.items():
        d_out = float(transfer_us(hw, int(trace.nbytes[b]), "d2h"))
        persistent = bool(trace.persistent[b])
        marks: list[tuple[float, int]] = []  # (unrolled time, -1 off / +1 on)
        # a non-persistent buffer is born again every iteration: one is enough
        for r in (0, 1) if persistent else (0,):
            for ev in evs:
                if isinstance(ev, Recompute):
                    marks.append((timeline.unrolled_start(ev.before_op, r), +1))
                    continue
                if isinstance(ev, SwapIn) and ev.next_iteration and not persistent:
                    continue
                t = (
                    timeline.iteration_start(r)
                    if ev.after_op < 0
                    else timeline.unrolled_end(ev.after_op, r)
                )
                # copies are widened by EPS_US: the simulator may order a copy's
                # end and an op's start at the same instant either way
                if isinstance(ev, SwapOut):
                    marks.append((t + ev.delay_us + d_out + EPS_US, -1))
                elif isinstance(ev, Release):
                    marks.append((t, -1))
                else:
                    due = timeline.unrolled_ready(ev.before_op, r + int(ev.next_iteration))
                    marks.append((min(t + ev.delay_us, due) - EPS_US, +1))
        marks.sort(key=lambda m: (m[0], -m[1]))
        present, off_at = True, 0.0
        for t, kind in marks:
            if kind < 0 and present:
                present, off_at = False, t
            elif kind > 0 and not present:
                present = True
                _cut(st, timeline, b, off_at, t)
        if not present:
            _cut(st, timeline, b, off_at, math.inf if persistent else timeline.period_us)
    for ev in plan.events:
        if isinstance(ev, Recompute) and len(ev.ops) > 1:
            temps = {int(w) for k in ev.ops for w in trace.op_writes(k)} - {ev.buffer}
            st.add_bytes(ev.before_op, int(sum(int(trace.nbytes[w]) for w in temps)))
    return st


def _cut(st: MemoryState, tl: Timeline, b: int, t0: float, t1: float) -> None:
    """Buffer `b` is off the device over unrolled [t0, t1]. A persistent
    buffer's state carries over: what falls in iteration 0 lowers `first`,
    what falls in iteration 1 lowers `steady`. Any other buffer lives within
    one iteration, the same in all."""
    persistent = bool(st.trace.persistent[b])
    for lo, hi, r in tl.ops_within(t0, t1):
        if persistent:
            st.add_hole(b, lo, hi, FIRST if r == 0 else STEADY)
        elif r == 0:
            st.add_hole(b, lo, hi, BOTH)

"""Where the memory of a job peaks: its residency on the op grid.

TENSILE's peak analysis (§IV-B Algorithm 1) on the op grid
(NOTE [ Peak analysis on the op grid ]):

- `MemoryState`: one job's residency -- lifetimes minus the holes that
  swaps, releases and recomputes cut into them -- and its memory curves,
  updated in place by slice arithmetic as holes are cut.
- `peak_analysis(states, timelines)`: Algorithm 1 over all jobs: the global
  peak, each job's peak op and time, the buffers resident there and the last
  op reading inputs before it.
- `memory_of_plan(trace, timeline, plan, device)`: the `MemoryState` a finished
  plan predicts (for planners that build plans another way, and for tests).

Sizes are bytes, times microseconds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction, TimeUnit
from memplan.planners.analysis.optimes import EPS_US, Timeline
from memplan.planners.core.plan import Event, Plan, Recompute, Release, SwapIn, SwapOut
from memplan.planners.core.semantics import IndexedPlan
from memplan.traces.model import MemoryPolicy, Trace

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

D2H, US = Direction.D2H, TimeUnit.US


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


# ---- the memory a finished plan predicts ----------------------------------------------------
def memory_of_plan(
    trace: Trace,
    timeline: Timeline,
    plan: Plan,
    device: DeviceModel,
    *,
    policy: MemoryPolicy = "framework",
    count_first_iteration: bool = True,
) -> MemoryState:
    """The op-grid residency `plan` predicts for one job, every copy starting
    at its trigger (lane queueing is not modelled: `planners.analysis.queued`
    does that): a SwapOut frees after its copy ends (`device.copy_time`, D2H;
    at the latest when its `before_op` is ready), a Release at once (an input
    released at the start is never loaded), a SwapIn takes the bytes when its
    copy starts (at the latest when `before_op` starts), a Recompute just
    before its op (its chain's temporaries counted at that op: every other
    buffer its ops write, also for a single op with several outputs, such as
    batch norm's statistics). The base lifetimes are `policy`'s (the
    framework's frees by default, so a plan must carry its own Releases).
    Iteration 0 starts with every persistent buffer resident; later
    iterations with what the previous one left. `plan` is indexed as the
    simulator indexes it (`IndexedPlan`: `PlanError` for a second Recompute
    of one buffer before one op)."""
    st = MemoryState(trace, policy, count_first_iteration=count_first_iteration)
    if trace.n_ops == 0:
        return st
    ip = IndexedPlan.of(plan, trace)
    per_buf: dict[int, list[Event]] = {}
    for group in (ip.start_events(), *ip.triggered[1:]):
        for _e, ev in group:
            per_buf.setdefault(ev.buffer, []).append(ev)
    for (b, _op), r in ip.recompute.items():
        per_buf.setdefault(b, []).append(r.event)
    for b, evs in per_buf.items():
        _holes(st, timeline, b, evs, float(device.copy_time(int(trace.nbytes[b]), D2H, US)))
    for r in ip.recompute.values():
        nbytes = sum(int(trace.nbytes[w]) for w in r.temporaries)
        st.add_bytes(r.event.before_op, nbytes)
    return st


def _holes(st: MemoryState, timeline: Timeline, b: int, evs: list[Event], d_out: float) -> None:
    """Cut the holes that events `evs` (all of buffer `b`) make into `st`."""
    persistent = bool(st.trace.persistent[b])
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
                off = t + ev.delay_us + d_out + EPS_US
                if ev.before_op >= 0:  # its deadline waits for the copy
                    off = min(off, timeline.unrolled_ready(ev.before_op, r))
                marks.append((off, -1))
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

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
  plan predicts (for planners that build plans another way, and for tests),
  each buffer's events walked with the simulator's rules (NOTE [ A plan on
  the op grid ]).

Sizes are bytes, times microseconds.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction, TimeUnit
from memplan.planners.analysis.optimes import EPS_US, Timeline
from memplan.planners.core.lifecycle import ARRIVING, NO_CTX, OFF, Buffers, Ctx, Do
from memplan.planners.core.lifecycle import Event as LifeEvent
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
# the simulator's peak from above when the timeline is right; for a finished
# plan, that takes its events in the simulator's order and with its rules
# (a swap-in cancelling a pending swap-out, a copy holding freed bytes:
# NOTE [ A plan on the op grid ]).
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

D2H, H2D, US = Direction.D2H, Direction.H2D, TimeUnit.US


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

    def add_bytes(self, op: int, nbytes: int, which: int = BOTH) -> None:
        """Bytes held while op `op` runs beyond the buffers' lifetimes (a
        recompute chain's temporaries, a copy reading a freed buffer), in
        iteration 0 (`FIRST`), in later iterations (`STEADY`) or in all."""
        if which & FIRST:
            self.first[op] += nbytes
        if which & STEADY:
            self.steady[op] += nbytes

    def live_at(self, op: int) -> np.ndarray:
        """Buffers alive at `op` by their lifetimes, ignoring holes."""
        return np.flatnonzero((self.start <= op) & (self.end >= op) & (self.nbytes > 0))

    def _bit(self, steady: bool | None) -> int:
        if steady is None:
            steady = not self.count_first_iteration
        return STEADY if steady else FIRST

    def resident_among(self, op: int, bufs: np.ndarray, steady: bool | None = None) -> np.ndarray:
        """bool per buffer of `bufs`: on the device while `op` runs. Costs
        the length of `bufs`, not of the trace (TENSILE's rounds look at the
        head of a fixed order only)."""
        ok = (self.start[bufs] <= op) & (self.end[bufs] >= op) & (self.nbytes[bufs] > 0)
        holed = np.flatnonzero(ok & self.holed[bufs])
        if len(holed):
            bit, holes = self._bit(steady), self.holes
            for i, b in zip(holed.tolist(), bufs[holed].tolist()):
                ok[i] = not _covers(holes[b], op, bit)
        return ok

    def resident_at(self, op: int, steady: bool | None = None) -> np.ndarray:
        """Buffers on the device while `op` runs (ascending ids)."""
        live = self.live_at(op)
        return live[self.resident_among(op, live, steady)]

    def peak(self) -> tuple[int, int]:
        """(bytes, first op where the curve peaks); (bytes resident at the
        start, -1) for a trace without ops."""
        c = self.curve
        if len(c) == 0:
            return int(self.nbytes[self.trace.exists_at_start].sum()), -1
        i = int(np.argmax(c))
        return int(c[i]), i


def _covers(holes: Iterable[tuple[int, int, int]], op: int, bit: int) -> bool:
    """Whether one of a buffer's `holes` (lo, hi, which) covers `op` in the
    curve `bit` names."""
    return any(lo <= op <= hi and w & bit for lo, hi, w in holes)


@dataclass(frozen=True)
class PeakAnalysis:
    """TENSILE Algorithm 1 over all jobs. `peak_bytes` is the global memory
    footprint peak MP = sum of the jobs' peaks (the jobs run asynchronously,
    so their peaks may coincide). Per job: the peak in bytes, the first op
    where it happens (-1 for a job without ops), its predicted start time
    (us), and `last_input_op`, the last op at or before the peak that reads a
    buffer (the deadline of a swap-out that is to lower this peak is the
    start of the peak op). `resident` (the buffers resident at each job's
    peak op) is found when first asked for: a round that looks only at the
    head of a fixed order asks `states[j].resident_among` instead."""

    peak_bytes: int
    job_peak_bytes: tuple[int, ...]
    job_peak_op: tuple[int, ...]
    job_peak_time_us: tuple[float, ...]
    last_input_op: tuple[int, ...]
    states: tuple[MemoryState, ...] = field(repr=False, compare=False)

    @cached_property
    def resident(self) -> tuple[np.ndarray, ...]:
        """Per job: the buffers resident at its peak op (ascending ids); a job
        without ops: its persistent buffers."""
        return tuple(
            st.resident_at(p) if p >= 0 else np.flatnonzero(st.trace.persistent)
            for st, p in zip(self.states, self.job_peak_op)
        )


def peak_analysis(
    states: Sequence[MemoryState], timelines: Sequence[Timeline] | None = None
) -> PeakAnalysis:
    """Algorithm 1 over the jobs' current `MemoryState`s."""
    peaks, ops, times, lua = [], [], [], []
    for j, st in enumerate(states):
        p_bytes, p = st.peak()
        peaks.append(p_bytes)
        ops.append(p)
        tl = timelines[j] if timelines is not None else None
        times.append(float(tl.start_us[p]) if tl is not None and p >= 0 else math.nan)
        lua.append(_last_reader(st.trace, p))
    return PeakAnalysis(
        sum(peaks), tuple(peaks), tuple(ops), tuple(times), tuple(lua), tuple(states)
    )


def _last_reader(trace: Trace, p: int) -> int:
    """The last op at or before `p` that reads a buffer (-1: none): the op
    of the last read up to p's, found in the read pointers."""
    if p < 0:
        return -1
    rp = trace.reads_csr[0]
    last = int(rp[p + 1]) - 1  # the index of the last read by ops 0..p
    return int(np.searchsorted(rp, last, "right")) - 1 if last >= 0 else -1


# ---- the memory a finished plan predicts ----------------------------------------------------
# NOTE [ A plan on the op grid ]
# `memory_of_plan` drives each buffer's `lifecycle.Buffers` state through its events in time
# order, as the simulator does, and cuts the holes that follow: every copy starts when its
# trigger (+ delay) fires, with no lane queue, and holds the lane `device.copy_time`; ops write
# their buffers at their start and end (WRITE: a host copy goes stale), and an op's own reads
# are not walked (checked plans restore a buffer first). A swap-out's copy ends at the latest
# when its `before_op` is ready (that op waits for it). The bytes of a buffer off the device or
# arriving are a hole from when it went until it is back (an arriving one: its copy's start, or
# just before `before_op` is ready); a framework free of a leaving buffer whose copy runs keeps
# the bytes until the copy ends (extra bytes past its lifetime). Instants take the simulator's
# order (`_WRITE_END` .. `_COPY_END`); EPS_US widens copies so float ties keep more bytes.
# Full text: docs/notes.md, "A plan on the op grid".

# At one instant, in the simulator's order: op k ends, writes and the framework
# frees after it; the next iteration loads its inputs; op k's triggers fire in
# plan order (and an undelayed swap-out's copy starts); op k+1 waits for its
# deadlines, makes absent buffers present (recomputes), creates its outputs and
# writes. A copy's end comes last.
_WRITE_END, _FREE, _LOAD, _TRIGGER, _COPY_START, _DEADLINE, _NEED, _CREATE, _WRITE, _COPY_END = (
    range(10)
)


def memory_of_plan(
    trace: Trace,
    timeline: Timeline,
    plan: Plan,
    device: DeviceModel,
    *,
    policy: MemoryPolicy = "framework",
    count_first_iteration: bool = True,
) -> MemoryState:
    """The op-grid residency `plan` predicts for one job (NOTE [ A plan on
    the op grid ]), every copy starting at its trigger (lane queueing is not
    modelled: `planners.analysis.queued` does that): a SwapOut frees when
    its copy ends (`device.copy_time`, D2H; at the latest when its
    `before_op` is ready) unless a SwapIn or Recompute wants the buffer back
    first, or at once where a valid host copy makes the copy needless; a
    Release frees at once (an input released at the start is never
    loaded), a SwapIn takes the bytes when its copy starts (at the latest
    when `before_op` starts), a Recompute just before its op (its chain's
    temporaries counted at that op: every other buffer its ops write, also
    for a single op with several outputs, such as batch norm's statistics).
    The base lifetimes are `policy`'s (the framework's frees by default, so
    a plan must carry its own Releases); a swap-out copy running at that
    free holds the bytes until it ends. Iteration 0 starts with every
    persistent buffer resident; later iterations with what the previous one
    left. `plan` is indexed as the simulator indexes it (`IndexedPlan`:
    `PlanError` for a second Recompute of one buffer before one op)."""
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
    d_out = device.copy_time(trace.nbytes, D2H, US).tolist()
    d_in = device.copy_time(trace.nbytes, H2D, US).tolist()
    bufs = Buffers(trace.n_buffers)
    for b, evs in per_buf.items():
        _Walk(st, timeline, bufs, b, d_out[b], d_in[b]).run(evs, trace.writers_of(b).tolist())
    for r in ip.recompute.values():
        nbytes = sum(int(trace.nbytes[w]) for w in r.temporaries)
        st.add_bytes(r.event.before_op, nbytes)
    return st


class _Walk:
    """One buffer's events in time order, its state in `bufs` (the
    transition function's), cutting its holes into `st` (NOTE [ A plan on
    the op grid ]). Times are unrolled microseconds: a persistent buffer is
    walked over iterations 0 and 1 (its state carries over), any other over
    iteration 0 (it lives the same in every one). The walk keeps only
    times: when the hole began and ends, when a running copy ends."""

    def __init__(
        self, st: MemoryState, tl: Timeline, bufs: Buffers, b: int, d_out: float, d_in: float
    ):
        self.st, self.tl, self.bufs, self.b = st, tl, bufs, b
        self.persistent = bool(st.trace.persistent[b])
        self.d_out, self.d_in = d_out, d_in
        self.heap: list[tuple[float, int, int, Callable[[float, Any], None], Any]] = []
        self.seq = 0  # ties at one instant and rank keep the order of pushing
        self.off_at = 0.0  # off or arriving: when the hole began
        self.on_at = 0.0  # arriving: when the bytes are back
        self.copy_end = 0.0  # leaving: when the bytes go
        self.writes = 0  # writes so far, and at the running swap-out's start
        self.writes_at_start = 0
        if self.persistent:
            bufs.create(b)

    def push(self, t: float, rank: int, act: Callable[[float, Any], None], arg: Any = None) -> None:
        heapq.heappush(self.heap, (t, rank, self.seq, act, arg))
        self.seq += 1

    def apply(self, ev: LifeEvent, ctx: Ctx = NO_CTX) -> int:
        return self.bufs.apply(self.b, ev, ctx)

    def run(self, evs: list[Event], writers: Sequence[int]) -> None:
        tl, st, b = self.tl, self.st, self.b
        iterations = (0, 1) if self.persistent else (0,)
        if not self.persistent:
            lo, hi = int(st.start[b]), int(st.end[b])
            if hi < lo:
                return  # never resident
            if st.trace.exists_at_start[b]:
                self.push(tl.iteration_start(0), _LOAD, self.create)
            else:
                self.push(tl.unrolled_ready(lo), _CREATE, self.create)
            self.push(tl.unrolled_end(hi), _FREE, self.free)
        for r in iterations:
            for k in writers:
                self.push(tl.unrolled_ready(k, r), _WRITE, self.write)
                self.push(tl.unrolled_end(k, r), _WRITE_END, self.write)
            for ev in evs:  # plan order within one trigger
                if isinstance(ev, Recompute):
                    self.push(tl.unrolled_ready(ev.before_op, r), _NEED, self.need)
                elif isinstance(ev, SwapIn) and ev.next_iteration and not self.persistent:
                    continue  # serves an iteration the buffer does not live in
                else:
                    t = (
                        tl.iteration_start(r)
                        if ev.after_op < 0
                        else tl.unrolled_end(ev.after_op, r)
                    )
                    self.push(t, _TRIGGER, self.trigger, (ev, r))
        while self.heap:
            t, _rank, _seq, act, arg = heapq.heappop(self.heap)
            act(t, arg)
        w = self.bufs.where[b]
        if w == OFF and self.bufs.alive[b]:
            self.cut(self.off_at, math.inf)
        elif w == ARRIVING:
            self.cut(self.off_at, self.on_at)

    # ---- the events ------------------------------------------------------------------
    def create(self, _t: float, _arg: None) -> None:
        self.bufs.create(self.b)  # CREATE, by its fast path

    def write(self, _t: float, _arg: None) -> None:
        self.bufs.written((self.b,))  # WRITE, by its fast path
        self.writes += 1

    def free(self, t: float, _arg: None) -> None:
        """The framework's free: the life ends, but a running copy keeps the bytes."""
        w = self.bufs.where[self.b]
        if self.bufs.free(self.b) & Do.DETACH:  # FREE, by its fast path
            self.extra(t, self.copy_end)
        elif w == OFF:
            self.cut(self.off_at, t)
        elif w == ARRIVING:
            self.cut(self.off_at, self.on_at)

    def trigger(self, t: float, arg: tuple[Event, int]) -> None:
        ev, r = arg
        if isinstance(ev, Release):
            if self.apply(LifeEvent.RELEASE) & Do.DROP:
                self.off_at = t
        elif isinstance(ev, SwapOut):
            do = self.apply(LifeEvent.SWAP_OUT, Ctx(delayed=bool(ev.delay_us)))
            if do & Do.DROP:  # a valid host copy: discarded at once
                self.off_at = t
            elif do & Do.COPY_D2H:
                self.leave(t, ev, r)
        elif isinstance(ev, SwapIn):
            due = self.tl.unrolled_ready(ev.before_op, r + int(ev.next_iteration))
            on = min(t + ev.delay_us, due) - EPS_US
            do = self.apply(LifeEvent.SWAP_IN)
            if do & Do.JOIN:
                self.on_at = min(self.on_at, on)
            elif do & Do.COPY_H2D:
                self.on_at = on
                end = t + ev.delay_us + self.d_in + EPS_US
                self.push(end, _COPY_END, self.arrived, self.bufs.epoch[self.b])

    def leave(self, t: float, ev: SwapOut, r: int) -> None:
        start = t + ev.delay_us
        end, rank = start + self.d_out + EPS_US, _COPY_END
        if ev.before_op >= 0:  # its deadline waits for the copy
            due = self.tl.unrolled_ready(ev.before_op, r)
            if due < end:
                end, rank = due, _DEADLINE
        start = min(start - EPS_US if ev.delay_us else start, end)
        self.copy_end = end
        ep = self.bufs.epoch[self.b]
        self.push(start, _COPY_START, self.started, ep)
        self.push(end, rank, self.left, ep)

    def started(self, t: float, epoch: int) -> None:
        """A swap-out's copy starts, even if the buffer was wanted back (the
        host copy is made all the same; its end then frees nothing)."""
        if epoch != self.bufs.epoch[self.b]:
            return
        do = self.apply(LifeEvent.COPY_OUT)
        if do & Do.DROP:  # a valid host copy: discarded, no bytes move
            self.off_at = t
        elif do & Do.LEAVE:
            self.apply(LifeEvent.D2H_START)
            self.writes_at_start = self.writes

    def left(self, t: float, epoch: int) -> None:
        """A swap-out's copy ends: the bytes go, unless the buffer was wanted back."""
        b = self.b
        if epoch != self.bufs.epoch[b] or self.bufs.copying[b] != epoch:
            return  # the copy was discarded or kept before it moved
        if (
            self.apply(LifeEvent.D2H_END, Ctx(written=self.writes != self.writes_at_start))
            & Do.DROP
        ):
            self.off_at = t

    def arrived(self, _t: float, epoch: int) -> None:
        if epoch != self.bufs.epoch[self.b] or self.bufs.where[self.b] != ARRIVING:
            return
        self.apply(LifeEvent.H2D_END)
        self.cut(self.off_at, self.on_at)

    def need(self, t: float, _arg: None) -> None:
        """A Recompute's op is due: it needs the buffer (within its life)."""
        if not self.bufs.alive[self.b]:
            return
        do = self.apply(LifeEvent.NEED, Ctx(recompute=True))
        if do & Do.RECOMPUTE:
            self.apply(LifeEvent.REMAKE)
            self.cut(self.off_at, t)
        elif do & Do.STALL:
            self.on_at = min(self.on_at, t)

    # ---- onto the op grid --------------------------------------------------------------
    def cut(self, t0: float, t1: float) -> None:
        """The buffer is off the device over unrolled [t0, t1]. A persistent
        buffer's state carries over: what falls in iteration 0 lowers `first`,
        what falls in iteration 1 lowers `steady`. Any other buffer lives
        within one iteration, the same in all."""
        for lo, hi, r in self.tl.ops_within(t0, t1):
            if self.persistent:
                self.st.add_hole(self.b, lo, hi, FIRST if r == 0 else STEADY)
            elif r == 0:
                self.st.add_hole(self.b, lo, hi, BOTH)

    def extra(self, t0: float, t1: float) -> None:
        """The bytes stay after the buffer's life ends at t0 (the end of its
        last op), until t1: every op that overlaps (t0, t1) counts them --
        in every iteration, or, in iteration 1, in every one but the first."""
        tl, nbytes = self.tl, int(self.st.nbytes[self.b])
        for r, which in ((0, BOTH), (1, STEADY)):
            shift = r * tl.period_us
            if tl.iteration_start(r) >= t1:
                break
            lo = int(np.searchsorted(tl.end_us + shift, t0, "right"))
            # op i is ready when op i - 1 ends: ops 1..k have ready < t1
            k = int(np.searchsorted(tl.end_us + shift, t1, "left"))
            for op in range(lo, min(k, tl.n_ops - 1) + 1):
                self.st.add_bytes(op, nbytes, which)

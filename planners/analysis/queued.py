"""The peak of one job whose copies queue on one FIFO lane.

`memory_of_plan` (planners.analysis.opgrid) starts every copy at its trigger.
A plan that leaves its copies to queue (vDNN: NOTE [ vDNN predicted peak ] in
planners/heuristics/vdnn.py) has its memory decided by the queue, so
`queued_peak` replays it with the simulator's rules (NOTE [ Event semantics ]
in sim/model.py) for one job alone on one lane shared by both directions,
with no budget, over a few iterations (each starts with the copies the one
before left queued):

- a SwapOut queues its buffer for the lane; the memory is freed when its
  copy ends, unless the buffer was wanted back meanwhile (kept, no free);
  its `before_op`, if set, does not start before the copy is over;
- a SwapIn queues a copy that takes the bytes when it starts; of a buffer
  still queued or copying out it just keeps it; its `before_op` waits for it;
- a Release frees at once (of a buffer queued or copying out: cancels a keep);
- the framework's frees end a buffer's life (`epoch`): its queued copies are
  void, and a running copy returns the memory when it ends.

Ops run back to back with the `Timeline`'s durations; copies take
`device.copy_time`. The plan is indexed as everywhere (`IndexedPlan`).
Recomputes and delayed copies are outside this model (`ValueError`): a plan
with them is scored by `memory_of_plan` or the simulator.
"""

from __future__ import annotations

import math
from collections import defaultdict, deque

from memplan.hwmodels.device import DeviceModel, Direction, TimeUnit
from memplan.planners.analysis.optimes import Timeline
from memplan.planners.core.plan import Plan, Release, SwapOut
from memplan.planners.core.semantics import IndexedPlan, OpTable, Triggered
from memplan.traces.model import Trace

_OFF, _DEV, _QUEUED, _COPYING, _ARRIVING = range(5)


def queued_peak(
    trace: Trace, timeline: Timeline, plan: Plan, device: DeviceModel, iterations: int = 3
) -> int:
    """The peak bytes of `plan` for `trace` alone on the device, its copies
    queued FIFO on one lane, over `iterations` iterations."""
    ip = IndexedPlan.of(plan, trace)
    if ip.recompute:
        e = next(iter(ip.recompute.values())).index
        raise ValueError(f"queued_peak: recomputes are not modelled (events[{e}])")
    for group in ip.triggered:
        for e, ev in group:
            if not isinstance(ev, Release) and ev.delay_us:
                raise ValueError(f"queued_peak: delayed copies are not modelled (events[{e}])")
    q = _Queue(trace, timeline, ip, device)
    for it in range(iterations):
        q.iteration(it, iterations)
    return q.peak


class _Queue:
    """The replay's state: where each buffer is, the lane and the memory."""

    def __init__(self, trace: Trace, tl: Timeline, ip: IndexedPlan, device: DeviceModel):
        nb = trace.n_buffers
        self.tab = OpTable.of(trace)
        self.ip = ip
        self.nbytes: list[int] = trace.nbytes.tolist()
        self.dur: list[float] = tl.duration_us.tolist()
        self.d2h = device.copy_time(trace.nbytes, Direction.D2H, TimeUnit.US).tolist()
        self.h2d = device.copy_time(trace.nbytes, Direction.H2D, TimeUnit.US).tolist()
        self.where = [_OFF] * nb
        self.keep = [False] * nb
        self.epoch = [0] * nb
        self.used = sum(self.nbytes[b] for b in self.tab.persistent)
        self.peak = self.used
        for b in self.tab.persistent:
            self.where[b] = _DEV
        self.lane: deque[tuple[int, int, bool]] = deque()  # (buffer, epoch, swap-in?)
        self.copying: tuple[int, int, bool] | None = None
        self.copy_end = math.inf  # when the copy on the lane ends
        self.arriving: dict[int, list[tuple[int, int]]] = {}  # buffer -> (iteration, op) waiting
        self.awaited: defaultdict[tuple[int, int], int] = defaultdict(int)  # (it, op) -> arrivals
        self.out_due: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
        self.now = 0.0

    def take(self, nbytes: int) -> None:
        self.used += nbytes
        self.peak = max(self.peak, self.used)

    def pump(self) -> None:
        """Start the next live copy if the lane is free."""
        where, keep, epoch = self.where, self.keep, self.epoch
        while self.copying is None and self.lane:
            b, ep, is_in = self.lane.popleft()
            if ep != epoch[b]:
                continue
            if not is_in and keep[b]:  # needed back before the copy began
                where[b], keep[b] = _DEV, False
                continue
            self.copying = (b, ep, is_in)
            if is_in:
                self.take(self.nbytes[b])
                self.copy_end = self.now + self.h2d[b]
            else:
                where[b] = _COPYING
                self.copy_end = self.now + self.d2h[b]

    def finish_copy(self) -> None:
        """End the running copy; the clock moves to its end if that is later."""
        assert self.copying is not None
        b, ep, is_in = self.copying
        end, self.copying, self.copy_end = self.copy_end, None, math.inf
        where, nbytes = self.where, self.nbytes
        if is_in:
            if ep == self.epoch[b]:
                where[b] = _DEV
                self.arrived(b)
            else:
                self.used -= nbytes[b]
        elif ep != self.epoch[b]:
            self.used -= nbytes[b]  # freed by the framework during the copy
        elif self.keep[b]:
            where[b], self.keep[b] = _DEV, False
        else:
            where[b] = _OFF
            self.used -= nbytes[b]
        saved, self.now = self.now, end
        self.pump()
        self.now = max(saved, end)

    def iteration(self, it: int, iterations: int) -> None:
        tab, where, nbytes = self.tab, self.where, self.nbytes
        for b in self.ip.inputs:
            where[b] = _DEV
            self.take(nbytes[b])
        self.trigger(self.ip.triggered[0], it, iterations)
        for i in range(tab.n_ops):
            key = (it, i)
            while self.awaited[key] > 0:
                self.finish_copy()
            for b, ep in self.out_due.pop(key, ()):
                while self.epoch[b] == ep and where[b] in (_QUEUED, _COPYING):
                    self.finish_copy()
            self.run_lane_until(self.now)
            for b in tab.creates[i]:
                where[b] = _DEV
                self.take(nbytes[b])
            end = self.now + self.dur[i]
            self.run_lane_until(end)
            self.now = end
            for b in tab.frees[i]:
                if where[b] == _DEV or where[b] == _QUEUED:
                    self.used -= nbytes[b]
                where[b] = _OFF
                self.keep[b] = False
                self.epoch[b] += 1
                self.arrived(b)
            self.trigger(self.ip.triggered[i + 1], it, iterations)

    def arrived(self, b: int) -> None:
        """`b` is no longer on its way: the ops that waited for it need not."""
        for key in self.arriving.pop(b, ()):
            self.awaited[key] -= 1

    def run_lane_until(self, t: float) -> None:
        """Finish every copy that ends by `t`, without moving the clock past it."""
        now = self.now
        while self.copy_end <= t:
            self.finish_copy()
        self.now = now

    def trigger(self, events: tuple[tuple[int, Triggered], ...], it: int, iterations: int) -> None:
        where, keep = self.where, self.keep
        for _e, ev in events:
            b = ev.buffer
            if isinstance(ev, SwapOut):
                if where[b] == _DEV:
                    where[b] = _QUEUED
                    self.lane.append((b, self.epoch[b], False))
                    if ev.before_op >= 0:
                        self.out_due[(it, ev.before_op)].append((b, self.epoch[b]))
            elif isinstance(ev, Release):
                if where[b] == _DEV:
                    where[b] = _OFF
                    self.used -= self.nbytes[b]
                elif where[b] in (_QUEUED, _COPYING):
                    keep[b] = False
            else:
                target = it + 1 if ev.next_iteration else it
                if target >= iterations:
                    continue  # serves an iteration that will not run
                if where[b] in (_QUEUED, _COPYING):
                    keep[b] = True
                elif where[b] == _OFF:
                    where[b] = _ARRIVING
                    self.arriving[b] = [(target, ev.before_op)]
                    self.awaited[(target, ev.before_op)] += 1
                    self.lane.append((b, self.epoch[b], True))
                elif where[b] == _ARRIVING:
                    self.arriving[b].append((target, ev.before_op))
                    self.awaited[(target, ev.before_op)] += 1
        self.pump()

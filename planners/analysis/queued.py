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

What each of these does to a buffer is `planners.core.lifecycle.step`'s
answer; this module decides when they happen.

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
from memplan.planners.core.lifecycle import DEV, LEAVING, NO_CTX, Buffers, Ctx, Do, Event
from memplan.planners.core.plan import Plan, Release, SwapOut
from memplan.planners.core.semantics import IndexedPlan, OpTable, Triggered
from memplan.traces.model import Trace


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
    """The replay's state: each buffer's state, the lane and the memory."""

    def __init__(self, trace: Trace, tl: Timeline, ip: IndexedPlan, device: DeviceModel):
        nb = trace.n_buffers
        self.tab = OpTable.of(trace)
        self.ip = ip
        self.nbytes: list[int] = trace.nbytes.tolist()
        self.dur: list[float] = tl.duration_us.tolist()
        self.d2h = device.copy_time(trace.nbytes, Direction.D2H, TimeUnit.US).tolist()
        self.h2d = device.copy_time(trace.nbytes, Direction.H2D, TimeUnit.US).tolist()
        self.bufs = Buffers(nb)  # its `wcount` tells a copy an op overlapped
        self.used = self.peak = 0
        for b in self.tab.persistent:
            self.create(b)
        self.lane: deque[tuple[int, int, bool]] = deque()  # (buffer, epoch, swap-in?)
        self.copying: tuple[int, int, bool, int] | None = None  # ... and its `wcount` at start
        self.copy_end = math.inf  # when the copy on the lane ends
        self.arriving: dict[int, list[tuple[int, int]]] = {}  # buffer -> (iteration, op) waiting
        self.awaited: defaultdict[tuple[int, int], int] = defaultdict(int)  # (it, op) -> arrivals
        self.out_due: dict[tuple[int, int], list[tuple[int, int]]] = defaultdict(list)
        self.now = 0.0

    def apply(self, b: int, ev: Event, ctx: Ctx = NO_CTX) -> int:
        """Move `b` by `ev` and do its bytes; returns the `Do` bits."""
        do = self.bufs.apply(b, ev, ctx)
        if do & Do.TAKE:
            self.take(self.nbytes[b])
        elif do & Do.DROP:
            self.used -= self.nbytes[b]
        return do

    def create(self, b: int) -> None:
        """CREATE (its fast path: NOTE [ Fast paths of the transition function ])."""
        self.bufs.create(b)
        self.take(self.nbytes[b])

    def take(self, nbytes: int) -> None:
        self.used += nbytes
        self.peak = max(self.peak, self.used)

    def pump(self) -> None:
        """Start the next live copy if the lane is free."""
        while self.copying is None and self.lane:
            b, ep, is_in = self.lane.popleft()
            if ep != self.bufs.epoch[b]:
                continue
            if is_in:
                self.take(self.nbytes[b])  # the copy's bytes until it lands
                self.copy_end = self.now + self.h2d[b]
            else:
                self.apply(b, Event.D2H_START)
                self.bufs.reading += 1  # NOTE [ Writes during a copy ] in sim/copies.py
                self.copy_end = self.now + self.d2h[b]
            self.copying = (b, ep, is_in, self.bufs.wcount[b])

    def finish_copy(self) -> None:
        """End the running copy; the clock moves to its end if that is later."""
        assert self.copying is not None
        b, ep, is_in, writes = self.copying
        end, self.copying, self.copy_end = self.copy_end, None, math.inf
        if not is_in:
            self.bufs.reading -= 1
        if ep != self.bufs.epoch[b]:
            self.used -= self.nbytes[b]  # the life ended during the copy: the bytes were its
        elif is_in:
            self.apply(b, Event.H2D_END)
            self.arrived(b)
        else:
            self.apply(b, Event.D2H_END, Ctx(written=self.bufs.wcount[b] != writes))
        saved, self.now = self.now, end
        self.pump()
        self.now = max(saved, end)

    def iteration(self, it: int, iterations: int) -> None:
        # The loop inlines the store's fast paths (CREATE of an op's outputs,
        # WRITE) and skips what has nothing to do: most ops wait for no copy,
        # end no copy and trigger nothing.
        tab, bufs, ip = self.tab, self.bufs, self.ip
        where, create_all, written, free = bufs.where, bufs.create_all, bufs.written, bufs.free
        nbytes, dur, awaited, out_due, arriving = (
            self.nbytes,
            self.dur,
            self.awaited,
            self.out_due,
            self.arriving,
        )
        triggered, need, creates, writes, frees = (
            ip.triggered,
            tab.need,
            tab.creates,
            tab.writes,
            tab.frees,
        )
        for b in ip.inputs:
            self.create(b)
        self.trigger(triggered[0], it, iterations)
        for i in range(tab.n_ops):
            key = (it, i)
            while awaited.get(key, 0) > 0:
                self.finish_copy()
            if out_due:
                for b, ep in out_due.pop(key, ()):
                    while bufs.epoch[b] == ep and where[b] == LEAVING:
                        self.finish_copy()
            if self.copy_end <= self.now:
                self.run_lane_until(self.now)
            for b in need[i]:
                if where[b] != DEV:  # NEED of a resident buffer does nothing
                    self.apply(b, Event.NEED)
            made = creates[i]
            if made:
                create_all(made)
                for b in made:
                    self.used += nbytes[b]
                self.peak = max(self.peak, self.used)
            w = writes[i]
            if w:
                written(w)  # at its start and at its end
            end = self.now + dur[i]
            if self.copy_end <= end:
                self.run_lane_until(end)
            self.now = end
            if w:
                written(w)
            for b in frees[i]:
                if free(b) & Do.DROP:
                    self.used -= nbytes[b]
                if arriving and b in arriving:
                    self.arrived(b)
            if triggered[i + 1]:
                self.trigger(triggered[i + 1], it, iterations)

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
        for _e, ev in events:
            b = ev.buffer
            if isinstance(ev, SwapOut):
                do = self.apply(b, Event.SWAP_OUT)
                if do & Do.COPY_D2H:
                    self.apply(b, Event.COPY_OUT)
                    self.lane.append((b, self.bufs.epoch[b], False))
                    if ev.before_op >= 0:
                        self.out_due[(it, ev.before_op)].append((b, self.bufs.epoch[b]))
            elif isinstance(ev, Release):
                self.apply(b, Event.RELEASE)
            else:
                target = it + 1 if ev.next_iteration else it
                if target >= iterations:
                    continue  # serves an iteration that will not run
                do = self.apply(b, Event.SWAP_IN)
                if do & (Do.COPY_H2D | Do.JOIN):
                    if do & Do.COPY_H2D:
                        self.arriving[b] = []
                        self.lane.append((b, self.bufs.epoch[b], True))
                    self.arriving[b].append((target, ev.before_op))
                    self.awaited[(target, ev.before_op)] += 1
        self.pump()

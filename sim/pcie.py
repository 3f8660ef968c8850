"""PCIe: the copy lane(s) between host and device.

`lanes=1` is the design card's single-lane channel: one `simpy.Resource`
shared by both directions and all jobs, FIFO. `lanes=2` is one lane per
direction (two copy engines, full duplex) with the profile's H2D slowdown:
while a D2H copy holds its lane, H2D bytes move at `h2d_duplex_factor` times
the H2D bandwidth. A copy holds its lane for `fixed cost + nbytes / bandwidth`
(the fixed cost is latency, not bandwidth, and is never slowed). Slowdown
windows (NOTE [ Lane slowdowns ] in sim/dynamics.py) stretch the bytes' part.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from typing import Any

import numpy as np
import simpy
from memplan.hwmodels.device import DeviceModel, Direction, TimeUnit


class SlowLanes:
    """Piecewise rate of the lanes, times in us: `rates[k]` (a fraction of full
    speed) holds from `edges[k]` to `edges[k + 1]`, the last one on (built from
    slowdown windows by `sim.dynamics.slow_lanes`, NOTE [ Lane slowdowns ])."""

    def __init__(self, edges: list[float], rates: list[float]):
        self.edges = edges
        self.rates = rates

    def finish_us(self, t0: float, work_us: float, scale: float = 1.0) -> float:
        """When `work_us` of full-speed work started at `t0` ends, the lane's
        rate times `scale` (a duplex slowdown) moving it."""
        edges, rates = self.edges, self.rates
        t, left = t0, work_us
        k = max(0, np.searchsorted(edges, t0, side="right") - 1)
        while True:
            rate = rates[k] * scale
            nxt = edges[k + 1] if k + 1 < len(edges) else math.inf
            if t + left / rate <= nxt:
                return t + left / rate
            left -= (nxt - t) * rate
            t, k = nxt, k + 1

    def work_us(self, t0: float, t1: float, scale: float = 1.0) -> float:
        """Full-speed work done from `t0` to `t1` at the lane's rate times `scale`."""
        edges, rates = self.edges, self.rates
        done, t = 0.0, t0
        k = max(0, np.searchsorted(edges, t0, side="right") - 1)
        while t < t1:
            nxt = min(edges[k + 1] if k + 1 < len(edges) else math.inf, t1)
            done += (nxt - t) * rates[k] * scale
            t, k = nxt, k + 1
        return done


class Pcie:
    """The lanes of one GPU. Times are microseconds of simulated time."""

    def __init__(self, env: simpy.Environment, device: DeviceModel, slow: SlowLanes | None = None):
        self.env = env
        self.slow = slow
        self.device = device
        lanes = device.lanes
        self.fixed_us = device.fixed_s * TimeUnit.US.value
        self.resources = tuple(simpy.Resource(env, capacity=1) for _ in range(lanes))
        self.names = ("pcie",) if lanes == 1 else ("h2d", "d2h")
        self.index = {Direction.H2D: 0, Direction.D2H: 0 if lanes == 1 else 1}
        self.duplex_factor = device.hw.h2d_duplex_factor if lanes == 2 else 1.0
        self._d2h_busy = False
        self._d2h_changed: simpy.Event | None = None

    def resource(self, direction: Direction) -> simpy.Resource:
        return self.resources[self.index[direction]]

    def full_speed_us(self, nbytes: int, direction: Direction) -> float:
        """Microseconds a copy holds its lane when nothing slows it."""
        return self.device.copy_time(nbytes, direction, TimeUnit.US)

    def _copy_us(self, nbytes: int, direction: Direction) -> float:
        """How long a copy starting now holds its lane."""
        if self.slow is None:
            return self.full_speed_us(nbytes, direction)
        start = self.env.now + self.fixed_us
        work = nbytes * 1e6 / self.device.bandwidth(direction)
        return self.slow.finish_us(start, work) - self.env.now

    def transfer(
        self, nbytes: int, direction: Direction
    ) -> Generator[simpy.Event, Any, simpy.Interrupt | None]:
        """Move `nbytes` on the lane the caller already holds.

        A copy that has started runs to its end (NOTE [ Stopping a job ] in
        sim/model.py): if the caller's process is interrupted meanwhile, the
        `Interrupt` is returned, for the caller to raise once it has put the
        buffer where the copy leaves it."""
        env = self.env
        if direction is Direction.D2H or self.duplex_factor == 1.0:
            busy = direction is Direction.D2H and self.duplex_factor != 1.0
            if busy:
                self._set_d2h_busy(True)
            done = env.timeout(self._copy_us(nbytes, direction))
            try:
                yield done
            except simpy.Interrupt as stop:
                yield done
                return stop
            finally:
                if busy:
                    self._set_d2h_busy(False)
            return None
        # H2D beside a D2H lane: the rate changes whenever a D2H copy starts
        # or ends, so wait for whichever comes first -- the end of the copy at
        # the current rate, or the change -- and carry over what is left,
        # counted in microseconds at full speed.
        stop = None
        if self.fixed_us:
            done = env.timeout(self.fixed_us)
            try:
                yield done
            except simpy.Interrupt as e:
                stop = e
                yield done
        left = nbytes * 1e6 / self.device.bandwidth(direction)
        while left > 1e-9:
            factor = self.duplex_factor if self._d2h_busy else 1.0
            if self._d2h_changed is None:
                self._d2h_changed = env.event()
            changed = self._d2h_changed
            t0 = env.now
            slow = self.slow
            until = left / factor if slow is None else slow.finish_us(t0, left, factor) - t0
            either = env.timeout(until) | changed
            try:
                yield either
            except simpy.Interrupt as e:
                stop = e
                yield either
            if not changed.triggered:
                left = 0.0
            elif slow is None:
                left -= (env.now - t0) * factor
            else:
                left -= slow.work_us(t0, env.now, factor)
        return stop

    def _set_d2h_busy(self, busy: bool) -> None:
        self._d2h_busy = busy
        if self._d2h_changed is not None:
            ev, self._d2h_changed = self._d2h_changed, None
            ev.succeed()

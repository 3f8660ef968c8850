"""Device memory of one GPU: an accounted pool of bytes with a budget.

The pool only counts; deciding what to do when an allocation does not fit
is the model's OOM policy. Whoever waits for memory yields `changed()`, an
event that fires at the next free or when in-flight swap-outs are fewer --
no polling. Every change is recorded as a sample (time, job, kind, delta)
from which `sim.metrics` builds the memory curves.
"""

from __future__ import annotations

import simpy


class MemoryPool:
    def __init__(self, env: simpy.Environment, budget_bytes: int):
        self.env = env
        self.budget = budget_bytes
        self.used = 0
        # Bytes that swap-outs already triggered will return when their copies
        # end: what the `stall` policy may wait for.
        self.pending_out = 0
        # (time_us, job, kind index, +/- bytes) per change; peaks, per-job and
        # per-kind curves are cumulative sums over these (`sim.metrics`).
        self.samples: list[tuple[float, int, int, int]] = []
        self._changed: simpy.Event | None = None

    def fits(self, nbytes: int) -> bool:
        return self.used + nbytes <= self.budget

    @property
    def free_bytes(self) -> int:
        return self.budget - self.used

    def alloc(self, job: int, kind: int, nbytes: int) -> None:
        """Take `nbytes` (the caller checked `fits` or chose to overrun)."""
        self.used += nbytes
        self.samples.append((self.env.now, job, kind, nbytes))

    def free(self, job: int, kind: int, nbytes: int) -> None:
        self.used -= nbytes
        self.samples.append((self.env.now, job, kind, -nbytes))
        if self._changed is not None:
            self.notify()

    def add_pending_out(self, nbytes: int) -> None:
        self.pending_out += nbytes
        if nbytes < 0:
            self.notify()

    def changed(self) -> simpy.Event:
        """An event that fires when memory is freed or pending swap-outs shrink."""
        if self._changed is None:
            self._changed = self.env.event()
        return self._changed

    def notify(self) -> None:
        if self._changed is not None:
            ev, self._changed = self._changed, None
            ev.succeed()

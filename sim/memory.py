"""Device memory of one GPU: a pool of bytes with a budget, the buffers that
hold them, and the OOM policy.

A process that needs bytes that may not fit does `yield from pool.get(...)`:
it returns once they fit -- evicting or waiting as the policy says -- or
raises `OutOfMemory`; the caller takes the bytes before it yields again, so
nothing runs in between. One class per `OomPolicy` (`POOLS` in
sim/model.py): `MemoryPool` itself fails, `StallPool` waits on `changed()`,
an event the pool succeeds when bytes are freed or in-flight swap-outs
shrink (no polling), and `PassivePool` and `DtrPool` (sim/dtr.py) also evict
(`victim`, `evict`). Every change of the bytes is recorded as a sample
(time, job, kind, delta) from which `sim.metrics` builds the memory curves.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import simpy
from memplan.sim.log import LogEntry, LogKind
from memplan.sim.state import DEV, LEAVING, OFF, Gen, JobState

if TYPE_CHECKING:
    from memplan.sim.model import GpuModel

K = LogKind

# NOTE [ Out of memory ]
# An allocation that does not fit the budget raises `OutOfMemory` from
# `MemoryPool.get`; the process that asked catches it at its top and stops
# its job (`GpuModel.stop`: logs `oom`, returns the job's memory, other jobs
# go on; NOTE [ Stopping a job ] in sim/model.py). Per policy:
# - `fail` (`MemoryPool`): at once.
# - `stall` (`StallPool`): waits for `changed()` while the free bytes plus
#   those that triggered swap-outs will return (`pending_out`) could cover
#   it, else it is an OOM; other frees wake it too, and it checks again.
# - `passive` (`PassivePool`, Capuchin's passive mode applied to the shared
#   pool): evicts the least recently used buffer on the device -- of any
#   job, as long as its job's current op does not use it and no copy of it
#   is running -- with a synchronous swap-out on the lane (`CopyEngine.
#   copy_out`; one that only drops the device copy when the host copy is
#   valid), until the allocation fits; with nothing left to evict it
#   behaves as `stall`. Each eviction and each on-demand fetch counts as a
#   passive swap of the job that owns the buffer (as do its bytes); the wait
#   is stall of the job that needed the room. Recency is an op's start (for
#   every buffer it accesses), an allocation, or the end of a swap-in.
# - `dtr` (`DtrPool`): evicts by DTR's heuristic instead, dropping what can be
#   remade or fetched and swapping out the rest (NOTE [ DTR ] in sim/remat.py);
#   then as `passive`.
# Every buffer a policy evicts -- its device copy freed by the eviction --
# counts for the job that owns it (`JobState.evictions`, `evicted_bytes`).
# Prefetching swap-ins make room the same way, but their waiting is not
# compute stall (`on_compute=False`): only the job's own process logs
# `stall_start` (when it first waits on `changed()`, not while it evicts)
# and `stall_end`, and counts the whole time, evictions included, as stall.


class OutOfMemory(Exception):
    """An allocation for `op` (-1: at the start of an iteration) whose first
    buffer is `buffer` cannot fit under the pool's policy."""

    def __init__(self, op: int, buffer: int):
        super().__init__(op, buffer)
        self.op = op
        self.buffer = buffer


class MemoryPool:
    """Bytes on the device and the buffers holding them; the `fail` policy."""

    passive = False  # keeps `lru` (PassivePool)
    dtr = False  # keeps `tables` of what can be remade, and recency (DtrPool)

    def __init__(self, model: GpuModel, budget_bytes: int):
        self.model = model
        self.env = model.env
        self.budget = budget_bytes
        self.used = 0
        # Bytes that swap-outs already triggered will return when their copies
        # end: what the `stall` policy may wait for.
        self.pending_out = 0
        # (time_us, job, kind index, +/- bytes) per change; peaks, per-job and
        # per-kind curves are cumulative sums over these (`sim.metrics`).
        self.samples: list[tuple[float, int, int, int]] = []
        self._changed: simpy.Event | None = None

    # ---- bytes -----------------------------------------------------------------------
    def fits(self, nbytes: int) -> bool:
        return self.used + nbytes <= self.budget

    @property
    def free_bytes(self) -> int:
        return self.budget - self.used

    def alloc(self, job: int, kind: int, nbytes: int) -> None:
        """Take `nbytes` (the caller checked `fits` or made room with `get`)."""
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

    # ---- buffers (the passive and dtr pools also keep their recency) ---------------
    def take(self, s: JobState, b: int) -> None:
        """Allocate `b`'s bytes; it is on the device and usable."""
        c = s.c
        n = c.nbytes[b]
        self.used += n
        self.samples.append((self.env.now, c.index, c.kind[b], n))
        s.where[b] = DEV

    def drop(self, s: JobState, b: int) -> None:
        """Free the device copy of `b` (DEV, or LEAVING with no copy running)."""
        c = s.c
        s.where[b] = OFF
        n = c.nbytes[b]
        self.used -= n
        self.samples.append((self.env.now, c.index, c.kind[b], -n))
        if self._changed is not None:
            self.notify()

    def stay(self, s: JobState, b: int) -> None:
        """`b`, leaving, stays on the device (its swap-out found it needed)."""
        s.where[b] = DEV

    def leave(self, s: JobState, b: int) -> None:
        """`b` is leaving: its swap-out owns the bytes."""
        s.where[b] = LEAVING

    def touch(self, s: JobState, bufs: tuple[int, ...]) -> None:
        """`bufs` are used now (an op starts); recency for `DtrPool`."""

    # ---- the policy ------------------------------------------------------------------
    def get(self, s: JobState, nbytes: int, op: int, b: int, on_compute: bool) -> Gen:
        """Return once `nbytes` fit, or raise `OutOfMemory` (NOTE [ Out of
        memory ]). `on_compute`: the job's own process asks, so waiting is
        stall; `op` and `b` name the allocation in the log."""
        if not self.fits(nbytes):
            raise OutOfMemory(op, b)
        return
        yield  # a generator, as the waiting policies' `get`


class StallPool(MemoryPool):
    """The `stall` policy: wait for memory that in-flight swap-outs will return."""

    def victim(self) -> tuple[int, int] | None:
        """(job, buffer) to evict before waiting; none under `stall`."""
        return None

    def get(self, s: JobState, nbytes: int, op: int, b: int, on_compute: bool) -> Gen:
        if self.fits(nbytes):
            return
        if nbytes > self.budget:
            raise OutOfMemory(op, b)
        env, model = self.env, self.model
        t0, stalled = env.now, False
        while not self.fits(nbytes):
            victim = self.victim()
            if victim is not None:
                owner = model.jobs[victim[0]]
                yield from self.evict(owner, victim[1], op if owner is s else -1)
                continue
            if self.free_bytes + self.pending_out < nbytes:
                raise OutOfMemory(op, b)
            if on_compute and not stalled:
                stalled = True
                model.log.append(LogEntry(env.now, s.c.index, s.iteration, K.STALL_START, op, b))
            yield self.changed()
            if s.stopped:  # NOTE [ Stopping a job ]: by a process this event woke first
                yield env.event()  # the interrupt on its way lands here
        if stalled:
            model.log.append(LogEntry(env.now, s.c.index, s.iteration, K.STALL_END, op, b))
        if on_compute:
            s.stall_us += env.now - t0

    def evict(self, owner: JobState, b: int, op: int) -> Gen:
        """Evict `owner`'s buffer `b` for an allocation of op `op` (-1: of
        another job): a synchronous swap-out, or a discard with a host copy."""
        yield from self.model.copies.copy_out(owner, b, op, True)


class PassivePool(StallPool):
    """The `passive` policy: evict the least recently used buffer first."""

    passive = True

    def __init__(self, model: GpuModel, budget_bytes: int):
        super().__init__(model, budget_bytes)
        # (job, buffer) of every resident buffer, least recently used first
        self.lru: dict[tuple[int, int], None] = {}

    def victim(self) -> tuple[int, int] | None:
        jobs = self.model.jobs
        return next((k for k in self.lru if k[1] not in jobs[k[0]].pinned), None)

    def take(self, s: JobState, b: int) -> None:
        MemoryPool.take(self, s, b)
        self.lru[(s.c.index, b)] = None

    def drop(self, s: JobState, b: int) -> None:
        c = s.c
        s.where[b] = OFF
        self.lru.pop((c.index, b), None)
        self.free(c.index, c.kind[b], c.nbytes[b])

    def stay(self, s: JobState, b: int) -> None:
        s.where[b] = DEV
        self.lru[(s.c.index, b)] = None

    def leave(self, s: JobState, b: int) -> None:
        s.where[b] = LEAVING
        self.lru.pop((s.c.index, b), None)

"""Device memory of one GPU: a pool of bytes with a budget, the buffers that
hold them, and the OOM policy.

A process that needs bytes that may not fit does `yield from pool.get(...)`:
it returns once they fit -- evicting or waiting as the policy says -- or
raises `OutOfMemory`; the caller takes the bytes before it yields again, so
nothing runs in between. One class per `OomPolicy` (`POOLS` in
sim/model.py): `MemoryPool` itself fails, `StallPool` waits on `changed()`,
an event the pool succeeds when bytes are freed or in-flight swap-outs
shrink (no polling), and `PassivePool` and `DtrPool` (sim/dtr.py) also evict
(`victim`, `evict`: through the copy engine, `copies`). Under an allocator
model a pool holds its `ledger` (sim/ledger.py). Every change of the bytes
is recorded as a sample (time, job, kind, delta) from which `sim.metrics`
builds the memory curves.
"""

from __future__ import annotations

from typing import Any, Protocol

import simpy
from memplan.hwmodels.device import DeviceModel
from memplan.planners.core.lifecycle import Do, Event
from memplan.sim.errors import OutOfMemory
from memplan.sim.job import CompiledJob
from memplan.sim.ledger import BlockLedger, CachingLedger
from memplan.sim.log import Log, LogEntry, LogKind, Rows
from memplan.sim.state import Gen, JobState
from memplan.traces.model import BUFFER_KINDS, BufferKind

K = LogKind
OTHER = BUFFER_KINDS.index(BufferKind.OTHER)  # the kind workspaces and contexts are counted as

# NOTE [ Out of memory ]
# An allocation that does not fit raises `OutOfMemory` from `MemoryPool.get`;
# the process that asked stops its job (NOTE [ Stopping a job ]). Per policy:
# `fail` (`MemoryPool`) at once; `stall` (`StallPool`) waits for `changed()`
# while free bytes plus pending swap-outs could cover it; `passive`
# (`PassivePool`, Capuchin's passive mode on the shared pool) evicts the
# least recently used buffer of any job that no current op uses and no copy
# reads (a synchronous swap-out, or a discard with a valid host copy) until
# it fits, then stalls; `dtr` (`DtrPool`) evicts by DTR's heuristic (NOTE [
# DTR ]). Evictions and on-demand fetches are passive swaps of the owner;
# the wait is stall of the job that needed the room (a prefetching swap-in's
# is not compute stall). Long form: docs/notes.md, "Out of memory".


class SwapsOut(Protocol):
    """What a pool evicts through: the copy engine (sim/copies.py)."""

    def copy_out(self, s: JobState, b: int, op: int, passive: bool) -> Gen: ...


class MemoryPool:
    """Bytes on the device and the buffers holding them; the `fail` policy.

    It runs on the clock `env` for `jobs` (their list, shared with the model),
    logs stalls and evictions to `log`; `device` prices what DTR remakes.
    `ledger`, under an allocator model, mirrors every allocation as a block;
    a `CachingLedger` also decides what fits (`caching`). `copies`, which
    evictions swap out through, is set once the copy engine exists."""

    passive = False  # keeps `lru` (PassivePool)
    dtr = False  # keeps `tables` of what can be remade, and recency (DtrPool)

    def __init__(
        self,
        env: simpy.Environment,
        jobs: list[JobState],
        log: Log,
        budget_bytes: int,
        device: DeviceModel,
        ledger: BlockLedger | None = None,
    ):
        self.env = env
        self.jobs = jobs
        self.log = log
        self.device = device
        self.ledger = ledger
        self.caching = ledger if isinstance(ledger, CachingLedger) else None
        self.copies: SwapsOut | None = None
        self.budget = budget_bytes
        self.used = 0
        # Bytes that swap-outs already triggered will return when their copies
        # end: what the `stall` policy may wait for.
        self.pending_out = 0
        # (time_us, job, kind index, +/- bytes) per change; peaks, per-job and
        # per-kind curves are cumulative sums over these (`sim.metrics`).
        self.samples = Rows(3)  # NOTE [ A flat log ] in sim/log.py
        self._row = self.samples.flat.extend
        self._changed: simpy.Event | None = None
        # NOTE [ Pinned host memory ]: bytes off the device with a valid host copy
        self.parked_bytes = self.parked_peak = 0
        # the samples that are contexts (NOTE [ Context reserve ])
        self.context_rows: list[int] = []

    # ---- bytes -----------------------------------------------------------------------
    def fits(self, nbytes: int) -> bool:
        if self.caching is None:
            return self.used + nbytes <= self.budget
        return self.caching.fits(nbytes)

    @property
    def free_bytes(self) -> int:
        if self.caching is None:
            return self.budget - self.used
        return self.caching.room()

    def alloc(self, job: int, kind: int, nbytes: int) -> None:
        """Take `nbytes` no buffer holds yet, a swap-in's before it lands (the
        caller checked `fits` or made room with `get`)."""
        if self.ledger is not None:
            self.ledger.alloc(job, nbytes)
        self._add(job, kind, nbytes)

    def free(self, job: int, kind: int, nbytes: int) -> None:
        """Give back bytes no buffer holds: `alloc`'s, or a dead buffer's that
        its copy read to the end."""
        if self.ledger is not None:
            self.ledger.free(job, nbytes)
        self._sub(job, kind, nbytes)

    def _add(self, job: int, kind: int, nbytes: int) -> None:
        self.used += nbytes
        self._row((self.env.now, job, kind, nbytes))

    def _sub(self, job: int, kind: int, nbytes: int) -> None:
        self.used -= nbytes
        self._row((self.env.now, job, kind, -nbytes))
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
    # The pool moves bytes; the buffer's state is `JobState.apply`'s, which the
    # caller runs first and whose `Do` it hands to `act`.
    def act(self, s: JobState, b: int, do: int) -> None:
        """The bytes part of a transition's `do` for buffer `b`."""
        if do & Do.DROP:
            self.drop(s, b)
        elif do & Do.TAKE:
            self._take_or_undo(s, b)
        elif do & Do.STAY:
            self.stay(s, b)
        elif do & Do.LEAVE:
            self.leave(s, b)
        elif do & Do.DETACH and self.ledger is not None:  # its copy still reads the bytes
            self.ledger.detach(s, b)

    def _take_or_undo(self, s: JobState, b: int) -> None:
        """`take`; if an allocator model refuses the bytes, `b` is not on the
        device after all (the `OutOfMemory` then stops the job)."""
        try:
            self.take(s, b)
        except OutOfMemory:
            s.apply(b, Event.TAKE_FAILED)
            raise

    def take(self, s: JobState, b: int) -> None:
        """Allocate `b`'s bytes; it is on the device and usable."""
        c = s.c
        if self.ledger is not None:  # its block first: an allocator model may refuse it
            self.ledger.take(s, b)
        kind, n = c.kind_bytes[b]
        self.used += n
        self._row((self.env.now, c.index, kind, n))
        if s.n_parked and s.parked[b]:  # made again on the device while its host copy holds
            self.unpark(s, b)

    def drop(self, s: JobState, b: int) -> None:
        """Free the device copy of `b` (DEV, or LEAVING with no copy running)."""
        c = s.c
        if self.ledger is not None:
            self.ledger.drop(s, b)
        kind, n = c.kind_bytes[b]
        self.used -= n
        self._row((self.env.now, c.index, kind, -n))
        if s.host[b] and s.alive[b]:
            self.park(s, b)
        if self._changed is not None:
            self.notify()

    def stay(self, s: JobState, b: int) -> None:
        """`b` is on the device to stay: leaving, its swap-out found it
        needed; or arrived, its swap-in is over."""
        if self.ledger is not None:
            self.ledger.stay(s, b)
        if s.n_parked and s.parked[b]:
            self.unpark(s, b)

    def leave(self, s: JobState, b: int) -> None:
        """`b` is leaving: its swap-out owns the bytes."""

    def touch(self, s: JobState, bufs: tuple[int, ...]) -> None:
        """`bufs` are used now (an op starts); recency for `DtrPool`."""

    def plan_changed(self, c: CompiledJob) -> None:
        """Job `c` runs a new plan from now on (what `DtrPool` may remake depends on it)."""

    # NOTE [ Pinned host memory ]
    # The pinned host memory a plan needs is the most bytes off the device at
    # once whose data lives in a host copy a swap made: a buffer is parked
    # from the moment its device copy is freed while it is alive with a valid
    # host copy (the end of a swap-out, a discard, a release, an eviction)
    # until it is on the device again (its swap-in or fetch is over, or a
    # recompute made it) or its life ends. A host copy that stays valid
    # beside a device copy is not counted, nor the pinned staging of a copy
    # while it runs. Per job and for the device (`parked_peak`).
    def park(self, s: JobState, b: int) -> None:
        if s.parked[b]:
            return
        s.parked[b] = True
        s.n_parked += 1
        n = s.c.nbytes[b]
        s.parked_bytes += n
        s.parked_peak = max(s.parked_peak, s.parked_bytes)
        self.parked_bytes += n
        self.parked_peak = max(self.parked_peak, self.parked_bytes)

    def unpark(self, s: JobState, b: int) -> None:
        s.parked[b] = False
        s.n_parked -= 1
        n = s.c.nbytes[b]
        s.parked_bytes -= n
        self.parked_bytes -= n

    # ---- bytes that are no buffer: workspaces and CUDA contexts --------------------
    def take_scratch(self, s: JobState, nbytes: int) -> None:
        """An op's workspace, for the op's duration (caller checked it fits)."""
        if self.ledger is not None:
            self.ledger.take_scratch(s.c.index, nbytes)
        s.scratch_bytes += nbytes
        self._add(s.c.index, OTHER, nbytes)

    def drop_scratch(self, s: JobState, nbytes: int) -> None:
        if self.ledger is not None:
            self.ledger.drop_scratch(s.c.index)
        s.scratch_bytes -= nbytes
        self._sub(s.c.index, OTHER, nbytes)

    def fits_context(self, nbytes: int) -> bool:
        if self.caching is None:
            return self.fits(nbytes)
        return nbytes <= self.caching.room()

    def hold_context(self, s: JobState, nbytes: int) -> None:
        """The job's CUDA context, from its arrival to its end (NOTE [ Context
        reserve ] in sim/simulate.py); no room for it is out of memory."""
        if not self.fits_context(nbytes):
            raise OutOfMemory(-1, -1)
        s.context_bytes = nbytes
        self.used += nbytes
        self.context_rows.append(len(self.samples))
        self.samples.add(self.env.now, (s.c.index, OTHER, nbytes))
        if self.caching is not None:
            self.caching.hold_context(s.c.index, nbytes)

    def end_job(self, s: JobState) -> None:
        """The job is over: its context, workspace and parked bytes go."""
        context = s.context_bytes
        if s.scratch_bytes:
            self.drop_scratch(s, s.scratch_bytes)
        if context:
            self.context_rows.append(len(self.samples))
            self._sub(s.c.index, OTHER, context)
            s.context_bytes = 0
        for b, parked in enumerate(s.parked):
            if parked:
                self.unpark(s, b)
        if self.caching is not None:
            self.caching.end_job(s.c.index, context)

    # ---- groups: all at once, or one block at a time under an allocator model --------
    # (a ledger allocates one block per tensor, as PyTorch does)
    def make_group(self, s: JobState, bufs: tuple[int, ...], nbytes: int, op: int, b: int) -> Gen:
        """New lives of `bufs` (`GpuModel._create`), `nbytes` in all, once
        room is made under the policy (`op` and `b` name the allocation)."""
        if self.ledger is not None:
            yield from self.make_each(s, bufs, op)
            return
        if nbytes and not self.fits_job(s, nbytes):
            yield from self.get(s, nbytes, op, b, True)
        for x in bufs:
            s.create(x)
            self.take(s, x)

    def take_group(self, s: JobState, bufs: list[int], op: int, target: int) -> Gen:
        """Allocate the absent `bufs` an op re-run for `target` writes."""
        if self.ledger is not None:
            nb = s.c.nbytes
            for w in bufs:
                if not self.fits_job(s, nb[w]):
                    yield from self.get(s, nb[w], op, target, True)
                self.act(s, w, s.apply(w, Event.REMAKE))
            return
        nbytes = sum(s.c.nbytes[w] for w in bufs)
        if nbytes and not self.fits_job(s, nbytes):
            yield from self.get(s, nbytes, op, target, True)
        for w in bufs:
            self.act(s, w, s.apply(w, Event.REMAKE))

    def make_each(self, s: JobState, bufs: tuple[int, ...], op: int) -> Gen:
        """`make_group` one buffer at a time, making room for each."""
        nbytes = s.c.nbytes
        for b in bufs:
            if not self.fits_job(s, nbytes[b]):
                yield from self.get(s, nbytes[b], op, b, True)
            s.create(b)
            self._take_or_undo(s, b)

    def scratch_for(self, s: JobState, nbytes: int, op: int) -> Gen:
        """Op `op`'s workspace of `nbytes`, once room is made under the policy."""
        if not self.fits_job(s, nbytes):
            yield from self.get(s, nbytes, op, -1, True)
        self.take_scratch(s, nbytes)

    # ---- what may fit, for the policies -------------------------------------------
    def fits_job(self, s: JobState, nbytes: int) -> bool:
        """Whether `nbytes` of job `s` fit now (the caching allocator asks its blocks)."""
        if self.caching is None:
            return self.used + nbytes <= self.budget
        return self.caching.fits_job(s, nbytes)

    def never_fits(self, nbytes: int) -> bool:
        """`nbytes` could not fit even with the device empty."""
        if self.caching is None:
            return nbytes > self.budget
        return self.caching.never_fits(nbytes)

    def may_fit_later(self, s: JobState, nbytes: int) -> bool:
        """Swap-outs in flight could still make room for `nbytes` (under the
        caching allocator, any of them: it may free a whole segment)."""
        if self.caching is None:
            return self.free_bytes + self.pending_out >= nbytes
        return self.pending_out > 0

    # ---- the policy ------------------------------------------------------------------
    def get(self, s: JobState, nbytes: int, op: int, b: int, on_compute: bool) -> Gen:
        """Return once `nbytes` fit, or raise `OutOfMemory` (NOTE [ Out of
        memory ]). `on_compute`: the job's own process asks, so waiting is
        stall; `op` and `b` name the allocation in the log."""
        if not self.fits_job(s, nbytes):
            raise OutOfMemory(op, b)
        return
        yield  # a generator, as the waiting policies' `get`


class StallPool(MemoryPool):
    """The `stall` policy: wait for memory that in-flight swap-outs will return."""

    def victim(self) -> tuple[int, int] | None:
        """(job, buffer) to evict before waiting; none under `stall`."""
        return None

    def get(self, s: JobState, nbytes: int, op: int, b: int, on_compute: bool) -> Gen:
        if self.fits_job(s, nbytes):
            return
        if self.never_fits(nbytes):
            raise OutOfMemory(op, b)
        env, log = self.env, self.log
        t0, stalled = env.now, False
        while not self.fits_job(s, nbytes):
            victim = self.victim()
            if victim is not None:
                owner = self.jobs[victim[0]]
                yield from self.evict(owner, victim[1], op if owner is s else -1)
                continue
            if not self.may_fit_later(s, nbytes):
                raise OutOfMemory(op, b)
            if on_compute and not stalled:
                stalled = True
                log.append(LogEntry(env.now, s.c.index, s.iteration, K.STALL_START, op, b))
            yield self.changed()
            if s.stopped:  # NOTE [ Stopping a job ]: by a process this event woke first
                yield env.event()  # the interrupt on its way lands here
        if stalled:
            log.append(LogEntry(env.now, s.c.index, s.iteration, K.STALL_END, op, b))
        if on_compute:
            s.stall_us += env.now - t0

    def evict(self, owner: JobState, b: int, op: int) -> Gen:
        """Evict `owner`'s buffer `b` for an allocation of op `op` (-1: of
        another job): a synchronous swap-out, or a discard with a host copy."""
        yield from self.copies.copy_out(owner, b, op, True)


class PassivePool(StallPool):
    """The `passive` policy: evict the least recently used buffer first."""

    passive = True

    def __init__(self, *parts: Any, **named: Any):  # as `MemoryPool` takes them
        super().__init__(*parts, **named)
        # (job, buffer) of every resident buffer, least recently used first
        self.lru: dict[tuple[int, int], None] = {}

    def victim(self) -> tuple[int, int] | None:
        jobs = self.jobs
        return next((k for k in self.lru if k[1] not in jobs[k[0]].pinned), None)

    def take(self, s: JobState, b: int) -> None:
        super().take(s, b)
        self.lru[(s.c.index, b)] = None

    def drop(self, s: JobState, b: int) -> None:
        self.lru.pop((s.c.index, b), None)
        super().drop(s, b)

    def stay(self, s: JobState, b: int) -> None:
        self.lru[(s.c.index, b)] = None
        super().stay(s, b)

    def leave(self, s: JobState, b: int) -> None:
        self.lru.pop((s.c.index, b), None)

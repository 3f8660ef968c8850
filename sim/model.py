"""The SimPy model of one GPU: compute, PCIe lane(s) and device memory.

One process per job walks its ops; every planned copy is a process of its
own (`CopyEngine`). Processes wait on events only -- the compute resource,
lane requests, copy-done events, the memory pool's `changed()` -- never
poll; a job that stops interrupts its processes. Everything observable goes
to `GpuModel.log` and the pool's samples.

Times inside the model are microseconds (op durations are rounded to 1 ns),
so hand-worked cases with whole milliseconds come out exact.
"""

from __future__ import annotations

from collections.abc import Sequence

import simpy
from memplan.hwmodels.device import DeviceModel
from memplan.sim.clock import Clock
from memplan.sim.copies import CopyEngine
from memplan.sim.dynamics import Dynamics, SlowLanes
from memplan.sim.errors import SimError
from memplan.sim.job import IN, OUT, REL, CompiledJob
from memplan.sim.ledger import POOLS, pool_class
from memplan.sim.log import CODE, Log, LogEntry, LogKind
from memplan.sim.memory import OutOfMemory
from memplan.sim.pcie import Pcie
from memplan.sim.recompute import recompute
from memplan.sim.remat import remake
from memplan.sim.state import ARRIVING, DEV, LEAVING, OFF, Allocator, Gen, JobState, OomPolicy
from memplan.sim.stream import ComputeStream
from simpy.core import EmptySchedule

K = LogKind
__all__ = ["POOLS", "GpuModel"]  # POOLS: the pool of each OOM policy (sim/ledger.py)


# NOTE [ Event semantics ]
# Who does what: the job's process (`_job`) walks the ops, triggers plan
# events (`_trigger`), waits for swap-ins and swap-out deadlines, makes
# absent inputs present (`_ensure`: recompute, or `CopyEngine.fetch`) and
# asks the pool for its outputs' bytes (`MemoryPool.get`, which applies the
# OOM policy). Planned swaps run in processes the `CopyEngine` starts;
# evictions and fetches run in the process that needs them.
# - SwapOut: at its trigger the buffer is marked leaving (still usable); after
#   the delay it queues for the D2H lane; the device memory is freed when the
#   copy ends. If the buffer already has a valid host copy, no bytes move: the
#   device copy is dropped when the delay ends (a `discard`; with no delay, at
#   the trigger, before the next op takes its outputs).
# - Host copies: a host copy is valid from the end of a D2H copy until an op
#   writes the buffer (in-place update, optimizer step) or the framework frees
#   it; a swap-in does not drop it (TENSILE). A copy that overlaps a writing
#   op at all is stale.
# - The framework's own free (`Buffer.freed_after`) of a buffer whose swap-out
#   copy is running takes effect when the copy ends (the copy engine still
#   reads the memory, as with `record_stream`); the host copy is dropped. If
#   the copy has not started, the memory is freed at once and the swap-out is
#   dropped. A buffer that is off the device when the framework frees it just
#   loses its host copy.
# - SwapIn: at its trigger the buffer is marked arriving; ops that need it
#   wait. After the delay it queues for the H2D lane and takes its bytes when
#   the copy starts (if they do not fit, it lets go of the lane, makes room
#   under the OOM policy, takes the bytes and queues again). A SwapIn of a
#   buffer that is on the device does nothing; of a buffer whose swap-out has
#   not finished, it cancels that swap-out's free (no H2D copy).
#   The cancelled swap-out's D2H copy still runs, queued or not: the plan
#   may release the buffer later on the strength of that host copy, as
#   `planners.core.check` assumes (an eviction the passive net no longer
#   needs is dropped instead).
#   `before_op` does not start before the swap-in is done (stall time).
# - A swap-out's `before_op`, if set, does not start before its process is
#   over: the copy ended, or it found nothing to copy (stall time; planners
#   NOTE [ Swap-out deadlines ]). A swap-out that was skipped or discarded at
#   its trigger sets no wait.
# - A swap-out whose copy ends while the job's current op uses the buffer, or
#   of a buffer an op needed while it was leaving, keeps it on the device
#   (host copy made, memory not freed).
# - Release frees the device copy at once; of a leaving buffer it undoes a
#   cancelled free. A Release, SwapOut or SwapIn that finds nothing to act on
#   is logged as `skip`.
# - Recompute (on demand, as Capuchin): when `before_op` needs the absent
#   buffer, the chain's ops re-run on the compute stream, each taking its
#   latency. Each re-run op allocates its absent outputs when it starts, so
#   the recomputed buffer's bytes are taken again then; outputs other than
#   the recomputed buffer are temporaries, freed when the chain ends; writes
#   to buffers on the device are not redone. A source that is absent is made
#   present the way an op input is (its own Recompute before the same op,
#   its swap-in, an on-demand fetch). A temporary, or a source made by its
#   own Recompute, that the framework had already freed is made again for
#   the chain only: that life ends with the chain, like a framework free
#   (NOTE [ Incarnations ]).
# - An input absent with nothing scheduled is fetched on demand (a passive
#   swap) if a host copy exists; under `dtr`, one that can be remade is
#   remade (NOTE [ DTR ] in sim/remat.py); else the plan lost the data:
#   `SimError` (`planners.core.check` rejects such plans).
#
# NOTE [ Iteration boundary ]
# Iteration k ends when its last op ends; k+1 starts at once, with no barrier
# on pending copies. Persistent buffers keep their state (resident, off
# device with a host copy, or mid-copy). Every other buffer died during the
# iteration (the framework frees it at `freed_after`, at the latest after the
# last op): its host copy is gone, and a plan event of iteration k still
# pending for it (a long delay) is dropped. Inputs are allocated at the start
# of each iteration (no transfer is modelled); an input released at
# after_op=-1 is never loaded. No op runs between two iterations: while the
# next one makes room for its inputs, no buffer is in use (eviction and the
# end of a swap-out treat the last op's buffers like any other). A job
# allocates its persistent buffers when it arrives and returns all its memory
# when it ends or runs out of memory.
#
# NOTE [ Incarnations ]
# A non-persistent buffer lives once per iteration, from its creation to the
# framework's free; a recompute chain may make a dead one again for a while.
# Each life is an incarnation, numbered by `JobState.epoch[b]`, which the
# framework's free (`_framework_free`) bumps, as does the job's stop for
# every buffer (NOTE [ Stopping a job ]). All per-buffer state is the
# current incarnation's: the free clears `alive`, `host` and `keep`, and
# `_create` starts the next life clean. A process that outlives a
# wait (a delayed swap, a copy queued for or holding a lane, a swap-in, an
# eviction) captures the epoch when it starts and, after each wait, touches
# the buffer's state only if the epoch is unchanged -- else it only gives back
# bytes it took itself. State a process leaves while it runs records the
# epoch it belongs to, never a bare flag: `copying[b]` is the epoch whose D2H
# copy holds the lane. With ops much shorter than copies, iteration k's copy
# of b may still run when iteration k+1 frees its own b, whose swap-out is
# queued behind it: that b is not being copied, and its bytes are freed at
# once. A swap-in's `done` event likewise stays its own (`in_ev[b]` is
# cleared only by the process that set it).
#
# NOTE [ Op durations ]
# An op lasts what `DeviceModel.op_durations` predicts at usage 0, however
# many jobs are active. Kernels of different jobs queue FIFO on one compute
# resource: that queue is the time-slicing, so the usage a kernel is
# predicted at is the one it sees while it holds the device (hwmodels
# NOTE [ Usage under a compute queue ]: none), not the share the other jobs
# take. Each job's durations are therefore computed once, when it is compiled.
#
# NOTE [ Out of memory ] is in sim/memory.py, next to the pools that apply it.
#
# NOTE [ Stopping a job ]
# A job stops when its last iteration ends, or when one of its processes --
# its own, or a swap-in's -- gets `OutOfMemory` from the pool and calls
# `GpuModel.stop`. The stop returns the job's memory (the bytes a running
# copy reads come back when the copy ends), ends every buffer's life (bumps
# each epoch, NOTE [ Incarnations ], so that another job's process holding
# one of them -- an eviction -- finds the life over after its wait), and
# interrupts the job's other processes (`Process.interrupt`): its own and
# its planned copies still running (`JobState.copy_procs`). What was waiting
# to start is dropped at once: a delay, a place in the compute or a lane's
# queue (the request is cancelled), a wait for memory, a stall on a swap-in
# or a deadline (which logs its `stall_end` then). What has started runs to
# its end, as on a GPU: a kernel holds the compute stream until it ends
# (`_hold`), a copy its lane (`Pcie.transfer` hands the interrupt back, to
# be raised once the copy has put the buffer where it goes; an eviction of
# another job's buffer completes for that job). Interrupts are events, so
# two places read `stopped` instead: a copy process started in the instant
# its job stopped runs its first step before its interrupt lands (it
# returns at once), and the pool's `changed()` wakes its waiters in one
# step, so a waiter woken after the process that stopped its job waits for
# its interrupt rather than take memory (`StallPool.get`).


class GpuModel:
    """Compute, lanes and memory of one GPU, running `jobs` to the end."""

    def __init__(
        self,
        jobs: Sequence[CompiledJob],
        device: DeviceModel,
        budget_bytes: int,
        oom: OomPolicy,
        allocator: Allocator = Allocator.EXACT,
        context_bytes: int = 0,
        lanes: SlowLanes | None = None,
    ):
        env = self.env = Clock()
        self.n_events = 0
        self.compute = ComputeStream(env)
        self.shared = len(jobs) > 1  # alone, a job never queues for compute
        self.pcie = Pcie(env, device, lanes)
        self.policy = oom
        self.log = Log()  # NOTE [ A flat log ] in sim/log.py
        self.jobs = [JobState(c) for c in jobs]
        self.allocator = allocator
        self.context_bytes = context_bytes  # per job (NOTE [ Context reserve ] in sim/simulate.py)
        self.mem = pool_class(oom, allocator)(self, budget_bytes)
        self.copies = CopyEngine(self)
        self.dyn: Dynamics | None = None  # set by `simulate` when anything moves (sim/dynamics.py)

    def run(self) -> None:
        env = self.env
        for s in self.jobs:
            s.proc = env.process(self._job(s))
        if self.dyn is not None:
            self.dyn.start()
        # SimPy's `Environment.run()` to the end, counting the events it steps
        step, n = env.step, 0
        try:
            while True:
                step()
                n += 1
        except EmptySchedule:
            pass
        self.n_events = n + env.skipped
        stuck = [s.c.name for s in self.jobs if not s.stopped]
        if stuck:  # every wait is on something that happens: this is a model bug
            raise RuntimeError(f"simulation ended with jobs still waiting: {stuck}")

    def close(self) -> None:
        """Let go of the run's state once its result is built (NOTE [ Garbage
        collection in simulate ] in sim/simulate.py): the per-buffer and per-op
        lists, the log and the samples go at once, by reference count; the
        model itself is still a cycle (SimPy's environment, the pool's and
        copy engine's `model`) but a few small objects."""
        for s in self.jobs:
            vars(s).clear()
        vars(self).clear()

    # ---- the job process ---------------------------------------------------------------
    def _job(self, s: JobState) -> Gen:
        c, env = s.c, self.env
        try:
            if c.arrival_us:
                yield env.timeout(c.arrival_us)
            s.start_us = env.now
            dyn = self.dyn
            if dyn is not None:
                dyn.arrived(s)
            if self.context_bytes:
                self.mem.hold_context(s, self.context_bytes)
            yield from self.mem.make_group(s, c.persistent, c.persistent_bytes, -1, -1)
            for it in range(c.iterations):
                if dyn is not None:
                    dyn.iteration_starts(s, it)
                yield from self._iteration(s, it)
                if dyn is not None:
                    dyn.iteration_ended(s, it)
        except OutOfMemory as oom:
            self.stop(s, oom)
            return
        except simpy.Interrupt:
            return  # one of its copies ran out of memory (NOTE [ Stopping a job ])
        self.stop(s)

    def _iteration(self, s: JobState, it: int) -> Gen:
        c, env, mem, log = s.c, self.env, self.mem, self.log.append
        j = c.index
        s.iteration = it
        s.iter_start_us.append(env.now)
        log(LogEntry(env.now, j, it, K.ITER_START))
        if c.inputs:
            yield from mem.make_group(s, c.inputs, c.input_bytes, -1, c.inputs[0])
        if c.triggers[0]:
            self._trigger(s, c.triggers[0], it)
        ops, dur = c.ops, s.dur  # per op: (accs, need, create, create_bytes, writes, frees, after)
        where, alive, host, keep = s.where, s.alive, s.host, s.keep
        wcount, deadlines, ready = s.wcount, s.deadlines, s.ready_us
        ledger, scratch = mem.ledger, c.workspace  # NOTE [ Workspaces ] in sim/job.py
        shared, passive, compute, take = self.shared, mem.passive, self.compute, mem.take
        touch = mem.touch if mem.dtr else None
        row = self.log.flat.extend  # a log row, inline (NOTE [ A flat log ] in sim/log.py)
        start, end = CODE[K.OP_START], CODE[K.OP_END]
        skip_to = env.skip_to
        for i in c.order:  # the plan's order (NOTE [ Plans under another order ])
            acc, need, create, cbytes, writes, frees, after = ops[i]
            s.pinned = acc
            if deadlines:
                waits = deadlines.pop((it, i), None)
                if waits:
                    yield from self._await_copies(s, waits, i)
            for b in need:
                if where[b] != DEV:
                    yield from self._ensure(s, b, i)
            if cbytes:
                if ledger:  # an allocator model: block by block
                    yield from mem.make_each(s, create, i)
                else:
                    if not mem.fits(cbytes):
                        yield from mem.get(s, cbytes, i, create[0], True)
                    for b in create:  # `_create`, inline
                        alive[b] = True
                        host[b] = keep[b] = False
                        take(s, b)
            if scratch is not None and scratch[i]:
                yield from mem.scratch_for(s, scratch[i], i)
            if passive:  # recency for the LRU eviction, see NOTE [ Out of memory ]
                lru = mem.lru
                for b in acc:
                    key = (j, b)
                    if key in lru:
                        del lru[key]
                        lru[key] = None
            elif touch is not None:  # and for DTR's staleness (NOTE [ DTR ])
                touch(s, acc)
            if shared:
                ready[i] = env.now  # the queue's wait is IterationReport.op_queue_s
                req = compute.request()
                try:
                    yield req
                except simpy.Interrupt:  # the job stopped while queued
                    compute.cancel(req)
                    raise
            row((env.now, j, it, start, i, -1, -1))
            for b in writes:  # a copy overlapping the write in any way is stale
                host[b] = False
            if s.reading:  # NOTE [ Writes during a copy ] in sim/copies.py
                for b in writes:
                    wcount[b] += 1
            if not skip_to(env.now + dur[i]):  # NOTE [ Kernels that nothing interleaves ]
                kernel = env.timeout(dur[i])
                try:
                    yield kernel
                except simpy.Interrupt:
                    yield from self._hold(kernel, req if shared else None)
                    raise
            if shared:
                compute.release()
            if scratch is not None and scratch[i]:
                mem.drop_scratch(s, scratch[i])
            row((env.now, j, it, end, i, -1, -1))
            for b in writes:
                host[b] = False
            if s.reading:
                for b in writes:
                    wcount[b] += 1
            for b in frees:
                self._framework_free(s, b)
            if after:
                self._trigger(s, after, it)
        s.pinned = ()  # no op of this job runs until the next iteration's first
        s.iter_end_us.append(env.now)
        log(LogEntry(env.now, j, it, K.ITER_END))

    def _hold(self, kernel: simpy.Event, req: simpy.Event | None) -> Gen:
        """The job stopped while its kernel runs: the kernel holds the compute
        stream until it ends (NOTE [ Stopping a job ])."""
        yield kernel
        if req is not None:
            self.compute.release()

    def _await_copies(self, s: JobState, waits: list[tuple[int, simpy.Event]], i: int) -> Gen:
        """The swap-ins due before op `i`, and the swap-outs with it as deadline."""
        for b, done in waits:
            if not done.triggered:
                yield from self._stall_on(s, done, i, b)

    def _stall_on(self, s: JobState, ev: simpy.Event, i: int, b: int) -> Gen:
        env, j, it = self.env, s.c.index, s.iteration
        t0 = env.now
        self.log.append(LogEntry(t0, j, it, K.STALL_START, i, b))
        try:
            yield ev
        finally:  # also when the job stops meanwhile
            self.log.append(LogEntry(env.now, j, it, K.STALL_END, i, b))
            s.stall_us += env.now - t0

    def _ensure(self, s: JobState, b: int, i: int) -> Gen:
        """Make buffer `b`, which op `i` needs, usable (NOTE [ Event semantics ])."""
        while True:
            w = s.where[b]
            if w == DEV:
                return
            if w == LEAVING:
                s.keep[b] = True
                return
            if w == ARRIVING:
                yield from self._stall_on(s, s.in_ev[b], i, b)
                continue
            c = s.c
            rc = c.recompute.get((b, i))
            if rc is not None:
                yield from recompute(self, s, rc, i)
            elif s.host[b]:
                yield from self.copies.fetch(s, b, i)
            elif self.mem.dtr and self.mem.remakeable(s, b, i):  # NOTE [ DTR ]
                yield from remake(self, s, b, i)
            else:
                raise SimError(
                    f"job {c.index} ({c.name}), iteration {s.iteration}, op {i}: buffer {b} "
                    f"is absent with no host copy, no swap-in and no recompute "
                    f"(planners.core.check rejects this plan)"
                )
            if s.where[b] == OFF:  # a model bug: every branch delivers `b` or stops
                raise RuntimeError(f"buffer {b} still absent after being made present")

    # ---- buffers ---------------------------------------------------------------------
    def _create(self, s: JobState, b: int) -> None:
        """A new incarnation of `b`: alive, no host copy, on the device (the
        pool files it by that state)."""
        s.alive[b] = True
        s.host[b] = s.keep[b] = False
        self.mem.take(s, b)

    def _framework_free(self, s: JobState, b: int) -> None:
        """End this incarnation of `b` (NOTE [ Incarnations ])."""
        w, ep = s.where[b], s.epoch[b]
        s.alive[b] = s.host[b] = s.keep[b] = False
        s.epoch[b] = ep + 1  # pending events for this incarnation of `b` are void
        # A copy that is running for *this* incarnation still reads the bytes
        # and returns them when it ends; a copy of an earlier one (still on
        # the lane, ahead of this one's queued swap-out) does not own them.
        if w == DEV or (w == LEAVING and s.copying[b] != ep):
            self.mem.drop(s, b)
        elif w == LEAVING and self.mem.ledger:  # its copy still reads the bytes
            self.mem.detach(s, b)
        s.where[b] = OFF
        if s.n_parked and s.parked[b]:
            self.mem.unpark(s, b)

    def stop(self, s: JobState, oom: OutOfMemory | None = None) -> None:
        """The job ends, or ran out of memory (NOTE [ Stopping a job ])."""
        if s.stopped:
            return
        env = self.env
        if oom is not None:
            s.oom = (s.iteration, oom.op, oom.buffer)
            self.log.append(LogEntry(env.now, s.c.index, s.iteration, K.OOM, oom.op, oom.buffer))
        s.stopped = True
        s.end_us = env.now
        copying, epoch = s.copying, s.epoch
        for b, w in enumerate(s.where):
            if w == DEV or (w == LEAVING and copying[b] != epoch[b]):
                self.mem.drop(s, b)
            elif w == LEAVING and self.mem.ledger:
                self.mem.detach(s, b)
            epoch[b] += 1  # every life ends with the job
        self.mem.end_job(s)
        active = env.active_process
        if self.dyn is not None:
            self.dyn.left(s)
        for p in (s.proc, s.depart_proc, *s.copy_procs):
            if p is not None and p is not active and p.is_alive:
                p.interrupt()

    # ---- plan events -------------------------------------------------------------------
    def _trigger(self, s: JobState, events: tuple, it: int) -> None:
        env, log, where, mem = self.env, self.log.append, s.where, self.mem
        j = s.c.index
        for code, b, delay, before, next_it, _e, after in events:
            w = where[b]
            if code == REL:
                if w == DEV and s.alive[b]:
                    mem.drop(s, b)
                    log(LogEntry(env.now, j, it, K.RELEASE, after, b))
                elif w == LEAVING:
                    s.keep[b] = False
                    log(LogEntry(env.now, j, it, K.RELEASE, after, b))
                else:
                    log(LogEntry(env.now, j, it, K.SKIP, after, b))
            elif code == OUT:
                if w == DEV and s.alive[b] and not delay and s.host[b]:
                    # a discard without a delay is done here: a process would
                    # drop the copy only after the next op took its outputs,
                    # at the same instant, and the peak would count both
                    mem.drop(s, b)
                    log(LogEntry(env.now, j, it, K.DISCARD, after, b))
                elif w == DEV and s.alive[b]:
                    mem.leave(s, b)
                    s.keep[b] = False
                    mem.add_pending_out(s.c.nbytes[b])
                    over = None
                    if before >= 0:  # NOTE [ Swap-out deadlines ] in planners/core/plan.py
                        over = env.event()
                        s.deadlines.setdefault((it, before), []).append((b, over))
                    self.copies.swap_out(s, b, delay, after, over)
                else:
                    log(LogEntry(env.now, j, it, K.SKIP, after, b))
            elif code == IN:
                target = it + 1 if next_it else it
                if target >= s.c.iterations:
                    continue  # serves an iteration that will not run
                if w == ARRIVING:
                    s.deadlines.setdefault((target, before), []).append((b, s.in_ev[b]))
                elif w == OFF and s.alive[b] and s.host[b]:
                    where[b] = ARRIVING
                    done = s.in_ev[b] = env.event()
                    s.deadlines.setdefault((target, before), []).append((b, done))
                    self.copies.swap_in(s, b, delay, after, done)
                else:
                    if w == LEAVING:
                        s.keep[b] = True
                    log(LogEntry(env.now, j, it, K.SKIP, after, b))

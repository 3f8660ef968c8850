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
from memplan.planners.core.lifecycle import Ctx, Do, Event
from memplan.sim.clock import Clock
from memplan.sim.copies import CopyEngine
from memplan.sim.dtr import DtrPool
from memplan.sim.dynamics import Dynamics
from memplan.sim.errors import OutOfMemory, SimError
from memplan.sim.job import IN, OUT, REL, CompiledJob
from memplan.sim.ledger import ledger_for
from memplan.sim.log import CODE, Log, LogEntry, LogKind
from memplan.sim.memory import MemoryPool, PassivePool, StallPool
from memplan.sim.pcie import Pcie, SlowLanes
from memplan.sim.recompute import recompute
from memplan.sim.remat import remake
from memplan.sim.state import DEV, OFF, Allocator, Gen, JobState, OomPolicy
from memplan.sim.stream import ComputeStream
from simpy.core import EmptySchedule

K = LogKind
__all__ = ["POOLS", "GpuModel"]

# the pool of each OOM policy (NOTE [ Out of memory ] in sim/memory.py)
POOLS: dict[OomPolicy, type[MemoryPool]] = {
    OomPolicy.FAIL: MemoryPool,
    OomPolicy.STALL: StallPool,
    OomPolicy.PASSIVE: PassivePool,
    OomPolicy.DTR: DtrPool,
}


# NOTE [ Event semantics ]
# What an event does to a buffer is `planners.core.lifecycle.step` (its
# table: tests/semantics/test_lifecycle.py); this model decides when each
# happens. The job's process (`_job`) walks the ops, triggers plan events
# (`_trigger`), waits for swap-ins and swap-out deadlines, makes absent
# inputs present (`ensure`) and takes its outputs' bytes under the OOM
# policy. Planned swaps run in processes of their own (`CopyEngine`): a
# SwapOut's copy queues for the D2H lane after its delay (a discard with no
# delay happens at the trigger), a SwapIn's for the H2D lane, taking its
# bytes when it starts (if they do not fit it lets go of the lane, makes
# room and queues again). `before_op` waits for either (stall time; NOTE [
# Swap-out deadlines ]). A Recompute runs when `before_op` needs the buffer:
# the chain's ops re-run on the compute stream, each taking its absent
# outputs' bytes when it starts; outputs other than the buffer are
# temporaries freed when the chain ends; absent sources are made present as
# inputs are. An absent input with nothing scheduled is fetched (a passive
# swap) from a valid host copy, remade under `dtr` (NOTE [ DTR ]), or lost:
# `SimError`. The long form: docs/design.md, "What happens to a buffer".
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
# Each life is numbered by its epoch (`Buffers.epoch`, planners/core/
# lifecycle.py), which FREE and STOP bump; all per-buffer state is the
# current life's. A process that outlives a wait (a delayed swap, a copy on
# a lane, a swap-in, an eviction) captures the epoch when it starts and,
# after each wait, moves the buffer only if the epoch is unchanged -- else it
# gives back only the bytes it took itself. `copying[b]` is the epoch whose
# D2H copy holds the lane, so iteration k's copy still running when k+1
# frees its own b leaves that b's bytes free at once; `in_ev[b]` is cleared
# only by the process that set it.
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
# A job stops when its last iteration ends or one of its processes gets
# `OutOfMemory` (`GpuModel.stop`). Every life ends (STOP: bytes returned, a
# running copy's when it ends; epochs bumped, so another job's process
# holding one -- an eviction -- finds it over), and its other processes are
# interrupted (`JobState.copy_procs`). What waits to start is dropped: a
# delay, a queued compute or lane request, a wait for memory, a stall (which
# logs its `stall_end`). What has started runs to its end: a kernel holds the
# compute stream (`_hold`), a copy its lane (`Pcie.transfer` raises the
# interrupt once the copy has landed). A copy process started in the instant
# its job stopped, and a waiter woken by `changed()` after the stop, read
# `stopped` instead of waiting for their interrupt. Long form: docs/design.md.


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
        ledger = ledger_for(allocator, env, self.jobs, budget_bytes)  # sim/ledger.py
        self.mem = POOLS[oom](env, self.jobs, self.log, budget_bytes, device, ledger)
        self.copies = CopyEngine(env, self.mem, self.pcie, self.log, self.stop)
        self.mem.copies = self.copies  # evictions are synchronous swap-outs
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
        lists, the log and the samples go at once, by reference count. The
        pool and the copy engine hold each other (evictions go through the
        engine, whose copies take the pool's bytes): emptying the engine ends
        that cycle, and what is left to the collector is a few small objects."""
        for part in (*self.jobs, self.copies):
            vars(part).clear()
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
        ops, dur = c.ops, s.dur  # per op an `OpRow` (sim/job.py), unpacked by position
        where, created, written = s.where, s.create, s.written
        deadlines, ready = s.deadlines, s.ready_us
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
                    yield from self.ensure(s, b, i)
            if cbytes:
                if ledger:  # an allocator model: block by block
                    yield from mem.make_each(s, create, i)
                else:
                    if not mem.fits(cbytes):
                        yield from mem.get(s, cbytes, i, create[0], True)
                    for b in create:
                        created(b)
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
            if shared:  # requested and released by hand, not in a `with` block as `rerun`
                # does (sim/recompute.py): a lone job's kernel takes no request at all
                ready[i] = env.now  # the queue's wait is IterationReport.op_queue_s
                req = compute.request()
                try:
                    yield req
                except simpy.Interrupt:  # the job stopped while queued
                    compute.cancel(req)
                    raise
            row((env.now, j, it, start, i, -1, -1))
            if writes:  # a copy overlapping the write in any way is stale
                written(writes)
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
            if writes:
                written(writes)
            for b in frees:
                self.framework_free(s, b)
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

    def ensure(self, s: JobState, b: int, i: int) -> Gen:
        """Make buffer `b`, which op `i` needs, usable (NOTE [ Event semantics ])."""
        c = s.c
        while True:
            if s.where[b] == DEV:
                return
            rc = c.recompute.get((b, i))
            ctx = Ctx(
                recompute=rc is not None,
                remakeable=bool(self.mem.dtr and self.mem.remakeable(s, b, i)),  # NOTE [ DTR ]
            )
            do = s.apply(b, Event.NEED, ctx)
            if do == Do.NONE:  # leaving: it stays
                return
            if do == Do.STALL:
                yield from self._stall_on(s, s.in_ev[b], i, b)
                continue
            if do == Do.RECOMPUTE:
                yield from recompute(self, s, rc, i)
            elif do == Do.FETCH:
                yield from self.copies.fetch(s, b, i)
            elif do == Do.REMAKE_CHAIN:
                yield from remake(self, self.mem.tables[c.index], s, b, i)
            else:
                raise SimError(
                    f"job {c.index} ({c.name}), iteration {s.iteration}, op {i}: buffer {b} "
                    f"is absent with no host copy, no swap-in and no recompute "
                    f"(planners.core.check rejects this plan)"
                )
            if s.where[b] == OFF:  # a model bug: every branch delivers `b` or stops
                raise RuntimeError(f"buffer {b} still absent after being made present")

    # ---- buffers ---------------------------------------------------------------------
    def framework_free(self, s: JobState, b: int) -> None:
        """End this incarnation of `b` (NOTE [ Incarnations ]). A copy running
        for *this* incarnation still reads the bytes and returns them when it
        ends; a copy of an earlier one (still on the lane, ahead of this one's
        queued swap-out) does not own them."""
        do = s.free(b)
        if do:
            self.mem.act(s, b, do)
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
        act = self.mem.act
        for b, do in s.end_all():  # every life ends with the job
            act(s, b, do)
        self.mem.end_job(s)
        active = env.active_process
        if self.dyn is not None:
            self.dyn.left(s)
        for p in (s.proc, s.depart_proc, *s.copy_procs):
            if p is not None and p is not active and p.is_alive:
                p.interrupt()

    # ---- plan events -------------------------------------------------------------------
    def _trigger(self, s: JobState, events: tuple, it: int) -> None:
        env, log, mem = self.env, self.log.append, self.mem
        j = s.c.index
        for code, b, delay, before, next_it, _e, after in events:  # `Trigger`s
            if code == REL:
                do = s.apply(b, Event.RELEASE)
                mem.act(s, b, do)
                kind = K.RELEASE if do & Do.RELEASED else K.SKIP
                log(LogEntry(env.now, j, it, kind, after, b))
            elif code == OUT:
                do = s.apply(b, Event.SWAP_OUT, Ctx(delayed=bool(delay)))
                mem.act(s, b, do)
                if do & Do.COPY_D2H:
                    mem.add_pending_out(s.c.nbytes[b])
                    over = None
                    if before >= 0:  # NOTE [ Swap-out deadlines ] in planners/core/plan.py
                        over = env.event()
                        s.deadlines.setdefault((it, before), []).append((b, over))
                    self.copies.swap_out(s, b, delay, after, over)
                else:
                    # a discard without a delay is done here: a process would
                    # drop the copy only after the next op took its outputs,
                    # at the same instant, and the peak would count both
                    kind = K.DISCARD if do & Do.DISCARD else K.SKIP
                    log(LogEntry(env.now, j, it, kind, after, b))
            elif code == IN:
                target = it + 1 if next_it else it
                if target >= s.c.iterations:
                    continue  # serves an iteration that will not run
                do = s.apply(b, Event.SWAP_IN)
                if do == Do.JOIN:
                    s.deadlines.setdefault((target, before), []).append((b, s.in_ev[b]))
                elif do == Do.COPY_H2D:
                    done = s.in_ev[b] = env.event()
                    s.deadlines.setdefault((target, before), []).append((b, done))
                    self.copies.swap_in(s, b, delay, after, done)
                else:
                    log(LogEntry(env.now, j, it, K.SKIP, after, b))

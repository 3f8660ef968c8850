"""The copy engine: planned swaps, passive evictions and on-demand fetches,
each holding a PCIe lane while its bytes move.

Planned swaps are processes of their own (`swap_out`, `swap_in` start them
and list them in `JobState.copy_procs`); evictions (`copy_out` from the
passive pool's `get`) and fetches (`fetch`) run inside the process that
needs them. The semantics are in NOTE [ Event semantics ] of
`sim/model.py`; what a stop does to a copy in NOTE [ Stopping a job ].
"""

from __future__ import annotations

from collections.abc import Callable

import simpy
from memplan.planners.core.lifecycle import Ctx, Do, Event
from memplan.sim.errors import OutOfMemory
from memplan.sim.log import Log, LogEntry, LogKind
from memplan.sim.memory import MemoryPool
from memplan.sim.pcie import Direction, Pcie
from memplan.sim.state import ARRIVING, Gen, JobState

K = LogKind


class CopyEngine:
    """The copies of one GPU's jobs, on its lanes `pcie` and memory pool `mem`,
    logged to `log`; a planned swap-in that runs out of memory `stop`s its job."""

    def __init__(
        self,
        env: simpy.Environment,
        mem: MemoryPool,
        pcie: Pcie,
        log: Log,
        stop: Callable[[JobState, OutOfMemory], None],
    ):
        self.env = env
        self.mem = mem
        self.pcie = pcie
        self.log = log
        self.stop = stop

    # ---- planned copies: processes of their own --------------------------------------
    def swap_out(
        self, s: JobState, b: int, delay: float, after: int, over: simpy.Event | None
    ) -> None:
        """Start the planned swap-out of `b` (triggered: LEAVING, its bytes
        pending); `over` (its deadline's wait) succeeds when it is over."""
        s.copy_procs[self.env.process(self._swap_out(s, b, delay, after, over))] = None

    def swap_in(self, s: JobState, b: int, delay: float, after: int, done: simpy.Event) -> None:
        """Start the planned swap-in of `b` (triggered: ARRIVING); `done`
        succeeds when it is over, whether `b` arrived or not."""
        s.copy_procs[self.env.process(self._swap_in(s, b, delay, after, done))] = None

    def _swap_out(
        self, s: JobState, b: int, delay: float, after: int, over: simpy.Event | None
    ) -> Gen:
        env = self.env
        ep = s.epoch[b]
        try:
            try:
                if s.stopped:  # started in the instant its job stopped
                    return
                if delay:
                    yield env.timeout(delay)
            finally:
                self.mem.add_pending_out(-s.c.nbytes[b])
            if s.epoch[b] != ep:  # the framework freed `b` meanwhile (and its memory)
                self.log.append(LogEntry(env.now, s.c.index, s.iteration, K.SKIP, after, b))
                return
            yield from self.copy_out(s, b, after, passive=False)
        except simpy.Interrupt:
            pass  # the job stopped (NOTE [ Stopping a job ])
        finally:
            s.copy_procs.pop(env.active_process, None)
            if over is not None:
                over.succeed()

    def _swap_in(self, s: JobState, b: int, delay: float, after: int, done: simpy.Event) -> Gen:
        env = self.env
        ep = s.epoch[b]
        try:
            if s.stopped:  # started in the instant its job stopped
                return
            if delay:
                yield env.timeout(delay)
            if s.epoch[b] != ep:  # the framework freed `b` meanwhile
                self.log.append(LogEntry(env.now, s.c.index, s.iteration, K.SKIP, after, b))
                return
            yield from self.copy_in(s, b, after, passive=False)
        except OutOfMemory as oom:
            self.stop(s, oom)
        except simpy.Interrupt:
            pass  # the job stopped (NOTE [ Stopping a job ])
        finally:
            s.copy_procs.pop(env.active_process, None)
            self._arrived(s, b, ep, done)

    # ---- D2H ---------------------------------------------------------------------------
    # NOTE [ Writes during a copy ]
    # A swap-out leaves a valid host copy only if no op wrote the buffer while
    # the bytes moved: `copy_out` takes `wcount[b]` when its transfer starts
    # and compares it when it ends, and the model's loop adds one for each
    # buffer an op writes, at the op's start and at its end. Only a write
    # inside such a window can change a comparison, so the loop counts writes
    # only while one of its job's swap-outs is moving bytes (`JobState.
    # reading`, raised for the transfer alone: nothing yields between its end
    # and the comparison). Most ops of most runs write with no copy moving;
    # counting them anyway cost a list read and write per written buffer,
    # twice per op: per op of `simulate`, 1k-op step 2.09 -> 1.98 us, 30k-op
    # step 2.43 -> 2.28 (one process, interleaved, 9 rounds).
    def copy_out(self, s: JobState, b: int, op: int, passive: bool) -> Gen:
        """Swap `b` (DEV or LEAVING) out; memory freed when the copy ends.
        `passive`: an eviction, run by the process that needs the room."""
        c, env, mem, pcie = s.c, self.env, self.mem, self.pcie
        log = self.log.append
        j, n, ep = c.index, c.nbytes[b], s.epoch[b]
        do = s.apply(b, Event.COPY_OUT, Ctx(passive=passive, in_use=b in s.pinned))
        mem.act(s, b, do)
        if do & Do.SKIP:  # the host copy is valid and the buffer wanted: it stays
            log(LogEntry(env.now, j, s.iteration, K.SKIP, op, b))
            return
        if do & Do.DISCARD:  # the host copy is valid: no bytes need to move
            if passive:
                s.passive += 1
                s.evictions += 1
                s.evicted_bytes += n
            log(LogEntry(env.now, j, s.iteration, K.DISCARD, op, b))
            return
        mem.add_pending_out(n)
        stop = None
        try:
            with pcie.resource(Direction.D2H).request() as req:
                try:
                    yield req
                except simpy.Interrupt:  # the copying process's job stopped:
                    if s.epoch[b] == ep:  # an eviction of another job's buffer
                        mem.act(s, b, s.apply(b, Event.D2H_CANCELLED))  # that will not happen
                    raise
                if s.epoch[b] != ep:
                    return
                # this incarnation's copy (NOTE [ Incarnations ]), or a called-off eviction
                do = s.apply(b, Event.D2H_START, Ctx(passive=passive))
                if do & Do.SKIP:
                    mem.act(s, b, do)
                    log(LogEntry(env.now, j, s.iteration, K.SKIP, op, b))
                    return
                wc, lane = s.wcount[b], pcie.index[Direction.D2H]
                start, end = (
                    (K.EVICT_START, K.EVICT_END) if passive else (K.SWAP_OUT_START, K.SWAP_OUT_END)
                )
                log(LogEntry(env.now, j, s.iteration, start, op, b, lane))
                s.reading += 1  # NOTE [ Writes during a copy ]
                try:
                    stop = yield from pcie.transfer(n, Direction.D2H)
                finally:
                    s.reading -= 1
                log(LogEntry(env.now, j, s.iteration, end, op, b, lane))
        finally:
            mem.add_pending_out(-n)
        s.bytes_d2h += n
        s.passive += passive
        if s.epoch[b] != ep:
            mem.free(j, c.kind[b], n)  # died during the copy: the bytes were ours
            freed = True
        else:
            ctx = Ctx(written=s.wcount[b] != wc, in_use=b in s.pinned)
            do = s.apply(b, Event.D2H_END, ctx)
            mem.act(s, b, do)
            freed = bool(do & Do.DROP)
        if passive and freed:
            s.evictions += 1
            s.evicted_bytes += n
        if stop is not None:
            raise stop

    # ---- H2D ---------------------------------------------------------------------------
    def fetch(self, s: JobState, b: int, i: int) -> Gen:
        """On-demand swap-in of `b` for op `i` (a passive swap); all of it is stall."""
        env = self.env
        t0, ep = env.now, s.epoch[b]
        done = s.in_ev[b] = env.event()  # ARRIVING: `ensure` applied NEED
        try:
            yield from self.copy_in(s, b, i, passive=True)
        except simpy.Interrupt:  # the job stopped: the stall ends with it
            s.stall_us += env.now - t0
            raise
        finally:
            self._arrived(s, b, ep, done)
        s.stall_us += env.now - t0

    def _arrived(self, s: JobState, b: int, ep: int, done: simpy.Event) -> None:
        if s.in_ev.get(b) is done:
            del s.in_ev[b]
        if s.epoch[b] == ep and s.where[b] == ARRIVING:
            s.apply(b, Event.H2D_FAILED)  # the copy did not happen
        done.succeed()

    def copy_in(self, s: JobState, b: int, op: int, passive: bool) -> Gen:
        """H2D copy of `b`: bytes taken when the copy starts (NOTE [ Event semantics ])."""
        c, env, mem, pcie = s.c, self.env, self.mem, self.pcie
        log = self.log.append
        j, n, kind, ep = c.index, c.nbytes[b], c.kind[b], s.epoch[b]
        lane = pcie.index[Direction.H2D]
        start, end = (K.FETCH_START, K.FETCH_END) if passive else (K.SWAP_IN_START, K.SWAP_IN_END)
        taken, stop = False, None
        for attempt in range(2):
            if attempt:  # did not fit: make room without holding the lane, then queue again
                yield from mem.get(s, n, op, b, False)
                if s.epoch[b] != ep:
                    return
                mem.alloc(j, kind, n)
                taken = True
            with pcie.resource(Direction.H2D).request() as req:
                try:
                    yield req
                except simpy.Interrupt:  # the job stopped
                    if taken:
                        mem.free(j, kind, n)
                    raise
                if s.epoch[b] != ep:
                    if taken:
                        mem.free(j, kind, n)
                    return
                if not taken and mem.fits(n):
                    mem.alloc(j, kind, n)
                    taken = True
                if taken:
                    log(LogEntry(env.now, j, s.iteration, start, op, b, lane))
                    stop = yield from pcie.transfer(n, Direction.H2D)
                    log(LogEntry(env.now, j, s.iteration, end, op, b, lane))
                    break
        s.bytes_h2d += n
        s.passive += passive
        if s.epoch[b] != ep:
            mem.free(j, kind, n)
        else:
            mem.act(s, b, s.apply(b, Event.H2D_END))
        if stop is not None:
            raise stop

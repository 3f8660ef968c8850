"""The copy processes of the model: planned swaps, passive evictions and
on-demand fetches, each holding a PCIe lane while its bytes move.

A mixin of `GpuModel` (it uses the model's pool, lanes, log and its
`_make_room` / `_drop`); the semantics are in NOTE [ Event semantics ] of
`sim/model.py`.
"""

from __future__ import annotations

import simpy
from memplan.sim.log import LogEntry, LogKind
from memplan.sim.memory import MemoryPool
from memplan.sim.pcie import Direction, Pcie
from memplan.sim.state import ARRIVING, DEV, LEAVING, OFF, Gen, JobState, Stop

K = LogKind


class Transfers:
    env: simpy.Environment
    mem: MemoryPool
    pcie: Pcie
    log: list[LogEntry]
    passive: bool
    lru: dict[tuple[int, int], None]

    def _swap_out(
        self, s: JobState, b: int, delay: float, after: int, over: simpy.Event | None
    ) -> Gen:
        """A planned swap-out; `over` (its deadline's wait) succeeds when it is."""
        try:
            yield from self._planned_out(s, b, delay, after)
        finally:
            if over is not None:
                over.succeed()

    def _planned_out(self, s: JobState, b: int, delay: float, after: int) -> Gen:
        ep = s.epoch[b]
        try:
            if delay:
                yield self.env.timeout(delay)
        finally:
            self.mem.add_pending_out(-s.c.nbytes[b])
        if s.stopped:
            return  # the job ended: `_retire` returned the memory
        if s.epoch[b] != ep:  # the framework freed `b` meanwhile (and its memory)
            self.log.append(LogEntry(self.env.now, s.c.index, s.iteration, K.SKIP, after, b))
            return
        try:
            yield from self._copy_out(s, b, after, passive=False)
        except Stop:
            return

    def _copy_out(self, s: JobState, b: int, op: int, passive: bool) -> Gen:
        """Swap `b` (DEV or LEAVING) out; memory freed when the copy ends."""
        c, env, mem, pcie = s.c, self.env, self.mem, self.pcie
        j, n, ep = c.index, c.nbytes[b], s.epoch[b]
        if s.host[b]:  # the host copy is valid: no bytes need to move
            if s.keep[b] or b in s.pinned:
                s.keep[b] = False
                self._keep(s, b)
                self.log.append(LogEntry(env.now, j, s.iteration, K.SKIP, op, b))
                return
            s.where[b] = DEV
            self._drop(s, b)
            s.passive += passive
            self.log.append(LogEntry(env.now, j, s.iteration, K.DISCARD, op, b))
            return
        s.where[b] = LEAVING
        if self.passive:
            self.lru.pop((j, b), None)
        mem.add_pending_out(n)
        try:
            with pcie.resource(Direction.D2H).request() as req:
                yield req
                if s.stopped or s.epoch[b] != ep:
                    return
                if s.keep[b]:  # needed again before the copy began
                    s.keep[b] = False
                    self._keep(s, b)
                    self.log.append(LogEntry(env.now, j, s.iteration, K.SKIP, op, b))
                    return
                s.copying[b] = ep  # this incarnation's copy (NOTE [ Incarnations ])
                wc, lane = s.wcount[b], pcie.index[Direction.D2H]
                start, end = (
                    (K.EVICT_START, K.EVICT_END) if passive else (K.SWAP_OUT_START, K.SWAP_OUT_END)
                )
                self.log.append(LogEntry(env.now, j, s.iteration, start, op, b, lane))
                yield from pcie.transfer(n, Direction.D2H)
                self.log.append(LogEntry(env.now, j, s.iteration, end, op, b, lane))
                if s.copying[b] == ep:
                    s.copying[b] = -1
        finally:
            mem.add_pending_out(-n)
        s.bytes_d2h += n
        s.passive += passive
        if s.stopped or s.epoch[b] != ep:
            mem.free(j, c.kind[b], n)  # died during the copy: the bytes were ours
            return
        s.host[b] = s.wcount[b] == wc
        if s.keep[b] or b in s.pinned:
            s.keep[b] = False
            self._keep(s, b)
        else:
            s.where[b] = DEV
            self._drop(s, b)

    def _keep(self, s: JobState, b: int) -> None:
        s.where[b] = DEV
        if self.passive:
            self.lru[(s.c.index, b)] = None

    def _swap_in(self, s: JobState, b: int, delay: float, after: int, done: simpy.Event) -> Gen:
        ep = s.epoch[b]
        try:
            if delay:
                yield self.env.timeout(delay)
            if s.stopped:
                return
            if s.epoch[b] != ep:  # the framework freed `b` meanwhile
                self.log.append(LogEntry(self.env.now, s.c.index, s.iteration, K.SKIP, after, b))
                return
            yield from self._copy_in(s, b, after, passive=False)
        except Stop:
            pass
        finally:
            self._arrived(s, b, ep, done)

    def _fetch(self, s: JobState, b: int, i: int) -> Gen:
        """On-demand swap-in of `b` for op `i` (a passive swap); all of it is stall."""
        t0, ep = self.env.now, s.epoch[b]
        done = s.in_ev[b] = self.env.event()
        s.where[b] = ARRIVING
        try:
            yield from self._copy_in(s, b, i, passive=True)
        finally:
            self._arrived(s, b, ep, done)
        s.stall_us += self.env.now - t0

    def _arrived(self, s: JobState, b: int, ep: int, done: simpy.Event) -> None:
        if s.in_ev.get(b) is done:
            del s.in_ev[b]
        if s.epoch[b] == ep and s.where[b] == ARRIVING:
            s.where[b] = OFF  # the copy did not happen
        done.succeed()

    def _copy_in(self, s: JobState, b: int, op: int, passive: bool) -> Gen:
        """H2D copy of `b`: bytes taken when the copy starts (NOTE [ Event semantics ])."""
        c, env, mem, pcie = s.c, self.env, self.mem, self.pcie
        j, n, kind, ep = c.index, c.nbytes[b], c.kind[b], s.epoch[b]
        lane = pcie.index[Direction.H2D]
        start, end = (K.FETCH_START, K.FETCH_END) if passive else (K.SWAP_IN_START, K.SWAP_IN_END)
        taken = False
        for attempt in range(2):
            if attempt:  # did not fit: make room without holding the lane, then queue again
                yield from self._make_room(s, n, op, False, b)
                if s.stopped or s.epoch[b] != ep:
                    return
                mem.alloc(j, kind, n)
                taken = True
            with pcie.resource(Direction.H2D).request() as req:
                yield req
                if s.stopped or s.epoch[b] != ep:
                    if taken:
                        mem.free(j, kind, n)
                    return
                if not taken and mem.fits(n):
                    mem.alloc(j, kind, n)
                    taken = True
                if taken:
                    self.log.append(LogEntry(env.now, j, s.iteration, start, op, b, lane))
                    yield from pcie.transfer(n, Direction.H2D)
                    self.log.append(LogEntry(env.now, j, s.iteration, end, op, b, lane))
                    break
        s.bytes_h2d += n
        s.passive += passive
        if s.stopped or s.epoch[b] != ep:
            mem.free(j, kind, n)
            return
        s.where[b] = DEV
        if self.passive:
            self.lru[(j, b)] = None

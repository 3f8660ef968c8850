"""Allocator models under the memory pools: every allocation the simulator
makes is also a block of its job's allocator (NOTE [ One process per job ]).

A pool under an allocator model holds a `BlockLedger` (`MemoryPool.ledger`),
which keeps which block holds each buffer, scratch space and copy in flight,
and hands them to one backend per job -- SmartPool's `Lifetimes`, or a
`CachingAllocator` (`CachingLedger`, which also decides what fits: the
reserved segments, not the tensor bytes, meet the budget). The pool calls
its ledger before it counts the bytes; the ledger never calls the pool.
"""

from __future__ import annotations

from typing import Any

import simpy
from memplan.sim.allocator import CachingAllocator, round_size, segment_size
from memplan.sim.errors import OutOfMemory
from memplan.sim.smartpool import Lifetimes
from memplan.sim.state import Allocator, JobState

# NOTE [ One process per job ]
# Jobs sharing a GPU are separate processes (as in TENSILE's system): each
# has its own CUDA context and allocator, and a block another job frees (an
# eviction) returns to its owner's cache. The ledger mirrors the pool's
# bytes as blocks: a device copy (`take` / `drop`; `detach`ed while a copy
# outlives its life), a swap-in's bytes before it lands (a loose block,
# adopted at `stay`; loose blocks of one size are interchangeable) and
# workspaces. Under `caching`, a new segment that does not fit first makes
# every job's cache return its free segments (an idealisation across
# processes, without which evictions could never make room). Long form:
# docs/notes.md, "One process per job".


class BlockLedger:
    """SmartPool's layout: every allocation of the pool mirrored as a block
    of its job's backend (`Lifetimes`); the pool's bytes decide what fits."""

    def __init__(self, n_jobs: int):
        self.backs: list[Any] = [self.backend() for _ in range(n_jobs)]
        self.owned: list[dict[int, Any]] = [{} for _ in range(n_jobs)]
        self.loose: list[dict[int, list[Any]]] = [{} for _ in range(n_jobs)]
        self.scratch: list[list[Any]] = [[] for _ in range(n_jobs)]

    def backend(self) -> Any:
        return Lifetimes()

    def _get(self, j: int, nbytes: int, b: int) -> Any:
        return self.backs[j].malloc(nbytes) if nbytes else None

    def _put(self, j: int, handle: Any) -> None:
        if handle is not None:
            self.backs[j].free(handle)

    def _lose(self, j: int, nbytes: int, handle: Any) -> None:
        self.loose[j].setdefault(nbytes, []).append(handle)

    def _pop_loose(self, j: int, nbytes: int) -> Any:
        same = self.loose[j].get(nbytes)
        if not same:
            raise RuntimeError(f"job {j}: no block of {nbytes} bytes to give back")
        return same.pop()

    # ---- buffers ---------------------------------------------------------------------
    def take(self, s: JobState, b: int) -> None:
        """A block for `b` (before the pool counts its bytes)."""
        j, n = s.c.index, s.c.nbytes[b]
        handle = self._get(j, n, b)
        owned = self.owned[j]
        if b in owned:  # an earlier life's copy, still read by its swap-out
            self._lose(j, n, owned[b])
        owned[b] = handle

    def drop(self, s: JobState, b: int) -> None:
        j = s.c.index
        self._put(j, self.owned[j].pop(b))

    def stay(self, s: JobState, b: int) -> None:
        j = s.c.index
        if b not in self.owned[j]:  # arrived: the bytes its swap-in took
            self.owned[j][b] = self._pop_loose(j, s.c.nbytes[b])

    def detach(self, s: JobState, b: int) -> None:
        """`b`'s life ended while a copy still reads its device bytes."""
        j = s.c.index
        if b in self.owned[j]:
            self._lose(j, s.c.nbytes[b], self.owned[j].pop(b))

    # ---- bytes without a buffer ------------------------------------------------------
    def alloc(self, job: int, nbytes: int) -> None:
        self._lose(job, nbytes, self._get(job, nbytes, -1))

    def free(self, job: int, nbytes: int) -> None:
        self._put(job, self._pop_loose(job, nbytes))

    def take_scratch(self, job: int, nbytes: int) -> None:
        self.scratch[job].append(self._get(job, nbytes, -1))

    def drop_scratch(self, job: int) -> None:
        self._put(job, self.scratch[job].pop())


class CachingLedger(BlockLedger):
    """PyTorch's caching allocator per job: the segments it reserves, plus
    the contexts, meet the budget (NOTE [ The caching allocator ])."""

    def __init__(self, env: simpy.Environment, jobs: list[JobState], budget_bytes: int):
        super().__init__(len(jobs))
        self.env = env
        self.jobs = jobs
        self.budget = budget_bytes
        self.reserved = self.allocated = self.contexts = 0
        self.reserved_peak = self.allocated_peak = 0
        self.allocated_at_peak = 0  # the most allocated while reserved is at its peak
        # (time_us, job, +/- bytes) per change of a job's segments or context
        self.device_samples: list[tuple[float, int, int]] = []

    def backend(self) -> Any:
        return CachingAllocator()

    # ---- what fits (the pool asks, `MemoryPool.caching`) ----------------------------
    def room(self) -> int:
        """Bytes no segment and no context holds."""
        return self.budget - self.contexts - self.reserved

    def _idle(self) -> int:
        return sum(a.idle for a in self.backs)

    def fits_job(self, s: JobState, nbytes: int) -> bool:
        if not nbytes:
            return True
        need = self.backs[s.c.index].growth(nbytes)
        return not need or need <= self.room() or need <= self.room() + self._idle()

    def fits(self, nbytes: int) -> bool:
        """`fits_job` for the job whose process asks (callers that name no job)."""
        return self.fits_job(self._asker(), nbytes)

    def _asker(self) -> JobState:
        p = self.env.active_process
        for s in self.jobs:
            if s.proc is p or p in s.copy_procs:
                return s
        raise RuntimeError("an allocation asked by no job's process")

    def never_fits(self, nbytes: int) -> bool:
        return segment_size(round_size(nbytes)) > self.budget - self.contexts

    def hold_context(self, job: int, nbytes: int) -> None:
        """Job `job`'s context now holds `nbytes` (the pool checked it fits)."""
        self.contexts += nbytes
        self.device_samples.append((self.env.now, job, nbytes))

    def end_job(self, job: int, context_bytes: int) -> None:
        """The job is over (its blocks given back): its context and cached segments go."""
        if context_bytes:
            self.contexts -= context_bytes
            self.device_samples.append((self.env.now, job, -context_bytes))
        self._release(job)

    # ---- blocks ----------------------------------------------------------------------
    def _get(self, j: int, nbytes: int, b: int) -> Any:
        if not nbytes:
            return None
        a = self.backs[j]
        need = a.growth(nbytes)
        if need > self.room():  # PyTorch's retry: free cached segments first
            for k in range(len(self.backs)):
                self._release(k)
            if need > self.room():
                raise OutOfMemory(-1, b)
        r0, a0 = a.reserved, a.allocated
        block = a.malloc(nbytes)
        self.allocated += a.allocated - a0
        if a.reserved != r0:
            self._reserve(j, a.reserved - r0)
        if self.allocated > self.allocated_peak:
            self.allocated_peak = self.allocated
        if self.reserved == self.reserved_peak and self.allocated > self.allocated_at_peak:
            self.allocated_at_peak = self.allocated
        return block

    def _put(self, j: int, handle: Any) -> None:
        if handle is None:
            return
        a = self.backs[j]
        a0 = a.allocated
        a.free(handle)
        self.allocated += a.allocated - a0
        if self.jobs[j].stopped:  # its process is gone: so are its segments
            self._release(j)

    def _release(self, j: int) -> None:
        freed = self.backs[j].empty_cache()
        if freed:
            self._reserve(j, -freed)

    def _reserve(self, j: int, delta: int) -> None:
        self.reserved += delta
        self.device_samples.append((self.env.now, j, delta))
        if self.reserved > self.reserved_peak:
            self.reserved_peak = self.reserved
            self.allocated_at_peak = self.allocated


def ledger_for(
    allocator: Allocator, env: simpy.Environment, jobs: list[JobState], budget_bytes: int
) -> BlockLedger | None:
    """The ledger a pool under `allocator` keeps (None: `exact`, bytes only)."""
    if allocator is Allocator.CACHING:
        return CachingLedger(env, jobs, budget_bytes)
    if allocator is Allocator.SMARTPOOL:
        return BlockLedger(len(jobs))
    return None

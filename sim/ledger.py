"""Allocator models under the memory pools: every allocation the simulator
makes is also a block of its job's allocator (NOTE [ One process per job ]).

`BlockLedger` is a mixin placed before an OOM policy's pool (`ledger_pool`):
it keeps which block holds each buffer, scratch space and copy in flight,
and hands them to one backend per job -- SmartPool's `Lifetimes`, or a
`CachingAllocator` (`CachingLedger`, which also decides what fits: the
reserved segments, not the tensor bytes, meet the budget).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memplan.planners.core.lifecycle import Event
from memplan.sim.allocator import CachingAllocator, round_size, segment_size
from memplan.sim.dtr import DtrPool
from memplan.sim.memory import MemoryPool, OutOfMemory, PassivePool, StallPool
from memplan.sim.smartpool import Lifetimes
from memplan.sim.state import Allocator, Gen, JobState, OomPolicy

if TYPE_CHECKING:
    from memplan.sim.model import GpuModel

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
    """Mixin: mirror every allocation as a block of the job's backend."""

    ledger = True

    def __init__(self, model: GpuModel, budget_bytes: int):
        super().__init__(model, budget_bytes)  # type: ignore[call-arg]
        n = len(model.jobs)
        self.backs: list[Any] = [self.backend() for _ in range(n)]
        self.owned: list[dict[int, Any]] = [{} for _ in range(n)]
        self.loose: list[dict[int, list[Any]]] = [{} for _ in range(n)]
        self.scratch: list[list[Any]] = [[] for _ in range(n)]
        self._dropping = False

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
        j, n = s.c.index, s.c.nbytes[b]
        handle = self._get(j, n, b)
        owned = self.owned[j]
        if b in owned:  # an earlier life's copy, still read by its swap-out
            self._lose(j, n, owned[b])
        owned[b] = handle
        super().take(s, b)  # type: ignore[misc]

    def drop(self, s: JobState, b: int) -> None:
        j = s.c.index
        self._put(j, self.owned[j].pop(b))
        self._dropping = True  # the policy's drop frees the bytes through `free`
        super().drop(s, b)  # type: ignore[misc]
        self._dropping = False

    def stay(self, s: JobState, b: int) -> None:
        j = s.c.index
        if b not in self.owned[j]:  # arrived: the bytes its swap-in took
            self.owned[j][b] = self._pop_loose(j, s.c.nbytes[b])
        super().stay(s, b)  # type: ignore[misc]

    def detach(self, s: JobState, b: int) -> None:
        """`b`'s life ended while a copy still reads its device bytes."""
        j = s.c.index
        if b in self.owned[j]:
            self._lose(j, s.c.nbytes[b], self.owned[j].pop(b))

    # ---- groups: one block at a time, as PyTorch allocates tensors -------------------
    def make_group(self, s: JobState, bufs: tuple[int, ...], nbytes: int, op: int, b: int) -> Gen:
        return self.make_each(s, bufs, op)  # type: ignore[attr-defined]

    def take_group(self, s: JobState, bufs: list[int], op: int, target: int) -> Gen:
        nbytes = s.c.nbytes
        for w in bufs:
            if not self.fits_job(s, nbytes[w]):  # type: ignore[attr-defined]
                yield from self.get(s, nbytes[w], op, target, True)  # type: ignore[attr-defined]
            self.act(s, w, s.apply(w, Event.REMAKE))  # type: ignore[attr-defined]

    # ---- bytes without a buffer ------------------------------------------------------
    def alloc(self, job: int, kind: int, nbytes: int) -> None:
        self._lose(job, nbytes, self._get(job, nbytes, -1))
        super().alloc(job, kind, nbytes)  # type: ignore[misc]

    def free(self, job: int, kind: int, nbytes: int) -> None:
        if not self._dropping:
            self._put(job, self._pop_loose(job, nbytes))
        super().free(job, kind, nbytes)  # type: ignore[misc]

    def take_scratch(self, s: JobState, nbytes: int) -> None:
        self.scratch[s.c.index].append(self._get(s.c.index, nbytes, -1))
        super().take_scratch(s, nbytes)  # type: ignore[misc]

    def drop_scratch(self, s: JobState, nbytes: int) -> None:
        self._put(s.c.index, self.scratch[s.c.index].pop())
        super().drop_scratch(s, nbytes)  # type: ignore[misc]


class CachingLedger(BlockLedger):
    """PyTorch's caching allocator per job: the segments it reserves, plus
    the contexts, meet the budget (NOTE [ The caching allocator ])."""

    def __init__(self, model: GpuModel, budget_bytes: int):
        super().__init__(model, budget_bytes)
        self.reserved = self.allocated = self.contexts = 0
        self.reserved_peak = self.allocated_peak = 0
        self.allocated_at_peak = 0  # the most allocated while reserved is at its peak
        # (time_us, job, +/- bytes) per change of a job's segments or context
        self.device_samples: list[tuple[float, int, int]] = []

    def backend(self) -> Any:
        return CachingAllocator()

    # ---- what fits -------------------------------------------------------------------
    def _room(self) -> int:
        return self.budget - self.contexts - self.reserved

    def _idle(self) -> int:
        return sum(a.idle for a in self.backs)

    def fits_job(self, s: JobState, nbytes: int) -> bool:
        if not nbytes:
            return True
        need = self.backs[s.c.index].growth(nbytes)
        return not need or need <= self._room() or need <= self._room() + self._idle()

    def fits(self, nbytes: int) -> bool:
        """`fits_job` for the job whose process asks (callers that name no job)."""
        return self.fits_job(self._asker(), nbytes)

    def _asker(self) -> JobState:
        p = self.env.active_process
        for s in self.model.jobs:
            if s.proc is p or p in s.copy_procs:
                return s
        raise RuntimeError("an allocation asked by no job's process")

    def never_fits(self, nbytes: int) -> bool:
        return segment_size(round_size(nbytes)) > self.budget - self.contexts

    def may_fit_later(self, s: JobState, nbytes: int) -> bool:
        return self.pending_out > 0

    @property
    def free_bytes(self) -> int:
        return self._room()

    def fits_context(self, nbytes: int) -> bool:
        return nbytes <= self._room()

    def hold_context(self, s: JobState, nbytes: int) -> None:
        super().hold_context(s, nbytes)
        self.contexts += nbytes
        self.device_samples.append((self.env.now, s.c.index, nbytes))

    def end_job(self, s: JobState) -> None:
        j, n = s.c.index, s.context_bytes
        super().end_job(s)
        if n:
            self.contexts -= n
            self.device_samples.append((self.env.now, j, -n))
        self._release(j)

    # ---- blocks ----------------------------------------------------------------------
    def _get(self, j: int, nbytes: int, b: int) -> Any:
        if not nbytes:
            return None
        a = self.backs[j]
        need = a.growth(nbytes)
        if need > self._room():  # PyTorch's retry: free cached segments first
            for k in range(len(self.backs)):
                self._release(k)
            if need > self._room():
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
        if self.model.jobs[j].stopped:  # its process is gone: so are its segments
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


POOLS: dict[OomPolicy, type[MemoryPool]] = {
    OomPolicy.FAIL: MemoryPool,
    OomPolicy.STALL: StallPool,
    OomPolicy.PASSIVE: PassivePool,
    OomPolicy.DTR: DtrPool,
}


def pool_class(oom: OomPolicy, allocator: Allocator) -> type[MemoryPool]:
    """The pool of OOM policy `oom` under `allocator`."""
    base = POOLS[oom]
    if allocator is Allocator.EXACT:
        return base
    mixin = CachingLedger if allocator is Allocator.CACHING else BlockLedger
    return type(f"{mixin.__name__}{base.__name__}", (mixin, base), {})

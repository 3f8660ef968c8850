"""PyTorch's CUDA caching allocator as a data structure: segments, blocks,
two pools, best fit, splitting and coalescing (NOTE [ The caching allocator ]).

Pure bookkeeping of one process on one stream: no SimPy, no clock. The
simulator keeps one `CachingAllocator` per job (NOTE [ One process per job ]
in sim/memory.py) and decides itself whether a new segment fits the device
(`growth` says how many bytes a request would add to the reserve).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator
from dataclasses import dataclass

# NOTE [ The caching allocator ]
# c10/cuda/CUDACachingAllocator.cpp by default (no PYTORCH_CUDA_ALLOC_CONF), on one stream:
# - a request is rounded up to a multiple of 512 B (at least 512 B); up to 1 MiB it comes from
#   the small pool, else the large pool; a block never moves between pools;
# - it gets the smallest free block of its pool large enough, the lowest address among equals;
# - with none, a new segment (cudaMalloc): 2 MiB for a small request, 20 MiB for a large one
#   under 10 MiB, else the request rounded up to 2 MiB;
# - a block is split when the rest is >= 512 B (small pool) or > 1 MiB (large); the request
#   keeps the front. Unsplit, the whole block is allocated (`allocated_bytes` counts it whole);
# - a freed block merges with its free neighbours in its segment;
# - segments go back only by `empty_cache`. A new segment that does not fit first frees every
#   entirely free cached segment and retries once (`release_cached_blocks`), then is out of
#   memory; the simulator does the same (sim/ledger.py `CachingLedger._get`).
# Addresses are virtual: a segment starts past the last one made (lowest = reserved first).
# Full text: docs/notes.md, "The caching allocator".
MIN_BLOCK = 512
SMALL_SIZE = 1 << 20
SMALL_BUFFER = 2 << 20
LARGE_BUFFER = 20 << 20
MIN_LARGE_ALLOC = 10 << 20
ROUND_LARGE = 2 << 20


def round_size(nbytes: int) -> int:
    """The size a request of `nbytes` is served with: a multiple of 512 B."""
    if nbytes < MIN_BLOCK:
        return MIN_BLOCK
    return -(-nbytes // MIN_BLOCK) * MIN_BLOCK


def segment_size(size: int) -> int:
    """The segment reserved for a rounded request `size` no cached block serves."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return -(-size // ROUND_LARGE) * ROUND_LARGE


def alone_size(nbytes: int) -> int:
    """Device bytes a request of `nbytes` takes with nothing cached to share:
    512-B rounding, and a segment of its own (2 MiB rounding) from 10 MiB
    (NOTE [ The planners' view of the caching allocator ] in memplan/plannerview.py)."""
    size = round_size(nbytes)
    return size if size < MIN_LARGE_ALLOC else segment_size(size)


class Block:
    """A piece of a segment: `addr`, `size` (bytes), in the small or large
    pool, free or allocated; `prev` / `next` are its neighbours in the segment."""

    __slots__ = ("addr", "size", "small", "free", "prev", "next")

    def __init__(self, addr: int, size: int, small: bool):
        self.addr = addr
        self.size = size
        self.small = small
        self.free = True
        self.prev: Block | None = None
        self.next: Block | None = None

    @property
    def whole(self) -> bool:
        """The block is its whole segment."""
        return self.prev is None and self.next is None

    def __repr__(self) -> str:
        state = "free" if self.free else "used"
        return f"Block({self.addr:#x}, {self.size}, {'small' if self.small else 'large'}, {state})"


@dataclass(frozen=True, slots=True)
class Segment:
    """One reserved segment and its blocks (address, size, free), in address order."""

    addr: int
    size: int
    small: bool
    blocks: tuple[tuple[int, int, bool], ...]


class CachingAllocator:
    """One process's caching allocator. Sizes in bytes. `allocated` counts
    allocated blocks whole, `reserved` the segments; both keep their peaks."""

    def __init__(self) -> None:
        # free blocks per pool (small: True), as sorted (size, addr) keys
        self._keys: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        self._free: dict[int, Block] = {}  # addr -> free block
        self._heads: dict[int, Block] = {}  # segment addr -> its first block
        self._next_addr = 1 << 40
        self.allocated = self.reserved = 0
        self.peak_allocated = self.peak_reserved = 0
        self.idle = 0  # bytes of cached segments that are entirely free

    # ---- queries ---------------------------------------------------------------------
    def _fit(self, size: int) -> Block | None:
        """The free block a rounded request `size` gets (best fit), or None."""
        keys = self._keys[size <= SMALL_SIZE]
        k = bisect_left(keys, (size, -1))
        return self._free[keys[k][1]] if k < len(keys) else None

    def growth(self, nbytes: int) -> int:
        """Bytes `malloc(nbytes)` would add to the reserve: 0 when a cached
        block serves it, else the new segment's size."""
        size = round_size(nbytes)
        return 0 if self._fit(size) is not None else segment_size(size)

    def segments(self) -> Iterator[Segment]:
        """The reserved segments in address order, with their blocks."""
        for addr in sorted(self._heads):
            blocks, b = [], self._heads[addr]
            size, small = 0, b.small
            while b is not None:
                blocks.append((b.addr, b.size, b.free))
                size += b.size
                b = b.next
            yield Segment(addr, size, small, tuple(blocks))

    # ---- the free pools --------------------------------------------------------------
    def _insert(self, b: Block) -> None:
        b.free = True
        self._free[b.addr] = b
        insort(self._keys[b.small], (b.size, b.addr))
        if b.whole:
            self.idle += b.size

    def _remove(self, b: Block) -> None:
        keys = self._keys[b.small]
        del keys[bisect_left(keys, (b.size, b.addr))]
        del self._free[b.addr]
        if b.whole:
            self.idle -= b.size

    # ---- malloc and free -------------------------------------------------------------
    def malloc(self, nbytes: int) -> Block:
        """Serve a request of `nbytes` (> 0), reserving a segment if no
        cached block fits (NOTE [ The caching allocator ])."""
        size = round_size(nbytes)
        small = size <= SMALL_SIZE
        b = self._fit(size)
        if b is None:
            b = Block(self._next_addr, segment_size(size), small)
            self._next_addr += b.size
            self._heads[b.addr] = b
            self.reserved += b.size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        else:
            self._remove(b)
        rest = b.size - size
        if (rest >= MIN_BLOCK) if small else (rest > SMALL_SIZE):
            tail = Block(b.addr + size, rest, small)
            tail.prev, tail.next = b, b.next
            if b.next is not None:
                b.next.prev = tail
            b.next = tail
            b.size = size
            self._insert(tail)
        b.free = False
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)
        return b

    def free(self, b: Block) -> None:
        """Give `b` back to its pool, merged with its free neighbours."""
        if b.free:
            raise RuntimeError(f"{b!r} freed twice")
        b.free = True  # also when it merges away: a second free is caught
        self.allocated -= b.size
        prev, nxt = b.prev, b.next
        if prev is not None and prev.free:
            self._remove(prev)
            prev.size += b.size
            prev.next = nxt
            if nxt is not None:
                nxt.prev = prev
            b = prev
        if nxt is not None and nxt.free:
            self._remove(nxt)
            b.size += nxt.size
            b.next = nxt.next
            if nxt.next is not None:
                nxt.next.prev = b
        self._insert(b)

    def empty_cache(self) -> int:
        """Return every entirely free segment to the device; the bytes returned."""
        if not self.idle:
            return 0
        whole = [b for b in self._free.values() if b.whole]
        for b in whole:
            self._remove(b)
            del self._heads[b.addr]
        released = sum(b.size for b in whole)
        self.reserved -= released
        return released

"""SmartPool's offline memory layout (SmartPool/AutoSwap, §III-C): every
buffer lifetime gets an offset in one pool, largest first, each in the
smallest hole its overlapping neighbours leave (NOTE [ SmartPool layout ]).

Pure data: lifetimes in, offsets and footprint out. The simulator records
the lifetimes (`Lifetimes`, one per job) and lays them out after the run
(NOTE [ SmartPool in the simulator ] in sim/simulate.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# NOTE [ SmartPool layout ]
# SmartPool's allocation is weighted interval colouring: a lifetime is an
# interval of logical time, its colour range an address range of its size,
# and two lifetimes that overlap in time may not overlap in address. The
# paper's heuristic: sort the lifetimes by size, largest first; place each
# in a hole between the address ranges of the already placed lifetimes it
# overlaps in time (its neighbours) -- best fit, the smallest hole it fits,
# the lowest address among equals -- and where no hole fits, extend the pool
# right above its highest neighbour. The footprint is the top of the highest
# range; no layout goes below the most bytes live at once (`live_peak`), the
# clique bound of the paper's eq. (1).
# Intervals are half-open [start, end) in event order: a buffer freed at
# event k and one allocated at event k + 1 may share addresses. Ties in size
# are placed by start, then by index, so a layout is deterministic.


@dataclass(frozen=True, slots=True)
class Layout:
    """Offsets (bytes) per lifetime, the pool's footprint and the live-bytes
    lower bound, all in bytes."""

    offsets: np.ndarray
    footprint: int
    live_peak: int


def live_peak(sizes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> int:
    """The most bytes live at once over half-open lifetimes [start, end)."""
    if not len(sizes):
        return 0
    t = np.concatenate((starts, ends))
    d = np.concatenate((sizes, -sizes)).astype(np.int64)
    # at equal times frees come first (half-open): sort by (time, delta)
    order = np.lexsort((d, t))
    return int(max(0, np.cumsum(d[order]).max()))


def layout(sizes: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> Layout:
    """SmartPool's best-fit layout of lifetimes [starts, ends) of `sizes`
    bytes (NOTE [ SmartPool layout ]). Each lifetime scans those placed
    before it: time grows with n times its neighbours (0.1-0.9 s for the zoo
    traces run three times, about 30 s for a 30k-op step)."""
    sizes = np.asarray(sizes, np.int64)
    starts = np.asarray(starts, np.int64)
    ends = np.asarray(ends, np.int64)
    n = len(sizes)
    offsets = np.zeros(n, np.int64)
    order = np.lexsort((np.arange(n), starts, -sizes))
    ps, pe, po, pt = (np.empty(n, np.int64) for _ in range(4))  # placed: start, end, offset, top
    m, footprint = 0, 0
    for k in order.tolist():
        z, s, e = int(sizes[k]), starts[k], ends[k]
        if z <= 0:
            continue
        near = (ps[:m] < e) & (pe[:m] > s)
        offset = 0
        if near.any():
            lo, hi = po[:m][near], pt[:m][near]
            by = np.argsort(lo, kind="stable")
            lo, hi = lo[by], hi[by]
            reach = np.maximum.accumulate(hi)
            hole_lo = np.concatenate(([0], reach))
            hole_hi = np.concatenate((lo, [max(footprint, int(reach[-1]))]))
            gap = hole_hi - hole_lo
            fits = np.flatnonzero(gap >= z)
            if len(fits):
                offset = int(hole_lo[fits[np.argmin(gap[fits])]])  # least gap, lowest address
            else:
                offset = int(reach[-1])
        offsets[k] = offset
        ps[m], pe[m], po[m], pt[m] = s, e, offset, offset + z
        m += 1
        footprint = max(footprint, offset + z)
    return Layout(offsets, footprint, live_peak(sizes, starts, ends))


class Lifetimes:
    """The lifetimes one job's buffers have, as the simulator allocates and
    frees them; time is this job's count of allocations and frees."""

    __slots__ = ("sizes", "starts", "ends", "clock")

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.starts: list[int] = []
        self.ends: list[int] = []
        self.clock = 0

    def malloc(self, nbytes: int) -> int:
        """A lifetime of `nbytes` starts; its handle."""
        self.clock += 1
        self.sizes.append(nbytes)
        self.starts.append(self.clock)
        self.ends.append(-1)
        return len(self.sizes) - 1

    def free(self, handle: int) -> None:
        self.clock += 1
        self.ends[handle] = self.clock

    def layout(self) -> Layout:
        """The layout of every lifetime so far; one still open ends now."""
        end = self.clock + 1
        ends = [e if e >= 0 else end for e in self.ends]
        return layout(np.array(self.sizes, np.int64), np.array(self.starts), np.array(ends))

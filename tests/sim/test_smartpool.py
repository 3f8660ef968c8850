"""SmartPool's offline layout (sim/smartpool.py, NOTE [ SmartPool layout ]):
a case worked by hand, and over random lifetimes (hypothesis) offsets that
never overlap two live buffers and a footprint at or above the live-bytes
bound, checked against a brute-force sweep."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from memplan.sim.smartpool import Lifetimes, layout, live_peak


def test_a_layout_worked_by_hand():
    # lifetimes [start, end) and sizes:   0: [0,2) 4   1: [1,4) 2   2: [3,5) 2   3: [2,6) 3
    # Largest first. 0 -> 0. 3 does not overlap 0 ([0,2) ends as it starts): 0.
    # 1 overlaps 0 ([0,4)) and 3 ([0,3)): no hole below 4, pool extends: 4.
    # 2 overlaps 3 ([0,3)) and 1 ([4,6)): the hole [3,4) is too small: 6.
    # Footprint 8; the most live at once is 7 (1, 2 and 3 during [3,4)).
    sizes, starts, ends = np.array([4, 2, 2, 3]), np.array([0, 1, 3, 2]), np.array([2, 4, 5, 6])
    lay = layout(sizes, starts, ends)
    assert (lay.offsets.tolist(), lay.footprint, lay.live_peak) == ([0, 4, 6, 0], 8, 7)


def test_best_fit_takes_the_smallest_hole():
    # a 10 over [0,10) -> 0. b 6 over [0,3) overlaps a -> 10 (footprint 16).
    # c 5 over [4,10) overlaps a only: the hole [10,16) above it, within the
    # footprint, fits -> 10. d 4 over [1,2) overlaps a and b -> 16 (footprint
    # 20). e 3 over [0,10) overlaps a [0,10), b [10,16), c [10,15), d [16,20):
    # no hole -> 20 (footprint 23).
    sizes, starts, ends = (
        np.array([10, 6, 5, 4, 3]),
        np.array([0, 0, 4, 1, 0]),
        np.array([10, 3, 10, 2, 10]),
    )
    lay = layout(sizes, starts, ends)
    assert (lay.offsets.tolist(), lay.footprint) == ([0, 10, 10, 16, 20], 23)
    # f 2 over [5,6) overlaps a [0,10), c [10,15), e [20,23): holes [15,20)
    # (5) fits; f goes there, the smallest hole that fits, not on top
    lay2 = layout(np.append(sizes, 2), np.append(starts, 5), np.append(ends, 6))
    assert (lay2.offsets[-1], lay2.footprint) == (15, 23)
    # g 3 over [5,6) too: larger, placed first, it takes [15,18); f then
    # fits exactly the [18,20) left above it
    lay3 = layout(np.append(sizes, [2, 3]), np.append(starts, [5, 5]), np.append(ends, [6, 6]))
    assert lay3.offsets[-2:].tolist() == [18, 15]


def test_lifetimes_record_the_order_of_events():
    rec = Lifetimes()
    a = rec.malloc(4)
    b = rec.malloc(2)
    rec.free(a)  # a [1,3), b [2, open)
    c = rec.malloc(4)  # c [4, open): may reuse a's bytes
    lay = rec.layout()
    assert (rec.starts, rec.ends) == ([1, 2, 4], [3, -1, -1])
    assert lay.offsets[c] == lay.offsets[a] and lay.footprint == 6 == lay.live_peak
    assert b == 1


def plain_layout(sizes, starts, ends):
    """The paper's heuristic in plain Python, one hole at a time: a second
    implementation to hold `layout` (numpy) to."""
    offsets = [0] * len(sizes)
    placed, footprint = [], 0
    for k in sorted(range(len(sizes)), key=lambda k: (-sizes[k], starts[k], k)):
        if sizes[k] <= 0:
            continue
        ranges = sorted(
            (offsets[i], offsets[i] + sizes[i]) for i in placed
            if starts[i] < ends[k] and starts[k] < ends[i]
        )  # fmt: skip
        best, top = None, 0
        for lo, hi in ranges:
            if lo - top >= sizes[k] and (best is None or lo - top < best[1]):
                best = (top, lo - top)
            top = max(top, hi)
        if footprint - top >= sizes[k] and (best is None or footprint - top < best[1]):
            best = (top, footprint - top)
        offsets[k] = best[0] if best else top
        placed.append(k)
        footprint = max(footprint, offsets[k] + int(sizes[k]))
    return offsets, footprint


@st.composite
def lifetimes(draw):
    n = draw(st.integers(1, 120))
    starts = draw(st.lists(st.integers(0, 300), min_size=n, max_size=n))
    lengths = draw(
        st.lists(st.one_of(st.integers(1, 20), st.integers(1, 300)), min_size=n, max_size=n)
    )
    sizes = draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n))
    s = np.array(starts)
    return np.array(sizes), s, s + np.array(lengths)


@settings(max_examples=100, deadline=None)
@given(lifetimes())
def test_random_lifetimes_never_overlap_and_stay_above_the_bound(case):
    sizes, starts, ends = case
    lay = layout(sizes, starts, ends)
    off, top = lay.offsets, lay.offsets + sizes
    live = (starts[:, None] < ends[None, :]) & (starts[None, :] < ends[:, None])
    apart = (top[:, None] <= off[None, :]) | (top[None, :] <= off[:, None])
    real = (sizes[:, None] > 0) & (sizes[None, :] > 0) & ~np.eye(len(sizes), dtype=bool)
    assert not (live & real & ~apart).any()
    # the bound, by brute force over every time step
    brute = max(int(sizes[(starts <= t) & (t < ends)].sum()) for t in range(int(ends.max()) + 1))
    assert lay.live_peak == brute == live_peak(sizes, starts, ends)
    assert lay.footprint == int(top[sizes > 0].max(initial=0)) >= lay.live_peak
    assert (off >= 0).all()
    # the same layout as the plain scan
    assert (off.tolist(), lay.footprint) == plain_layout(sizes.tolist(), starts, ends)

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


@st.composite
def lifetimes(draw):
    n = draw(st.integers(1, 40))
    starts = draw(st.lists(st.integers(0, 60), min_size=n, max_size=n))
    lengths = draw(st.lists(st.integers(1, 30), min_size=n, max_size=n))
    sizes = draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n))
    s = np.array(starts)
    return np.array(sizes), s, s + np.array(lengths)


@settings(max_examples=200, deadline=None)
@given(lifetimes())
def test_random_lifetimes_never_overlap_and_stay_above_the_bound(case):
    sizes, starts, ends = case
    lay = layout(sizes, starts, ends)
    off = lay.offsets
    n = len(sizes)
    for i in range(n):
        for k in range(i + 1, n):
            live_together = starts[i] < ends[k] and starts[k] < ends[i]
            if live_together and sizes[i] and sizes[k]:
                apart = off[i] + sizes[i] <= off[k] or off[k] + sizes[k] <= off[i]
                assert apart, (i, k)
    # the bound, by brute force over every time step
    brute = max(
        (int(sizes[(starts <= t) & (t < ends)].sum()) for t in range(int(ends.max()) + 1)),
        default=0,
    )
    assert lay.live_peak == brute == live_peak(sizes, starts, ends)
    assert lay.footprint == max(int((off + sizes)[sizes > 0].max(initial=0)), 0)
    assert lay.footprint >= lay.live_peak
    assert (off >= 0).all()

"""Lane searches that share walks (NOTE [ Lane walks ]) answer as a search
on a lane that kept none: random bookings and queries, one lane set kept
across them and a fresh one (the same bookings replayed) per query. And
`FreeTime.may_fit` (NOTE [ Free time after a start ]) says no only where
neither search finds a slot."""

from __future__ import annotations

import random

import numpy as np
import pytest
from memplan.hwmodels.device import Direction
from memplan.planners.analysis.lanes import LaneSet
from memplan.planners.analysis.optimes import Timeline
from memplan.planners.core.errors import PlanError

H2D, D2H = Direction.H2D, Direction.D2H


def timelines(periods: list[float]) -> list[Timeline]:
    return [Timeline(np.zeros(1), np.array([p]), p) for p in periods]


def fresh(periods: list[float], lanes: int, bookings: list[tuple]) -> LaneSet:
    """A lane set with `bookings` made and no walk kept."""
    out = LaneSet(timelines(periods), lanes=lanes)
    for b in bookings:
        out.book(*b)
    return out


@pytest.mark.parametrize(
    "periods, lanes",
    [([1000.0], 1), ([1000.0], 2), ([1000.0, 400.0], 1)],
    ids=["one job", "two lanes", "two jobs sharing a lane"],
)
def test_kept_walks_answer_as_fresh_ones(periods, lanes):
    """Back-to-back slots (a start one slot before a busy start, as TENSILE
    books swap-ins) make walks meet at exactly equal starts."""
    rng = random.Random(36)
    kept = LaneSet(timelines(periods), lanes=lanes)
    bookings: list[tuple] = []
    durs = [40.0, 55.0]
    asked = 0
    for _ in range(60):
        for _ in range(rng.randint(5, 25)):
            job, d = rng.randrange(len(periods)), rng.choice([H2D, D2H])
            dur = rng.choice(durs)
            lo = rng.uniform(0, 1.5 * periods[job])
            hi = lo + rng.uniform(0.2, 1.2) * periods[job]
            if rng.random() < 0.5:
                want = fresh(periods, lanes, bookings).latest(job, lo, hi, dur, d)
                assert kept.latest(job, lo, hi, dur, d) == want
            else:
                want = fresh(periods, lanes, bookings).earliest(job, lo, hi, dur, d)
                assert kept.earliest(job, lo, hi, dur, d) == want
            asked += want is not None
        job, d = rng.randrange(len(periods)), rng.choice([H2D, D2H])
        dur = rng.choice(durs)
        s = kept.latest(job, 0.0, rng.uniform(0.5, 2.0) * periods[job], dur, d)
        if s is not None:
            bookings.append((job, s, dur, d))
            kept.book(job, s, dur, d)
    assert asked > 150 and len(bookings) > 10


def test_may_fit_by_hand():
    """Busy [100, 200), [240, 300), [400, 500) on a circle of 1000 us; after
    150 the lane is free for 40 us at 200, 100 us at 300, 650 us at 500."""
    lanes = LaneSet(timelines([1000.0]))
    for start, dur in [(100.0, 100.0), (240.0, 60.0), (400.0, 100.0)]:
        lanes.book(0, start, dur, H2D)
    durs = np.array([40.0, 50.0, 50.0, 120.0, 120.0])
    his = np.array([240.0, 350.0, 349.0, 620.0, 610.0])
    free = lanes.free_after(0, 150.0, 1000.0, H2D)
    assert free.may_fit(durs, his).tolist() == [True, True, False, True, False]
    for dur, hi in zip(durs, his, strict=True):
        found = lanes.latest(0, 150.0, hi, dur, H2D) is not None
        assert free.may_fit(np.array([dur]), np.array([hi])).tolist() == [found]
    with pytest.raises(ValueError, match="past this free time's end"):
        free.may_fit(np.array([40.0]), np.array([1001.0]))
    lanes.book(0, 300.0, 50.0, H2D)
    with pytest.raises(PlanError, match="after a booking"):
        free.may_fit(durs, his)


def test_may_fit_takes_a_slot_that_touches_both_neighbours():
    """Busy [0, 100) and [139.99999982, 200): the free stretch is 1.8e-7 us
    short of a 40 us copy, and both searches take [99.99999991, 139.99999991),
    which overlaps each neighbour by 0.9e-7 us, under the 1e-7 us touch
    tolerance (NOTE [ Lane steps relative to the magnitude ]); so must
    `may_fit`."""
    lanes = LaneSet(timelines([1000.0]))
    lanes.book(0, 0.0, 100.0, H2D)
    lanes.book(0, 140.0 - 1.8e-7, 60.0 + 1.8e-7, H2D)
    lo, hi = 100.0 - 0.9e-7, 140.0 - 0.9e-7
    assert lanes.latest(0, lo, hi, 40.0, H2D) == pytest.approx(lo, abs=1e-12)
    assert lanes.earliest(0, lo, hi, 40.0, H2D) == pytest.approx(lo, abs=1e-12)
    free = lanes.free_after(0, lo, 1000.0, H2D)
    assert free.may_fit(np.array([40.0]), np.array([hi])).tolist() == [True]


@pytest.mark.parametrize(
    "periods, lanes, scale",
    [([1000.0], 1, 1.0), ([1000.0], 2, 1.0), ([1000.0, 400.0], 1, 1.0), ([1000.0], 1, 2.0**40)],
    ids=["one job", "two lanes", "two jobs sharing a lane", "at 2**40"],
)
def test_may_fit_says_no_only_where_no_search_finds_a_slot(periods, lanes, scale):
    """Copies booked back to back as TENSILE books them; windows that start
    and end at busy edges, a hair (1e-8, 1e-3 us) off them, or anywhere, and
    windows one copy long ending at a busy start: no `may_fit` False where
    `latest` or `earliest` finds a slot, and a True where none does only if
    a free stretch is within a hair of fitting."""
    rng = random.Random(5)
    periods = [p * scale for p in periods]
    ls = LaneSet(timelines(periods), lanes=lanes)
    durs = [40.0 * scale, 55.0 * scale]
    seen = {True: 0, False: 0}
    hair = 1e-5 + 1e-13 * 3 * max(periods)  # a few ulps of the largest time

    def jitter() -> float:
        return rng.choice([0.0, 1e-8, -1e-8, 1e-3, -1e-3])

    def near_edge(edges: list[float], base: float) -> float:
        return rng.choice(edges) + jitter() if edges and rng.random() < 0.7 else base

    for _ in range(60):
        job, d = rng.randrange(len(periods)), rng.choice([H2D, D2H])
        dur = rng.choice(durs)
        s = ls.latest(job, 0.0, rng.uniform(0.5, 2.0) * periods[job], dur, d)
        if s is not None and rng.random() < 0.3:
            ls.book(job, s, dur, d)
        job, d = rng.randrange(len(periods)), rng.choice([H2D, D2H])
        starts = [t for _j, t, _u, _d in ls.bookings]
        edges = starts + [t + u for _j, t, u, _d in ls.bookings]
        lo = near_edge(edges, rng.uniform(0, 1.5 * periods[job]))
        copies = [rng.choice(durs) for _ in range(8)]
        his = [max(lo, near_edge(edges, lo + rng.uniform(0.1, 1.2) * periods[job])) for _ in copies]
        queries = [(lo, copies, his)]
        if starts:
            end, dur = rng.choice(starts), rng.choice(durs)
            queries.append((end - dur + jitter(), [dur], [end + jitter()]))
        for lo, copies, his in queries:
            free = ls.free_after(job, lo, max(his), d)
            fits = free.may_fit(np.array(copies), np.array(his))
            for fit, dur, hi in zip(fits.tolist(), copies, his, strict=True):
                searches = (ls.latest(job, lo, hi, dur, d), ls.earliest(job, lo, hi, dur, d))
                found = any(x is not None for x in searches)
                assert fit or not found
                if fit and not found:
                    free = ls.free_intervals(job, lo, hi, d)
                    assert any(b - a >= dur - hair for a, b in free)
                seen[fit] += 1
    assert seen[True] > 100 and seen[False] > 100

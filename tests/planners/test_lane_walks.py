"""Lane searches that share walks (NOTE [ Lane walks ]) answer as a search
on a lane that kept none: random bookings and queries, one lane set kept
across them and a fresh one (the same bookings replayed) per query."""

from __future__ import annotations

import random

import numpy as np
import pytest
from memplan.hwmodels.device import Direction
from memplan.planners.analysis.lanes import LaneSet
from memplan.planners.analysis.optimes import Timeline

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

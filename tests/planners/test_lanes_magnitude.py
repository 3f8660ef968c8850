"""Lane searches at any magnitude of time (NOTE [ Lane steps relative to the
magnitude ]): they return the slot a brute force over the free intervals
finds, they return at all when times pass 2**30 us, and a search that cannot
progress raises PlanError instead of looping."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel, Direction
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners import registry
from memplan.planners.analysis import lanes as lanes_module
from memplan.planners.analysis.lanes import LaneSet
from memplan.planners.analysis.optimes import Timeline
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.traces import synthetic

H2D = Direction.H2D


def circle(period_us: float) -> LaneSet:
    """One job whose iteration (and lane circle) is `period_us` long."""
    return LaneSet([Timeline(np.zeros(1), np.array([period_us]), period_us)])


def test_latest_at_3e13_us_stops_where_a_busy_interval_starts():
    """The case that looped forever with a constant 1e-7 us step: a circle of
    3e13 us busy on [5.605e12, 1.479e13) and [1.561e13, 2.337e13). In the
    window [5.19e13, 8.24e13] (iteration 2 from 6e13) the free stretches are
    [5.337e13, 6.5605e13) (long enough for 6.119e12 us) and [7.479e13,
    7.561e13) (too short), so the latest slot ends where the busy interval
    at 2 * 3e13 + 5.605e12 starts."""
    P = 3e13
    lanes = circle(P)
    for a, d in [
        (5605162921939.068, 9184648957006.58),
        (82439503232119.62, 932718643524.1008),
        (75608209489987.17, 7102534236374.868),
    ]:
        lanes.book(0, a, d, H2D)
    lo, hi, dur = 51896323487903.95, 82439503232119.62, 6118970848141.45
    s = lanes.latest(0, lo, hi, dur, H2D)
    assert s == pytest.approx(2 * P + 5605162921939.068 - dur, rel=1e-12)
    assert lanes.is_free(0, s, dur, H2D)


def _brute(lanes: LaneSet, lo: float, hi: float, dur: float) -> tuple[float | None, float | None]:
    """(earliest, latest) start of a free slot of `dur` in [lo, hi], read off
    the free intervals."""
    fits = [(a, b) for a, b in lanes.free_intervals(0, lo, hi, H2D) if b - a >= dur]
    if not fits:
        return None, None
    return fits[0][0], fits[-1][1] - dur


@pytest.mark.parametrize("scale", [1.0, 2.0**40])
def test_searches_agree_with_the_free_intervals_at_every_scale(scale):
    """Random bookings on a circle of 1000 (x scale) us; slot lengths and
    windows drawn so no gap is within 1e-6 of a slot's length (a touch)."""
    rng = random.Random(17)
    checked = 0
    for _ in range(300):
        P = 1000.0 * scale
        lanes = circle(P)
        for _ in range(rng.randint(0, 5)):
            lanes.book(0, rng.uniform(0, 3 * P), rng.uniform(0.01, 0.3) * P, H2D)
        lo = rng.uniform(0, 2 * P)
        hi = lo + rng.uniform(0.05, 1.5) * P
        dur = rng.uniform(0.01, 0.5) * P
        gaps = [b - a for a, b in lanes.free_intervals(0, lo, hi, H2D)]
        if any(abs(g - dur) < 1e-6 * P for g in gaps):
            continue
        first, last = _brute(lanes, lo, hi, dur)
        got_first = lanes.earliest(0, lo, hi, dur, H2D)
        got_last = lanes.latest(0, lo, hi, dur, H2D)
        if first is None:
            assert got_first is None and got_last is None
        else:
            assert got_first == pytest.approx(first, rel=1e-9, abs=1e-9 * P)
            assert got_last == pytest.approx(last, rel=1e-9, abs=1e-9 * P)
        checked += 1
    assert checked > 250


def test_a_search_past_its_step_cap_is_a_plan_error(monkeypatch):
    """Busy [100, 200) and [300, 400) on a circle of 1000 us: the latest 150 us
    slot ending by 450 needs two steps back (to 150, then to -50 < lo = 0:
    none); with a cap of one step it raises instead of looping."""
    lanes = circle(1000.0)
    lanes.book(0, 100.0, 100.0, H2D)
    lanes.book(0, 300.0, 100.0, H2D)
    assert lanes.latest(0, 0.0, 450.0, 150.0, H2D) is None
    assert lanes.earliest(0, 0.0, 600.0, 150.0, H2D) == 400.0
    monkeypatch.setattr(lanes_module, "_step_cap", lambda *a: 1)
    with pytest.raises(PlanError, match=r"lane search \(latest\) for job 0 made no progress"):
        lanes.latest(0, 0.0, 450.0, 150.0, H2D)
    with pytest.raises(PlanError, match=r"lane search \(earliest\) for job 0 made no progress"):
        lanes.earliest(0, 0.0, 600.0, 150.0, H2D)


def test_a_non_finite_iteration_is_a_plan_error():
    with pytest.raises(PlanError, match=r"job 0: the predicted iteration time is not finite"):
        circle(float("inf"))


@pytest.mark.parametrize("planner", ["tensile", "capuchin"])
def test_planners_return_on_ops_of_2_62_flops(planner):
    """Every op 2**62 FLOPs (about 33 h each on an RTX A6000 by roofline): the
    lane circles run to ~1e13 us, and the planners still return checked plans."""
    t = synthetic.residual(4, seed=3)
    t = dataclasses.replace(
        t, ops=tuple(dataclasses.replace(o, flops=2**62, duration_us=None) for o in t.ops)
    )
    device = DeviceModel(load_hardware("rtx-a6000"), Roofline(), 1)
    for frac in (0.5, 0.8):
        result = registry.run(planner, [t, t], device, budget_bytes=int(t.peak()[0] * frac))
        for plan in result.plans:
            check(plan, t)

"""Whole buffers in the split bound (NOTE [ Whole buffers ] in
planners/analysis/whole.py): the 0/1 cover against enumeration, a
hand-worked case where it is the optimum, and the split bound with it never
below the fractional one nor above the brute-force optimum, a simulated
heuristic plan, or Checkmate's known optima."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel, TimeUnit
from memplan.hwmodels.latency import Fixed, Measured
from memplan.hwmodels.profile import load_hardware
from memplan.planners import registry
from memplan.planners.analysis.bounds import peak_lower_bound
from memplan.planners.analysis.gaps import gap_table
from memplan.planners.analysis.whole import UNITS, whole_cover
from memplan.planners.analysis.window_bound import _min_cover, split_bound, time_bounds
from memplan.planners.core.plan import Plan, SwapIn, SwapOut, fingerprint_of
from memplan.sim import Job, simulate
from memplan.traces import synthetic
from memplan.traces.synthetic import Durations, Grain

from tests.planners.bruteforce import (
    MS,
    B,
    MiB,
    Step,
    brute_force,
    durations_s,
    random_tiny,
    tiny_hw,
    tiny_trace,
)

REL = 1e-9


def _exact(cost: np.ndarray, nbytes: np.ndarray, need: float) -> float:
    """The 0/1 optimum by enumeration of every subset."""
    best = math.inf
    for take in itertools.product((0, 1), repeat=len(cost)):
        t = np.array(take, bool)
        if nbytes[t].sum() >= need:
            best = min(best, float(cost[t].sum()))
    return best


# ---- the cover ------------------------------------------------------------------------
def test_whole_cover_by_hand():
    # need 5 of gaps of 4, 4 and 2 bytes at costs 4, 4, 3: fractionally one
    # 4 and half the 2 (5.5) or 1.25 of the 4s (5); whole, a 4 and the 2 (7)
    cost, nbytes = np.array([4.0, 4.0, 3.0]), np.array([4.0, 4.0, 2.0])
    assert _min_cover(cost[None, :], nbytes, 5.0)[0] == pytest.approx(5.0)
    assert whole_cover(cost, nbytes, 5.0)[0] == pytest.approx(7.0)
    # an unusable gap (inf) is never taken; too few bytes is inf; no need is 0
    assert whole_cover(np.array([4.0, np.inf, 3.0]), nbytes, 5.0)[0] == pytest.approx(7.0)
    assert whole_cover(np.array([4.0, np.inf, np.inf]), nbytes, 5.0)[0] == math.inf
    assert whole_cover(cost, nbytes, 0.0)[0] == 0.0
    # large gaps only, holding exactly the need (no rounding may lose it)
    for need in (7.3, 7.3e6 + 0.1, 123456789.0):
        two = np.array([need * 0.45, need - need * 0.45])
        assert whole_cover(np.array([1.0, 2.0]), two, need)[0] == pytest.approx(3.0)


@pytest.mark.parametrize("seed", range(40))
def test_whole_cover_is_below_the_0_1_optimum(seed):
    """Random gaps (a few large next to the need, many small, some unusable):
    never above the exact 0/1 optimum (it is a bound), and equal to it when
    every gap is a whole number of units and taken whole (nothing rounded)."""
    rng = np.random.default_rng(seed)
    g = int(rng.integers(2, 11))
    nbytes = rng.choice([1.0, 3.0, 50.0, 200.0, 700.0], size=g) * rng.uniform(0.5, 1.5, g)
    cost = np.where(rng.random(g) < 0.15, np.inf, rng.uniform(0.0, 5.0, g))
    need = float(rng.uniform(0.1, 1.0) * nbytes.sum())
    rows = np.stack([cost, cost * rng.uniform(0.5, 2.0, g)])
    got = whole_cover(rows, nbytes, need)
    for row, value in zip(rows, got):
        assert value <= _exact(row, nbytes, need) * (1 + REL)
    # exact: need = UNITS units of 1 byte, every gap >= 16 units, whole units
    sizes = rng.integers(300, 1500, size=g).astype(np.float64)
    need = float(UNITS)
    if sizes.sum() >= need:
        assert whole_cover(cost, sizes, need)[0] == pytest.approx(_exact(cost, sizes, need))


# ---- the split bound with whole buffers: by hand ---------------------------------------
def test_split_with_whole_buffers_is_the_optimum():
    """A and C (4 MiB each, made by op 0, which also writes an empty parameter:
    neither may be recomputed) are read by op 4; op 1 makes Y (6 MiB), op 2
    reads it; op 3 takes 20 ms, the others 1 ms; the lane moves 1 MiB/ms.
    Under 12 MiB, 2 MiB of A and C is off the device while ops 1 and 2 run.

    - fractional split at the start of op 1, s = op 0: op 0, then 2 MiB out
      (2 ms), then ops 1-4 (23 ms) hide the copy back: 26 ms;
    - whole: one of A and C goes out, 4 ms: 28 ms;
    - the plan that copies A out after op 0 (op 1 waiting) and back after op
      2 runs in 1 + 4 + 1 + 1 + 20 + 1 = 28 ms: the bound is the optimum."""
    ops = [
        Step((), (0, 1, 3)),
        Step((), (2,)),
        Step((2,), ()),
        Step((), (), 20),
        Step((0, 1), ()),
    ]
    t = tiny_trace([B(4), B(4), B(6), B(0, "param")], ops)
    dev = DeviceModel(tiny_hw(), Fixed(durations_s(t)))
    budget = 12 * MiB
    g = gap_table(t, dev)
    d = dev.op_durations(t, TimeUnit.S)
    need = (t.memory_curve("liveness") - budget).astype(np.float64)
    assert split_bound(g, d, need, whole=False).seconds == pytest.approx(0.026)
    whole = split_bound(g, d, need)
    assert whole.seconds == pytest.approx(0.028)
    assert whole.where.endswith("whole buffers")
    assert time_bounds(t, dev, budget).best.name == "split"
    plan = Plan(fingerprint_of(t), (SwapOut(0, 0, 0.0, 1), SwapIn(0, 2, 4)))
    run = simulate([Job(t, plan)], dev, budget=budget).jobs[0]
    assert run.iteration_times_s == pytest.approx((0.028,) * 3)


# ---- validity and strength -------------------------------------------------------------
def _splits(t, dev, budget) -> tuple[float, float]:
    """(fractional, whole) split bounds; -inf where no op is over the budget."""
    need = (t.memory_curve("liveness") - budget).astype(np.float64)
    if not (need > 0).any() or budget < peak_lower_bound(t, workspace=False).nbytes:
        return -math.inf, -math.inf
    g, d = gap_table(t, dev), dev.op_durations(t, TimeUnit.S)
    return split_bound(g, d, need, whole=False).seconds, split_bound(g, d, need).seconds


def test_whole_split_is_between_the_fractional_one_and_the_brute_force_optimum():
    """Random tiny steps (buffers of 1-4 MiB, needs of a few MiB: whole
    buffers matter), lanes from 4 to 0.25 MiB/ms: the split bound with whole
    buffers is at or above the fractional one, strictly above it somewhere,
    and never above the brute force's optimum (a subset of all plans)."""
    compared = raised = 0
    for seed in range(24):
        t, budget = random_tiny(seed, n_ops=8)
        d = [round(op.duration_us * 1000) for op in t.ops]
        for mib_per_ms in (4, 0.25):
            dev = DeviceModel(tiny_hw(lanes_bw_mib_per_ms=mib_per_ms), Fixed(durations_s(t)))
            io_t = [round(int(b.nbytes // MiB) * MS / mib_per_ms) for b in t.buffers]
            for extra in (0, MiB):
                frac, whole = _splits(t, dev, budget + extra)
                assert whole >= frac * (1 - REL)
                raised += whole > frac * (1 + 1e-6)
                bf = brute_force(t, d, io_t, budget + extra)
                if bf.iteration_ticks is None:
                    continue
                compared += 1
                assert whole <= bf.iteration_ticks * 1e-9 * (1 + REL)
    assert compared >= 40 and raised >= 5


SYNTHETIC = {
    "chain": lambda: synthetic.chain(6, act_mib=4, durations=Durations(Grain.US, 50, 400)),
    "unet": lambda: synthetic.unet(2, act_mib=4, durations=Durations(Grain.US, 50, 400)),
    "checkmate": lambda: synthetic.checkmate_chain(8),
}


def _heuristics() -> list[str]:
    return [n for n in registry.names() if n != "cpsat" and not registry.get(n).searches]


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(SYNTHETIC))
def test_whole_split_holds_for_every_heuristic_plan(family):
    """Budgets from near the release-only peak down to near the peak floor,
    a lane of 0.5 MiB/ms (copies of a 4 MiB activation take 8 ms against ops
    of 50-400 us): the steady state of every heuristic's plan that runs
    (with the dtr net) is at or above the split bound with whole buffers
    (per period: NOTE [ Split across the boundary ])."""
    t = SYNTHETIC[family]()
    dev = DeviceModel(tiny_hw(lanes_bw_mib_per_ms=0.5, memory_mib=4096), Measured())
    peak = int(t.memory_curve("liveness").max())
    floor = peak_lower_bound(t, workspace=False).nbytes
    ran = 0
    for frac in (0.8, 0.5, 0.2):
        budget = floor + int(frac * (peak - floor))
        _, whole = _splits(t, dev, budget)
        for name in _heuristics():
            r = registry.get(name)([t], dev, budget_bytes=budget)
            if not r.plans:
                continue
            run = simulate([Job(t, r.plans[0])], dev, budget=budget, oom="dtr").jobs[0]
            if run.oom:
                continue
            ran += 1
            assert run.iteration_time_s >= whole * (1 - REL), (name, frac)
    assert ran >= 6


@pytest.mark.parametrize(("n", "units", "optimum"), [(8, 5, 22), (6, 4, 18), (16, 9, 42)])
def test_whole_split_on_checkmates_chain(n, units, optimum):
    """At or below Checkmate's optimum 2n + 1 + B unit ops (1 us each) at
    budget B = floor((n + 2) / 2) units (n = 6: 18, as the brute force finds)."""
    t = synthetic.checkmate_chain(n)
    dev = DeviceModel(load_hardware("rtx-a6000"), Measured())
    frac, whole = _splits(t, dev, units * (64 << 20))
    assert frac * (1 - REL) <= whole <= optimum * 1e-6 * (1 + REL)

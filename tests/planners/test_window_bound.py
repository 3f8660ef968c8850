"""The gap table (planners/analysis/gaps.py) and the window bounds built on
it (planners/analysis/window_bound.py): hand-worked values, and validity --
no bound above the brute-force optimum, above a simulated iteration of any
heuristic's plan or of a random plan (under every OOM policy), or above
Checkmate's known optima."""

from __future__ import annotations

import math

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel, Direction, TimeUnit
from memplan.hwmodels.latency import Fixed, Measured
from memplan.hwmodels.profile import load_hardware
from memplan.planners import registry
from memplan.planners.analysis.bounds import peak_lower_bound, time_lower_bound
from memplan.planners.analysis.gaps import gap_table, recompute_costs
from memplan.planners.analysis.window_bound import (
    BestBound,
    best_time_bound,
    time_bounds,
)
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import (
    Plan,
    Recompute,
    Release,
    SwapIn,
    SwapOut,
    fingerprint_of,
)
from memplan.sim import Job, simulate
from memplan.sim.state import OomPolicy
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

REL = 1e-9  # float noise: bounds sum seconds, the simulator microseconds


def _device(t, mib_per_ms: float = 1.0, lanes: int = 1) -> DeviceModel:
    return DeviceModel(tiny_hw(lanes_bw_mib_per_ms=mib_per_ms), Fixed(durations_s(t)), lanes=lanes)


# ---- the gap table ------------------------------------------------------------------------
def test_gap_table_by_hand():
    # 0: input X (2 MiB), read by ops 0 and 3; 1: parameter P (1 MiB), read by
    # op 0, updated in place by op 4; 2: activation A (4 MiB), made by op 0
    # (3 ms), read by ops 1 and 3; 3: frozen parameter F (1 MiB), read by op 1
    ops = [
        Step((0, 1), (2,), 3),
        Step((2, 3), (), 1),
        Step((), (), 1),
        Step((0, 2), (), 1),
        Step((1,), (1,), 1),
    ]
    t = tiny_trace([B(2, "input"), B(1, "param"), B(4), B(1, "param")], ops)
    g = gap_table(t, _device(t))
    rows = sorted(
        zip(
            g.buffer.tolist(),
            g.after.tolist(),
            g.before.tolist(),
            (g.d2h * 1e3).round(9).tolist(),
            (g.h2d * 1e3).round(9).tolist(),
            (g.rec * 1e3).round(9).tolist(),
        )
    )
    inf = math.inf
    # copies per period (NOTE [ The boundary ] in planners/analysis/gaps.py)
    assert rows == [
        # X: a D2H after the iteration starts (no host copy at load) and an H2D
        (0, 0, 3, 2.0, 2.0, inf),
        # P: its host copy is of op 4's write, of the previous iteration: a
        # round trip per period, the D2H not within the iteration
        (1, 0, 4, 1.0, 1.0, inf),
        # A: both copies, or op 0 again
        (2, 1, 3, 4.0, 4.0, 3.0),
        # F before its read and after it, one gap across the boundary: never
        # written (its host copy stays valid), but back once per period
        (3, -1, 1, 0.0, 1.0, inf),
        (3, 1, 5, 0.0, 1.0, inf),
    ]
    at = {(int(b), int(a)): i for i, (b, a) in enumerate(zip(g.buffer, g.after))}
    # F's two pieces share one H2D; P's D2H follows op 4 of the previous
    # iteration (position 4 - 5); F's after-piece is back by op 1 of the next
    assert g.trip[at[(3, -1)]] == g.trip[at[(3, 1)]] != g.trip[at[(1, 0)]]
    assert (g.written[at[(1, 0)]], g.out_after[at[(1, 0)]]) == (-2, -1)
    assert g.in_before[at[(3, 1)]] == 6 and g.in_before[at[(2, 1)]] == 3


def test_recompute_costs_by_hand():
    # op 0 writes A (3 MiB) and B (1 MiB) in 4 ms: shares of 3 and 1 ms; op 1
    # (RNG, 2 ms) writes C; op 2 rewrites C in place (reads it): not a maker;
    # op 3 writes D and the parameter P: it may never run twice
    ops = [
        Step((), (0, 1), 4),
        Step((), (2,), 2, rng=True),
        Step((2,), (2,), 1),
        Step((0,), (3, 4), 1),
        Step((1, 2, 3, 4), (), 1),
    ]
    t = tiny_trace([B(3), B(1), B(1), B(1), B(1, "param")], ops)
    rec = recompute_costs(t, np.array(durations_s(t)))
    assert (rec * 1e3).round(9).tolist() == [3.0, 1.0, 2.0, math.inf, math.inf]
    # NOTE [ Later writes in the chain ]: C's gap (2, 4) comes back by a chain
    # that re-runs op 1 and then op 2's in-place write: 2 + 1 ms, not op 1's 2
    g = gap_table(t, DeviceModel(load_hardware("rtx-a6000"), Measured()))
    by_gap = {
        (int(b), int(a)): round(float(r) * 1e3, 9) for b, a, r in zip(g.buffer, g.after, g.rec)
    }
    assert by_gap[(2, 2)] == 3.0
    assert by_gap[(0, 0)] == 3.0 and by_gap[(1, 0)] == 1.0


@pytest.mark.parametrize(
    "make",
    [
        lambda: synthetic.chain(4),
        lambda: synthetic.residual(3),
        lambda: synthetic.unet(2),
        lambda: synthetic.random_dag(80, seed=5, dropout=True),
        lambda: synthetic.checkmate_chain(6),
    ],
)
def test_gaps_and_accesses_add_up_to_the_release_only_memory(make):
    t = make()
    g = gap_table(t, _device(t))
    p, bufs = t.access_csr
    mem = np.zeros(t.n_ops + 1)
    np.add.at(mem, np.repeat(np.arange(t.n_ops), np.diff(p)), t.nbytes[bufs])
    around = np.zeros(t.n_ops + 1)
    np.add.at(around, g.after + 1, g.nbytes)
    np.add.at(around, g.before, -g.nbytes)
    assert (mem[:-1] + np.cumsum(around)[:-1]).tolist() == t.memory_curve("liveness").tolist()


# ---- strength: hand-worked cases ----------------------------------------------------------
SPLIT_OPS = [
    Step((), (0, 2), 1),
    Step((), (1,), 1),
    Step((1,), (), 1),
    Step((), (), 20),
    Step((0,), (), 1),
]
SPLIT_BUFFERS = [B(8), B(8), B(0, "param")]


def test_split_bound_is_above_the_single_op_bound():
    """A (8 MiB) is made by op 0, which also writes an empty parameter (so A
    may not be recomputed), and read by op 4; op 1 makes Y (8 MiB), op 2
    reads it; op 3 takes 20 ms, the others 1 ms; the lane moves 1 MiB/ms.
    Under 8 MiB, A is off the device while ops 1 and 2 run.

    - single-op: A's round trip (16 ms of lane) hides behind 24 ms of
      compute: 24 ms.
    - split at the start of op 1, with s = op 0 (A's D2H copy cannot start
      before op 0 ends): before it, op 0 (1 ms) then the D2H copy (8 ms):
      9 ms; after it, ops 1-4 (23 ms) hide the H2D copy (8 ms): 32 ms.
    - the plan that copies A out after op 0 (op 1 waiting for it) and back
      after op 2 runs in 1 + 8 + 1 + 1 + 20 + 1 = 32 ms: the bound is the
      optimum."""
    t = tiny_trace(SPLIT_BUFFERS, SPLIT_OPS)
    dev = _device(t)
    tb = {b.name: b.seconds for b in time_bounds(t, dev, 8 * MiB).bounds}
    assert tb["single-op"] == pytest.approx(0.024)
    assert tb["split"] == pytest.approx(0.032)
    assert best_time_bound(t, dev, 8 * MiB) == (pytest.approx(0.032), "split")
    plan = Plan(fingerprint_of(t), (SwapOut(0, 0, 0.0, 1), SwapIn(0, 2, 4)))
    run = simulate([Job(t, plan)], dev, budget=8 * MiB).jobs[0]
    assert run.iteration_times_s == pytest.approx((0.032,) * 3)


def test_split_counts_a_d2h_copy_only_after_its_write():
    """A and C (4 MiB each, made by ops 0 and 2 with an empty parameter: not
    recomputable) are read by ops 5 and 6; op 3 makes Y (8 MiB), op 4 reads
    it; op 1 takes 8 ms, the others 1 ms (14 ms in all); the lane moves
    1 MiB/ms. Under 8 MiB, A and C are both out while ops 3 and 4 run.

    - single-op and multi-op: two round trips, 16 ms of lane.
    - split at the start of op 3 (or 4), s = op 2, r = op 6: only C's D2H
      copy must come after op 2 (A's hides behind op 1): ops 0-2 (10 ms) then
      4 ms; then both H2D copies (8 ms, beside ops 3-5) before op 6 (1 ms):
      14 + 9 = 23 ms. Counting A's D2H copy after op 2 as well would claim
      27 ms, more than the plan below.
    - the plan that copies A out during op 1, C out after op 2 (op 3 waiting)
      and both back after op 4 runs in 10 + 4 + 2 + 4 + 1 + 3 + 1 = 25 ms."""
    ops = [
        Step((), (0, 3), 1),
        Step((), (), 8),
        Step((), (1, 3), 1),
        Step((), (2,), 1),
        Step((2,), (), 1),
        Step((0,), (), 1),
        Step((1,), (), 1),
    ]
    t = tiny_trace([B(4), B(4), B(8), B(0, "param")], ops)
    dev = _device(t)
    tb = {b.name: b.seconds for b in time_bounds(t, dev, 8 * MiB).bounds}
    assert tb["single-op"] == pytest.approx(0.016)
    assert tb["split"] == pytest.approx(0.023)
    events = (SwapOut(0, 0, 0.0, 3), SwapOut(1, 2, 0.0, 3), SwapIn(0, 4, 5), SwapIn(1, 4, 6))
    run = simulate([Job(t, Plan(fingerprint_of(t), events))], dev, budget=8 * MiB).jobs[0]
    assert run.iteration_times_s == pytest.approx((0.025,) * 3)


def test_multi_op_bound_covers_every_op_at_once():
    """A and B (4 MiB each, made by ops 0 and 3, which also write an empty
    parameter, so neither may be recomputed) are read by ops 2 and 5; ops 1
    and 4 make 4 MiB temporaries. All ops take 1 ms, the lane moves 1 MiB/ms.
    Under 4 MiB, A is off the device at op 1 and B at op 4.

    - single-op: one op needs one round trip of 4 MiB, 8 ms > 6 ms of
      compute: 8 ms.
    - split at the start of op 4, with s = op 3 (B's D2H copy cannot start
      before op 3 ends) and r = op 5 (its H2D copy ends before op 5 starts):
      ops 0-3 then the D2H copy, 4 + 4 ms; the H2D copy (4 ms, beside op 4)
      then op 5, 4 + 1 ms: 13 ms (the start of op 1 gives 1 + 4 + 4 + 4).
    - multi-op: both round trips on one lane, 16 ms.
    - the plan that swaps each out before and in after its hot op stalls
      4 ms four times: 6 + 16 = 22 ms."""
    ops = [
        Step((), (0, 1)),
        Step((), (2,)),
        Step((0,), ()),
        Step((), (3, 1)),
        Step((), (4,)),
        Step((3,), ()),
    ]
    t = tiny_trace([B(4), B(0, "param"), B(4), B(4), B(4)], ops)
    dev = _device(t)
    tb = {b.name: b.seconds for b in time_bounds(t, dev, 4 * MiB).bounds}
    assert tb["single-op"] == pytest.approx(0.008)
    assert tb["split"] == pytest.approx(0.013)
    assert tb["multi-op"] == pytest.approx(0.016, rel=1e-6)  # costs rounded down in the flow
    assert best_time_bound(t, dev, 4 * MiB).name == "multi-op"
    events = (SwapOut(0, 0, 0.0, 1), SwapIn(0, 1, 2), SwapOut(3, 3, 0.0, 4), SwapIn(3, 4, 5))
    run = simulate([Job(t, Plan(fingerprint_of(t), events))], dev, budget=4 * MiB).jobs[0]
    assert run.iteration_times_s == pytest.approx((0.022,) * 3)


def test_two_lanes_split_the_same_way():
    # the split counts only D2H copies before its instant and only H2D copies
    # after it: a second lane changes nothing (the case above)
    t = tiny_trace(SPLIT_BUFFERS, SPLIT_OPS)
    tb = {b.name: b.seconds for b in time_bounds(t, _device(t, lanes=2), 8 * MiB).bounds}
    assert tb["split"] == pytest.approx(0.032)


def test_names_of_the_best_bound():
    t = tiny_trace(SPLIT_BUFFERS, SPLIT_OPS)
    dev = _device(t)
    # nothing over the budget: compute is the bound, and every other ties it
    assert best_time_bound(t, dev, 16 * MiB) == BestBound(pytest.approx(0.024), "compute")
    # below the peak lower bound (A and Y are 8 MiB each) no plan fits
    s, name = best_time_bound(t, dev, 8 * MiB - 1)
    assert (math.isinf(s), name) == (True, "peak floor")
    # over the budget: every bound, in order, and the largest named
    tb = time_bounds(t, dev, 8 * MiB)
    assert [b.name for b in tb.bounds] == ["compute", "single-op", "split", "multi-op"]
    assert tb.best.name == tb.to_dict()["best"] == "split"


def test_a_bad_budget_is_a_plan_error():
    t = tiny_trace(SPLIT_BUFFERS, SPLIT_OPS)
    with pytest.raises(PlanError, match="budget=0 must be a positive number of bytes"):
        time_bounds(t, _device(t), 0)


# ---- validity -----------------------------------------------------------------------------
def _all_bounds(t, dev, budget) -> list[float]:
    return [b.seconds for b in time_bounds(t, dev, budget).bounds]


def _above_compute(t, dev, budget) -> bool:
    tb = time_bounds(t, dev, budget)
    return tb.best.seconds > tb.compute_s * (1 + 1e-6)


@pytest.mark.parametrize("seed", range(24))
def test_bounds_never_exceed_the_brute_force_optimum(seed):
    # the brute force's plans are a subset of all plans: its optimum is at or
    # above the true one, so no lower bound may pass it; a slow lane (4 ms per
    # MiB) makes the bounds rise above compute
    t, budget = random_tiny(seed, n_ops=8)
    d = [round(op.duration_us * 1000) for op in t.ops]
    for mib_per_ms in (4, 0.25):
        io_t = [round(int(b.nbytes // MiB) * MS / mib_per_ms) for b in t.buffers]
        dev = _device(t, mib_per_ms=mib_per_ms)
        for extra in (0, MiB):
            bf = brute_force(t, d, io_t, budget + extra)
            if bf.iteration_ticks is None:  # none of its plans fits: nothing to compare
                continue
            for s in _all_bounds(t, dev, budget + extra):
                assert s <= bf.iteration_ticks * 1e-9 * (1 + REL)


def _heuristics() -> list[str]:
    return [n for n in registry.names() if n != "cpsat" and not registry.get(n).searches]


def _policies() -> list[str]:
    return [p.value for p in OomPolicy]


SYNTHETIC = {
    "chain": lambda: synthetic.chain(6, act_mib=4, durations=Durations(Grain.US, 50, 400)),
    "residual": lambda: synthetic.residual(3, act_mib=4, durations=Durations(Grain.US, 50, 400)),
    "unet": lambda: synthetic.unet(2, act_mib=4, durations=Durations(Grain.US, 50, 400)),
    "dag": lambda: synthetic.random_dag(
        50, seed=3, dropout=True, durations=Durations(Grain.US, 20, 400)
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(SYNTHETIC))
@pytest.mark.parametrize(("lanes", "mib_per_ms"), [(1, 2), (1, 0.5), (2, 0.5)])
def test_bounds_hold_for_every_heuristic_plan_and_fallback(family, lanes, mib_per_ms):
    """Budgets from near the release-only peak down to near the peak floor;
    copies of a 4 MiB activation take 2-8 ms against ops of 20-400 us."""
    t = SYNTHETIC[family]()
    hw = tiny_hw(lanes_bw_mib_per_ms=mib_per_ms, memory_mib=4096)
    dev = DeviceModel(hw, Measured(), lanes=lanes)
    peak = int(t.memory_curve("liveness").max())
    floor = peak_lower_bound(t, workspace=False).nbytes
    ran = above = 0
    for frac in (0.8, 0.5, 0.25, 0.05):
        budget = floor + int(frac * (peak - floor))
        worst = max(_all_bounds(t, dev, budget))
        above += _above_compute(t, dev, budget)
        for name in _heuristics():
            r = registry.get(name)([t], dev, budget_bytes=budget)
            if not r.plans:
                continue
            for policy in _policies():
                run = simulate([Job(t, r.plans[0])], dev, budget=budget, oom=policy).jobs[0]
                if run.oom:
                    continue
                ran += 1
                # the steady state: bounds are per period (NOTE [ The boundary ])
                assert run.iteration_time_s >= worst * (1 - REL), (name, policy, frac)
    assert ran >= 12 and above >= 3


def _random_plan(t, rng: np.random.Generator) -> Plan:
    """Swaps with random triggers, delays and deadlines, releases with a
    recompute of the maker, and cross-iteration swaps of parameters."""
    n, events = t.n_ops, []
    for b in range(t.n_buffers):
        acc = t.accesses_of(b).tolist()
        for p, q in zip(acc, acc[1:]):
            if q - p < 2 or rng.random() < 0.3:
                continue
            maker = int(t.created_at[b])
            if rng.random() < 0.6 or maker < 0:
                deadline = int(rng.integers(p + 1, q + 1)) if rng.random() < 0.3 else -1
                events.append(SwapOut(b, p, float(rng.choice([0.0, 300.0, 3000.0])), deadline))
                after = int(rng.integers(p, q))
                events.append(SwapIn(b, after, q, float(rng.choice([0.0, 500.0]))))
            else:
                events += [Release(b, p), Recompute(b, q, (maker,), t.ops[maker].rng)]
        if t.persistent[b] and acc and rng.random() < 0.5:
            events.append(SwapOut(b, acc[-1], float(rng.choice([0.0, 1000.0]))))
            after = int(rng.integers(acc[-1], n))
            events.append(SwapIn(b, after, acc[0], 0.0, next_iteration=True))
    return Plan(fingerprint_of(t), tuple(events))


@pytest.mark.slow
def test_bounds_hold_for_random_plans_under_every_policy():
    """The steady state (the mean of iterations 1..) of every run that
    finishes, bounds being per period (NOTE [ The boundary ] in
    planners/analysis/gaps.py: a plan that leaves the H2D of a parameter to
    the next iteration has a lighter last one): random plans the checker
    accepts on random tiny steps, one lane or two, lanes from 4 MiB/ms
    (copies hide) to 0.1 MiB/ms (the bounds rise above compute), every OOM
    policy of the simulator."""
    ran = above = 0
    for seed in range(16):
        t, budget = random_tiny(seed, n_ops=9, n_buffers=7)
        rng = np.random.default_rng(seed)
        for lanes, mib_per_ms in ((1, 4), (1, 0.1), (2, 0.25)):
            dev = _device(t, mib_per_ms=mib_per_ms, lanes=lanes)
            for extra in (0, MiB):
                worst = max(_all_bounds(t, dev, budget + extra))
                above += _above_compute(t, dev, budget + extra)
                for _ in range(4):
                    plan = _random_plan(t, rng)
                    try:
                        check(plan, t)
                    except PlanError:
                        continue
                    for policy in _policies():
                        job = simulate([Job(t, plan)], dev, budget=budget + extra, oom=policy)
                        run = job.jobs[0]
                        if not run.oom:
                            ran += 1
                            steady = run.iteration_time_s
                            assert steady >= worst * (1 - REL), (plan, policy)
    assert ran >= 500 and above >= 20


CHECKMATE = [(8, 5, 22), (8, 6, 21), (6, 4, 18), (6, 5, 16)]  # n, units of budget, optimum


@pytest.mark.parametrize(("n", "units", "optimum"), CHECKMATE)
def test_bounds_on_checkmates_chain(n, units, optimum):
    """Every bound stays at or below the known optimum (unit ops of 1 us).
    The single-op bound at the peak (op n + 1, n + 2 units live) is T with
    T / rt + (T - (2n + 1) us) / 1 us = n + 2 - B units missing, rt a unit's
    round trip (ms: the lane takes a sliver), i.e. T = (3n + 3 - B) /
    (1 / rt + 1e6): the optimum, bar that sliver, where B = (n + 2) / 2."""
    t = synthetic.checkmate_chain(n)
    dev = DeviceModel(load_hardware("rtx-a6000"), Measured())
    unit = 64 << 20
    budget = units * unit
    for s in _all_bounds(t, dev, budget):
        assert s <= optimum * 1e-6 * (1 + REL)
    rt = float(
        dev.copy_time(unit, Direction.D2H, TimeUnit.S)
        + dev.copy_time(unit, Direction.H2D, TimeUnit.S)
    )
    single = time_lower_bound(t, dev, budget).seconds
    assert single == pytest.approx((3 * n + 3 - units) / (1 / rt + 1e6), rel=1e-9)

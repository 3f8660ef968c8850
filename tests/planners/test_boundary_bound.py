"""Bounds that see the iteration boundary (NOTE [ The boundary ] in
planners/analysis/gaps.py, NOTE [ Split across the boundary ] in
planners/analysis/window_bound.py): a persistent buffer absent across it pays
a round trip per period. A hand-worked case, and validity against the brute
force and against the simulated steady state of the planners' plans."""

from __future__ import annotations

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Measured
from memplan.planners import registry
from memplan.planners.analysis.bounds import peak_lower_bound, time_lower_bound
from memplan.planners.analysis.gaps import gap_table
from memplan.planners.analysis.window_bound import SPLIT, time_bounds
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Plan, SwapIn, SwapOut, fingerprint_of
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
    random_tiny,
    tiny_hw,
    tiny_trace,
)
from tests.planners.test_window_bound import REL, _device, _random_plan

ITERATIONS = 6  # simulated: the steady state is the mean of iterations 1..5


# ---- by hand ------------------------------------------------------------------------------
# S (4 MiB) is optimizer state: op 2 reads and rewrites it, nothing else touches
# it. A (4 MiB) is made by op 0 and read by op 1; op 3 touches nothing. Every op
# takes 1 ms, the lane 1 ms per MiB. At a 4 MiB budget S is gone while ops 0 and
# 1 run, in the piece (-1, 2) of its gap across the boundary: each period its
# D2H (after op 2 of the previous iteration: 4 ms) and its H2D (after op 1,
# before op 2: 4 ms).
def _state_trace():
    ops = [Step((), (1,), 1), Step((1,), (), 1), Step((0,), (0,), 1), Step((), (), 1)]
    return tiny_trace([B(4, "param"), B(4)], ops)


def test_a_state_absent_at_the_peak_pays_both_copies():
    t = _state_trace()
    dev = _device(t)
    g = gap_table(t, dev)
    (head,) = [i for i in range(len(g)) if g.after[i] == -1]
    # per period a round trip; within the iteration only the H2D
    assert (g.d2h[head] * 1e3, g.h2d[head] * 1e3, g.written[head]) == (4.0, 4.0, -2)
    assert (g.out_after[head], g.in_before[head]) == (2 - 4, 2)
    ms = {b.name: round(b.seconds * 1e3, 6) for b in time_bounds(t, dev, 4 * MiB).bounds}
    # compute 4 ms. Single-op and multi-op: 8 ms of copies on one lane (a
    # bound that charged the H2D alone: 4 ms, compute). Split at the start of
    # op 0, out after op 2 of the previous iteration, back before op 2: the D2H
    # against op 3 (4 ms), the H2D against ops 0-1 (4 ms), then op 2: 9 ms (a
    # split that saw no D2H before the iteration's start: 2 + 4 + 2 = 8 ms,
    # the H2D between ops 1 and 2)
    assert ms == {"compute": 4.0, "single-op": 8.0, "split": 9.0, "multi-op": 8.0}
    best = time_bounds(t, dev, 4 * MiB).best
    assert best.name == SPLIT and "of the previous iteration" in best.where


def test_the_hand_worked_bound_is_below_a_real_plan():
    # copy S out at each iteration's start (op 0 waits for it), back after op 1:
    # 4 + 1 + 1 + 4 + 1 + 1 = 12 ms every iteration, iteration 0 included
    t = _state_trace()
    dev = _device(t)
    plan = Plan(fingerprint_of(t), (SwapOut(0, -1, 0.0, 0), SwapIn(0, 1, 2)))
    check(plan, t)
    run = simulate([Job(t, plan)], dev, budget=4 * MiB, iterations=ITERATIONS).jobs[0]
    assert not run.oom and run.iteration_times_s == (0.012,) * ITERATIONS
    assert time_bounds(t, dev, 4 * MiB).best.seconds <= run.iteration_time_s * (1 + REL)


# P (4 MiB) is a parameter that op 0 reads and updates in place; A (4 MiB) is made
# by op 1 and read by op 2. At 4 MiB, P is gone over ops 1-2 in the piece (0, 4)
# of its gap: a D2H after op 0 and an H2D by op 0 of the next iteration.
def test_a_parameter_absent_after_its_update_pays_both_copies():
    ops = [Step((0,), (0,), 1), Step((), (1,), 1), Step((1,), (), 1), Step((), (), 1)]
    t = tiny_trace([B(4, "param"), B(4)], ops)
    dev = _device(t)
    g = gap_table(t, dev)
    (tail,) = [i for i in range(len(g)) if g.before[i] == t.n_ops]
    assert (g.d2h[tail] * 1e3, g.h2d[tail] * 1e3) == (4.0, 4.0)
    assert (g.out_after[tail], g.in_before[tail]) == (0, 0 + 4)
    # single-op: the round trip, 8 ms (a bound charging only the D2H: compute,
    # 4 ms). Split at the start of op 1, out after op 0, back by the next
    # iteration's op 0, over one period from the end of op 0: the D2H (4 ms,
    # no op between), max(ops 1-3, H2D) = 4 ms, then the next op 0: 9 ms (a
    # split that charged no H2D past the iteration: op 0, the D2H, ops 1-3: 8)
    tb = time_lower_bound(t, dev, 4 * MiB, workspace=False)
    assert round(tb.seconds * 1e3, 6) == 8.0
    best = time_bounds(t, dev, 4 * MiB).best
    assert (best.name, round(best.seconds * 1e3, 6)) == (SPLIT, 9.0)
    assert best.where == "start of op 1, copies out after op 0"


def test_the_bound_is_on_the_steady_state_not_on_iteration_zero():
    # P out after op 0 (op 1 waits for it), back after op 2 for the next
    # iteration's op 0 (which waits for it): 1 + 4 + 2 + 4 = 11 ms a period.
    # Iteration 0 starts with P resident and waits for nothing: 8 ms, below
    # the 9 ms bound, which holds for the steady state (NOTE [ The boundary ])
    ops = [Step((0,), (0,), 1), Step((), (1,), 1), Step((1,), (), 1), Step((), (), 1)]
    t = tiny_trace([B(4, "param"), B(4)], ops)
    dev = _device(t)
    plan = Plan(fingerprint_of(t), (SwapOut(0, 0, 0.0, 1), SwapIn(0, 2, 0, 0.0, True)))
    check(plan, t)
    run = simulate([Job(t, plan)], dev, budget=4 * MiB, iterations=ITERATIONS).jobs[0]
    assert run.iteration_times_s == (0.008,) + (0.011,) * (ITERATIONS - 1)
    best = time_bounds(t, dev, 4 * MiB).best.seconds
    assert run.iteration_times_s[0] < best <= run.iteration_time_s * (1 + REL)


def test_two_lanes_halve_the_round_trip():
    # each direction on its own lane: the single-op bound sees 4 ms a period
    # (compute, 4 ms); the split still 9 ms (its two windows, one copy each)
    t = _state_trace()
    ms = {
        b.name: round(b.seconds * 1e3, 6)
        for b in time_bounds(t, _device(t, lanes=2), 4 * MiB).bounds
    }
    assert ms["single-op"] == 4.0 and ms["split"] == 9.0


# ---- against the brute force -------------------------------------------------------------
@pytest.mark.parametrize("seed", range(16))
def test_bounds_never_exceed_the_brute_force_optimum(seed):
    """Random steps with a parameter updated mid-iteration (its gap across
    the boundary covers the ops after the update and before its first
    access): the brute force's plans swap it out after its last access and
    back for the next iteration, never stalling it (NOTE [ CP-SAT
    semantics ]), or out from the iteration's start and back before its
    first access (`heads`), a subset of all plans."""
    t, budget = random_tiny(seed, n_ops=7, update_early=True)
    d = [round(op.duration_us * 1000) for op in t.ops]
    for mib_per_ms in (4, 0.5, 0.1):
        io_t = [round(int(b.nbytes // MiB) * MS / mib_per_ms) for b in t.buffers]
        dev = _device(t, mib_per_ms=mib_per_ms)
        for extra in (0, MiB):
            bf = brute_force(t, d, io_t, budget + extra, heads=True)
            if bf.iteration_ticks is None:
                continue
            for b in time_bounds(t, dev, budget + extra).bounds:
                assert b.seconds <= bf.iteration_ticks * 1e-9 * (1 + REL), (b, bf)


def test_the_brute_force_swaps_a_parameter_across_the_boundary():
    # P (2 MiB, lane 1 ms per MiB) read and updated by op 0, gone over ops 2-3
    # (A, 4 MiB, at a 4 MiB budget): out after op 0 during op 1 (3 ms), back
    # during op 4 (3 ms) for the next iteration, never stalling it: 9 ms, all
    # compute, and so is every bound (single-op: 4 ms of copies a period)
    ops = [Step((0,), (0,), 1), Step((), (), 3), Step((), (1,), 1), Step((1,), (), 1)]
    t = tiny_trace([B(2, "param"), B(4)], [*ops, Step((), (), 3)])
    d = [round(op.duration_us * 1000) for op in t.ops]
    io_t = [round(int(b.nbytes // MiB) * MS) for b in t.buffers]
    bf = brute_force(t, d, io_t, 4 * MiB)
    assert bf.iteration_ticks == 9 * MS and bf.modes == ("swap",)
    tb = time_bounds(t, _device(t), 4 * MiB)
    assert [round(b.seconds * 1e3, 6) for b in tb.bounds] == [9.0] * 4


def test_the_brute_force_takes_a_state_off_from_the_iteration_start():
    # O (2 MiB) is read and updated by the last op only; at 3 MiB it is gone
    # over ops 1-2 (A, 2 MiB): out from the iteration's start, op 1 waiting
    # for it (op 0 takes 1 ms), back after op 2: 2 + 1 + 1 + 2 + 1 = 7 ms (and
    # the 1-tick margin); the split sees the D2H under op 0 and the H2D alone
    # after op 2: max(ops 0-2, D2H) + H2D + op 3 = 3 + 2 + 1 = 6 ms
    ops = [Step((), (1,)), Step((1,), (2,)), Step((2,), (3,)), Step((3, 0), (0,))]
    t = tiny_trace([B(2, "param"), B(1), B(2), B(1)], ops)
    d = [round(op.duration_us * 1000) for op in t.ops]
    io_t = [round(int(b.nbytes // MiB) * MS) for b in t.buffers]
    bf = brute_force(t, d, io_t, 3 * MiB, heads=True)
    assert bf.iteration_ticks == 7 * MS + 1 and bf.modes == ("swap",)
    ms = {b.name: round(b.seconds * 1e3, 6) for b in time_bounds(t, _device(t), 3 * MiB).bounds}
    assert ms == {"compute": 4.0, "single-op": 4.0, "split": 6.0, "multi-op": 4.0}


# ---- against the planners ----------------------------------------------------------------
SYNTHETIC = {
    "chain": lambda: synthetic.chain(5, act_mib=4, durations=Durations(Grain.US, 50, 400)),
    "residual": lambda: synthetic.residual(2, act_mib=4, durations=Durations(Grain.US, 50, 400)),
    "dag": lambda: synthetic.random_dag(
        30, seed=7, dropout=True, durations=Durations(Grain.US, 20, 400)
    ),
}


def _heuristics() -> list[str]:
    return [n for n in registry.names() if n != "cpsat" and not registry.get(n).searches]


@pytest.mark.parametrize("family", sorted(SYNTHETIC))
@pytest.mark.parametrize(("lanes", "mib_per_ms"), [(1, 0.5), (2, 0.25)])
def test_bounds_hold_for_the_steady_state_of_every_planners_plan(family, lanes, mib_per_ms):
    """The simulator's steady state (the mean of iterations 1..5) of every
    heuristic's plan, under every OOM policy (TENSILE swaps updated
    parameters across the boundary), on small steps with parameters and
    optimizer state, budgets from near the release-only peak down to near
    the peak floor."""
    t = SYNTHETIC[family]()
    hw = tiny_hw(lanes_bw_mib_per_ms=mib_per_ms, memory_mib=4096)
    dev = DeviceModel(hw, Measured(), lanes=lanes)
    peak = int(t.memory_curve("liveness").max())
    floor = peak_lower_bound(t, workspace=False).nbytes
    ran = 0
    for frac in (0.7, 0.3, 0.05):
        budget = floor + int(frac * (peak - floor))
        worst = max(b.seconds for b in time_bounds(t, dev, budget).bounds)
        for name in _heuristics():
            r = registry.get(name)([t], dev, budget_bytes=budget)
            if not r.plans:
                continue
            for policy in [p.value for p in OomPolicy]:
                run = simulate(
                    [Job(t, r.plans[0])], dev, budget=budget, oom=policy, iterations=ITERATIONS
                ).jobs[0]
                if run.oom:
                    continue
                ran += 1
                steady = run.iteration_time_s
                assert steady >= worst * (1 - REL), (name, policy, frac, run.iteration_times_s)
    assert ran >= 12


def test_bounds_hold_for_random_plans_across_the_boundary():
    """Random plans the checker accepts (parameters swapped out after their
    last access and back for the next iteration's first, among other swaps
    and recomputes) on random steps with a parameter updated mid-iteration:
    the steady state of every run that finishes is at or above every bound."""
    ran = crossed = 0
    for seed in range(12):
        t, budget = random_tiny(seed, n_ops=8, update_early=True)
        rng = np.random.default_rng(seed)
        for lanes, mib_per_ms in ((1, 0.1), (2, 0.25)):
            dev = _device(t, mib_per_ms=mib_per_ms, lanes=lanes)
            worst = max(b.seconds for b in time_bounds(t, dev, budget).bounds)
            for _ in range(6):
                plan = _random_plan(t, rng)
                try:
                    check(plan, t)
                except PlanError:
                    continue
                for policy in ("fail", "dtr"):
                    run = simulate(
                        [Job(t, plan)], dev, budget=budget, oom=policy, iterations=ITERATIONS
                    ).jobs[0]
                    if run.oom:
                        continue
                    ran += 1
                    crossed += any(getattr(e, "next_iteration", False) for e in plan.events)
                    assert run.iteration_time_s >= worst * (1 - REL), (plan, policy)
    assert ran >= 40 and crossed >= 10

"""Recomputations charged their dead sources (NOTE [ Dead sources ] in
planners/analysis/sources.py): the charges by hand, a case where the split
and multi-op bounds with them are the optimum, and the bounds with them
never below those without. Validity against the brute force, heuristic plans
under every policy, random plans and Checkmate's chain is in
test_window_bound.py and test_whole_cover.py, which run `time_bounds`."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel, TimeUnit
from memplan.hwmodels.latency import Fixed
from memplan.planners.analysis.bounds import peak_lower_bound
from memplan.planners.analysis.gaps import gap_table, recompute_costs
from memplan.planners.analysis.sources import DeadSources
from memplan.planners.analysis.window_bound import multi_op_bound, split_bound, time_bounds
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Plan, Recompute, Release, fingerprint_of
from memplan.sim import Job, simulate
from memplan.traces import synthetic

from tests.planners.bruteforce import B, MiB, Step, durations_s, random_tiny, tiny_hw, tiny_trace


def _ms(x: np.ndarray) -> list[float]:
    return [round(v * 1e3, 9) if math.isfinite(v) else v for v in x.tolist()]


def test_charges_by_hand():
    """op 0 makes A (5 ms); ops 1 and 2 read A and make B and C (1 ms each);
    op 3 reads B and C and makes X (1 ms); op 4 reads nothing; op 5 reads X.
    A dies after op 2, B and C after op 3.

    - at op 2 nothing is dead yet: each costs its maker alone;
    - at op 3 A is dead: B and C cost their maker and op 0, 6 ms each;
    - at op 4 B and C are dead too. B's making costs ops 0 and 1 (6 ms), C's
      ops 0 and 2 (6 ms); one writer each for B and C is 2 ms. X costs
      1 + max(2, 6) = 7 ms: at most the 8 ms of the only chain (ops 0-3,
      op 0 once), where summing the two makings would claim 13."""
    ops = [
        Step((), (0,), 5),
        Step((0,), (1,)),
        Step((0,), (2,)),
        Step((1, 2), (3,)),
        Step((), ()),
        Step((3,), ()),
    ]
    t = tiny_trace([B(1), B(1), B(1), B(1)], ops)
    d = np.array(durations_s(t))
    ds = DeadSources(t, d)
    assert _ms(ds.at(2)) == _ms(recompute_costs(t, d)) == [5.0, 1.0, 1.0, 1.0]
    assert _ms(ds.at(3)) == [5.0, 6.0, 6.0, 1.0]
    assert _ms(ds.at(4)) == [5.0, 6.0, 6.0, 7.0]


def test_a_source_no_op_can_make_again_stops_the_recompute():
    # op 0 makes Z and writes an (empty) parameter: Z may not be recomputed;
    # op 1 reads Z, which dies after it, and makes X: at op 2 X can no longer
    # be recomputed either
    ops = [Step((), (0, 2)), Step((0,), (1,)), Step((), ()), Step((1,), ())]
    t = tiny_trace([B(1), B(1), B(0, "param")], ops)
    ds = DeadSources(t, np.array(durations_s(t)))
    assert ds.at(1)[:2].tolist() == [math.inf, pytest.approx(1e-3)]
    assert ds.at(2)[:2].tolist() == [math.inf, math.inf]


DEAD = [
    Step((), (0,), 2),  # Z (4 MiB), a temporary read by op 1 only
    Step((0,), (1,)),  # X (4 MiB), read again by op 5
    Step((), (2,)),  # Y (8 MiB)
    Step((2,), ()),
    Step((), (), 20),
    Step((1,), ()),
]


def test_bounds_with_dead_sources_are_the_optimum():
    """Under 8 MiB X is off the device while ops 2 and 3 run; the lane moves
    0.1 MiB/ms (a round trip of X takes 80 ms), so X is recomputed. Z died
    after op 1: the chain re-runs op 0 (2 ms) and op 1 (1 ms). Compute is
    26 ms: the split bound that charges op 1 alone says 27 ms, the one that
    charges the dead source 29 ms, and the plan that releases X after op 1 and
    recomputes it with ops 0 and 1 before op 5 runs in 29 ms."""
    t = tiny_trace([B(4), B(4), B(8)], DEAD)
    dev = DeviceModel(tiny_hw(lanes_bw_mib_per_ms=0.1), Fixed(durations_s(t)))
    budget = 8 * MiB
    g, d = gap_table(t, dev), dev.op_durations(t, TimeUnit.S)
    need = (t.memory_curve("liveness") - budget).astype(np.float64)
    ds = DeadSources(t, d)
    assert split_bound(g, d, need).seconds == pytest.approx(0.027)
    assert split_bound(g, d, need, sources=ds).seconds == pytest.approx(0.029)
    # the multi-op bound mixes both ways: T = 26 + c (1 - y) = 80 y ms, a
    # share y of X by the lane, c = 1 ms for op 1 alone or 3 with op 0
    # (to the golden search's bracket on b)
    assert multi_op_bound(g, d, need, 1).seconds == pytest.approx(27 / 81 * 0.08, rel=1e-4)
    with_sources = multi_op_bound(g, d, need, 1, sources=ds).seconds
    assert with_sources == pytest.approx(29 / 83 * 0.08, rel=1e-4)
    assert time_bounds(t, dev, budget).best.seconds == pytest.approx(0.029)
    plan = Plan(fingerprint_of(t), (Release(1, 1), Recompute(1, 5, (0, 1))))
    check(plan, t)
    for policy in ("fail", "dtr"):
        run = simulate([Job(t, plan)], dev, budget=budget, oom=policy).jobs[0]
        assert run.iteration_times_s == pytest.approx((0.029,) * 3)


@pytest.mark.parametrize("seed", range(16))
def test_dead_sources_only_raise_the_bounds(seed):
    """Random tiny steps and a Checkmate chain, a slow lane: the split and
    multi-op bounds with dead sources are at or above those without."""
    t, budget = random_tiny(seed, n_ops=9, n_buffers=7)
    if seed == 0:
        t, budget = synthetic.checkmate_chain(6, unit_bytes=MiB, unit_us=1000.0), 4 * MiB
    dev = DeviceModel(tiny_hw(lanes_bw_mib_per_ms=0.25), Fixed(durations_s(t)))
    g, d = gap_table(t, dev), dev.op_durations(t, TimeUnit.S)
    need = (t.memory_curve("liveness") - budget).astype(np.float64)
    if not (need > 0).any():
        return
    ds = DeadSources(t, d)
    for bound in (split_bound, lambda *a, **k: multi_op_bound(*a, 1, **k)):
        assert bound(g, d, need, sources=ds).seconds >= bound(g, d, need).seconds * (1 - 1e-9)


# ---- validity: plans whose chains make dead sources again --------------------------------
def _chain(t, b: int, q: int) -> tuple[int, ...]:
    """The ops that make `b` again before op `q`: its maker, and recursively
    the makers of the maker's inputs that the framework freed before q."""
    ops, todo = set(), [b]
    while todo:
        x = todo.pop()
        maker = int(t.created_at[x])
        if maker < 0 or maker in ops:
            continue
        ops.add(maker)
        todo += [
            int(y)
            for y in t.op_reads(maker).tolist()
            if not t.persistent[y] and t.freed_after[y] < q
        ]
    return tuple(sorted(ops))


def _chain_choices(t) -> list[tuple[Release, Recompute]]:
    """Every gap the checker lets a plan release and recompute alone by the
    chain that makes its dead sources again."""
    out = []
    for b in range(t.n_buffers):
        if t.persistent[b] or t.created_at[b] < 0:
            continue
        acc = t.accesses_of(b).tolist()
        for p, q in zip(acc, acc[1:]):
            if q - p < 2:
                continue
            ops = _chain(t, b, q)
            pair = (Release(b, p), Recompute(b, q, ops, any(t.ops[k].rng for k in ops)))
            try:
                check(Plan(fingerprint_of(t), pair), t)
            except PlanError:
                continue
            out.append(pair)
    return out


def _chain_plan(t, choices, rng: np.random.Generator) -> Plan:
    """A random subset of `choices` in which no chain reads a buffer another
    one releases."""
    released: set[int] = set()
    read: set[int] = set()
    events = []
    for i in rng.permutation(len(choices)).tolist():
        rel, rec = choices[i]
        reads = {int(y) for k in rec.ops for y in t.op_reads(k).tolist()}
        if rel.buffer in read or reads & released or rng.random() < 0.3:
            continue
        released.add(rel.buffer)
        read |= reads
        events += [rel, rec]
    return Plan(fingerprint_of(t), tuple(events))


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_bounds_hold_for_chains_that_make_dead_sources_again(seed):
    """Random steps (random_dag with dropout, ops of 20-400 us, a lane of
    0.5 MiB/ms: recomputing beats copying), budgets from near the
    release-only peak to near the floor: the steady iteration of every plan
    the checker accepts that recomputes through dead sources, under every OOM
    policy, is at or above every bound; and the bounds do charge dead
    sources somewhere (they rise above the bounds that do not)."""
    from memplan.sim.state import OomPolicy
    from memplan.traces.synthetic import Durations, Grain

    t = synthetic.random_dag(60, seed=seed, dropout=True, durations=Durations(Grain.US, 20, 400))
    dev = DeviceModel(tiny_hw(lanes_bw_mib_per_ms=0.5, memory_mib=4096), Fixed(durations_s(t)))
    g, d = gap_table(t, dev), dev.op_durations(t, TimeUnit.S)
    ds = DeadSources(t, d)
    peak = int(t.memory_curve("liveness").max())
    floor = peak_lower_bound(t, workspace=False).nbytes
    rng = np.random.default_rng(seed)
    choices = _chain_choices(t)
    assert any(len(rec.ops) > 1 for _, rec in choices)  # some chains make dead sources
    ran = raised = 0
    for frac in (0.7, 0.4, 0.15):
        budget = floor + int(frac * (peak - floor))
        need = (t.memory_curve("liveness") - budget).astype(np.float64)
        worst = time_bounds(t, dev, budget).best.seconds
        raised += split_bound(g, d, need, sources=ds).seconds > split_bound(g, d, need).seconds
        for _ in range(6):
            plan = _chain_plan(t, choices, rng)
            try:
                check(plan, t)
            except PlanError:
                continue
            for policy in OomPolicy:
                run = simulate([Job(t, plan)], dev, budget=budget, oom=policy.value).jobs[0]
                if not run.oom:
                    ran += 1
                    # the steady state: bounds are per period (NOTE [ The boundary ])
                    assert run.iteration_time_s >= worst * (1 - 1e-9), (policy, frac)
    assert ran >= 10 and raised >= 1


def _temporaries(seed: int):
    """(trace, budget): 2-3 layers, each a temporary T (1-3 MiB, made in 1-4
    ms, sometimes from the previous layer's output) that the next op (1-2
    ms) turns into a saved output X (1-3 MiB), dead before X's backward
    read; then a spike Y (2-5 MiB) and the backward reads in reverse; a
    budget 1-4 MiB under the release-only peak."""
    rng = np.random.default_rng(seed)
    bufs: list[B] = []
    ops: list[Step] = []
    xs: list[int] = []
    for _ in range(int(rng.integers(2, 4))):
        tmp, x = len(bufs), len(bufs) + 1
        bufs += [B(int(rng.integers(1, 4))), B(int(rng.integers(1, 4)))]
        src = (xs[-1],) if xs and rng.random() < 0.5 else ()
        ops += [
            Step(src, (tmp,), int(rng.integers(1, 5))),
            Step((tmp,), (x,), int(rng.integers(1, 3))),
        ]
        xs.append(x)
    y = len(bufs)
    bufs.append(B(int(rng.integers(2, 6))))
    ops += [Step((), (y,)), Step((y,), ())]
    ops += [Step((x,), (), int(rng.integers(1, 3))) for x in reversed(xs)]
    t = tiny_trace(bufs, ops)
    floor = peak_lower_bound(t, workspace=False).nbytes
    peak = int(t.memory_curve("liveness").max())
    return t, max(floor, peak - int(rng.integers(1, 5)) * MiB)


def test_bounds_against_every_plan_of_recompute_chains():
    """Steps whose saved outputs are made from temporaries that die (above),
    a lane of 0.01 MiB/ms (only recomputation pays): the best of every plan
    that recomputes any subset of the gaps by the chains that make their
    dead sources again (simulated, fitting alone) is at or above the best
    bound; the bound charges the dead temporaries (above the split bound
    without them in every case) and is within 2% of that best plan in most."""
    compared = close = 0
    for seed in range(30):
        t, budget = _temporaries(seed)
        dev = DeviceModel(tiny_hw(lanes_bw_mib_per_ms=0.01), Fixed(durations_s(t)))
        choices = _chain_choices(t)
        best = math.inf
        for take in itertools.product((False, True), repeat=len(choices)):
            events = tuple(ev for keep, pair in zip(take, choices) if keep for ev in pair)
            plan = Plan(fingerprint_of(t), events)
            try:
                check(plan, t)
            except PlanError:
                continue
            run = simulate([Job(t, plan)], dev, budget=budget).jobs[0]
            if not run.oom:
                best = min(best, *run.iteration_times_s)
        if math.isinf(best):
            continue
        compared += 1
        bound = time_bounds(t, dev, budget).best.seconds
        assert bound <= best * (1 + 1e-9)
        g, d = gap_table(t, dev), dev.op_durations(t, TimeUnit.S)
        need = (t.memory_curve("liveness") - budget).astype(np.float64)
        assert bound > split_bound(g, d, need).seconds * (1 + 1e-6)
        close += bound >= best * 0.98
    assert compared >= 20 and close >= compared // 2

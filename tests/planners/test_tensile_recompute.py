"""TENSILE's recompute phase (§IV-D with Capuchin's MSPS update) on tiny
hand traces whose picks are worked out by hand.

The lane moves 1 KiB per ms, so no swap hides and only recompute helps; ops
take whole ms and buffers are whole MiB. MSPS is quoted in MiB per ms
(bytes/s = MiB/ms x 2^20 x 1000)."""

from __future__ import annotations

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Fixed
from memplan.planners.analysis import msps
from memplan.planners.core.check import check
from memplan.planners.core.plan import Reason, Recompute, Release, Status
from memplan.planners.heuristics.tensile.planner import TensileOptions, tensile
from memplan.sim import Job, simulate

from tests.planners.bruteforce import B, MiB, Step, durations_s, tiny_hw, tiny_trace

SLOW = tiny_hw(lanes_bw_mib_per_ms=1 / 1024)


def mib_per_ms(x: float) -> float:
    return x * MiB * 1000


def plan(trace, budget_mib, **opts):
    res = tensile(
        [trace],
        DeviceModel(SLOW, Fixed(durations_s(trace))),
        budget_bytes=budget_mib * MiB,
        options=TensileOptions(**opts),
    )
    for p in res.plans:
        check(p, trace)
    return res


def simulated(trace, res, budget_mib):
    return simulate(
        [Job(trace, res.plans[0])],
        DeviceModel(SLOW, Fixed(durations_s(trace))),
        iterations=3,
        budget=budget_mib * MiB,
        oom="fail",
    )


def picks(res):
    return [(b, before, pytest.approx(m)) for _j, b, before, m in res.stats["recompute_picks"]]


def recomputes(res):
    return [ev for ev in res.plans[0].events if isinstance(ev, Release | Recompute)]


# ---- MSPS and the pick order -------------------------------------------------------------
def three_independent():
    """x (input, 1 MiB, read to the end) makes a (4 MiB, 1 ms), c (2 MiB,
    4 ms) and e (3 MiB, 1 ms); op 3 makes a 8 MiB buffer that op 4 reads
    (the peak, 19 MiB: x a c e + 8 + 1); backward reads a, c, e again.
    Resident MiB per op: 5 7 10 18 19 11 7 5."""
    bufs = [B(1, "input"), B(4), B(2), B(3), B(8), B(1), B(1), B(1), B(1)]
    ops = [
        Step((0,), (1,), 1),
        Step((0,), (2,), 4),
        Step((0,), (3,), 1),
        Step((0,), (4,), 1),
        Step((4,), (5,), 1),
        Step((1, 0), (6,), 1),
        Step((2,), (7,), 1),
        Step((3, 0), (8,), 1),
    ]
    return tiny_trace(bufs, ops)


def test_msps_values_and_pick_order():
    """Candidates at op 4: a 4 MiB / 1 ms = 4, e 3 / 1 = 3, c 2 / 4 = 0.5
    MiB/ms, each re-run by its one op from x. 12 MiB needs 7 saved: a then
    e (19 -> 15 -> 12); c is left. 10 MiB takes c too (op 4 keeps x, the
    8 MiB it reads and its output)."""
    t = three_independent()
    assert t.peak() == (19 * MiB, 4)
    res = plan(t, 12)
    assert res.feasible and res.stats["peak_bytes"] == 12 * MiB
    assert picks(res) == [(1, 5, mib_per_ms(4.0)), (3, 7, mib_per_ms(3.0))]
    assert recomputes(res) == [
        Release(1, 0),
        Release(3, 2),
        Recompute(1, 5, (0,)),
        Recompute(3, 7, (2,)),
    ]
    assert res.stats["recompute_time_s"] == pytest.approx(2e-3)
    tight = plan(t, 10)
    assert [b for b, _op, _m in picks(tight)] == [1, 3, 2]
    assert tight.feasible and tight.stats["peak_bytes"] == 10 * MiB
    for r, budget in ((res, 12), (tight, 10)):
        sim = simulated(t, r, budget)
        assert not sim.oom and sim.peak_bytes <= budget * MiB


# ---- Capuchin's update (Algorithm 2) -----------------------------------------------------
def lineage(op0_ms: int):
    """Capuchin's lineage example, T2 -> T3 -> T4 with T3 dead after its
    last use: x (input, 1 MiB, read to the end) makes T2 (4 MiB, op 0 of
    `op0_ms`), op 1 T3 (1 MiB, 1 ms), op 2 T4 (4 MiB, 1 ms); op 3 makes Y
    (3 MiB, 2 ms) from x; op 4 a 8 MiB buffer (the peak, 20 MiB). Backward:
    op 5 reads T4, op 6 Y, op 7 T2. Resident MiB: 5 6 10 12 20 13 9 6.
    Gaps around op 4: T2 (1, 7), T4 (2, 5), Y (3, 6)."""
    bufs = [B(1, "input"), B(4), B(1), B(4), B(3), B(8), B(1), B(1), B(1)]
    ops = [
        Step((0,), (1,), op0_ms),
        Step((1,), (2,), 1),
        Step((2,), (3,), 1),
        Step((0,), (4,), 2),
        Step((0,), (5,), 1),
        Step((3,), (6,), 1),
        Step((4, 0), (7,), 1),
        Step((1, 0), (8,), 1),
    ]
    return tiny_trace(bufs, ops)


def test_choosing_a_source_lengthens_the_chains_that_read_it():
    """NOTE [ MSPS update in TENSILE ], lines 17-21 of Algorithm 2. At first
    T2 = 4/1 = 4, T4 (ops 1, 2 from T2, T3 being dead) = 4/2 = 2, Y = 3/2 =
    1.5 MiB/ms. T2 goes first (20 -> 16 MiB at op 4); T4's chain must now
    make T2 too: ops 0, 1, 2, 4/3 MiB/ms, below Y, so Y is next (16 -> 13),
    not T4 as the first values said. At 11 MiB T4 follows with that chain:
    a chain whose source was itself released for recompute. Its
    temporaries T2 and T3 (5 MiB) are counted at op 5: 6 + 5 = 11 MiB."""
    t = lineage(op0_ms=1)
    assert t.peak() == (20 * MiB, 4)
    res = plan(t, 13)
    assert res.feasible and res.stats["peak_bytes"] == 13 * MiB
    assert picks(res) == [(1, 7, mib_per_ms(4.0)), (4, 6, mib_per_ms(1.5))]

    chained = plan(t, 11)
    assert chained.feasible and chained.stats["peak_bytes"] == 11 * MiB
    assert picks(chained) == [
        (1, 7, mib_per_ms(4.0)),
        (4, 6, mib_per_ms(1.5)),
        (3, 5, mib_per_ms(4 / 3)),
    ]
    assert recomputes(chained) == [
        Release(1, 1),
        Release(3, 2),
        Release(4, 3),
        Recompute(3, 5, (0, 1, 2)),
        Recompute(4, 6, (3,)),
        Recompute(1, 7, (0,)),
    ]
    assert chained.stats["recompute_time_s"] == pytest.approx(6e-3)  # 3 + 2 + 1 ms
    sim = simulated(t, chained, 11)
    assert not sim.oom and sim.peak_bytes <= 11 * MiB
    # each iteration re-runs ops 0, 1, 2 before op 5, op 3 before 6, op 0 before 7
    assert sim.jobs[0].recompute_s == pytest.approx(3 * 6e-3)


def test_choosing_a_source_after_its_reader_extends_the_chosen_chain():
    """Lines 6-12 and 31-33 of Algorithm 2. With op 0 taking 3 ms, T2 is
    worth 4/3 MiB/ms and T4 (ops 1, 2) 4/2 = 2: T4 goes first, its chain
    reading T2. T2 now carries ext_time: choosing it makes T4's chain re-run
    op 0 as well, so it costs 3 + 3 ms (4/6 MiB/ms), below Y (1.5), which is
    next. At 11 MiB T2 follows, and T4's chosen chain becomes ops 0, 1, 2."""
    t = lineage(op0_ms=3)
    res = plan(t, 11)
    assert res.feasible and res.stats["peak_bytes"] == 11 * MiB
    assert picks(res) == [
        (3, 5, mib_per_ms(2.0)),
        (4, 6, mib_per_ms(1.5)),
        (1, 7, mib_per_ms(4 / 6)),
    ]
    assert Recompute(3, 5, (0, 1, 2)) in recomputes(res)
    assert res.stats["recompute_time_s"] == pytest.approx((5 + 2 + 3) * 1e-3)
    sim = simulated(t, res, 11)
    assert not sim.oom and sim.peak_bytes <= 11 * MiB


def test_a_longer_chain_than_the_cap_is_not_taken():
    """With chains of at most 2 ops, T4 cannot follow T2 (its chain would be
    ops 0, 1, 2): at 11 MiB the plan stops short at 13."""
    res = plan(lineage(op0_ms=1), 11, max_recompute_ops=2)
    assert [b for _j, b, _op, _m in res.stats["recompute_picks"]] == [1, 4]
    assert res.stats["peak_bytes"] == 13 * MiB and not res.feasible


# ---- in-place writes -------------------------------------------------------------------------
def in_place():
    """x (input, 1 MiB) -> op 0 a (4 MiB, 1 ms) -> op 1 relu_ on a (reads and
    writes a, 1 ms); op 2 a 8 MiB buffer from x (the peak, 13 MiB); op 3
    reads a and x. Resident MiB: 5 5 13 5."""
    bufs = [B(1, "input"), B(4), B(8), B(1)]
    ops = [Step((0,), (1,), 1), Step((1,), (1,), 1), Step((0,), (2,), 1), Step((1, 0), (3,), 1)]
    return tiny_trace(bufs, ops)


def test_a_buffer_written_in_place_is_remade_by_all_its_writes():
    """planners.analysis.msps NOTE [ In-place chains ]: a's value as op 3
    reads it is op 0's output after op 1's in-place update."""
    t = in_place()
    assert msps.producer(t, 1) == -1  # two writes: Capuchin's rule rejects it
    assert msps.makers(t, 1, 3) == (0, 1)
    assert msps.makers(t, 1, 1) == (0,)  # as op 1 reads it: before the update
    assert msps.chain(t, 1, 3, lambda s: s == 0) is None
    assert msps.chain(t, 1, 3, lambda s: s == 0, max_ops=2, in_place=True) == ((0, 1), (0,))
    res = plan(t, 9)
    assert res.feasible and res.stats["peak_bytes"] == 9 * MiB
    assert recomputes(res) == [Release(1, 1), Recompute(1, 3, (0, 1))]
    sim = simulated(t, res, 9)
    assert not sim.oom and sim.peak_bytes <= 9 * MiB
    off = plan(t, 9, recompute_in_place=False)
    assert not off.feasible and off.stats["peak_bytes"] == 13 * MiB


def test_a_dropout_mask_is_remade_with_its_rng_state():
    """A mask made by op 0, filled by op 1 (RNG, in place) and scaled by
    op 2 (in place): its chain re-runs all three and restores the RNG."""
    bufs = [B(1, "input"), B(4), B(8), B(1)]
    ops = [
        Step((0,), (1,), 1),
        Step((1,), (1,), 1, rng=True),
        Step((1,), (1,), 1),
        Step((0,), (2,), 1),
        Step((1, 0), (3,), 1),
    ]
    t = tiny_trace(bufs, ops)
    res = plan(t, 9)
    assert res.feasible
    assert recomputes(res) == [Release(1, 2), Recompute(1, 4, (0, 1, 2), restore_rng=True)]
    assert not simulated(t, res, 9).oom


# ---- short of the budget ---------------------------------------------------------------------
def test_short_of_the_budget_the_plan_is_returned_for_the_safety_net():
    """NOTE [ Short of the budget ]: below what swap and recompute reach,
    TENSILE returns its plan, stopped with no move left, and says what the
    runtime safety net must make up. At 3 MiB all three go and op 4 still
    holds 10 MiB: 7 MiB short."""
    t = three_independent()
    res = plan(t, 3)
    assert (res.status, res.reason) == (Status.STOPPED, Reason.NO_MOVE_LEFT)
    assert res.stats["peak_bytes"] == 10 * MiB
    assert len(res.stats["recompute_picks"]) == 3 and res.plans
    assert "runtime safety net" in res.detail and f"{7 * MiB} B" in res.detail
    assert "infeasible" not in res.explain()
    assert res.stats["stop"] == "no swap, no recompute left"


def test_options_are_recorded():
    res = plan(three_independent(), 12, max_recompute_ops=4, recompute_in_place=False)
    assert res.options["max_recompute_ops"] == 4
    assert res.options["recompute_in_place"] is False
    assert TensileOptions().max_recompute_ops == 32
    with pytest.raises(ValueError, match="max_recompute_ops"):
        TensileOptions(max_recompute_ops=0)


# ---- the shipped traces ----------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize(("name", "fraction"), [("resnet50", 0.6), ("gpt2", 0.5)])
def test_shipped_traces_fit_on_their_own(name, fraction):
    """rtx-a6000, roofline, one lane: before the recompute chains TENSILE ran
    out of memory at these budgets (its recomputes were one op long and
    never placed while a copy ran); now its plan fits without the runtime
    net. gpt2's dropout masks come back by chains of 3-4 ops (made, filled
    in place, scaled in place) that restore the RNG state."""
    from memplan.hwmodels.latency import Roofline
    from memplan.hwmodels.profile import load_hardware
    from memplan.traces import io

    t = io.load(f"zoo:{name}")
    dev = DeviceModel(load_hardware("rtx-a6000"), Roofline())
    vanilla = simulate([Job(t, None)], dev, iterations=1)
    budget = int(vanilla.peak_bytes * fraction)
    res = tensile([t], dev, budget_bytes=budget)
    assert res.feasible and res.stats["peak_bytes"] <= budget
    check(res.plans[0], t)
    sim = simulate([Job(t, res.plans[0])], dev, iterations=3, budget=budget, oom="fail")
    assert not sim.oom and sim.peak_bytes <= res.stats["peak_bytes"]
    if name == "gpt2":
        chains = [ev for ev in recomputes(res) if isinstance(ev, Recompute) and len(ev.ops) > 1]
        assert any(ev.restore_rng for ev in chains)


@pytest.mark.slow
def test_in_place_chains_replay_bit_identically():
    """NOTE [ In-place chains ] with real tensors: tiny_transformer's dropout
    masks (empty_like, bernoulli_ in place, div_ in place), released after
    their next-to-last access and remade by their chain before the last,
    give the plan-free run's parameters and losses bit for bit."""
    from memplan.planners.analysis import access_table
    from memplan.planners.core.plan import Plan, fingerprint_of
    from memplan.planners.heuristics.vanilla import release_only_plan
    from memplan.traces.capture import CaptureOptions, capture
    from memplan.traces.zoo import ZOO
    from memplan.validate import compare_results, replay

    t = capture(ZOO["tiny_transformer"], 4, CaptureOptions(device="cpu"), model_name="tt")
    table, (start, end) = access_table(t), t.lifetimes("liveness")
    events = list(release_only_plan(t).events)
    for b in range(t.n_buffers):
        acc = table.accesses(b).tolist()
        if len(acc) < 3 or len(msps.makers(t, b, acc[-1], table)) < 2:
            continue
        prev, nxt = acc[-2], acc[-1]

        def alive(s, b=b, x=nxt):
            return s != b and start[s] <= x <= end[s]

        found = msps.chain(t, b, nxt, alive, max_ops=8, in_place=True)
        if found is not None and nxt - prev > 1:
            rng = any(t.ops[k].rng for k in found[0])
            events += [Release(b, prev), Recompute(b, nxt, found[0], rng)]
    remade = [ev for ev in events if isinstance(ev, Recompute)]
    assert len(remade) >= 3 and any(ev.restore_rng for ev in remade)
    plan = Plan(fingerprint_of(t), tuple(events), "tt")
    check(plan, t)
    compare_results(replay(t, iterations=2), replay(t, iterations=2, plan=plan))

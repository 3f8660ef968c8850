"""TENSILE on hand traces with known answers, then properties over the
synthetic graphs (every plan passes `check`, simulates without OOM and
never raises the peak above vanilla)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Measured
from memplan.planners import registry
from memplan.planners.analysis import msps
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Reason, Recompute, Release, Status, SwapIn, SwapOut
from memplan.planners.heuristics.tensile.planner import TensileOptions, tensile
from memplan.sim.job import Job
from memplan.sim.log import LogKind
from memplan.sim.metrics import savings
from memplan.sim.simulate import simulate
from memplan.traces import io
from memplan.traces import synthetic as syn

from tests.planners.test_analysis import B, MiB, O, cross_iteration, gap_chain, gpu, make

HW = gpu()


def swaps(plan):
    """The plan's copies, delays rounded to 1 ns."""
    out = []
    for ev in plan.events:
        if isinstance(ev, SwapOut):
            out.append(SwapOut(ev.buffer, ev.after_op, round(ev.delay_us, 3)))
        elif isinstance(ev, SwapIn):
            d = round(ev.delay_us, 3)
            out.append(SwapIn(ev.buffer, ev.after_op, ev.before_op, d, ev.next_iteration))
    return out


def run(traces, plans, lat, hw=HW, **kw):
    return simulate(
        [Job(t, p) for t, p in zip(traces, plans, strict=True)], DeviceModel(hw, lat), **kw
    )


# ---- hand cases -------------------------------------------------------------------------
def test_one_hidden_swap_of_a_chain():
    """`gap_chain`: b1 swapped out after op 1 ([2, 4) ms), in [8, 10) ms
    (1 ns before op 5 is ready): the peak drops from 7 to 5 MiB, no stall."""
    t, lat = gap_chain()
    res = tensile([t], DeviceModel(HW, lat))
    assert res.feasible and res.planner == "tensile"
    plan = res.plans[0]
    check(plan, t)
    assert swaps(plan) == [SwapOut(1, 1, 0.0), SwapIn(1, 3, 5, 999.999)]
    # op 3 [5, 7) is the first op the hole (copy end 4 ms .. swap-in 8 ms)
    # holds: the memory the plan counts on there is the swap-out's deadline
    assert plan.events[0].before_op == 3
    assert res.stats["peak_bytes"] == 5 * MiB
    assert res.stats["vanilla_peak_bytes"] == 7 * MiB
    assert res.stats["stop"] == "no swap"

    vanilla, planned = simulate([t], DeviceModel(HW, lat)), run([t], [plan], lat)
    assert vanilla.peak_bytes == 7 * MiB
    assert planned.peak_bytes == 5 * MiB
    m = savings(vanilla, planned).total
    assert m.msr == pytest.approx(2 / 7)
    assert m.eor == 1.0  # the swap is hidden: not a nanosecond of stall
    assert planned.jobs[0].stall_s == 0.0
    copies = [
        (e.iteration, e.kind, round(e.t_us / 1000, 3))
        for e in planned.log
        if e.kind in (LogKind.SWAP_OUT_START, LogKind.SWAP_IN_END) and e.iteration == 0
    ]
    assert copies == [(0, LogKind.SWAP_OUT_START, 2.0), (0, LogKind.SWAP_IN_END, 10.0)]


def test_a_budget_stops_as_soon_as_the_peak_fits():
    t, lat = gap_chain()
    roomy = tensile([t], DeviceModel(HW, lat), budget_bytes=7 * MiB)
    assert roomy.feasible and roomy.stats["stop"] == "fits" and not swaps(roomy.plans[0])
    tight = tensile([t], DeviceModel(HW, lat), budget_bytes=5 * MiB)
    assert tight.feasible and len(swaps(tight.plans[0])) == 2
    # 4 MiB: the swap is not enough and nothing at the new peak can be recomputed
    short = tensile([t], DeviceModel(HW, lat), budget_bytes=4 * MiB)
    assert not short.feasible and short.stats["peak_bytes"] == 5 * MiB
    for r in (roomy, tight, short):
        check(r.plans[0], t)


def test_cross_iteration_parameter_swap():
    """`cross_iteration`: the weight, updated at op 3, leaves during the
    optimizer phase and comes back for op 0 of the next iteration."""
    t, lat = cross_iteration()
    res = tensile([t], DeviceModel(HW, lat))
    plan = res.plans[0]
    check(plan, t)
    assert swaps(plan) == [
        SwapOut(1, 3, 0.0),
        SwapIn(1, 5, 0, 999.999, next_iteration=True),
    ]
    assert res.stats["peak_bytes"] == 8 * MiB

    vanilla, planned = simulate([t], DeviceModel(HW, lat)), run([t], [plan], lat)
    assert (vanilla.peak_bytes, planned.peak_bytes) == (11 * MiB, 8 * MiB)
    m = savings(vanilla, planned).total
    assert m.msr == pytest.approx(3 / 11) and m.eor == 1.0
    ins = [e for e in planned.log if e.kind is LogKind.SWAP_IN_END]
    # iterations 0 and 1 bring w back for the next one; the last has no next
    assert [(e.iteration, round(e.t_us / 1000, 3)) for e in ins] == [(0, 15.0), (1, 30.0)]


def test_two_jobs_share_the_lane():
    """Two `gap_chain`s interleave op by op on the compute queue: A's ops 0-5
    start at 0, 2, 4, 10, 14, 20 ms, B's at 1, 3, 7, 12, 17, 21 ms. A's
    swap-out holds the lane [3, 5) ms, so B's, due when its op 1 ends at
    4 ms, waits until 5 ms (a 1 ms delay)."""
    t, lat = gap_chain()
    res = tensile([t, t], DeviceModel(HW, lat))
    a, b = res.plans
    for p in (a, b):
        check(p, t)
    assert swaps(a) == [SwapOut(1, 1, 0.0), SwapIn(1, 3, 5, 2999.999)]
    assert swaps(b) == [SwapOut(1, 1, 1000.0), SwapIn(1, 3, 5, 3999.999)]
    assert res.stats["job_peak_bytes"] == [5 * MiB, 5 * MiB]

    vanilla, planned = simulate([t, t], DeviceModel(HW, lat)), run([t, t], [a, b], lat)
    assert [j.peak_bytes for j in planned.jobs] == [5 * MiB, 5 * MiB]
    assert planned.peak_bytes <= res.stats["peak_bytes"] < vanilla.peak_bytes
    assert savings(vanilla, planned).total.eor == 1.0
    starts = [
        (e.job, e.t_us / 1000)
        for e in planned.log
        if e.kind is LogKind.SWAP_OUT_START and e.iteration == 0
    ]
    assert starts == [(0, 3.0), (1, 5.0)]

    # the authors' simplification: each job plans on a lane of its own, so
    # B books its copy on top of A's
    own = tensile([t, t], DeviceModel(HW, lat), options=TensileOptions(per_job_lane=True))
    assert swaps(own.plans[1])[0] == SwapOut(1, 1, 0.0)


def recompute_trace():
    """x input 1 MiB, a 2, b 2, c 4, d 1, e 1 MiB; ops of 1 ms:
    op0 x -> a, op1 a -> b, op2 a -> c, op3 c -> d, op4 b, d, a -> e.
    Resident 3, 4, 8, 9, 6 MiB: the peak is op 3, where a and b are idle. b
    can be recomputed from a (alive until op 4) by re-running op 1; a cannot
    (its source x is gone). Recomputing b lowers ops 2 and 3 by 2 MiB."""
    return make(
        [B(1, "input"), B(2), B(2), B(4), B(1), B(1)],
        [O([0], [1]), O([1], [2]), O([1], [3]), O([3], [4]), O([2, 4, 1], [5])],
    )


SLOW = gpu(mib_per_ms=0.001)  # no copy hides: only recompute helps


def test_msps_recompute_when_swaps_are_not_enough():
    t, lat = recompute_trace()
    free = tensile([t], DeviceModel(SLOW, lat))
    assert free.stats["peak_bytes"] == 9 * MiB and not free.plans[0].events  # no budget: no cost
    res = tensile([t], DeviceModel(SLOW, lat), budget_bytes=7 * MiB)
    check(res.plans[0], t)
    assert res.feasible and res.stats["peak_bytes"] == 7 * MiB
    assert list(res.plans[0].events) == [Release(2, 1), Recompute(2, 4, (1,))]
    assert res.stats["recomputes"] == [1]
    assert res.stats["recompute_time_s"] == pytest.approx(1e-3)

    planned = run([t], res.plans, lat, SLOW, budget=7 * MiB)
    assert not planned.oom and planned.peak_bytes == 7 * MiB
    assert planned.jobs[0].recompute_s == pytest.approx(3e-3)  # once per iteration

    short = tensile([t], DeviceModel(SLOW, lat), budget_bytes=6 * MiB)
    assert not short.feasible and short.stats["peak_bytes"] == 7 * MiB
    off = tensile(
        [t], DeviceModel(SLOW, lat), budget_bytes=7 * MiB, options=TensileOptions(recompute=False)
    )
    assert not off.feasible and off.stats["peak_bytes"] == 9 * MiB


def test_msps_chain_and_order():
    t, _ = recompute_trace()
    assert msps.producer(t, 2) == 1
    assert msps.producer(t, 0) == -1  # an input has no producer
    assert msps.chain(t, 2, 4, lambda s: s == 1) == ((1,), (1,))
    assert msps.chain(t, 2, 4, lambda s: False, max_ops=3) is None  # x is gone
    assert msps.chain(t, 2, 1, lambda s: True) is None  # op 1 does not run before op 1
    fast = msps.RecomputeCandidate(0, 2, 1, 4, (1,), (1,), 2 * MiB, 1000.0)
    big_slow = msps.RecomputeCandidate(0, 3, 2, 4, (2,), (1,), 4 * MiB, 4000.0)
    assert fast.msps == pytest.approx(2 * MiB / 1e-3)
    assert msps.best([big_slow, fast]) is fast
    assert msps.best([]) is None
    assert fast.events() == (Release(2, 1), Recompute(2, 4, (1,)))


def test_max_swap_rate_makes_two_jobs_take_turns():
    """NOTE [ Max swapping rate ]: a job may swap while its count is at most
    rate x all swaps so far. At 0.5 two jobs alternate; at 0.25 both are
    stuck after one swap each (0 <= 0, then 0 <= 0.25, then 1 > 0.5)."""
    t = syn.residual(3, act_mib=2, optimizer=False, durations=syn.Durations(syn.Grain.MS, 2, 6))
    free = tensile([t, t], DeviceModel(HW, Measured()))
    half = tensile([t, t], DeviceModel(HW, Measured()), options=TensileOptions(max_swap_rate=0.5))
    quarter = tensile(
        [t, t], DeviceModel(HW, Measured()), options=TensileOptions(max_swap_rate=0.25)
    )
    for r in (free, half, quarter):
        for p in r.plans:
            check(p, t)
    a, b = half.stats["swaps"]
    assert a >= 2 and abs(a - b) <= 1
    assert quarter.stats["swaps"] == [1, 1]
    assert quarter.stats["peak_bytes"] > free.stats["peak_bytes"]


def test_options_are_validated():
    t, lat = gap_chain()
    with pytest.raises(ValueError, match="max_swap_rate"):
        TensileOptions(max_swap_rate=0.0)
    with pytest.raises(PlanError, match="tensile: max_swap_rate=0.0 must be in"):
        registry.run("tensile", [t], DeviceModel(HW, lat), options={"max_swap_rate": 0.0})
    with pytest.raises(PlanError, match="tensile: unknown option 'bogus'"):
        registry.run("tensile", [t], DeviceModel(HW, lat), options={"bogus": 1})
    with pytest.raises(PlanError, match="budget_bytes"):
        tensile([t], DeviceModel(HW, lat), budget_bytes=-5)
    assert TensileOptions().max_swap_rate == 1.0


def test_result_records_options_and_stats():
    t, lat = gap_chain()
    res = tensile(
        [t], DeviceModel(HW, lat), budget_bytes=6 * MiB, options=TensileOptions(swap_rest=False)
    )
    assert res.options["budget_bytes"] == 6 * MiB and res.options["swap_rest"] is False
    assert res.stats["job_peak_bytes"] == [5 * MiB]
    assert res.stats["liveness_peak_bytes"] == 7 * MiB
    assert res.solve_time_s > 0


# ---- properties over the synthetic graphs ----------------------------------------------------
MS = syn.Durations(syn.Grain.MS, 1, 9)


@st.composite
def synthetic_traces(draw):
    family = draw(st.sampled_from(["chain", "residual", "unet", "dag"]))
    seed = draw(st.integers(0, 10_000))
    optimizer = draw(st.booleans())
    if family == "chain":
        return syn.chain(
            draw(st.integers(1, 6)),
            act_mib=draw(st.integers(1, 4)),
            seed=seed,
            optimizer=optimizer,
            durations=MS,
        )
    if family == "residual":
        return syn.residual(
            draw(st.integers(1, 3)),
            act_mib=draw(st.integers(1, 3)),
            seed=seed,
            optimizer=optimizer,
            durations=MS,
        )
    if family == "unet":
        return syn.unet(draw(st.integers(1, 2)), seed=seed, optimizer=optimizer, durations=MS)
    return syn.random_dag(
        draw(st.integers(8, 60)),
        seed=seed,
        optimizer=optimizer,
        dropout=draw(st.booleans()),
        durations=MS,
    )


PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(synthetic_traces(), st.booleans())
def test_plans_check_and_never_raise_the_peak(t, swap_rest):
    lat = Measured()
    res = tensile([t], DeviceModel(HW, lat), options=TensileOptions(swap_rest=swap_rest))
    check(res.plans[0], t)
    vanilla = simulate([t], DeviceModel(HW, lat))
    planned = run([t], res.plans, lat, check=False)
    assert not planned.oom
    assert planned.peak_bytes <= vanilla.peak_bytes
    assert planned.peak_bytes <= res.stats["peak_bytes"]  # the op grid bounds it
    assert planned.jobs[0].stall_s < 1e-9  # every swap hides
    assert res.stats["peak_bytes"] <= res.stats["liveness_peak_bytes"]


@PROPERTY
@given(synthetic_traces(), st.floats(0.3, 1.0))
def test_with_a_budget_the_plan_fits_or_says_it_stopped_short(t, frac):
    """NOTE [ Short of the budget ]: a plan that does not fit is still
    returned, stopped with no move left (never called infeasible)."""
    lat = Measured()
    budget = max(1, int(t.peak("framework")[0] * frac))
    res = tensile([t], DeviceModel(HW, lat), budget_bytes=budget)
    check(res.plans[0], t)
    planned = run([t], res.plans, lat, check=False, budget=budget)
    if res.feasible:
        assert not planned.oom and planned.peak_bytes <= budget
    else:
        assert (res.status, res.reason) == (Status.STOPPED, Reason.NO_MOVE_LEFT)
        assert res.stats["peak_bytes"] > budget


@PROPERTY
@given(synthetic_traces(), st.sampled_from([None, 0.8]), st.booleans())
def test_two_identical_jobs_share_memory_and_lane(t, frac, per_job_lane):
    lat = Measured()
    vanilla = simulate([t, t], DeviceModel(HW, lat))
    budget = None if frac is None else int(vanilla.peak_bytes * frac)
    res = tensile(
        [t, t],
        DeviceModel(HW, lat),
        budget_bytes=budget,
        options=TensileOptions(per_job_lane=per_job_lane),
    )
    for p in res.plans:
        check(p, t)
    planned = run([t, t], res.plans, lat, check=False)
    assert not planned.oom
    assert planned.peak_bytes <= vanilla.peak_bytes
    if not per_job_lane:
        assert planned.peak_bytes <= res.stats["peak_bytes"]
        if res.feasible and budget is not None:
            assert planned.peak_bytes <= budget


# ---- the shipped traces -------------------------------------------------------------------
DATA = Path(__file__).resolve().parents[2] / "traces" / "data"
SHIPPED = ("resnet50", "vgg16", "inception_v3", "densenet121", "bert_base", "gpt2")


@pytest.fixture(scope="module")
def a6000():
    from memplan.hwmodels.latency import Roofline
    from memplan.hwmodels.profile import load_hardware

    return load_hardware("rtx-a6000"), Roofline()


def shipped(name: str):
    path = DATA / f"{name}_b16_adam.json.gz"
    if not path.exists():
        pytest.skip(f"{path.name} not shipped")
    return io.load(path)


@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_traces(name, a6000):
    """Without a budget every swap hides and the simulator sees exactly the
    predicted peak; with 80% of the vanilla peak the plan fits or says so."""
    hw, lat = a6000
    t = shipped(name)
    vanilla = simulate([t], DeviceModel(hw, lat))
    for budget in (None, int(vanilla.peak_bytes * 0.8)):
        res = tensile([t], DeviceModel(hw, lat), budget_bytes=budget)
        check(res.plans[0], t)
        planned = run([t], res.plans, lat, hw, check=False, budget=budget if res.feasible else None)
        assert not planned.oom
        assert planned.peak_bytes <= vanilla.peak_bytes
        assert planned.peak_bytes <= res.stats["peak_bytes"]
        if budget is None:
            assert planned.peak_bytes < vanilla.peak_bytes
            assert planned.jobs[0].stall_s < 1e-9
        elif res.feasible:
            assert planned.peak_bytes <= budget


@pytest.mark.slow
def test_two_shipped_jobs_on_one_lane(a6000):
    hw, lat = a6000
    t = shipped("resnet50")
    res = tensile([t, t], DeviceModel(hw, lat))
    for p in res.plans:
        check(p, t)
    vanilla, planned = (
        simulate([t, t], DeviceModel(hw, lat)),
        run([t, t], res.plans, lat, hw, check=False),
    )
    assert planned.peak_bytes <= res.stats["peak_bytes"] < vanilla.peak_bytes
    assert max(j.stall_s for j in planned.jobs) < 1e-9

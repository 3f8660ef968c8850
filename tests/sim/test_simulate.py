"""`simulate` at its boundary (arguments, plan checking), TENSILE's metrics,
and OOM policies on random steps."""

from __future__ import annotations

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.latency import Fixed
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Plan, Recompute, Release, SwapIn, SwapOut
from memplan.planners.heuristics.vanilla import release_only_plan
from memplan.sim import Job, SimError, savings, simulate
from memplan.traces import synthetic
from memplan.traces.io import fingerprint

from tests.sim.handtraces import B, Call, MiB, fmt, gpu, make
from tests.sim.test_model import swap_chain


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"iterations": 0}, "iterations=0 must be an integer >= 1"),
        ({"budget": 0}, "budget=0 must be a positive number of bytes"),
        ({"oom": "explode"}, "oom='explode' must be one of fail, stall, passive"),
    ],
)
def test_bad_arguments(kwargs, message):
    t, lat = swap_chain()
    with pytest.raises(SimError, match=message):
        simulate([t], DeviceModel(gpu(), lat), **kwargs)


def test_more_bad_arguments():
    t, lat = swap_chain()
    with pytest.raises(SimError, match="lanes=2 needs two copy engines; hand-gpu has 1"):
        simulate([t], DeviceModel(gpu(copy_engines=1), lat, lanes=2))
    with pytest.raises(LatencyError, match="lanes=3 must be 1"):
        DeviceModel(gpu(), lat, lanes=3)
    with pytest.raises(SimError, match="no jobs"):
        simulate([], DeviceModel(gpu(), lat))
    with pytest.raises(SimError, match=r"jobs\[0\]: arrival_s=-1.0 must be >= 0"):
        simulate([Job(t, arrival_s=-1.0)], DeviceModel(gpu(), lat))
    with pytest.raises(SimError, match="returned bad durations"):
        simulate([t], DeviceModel(gpu(), Fixed([0.001, float("nan"), 0.001, 0.001])))


def test_plans_are_checked_first():
    t, lat = swap_chain()
    bad = Plan(fingerprint(t), (SwapOut(0, 0),))  # op3 reads a, never swapped in
    with pytest.raises(PlanError, match="op 3 .*reads buffer 0, which is absent"):
        simulate([Job(t, bad)], DeviceModel(gpu(), lat))
    # unchecked, the run reaches op3 and finds the data gone... unless a host
    # copy lets it fetch on demand: a passive swap
    r = simulate([Job(t, bad)], DeviceModel(gpu(), lat), check=False, iterations=1)
    assert r.jobs[0].passive_swaps == 1 and r.jobs[0].stall_s == 0.002


def test_per_job_iterations_and_names():
    t, lat = swap_chain()
    r = simulate([Job(t, iterations=1, name="one"), t], DeviceModel(gpu(), lat))
    assert [(j.name, len(j.iteration_times_s)) for j in r.jobs] == [("one", 1), ("hand", 3)]


def test_compare_gives_tensile_metrics():
    # vanilla: 4 MiB peak (op2 holds a, b1, b2), 8 ms; the late swap-in: 3 MiB, 10 ms
    t, lat = swap_chain()
    vanilla = simulate([t], DeviceModel(gpu(), lat), iterations=1)
    planned = simulate(
        [Job(t, Plan(fingerprint(t), (SwapOut(0, 0), SwapIn(0, 2, 3))))],
        DeviceModel(gpu(), lat),
        iterations=1,
    )
    c = savings(vanilla, planned)
    m = c.jobs[0]
    assert (m.vmp_bytes, m.emp_bytes, m.vtc_s, m.etc_s) == (4 * MiB, 3 * MiB, 0.008, 0.010)
    assert (m.msr, m.eor, m.cbr) == pytest.approx((0.25, 1.25, 0.2), rel=1e-12)
    assert c.total == m
    with pytest.raises(SimError, match="1 jobs, the planned run 2"):
        savings(vanilla, simulate([t, t], DeviceModel(gpu(), lat)))


def test_compare_after_oom_is_nan():
    t, lat = swap_chain()
    ok = simulate([t], DeviceModel(gpu(), lat))
    oom = simulate([t], DeviceModel(gpu(), lat), budget=3 * MiB)
    m = savings(ok, oom).jobs[0]
    assert np.isnan([m.msr, m.eor, m.cbr]).all()


def op_bytes(t) -> int:
    """The most bytes one op touches: the least a budget must hold."""
    return max(int(t.nbytes[t.op_accesses(i)].sum()) for i in range(t.n_ops))


def start_bytes(t) -> int:
    return int(t.nbytes[t.exists_at_start].sum())


@pytest.mark.parametrize("seed", range(6))
def test_passive_mode_keeps_any_step_under_a_tight_budget(seed):
    t = synthetic.random_dag(100, seed=seed, dropout=seed % 2 == 1)
    lat = Fixed(np.full(t.n_ops, 1e-4))
    budget = max(op_bytes(t), start_bytes(t))
    for plan in (None, release_only_plan(t)):
        r = simulate([Job(t, plan)], DeviceModel(gpu(), lat), budget=budget, oom="passive")
        j = r.jobs[0]
        assert not j.oom and j.passive_swaps > 0
        assert r.peak_bytes <= budget
        assert j.bytes_h2d <= j.bytes_d2h + int(t.nbytes.sum()) * 3  # fetches come from evictions
        assert (r.memory.bytes <= budget).all() and r.memory.bytes[-1] == 0


@pytest.mark.parametrize("seed", range(4))
def test_budget_at_the_peak_is_enough(seed):
    t = synthetic.random_dag(90, seed=seed)
    lat = Fixed(np.full(t.n_ops, 1e-4))
    fw, live = t.peak("framework")[0], t.peak("liveness")[0]
    assert not simulate([t], DeviceModel(gpu(), lat), budget=fw).jobs[0].oom
    assert simulate([t], DeviceModel(gpu(), lat), budget=fw - 1).jobs[0].oom
    r = simulate([Job(t, release_only_plan(t))], DeviceModel(gpu(), lat), budget=live, oom="stall")
    assert (r.jobs[0].oom, r.jobs[0].stall_s, r.peak_bytes) == (False, 0.0, live)


def test_two_passive_jobs_share_a_budget():
    t = synthetic.random_dag(80, seed=7)
    lat = Fixed(np.full(t.n_ops, 1e-4))
    budget = 2 * max(op_bytes(t), start_bytes(t))
    r = simulate(
        [t, Job(t, arrival_s=0.001)], DeviceModel(gpu(), lat), budget=budget, oom="passive"
    )
    assert not r.oom and r.peak_bytes <= budget
    assert all(j.passive_swaps > 0 for j in r.jobs)


def test_recompute_allocation_evicts_in_passive_mode():
    # x (input) -> op0 -> a; a released after op1 and recomputed before op4.
    # Under 3 MiB, re-taking a's 2 MiB at 4 ms needs room: x is the chain's
    # source (pinned), so d goes (1 MiB, 4->5); op5 fetches it back (7->8).
    t, lat = make(
        [B(1, "input", freed_after=5), B(2), B(1), B(1)],
        [
            Call([0], [1]),
            Call([1], []),
            Call([], [2]),
            Call([2], [3]),
            Call([1], []),
            Call([3], []),
        ],
    )
    p = Plan(fingerprint(t), (Release(1, 1), Recompute(1, 4, (0,))))
    r = simulate([Job(t, p)], DeviceModel(gpu(), lat), iterations=1, budget=3 * MiB, oom="passive")
    assert fmt(r.log)[10:] == [
        (4.0, "evict_start", 4, 3, "lane0"),
        (5.0, "evict_end", 4, 3, "lane0"),
        (5.0, "recompute_start", 0, 1),
        (6.0, "recompute_end", 0, 1),
        (6.0, "op_start", 4, -1),
        (7.0, "op_end", 4, -1),
        (7.0, "fetch_start", 5, 3, "lane0"),
        (8.0, "fetch_end", 5, 3, "lane0"),
        (8.0, "op_start", 5, -1),
        (9.0, "op_end", 5, -1),
        (9.0, "iter_end", -1, -1),
    ]
    j = r.jobs[0]
    assert (j.passive_swaps, j.recompute_s, j.stall_s, j.peak_bytes) == (2, 0.001, 0.002, 3 * MiB)


def test_jobs_sharing_the_device_are_not_slowed_twice():
    """Four identical jobs on one FIFO compute queue take four times as long per
    iteration as one job alone: the queue is the sharing, and the roofline is
    asked for each kernel alone (hwmodels NOTE [ Usage under a compute queue ])."""
    from memplan.hwmodels.latency import Roofline
    from memplan.hwmodels.profile import load_hardware
    from memplan.traces.synthetic import chain

    trace = chain(4)
    hw = load_hardware("rtx-a6000")
    one = simulate([trace], DeviceModel(hw, Roofline()), iterations=3)
    four = simulate([trace] * 4, DeviceModel(hw, Roofline()), iterations=3)
    ratio = four.jobs[0].iteration_time_s / one.jobs[0].iteration_time_s
    assert ratio == pytest.approx(4.0, rel=1e-6)

"""Every method's scheduler over random scenarios (arrivals, iteration
counts, departures, jitter, a slow lane): each plan it hands the simulator
passes the plan checker at the boundary it is taken (simulate's check=True),
plans change only at boundaries at or after they are ready, the budget holds
under the passive net, and the same seed gives the same run."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Fixed
from memplan.hwmodels.profile import load_hardware
from memplan.planners.heuristics.tensile.update import PlanningTime
from memplan.sim import Job, simulate
from memplan.sim.dynamics import LaneSlowdown
from memplan.traces import synthetic

from memplan.controllers import Method, controller_for

HW = load_hardware("rtx-a6000")
TRACES = (synthetic.chain(3, act_mib=32), synthetic.chain(5, act_mib=16, param_mib=4))


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 3))
    jobs = []
    for k in range(n):
        t = TRACES[draw(st.integers(0, 1))]
        arrival = draw(st.sampled_from([0.0, 0.001, 0.0025, 0.006]))
        leaves = draw(st.booleans())
        departure = arrival + draw(st.sampled_from([0.003, 0.008])) if leaves else None
        iters = 50 if leaves else draw(st.integers(1, 5))
        jobs.append(
            Job(t, arrival_s=arrival, iterations=iters, departure_s=departure, name=f"j{k}")
        )
    method = draw(st.sampled_from([m.value for m in Method]))
    jitter = draw(st.sampled_from([0.0, 0.3]))
    slow = draw(st.booleans())
    lanes = (LaneSlowdown(4.0, 0.001, 0.004),) if slow else ()
    frac = draw(st.sampled_from([0.5, 0.8]))
    return jobs, method, jitter, lanes, frac


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.integers(0, 3))
def test_random_scenarios_under_every_scheduler(case, seed):
    jobs, method, jitter, lanes, frac = case
    # one latency model for both traces: Fixed by op count would not fit both
    dev = DeviceModel(HW, _PerTrace())
    peak = sum(t.peak("framework")[0] for t in {id(j.trace): j.trace for j in jobs}.values())
    budget = max(int(frac * peak), 1)
    kw = dict(budget=budget, oom="passive", jitter=jitter, lane_slowdowns=lanes, seed=seed)

    def run():
        ctl = controller_for(
            method, [j.trace for j in jobs], dev, budget, planning=PlanningTime(1e-3, 0.0)
        )
        return simulate(jobs, dev, controller=ctl, **kw), ctl

    res, ctl = run()
    changes = sum(len(j.plan_changes) for j in res.jobs)
    event(f"{method}: {'plans changed' if changes else 'no change'}")
    event(f"passive net {'used' if sum(j.passive_swaps for j in res.jobs) else 'idle'}")
    starts = {(r.job, r.iteration): r.start_s for r in ctl.record.reports}
    for j in res.jobs:
        n_it = len(j.iteration_times_s)
        assert len(j.plan_versions) >= n_it
        assert list(j.plan_versions) == sorted(j.plan_versions)
        for it, ready, _why in j.plan_changes:
            # taken at an iteration boundary at or after it was ready
            if (j.index, it) in starts:
                assert starts[(j.index, it)] >= ready - 1e-12
        assert all(t >= 0 for t in j.iteration_times_s)
        assert j.stall_s >= 0
    assert res.oom or res.device_peak_bytes <= budget
    again, _ = run()
    assert [j.plan_versions for j in again.jobs] == [j.plan_versions for j in res.jobs]
    assert [j.iteration_times_s for j in again.jobs] == [j.iteration_times_s for j in res.jobs]


class _PerTrace(Fixed):
    """0.2 ms per op whatever the trace."""

    def __init__(self):
        pass

    def predict_all(self, trace, hw, usage=0.0):
        return np.full(trace.n_ops, 2e-4)

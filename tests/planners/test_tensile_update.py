"""TENSILE's plan updating on plain arrays: the average change rate against
the threshold (worked by hand from the EWMA rule), the modelled planning
time, and Capuchin fed a measured timeline."""

from __future__ import annotations

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Fixed
from memplan.hwmodels.profile import load_hardware
from memplan.planners.analysis.optimes import predict_timelines
from memplan.planners.core.errors import PlanError
from memplan.planners.heuristics.capuchin.planner import capuchin
from memplan.planners.heuristics.tensile.update import LatencyTracker, PlanningTime, UpdateOptions
from memplan.traces import synthetic

HW = load_hardware("rtx-a6000")


def test_change_rate_follows_the_ewma_and_is_averaged_over_distinct_traces():
    a = synthetic.chain(2)  # 9 ops
    b = synthetic.chain(3)  # 12 ops
    tr = LatencyTracker(_PerTrace({a: 1e-3, b: 2e-3}), HW, UpdateOptions(threshold=0.1, alpha=0.5))
    tr.mark_planned([a, b, a])
    assert tr.average_change_rate([a, b]) == 0.0
    # a's ops observed at 2 ms: each estimate 0.5*2 + 0.5*1 = 1.5 ms -> rate 0.5
    tr.observe(a, np.full(a.n_ops, 2e-3))
    assert tr.average_change_rate([a]) == pytest.approx(0.5)
    # b unchanged: the mean over {a, b} (a named twice counts once) is 0.25
    assert tr.average_change_rate([a, b, a]) == pytest.approx(0.25)
    assert tr.due([a, b]) == (True, pytest.approx(0.25))
    # re-planned from the estimates: the rate starts again from 0
    tr.mark_planned([a, b])
    assert tr.due([a, b]) == (False, 0.0)
    # one more 2 ms iteration: 1.75 ms vs 1.5 ms planned -> 1/6 on a, mean 1/12 < 0.1
    tr.observe(a, np.full(a.n_ops, 2e-3))
    assert tr.due([a, b]) == (False, pytest.approx(1 / 12))
    # ops not observed (NaN) keep their estimates: half of b's ops at 4 ms
    # move from 2 to 3 ms, b's sum by a quarter
    lat = np.full(b.n_ops, np.nan)
    lat[: b.n_ops // 2] = 4e-3
    tr.observe(b, lat)
    assert tr.average_change_rate([b]) == pytest.approx(0.25)


class _PerTrace(Fixed):
    """Every op of a trace at one duration per trace."""

    def __init__(self, per: dict):
        self.per = per

    def predict_all(self, trace, hw, usage=0.0):
        return np.full(trace.n_ops, self.per[trace])


def test_tracker_refuses_latencies_of_the_wrong_length():
    a = synthetic.chain(2)
    tr = LatencyTracker(_PerTrace({a: 1e-3}), HW)
    with pytest.raises(PlanError, match="9 ops"):
        tr.observe(a, np.ones(3))


def test_planning_time_is_fixed_plus_per_op():
    a, b = synthetic.chain(2), synthetic.chain(3)  # 9 and 12 ops
    assert PlanningTime(0.5, 0.01).of([a, b, b]) == pytest.approx(0.5 + 0.01 * 33)
    assert PlanningTime().of([]) == PlanningTime().fixed_s


@pytest.mark.parametrize(
    "bad", [dict(fixed_s=-1.0), dict(per_op_s=float("nan")), dict(fixed_s=1e9)]
)
def test_planning_time_refuses_absurd_values(bad):
    with pytest.raises(PlanError, match="planning time"):
        PlanningTime(**bad)


@pytest.mark.parametrize("bad", [dict(threshold=0.0), dict(threshold=float("inf")), dict(alpha=2)])
def test_update_options_refuse_absurd_values(bad):
    with pytest.raises(PlanError):
        UpdateOptions(**bad)


def test_capuchin_from_the_predicted_timeline_given_explicitly_is_capuchin():
    t = synthetic.chain(6, act_mib=8)
    dev = DeviceModel(HW, Fixed(np.full(t.n_ops, 2e-3)))
    budget = int(0.7 * t.peak("framework")[0])
    own = capuchin([t], dev, budget_bytes=budget)
    given = capuchin([t], dev, budget_bytes=budget, timelines=predict_timelines([t], dev))
    assert own.plans and given.plans == own.plans
    tl = predict_timelines([t], DeviceModel(HW, Fixed(np.full(t.n_ops, 4e-3))))
    with pytest.raises(PlanError, match="one per job"):
        capuchin([t], dev, budget_bytes=budget, timelines=tl * 2)

"""NOTE [ The net under a reordered plan ]: a plan that reorders ops runs
under the passive net where the comparison asks for dtr (the simulator
refuses dtr for it), and its row says so; other plans keep their net."""

from __future__ import annotations

import dataclasses

from memplan.hwmodels.device import DeviceModel
from memplan.planners.heuristics.vanilla import vanilla_plan

from memplan.comparison import compare_planners
from memplan.plannerview import net_for
from memplan.runconfig import RunConfig
from tests.planners.test_plan_order import interleaved
from tests.sim.handtraces import MiB, gpu


def test_net_for_a_reordered_plan_is_passive_under_dtr_only():
    t, _ = interleaved()
    plain = vanilla_plan(t)
    same = dataclasses.replace(plain, order=tuple(range(t.n_ops)))  # the trace's own order
    moved = dataclasses.replace(plain, order=(0, 2, 1, 3, 4))
    assert net_for([plain], [t], "dtr") == ("dtr", "")
    assert net_for([same], [t], "dtr") == ("dtr", "")
    assert net_for([moved], [t], "none") == ("none", "")
    assert net_for([moved], [t], "passive") == ("passive", "")
    net, why = net_for([moved], [t], "dtr")
    assert net == "passive" and "reorders ops" in why


def test_a_swapadvisor_row_under_dtr_runs_with_the_passive_net():
    t, lat = interleaved()
    dev = DeviceModel(gpu(), lat)
    opts = {"swapadvisor": {"population": 8, "generations": 4}}
    run = RunConfig(fallback="dtr")
    c = compare_planners([t], dev, ["swapadvisor"], budget=7 * MiB, options=opts, config=run)
    (row,) = c.rows
    assert row.fit == "alone" and row.iteration_time_s == 0.005  # 5 ops of 1 ms, no event
    assert row.fallback == "passive" and "its net is passive" in row.reason

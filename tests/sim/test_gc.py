"""NOTE [ Garbage collection in simulate ]: the collector is paused for the
run and given back as the caller had it."""

from __future__ import annotations

import gc
import importlib

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners.core.errors import PlanError
from memplan.planners.heuristics.vanilla import release_only_plan
from memplan.sim import Job, simulate
from memplan.traces import synthetic

DEV = DeviceModel(load_hardware("rtx-a6000"), Roofline())


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_paused_during_the_run_and_restored(monkeypatch, enabled):
    module = importlib.import_module("memplan.sim.simulate")
    seen = []
    real = module._run

    def spy(*args):
        seen.append(gc.isenabled())
        return real(*args)

    monkeypatch.setattr(module, "_run", spy)
    (gc.enable if enabled else gc.disable)()
    try:
        module.simulate([synthetic.chain(3)], DEV, iterations=1)
        assert seen == [False]
        assert gc.isenabled() is enabled
    finally:
        gc.enable()


def test_the_collector_comes_back_after_an_error():
    """A plan for another trace is refused inside the run (by the checker)."""
    gc.enable()
    wrong = release_only_plan(synthetic.chain(4))
    with pytest.raises(PlanError):
        simulate([Job(synthetic.chain(3), wrong)], DEV, iterations=1)
    assert gc.isenabled()


def test_a_finished_run_leaves_nothing_of_the_traces_size_to_the_collector():
    """The model is a cycle (SimPy's environment), but `GpuModel.close` lets
    go of the per-buffer and per-op state, the log and the samples: what is
    left for the collector is a few small objects, however large the trace."""
    t = synthetic.sized(2000, seed=0, family=synthetic.Family.RESIDUAL)
    plan = release_only_plan(t)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        r = simulate([Job(t, plan)], DEV, iterations=2, oom="passive", budget=t.peak("liveness")[0])
        assert len(r.log) >= 4 * t.n_ops  # the result keeps its log
        del r
        gc.collect()
        left = list(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert len(left) < 30
    assert max(len(x) for x in left if isinstance(x, list | tuple | dict)) < 20

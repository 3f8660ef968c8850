"""Replaying a plan with another op order (NOTE [ Plans under another order ])
computes the same bits as the trace's order: an allowed order changes when
ops run, never what they compute."""

from __future__ import annotations

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Fixed
from memplan.planners.core.order import check_order, topological_order
from memplan.planners.core.plan import Plan, fingerprint_of
from memplan.sim import Job, simulate
from memplan.validate import compare_results, replay
from memplan.validate.runtime.errors import RuntimePlanError
from memplan.validate.runtime.plan import export

from tests.sim.handtraces import gpu
from tests.validate.helpers import trace_of, vanilla


def latest_first(trace):
    """The allowed order that, of the ready ops, always runs the one latest in
    the trace: independent branches run in the opposite order."""
    return topological_order(trace, [-i for i in range(trace.n_ops)])


@pytest.mark.parametrize("model", ["tiny_resnet", "tiny_transformer"])
def test_a_reordered_plan_replays_bit_identical_results(model):
    trace = trace_of(model)
    order = latest_first(trace)
    assert order != tuple(range(trace.n_ops))  # the models have independent branches
    check_order(trace, order)
    plan = Plan(fingerprint_of(trace), (), model, order)
    r = replay(trace, plan=plan, iterations=2)
    compare_results(vanilla(model), r)
    # the replay's pool and the simulator run the same order: the same peak
    device = DeviceModel(gpu(1 << 20), Fixed(np.full(trace.n_ops, 1e-6)))
    sim = simulate([Job(trace, plan)], device, iterations=1)
    assert r.peak_bytes == sim.peak_bytes


def test_the_order_changes_the_replayed_peak():
    # tiny_transformer's heads and its MLP leave room: running the latest ready
    # op first peaks lower than the trace (the simulator agrees, above)
    trace = trace_of("tiny_transformer")
    plan = Plan(fingerprint_of(trace), (), "tiny_transformer", latest_first(trace))
    assert replay(trace, plan=plan, iterations=1).peak_bytes < trace.peak("framework")[0]


def test_the_runtime_refuses_a_reordered_plan():
    # a training loop runs autograd's order; only the simulator and the replay reorder
    trace = trace_of("tiny_resnet")
    plan = Plan(fingerprint_of(trace), (), "tiny_resnet", latest_first(trace))
    with pytest.raises(RuntimePlanError, match=r"runs its ops in another order"):
        export(plan, trace)
    export(Plan(fingerprint_of(trace), (), "tiny_resnet", tuple(range(trace.n_ops))), trace)

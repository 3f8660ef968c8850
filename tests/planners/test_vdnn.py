"""vDNN: layer-wise offload in forward, prefetch one layer ahead in backward."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hwmodels.latency import Fixed, Measured
from hwmodels.profile import load_hardware
from planners import registry
from planners.check import check
from planners.errors import PlanError
from planners.plan import SwapIn, SwapOut
from planners.vdnn import VdnnLayers, VdnnOptions, _is_conv, layers_of, vdnn, vdnn_plan
from sim import Job, simulate
from traces.synthetic import Durations, TimeUnit, chain, residual, sized, unet

MiB = 1 << 20
V100 = load_hardware("v100-sxm2-16gb")
MS = Durations(TimeUnit.MS, 1, 9)

# chain(3): buffers 0 input, 1 target, 2/4/6 weights, 3/5/7 the outputs of
# layer1..3. Ops: 0-2 the convolutions, 3 mse_loss, 4 ones_like, 5
# mse_loss_backward, 6/7/8 the convolution backwards of layer3/2/1.
CHAIN3_CONV = [
    SwapOut(0, 0),  # layer1's input, after layer1's forward
    SwapOut(3, 1),  # layer2's input
    SwapOut(5, 2),  # layer3's input
    SwapIn(5, 3, 6),  # needed by layer3's backward (op 6): when the loss backward starts (op 4)
    SwapIn(3, 5, 7),  # layer2's backward (op 7): when layer3's backward starts
    SwapIn(0, 6, 8),  # layer1's backward (op 8): when layer2's backward starts
]
# vDNN_all also offloads the loss layer's inputs (layer3's output and the
# target) after op 3; mse_loss_backward (op 5) needs them, and no layer
# follows the loss, so they are prefetched by the op just before (op 4).
CHAIN3_ALL = [SwapOut(1, 3), SwapOut(7, 3), SwapIn(1, 4, 5), SwapIn(7, 4, 5)]


def order(events):
    return sorted(events, key=lambda ev: (ev.after_op, isinstance(ev, SwapIn), ev.buffer))


def test_chain_vdnn_conv_exact_events():
    t = chain(3)
    plan = vdnn_plan(t, VdnnOptions(VdnnLayers.CONV))
    assert list(plan.events) == order(CHAIN3_CONV)
    check(plan, t)


def test_chain_vdnn_all_exact_events():
    t = chain(3)
    plan = vdnn_plan(t, VdnnOptions("all"))
    assert list(plan.events) == order(CHAIN3_CONV + CHAIN3_ALL)
    check(plan, t)


@pytest.mark.parametrize(
    ("target", "conv"),
    [
        ("aten.convolution.default", True),
        ("aten.cudnn_convolution.default", True),
        ("aten.conv2d.default", True),
        ("aten.slow_conv_dilated2d.default", True),
        ("aten.convolution_backward.default", False),
        ("aten._convert_indices_from_coo_to_csr.default", False),
        ("aten.mm.default", False),
    ],
)
def test_what_counts_as_a_convolution(target, conv):
    assert _is_conv(target) is conv


def test_layers_are_runs_of_one_module():
    t = residual(1)
    names = [(layer.module, layer.conv) for layer in layers_of(t)]
    assert names == [
        ("stem", True),
        ("block0.conv1", True),
        ("block0.relu", False),
        ("block0.conv2", True),
        ("block0", False),  # the residual add
        ("loss", False),
    ]


def test_a_skip_connection_is_offloaded_after_its_last_forward_use():
    # the stem's output feeds block0.conv1 and block0's add: it leaves after
    # the add (op 4) and comes back for conv1's backward, triggered when the
    # backward of the next layer (block0.relu) starts
    t = residual(1)
    plan = vdnn_plan(t)
    stem_out = next(b.id for b in t.buffers if b.name == "stem:out")
    out, back = [ev for ev in plan.events if ev.buffer == stem_out]
    assert out == SwapOut(stem_out, 4)
    relu_bwd = next(op.id for op in t.ops if op.target.startswith("aten.threshold_backward"))
    conv1_bwd = next(
        op.id for op in t.ops if op.module == "block0.conv1" and op.phase.value == "backward"
    )
    assert back == SwapIn(stem_out, relu_bwd - 1, conv1_bwd)
    check(plan, t)


@pytest.mark.parametrize("make", [lambda: chain(6), lambda: residual(3), lambda: unet(2)])
@pytest.mark.parametrize("layers", ["all", "conv"])
def test_plans_check(make, layers):
    t = make()
    check(vdnn_plan(t, VdnnOptions(layers)), t)


def test_predicted_peak_is_the_simulated_one():
    # 1 ms ops, 4 MiB activations: every copy (~0.3 ms on a V100) hides
    t = chain(8, act_mib=4, durations=Durations(TimeUnit.MS, 1, 1))
    lat = Measured()
    res = vdnn([t], V100, lat)
    sim = simulate([Job(t, res.plans[0])], V100, lat)
    assert res.stats["job_peak_bytes"] == [sim.peak_bytes]
    assert sim.peak_bytes < t.peak()[0]


def test_budget_feasibility_and_registry():
    t = chain(8, act_mib=4, durations=Durations(TimeUnit.MS, 1, 1))
    lat = Fixed(np.full(t.n_ops, 1e-3))
    peak = vdnn([t], V100, lat).stats["peak_bytes"]
    assert vdnn([t], V100, lat, budget_bytes=peak).feasible
    assert not vdnn([t], V100, lat, budget_bytes=peak - 1).feasible
    res = registry.run("vdnn", [t, t], V100, lat, options=["layers=conv"])
    assert res.options == {"layers": "conv"} and len(res.plans) == 2
    with pytest.raises(PlanError, match="layers"):
        registry.run("vdnn", [t], V100, lat, options={"layers": "fc"})
    with pytest.raises(PlanError, match="layers"):
        VdnnOptions("fc")


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_ops=st.integers(12, 120),
    seed=st.integers(0, 10_000),
    layers=st.sampled_from(["all", "conv"]),
)
def test_never_above_vanilla_and_fits_when_feasible(n_ops, seed, layers):
    # op durations of milliseconds, as on a real device (with microsecond ops
    # a copy can outlive the buffer it copies and hold its memory longer)
    t = sized(n_ops, seed=seed, durations=MS)
    lat = Measured()
    vanilla = simulate([t], V100, lat).peak_bytes
    budget = int(vanilla * 0.8)
    res = vdnn([t], V100, lat, budget_bytes=budget, layers=layers)
    check(res.plans[0], t)
    sim = simulate([Job(t, res.plans[0])], V100, lat, budget=max(budget, vanilla))
    assert sim.peak_bytes <= vanilla
    if res.feasible:
        assert sim.peak_bytes <= budget

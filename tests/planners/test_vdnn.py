"""vDNN: layer-wise offload in forward, prefetch one layer ahead in backward."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Fixed, Measured
from memplan.hwmodels.profile import load_hardware
from memplan.planners import registry
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Plan, SwapIn, SwapOut
from memplan.planners.heuristics.vdnn import (
    VdnnLayers,
    VdnnOptions,
    _is_conv,
    layers_of,
    vdnn,
    vdnn_plan,
)
from memplan.sim import Job, simulate
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.synthetic import Durations, Grain, chain, residual, sized, unet
from memplan.traces.zoo import ZOO

MiB = 1 << 20
V100 = load_hardware("v100-sxm2-16gb")
MS = Durations(Grain.MS, 1, 9)

# chain(3): buffers 0 input, 1 target, 2/4/6 weights, 3/5/7 the outputs of
# layer1..3. Ops: 0-2 the convolutions, 3 mse_loss, 4 ones_like, 5
# mse_loss_backward, 6/7/8 the convolution backwards of layer3/2/1. Layers:
# layer1..3 are ops 0..2, the loss op 3. A swap-out's deadline is the first
# op of the layer after the next one (after the forward pass: op 4), at the
# latest the op whose end triggers the prefetch.
CHAIN3 = [
    SwapOut(0, 0, before_op=2),  # layer1's input, after layer1's forward; by layer3
    SwapOut(3, 1, before_op=3),  # layer2's input; by the loss
    SwapIn(3, 5, 7),  # layer2's backward (op 7): when layer3's backward starts
    SwapIn(0, 6, 8),  # layer1's backward (op 8): when layer2's backward starts
]
# Left alone, as their copies would overlap no op: layer3's input (buffer 5,
# out after op 2, due by op 3 because its prefetch follows op 3), and under
# vDNN_all the loss layer's inputs (layer3's output and the target, out
# after op 3, needed by op 5 and prefetched after op 4: due by op 4).


def order(events):
    return sorted(events, key=lambda ev: (ev.after_op, isinstance(ev, SwapIn), ev.buffer))


@pytest.mark.parametrize("layers", ["conv", "all"])
def test_chain_exact_events(layers):
    t = chain(3)
    plan = vdnn_plan(t, VdnnOptions(VdnnLayers(layers)))
    assert list(plan.events) == order(CHAIN3)
    check(plan, t)


def test_vdnn_all_offloads_more_than_vdnn_conv():
    # small_cnn's batch-norm, ReLU and pooling layers have inputs backward reads
    t = capture(ZOO["small_cnn"], 4, CaptureOptions(device="meta"), model_name="small_cnn")
    conv, every = (vdnn_plan(t, VdnnOptions(layers)) for layers in ("conv", "all"))
    swapped = [{ev.buffer for ev in p.events if isinstance(ev, SwapOut)} for p in (conv, every)]
    assert swapped[0] < swapped[1]
    for p in (conv, every):
        check(p, t)
        outs = [ev for ev in p.events if isinstance(ev, SwapOut)]
        assert all(ev.after_op + 1 < ev.before_op for ev in outs)  # an op to overlap


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
    # backward of the next layer (block0.relu) starts. The add's layer is the
    # last but one (the loss, op 5, follows): the copy is due by op 6, the
    # first after the forward pass.
    t = residual(1)
    plan = vdnn_plan(t)
    stem_out = next(b.id for b in t.buffers if b.name == "stem:out")
    out, back = [ev for ev in plan.events if ev.buffer == stem_out]
    assert out == SwapOut(stem_out, 4, before_op=6)
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


def planned_chain(durations):
    """chain(8) with 4 MiB activations under vDNN: trace, plan result, simulation."""
    t = chain(8, act_mib=4, durations=durations)
    res = vdnn([t], DeviceModel(V100, Measured()))
    sim = simulate([Job(t, res.plans[0])], DeviceModel(V100, Measured()))
    assert res.stats["job_peak_bytes"] == [sim.peak_bytes]  # predicted = simulated
    return t, res, sim


def test_predicted_peak_is_the_simulated_one():
    # 1 ms ops: every copy (~0.3 ms on a V100) hides
    t, _res, sim = planned_chain(Durations(Grain.MS, 1, 1))
    assert sim.peak_bytes < t.peak()[0]
    assert sim.jobs[0].stall_s == 0


def test_deadlines_make_the_peak_independent_of_timing():
    # 100 us ops: every copy (~0.3 ms on a V100) outlasts the layer it
    # overlaps, so the layer after waits for it (stall), and the peak is the
    # same with every op 20% faster or slower
    t, res, sim = planned_chain(Durations(Grain.US, 100, 100))
    lat = Measured()
    assert sim.jobs[0].stall_s > 0
    secs = np.asarray(lat.predict_all(t, V100))
    for f in (0.8, 1.2):
        scaled = simulate([Job(t, res.plans[0])], DeviceModel(V100, Fixed(secs * f)))
        assert scaled.peak_bytes == sim.peak_bytes
    # without them the copies queue through the forward pass and the peak moves
    free = Plan(
        res.plans[0].trace_fingerprint,
        tuple(
            SwapOut(ev.buffer, ev.after_op) if isinstance(ev, SwapOut) else ev
            for ev in res.plans[0].events
        ),
    )
    peaks = {
        simulate([Job(t, free)], DeviceModel(V100, Fixed(secs * f))).peak_bytes
        for f in (0.8, 1.0, 1.2)
    }
    assert len(peaks) > 1


def test_budget_feasibility_and_registry():
    t = chain(8, act_mib=4, durations=Durations(Grain.MS, 1, 1))
    lat = Fixed(np.full(t.n_ops, 1e-3))
    peak = vdnn([t], DeviceModel(V100, lat)).stats["peak_bytes"]
    assert vdnn([t], DeviceModel(V100, lat), budget_bytes=peak).feasible
    assert not vdnn([t], DeviceModel(V100, lat), budget_bytes=peak - 1).feasible
    res = registry.run("vdnn", [t, t], DeviceModel(V100, lat), options=["layers=conv"])
    assert res.options == {"layers": "conv"} and len(res.plans) == 2
    with pytest.raises(PlanError, match="layers"):
        registry.run("vdnn", [t], DeviceModel(V100, lat), options={"layers": "fc"})
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
    vanilla = simulate([t], DeviceModel(V100, lat)).peak_bytes
    budget = int(vanilla * 0.8)
    res = vdnn([t], DeviceModel(V100, lat), budget_bytes=budget, options=VdnnOptions(layers=layers))
    check(res.plans[0], t)
    sim = simulate([Job(t, res.plans[0])], DeviceModel(V100, lat), budget=max(budget, vanilla))
    assert sim.peak_bytes <= vanilla
    if res.feasible:
        assert sim.peak_bytes <= budget

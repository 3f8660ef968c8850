"""Chen et al. sqrt(n) checkpointing: boundaries, releases, recompute chains."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Measured, Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners import registry
from memplan.planners.analysis import predict_timeline
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Recompute, Release
from memplan.planners.heuristics.checkpoint import (
    CheckpointOptions,
    checkpoint,
    checkpoint_plan,
    predicted_peak,
    segment,
)
from memplan.sim import Job, simulate
from memplan.traces.synthetic import Durations, Grain, chain, random_dag, residual, sized

from tests.planners.test_capuchin import make

MiB = 1 << 20
V100 = load_hardware("v100-sxm2-16gb")
MS = Durations(Grain.MS, 1, 9)


def x(i: int) -> int:
    """Buffer of layer i's output in `chain` (0 input, 1 target, 2i weights)."""
    return 2 * i + 1


def conv_bwd(i: int, n: int = 16) -> int:
    """Op of layer i's convolution_backward in chain(n): n convs, mse_loss,
    ones_like, mse_loss_backward, then layers n..1."""
    return n + 3 + (n - i)


def test_chain_of_16_in_4_segments():
    t = chain(16, act_mib=4)
    seg = segment(t)
    assert seg.candidates == tuple(x(i) for i in range(1, 17))
    assert seg.kept == (x(4), x(8), x(12), x(16))
    plan, stats = checkpoint_plan(t)
    # each released output leaves after the next layer's forward (op i) ...
    released = [i for i in range(1, 12) if i % 4]
    releases = [Release(x(i), i) for i in released]
    # ... and comes back, a segment at a time from the boundary before it,
    # when backward first needs one of them: the last layer of the segment
    # reads its input (nested: each recompute's source is recomputed first)
    recomputes = [
        Recompute(x(i), conv_bwd(last + 1), (i - 1,))
        for last in (11, 7, 3)
        for i in range(last - 2, last + 1)
    ]
    assert plan.events == (*releases, *recomputes)
    assert stats["recomputed_ops"] == 9 and not stats["kept_back"]
    check(plan, t)


def test_the_final_segment_is_not_checkpointed_and_segments_is_an_option():
    t = chain(16)
    two = segment(t, 2)
    assert two.kept == (x(8), x(16))
    assert two.released == tuple(x(i) for i in range(1, 8))
    assert segment(t, 1).released == ()
    with pytest.raises(PlanError, match="segments"):
        CheckpointOptions(0)


def test_chain_saves_memory_in_the_simulator():
    t = chain(16, act_mib=4, param_mib=1, durations=Durations(Grain.MS, 1, 1))
    lat = Measured()
    res = checkpoint([t], DeviceModel(V100, lat))
    sim = simulate([Job(t, res.plans[0])], DeviceModel(V100, lat), iterations=1)
    vanilla = simulate([t], DeviceModel(V100, lat), iterations=1)
    # backward starts with x4, x8, x12 and the final segment x13..x16 instead
    # of all 16 outputs: 9 x 4 MiB less
    assert vanilla.peak_bytes - sim.peak_bytes == 36 * MiB
    assert sim.peak_bytes <= res.stats["peak_bytes"]
    assert sim.jobs[0].recompute_s == pytest.approx(9e-3)


def test_residual_boundaries_are_the_articulation_points():
    t = residual(4)
    names = [t.buffers[b].name for b in segment(t).candidates]
    # never a conv1 or relu output inside a block: the skip bypasses them
    assert names == ["stem:out", "block0:out", "block1:out", "block2:out", "block3:out"]
    seg = segment(t, 3)
    assert [t.buffers[b].name for b in seg.kept] == ["stem:out", "block1:out", "block3:out"]
    plan, _ = checkpoint_plan(t, CheckpointOptions(3))
    check(plan, t)
    # the relu output of block0 comes back from the stem's output: conv1, relu
    relu0 = next(b.id for b in t.buffers if b.name == "block0.relu:out")
    (rc,) = [ev for ev in plan.events if isinstance(ev, Recompute) and ev.buffer == relu0]
    assert [t.ops[k].target for k in rc.ops] == ["aten.convolution.default", "aten.relu.default"]


def test_side_values_do_not_hide_boundaries():
    # A mask made from nothing is read by every layer, the target by the
    # loss: both are left out of the graph, so h1..h4 are still boundaries.
    act = (1, "activation")
    buffers = [(1, "input"), act, act, act, act, act, act, (1, "input")]
    buffers += [act] * 5
    f, b = "forward", "backward"
    ops = [
        ([], [1], 1, f),  # mask
        ([0], [2], 1, f),  # h1
        ([2, 1], [3], 1, f),  # h2
        ([3, 1], [4], 1, f),  # h3
        ([4, 1], [5], 1, f),  # h4
        ([5, 7], [6], 1, f),  # loss against the target
        ([6, 5, 7], [8], 1, b),
        ([4, 8, 1], [9], 1, b),
        ([3, 9, 1], [10], 1, b),
        ([2, 10, 1], [11], 1, b),
        ([0, 11], [12], 1, b),
    ]
    t, _lat = make(buffers, ops)
    seg = segment(t, 2)
    assert seg.candidates == (2, 3, 4, 5)
    assert seg.kept == (3, 5) and seg.released == (2,)
    plan, _ = checkpoint_plan(t, CheckpointOptions(2))
    assert plan.events == (Release(2, 2), Recompute(2, 9, (1,)))
    check(plan, t)


def test_dropout_in_a_chain_restores_the_rng():
    t = random_dag(60, seed=1, dropout=True)
    plan, _ = checkpoint_plan(t)
    check(plan, t)
    rng = [ev for ev in plan.events if isinstance(ev, Recompute) and ev.restore_rng]
    assert rng and all(any(t.ops[k].rng for k in ev.ops) for ev in rng)


def test_falls_back_to_the_empty_plan_when_it_would_raise_the_peak():
    t = random_dag(40, seed=4, durations=MS)
    lat = Measured()
    raw, _ = checkpoint_plan(t)
    assert raw.events
    device = DeviceModel(V100, lat)
    assert predicted_peak(t, predict_timeline(t, device), raw, device) > t.peak()[0]
    res = checkpoint([t], DeviceModel(V100, lat))
    assert res.plans[0].events == () and res.stats["jobs"][0]["fallback"]
    assert res.stats["peak_bytes"] == t.peak()[0]


def test_budget_and_registry():
    t = chain(16, act_mib=4, param_mib=1, durations=Durations(Grain.MS, 1, 1))
    lat = Measured()
    peak = checkpoint([t], DeviceModel(V100, lat)).stats["peak_bytes"]
    assert checkpoint([t], DeviceModel(V100, lat), budget_bytes=peak).feasible
    assert not checkpoint([t], DeviceModel(V100, lat), budget_bytes=peak - 1).feasible
    res = registry.run("checkpoint", [t, t], DeviceModel(V100, lat), options=["segments=2"])
    assert res.options == {"segments": 2} and len(res.plans) == 2
    with pytest.raises(PlanError, match="unknown option"):
        registry.run("checkpoint", [t], DeviceModel(V100, lat), options={"segs": 2})


@pytest.fixture(scope="module")
def transformer():
    from memplan.traces.capture import capture
    from memplan.traces.zoo import ZOO

    return capture(ZOO["tiny_transformer"], 4)


@pytest.mark.slow
def test_captured_transformer(transformer):
    t = transformer
    lat = Roofline()
    res = checkpoint([t], DeviceModel(V100, lat))
    plan = res.plans[0]
    check(plan, t)
    assert plan.counts()["recompute"] > 0
    assert any(ev.restore_rng for ev in plan.events if isinstance(ev, Recompute))
    sim = simulate([Job(t, plan)], DeviceModel(V100, lat))
    assert sim.peak_bytes < simulate([t], DeviceModel(V100, lat)).peak_bytes


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n_ops=st.integers(12, 160), seed=st.integers(0, 10_000), segments=st.sampled_from([None, 2, 3])
)
def test_never_above_vanilla_and_fits_when_feasible(n_ops, seed, segments):
    t = sized(n_ops, seed=seed, durations=MS)
    lat = Measured()
    vanilla = simulate([t], DeviceModel(V100, lat)).peak_bytes
    budget = int(vanilla * 0.8)
    res = checkpoint(
        [t],
        DeviceModel(V100, lat),
        budget_bytes=budget,
        options=CheckpointOptions(segments=segments),
    )
    check(res.plans[0], t)
    sim = simulate([Job(t, res.plans[0])], DeviceModel(V100, lat), budget=max(budget, vanilla))
    assert sim.peak_bytes <= vanilla
    assert sim.peak_bytes <= res.stats["peak_bytes"]
    if res.feasible:
        assert sim.peak_bytes <= budget

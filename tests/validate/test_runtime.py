"""The exported runtime in a real training step: the same gradients as a
plain step for every planner's plan, the saved-tensor bytes on the device
side drop by what the plan offloads, and a model that is not the traced one
is a `RuntimePlanError` naming the first difference."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools

import pytest
import torch
from memplan.planners.core.plan import Plan, SwapIn, SwapOut
from memplan.traces.io import fingerprint
from memplan.traces.model import Phase
from memplan.traces.zoo import BUILTIN, MLP, ZOO, TinyResNet
from memplan.validate.runtime.errors import RuntimePlanError
from memplan.validate.runtime.hooks import PlanRuntime, apply_plan
from memplan.validate.runtime.io import load, save
from memplan.validate.runtime.plan import Action, export
from torch import nn

from tests.validate.helpers import (
    first_backward_use,
    first_op,
    last_forward_use,
    output_of,
    plan_of,
    trace_of,
)
from tests.validate.test_compare import PLANNERS, plan_for

MLP_SAVED_BYTES = 12544 + 8192 + 4096 + 160 + 32 + 4  # batch 4: see the test below


@functools.cache
def workload(model: str, batch: int = 4):
    torch.manual_seed(0)
    return ZOO[model](batch)


def step(model: str, plan=None, net: nn.Module | None = None, batch: int = 4):
    """One forward + backward of a fresh copy of the zoo model (or `net`),
    under `plan` (a RuntimePlan, its state moves left out) or plain; dropout
    draws from seed 1."""
    w = workload(model, batch)
    net = copy.deepcopy(w.model) if net is None else net
    if plan is not None:  # no optimizer step here: test_runtime_state.py moves the state
        plan = dataclasses.replace(plan, state=(), host_step=())
    ctx = PlanRuntime(net, plan).step() if plan is not None else contextlib.nullcontext()
    torch.manual_seed(1)
    with ctx as stats:
        loss = w.loss_fn(net(*w.inputs), *w.targets)
        loss.backward()
    grads = {n: p.grad for n, p in net.named_parameters()}
    return loss.detach(), grads, net.state_dict(), stats


def assert_same_step(a, b) -> None:
    (la, ga, sa, _), (lb, gb, sb, _) = a, b
    assert torch.equal(la, lb)
    assert ga.keys() == gb.keys()
    for name in ga:
        assert torch.equal(ga[name], gb[name]), name
    for name in sa:  # BatchNorm's running statistics updated exactly once
        assert torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize("planner", PLANNERS)
@pytest.mark.parametrize("model", BUILTIN)
def test_a_step_under_every_planners_plan_gives_the_plain_gradients(model, planner):
    rp = export(plan_for(model, planner), trace_of(model), planner)
    planned = step(model, rp)
    assert_same_step(step(model), planned)
    stats = planned[3]
    assert stats.packed == sum(d.action in (Action.KEEP, Action.OFFLOAD) for d in rp.saved)
    assert stats.forward_device_bytes == rp.held_bytes()
    assert stats.recomputed_ops == len(rp.recompute)
    assert stats.device_bytes == 0 and stats.host_bytes == 0  # all let go after backward


def test_the_saved_bytes_of_a_plain_step_are_every_saved_activation():
    """MLP at batch 4 saves its input (4 x 784 floats), both ReLU outputs
    (4 x 512 and 4 x 256 floats, each also saved by the next Linear), the
    log-softmax output (4 x 10), the int64 labels and nll_loss's total weight
    (one float); the weights are parameters, not counted."""
    trace = trace_of("mlp")
    rp = export(Plan(fingerprint(trace), (), "mlp"), trace)
    stats = step("mlp", rp)[3]
    assert stats.forward_device_bytes == rp.held_bytes() == MLP_SAVED_BYTES
    assert stats.kept == len(trace.saved) and stats.offloaded == 0


def test_an_offload_takes_its_bytes_off_the_device_side_until_prefetched():
    trace = trace_of("mlp")
    relu = output_of(trace, first_op(trace, "aten.relu.default"))  # 4 x 512 floats
    out, back = last_forward_use(trace, relu), first_backward_use(trace, relu)
    rp = export(plan_of(trace, SwapOut(relu, out), SwapIn(relu, back - 3, back)), trace)
    assert [d.index for d in rp.saved if d.action is Action.OFFLOAD] == [1, 2]  # relu, fc2
    planned = step("mlp", rp)
    assert_same_step(step("mlp"), planned)
    stats = planned[3]
    assert stats.forward_device_bytes == MLP_SAVED_BYTES - 8192
    assert stats.offloaded == 2 and stats.offloaded_bytes == 8192  # one copy for both
    assert stats.host_peak_bytes == 8192 and stats.prefetched == 1 and stats.late == 0
    # no other op's tensors are unpacked between the swap-in's trigger and fc2's
    # backward, so the prefetch starts a little early, at the second ReLU's
    # backward: fc1's input and that ReLU's output are still held then
    assert stats.device_peak_bytes == 12544 + 4096 + 8192


@pytest.mark.parametrize(
    "model,planner",
    [("small_cnn", "vdnn"), ("tiny_transformer", "vdnn"), ("tiny_resnet", "capuchin")],
)
def test_offloading_plans_lower_the_saved_bytes_by_what_they_offload(model, planner):
    trace = trace_of(model)
    rp = export(plan_for(model, planner), trace, planner)
    offloaded = rp.held_bytes(frozenset({Action.OFFLOAD}))
    assert offloaded > 0 and not rp.regions
    stats = step(model, rp)[3]
    vanilla = step(model, export(Plan(fingerprint(trace), (), model), trace))[3]
    assert stats.forward_device_bytes == vanilla.forward_device_bytes - offloaded
    assert stats.offloaded_bytes == offloaded == stats.host_peak_bytes
    assert stats.prefetched > 0


def test_vdnn_offloads_exactly_the_feature_maps_it_swaps():
    trace, plan = trace_of("small_cnn"), plan_for("small_cnn", "vdnn")
    rp = export(plan, trace, "vdnn")
    swapped = {ev.buffer for ev in plan.events if isinstance(ev, SwapOut)}
    assert {d.buffer for d in rp.saved if d.action is Action.OFFLOAD} == swapped
    assert rp.skipped == ()


def test_a_prefetch_is_triggered_by_an_earlier_unpack():
    trace = trace_of("tiny_transformer")
    rp = export(plan_for("tiny_transformer", "vdnn"), trace)

    def first_bwd(index: int) -> int:
        b = trace.views[trace.saved[index].view].buffer
        return min(int(k) for k in trace.accesses_of(b) if trace.ops[k].phase is Phase.BACKWARD)

    triggered = [d for d in rp.saved if d.prefetch_after is not None]
    assert triggered
    for d in triggered:
        assert rp.saved[d.prefetch_after].action in (Action.KEEP, Action.OFFLOAD)
        assert first_bwd(d.prefetch_after) < first_bwd(d.index)


def test_recompute_with_dropout_checkpoints_the_blocks():
    trace = trace_of("tiny_transformer")
    rp = export(plan_for("tiny_transformer", "checkpoint"), trace, "checkpoint")
    assert rp.regions == ("blocks.0", "blocks.1")
    assert any(r.target == "aten.bernoulli_.float" for r in rp.recompute)
    planned = step("tiny_transformer", rp)
    assert_same_step(step("tiny_transformer"), planned)
    assert planned[3].recomputed_ops == len(rp.recompute) > 0
    assert planned[3].region_inputs == 2  # each block's input


def test_the_model_is_left_as_it_was():
    trace = trace_of("tiny_transformer")
    rp = export(plan_for("tiny_transformer", "checkpoint"), trace)
    net = copy.deepcopy(workload("tiny_transformer").model)
    step("tiny_transformer", rp, net=net)
    for m in net.modules():
        assert not m._forward_hooks and not m._forward_pre_hooks
        assert "forward" not in m.__dict__


# ---- models that are not the traced one ---------------------------------------------------
def test_a_model_without_the_traced_modules_is_refused_before_the_step():
    rp = export(plan_for("small_cnn", "vdnn"), trace_of("small_cnn"))
    with pytest.raises(RuntimePlanError, match="module 'block1.conv' of the trace is not in"):
        PlanRuntime(TinyResNet(), rp)


def test_a_container_without_a_forward_cannot_be_checkpointed():
    rp = export(plan_for("tiny_transformer", "checkpoint"), trace_of("tiny_transformer"))
    net = workload("tiny_transformer").model
    with pytest.raises(RuntimePlanError, match="'blocks' is a ModuleList without a forward"):
        PlanRuntime(net, dataclasses.replace(rp, regions=("blocks",)))


def test_a_model_saving_in_other_modules_fails_at_the_first_difference():
    rp = export(plan_for("mlp", "vdnn"), trace_of("mlp"))
    net = copy.deepcopy(workload("mlp").model)
    net.fc2 = nn.Sequential(net.fc2)  # the same maths, one module deeper
    with pytest.raises(RuntimePlanError, match=r"saved tensor #2: packed in module 'fc2.0'"):
        step("mlp", rp, net=net)


def test_a_step_that_saves_fewer_tensors_fails_at_its_end():
    rp = export(plan_for("mlp", "vdnn"), trace_of("mlp"))
    w = workload("mlp")
    net = MLP()
    with (
        pytest.raises(RuntimePlanError, match=r"saved 0 tensors .* first missing is #0"),
        PlanRuntime(net, rp).step(),
        torch.no_grad(),
    ):
        net(*w.inputs)


def test_another_batch_size_is_a_mismatch():
    rp = export(plan_for("mlp", "vdnn"), trace_of("mlp"))
    with pytest.raises(RuntimePlanError, match="storage has 25088 bytes, the trace recorded 12544"):
        step("mlp", rp, batch=8)


def test_apply_plan_needs_the_trace_of_a_plan():
    trace = trace_of("mlp")
    plan = plan_for("mlp", "vdnn")
    net = copy.deepcopy(workload("mlp").model)
    with pytest.raises(RuntimePlanError, match="needs its trace"):
        apply_plan(net, plan)
    w = workload("mlp")
    with apply_plan(net, plan, trace) as stats:
        w.loss_fn(net(*w.inputs), *w.targets).backward()
    assert stats.offloaded > 0


def test_a_runtime_plan_file_round_trips(tmp_path):
    rp = export(plan_for("tiny_transformer", "checkpoint"), trace_of("tiny_transformer"), "ck")
    for name in ("rt.json", "rt.json.gz"):
        save(rp, tmp_path / name)
        assert load(tmp_path / name) == rp
    (tmp_path / "bad.json").write_text('{"schema": "memplan.runtime/1", "saved": [{"index": 3}]}')
    with pytest.raises(RuntimePlanError, match=r"bad.json: saved\[0\].action: missing"):
        load(tmp_path / "bad.json")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("planner", ["vdnn", "checkpoint"])
def test_cuda_offload_and_recompute_give_the_plain_gradients(planner):
    model = "tiny_transformer"
    rp = export(plan_for(model, planner), trace_of(model))
    w = workload(model)

    def cuda_step(plan):
        net = copy.deepcopy(w.model).cuda()
        ctx = PlanRuntime(net, plan).step() if plan else contextlib.nullcontext()
        torch.manual_seed(1)
        with ctx as stats:
            loss = w.loss_fn(net(*(x.cuda() for x in w.inputs)), *(y.cuda() for y in w.targets))
            loss.backward()
        torch.cuda.synchronize()
        return loss.detach(), {n: p.grad for n, p in net.named_parameters()}, {}, stats

    assert_same_step(cuda_step(None), cuda_step(rp))

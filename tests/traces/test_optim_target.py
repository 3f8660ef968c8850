"""Optimizers as the described device runs them (NOTE [ Optimizer defaults ],
NOTE [ Fused Adam on meta ] in traces/optim.py): foreach by default for a
CUDA trace, one update per parameter elsewhere, and fused Adam on meta for a
target as one `_fused_adam_` over every parameter.

By hand, mlp (784 -> 512 -> 256 -> 10) has 6 parameters of P bytes in all; at
batch 2 its batch is 2 x 784 x 4 bytes of input and 2 x 8 of int64 labels,
alive until the step ends. Adam's step holds params, grads and both moments
(4 P) plus what the update makes:
- per parameter (foreach=False): sqrt and div of fc1.weight, 2 x W1;
- foreach: `_foreach_sqrt` of all six `exp_avg_sq` at once, P;
- fused: nothing; its six 0-d float32 `step` tensors are device state (24 B).
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from memplan.traces import optim
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.model import BufferKind, Phase, Trace
from memplan.traces.target import Target, TargetDevice
from memplan.traces.zoo import ZOO
from torch.optim.optimizer import _default_to_fused_or_foreach
from torch.utils._foreach_utils import _get_foreach_kernels_supported_devices

A100 = Target("a100-sxm-80gb", TargetDevice.CUDA, (8, 0))
MLP_PARAMS = 401_920 + 131_328 + 2_570  # elements: fc1, fc2, fc3 weights and biases
P = 4 * MLP_PARAMS
W1 = 4 * 784 * 512
BATCH_2 = 2 * 784 * 4 + 2 * 8


def _optimizer_ops(trace: Trace) -> list[str]:
    return [op.target for op in trace.ops if op.phase is Phase.OPTIMIZER]


def _step_peak(trace: Trace) -> int:
    """The most bytes alive at any op of the optimizer phase."""
    curve = trace.memory_curve()
    return max(int(curve[op.id]) for op in trace.ops if op.phase is Phase.OPTIMIZER)


# ---- the rule, without a capture -------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "given", "device", "foreach"),
    [
        ("adam", {}, TargetDevice.CUDA, True),
        ("sgd", {}, TargetDevice.CUDA, True),
        ("rmsprop", {}, TargetDevice.CUDA, True),
        ("adam", {}, TargetDevice.CPU, False),
        ("adam", {}, None, False),  # meta without a target
        ("adam", {"foreach": False}, TargetDevice.CUDA, False),  # theirs wins
        ("adam", {"fused": False}, TargetDevice.CUDA, False),  # torch: a flag given, no default
        ("adam", {"differentiable": True}, TargetDevice.CUDA, False),
        ("adafactor", {}, TargetDevice.CUDA, False),  # its step reads None as False
        ("adam", {"fused": True}, TargetDevice.CUDA, None),  # not combined with fused
        ("muon", {}, TargetDevice.CUDA, None),  # no foreach keyword
    ],
)  # fmt: skip
def test_foreach_default_follows_the_described_device(name, given, device, foreach):
    kwargs = optim.resolve_kwargs(name, given, 1e-3, device, meta=False)
    assert kwargs.get("foreach") == foreach


def test_torch_picks_foreach_on_cuda_only():
    # the facts the rule stands on, read from the installed torch
    assert "cuda" in _get_foreach_kernels_supported_devices()
    assert "cpu" not in _get_foreach_kernels_supported_devices()
    assert "meta" not in _get_foreach_kernels_supported_devices()
    cpu = [torch.zeros(2, requires_grad=True)]
    assert _default_to_fused_or_foreach(cpu, differentiable=False) == (False, False)


def test_capture_options_pass_the_described_device():
    assert CaptureOptions(target=A100).resolved_kwargs["foreach"] is True
    assert CaptureOptions().resolved_kwargs["foreach"] is False  # meta, no target
    assert CaptureOptions("cpu").resolved_kwargs["foreach"] is False
    assert CaptureOptions(target=A100).describes is TargetDevice.CUDA
    assert CaptureOptions().describes is None
    assert CaptureOptions("cpu").describes is TargetDevice.CPU


# ---- captures for a CUDA target ----------------------------------------------------------
def test_cuda_target_records_foreach_ops_by_default():
    trace = capture(ZOO["mlp"], 2, CaptureOptions(target=A100))
    ops = _optimizer_ops(trace)
    assert ops and all(t.startswith("aten._foreach_") for t in ops), ops
    assert trace.meta.optimizer_kwargs == {"lr": 1e-3, "foreach": True}
    sqrt = [op for op in trace.ops if op.target == "aten._foreach_sqrt.default"]
    assert len(sqrt) == 1 and len(sqrt[0].reads) == 6 and len(sqrt[0].writes) == 6
    assert trace.bytes_by_kind()[BufferKind.OTHER] == P  # the six square roots
    assert _step_peak(trace) == 5 * P + BATCH_2


def test_cuda_target_with_foreach_false_updates_one_parameter_at_a_time():
    opts = CaptureOptions(target=A100, optimizer_kwargs={"foreach": False})
    trace = capture(ZOO["mlp"], 2, opts)
    counts = Counter(_optimizer_ops(trace))
    assert counts["aten.addcdiv_.default"] == 6
    assert not any(t.startswith("aten._foreach_") for t in counts)
    assert trace.meta.optimizer_kwargs == {"lr": 1e-3, "foreach": False}
    assert _step_peak(trace) == 4 * P + 2 * W1 + BATCH_2


def test_without_target_meta_keeps_one_update_per_parameter():
    trace = capture(ZOO["mlp"], 2)
    assert Counter(_optimizer_ops(trace))["aten.addcdiv_.default"] == 6
    assert trace.meta.optimizer_kwargs == {"lr": 1e-3, "foreach": False}


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
def test_fused_on_meta_for_a_target_is_one_kernel_for_all_parameters(optimizer):
    opts = CaptureOptions(target=A100, optimizer=optimizer, optimizer_kwargs={"fused": True})
    trace = capture(ZOO["mlp"], 2, opts)
    kernel = f"aten._fused_{optimizer}_.default"
    # the steps' +1 (`_fused_adam` in torch/optim/adam.py), then the update
    assert _optimizer_ops(trace) == ["aten._foreach_add_.Scalar", kernel]
    (fused,) = (op for op in trace.ops if op.target == kernel)
    # reads params, grads, both moments, steps; writes all but the grads
    assert (len(fused.reads), len(fused.writes)) == (5 * 6, 4 * 6)
    assert trace.bytes_by_kind()[BufferKind.OPTIMIZER_STATE] == 2 * P + 6 * 4
    assert trace.bytes_by_kind()[BufferKind.OTHER] == 0
    assert _step_peak(trace) == 4 * P + 6 * 4 + BATCH_2
    assert trace.meta.optimizer_kwargs == {"lr": 1e-3, "fused": True}


def test_fused_state_is_created_inside_the_recorded_first_step():
    # warmup_iterations=0: the state is made where torch makes it, in step()
    kwargs = {"fused": True, "amsgrad": True}
    opts = CaptureOptions(target=A100, optimizer_kwargs=kwargs, warmup_iterations=0)
    trace = capture(ZOO["mlp"], 2, opts)
    counts = Counter(_optimizer_ops(trace))
    assert counts == {
        "aten.zeros.default": 6,  # steps
        "aten.zeros_like.default": 3 * 6,  # exp_avg, exp_avg_sq, max_exp_avg_sq
        "aten._foreach_add_.Scalar": 1,
        "aten._fused_adam_.default": 1,
    }
    # made in the optimizer phase, so `other` (NOTE [ Buffer kinds ] in capture.py)
    kinds = trace.bytes_by_kind()
    assert (kinds[BufferKind.OPTIMIZER_STATE], kinds[BufferKind.OTHER]) == (0, 3 * P + 6 * 4)


@pytest.mark.parametrize("amsgrad", [False, True])
def test_fused_state_on_meta_matches_torchs_own_on_cpu(amsgrad):
    """The state memplan creates on meta has the keys, shapes, dtypes and
    device placement torch's fused Adam creates on cpu, where it runs itself."""

    def state_after_one_step(device: str) -> list[dict]:
        layer = torch.nn.Linear(3, 2, device=device)
        kwargs = {"fused": True, "amsgrad": amsgrad, "lr": 1e-3}
        opt = optim.build("adamw", kwargs, layer.parameters(), "probe")
        for p in layer.parameters():
            p.grad = torch.ones_like(p)
        opt.step()
        return [
            {k: (tuple(v.shape), v.dtype, v.device == p.device) for k, v in opt.state[p].items()}
            for p in layer.parameters()
        ]

    assert state_after_one_step("meta") == state_after_one_step("cpu")


# ---- what stays refused (the one-line errors: tests/traces/test_capture_options.py) ------
def test_the_meta_kernels_the_rule_relies_on():
    # Adam's fused kernels run on meta; SGD's and Adagrad's do not (torch 2.13)
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    assert has("aten::_fused_adam_", "Meta") and has("aten::_fused_adamw_", "Meta")
    assert not has("aten::_fused_sgd_", "Meta") and not has("aten::_fused_adagrad_", "Meta")

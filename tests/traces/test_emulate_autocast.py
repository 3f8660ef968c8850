"""Autocast emulated on meta for a target (NOTE [ Autocast on meta ]) and
the GradScaler of an fp16 capture on meta (NOTE [ GradScaler on meta ]).

A cpu target is held against real cpu autocast, op for op and buffer for
buffer; a CUDA target, which no machine here runs, against dtypes and op
lists worked out by hand from autocast's cuda lists."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.emulate import Emulation
from memplan.traces.emulate.autocast import BANNED_ON_CUDA, CPU_POLICY, CUDA_POLICY
from memplan.traces.model import BufferKind, Phase
from memplan.traces.target import Target, TargetDevice
from memplan.traces.zoo import ZOO, Workload
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

CPU = Target("cpu-local", TargetDevice.CPU)
A100 = Target("a100-sxm-80gb", TargetDevice.CUDA, (8, 0))
BATCH, WIDTH, CLASSES = 8, 64, 16


def _per_buffer(trace) -> list[tuple]:
    return [(b.nbytes, b.kind, b.persistent, b.freed_after) for b in trace.buffers]


def _assert_same_trace(emulated, real) -> None:
    """The same op targets in order, and per buffer the same bytes, kind,
    persistence and last op; each op's reads and writes and the views'
    dtypes too."""
    assert [o.target for o in emulated.ops] == [o.target for o in real.ops]
    assert _per_buffer(emulated) == _per_buffer(real)
    assert [(o.reads, o.writes) for o in emulated.ops] == [(o.reads, o.writes) for o in real.ops]
    assert [v.dtype for v in emulated.views] == [v.dtype for v in real.views]


# Casts in forward and loss, by hand. small_cnn: the input and the three conv
# weights, the head's weight and bias, the logits to float32 for the loss (7).
# tiny_transformer, per block: qkv's bias, weight and input, proj's bias and
# weight, the float32 attention weights before `@ v`, fc1's three, fc2's two
# (11); then the head's three and the logits for the loss: 2 * 11 + 4 = 26.
@pytest.mark.parametrize(
    "model, amp, casts",
    [("small_cnn", "bf16", 7), ("tiny_transformer", "bf16", 26), ("tiny_transformer", "fp16", 26)],
)
def test_a_cpu_target_on_meta_captures_what_cpu_autocast_runs(model, amp, casts):
    emulated = capture(ZOO[model], 4, CaptureOptions(amp=amp, target=CPU), model_name=model)
    real = capture(ZOO[model], 4, CaptureOptions(device="cpu", amp=amp), model_name=model)
    _assert_same_trace(emulated, real)
    forward = [o for o in emulated.ops if o.phase is Phase.FORWARD]
    assert sum(o.target == "aten._to_copy.default" for o in forward) == casts


class Probe(nn.Module):
    """`fc` applied twice, layer_norm and softmax of its output, a head."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.ln = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(self.fc(x))
        return self.head(self.ln(h) * h.softmax(-1))


def probe(batch_size: int) -> Workload:
    x = torch.randn(batch_size, WIDTH)
    y = torch.randint(0, CLASSES, (batch_size,))
    return Workload(Probe().train(), (x,), (y,), F.cross_entropy)


def _capture_probe(amp: str, target: Target | None = None, **options):
    device = "meta" if target is not None else "cpu"
    opts = CaptureOptions(device=device, amp=amp, target=target, **options)
    return capture(probe, BATCH, opts, model_name="probe")


def _weight_casts(trace, name: str) -> list[int]:
    """The ops that cast parameter `name`."""
    (bid,) = [b.id for b in trace.buffers if b.name == name]
    return [
        o.id
        for o in trace.ops
        if o.target == "aten._to_copy.default" and bid in {trace.views[v].buffer for v in o.reads}
    ]


def test_a_weight_used_twice_is_cast_once_per_pass_and_the_cache_ends_with_it():
    """Two passes (accumulate=2): fc.weight is cast once per pass, twice in
    all, as cpu autocast does; everything else equals the cpu run too."""
    emulated = _capture_probe("bf16", CPU, accumulate=2)
    real = _capture_probe("bf16", accumulate=2)
    _assert_same_trace(emulated, real)
    casts = _weight_casts(emulated, "fc.weight")
    assert len(casts) == 2
    assert all(emulated.ops[i].phase is Phase.FORWARD for i in casts)
    (cast_view,) = emulated.ops[casts[0]].writes
    assert emulated.buffers[emulated.views[cast_view].buffer].nbytes == WIDTH * WIDTH * 2


def _written(trace, op) -> tuple[tuple[str, tuple[int, ...]], ...]:
    return tuple((trace.views[v].dtype, trace.views[v].shape) for v in op.writes)


def test_a_cuda_target_keeps_layer_norm_softmax_and_the_loss_in_float32():
    """Probe's forward and loss under CUDA's bf16 list, by hand: fc's bias,
    weight and input cast once for both calls; layer_norm (fp32) and softmax
    (fp32_set_opt_dtype) each read a float32 copy of h; the head casts its
    input back; cross_entropy is log_softmax in bf16 and nll_loss in fp32."""
    trace = _capture_probe("bf16", A100)
    bf, f32, B, W, C = "bfloat16", "float32", BATCH, WIDTH, CLASSES
    forward = [(o.target.removeprefix("aten."), _written(trace, o)) for o in trace.ops]
    forward = forward[: [o.phase for o in trace.ops].index(Phase.BACKWARD)]
    assert forward == [
        ("_to_copy.default", ((bf, (W,)),)),  # fc.bias
        ("_to_copy.default", ((bf, (W, W)),)),  # fc.weight
        ("_to_copy.default", ((bf, (B, W)),)),  # x
        ("addmm.default", ((bf, (B, W)),)),
        ("addmm.default", ((bf, (B, W)),)),  # the second call: cached casts
        ("_to_copy.default", ((f32, (B, W)),)),  # layer_norm: fp32
        ("native_layer_norm.default", ((f32, (B, W)), (f32, (B, 1)), (f32, (B, 1)))),
        ("_to_copy.default", ((f32, (B, W)),)),  # softmax(dtype=float32)
        ("_softmax.default", ((f32, (B, W)),)),
        ("mul.Tensor", ((f32, (B, W)),)),
        ("_to_copy.default", ((bf, (C,)),)),  # head.bias
        ("_to_copy.default", ((bf, (C, W)),)),  # head.weight
        ("_to_copy.default", ((bf, (B, W)),)),  # its input
        ("addmm.default", ((bf, (B, C)),)),
        ("_log_softmax.default", ((bf, (B, C)),)),  # dtype given: stays bf16
        ("_to_copy.default", ((f32, (B, C)),)),  # nll_loss: fp32
        ("nll_loss_forward.default", ((f32, ()), (f32, ()))),
    ]
    assert len(_weight_casts(trace, "fc.weight")) == 1


def test_fp16_on_a_cuda_target_records_the_grad_scaler_and_steps():
    """fp16: softmax of a float16 tensor into float32 is one `_softmax`
    with half_to_float (no float32 copy of h); the GradScaler's scale and
    growth tracker are persistent 4-byte buffers; backward starts with
    loss * scale; the optimizer phase unscales, steps, then updates."""
    trace = _capture_probe("fp16", A100)
    softmax = [o for o in trace.ops if o.target == "aten._softmax.default"]
    assert len(softmax) == 1 and softmax[0].args["args"][2] is True
    (read,) = softmax[0].reads
    assert trace.views[read].dtype == "float16" and _written(trace, softmax[0]) == (
        ("float32", (BATCH, WIDTH)),
    )
    assert trace.ops[softmax[0].id - 1].target == "aten.native_layer_norm.default"
    scaler = {b.name: b for b in trace.buffers if b.name.startswith("grad_scaler.")}
    assert {k: (b.nbytes, b.persistent) for k, b in scaler.items()} == {
        "grad_scaler.scale": (4, True),
        "grad_scaler.growth_tracker": (4, True),
    }
    backward = [o for o in trace.ops if o.phase is Phase.BACKWARD]
    assert backward[0].target == "aten.mul.Tensor"
    assert scaler["grad_scaler.scale"].id in {trace.views[v].buffer for v in backward[0].reads}
    optimizer = [o for o in trace.ops if o.phase is Phase.OPTIMIZER]
    targets = [o.target for o in optimizer]
    unscale = targets.index("aten._amp_foreach_non_finite_check_and_unscale_.default")
    assert targets[-1] == "aten._amp_update_scale_.default"
    params = {b.id for b in trace.buffers if b.kind is BufferKind.PARAM}
    updates = [
        i for i, o in enumerate(optimizer) if params & {trace.views[v].buffer for v in o.writes}
    ]
    assert updates and unscale < updates[0]  # the step was taken, after the unscale
    assert trace.meta.dtype == "float32"


# ---- single calls, against cpu autocast and by hand ---------------------------------------
class _Ops(TorchDispatchMode):
    """Every aten call: its name, the storages it reads (numbered as first
    seen) and the dtypes of its outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple[int, ...], tuple[str, ...]]] = []
        self.number: dict[int, int] = {}
        self.kept: list[torch.UntypedStorage] = []  # alive, so no address is reused

    def _numbers(self, tensors) -> tuple[int, ...]:  # noqa: ANN001
        numbers = []
        for t in tensors:
            storage = t.untyped_storage()
            if storage._cdata not in self.number:
                self.number[storage._cdata] = len(self.number)
                self.kept.append(storage)
            numbers.append(self.number[storage._cdata])
        return tuple(numbers)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        reads = self._numbers(t for t in tree_flatten((args, kwargs))[0] if _is_tensor(t))
        out = func(*args, **(kwargs or {}))
        outs = [t for t in tree_flatten(out)[0] if _is_tensor(t)]
        self._numbers(outs)
        dtypes = tuple(str(t.dtype).removeprefix("torch.") for t in outs)
        self.ops.append((str(func), reads, dtypes))
        return out


def _is_tensor(x: object) -> bool:
    return isinstance(x, torch.Tensor)


class _Calls(TorchFunctionMode):
    """The torch-level calls made by a mode entered after this one."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        self.names.append(getattr(func, "__name__", ""))
        return func(*args, **(kwargs or {}))


def _operands(device: str) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def make(*shape: int, grad: bool = False) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device).requires_grad_(grad)

    return {
        "x": make(4, 8),
        "w": make(8, 8, grad=True),
        "b": make(8, grad=True),
        "img": make(2, 3, 4, 4, 4),
        "k": make(2, 3, 3, 3, 3, grad=True),
        "y": torch.randint(0, 8, (4,), generator=g).to(device),
    }


CALLS = {
    "linear twice (cached weight)": lambda d: F.linear(F.linear(d["x"], d["w"], d["b"]), d["w"]),
    "matmul": lambda d: d["x"] @ d["w"],
    "rmatmul": lambda d: d["w"].__rmatmul__(d["x"]),
    "cat (promote)": lambda d: torch.cat([F.linear(d["x"], d["w"]), d["x"]]),
    "mse_loss (fp32)": lambda d: F.mse_loss(F.linear(d["x"], d["w"]), d["x"]),
    "cross_entropy (fp32)": lambda d: F.cross_entropy(F.linear(d["x"], d["w"]), d["y"]),
    "prod (fp32)": lambda d: F.linear(d["x"], d["w"]).prod(),
    "softmax (not on cpu's list)": lambda d: F.softmax(F.linear(d["x"], d["w"]), -1),
    "max_pool3d (fp32)": lambda d: F.max_pool3d(F.conv3d(d["img"], d["k"], padding=1), 2),
    "max_pool3d with indices": lambda d: F.max_pool3d(d["img"], 2, return_indices=True)[0],
    "pow, rpow": lambda d: (F.linear(d["x"], d["w"]) ** 2, 2 ** F.linear(d["x"], d["w"])),
    "out= is left alone": lambda d: torch.matmul(d["x"], d["x"].t(), out=d["x"].new_empty(4, 4)),
}


def _emulated(target: Target, dtype: torch.dtype, call) -> list:  # noqa: ANN001
    ops, em = _Ops(), Emulation(target)
    with em, em.autocast_region(dtype), ops:
        call()
    return ops.ops


@pytest.mark.parametrize("name", list(CALLS))
def test_single_calls_cast_as_cpu_autocast_does(name):
    real = _Ops()
    operands = _operands("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16), real:
        CALLS[name](operands)
    operands = _operands("meta")
    assert _emulated(CPU, torch.bfloat16, lambda: CALLS[name](operands)) == real.ops


def _mha(device: str) -> nn.MultiheadAttention:
    torch.manual_seed(0)
    return nn.MultiheadAttention(8, 2, batch_first=True, device=device)


def test_multihead_attention_is_cast_inside_as_autocast_does():
    """F.multi_head_attention_forward is one call to the mode; its body runs
    under it, so its linears, bmm and softmax are cast as on cpu; on CUDA
    its softmax is float32, so the averaged weights are float32 while the
    output (out_proj, a linear) is bf16."""
    real, x, mha = _Ops(), torch.randn(2, 5, 8), _mha("cpu")
    with torch.autocast("cpu", dtype=torch.bfloat16), real:
        mha(x, x, x)
    x, mha = torch.randn(2, 5, 8, device="meta"), _mha("meta")
    assert _emulated(CPU, torch.bfloat16, lambda: mha(x, x, x)) == real.ops
    em = Emulation(A100)
    with em, em.autocast_region(torch.bfloat16):
        out, weights = mha(x, x, x)
    assert (out.dtype, weights.dtype) == (torch.bfloat16, torch.float32)


def test_cuda_reductions_get_a_float32_dtype_unless_one_is_given():
    """fp32_set_opt_dtype (sum, softmax) and fp32_append_dtype (norm) on
    CUDA: float32 out of a bf16 input, unless the caller named a dtype."""
    h = torch.randn(4, 8, device="meta", dtype=torch.bfloat16)
    em = Emulation(A100)
    with em, em.autocast_region(torch.bfloat16):
        dtypes = [h.sum().dtype, h.sum(dtype=torch.bfloat16).dtype, torch.norm(h).dtype]
        dtypes += [F.log_softmax(h, -1, dtype=torch.bfloat16).dtype, h.exp().dtype]
    assert dtypes == [torch.float32, torch.bfloat16, torch.float32, torch.bfloat16, torch.float32]
    em = Emulation(CPU)
    with em, em.autocast_region(torch.bfloat16):  # none of these is on cpu's list
        assert [h.sum().dtype, torch.norm(h).dtype, h.exp().dtype] == [torch.bfloat16] * 3


@pytest.mark.parametrize("dims", [2, 3])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cuda_cross_entropy_is_rebuilt_op_for_op(dims, reduction, smoothing):
    """The rebuilt CUDA cross_entropy, run on cpu tensors (which the
    emulation never casts), calls the ops of the C++ composite in its order,
    forward and backward, and computes the same loss and grads."""
    torch.manual_seed(0)
    shape, y = (6, 5), torch.tensor([0, 1, 4, -100, 2, 3])
    if dims == 3:
        shape, y = (2, 5, 3), torch.tensor([[0, 1, -100], [2, 3, 4]])
    x = torch.randn(*shape, requires_grad=True)
    x_emulated = x.detach().clone().requires_grad_()
    real, emulated, calls = _Ops(), _Ops(), _Calls()
    with real:
        loss = F.cross_entropy(x, y, reduction=reduction, label_smoothing=smoothing).sum()
        loss.backward()
    em = Emulation(A100)
    with emulated:
        with calls, em, em.autocast_region(torch.bfloat16):
            loss_emulated = F.cross_entropy(
                x_emulated, y, reduction=reduction, label_smoothing=smoothing
            ).sum()
        loss_emulated.backward()
    # the rebuild ran (its calls reach the mode below), not the C++ composite
    assert "nll_loss_nd" in calls.names and "cross_entropy_loss" not in calls.names
    assert emulated.ops == real.ops
    assert torch.allclose(loss_emulated, loss) and torch.allclose(x_emulated.grad, x.grad)


def test_cuda_cross_entropy_is_float32_with_label_smoothing_too():
    """bf16 logits on CUDA: nll_loss casts to float32 and the smoothing
    term's sums get dtype=float32, so the loss is float32 either way."""
    logits = torch.randn(8, 16, device="meta", dtype=torch.bfloat16)
    y = torch.zeros(8, dtype=torch.long, device="meta")
    em = Emulation(A100)
    with em, em.autocast_region(torch.bfloat16):
        plain, smoothed = (
            F.cross_entropy(logits, y),
            F.cross_entropy(logits, y, label_smoothing=0.1),
        )
    assert (plain.dtype, smoothed.dtype) == (torch.float32, torch.float32)


def test_binary_cross_entropy_is_refused_on_cuda_and_float32_on_cpu():
    p = torch.rand(4, 8, device="meta", dtype=torch.bfloat16)
    em = Emulation(A100)
    with (
        em,
        em.autocast_region(torch.bfloat16),
        pytest.raises(RuntimeError, match="unsafe to autocast"),
    ):
        F.binary_cross_entropy(p, p)
    em = Emulation(CPU)
    with em, em.autocast_region(torch.bfloat16):
        assert F.binary_cross_entropy(p, p).dtype == torch.float32


@pytest.mark.parametrize(
    "policy, key, extra",
    [(CUDA_POLICY, "AutocastCUDA", set(BANNED_ON_CUDA)), (CPU_POLICY, "AutocastCPU", set())],
)
def test_the_lists_name_the_ops_torch_registers_for_autocast(policy, key, extra):
    """Every aten op the installed torch wraps for the device type has a
    policy here, and no other (overloads folded into their op's name).
    `_cudnn_rnn`, wrapped in CUDA builds only (AutocastRNN.cpp), is
    traces/emulate/rnn.py's."""
    registered = torch._C._dispatch_get_registrations_for_dispatch_key(key)
    names = {
        r.removeprefix("aten::").partition(".")[0] for r in registered if r.startswith("aten::")
    }
    assert set(policy) | extra == names - {"_cudnn_rnn"}

"""Recurrent layers on meta for a CUDA target: cuDNN's one fused kernel each
way (NOTE [ Recurrent layers on a CUDA target ] in traces/emulate/rnn.py),
its reserve (NOTE [ cuDNN reserve space ]), its weight buffer (NOTE [ cuDNN
weight buffer ]), the refusal for cpu targets; every size worked by hand."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from memplan.traces import io
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.emulate import HANDLERS, rnn
from memplan.traces.emulate.rnn import RnnMode, RnnShape
from memplan.traces.errors import TraceError
from memplan.traces.model import BufferKind, Phase, Trace
from memplan.traces.target import Target, TargetDevice
from memplan.traces.zoo import ZOO, Workload
from torch import nn
from torch.nn.utils.rnn import PackedSequence

from tests.fuzz.harness import assert_clean, run_cli

A100 = Target("a100-sxm-80gb", TargetDevice.CUDA, (8, 0))
V100 = Target("v100", TargetDevice.CUDA, (7, 0))
FORWARD, BACKWARD = "aten._cudnn_rnn.default", "aten._cudnn_rnn_backward.default"
# `_cudnn_rnn`'s positional arguments (its schema)
MODE, STRIDE0, HIDDEN, PROJ, LAYERS, BATCH_FIRST, TRAIN, BIDIR, BATCH_SIZES = (
    6, 2, 7, 8, 9, 10, 12, 13, 14
)  # fmt: skip


class _Last(nn.Module):
    """A recurrent layer whose output (a packed one's data) is the model's output."""

    def __init__(self, layer: nn.Module, batch_sizes: list[int] | None = None) -> None:
        super().__init__()
        self.rnn = layer
        self.batch_sizes = batch_sizes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.batch_sizes is None:
            return self.rnn(x)[0]
        return self.rnn(PackedSequence(x, torch.tensor(self.batch_sizes, device="cpu")))[0].data


def _workload(make: Callable[[], nn.Module], shape: tuple[int, ...], **kw: object):  # noqa: ANN202
    def factory(batch: int) -> Workload:
        layer = make()
        x = torch.randn(*shape, dtype=next(layer.parameters()).dtype)
        return Workload(_Last(layer, **kw), (x,), (), lambda out: out.float().sum())

    return factory


def _capture(workload, target: Target = A100, **options: object) -> Trace:  # noqa: ANN001
    return capture(workload, 4, CaptureOptions(target=target, **options))


def _only(trace: Trace, target: str):  # noqa: ANN202
    (op,) = [op for op in trace.ops if op.target == target]
    return op


def _nbytes(trace: Trace, view: int) -> int:
    return trace.buffers[trace.views[view].buffer].nbytes


def _shapes(trace: Trace, views: tuple[int, ...]) -> list[tuple[int, ...]]:
    return [trace.views[v].shape for v in views]


# ---- the zoo's LSTM on an A100 -----------------------------------------------------------
@pytest.fixture(scope="module")
def lstm() -> Trace:
    return capture(ZOO["lstm"], 16, CaptureOptions(target=A100), model_name="lstm")


def test_the_whole_stack_is_one_cudnn_rnn_forward_and_one_backward(lstm):
    """`_cudnn_impl` makes one `_cudnn_rnn` for both layers (num_layers=2 is
    its argument), not one per layer; autograd's backward is one
    `_cudnn_rnn_backward`. No per-step cell op is left."""
    targets = [(op.phase, op.target) for op in lstm.ops]
    assert targets.count((Phase.FORWARD, FORWARD)) == 1
    assert targets.count((Phase.BACKWARD, BACKWARD)) == 1
    assert sum(1 for _, t in targets if "rnn" in t) == 2
    assert not [t for _, t in targets if "sigmoid" in t or "tanh" in t]
    args = _only(lstm, FORWARD).args["args"]
    assert args[MODE] == 2 and args[STRIDE0] == 4  # LSTM; w_ih, w_hh, b_ih, b_hh
    assert (args[HIDDEN], args[PROJ], args[LAYERS]) == (64, 0, 2)
    assert (args[BATCH_FIRST], args[TRAIN], args[BIDIR], args[BATCH_SIZES]) == (
        True, True, False, []
    )  # fmt: skip


def test_the_fused_kernels_count_their_matmul_flops(lstm):
    """192 rows (12 steps x 16); per row, layer 1: 4 gates x 64 x (32 in +
    64 recurrent) = 24,576 multiply-adds, layer 2: 4 x 64 x (64 + 64) =
    32,768; forward 2 x 192 x 57,344 = 22,020,096 FLOPs, backward twice that."""
    assert _only(lstm, FORWARD).flops == 22_020_096
    assert _only(lstm, BACKWARD).flops == 44_040_192


def test_the_reserve_is_sized_by_the_rule_saved_and_freed_after_backward(lstm):
    """12 steps x 16 rows x (hidden of layer 1: 64 + 2 layers x 5 x 64) x 4 B
    = 192 x 704 x 4 = 540,672 B = 528 KiB; saved for backward, read by it
    and freed right after it."""
    fwd, bwd = _only(lstm, FORWARD), _only(lstm, BACKWARD)
    reserve = fwd.writes[3]
    assert lstm.views[reserve].dtype == "uint8"
    assert _nbytes(lstm, reserve) == 540_672 == 528 * 1024
    assert reserve in {s.view for s in lstm.saved}
    assert reserve in bwd.reads
    assert lstm.buffers[lstm.views[reserve].buffer].freed_after == bwd.id


def test_outputs_grads_and_the_flat_weights_have_their_shapes(lstm):
    """Forward: output (16, 12, 64), hy and cy (2, 16, 64). Backward: grads of
    the input (16, 12, 32), hx and cx, and of the 8 weights as views of one
    buffer of the weight space: 4 x 64 x (32 + 64) + 512 + 4 x 64 x 128 + 512
    = 58,368 floats = 233,472 B, the size of the one parameter buffer the
    LSTM's weights were flattened into. Adam then reads that grad buffer."""
    fwd, bwd = _only(lstm, FORWARD), _only(lstm, BACKWARD)
    assert _shapes(lstm, fwd.writes[:3]) == [(16, 12, 64), (2, 16, 64), (2, 16, 64)]
    assert _shapes(lstm, bwd.writes[:3]) == [(16, 12, 32), (2, 16, 64), (2, 16, 64)]
    weights = [(256, 32), (256, 64), (256,), (256,), (256, 64), (256, 64), (256,), (256,)]
    assert _shapes(lstm, bwd.writes[3:]) == weights
    grad_buffers = {lstm.views[v].buffer for v in bwd.writes[3:]}
    assert len(grad_buffers) == 1
    (grad,) = grad_buffers
    assert lstm.buffers[grad].kind is BufferKind.GRAD
    assert lstm.buffers[grad].nbytes == 58_368 * 4 == 233_472
    params = sorted(b.nbytes for b in lstm.buffers if b.kind is BufferKind.PARAM)
    assert params == [40, 2_560, 233_472]  # head bias, head weight, the LSTM
    optimizer_reads = {
        lstm.views[v].buffer for op in lstm.ops if op.phase is Phase.OPTIMIZER for v in op.reads
    }
    assert grad in optimizer_reads


def test_without_warm_up_the_recorded_step_is_the_same_kernel():
    trace = capture(ZOO["lstm"], 16, CaptureOptions(target=A100, warmup_iterations=0))
    assert [op.target for op in trace.ops if "rnn" in op.target] == [FORWARD, BACKWARD]
    assert _nbytes(trace, _only(trace, FORWARD).writes[3]) == 540_672


# ---- other layers: modes, stride0s, reserves by hand ---------------------------------------
@pytest.mark.parametrize(
    ("make", "shape", "mode", "stride0", "reserve", "hy"),
    [
        # 2 layers, 5 steps x 4 rows: 20 x (16 + 2 x 6 x 16) x 4 B
        (lambda: nn.GRU(8, 16, num_layers=2), (5, 4, 8), 3, 4, 20 * 208 * 4, (2, 4, 16)),
        # 1 layer, 2 directions: 20 x 2 x (5 x 16) x 4 B
        (lambda: nn.LSTM(8, 16, bidirectional=True, batch_first=True), (4, 5, 8), 2, 4,
         20 * 160 * 4, (2, 4, 16)),
        # projection to 4: 20 x (4 + 2 x 5 x 16) x 4 B; hy is 4 wide, cy 16
        (lambda: nn.LSTM(8, 16, num_layers=2, proj_size=4), (5, 4, 8), 2, 5, 20 * 164 * 4,
         (2, 4, 4)),
        # relu without biases: 20 x 16 x 4 B, 2 weights a layer
        (lambda: nn.RNN(8, 16, nonlinearity="relu", bias=False), (5, 4, 8), 0, 2, 20 * 16 * 4,
         (1, 4, 16)),
        (lambda: nn.RNN(8, 16), (5, 4, 8), 1, 4, 20 * 16 * 4, (1, 4, 16)),
    ],
    ids=["gru", "bidirectional_lstm", "proj_lstm", "rnn_relu_no_bias", "rnn_tanh"],
)  # fmt: skip
def test_each_layer_kind_is_one_fused_kernel(make, shape, mode, stride0, reserve, hy):
    trace = _capture(_workload(make, shape))
    fwd, bwd = _only(trace, FORWARD), _only(trace, BACKWARD)
    assert (fwd.args["args"][MODE], fwd.args["args"][STRIDE0]) == (mode, stride0)
    assert _nbytes(trace, fwd.writes[3]) == reserve
    assert trace.views[fwd.writes[1]].shape == hy
    assert trace.views[bwd.writes[0]].shape == shape  # grad of the input
    # grads of input and hx, cx for an LSTM, then one per weight
    n_state = 3 if mode == RnnMode.LSTM else 2
    assert len(bwd.writes) == n_state + len(list(make().parameters()))


def test_weight_grads_without_biases_are_one_tensor_each():
    """stride0 2 against cuDNN's 4: `_cudnn_rnn_backward_weight` copies into
    one new tensor per weight, (16, 8) and (16, 16) floats."""
    trace = _capture(_workload(lambda: nn.RNN(8, 16, bias=False), (5, 4, 8)))
    grads = _only(trace, BACKWARD).writes[2:]  # after the grads of input and hx
    assert [_nbytes(trace, v) for v in grads] == [16 * 8 * 4, 16 * 16 * 4]


def test_packed_input_reserves_by_its_rows():
    """batch_sizes 4, 3, 1: 8 rows x 6 x 16 x 4 B = 3,072 B; hy has
    batch_sizes[0] = 4 rows."""
    trace = _capture(_workload(lambda: nn.GRU(8, 16), (8, 8), batch_sizes=[4, 3, 1]))
    fwd = _only(trace, FORWARD)
    assert fwd.args["args"][BATCH_SIZES] == [4, 3, 1]
    assert _nbytes(trace, fwd.writes[3]) == 3_072
    assert _shapes(trace, fwd.writes[:2]) == [(8, 16), (1, 4, 16)]


def test_weights_not_in_one_buffer_are_copied_into_a_new_one_each_forward():
    """bfloat16 weights are not flattened (`cudnn.is_acceptable`), so
    `_cudnn_rnn` makes the weight buffer itself: 4 x 16 x (8 + 16) + 128 =
    1,664 bf16 = 3,328 B, saved for backward; the 4 parameters stay apart."""
    trace = _capture(_workload(lambda: nn.LSTM(8, 16).to(torch.bfloat16), (5, 4, 8)))
    fwd = _only(trace, FORWARD)
    assert _nbytes(trace, fwd.writes[4]) == 3_328
    assert fwd.writes[4] in {s.view for s in trace.saved}
    assert sum(1 for b in trace.buffers if b.kind is BufferKind.PARAM) == 4


def test_bfloat16_before_sm80_runs_the_per_step_cells():
    """`supportsBFloat16RNNWithCuDNN` needs sm 8.0: a V100 runs the cells."""
    trace = _capture(_workload(lambda: nn.LSTM(8, 16).to(torch.bfloat16), (5, 4, 8)), V100)
    assert not [op for op in trace.ops if "rnn" in op.target]
    assert [op for op in trace.ops if op.target == "aten.sigmoid_.default"]


def test_autocast_copies_the_weights_to_float16_and_halves_the_reserve():
    """`_cudnn_rnn_cast_reflatten`: float16 even under bf16 autocast; the
    reserve at 2 B a value is 270,336 B, half the float32 one; one zeroed
    float16 weight buffer of 58,368 values holds the 8 weight copies, and
    `_cudnn_rnn` reads it."""
    trace = capture(ZOO["lstm"], 16, CaptureOptions(target=A100, amp="bf16"))
    fwd = _only(trace, FORWARD)
    assert trace.views[fwd.reads[0]].dtype == "float16"
    assert _nbytes(trace, fwd.writes[3]) == 270_336
    copies = [op for op in trace.ops if op.target == "aten.copy_.default"]
    assert len(copies) == 8
    (flat,) = {trace.views[op.writes[0]].buffer for op in copies}
    assert trace.buffers[flat].nbytes == 58_368 * 2
    assert {trace.views[v].dtype for v in fwd.reads if trace.views[v].buffer == flat} == {"float16"}


# ---- the rules, against independent figures --------------------------------------------
@pytest.mark.parametrize("make", [lambda: nn.LSTM(32, 64, 2), lambda: nn.GRU(8, 16, 3, bidirectional=True),
                                  lambda: nn.LSTM(8, 16, 2, proj_size=4), lambda: nn.RNN(5, 7)])  # fmt: skip
def test_the_weight_space_holds_exactly_a_module_with_biases(make):
    """With biases, every slot is a parameter: the total is torch's own count."""
    mod = make()
    shape = RnnShape(rnn.MODULE_MODES[mod.mode], mod.input_size, mod.hidden_size, mod.proj_size,
                     mod.num_layers, mod.bidirectional)  # fmt: skip
    assert shape.weight_numel() == sum(p.numel() for p in mod.parameters())
    offsets = shape.offsets(True)
    assert offsets[0] == 0 and offsets == sorted(offsets)


def test_the_reserve_rule_gives_the_sizes_cudnn_reported():
    """pytorch/pytorch#2895: cuDNN 7 on a P100 reported reserves of
    736,000,000 B (LSTM) and 864,000,000 B (GRU) for models of 3,038,090 and
    2,279,370 parameters. Those counts are a 4-layer RNN of 320 units on 123
    features plus a Linear(320, 10) head (checked here on torch's modules);
    25,000 rows (steps x batch) make both sizes exact."""
    assert sum(p.numel() for p in nn.LSTM(123, 320, 4).parameters()) + 3_210 == 3_038_090
    assert sum(p.numel() for p in nn.GRU(123, 320, 4).parameters()) + 3_210 == 2_279_370
    lstm = RnnShape(RnnMode.LSTM, 123, 320, 0, 4, False)
    gru = RnnShape(RnnMode.GRU, 123, 320, 0, 4, False)
    assert lstm.reserve_bytes(25_000, 4) == 736_000_000
    assert gru.reserve_bytes(25_000, 4) == 864_000_000


def test_the_handlers_cover_what_nn_rnnbase_calls():
    assert {HANDLERS[f] for f in (torch._VF.lstm, torch._VF.gru, torch._VF.rnn_tanh,
                                  torch._VF.rnn_relu)} == {rnn._fused}  # fmt: skip
    assert rnn.meta_kernels(A100).keys() == {FORWARD, BACKWARD}
    assert rnn.meta_kernels(Target("cpu-local", TargetDevice.CPU)) == {}


def test_the_backward_kernel_follows_output_mask_and_missing_grads():
    """Input, hx, cx grads always; no weight grads unless asked; nothing at
    all without any incoming grad (native/cudnn/RNN.cpp)."""
    m = torch.device("meta")
    x, hx, cx = (
        torch.empty(5, 4, 8, device=m),
        torch.empty(1, 4, 16, device=m),
        torch.empty(1, 4, 16, device=m),
    )
    weights = [torch.empty(64, 8, device=m), torch.empty(64, 16, device=m)]
    buf, out, reserve = torch.empty(64 * 24 + 128, device=m), torch.empty(5, 4, 16, device=m), None
    args = [x, weights, 2, buf, hx, cx, out, out, None, None, 2, 16, 0, 1, False, 0.0, True, False,
            [], None, reserve, [True, True, True, False]]  # fmt: skip
    dx, dhx, dcx, dw = rnn._cudnn_rnn_backward(*args)
    assert (dx.shape, dhx.shape, dcx.shape, dw) == (x.shape, hx.shape, cx.shape, [])
    args[7] = None
    assert rnn._cudnn_rnn_backward(*args) == (None, None, None, [None, None])


# ---- refusals and the command line --------------------------------------------------------
def test_a_cpu_target_is_refused_naming_cpu():
    with pytest.raises(TraceError) as e:
        capture(ZOO["lstm"], 4, CaptureOptions(target=Target("cpu-local", TargetDevice.CPU)),
                model_name="lstm")  # fmt: skip
    assert str(e.value) == (
        "workload 'lstm': LSTM at 'lstm': meta does not emulate the fused oneDNN kernel cpu "
        "target cpu-local runs (NOTE [ Recurrent layers on meta ]): capture with --device cpu"
    )


def test_the_cli_captures_an_lstm_for_a_gpu_and_reads_it_back(tmp_path):
    out = str(tmp_path / "l.json.gz")
    o = run_cli(["capture", "--model", "lstm", "--batch", "16", "--target", "a100-sxm-80gb",
                 "--out", out], 60.0)  # fmt: skip
    assert_clean(o)
    assert o.code == 0, o.stderr
    trace = io.load(out)
    assert [op.target for op in trace.ops if "rnn" in op.target] == [FORWARD, BACKWARD]
    o = run_cli(["inspect", out], 30.0)
    assert o.code == 0, o.stderr
    assert "a100-sxm-80gb (cuda, sm 8.0)" in o.stdout

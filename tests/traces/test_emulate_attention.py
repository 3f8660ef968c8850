"""SDPA under a target (traces/emulate/attention.py): the backend table of
NOTE [ SDPA backend selection ] worked by hand, the fused op and its backward
in a meta capture for a CUDA target, the philox outputs, pinned backends, and
a meta capture for the cpu target equal to a real cpu capture."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.emulate import attention, dispatch_rules, sdpa_selection
from memplan.traces.errors import TraceError
from memplan.traces.model import Phase
from memplan.traces.target import AttentionBackend as B
from memplan.traces.target import Target, TargetDevice
from memplan.traces.zoo import Workload
from torch import nn

FLASH_OP = "aten._scaled_dot_product_flash_attention.default"
FLASH_BWD = "aten._scaled_dot_product_flash_attention_backward.default"
EFFICIENT_OP = "aten._scaled_dot_product_efficient_attention.default"
CPU_FLASH_OP = "aten._scaled_dot_product_flash_attention_for_cpu.default"

A100 = Target("a100-sxm-80gb", TargetDevice.CUDA, (8, 0))
CPU = Target("cpu-local", TargetDevice.CPU)


def cuda(cc: tuple[int, int], pin: B = B.AUTO) -> Target:
    return Target(f"sm{cc[0]}{cc[1]}", TargetDevice.CUDA, cc, pin)


def qkv(dtype, d=64, heads=4, kv_heads=None, s_q=128, s_k=None, grad=False):
    """Meta query, key, value of batch 2."""
    s_k = s_q if s_k is None else s_k
    kv_heads = heads if kv_heads is None else kv_heads
    q = torch.empty(2, heads, s_q, d, dtype=dtype, device="meta", requires_grad=grad)
    k = torch.empty(2, kv_heads, s_k, d, dtype=dtype, device="meta", requires_grad=grad)
    v = torch.empty(2, kv_heads, s_k, d, dtype=dtype, device="meta", requires_grad=grad)
    return q, k, v


BF16, FP16, FP32 = torch.bfloat16, torch.float16, torch.float32
MASK = torch.ones(128, 128, dtype=torch.bool, device="meta")

# (target, inputs, call keywords, expected): each row's reason is the first
# filter of NOTE [ SDPA filters ] that decides it.
TABLE = [
    pytest.param(A100, qkv(BF16), {}, B.FLASH, id="sm80-bf16-flash"),
    pytest.param(A100, qkv(FP32), {}, B.EFFICIENT, id="sm80-fp32-flash-takes-16-bit-only"),
    pytest.param(cuda((7, 0)), qkv(FP16), {}, B.EFFICIENT, id="sm70-fp16-flash-needs-sm80"),
    pytest.param(cuda((7, 0)), qkv(BF16), {}, B.MATH, id="sm70-bf16-efficient-bf16-needs-sm80"),
    pytest.param(cuda((9, 0)), qkv(BF16), {}, B.FLASH, id="sm90-bf16-cudnn-not-preferred"),
    pytest.param(A100, qkv(BF16, d=300), {}, B.MATH, id="hd300-over-256-and-not-8-aligned"),
    pytest.param(A100, qkv(BF16, d=264), {}, B.EFFICIENT, id="hd264-over-256-but-8-aligned"),
    pytest.param(A100, qkv(BF16), {"attn_mask": MASK}, B.EFFICIENT, id="mask-flash-takes-none"),
    pytest.param(A100, qkv(BF16), {"dropout_p": 0.1}, B.FLASH, id="dropout-flash-takes-it"),
    pytest.param(A100, qkv(FP32), {"dropout_p": 0.1}, B.EFFICIENT, id="fp32-dropout-efficient"),
    pytest.param(
        A100, qkv(BF16, heads=8, kv_heads=2), {"enable_gqa": True}, B.FLASH, id="gqa-flash"
    ),
    pytest.param(
        A100, qkv(FP32, heads=8, kv_heads=2), {"enable_gqa": True}, B.MATH, id="gqa-fp32-math"
    ),
    pytest.param(A100, qkv(BF16, heads=8, kv_heads=2), {}, B.MATH, id="gqa-without-enable_gqa"),
    pytest.param(cuda((8, 6)), qkv(BF16, d=200, grad=True), {}, B.EFFICIENT, id="sm86-train-hd200"),
    pytest.param(cuda((8, 6)), qkv(BF16, d=200), {}, B.FLASH, id="sm86-inference-hd200"),
    pytest.param(
        A100, qkv(BF16, s_q=64, s_k=128), {"is_causal": True}, B.EFFICIENT, id="causal-non-square"
    ),
    pytest.param(cuda((6, 1)), qkv(FP16, d=60), {}, B.EFFICIENT, id="sm61-fp16-align-1"),
    pytest.param(cuda((7, 0)), qkv(FP16, d=60), {}, B.MATH, id="sm70-fp16-align-8"),
    pytest.param(cuda((7, 0)), qkv(FP32, d=60), {}, B.EFFICIENT, id="sm70-fp32-align-1"),
    pytest.param(A100, qkv(FP32, d=62), {}, B.MATH, id="sm80-fp32-align-4-hd62"),
    pytest.param(A100, qkv(FP32, d=60), {}, B.EFFICIENT, id="sm80-fp32-align-4-hd60"),
    pytest.param(CPU, qkv(FP32), {}, B.FLASH, id="cpu-fp32-flash"),
    pytest.param(CPU, qkv(FP32, d=60), {}, B.FLASH, id="cpu-any-head-dim"),
    pytest.param(CPU, qkv(FP32), {"dropout_p": 0.1}, B.MATH, id="cpu-dropout-math"),
    pytest.param(
        CPU,
        qkv(FP32),
        {"attn_mask": torch.ones(2, 128, 128, dtype=torch.bool, device="meta")},
        B.MATH,
        id="cpu-3d-mask-math",
    ),
    pytest.param(
        CPU, qkv(BF16, heads=8, kv_heads=2), {"enable_gqa": True}, B.FLASH, id="cpu-gqa-flash"
    ),
]


@pytest.mark.parametrize(("target", "tensors", "kwargs", "expected"), TABLE)
def test_backend_table(target, tensors, kwargs, expected):
    assert attention.select_backend(target, *tensors, **kwargs) is expected


def test_cudnn_is_tried_last_at_cudnn_9_10():
    # a CUDA 12.x wheel's cuDNN 9.10 is not newer than 9.15: the default order
    assert attention.CUDNN_VERSION == 91002
    assert not attention.prefers_cudnn(cuda((9, 0)))
    assert attention.priority_order(cuda((9, 0))) == (B.FLASH, B.EFFICIENT, B.MATH, B.CUDNN)
    assert attention.priority_order(CPU) == (B.FLASH, B.MATH)


def test_a_cudnn_newer_than_9_15_goes_first_on_sm90_only(monkeypatch):
    # read where selection runs (traces/emulate/sdpa_selection.py), not attention's re-export
    monkeypatch.setattr(sdpa_selection, "CUDNN_VERSION", 91600)
    assert attention.priority_order(cuda((9, 0)))[0] is B.CUDNN
    assert attention.select_backend(cuda((9, 0)), *qkv(BF16)) is B.CUDNN
    assert attention.select_backend(cuda((8, 0)), *qkv(BF16)) is B.FLASH
    assert attention.select_backend(cuda((8, 9)), *qkv(BF16)) is B.FLASH


@pytest.mark.parametrize(
    ("target", "tensors", "kwargs", "reason"),
    [
        (cuda((8, 0), B.CUDNN), qkv(BF16, d=192), {}, "head dims up to 128, got 192/192"),
        (
            cuda((8, 0), B.FLASH),
            qkv(BF16),
            {"attn_mask": MASK},
            "flash attention takes no attn_mask",
        ),
        (cuda((7, 5), B.FLASH), qkv(FP16), {}, "needs sm 8.0..12.1, sm75 is sm 7.5"),
        (cuda((8, 0), B.EFFICIENT), qkv(BF16, d=60), {}, "multiples of 8"),
        (Target("c", TargetDevice.CPU, None, B.FLASH), qkv(FP32), {"dropout_p": 0.5}, "no dropout"),
    ],
)
def test_a_pinned_backend_that_cannot_run_is_a_one_line_error(target, tensors, kwargs, reason):
    with pytest.raises(TraceError) as err:
        attention.select_backend(target, *tensors, **kwargs)
    msg = str(err.value)
    assert "\n" not in msg and "no available kernel" in msg and reason in msg
    assert "test_emulate_attention.py:" in msg  # where the call was made


def test_a_pinned_backend_that_can_run_is_used():
    assert attention.select_backend(cuda((9, 0), B.CUDNN), *qkv(BF16)) is B.CUDNN
    assert attention.select_backend(cuda((8, 0), B.MATH), *qkv(BF16)) is B.MATH
    assert attention.select_backend(cuda((8, 0), B.EFFICIENT), *qkv(BF16)) is B.EFFICIENT


def test_host_outputs_are_the_efficient_philox_pair_on_cuda_only():
    # NOTE [ Philox outputs on the host ]: flash's and cuDNN's live on the GPU
    assert dict(attention.host_outputs(A100)) == {EFFICIENT_OP: (2, 3)}
    assert dict(attention.host_outputs(CPU)) == {}
    assert dict(dispatch_rules(A100).host_outputs) == {EFFICIENT_OP: (2, 3)}


# ---- captures ----------------------------------------------------------------
class SelfAttention(nn.Module):
    """One causal attention layer: `heads` query heads of `head_dim`,
    `kv_heads` key/value heads (GQA when fewer), or a bool mask instead of
    is_causal."""

    def __init__(self, heads=4, kv_heads=4, head_dim=64, p=0.0, mask=False):
        super().__init__()
        self.h, self.kv, self.d, self.p, self.mask = heads, kv_heads, head_dim, p, mask
        self.q = nn.Linear(heads * head_dim, heads * head_dim, bias=False)
        self.kv_proj = nn.Linear(heads * head_dim, 2 * kv_heads * head_dim, bias=False)
        self.out = nn.Linear(heads * head_dim, heads * head_dim, bias=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.h, self.d).transpose(1, 2)
        k, v = self.kv_proj(x).view(b, s, 2, self.kv, self.d).permute(2, 0, 3, 1, 4)
        mask = torch.ones(s, s, dtype=torch.bool, device=x.device).tril() if self.mask else None
        o = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.p, is_causal=not self.mask,
            enable_gqa=self.kv != self.h,
        )  # fmt: skip
        return self.out(o.transpose(1, 2).reshape(b, s, -1))


def attention_layer(dtype, seq, **kw):
    def factory(batch):
        model = SelfAttention(**kw).to(dtype)
        x = torch.randn(batch, seq, model.h * model.d, dtype=dtype)
        return Workload(model, (x,), (), lambda y: y.float().square().mean())

    return factory


def square_views(trace, seq):
    return [v for v in trace.views if tuple(v.shape[-2:]) == (seq, seq)]


def test_flash_on_a100_keeps_no_seq_by_seq_matrix_and_saves_the_logsumexp():
    # batch 2, heads 4, seq 128, head dim 64, bf16
    factory = attention_layer(torch.bfloat16, 128)
    meta = capture(factory, 2, CaptureOptions(device="meta"))
    flash = capture(factory, 2, CaptureOptions(device="meta", target=A100))
    assert square_views(meta, 128)  # meta's own dispatch: math, scores and probabilities
    assert square_views(flash, 128) == []
    ops = {o.target: o for o in flash.ops}
    assert ops[FLASH_OP].phase is Phase.FORWARD and ops[FLASH_BWD].phase is Phase.BACKWARD
    # logsumexp: (batch, heads, seq) fp32 = 2 * 4 * 128 * 4 bytes, saved for backward
    lse = [v for v in flash.views if v.shape == (2, 4, 128)]
    assert [v.dtype for v in lse] == ["float32"]
    assert flash.buffers[lse[0].buffer].nbytes == 4096
    assert lse[0].id in ops[FLASH_OP].writes and lse[0].id in ops[FLASH_BWD].reads
    assert lse[0].id in {s.view for s in flash.saved}
    # flash's philox state is on the GPU (16 + 8 bytes), read by the backward
    philox = [v for v in flash.views if v.dtype == "uint64"]
    assert sorted(flash.buffers[v.buffer].nbytes for v in philox) == [8, 16]
    assert all(v.id in ops[FLASH_BWD].reads for v in philox)


def test_efficient_philox_outputs_are_not_buffers():
    factory = attention_layer(torch.bfloat16, 128, p=0.25)
    trace = capture(factory, 2, CaptureOptions(device="meta", target=cuda((8, 0), B.EFFICIENT)))
    op = next(o for o in trace.ops if o.target == EFFICIENT_OP)
    # only the output (2*4*128*64 bf16 = 128 KiB) and the logsumexp (2*4*128 fp32 = 4 KiB)
    written = sorted(trace.buffers[trace.views[w].buffer].nbytes for w in op.writes)
    assert written == [4096, 131072]
    assert not [v for v in trace.views if v.dtype == "int64" and v.shape == ()]


def test_flash_pads_a_head_dim_that_is_not_a_multiple_of_8():
    # head dim 60 -> 64: q, k, v padded (3 constant_pad_nd), the output sliced back
    factory = attention_layer(torch.bfloat16, 128, head_dim=60)
    trace = capture(factory, 2, CaptureOptions(device="meta", target=A100))
    forward = [o.target for o in trace.ops if o.phase is Phase.FORWARD]
    i = forward.index(FLASH_OP)
    assert forward[i - 3 : i] == ["aten.constant_pad_nd.default"] * 3
    padded = trace.views[next(o for o in trace.ops if o.target == FLASH_OP).reads[0]]
    assert padded.shape == (2, 4, 128, 64)


def test_a_pinned_backend_that_cannot_run_stops_the_capture_in_one_line():
    factory = attention_layer(torch.float16, 128)
    with pytest.raises(TraceError) as err:
        capture(factory, 2, CaptureOptions(device="meta", target=cuda((7, 0), B.FLASH)))
    msg = str(err.value)
    assert "\n" not in msg and "no available kernel" in msg and "sm 8.0..12.1" in msg
    assert "test_emulate_attention.py:" in msg


def signature(trace):
    ops = [(o.target, o.phase, o.reads, o.writes, o.module) for o in trace.ops]
    buffers = [(b.nbytes, b.kind, b.persistent, b.name, b.freed_after) for b in trace.buffers]
    views = [(v.buffer, v.shape, v.stride, v.offset, v.dtype) for v in trace.views]
    return ops, buffers, views


@pytest.mark.parametrize("kw", [{"kv_heads": 2}, {"mask": True}], ids=["causal-gqa", "bool-mask"])
def test_meta_for_the_cpu_target_equals_a_real_cpu_capture(kw):
    # fp32, batch 2, seq 16, 4 heads of 16: cpu runs its fused flash kernel
    factory = attention_layer(torch.float32, 16, head_dim=16, **kw)
    real = capture(factory, 2, CaptureOptions(device="cpu", target=CPU))
    emulated = capture(factory, 2, CaptureOptions(device="meta", target=CPU))
    plain = capture(factory, 2, CaptureOptions(device="meta"))
    assert CPU_FLASH_OP in {o.target for o in real.ops}
    assert signature(emulated) == signature(real)
    assert signature(plain) != signature(real)  # meta's own dispatch is math


def test_tiny_llama_sdpa_runs_flash_and_eager_keeps_the_scores():
    tf = pytest.importorskip("transformers")
    from memplan.traces.workload import output_loss, with_labels

    def factory(impl):
        def build(batch):
            config = tf.LlamaConfig(
                hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                attn_implementation=impl,
            )  # fmt: skip
            model = with_labels(tf.LlamaForCausalLM)(config).to(torch.bfloat16)
            ids = torch.randint(0, 256, (batch, 64))
            return Workload(model.train(), (ids, ids), (), output_loss)

        return build

    sdpa = capture(factory("sdpa"), 2, CaptureOptions(device="meta", target=A100))
    eager = capture(factory("eager"), 2, CaptureOptions(device="meta", target=A100))
    targets = [o.target for o in sdpa.ops]
    assert targets.count(FLASH_OP) == 2 and targets.count(FLASH_BWD) == 2
    assert square_views(sdpa, 64) == [] and square_views(eager, 64)

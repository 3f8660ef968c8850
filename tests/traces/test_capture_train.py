"""Capture of what people train (issue 18, item 4): AdamW, SGD without
momentum, bf16 autocast, fp16 with a GradScaler, gradient accumulation.

Parameter, gradient and optimizer-state bytes are worked out by hand from the
models' parameter shapes; the trace's framework peak is held against
`torch.profiler` on the same step run by plain PyTorch code written here
(NOTE [ The profiler's peak without kernel scratch ])."""

from __future__ import annotations

import bisect
import math

import pytest
import torch
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.errors import TraceError
from memplan.traces.model import DTYPE_BYTES, Amp, BufferKind, Phase
from memplan.traces.zoo import ZOO, Workload
from torch import nn
from torch.profiler import ProfilerActivity, profile

# Parameters by hand. mlp: 784*512+512 + 512*256+256 + 256*10+10 (6 tensors).
# small_cnn: convs 3*16*9 + 16*32*9 + 32*64*9, BatchNorm weights and biases
# 2*(16+32+64), head 1024*10+10 (11 tensors).
N_PARAMS = {"mlp": 401_920 + 131_328 + 2_570, "small_cnn": 432 + 4_608 + 18_432 + 224 + 10_250}
N_TENSORS = {"mlp": 6, "small_cnn": 11}
BATCH = 8


def _capture(model: str, device: str = "cpu", **options):
    return capture(ZOO[model], BATCH, CaptureOptions(device=device, **options), model_name=model)


def _kind_bytes(trace) -> dict[BufferKind, int]:
    return trace.bytes_by_kind()


def _written(trace, op):
    return [trace.buffers[trace.views[v].buffer] for v in op.writes]


# ---- optimizers ------------------------------------------------------------------------
@pytest.mark.parametrize("model", ["mlp", "small_cnn"])
def test_adamw_keeps_two_moments_and_decays_every_parameter(model):
    trace = _capture(model, optimizer="AdamW", optimizer_kwargs={"weight_decay": 0.01})
    n = N_PARAMS[model]
    by_kind = _kind_bytes(trace)
    assert by_kind[BufferKind.PARAM] == by_kind[BufferKind.GRAD] == 4 * n
    assert by_kind[BufferKind.OPTIMIZER_STATE] == 8 * n  # exp_avg + exp_avg_sq, float32
    assert trace.meta.optimizer == "adamw"
    assert trace.meta.optimizer_kwargs == {"lr": 1e-3, "foreach": False, "weight_decay": 0.01}
    # decoupled decay (param *= 1 - lr*wd) and the update: two writes per parameter
    param_writes = [
        op
        for op in trace.ops
        if op.phase is Phase.OPTIMIZER
        and any(b.kind is BufferKind.PARAM for b in _written(trace, op))
    ]
    assert len(param_writes) == 2 * N_TENSORS[model]


def test_sgd_with_and_without_momentum():
    """`optimizer="sgd"` keeps its momentum 0.9 (NOTE [ Optimizer defaults ]):
    one float32 buffer per parameter; momentum=0 is plain SGD, no state, and
    one `add_` per parameter."""
    n = N_PARAMS["mlp"]
    with_momentum = _capture("mlp", optimizer="sgd")
    assert with_momentum.meta.optimizer_kwargs["momentum"] == 0.9
    assert _kind_bytes(with_momentum)[BufferKind.OPTIMIZER_STATE] == 4 * n
    plain = _capture("mlp", optimizer="sgd", optimizer_kwargs={"momentum": 0})
    assert plain.meta.optimizer_kwargs == {"lr": 1e-3, "foreach": False, "momentum": 0}
    assert _kind_bytes(plain)[BufferKind.OPTIMIZER_STATE] == 0
    assert not any(b.kind is BufferKind.OPTIMIZER_STATE for b in plain.buffers)
    steps = [op.target for op in plain.ops if op.phase is Phase.OPTIMIZER]
    assert steps == ["aten.add_.Tensor"] * N_TENSORS["mlp"]


# ---- mixed precision -------------------------------------------------------------------
def _bytes_follow_dtypes(trace) -> None:
    """Every buffer an op creates, seen whole by a contiguous view, holds
    exactly numel x the bytes of that view's dtype."""
    checked = 0
    for v in trace.views:
        b = trace.buffers[v.buffer]
        contiguous = all(
            st == math.prod(v.shape[i + 1 :]) for i, st in enumerate(v.stride) if v.shape[i] > 1
        )
        if b.persistent or v.offset or not contiguous or not v.shape:
            continue
        if b.nbytes == math.prod(v.shape) * DTYPE_BYTES[v.dtype]:
            checked += 1
        else:  # a view of part of a buffer: never more than the buffer
            assert math.prod(v.shape) * DTYPE_BYTES[v.dtype] < b.nbytes, (v, b)
    assert checked > 10


def test_bf16_autocast_runs_forward_in_bf16_and_keeps_float32_grads_and_state():
    """mlp at batch 8 under bf16 autocast (cpu): the first ops cast fc1's bias
    (512 x 2 B), its weight (512 x 784 x 2 B) and the input (8 x 784 x 2 B)
    to bf16, and the first addmm writes 8 x 512 bf16 values. Parameters,
    grads and Adam's moments stay float32."""
    trace = _capture("mlp", amp="bf16")
    n = N_PARAMS["mlp"]
    assert trace.meta.amp is Amp.BF16 and trace.meta.dtype == "float32"
    by_kind = _kind_bytes(trace)
    assert (by_kind[BufferKind.PARAM], by_kind[BufferKind.GRAD]) == (4 * n, 4 * n)
    assert by_kind[BufferKind.OPTIMIZER_STATE] == 8 * n
    casts = [(op.target, [(b.nbytes, b.kind) for b in _written(trace, op)]) for op in trace.ops[:4]]
    act = BufferKind.ACTIVATION
    assert casts == [
        ("aten._to_copy.default", [(512 * 2, act)]),
        ("aten._to_copy.default", [(512 * 784 * 2, act)]),
        ("aten._to_copy.default", [(BATCH * 784 * 2, act)]),
        ("aten.addmm.default", [(BATCH * 512 * 2, act)]),
    ]
    assert {trace.views[v].dtype for op in trace.ops[:4] for v in op.writes} == {"bfloat16"}
    grads = [b for b in trace.buffers if b.kind is BufferKind.GRAD]
    grad_dtypes = {v.dtype for v in trace.views if trace.buffers[v.buffer].kind is BufferKind.GRAD}
    assert len(grads) == N_TENSORS["mlp"] and grad_dtypes == {"float32"}
    _bytes_follow_dtypes(trace)


def test_bf16_convolutions_write_bf16_activations():
    """small_cnn's first convolution at batch 8: 8 x 16 x 32 x 32 bf16 values."""
    trace = _capture("small_cnn", amp="bf16")
    conv = next(op for op in trace.ops if op.target == "aten.convolution.default")
    (out,) = [trace.views[v] for v in conv.writes]
    assert out.dtype == "bfloat16" and trace.buffers[out.buffer].nbytes == BATCH * 16 * 32 * 32 * 2
    _bytes_follow_dtypes(trace)


def test_fp16_with_a_grad_scaler_records_scale_unscale_step_and_update():
    trace = _capture("mlp", amp="fp16")
    n = N_PARAMS["mlp"]
    assert trace.meta.amp is Amp.FP16
    by_kind = _kind_bytes(trace)
    assert (by_kind[BufferKind.PARAM], by_kind[BufferKind.GRAD]) == (4 * n, 4 * n)
    assert by_kind[BufferKind.OPTIMIZER_STATE] == 8 * n
    scaler = {b.name: b for b in trace.buffers if b.name.startswith("grad_scaler.")}
    assert {k: (b.nbytes, b.persistent) for k, b in scaler.items()} == {
        "grad_scaler.scale": (4, True),  # one float32
        "grad_scaler.growth_tracker": (4, True),  # one int32
    }
    ids = {scaler["grad_scaler.scale"].id}
    backward = [op for op in trace.ops if op.phase is Phase.BACKWARD]
    # backward starts with loss * scale
    assert backward[0].target == "aten.mul.Tensor"
    assert ids <= {trace.views[v].buffer for v in backward[0].reads}
    optimizer = [op.target for op in trace.ops if op.phase is Phase.OPTIMIZER]
    unscale = optimizer.index("aten._amp_foreach_non_finite_check_and_unscale_.default")
    assert optimizer.count("aten.addcdiv_.default") == N_TENSORS["mlp"]  # the step ran
    assert unscale < optimizer.index("aten.addcdiv_.default")
    assert optimizer[-1] == "aten._amp_update_scale_.default"
    unscaled = _written(trace, trace.ops[trace.n_ops - len(optimizer) + unscale])
    assert sum(b.kind is BufferKind.GRAD for b in unscaled) == N_TENSORS["mlp"]
    assert {v.dtype for op in trace.ops[:3] for v in (trace.views[w] for w in op.writes)} == {
        "float16"
    }
    _bytes_follow_dtypes(trace)


# ---- gradient accumulation -------------------------------------------------------------
def test_accumulation_runs_k_passes_then_one_step():
    """mlp, K=3 (NOTE [ Gradient accumulation ]). One pass's forward is 7 ops
    (3 addmm, 2 relu, log_softmax, nll_loss), plus the loss / K: 3 x 8. Its
    backward is 13 ops, plus the division's backward, plus in passes 2 and 3
    one in-place add per parameter into the grads: 3 x 14 + 2 x 6. The
    optimizer phase is that of one step."""
    one = _capture("mlp", device="meta")
    three = _capture("mlp", device="meta", accumulate=3)
    assert three.meta.accumulate == 3 and one.meta.accumulate == 1
    runs = [
        p
        for i, p in enumerate(o.phase for o in three.ops)
        if i == 0 or p is not three.ops[i - 1].phase
    ]
    F, B, S = Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER
    assert runs == [F, B, F, B, F, B, S]
    assert one.ops_by_phase() == {F: 7, B: 13, S: 42}
    assert three.ops_by_phase() == {F: 3 * 8, B: 3 * 14 + 2 * 6, S: 42}
    n = N_PARAMS["mlp"]
    by_kind = _kind_bytes(three)
    assert by_kind[BufferKind.GRAD] == 4 * n  # created once, accumulated in place
    assert by_kind[BufferKind.OPTIMIZER_STATE] == 8 * n
    adds = [op for op in three.ops if op.phase is B and op.target == "aten.add_.Tensor"]
    assert all(_written(three, op)[0].kind is BufferKind.GRAD for op in adds)


def test_meta_and_cpu_agree_for_adamw_and_accumulation():
    def signature(t):
        ops = [(o.target, o.phase, o.reads, o.writes) for o in t.ops]
        return ops, [(b.nbytes, b.kind, b.persistent, b.freed_after) for b in t.buffers]

    kw = {"optimizer": "adamw", "accumulate": 2}
    assert signature(_capture("small_cnn", "meta", **kw)) == signature(_capture("small_cnn", **kw))


# ---- against torch.profiler ------------------------------------------------------------
# NOTE [ The profiler's peak without kernel scratch ]
# torch.profiler(profile_memory=True) on cpu logs every allocation and free of
# the cpu allocator ("[memory]" events with a signed size). Its peak over one
# step, plus the bytes that existed before (parameters, module buffers,
# optimizer state, scaler state, the batch), is the real peak of the step.
# Some cpu kernels also allocate scratch that they free before they return:
# the half-precision convolution (`_slow_conv2d_forward`) builds an im2col
# buffer of C_in*9 x H*W values per image. A trace records tensors, not what
# happens inside a kernel (on a GPU that is cuDNN's workspace, estimated per
# profile as `workspace_bytes`), so we compare with the profiler's peak after
# dropping every allocation freed within the same outermost aten call
# (matched by size). The trace must come within 2% of that; on these models it
# is within a few bytes (host-side scalars). The scratch is left out, not
# ignored: small_cnn at batch 8 under bf16 or fp16 has a full profiler peak
# 6-7% above the trace's, and the test holds that the full peak is the higher.
def _outermost_calls(events) -> list[tuple[int, int]]:
    spans = sorted(
        ((e.start_ns(), e.end_ns()) for e in events if e.name().startswith("aten::")),
        key=lambda s: (s[0], -s[1]),
    )
    outer: list[tuple[int, int]] = []
    for s, e in spans:
        if not (outer and s >= outer[-1][0] and e <= outer[-1][1]):
            outer.append((s, e))
    return outer


def _peaks(prof) -> tuple[int, int]:
    """(peak without in-call scratch, full peak) of the profiled step, bytes
    above what existed before it (NOTE [ The profiler's peak without kernel
    scratch ])."""
    events = list(prof.profiler.kineto_results.events())
    calls = _outermost_calls(events)
    starts = [s for s, _ in calls]
    memory = sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns())
    scratch: set[int] = set()
    pending: dict[tuple[int, int], list[int]] = {}
    for k, e in enumerate(memory):
        i = bisect.bisect_right(starts, e.start_ns()) - 1
        if i < 0 or e.start_ns() > calls[i][1]:
            continue
        if e.nbytes() > 0:
            pending.setdefault((i, e.nbytes()), []).append(k)
        elif pending.get((i, -e.nbytes())):
            scratch |= {pending[(i, -e.nbytes())].pop(), k}
    now = full = peak = full_peak = 0
    for k, e in enumerate(memory):
        full += e.nbytes()
        full_peak = max(full_peak, full)
        if k not in scratch:
            now += e.nbytes()
            peak = max(peak, now)
    return peak, full_peak


CASES = {
    "adamw": (
        {"optimizer": "adamw", "optimizer_kwargs": {"weight_decay": 0.01}},
        lambda p: torch.optim.AdamW(p, lr=1e-3, weight_decay=0.01, foreach=False),
        None,
        1,
    ),
    "sgd": (
        {"optimizer": "sgd", "optimizer_kwargs": {"momentum": 0}},
        lambda p: torch.optim.SGD(p, lr=1e-3, momentum=0, foreach=False),
        None,
        1,
    ),
    "bf16": (
        {"amp": "bf16"},
        lambda p: torch.optim.Adam(p, lr=1e-3, foreach=False),
        torch.bfloat16,
        1,
    ),
    "fp16": (
        {"amp": "fp16"},
        lambda p: torch.optim.Adam(p, lr=1e-3, foreach=False),
        torch.float16,
        1,
    ),
    "accumulate": (
        {"accumulate": 3},
        lambda p: torch.optim.Adam(p, lr=1e-3, foreach=False),
        None,
        3,
    ),
}


def _profiled(model: str, make_optimizer, amp, passes: int) -> tuple[int, int, int]:
    """A plain training step written here, warmed up once, then profiled:
    (peak, full peak, bytes before), all in bytes."""
    torch.manual_seed(0)
    w = ZOO[model](BATCH)
    opt = make_optimizer(w.model.parameters())
    scaler = torch.amp.GradScaler("cpu") if amp is torch.float16 else None

    def step():
        for _ in range(passes):
            with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
                loss = w.loss_fn(w.model(*w.inputs), *w.targets)
            if passes > 1:
                loss = loss / passes
            (loss if scaler is None else scaler.scale(loss)).backward()
            del loss
        if scaler is None:
            opt.step()
        else:
            scaler.step(opt)
            scaler.update()
        opt.zero_grad(set_to_none=True)

    step()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    held = [*w.model.parameters(), *w.model.buffers(), *w.inputs, *w.targets]
    held += [t for s in opt.state.values() for k, t in s.items() if k != "step"]
    if scaler is not None:
        held += [scaler._scale, scaler._growth_tracker]
    before = sum(t.untyped_storage().nbytes() for t in held)
    peak, full = _peaks(prof)
    return peak + before, full + before, before


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("model", ["mlp", "small_cnn"])
def test_the_trace_peak_is_the_profilers_within_2_percent(model, case):
    """The captured trace's framework peak against torch.profiler's peak of
    the same step (NOTE [ The profiler's peak without kernel scratch ]); what
    existed before the step is exactly the trace's resident-at-start bytes."""
    options, make_optimizer, amp, passes = CASES[case]
    trace = _capture(model, **options)
    profiled, full, before = _profiled(model, make_optimizer, amp, passes)
    peak, _ = trace.peak("framework")
    assert int(trace.nbytes[trace.exists_at_start].sum()) == before
    assert abs(peak - profiled) <= 0.02 * profiled, (peak, profiled, full)
    assert full >= profiled


# ---- fp16 steps the GradScaler skips -------------------------------------------------------
def _overflowing(factor: float):
    """Linear(8, 8) whose loss is factor x the sum of squared outputs: the
    fp16 grads of large factors overflow at the GradScaler's first scales."""

    def make(batch: int) -> Workload:
        x = torch.randn(batch, 8)
        return Workload(nn.Linear(8, 8), (x,), (), lambda out: out.float().pow(2).sum() * factor)

    return make


def test_warm_up_goes_on_while_the_grad_scaler_skips_steps():
    """NOTE [ Warm-up under a GradScaler ]. With factor 1024 the first step
    overflows (checked here with plain PyTorch), so one warm-up step would
    leave Adam without state; capture warms up until a step is taken, and
    records one that updates both parameters, with both moments resident."""
    torch.manual_seed(0)
    w = _overflowing(1024.0)(4)
    opt, scaler = torch.optim.Adam(w.model.parameters()), torch.amp.GradScaler("cpu")
    with torch.autocast("cpu", dtype=torch.float16):
        loss = w.loss()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
    assert scaler.get_scale() < 2.0**16 and not opt.state  # skipped

    trace = capture(_overflowing(1024.0), 4, CaptureOptions("cpu", amp="fp16"))
    assert [op.target for op in trace.ops].count("aten.addcdiv_.default") == 2
    state = [b for b in trace.buffers if b.kind is BufferKind.OPTIMIZER_STATE]
    assert len(state) == 4 and all(b.persistent for b in state)


@pytest.mark.parametrize(
    ("factor", "warmup", "message"),
    [
        (1024.0, 0, "the recorded step found inf/NaN grads and the GradScaler skipped"),
        (math.inf, 1, "after 25 warm-up steps the GradScaler still skips the step"),
    ],
)
def test_a_step_the_grad_scaler_skips_is_not_recorded(factor, warmup, message):
    opts = CaptureOptions("cpu", amp="fp16", warmup_iterations=warmup)
    with pytest.raises(TraceError, match=message):
        capture(_overflowing(factor), 4, opts)

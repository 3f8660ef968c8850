"""Capture of a full training step: meta and CPU agree, the framework peak
matches what torch.profiler sees, and every buffer has the right kind."""

from __future__ import annotations

import pytest
import torch
from memplan.traces import io
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.errors import TraceError
from memplan.traces.io import fingerprint
from memplan.traces.model import BufferKind, Phase
from memplan.traces.zoo import ZOO
from torch.profiler import ProfilerActivity, profile


def _signature(trace):
    ops = [(o.target, o.phase, o.reads, o.writes, o.module, o.flops, o.rng) for o in trace.ops]
    bufs = [(b.nbytes, b.kind, b.persistent, b.name, b.freed_after) for b in trace.buffers]
    views = [(v.buffer, v.shape, v.stride, v.offset, v.dtype) for v in trace.views]
    return ops, bufs, views


@pytest.mark.parametrize("model", ["small_cnn", "tiny_transformer", "mlp"])
def test_meta_and_cpu_capture_the_same_ops_and_buffers(model):
    meta = capture(ZOO[model], 4, CaptureOptions(device="meta"), model_name=model)
    cpu = capture(ZOO[model], 4, CaptureOptions(device="cpu"), model_name=model)
    assert _signature(meta) == _signature(cpu)
    assert fingerprint(meta) != fingerprint(cpu)  # the device is part of the metadata
    io.from_dict(io.to_dict(meta))  # the loader accepts what capture writes


def _profiled_peak_bytes(batch: int) -> tuple[int, int]:
    """Peak CPU bytes allocated during one plain training step, as
    torch.profiler records them, plus the bytes that existed before."""
    torch.manual_seed(0)
    w = ZOO["small_cnn"](batch)
    opt = torch.optim.Adam(w.model.parameters(), foreach=False)

    def step():
        loss = w.loss_fn(w.model(*w.inputs), *w.targets)
        loss.backward()
        del loss
        opt.step()
        opt.zero_grad(set_to_none=True)

    step()  # warm-up: optimizer state exists from here on
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    mem = sorted(
        (e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
        key=lambda e: e.start_ns(),
    )
    current = peak = 0
    for e in mem:
        current += e.nbytes()
        peak = max(peak, current)
    # What was allocated before profiling started: params, both Adam moments,
    # BatchNorm buffers, the batch. (Adam's step counters live on the host
    # in a GPU run; on CPU they are 4 bytes each and inside the 5%.)
    tensors = [*w.model.parameters(), *w.model.buffers(), *w.inputs, *w.targets]
    tensors += [t for s in opt.state.values() for k, t in s.items() if k != "step"]
    before = sum(t.untyped_storage().nbytes() for t in tensors)
    return peak + before, before


def test_framework_peak_matches_the_profiler_within_5_percent():
    trace = capture(ZOO["small_cnn"], 16, CaptureOptions(device="cpu"), model_name="small_cnn")
    profiled, before = _profiled_peak_bytes(16)
    peak, _ = trace.peak("framework")
    assert int(trace.nbytes[trace.exists_at_start].sum()) == before
    assert abs(peak - profiled) / profiled <= 0.05, (peak, profiled)


def test_buffer_kinds_and_adam_state():
    trace = capture(ZOO["small_cnn"], 8, CaptureOptions(device="meta"), model_name="small_cnn")
    w = ZOO["small_cnn"](8)
    n_params = sum(p.numel() for p in w.model.parameters())
    by_kind = trace.bytes_by_kind()
    assert by_kind[BufferKind.PARAM] == 4 * n_params
    assert by_kind[BufferKind.OPTIMIZER_STATE] == 8 * n_params  # exp_avg + exp_avg_sq
    assert by_kind[BufferKind.GRAD] == 4 * n_params
    inputs = [b for b in trace.buffers if b.kind is BufferKind.INPUT]
    assert [b.name for b in inputs] == ["input0", "target0"]
    assert all(b.freed_after == trace.n_ops - 1 for b in inputs)
    grads = [b for b in trace.buffers if b.kind is BufferKind.GRAD]
    assert {b.name for b in grads} == {f"{n}.grad" for n, _ in w.model.named_parameters()}
    # zero_grad(set_to_none=True) drops the grads at the end of the step
    assert all(b.freed_after == trace.n_ops - 1 for b in grads)
    assert all(b.persistent for b in trace.buffers if b.kind is BufferKind.OPTIMIZER_STATE)
    assert all(not b.persistent for b in trace.buffers if b.kind is BufferKind.ACTIVATION)


def test_sgd_has_one_momentum_buffer_per_param():
    trace = capture(ZOO["mlp"], 4, CaptureOptions(optimizer="sgd"), model_name="mlp")
    by_kind = trace.bytes_by_kind()
    assert by_kind[BufferKind.OPTIMIZER_STATE] == by_kind[BufferKind.PARAM]


def test_phases_are_in_order_and_optimizer_runs_per_parameter():
    trace = capture(ZOO["mlp"], 4, model_name="mlp")
    phases = [o.phase for o in trace.ops]
    order = {Phase.FORWARD: 0, Phase.BACKWARD: 1, Phase.OPTIMIZER: 2}
    assert phases == sorted(phases, key=order.__getitem__)
    n_params = len(list(ZOO["mlp"](4).model.parameters()))
    updates = [o for o in trace.ops if o.target == "aten.addcdiv_.default"]
    assert len(updates) == n_params  # foreach=False: one Adam update per parameter


def test_modules_rng_and_saved_tensors():
    trace = capture(ZOO["tiny_transformer"], 2, model_name="tiny_transformer")
    forward = [o for o in trace.ops if o.phase is Phase.FORWARD]
    backward = [o for o in trace.ops if o.phase is Phase.BACKWARD]
    assert any(o.rng for o in forward), "dropout must be marked as consuming RNG"
    assert not any(o.rng for o in trace.ops if o.phase is Phase.OPTIMIZER)
    assert {o.module for o in forward if o.target == "aten.addmm.default"} - {""}
    # backward ops carry the module of the forward op they differentiate
    fwd_modules = {o.module for o in forward}
    bwd_modules = {o.module for o in backward} - {""}
    assert bwd_modules and bwd_modules <= fwd_modules
    assert trace.saved and [s.index for s in trace.saved] == list(range(len(trace.saved)))
    assert all(trace.views[s.view].buffer < trace.n_buffers for s in trace.saved)


def test_meta_capture_of_args_round_trips_through_json():
    trace = capture(ZOO["small_cnn"], 2, model_name="small_cnn")
    conv = next(o for o in trace.ops if o.target == "aten.convolution.default")
    args = conv.args["args"]
    assert args[0] == {"view": conv.reads[0]}
    assert args[3] == [1, 1]  # stride
    d = io.to_dict(trace)
    assert io.to_dict(io.from_dict(d)) == d


def test_bad_options_are_trace_errors():
    with pytest.raises(TraceError, match="optimizer='rmsprob' is not a torch.optim optimizer"):
        CaptureOptions(optimizer="rmsprob")
    with pytest.raises(TraceError, match="measure=True needs a real device"):
        CaptureOptions(device="meta", measure=True)
    with pytest.raises(TraceError, match="batch_size=0 must be >= 1"):
        capture(ZOO["mlp"], 0)


def test_measure_on_cpu_records_durations():
    trace = capture(ZOO["mlp"], 4, CaptureOptions(device="cpu", measure=True, measure_repeats=3))
    assert all(o.duration_us is not None and o.duration_us > 0 for o in trace.ops)


def test_batch_norm_running_stats_are_recorded_as_written():
    trace = capture(ZOO["small_cnn"], 2, model_name="small_cnn")
    stats = {b.id for b in trace.buffers if b.name.endswith(("running_mean", "running_var"))}
    assert stats
    bns = [o for o in trace.ops if o.target == "aten.native_batch_norm.default"]
    written = {trace.views[v].buffer for o in bns for v in o.writes}
    assert stats <= written

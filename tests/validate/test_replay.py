"""Vanilla replays: the device pool follows the trace to the byte, runs are
reproducible bit for bit, and the starting state is valid for every op."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from memplan.traces.io import fingerprint
from memplan.traces.model import BufferKind
from memplan.validate import ValidationError, compare_results, replay
from memplan.validate.replay.initial import index_bounds, initial_bytes
from memplan.validate.replay.program import compile_trace

from tests.validate.helpers import trace_of


@pytest.mark.parametrize("model", ["small_cnn", "tiny_transformer"])
def test_vanilla_pool_follows_the_framework_curve_exactly(model):
    trace = trace_of(model)
    r = replay(trace, iterations=2)
    assert r.peak_bytes == trace.peak("framework")[0]
    assert r.iteration_peak_bytes.tolist() == [r.peak_bytes] * 2  # each step peaks alike
    expected = trace.memory_curve("framework")
    for k in range(2):
        np.testing.assert_array_equal(r.memory_curve[k], expected)
    assert r.transfers == () and r.recomputes.tolist() == [0, 0]
    assert r.wait_seconds.tolist() == [0.0, 0.0]
    assert r.op_seconds.shape == (2, trace.n_ops) and (r.op_seconds > 0).all()
    assert (r.iteration_seconds >= r.op_seconds.sum(axis=1)).all()
    assert r.allocator_peak_bytes is None and r.size_mismatches == {}


@pytest.mark.parametrize("model", ["small_cnn", "tiny_transformer", "mlp"])
def test_same_seed_is_bit_identical_and_another_seed_is_not(model):
    trace = trace_of(model)
    a = replay(trace, iterations=2, seed=3)
    b = replay(trace, iterations=2, seed=3)
    compare_results(a, b)
    assert all(torch.equal(a.state[k], b.state[k]) for k in a.state)
    assert np.isfinite(a.losses).all() and a.losses.shape == (2, 1)
    assert a.losses[0, 0] != a.losses[1, 0]  # the first step changed the parameters
    c = replay(trace, iterations=2, seed=4)
    with pytest.raises(ValidationError, match=r"buffer 0 \(\S+\) differs: \d+ of \d+ elements"):
        compare_results(a, c)


def test_state_covers_every_persistent_buffer_and_moves_with_training():
    trace = trace_of("small_cnn")
    one, two = replay(trace, iterations=1), replay(trace, iterations=2)
    persistent = {b.id for b in trace.buffers if b.persistent}
    assert one.state.keys() == persistent
    assert one.names[0] == trace.buffers[0].name
    # iteration 0 is the same in both runs; the second step moves every param
    assert one.losses[0, 0] == two.losses[0, 0]
    params = [b.id for b in trace.buffers if b.kind is BufferKind.PARAM]
    assert all(not torch.equal(one.state[p], two.state[p]) for p in params)
    with pytest.raises(ValidationError, match=r"loss 0 of iteration 0 differs"):
        compare_results(one, dataclasses.replace(one, losses=one.losses + 1))


def test_dropout_masks_change_between_iterations_but_not_between_runs():
    trace = trace_of("tiny_transformer")
    assert any(op.rng for op in trace.ops)
    a, b = replay(trace, iterations=3, seed=1), replay(trace, iterations=3, seed=1)
    np.testing.assert_array_equal(a.losses, b.losses)
    assert len(set(a.losses[:, 0].tolist())) == 3


def test_a_meta_capture_replays_like_a_cpu_capture():
    cpu, meta = trace_of("small_cnn"), trace_of("small_cnn", device="meta")
    assert fingerprint(cpu) != fingerprint(meta)
    compare_results(replay(cpu, iterations=2), replay(meta, iterations=2))


def test_a_buffer_larger_than_the_trace_says_is_reported_not_fatal():
    # on meta, mse_loss's 0-dim output owns 4 bytes; on CPU it is a view into
    # the 4 x 512 float buffer of squared differences (8 KiB)
    meta, cpu = trace_of("linear_chain", device="meta"), trace_of("linear_chain")
    loss = next(op for op in meta.ops if op.target == "aten.mse_loss.default")
    (b,) = meta.op_writes(loss.id).tolist()
    assert (meta.buffers[b].nbytes, cpu.buffers[b].nbytes) == (4, 8192)
    r = replay(meta, iterations=1)
    assert r.size_mismatches == {b: (4, 8192)}
    assert r.peak_bytes == meta.peak("framework")[0]
    compare_results(r, replay(cpu, iterations=1))


def test_the_callers_generator_is_left_alone():
    torch.manual_seed(123)
    before = torch.get_rng_state()
    replay(trace_of("tiny_transformer"), iterations=1)
    assert torch.equal(torch.get_rng_state(), before)


def test_index_bounds_come_from_how_the_trace_uses_the_buffer():
    tt = trace_of("tiny_transformer")
    named = {tt.buffers[b].name: n for b, n in index_bounds(tt).items()}
    # token ids index a 100-row embedding, targets the 100-way logits
    assert named["input0"] == 100 and named["target0"] == 100
    cnn = trace_of("small_cnn")
    assert {cnn.buffers[b].name: n for b, n in index_bounds(cnn).items()} == {"target0": 10}


def test_starting_state_is_seeded_typed_and_valid():
    trace = trace_of("tiny_transformer")
    dtypes = compile_trace(trace, torch.device("cpu")).buffer_dtype
    raw = initial_bytes(trace, dtypes, seed=5)
    assert raw.keys() == {int(b) for b in np.flatnonzero(trace.exists_at_start)}
    assert all(raw[b].numel() == trace.buffers[b].nbytes for b in raw)
    again = initial_bytes(trace, dtypes, seed=5)
    assert all(torch.equal(raw[b], again[b]) for b in raw)
    other = initial_bytes(trace, dtypes, seed=6)
    assert not torch.equal(raw[0], other[0])

    def typed(b):
        return raw[b].view(dtypes[b])

    by_name = {trace.buffers[b].name: b for b in raw}
    ids = typed(by_name["input0"])
    assert ids.dtype == torch.int64 and ids.min() >= 0 and ids.max() < 100
    assert len(ids.unique()) > 10  # random, not a constant
    for name, b in by_name.items():
        if name.endswith("exp_avg_sq"):
            assert (typed(b) >= 0).all() and (typed(b) > 0).any()
    weight = typed(by_name["head.weight"])  # 100 x 64: randn / sqrt(64)
    assert 0.08 < float(weight.std()) < 0.17


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"iterations": 0}, "iterations=0 must be >= 1"),
        ({"lanes": 3}, "lanes=3 must be 1 or 2"),
        ({"bandwidth_bytes_per_s": 0}, "bandwidth_bytes_per_s=0 must be > 0"),
        ({"device": "meta"}, "device='meta' must be cpu or cuda"),
    ],
)
def test_bad_arguments_are_validation_errors(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        replay(trace_of("mlp"), **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a CPU-only machine")
def test_cuda_without_cuda_is_a_validation_error():
    with pytest.raises(ValidationError, match="CUDA is not available"):
        replay(trace_of("mlp"), device="cuda")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_replay_matches_itself_and_reports_the_allocator_peak():
    trace = trace_of("small_cnn")
    a, b = replay(trace, device="cuda"), replay(trace, device="cuda")
    compare_results(a, b)
    assert a.peak_bytes == trace.peak("framework")[0]
    assert a.allocator_peak_bytes is not None and a.allocator_peak_bytes >= a.peak_bytes

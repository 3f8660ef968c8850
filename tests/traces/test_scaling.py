"""Batch scaling (NOTE [ Batch scaling ]): traces scaled from two captures
equal real captures at other batches, the rounding rules hold on hand-made
traces, and disagreements and failed checks fall back to capturing."""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from memplan.traces import io
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.model import Buffer, BufferKind, Op, Phase, Trace, TraceMeta, View
from memplan.traces.scaling import BatchTraces, ScalingError, _Line, fit, model_captures
from memplan.traces.zoo import ZOO


def _whole(trace: Trace) -> dict:
    """The trace as its file would hold it, without meta.extra (where a
    scaled trace records the batches it came from)."""
    d = io.to_dict(trace)
    d["meta"].pop("extra")
    return d


@pytest.mark.parametrize("model", ["mlp", "small_cnn", "tiny_resnet", "tiny_transformer"])
def test_scaled_traces_equal_captures_at_other_batches(model):
    traces = BatchTraces(model_captures(model), bases=(3, 7))
    for batch in (2, 21):
        scaled = traces.trace(batch)
        assert scaled.scaled and scaled.note == ""
        real = capture(ZOO[model], batch, CaptureOptions(), model_name=model)
        assert _whole(scaled.trace) == _whole(real)  # every byte, shape, stride, flop
        assert scaled.trace.peak() == real.peak()
        assert scaled.trace.meta.extra["scaled_from"] == [3, 7]
        io.from_dict(io.to_dict(scaled.trace))  # the loader takes it
    assert traces.captures == 2 and traces.notes == []


def test_mlp_input_and_first_layer_scale_by_hand():
    traces = BatchTraces(model_captures("mlp"), bases=(2, 4))
    t = traces.trace(1000).trace
    by_name = {b.name: b for b in t.buffers}
    assert by_name["input0"].nbytes == 1000 * 784 * 4  # float32 [1000, 784]
    assert by_name["target0"].nbytes == 1000 * 8  # int64 labels
    assert by_name["fc1.weight"].nbytes == 512 * 784 * 4  # does not scale
    addmm = next(o for o in t.ops if o.target == "aten.addmm.default")
    assert addmm.flops == 2 * 1000 * 784 * 512  # the first layer's matmul
    assert t.meta.batch_size == 1000


def test_batch_one_and_the_bases_are_captures():
    traces = BatchTraces(model_captures("tiny_transformer"), bases=(2, 5))
    one = traces.trace(1)
    assert not one.scaled and "batch 1" in one.note
    assert one.trace.n_ops == 345  # size-1 dims take other paths ...
    assert traces.trace(2).trace.n_ops == 353  # ... than every batch from 2
    assert not traces.trace(5).scaled
    assert traces.trace(9).scaled
    assert traces.captures == 3  # 1, 2, 5; 9 was scaled


def test_captures_that_disagree_are_named_and_every_batch_is_captured():
    t1 = capture(ZOO["tiny_transformer"], 1, CaptureOptions(), model_name="tt")
    t2 = capture(ZOO["tiny_transformer"], 2, CaptureOptions(), model_name="tt")
    with pytest.raises(
        ScalingError, match=r"batch 1 and 2 disagree: number of buffers: 296 vs 304"
    ):
        fit(t1, t2)
    # a model whose base captures disagree: mlp at one batch, small_cnn at the other
    made = []

    def capture_at(batch):
        made.append(batch)
        name = "mlp" if batch == 2 else "small_cnn"
        return capture(ZOO[name], batch, CaptureOptions(), model_name="x")

    traces = BatchTraces(capture_at, bases=(2, 3))
    got = traces.trace(6)
    assert not got.scaled and "disagree" in got.note
    assert made == [2, 3, 6]
    assert not traces.scaling
    assert len(traces.notes) == 1 and traces.notes[0].startswith("scaling off")


# ---- hand-made traces: rounding, checks ----------------------------------------------
def _hand(batch: int, extra_bytes: int, flops: int, width: int = 2) -> Trace:
    """An input [batch, width] float32 and a relu into an activation of
    `extra_bytes` more than the input."""
    n_in = batch * width * 4
    buffers = (
        Buffer(0, n_in, BufferKind.INPUT, name="input0", freed_after=0),
        Buffer(1, n_in + extra_bytes, BufferKind.ACTIVATION, freed_after=0),
    )
    views = (
        View(0, 0, (batch, width), (width, 1), 0, "float32"),
        View(1, 1, (batch, width), (width, 1), 0, "float32"),
    )
    args = {"args": [{"view": 0}, [batch, width]], "kwargs": {}}
    op = Op(0, "aten.relu.default", Phase.FORWARD, (0,), (1,), args, flops=flops)
    return Trace(TraceMeta("hand", batch), buffers, views, (op,))


def test_rounding_bytes_up_flops_to_nearest_args_exact():
    # activation extra bytes 10 at batch 2, 13 at batch 4: 11.5 at 3 -> 12;
    # flops 3 and 4: 3.5 at 3 -> 4 (halves up), 4.5 at 5 -> 5
    f = fit(_hand(2, 10, 3), _hand(4, 13, 4))
    t3 = f.at(3)
    assert t3.buffers[1].nbytes == 3 * 8 + 12
    assert t3.ops[0].flops == 4
    assert t3.ops[0].args["args"][1] == [3, 2]  # an integer of the call scales too
    assert t3.views[1].shape == (3, 2)
    assert f.at(5).ops[0].flops == 5
    assert f.at(5).buffers[1].nbytes == 5 * 8 + 15  # 14.5 -> 15
    assert f.at(4).buffers[1].nbytes == 4 * 8 + 13  # a base comes back exactly
    # the base traces are left as they were
    assert f.base.ops[0].args["args"][1] == [2, 2]


def test_a_fit_that_does_not_hold_at_a_batch_says_where():
    # width 2 at batch 2 and 3 at batch 4: 2.5 at batch 3 is no shape
    f = fit(_hand(2, 0, 0, width=2), _hand(4, 0, 0, width=3))
    with pytest.raises(ScalingError, match=r"views\[0\]\.shape\[1\] is 2 at batch 2 and 3"):
        f.at(3)
    # extra bytes 100 at batch 2, 10 at batch 4: negative from batch 7 (-35 at 7)
    f = fit(_hand(2, 100, 0), _hand(4, 10, 0))
    with pytest.raises(ScalingError, match=r"buffers\[1\]\.nbytes would be -"):
        f.at(7)


def test_a_scaled_trace_the_loader_would_refuse_is_refused():
    # the view grows with the batch and its buffer does not: at batch 6 the
    # view [6, 2] float32 spans 48 bytes of a 40-byte buffer
    def fixed(batch):
        t = _hand(batch, 0, 0)
        return dataclasses.replace(
            t, buffers=(t.buffers[0], dataclasses.replace(t.buffers[1], nbytes=40))
        )

    f = fit(fixed(2), fixed(4))
    f.at(5)
    with pytest.raises(ScalingError, match=r"views\[1\]: spans 48 bytes but buffer 1 has 40"):
        f.at(6)
    # bytes past 2**62 (NOTE [ Trace sanity ranges ])
    f = fit(_hand(2, 0, 0), _hand(4, 2**61, 0))
    with pytest.raises(ScalingError, match=r"buffers\[1\]\.nbytes: more than"):
        f.at(8)


def test_a_failed_check_turns_scaling_off_and_later_batches_are_captured():
    def capture_at(batch):  # bytes affine up to batch 4, quadratic beyond
        return _hand(batch, 0 if batch <= 4 else batch * batch, 0)

    traces = BatchTraces(capture_at, bases=(2, 4))
    assert traces.trace(3).scaled
    check = traces.check(10)
    assert not check.ok
    assert check.captured_peak_bytes == 2 * 80 + 100 and check.scaled_peak_bytes == 160
    assert "buffers[1].nbytes: 80 scaled, 180 captured" in check.reason
    assert not traces.scaling and "does not match its capture" in traces.notes[0]
    got = traces.trace(6)
    assert not got.scaled and got.trace.buffers[1].nbytes == 6 * 8 + 36
    assert traces.trace(3).scaled is False  # a scaled trace made before is not kept


def test_a_check_within_tolerance_passes():
    def capture_at(batch):  # off the line by 1 byte in 8000 at batch 1000
        return _hand(batch, 1 if batch == 1000 else 0, 0)

    traces = BatchTraces(capture_at, bases=(2, 4), tolerance=0.005)
    check = traces.check(1000)
    assert check.ok and 0 < check.max_rel_error < 0.005
    assert traces.scaling


@pytest.mark.parametrize(
    "bases, tolerance, message",
    [((1, 2), 0.005, "2 <= b1 < b2"), ((4, 4), 0.005, "2 <= b1 < b2"), ((2, 4), -1, "tolerance")],
)
def test_bad_settings_are_refused(bases, tolerance, message):
    with pytest.raises(ScalingError, match=message):
        BatchTraces(lambda b: _hand(b, 0, 0), bases=bases, tolerance=tolerance)


@given(
    q1=st.integers(0, 10**12),
    q2=st.integers(0, 10**12),
    b1=st.integers(2, 50),
    gap=st.integers(1, 50),
    batch=st.integers(1, 10**5),
)
def test_rounding_against_fractions(q1, q2, b1, gap, batch):
    b2 = b1 + gap
    line = _Line(b1, b2, batch)
    exact = q1 + Fraction(q2 - q1) * (batch - b1) / (b2 - b1)
    if exact >= 0:
        assert line.up(q1, q2, "x") == math.ceil(exact)
        assert line.nearest(q1, q2, "x") == math.floor(exact + Fraction(1, 2))
    else:
        with pytest.raises(ScalingError):
            line.up(q1, q2, "x")
    if exact.denominator == 1:
        assert line.whole(q1, q2, "x") == exact
    else:
        with pytest.raises(ScalingError, match="not a whole number"):
            line.whole(q1, q2, "x")

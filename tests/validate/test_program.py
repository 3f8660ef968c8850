"""Compiling a trace for replay: the tagged JSON arguments back to torch
objects, operator lookup, and a hand-made trace replayed end to end."""

from __future__ import annotations

import math

import pytest
import torch
from memplan.traces.model import Buffer, BufferKind, Op, Phase, Trace, TraceMeta, View
from memplan.validate import ValidationError, replay
from memplan.validate.replay.initial import initial_bytes
from memplan.validate.replay.program import HostTensor, ViewRef, _Decoder, compile_trace, resolve

from tests.validate.helpers import trace_of

CPU = torch.device("cpu")


@pytest.mark.parametrize(
    ("encoded", "decoded"),
    [
        ({"view": 3}, ViewRef(3)),
        ({"float": "-inf"}, -math.inf),
        ({"complex": [1.0, -2.0]}, complex(1, -2)),
        ({"dtype": "bfloat16"}, torch.bfloat16),
        ({"layout": "strided"}, torch.strided),
        ({"memory_format": "channels_last"}, torch.channels_last),
        ({"generator": None}, None),
        ({"device": "meta"}, CPU),  # the capture device becomes the run device
        ([1, [{"view": 0}, None]], [1, [ViewRef(0), None]]),
        ({"host_tensor": [1, 2], "dtype": "int32"}, HostTensor([1, 2], torch.int32)),
    ],
)
def test_tagged_arguments_decode(encoded, decoded):
    got = _Decoder("meta", CPU, "ops[0]")(encoded)
    assert got == decoded and type(got) is type(decoded)


def test_a_host_device_stays_on_the_host():
    assert _Decoder("cuda", CPU, "ops[0]")({"device": "cpu"}) == torch.device("cpu")
    assert _Decoder("cuda", CPU, "ops[0]")({"device": "cuda"}) == CPU


@pytest.mark.parametrize(
    ("encoded", "message"),
    [
        ({"repr": "<object>"}, r"ops\[7\]: cannot rebuild argument"),
        ({"host_tensor": None, "dtype": "float32"}, r"ops\[7\]: a host tensor's value"),
        ({"dtype": "float128"}, "unknown dtype 'float128'"),
    ],
)
def test_arguments_that_cannot_be_rebuilt(encoded, message):
    with pytest.raises(ValidationError, match=message):
        _Decoder("meta", CPU, "ops[7]")(encoded)


def test_operator_lookup():
    assert resolve("aten.convolution.default", "x") is torch.ops.aten.convolution.default
    with pytest.raises(
        ValidationError, match=r"ops\[2\]: torch has no operator 'aten.nope.default'"
    ):
        resolve("aten.nope.default", "ops[2]")
    with pytest.raises(ValidationError, match="is not namespace.op.overload"):
        resolve("aten.add", "ops[2]")


def _scaled_sum() -> Trace:
    """x (input, 4 floats) -> y = x * tensor(2.0) (a host scalar) -> s = sum(y):
    a forward-only step whose loss is the last op's 0-dim output."""
    f32 = "float32"
    buffers = (
        Buffer(0, 16, BufferKind.INPUT, name="input0", freed_after=1),
        Buffer(1, 16, BufferKind.ACTIVATION, freed_after=1),
        Buffer(2, 4, BufferKind.ACTIVATION, freed_after=1),
    )
    views = (
        View(0, 0, (4,), (1,), 0, f32),
        View(1, 1, (4,), (1,), 0, f32),
        View(2, 2, (), (), 0, f32),
    )
    ops = (
        Op(0, "aten.mul.Tensor", Phase.FORWARD, (0,), (1,),
           {"args": [{"view": 0}, {"host_tensor": 2.0, "dtype": f32}], "kwargs": {}}),
        Op(1, "aten.sum.default", Phase.FORWARD, (1,), (2,),
           {"args": [{"view": 1}], "kwargs": {}}),
    )  # fmt: skip
    return Trace(TraceMeta("scaled_sum", 1, device="cpu"), buffers, views, ops)


def test_a_hand_made_trace_replays_with_its_host_scalar():
    trace = _scaled_sum()
    program = compile_trace(trace, CPU)
    assert program.loss_op == 2 and program.loss_views == (2,)
    assert [s.creates for s in program.steps] == [(1,), (2,)]
    assert [s.frees for s in program.steps] == [(), (0, 1, 2)]
    x = initial_bytes(trace, program.buffer_dtype, seed=9)[0].view(torch.float32)
    r = replay(trace, iterations=2, seed=9)
    assert r.losses.tolist() == [[float((x * 2).sum())]] * 2
    assert r.peak_bytes == 36 and r.memory_curve.tolist() == [[32, 36]] * 2
    assert r.state == {}


def test_batchnorm_running_statistics_are_written():
    trace = trace_of("small_cnn")
    bn = next(op for op in trace.ops if op.target == "aten.native_batch_norm.default")
    step = compile_trace(trace, CPU).steps[bn.id]
    running = {
        trace.views[v].buffer for v in (bn.args["args"][3]["view"], bn.args["args"][4]["view"])
    }
    assert {trace.buffers[b].name.rsplit(".", 1)[-1] for b in running} == {
        "running_mean",
        "running_var",
    }
    # capture records the writes the schema does not declare
    assert running <= {int(b) for b in trace.op_writes(bn.id)}
    assert running <= set(step.writes) and {("args", 3), ("args", 4)} <= set(step.mutated)

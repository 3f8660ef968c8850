"""Roofline and Measured on hand-worked ops; scalar and vectorised paths agree."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.features import op_costs
from memplan.hwmodels.latency import (
    DEFAULT_EFFICIENCY,
    Fixed,
    Measured,
    Roofline,
    RooflineOptions,
    usage_stretch,
)
from memplan.hwmodels.opclass import OpClass

from tests.hwmodels.handmade import Call, add, device, make, mm

ONE = RooflineOptions(efficiency=dict.fromkeys(OpClass, 1.0))

# (1024 x 512) @ (512 x 256), float32
MM_FLOPS = 2 * 1024 * 512 * 256  # 268,435,456
MM_READ = (1024 * 512 + 512 * 256) * 4  # 2,621,440
MM_WRITE = 1024 * 256 * 4  # 1,048,576


def test_matmul_costs_from_the_trace():
    t = make([mm(1024, 512, 256)])
    c = op_costs(t)
    assert c.flops[0] == MM_FLOPS
    assert c.bytes_read[0] == MM_READ
    assert c.bytes_written[0] == MM_WRITE


def test_roofline_matmul_is_compute_bound():
    t = make([mm(1024, 512, 256)])
    hw = device()
    # compute 268,435,456 / 1e12 = 268.435456 us; memory 3,670,016 / 1e11 = 36.7 us
    expect = 5e-6 + 268.435456e-6
    got = Roofline(ONE).predict_all(t, hw)
    assert got[0] == pytest.approx(expect, rel=1e-12)
    # half the device taken by others: twice as long (NOTE [ Usage ])
    assert Roofline(ONE).predict_all(t, hw, usage=0.5)[0] == pytest.approx(2 * expect)


def test_roofline_analytic_flops_when_the_trace_has_none():
    t = make([mm(1024, 512, 256, flops=0)])
    assert op_costs(t).flops[0] == MM_FLOPS
    assert Roofline(ONE).predict_all(t, device())[0] == pytest.approx(5e-6 + 268.435456e-6)


def test_roofline_elementwise_is_memory_bound():
    t = make([add(1 << 20)])
    # three 4 MiB views: 12,582,912 bytes at 1e11 B/s = 125.82912 us
    assert Roofline(ONE).predict_all(t, device())[0] == pytest.approx(5e-6 + 125.82912e-6)


def test_default_efficiency_and_profile_override():
    t = make([mm(1024, 512, 256)])
    eff = DEFAULT_EFFICIENCY[OpClass.MATMUL]
    assert Roofline().predict_all(t, device())[0] == pytest.approx(5e-6 + 268.435456e-6 / eff)
    hw = device(roofline_efficiency={"matmul": 0.25})
    assert Roofline().predict_all(t, hw)[0] == pytest.approx(5e-6 + 4 * 268.435456e-6)
    with pytest.raises(LatencyError, match="roofline_efficiency.gemm: unknown op class"):
        Roofline().predict_all(t, device(roofline_efficiency={"gemm": 1.0}))


def test_tf32_for_float32_convs_only():
    conv = Call(
        "aten.convolution.default", ((2, 8, 16, 16), (16, 8, 3, 3)), (2, 16, 16, 16),
        ["$0", "$1", None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1],
    )  # fmt: skip
    t = make([conv, mm(64, 64, 64)])
    c = op_costs(t)
    assert c.flops[0] == 1_179_648  # 2 x N x Cout x Ho x Wo x Cin x k x k = 2*2*16*16*16*8*9
    assert c.bytes_read[0] + c.bytes_written[0] == 53_760  # (2048 + 576 + 4096) floats
    hw = device(peak_flops={"float32": 1e12, "tfloat32": 8e12})
    got = Roofline(ONE).predict_all(t, hw)
    # on TF32 the conv needs 0.147 us of compute but 0.5376 us of memory traffic
    assert got[0] == pytest.approx(5e-6 + 53_760 / 1e11)
    assert got[1] == pytest.approx(5e-6 + 2 * 64**3 / 1e12)  # matmuls stay on float32
    no_tf32 = Roofline(dataclasses.replace(ONE, tf32_conv=False)).predict_all(t, hw)
    assert no_tf32[0] == pytest.approx(5e-6 + 1_179_648 / 1e12)


def test_view_ops_cost_nothing():
    t = make([Call("aten.view.default", ((4, 4),), (16,), ["$0", [16]]), add(16)])
    got = Roofline().predict_all(t, device())
    assert got[0] == 0.0 and got[1] > 0.0


MIXED = [
    mm(256, 128, 64),
    add(4096),
    Call("aten.relu_.default", ((8, 8),), None, ["$0"], inplace=True),
    Call("aten.sum.dim_IntList", ((32, 64),), (32,), ["$0", [1], False]),
    Call("aten.native_batch_norm.default", ((4, 8, 5, 5), (8,), (8,), (8,), (8,)), (4, 8, 5, 5),
         ["$0", "$1", "$2", "$3", "$4", True, 0.1, 1e-5]),
    Call("aten.addcdiv_.default", ((100,), (100,), (100,)), None, ["$0", "$1", "$2"],
         kwargs={"value": -0.01}, inplace=True),
    Call("aten.cat.default", ((3, 4), (5, 4)), (8, 4), [["$0", "$1"], 0]),
    Call("aten.t.default", ((3, 4),), (4, 3), ["$0"]),
    Call("aten.add_.Tensor", ((1,),), None, ["$0", 1], dtype="int64", inplace=True),
]  # fmt: skip


@pytest.mark.parametrize("usage", [0.0, 0.25, 1.0])
def test_scalar_and_vectorised_roofline_agree(usage):
    t = make(MIXED)
    hw = device()
    model = Roofline()
    vec = model.predict_all(t, hw, usage)
    assert vec.shape == (t.n_ops,)
    for op in t.ops:
        assert model.predict(op, t, hw, usage) == pytest.approx(vec[op.id], rel=1e-12)
    rows = np.array([3, 0, 3])
    got = model.predict_ops(t, hw, rows, np.array([0.0, usage, usage]))
    assert got == pytest.approx([model.predict(t.ops[3], t, hw, 0.0), vec[0], vec[3]])


def test_usage_stretch_and_bad_usage():
    assert usage_stretch(0.0) == 1.0
    assert usage_stretch(0.75) == pytest.approx(4.0)
    assert usage_stretch(1.0) == pytest.approx(10.0)  # capped at MAX_USAGE = 0.9
    t = make([add(8)])
    with pytest.raises(LatencyError, match=r"usage=1.5 must be a fraction"):
        Roofline().predict_all(t, device(), 1.5)


def test_costs_are_cached_per_trace():
    t = make([add(8)])
    assert op_costs(t) is op_costs(t)
    assert op_costs(make([add(8)])) is not op_costs(t)


def test_measured_and_fixed():
    t = make([add(8), add(16)])
    t2 = dataclasses.replace(t, ops=tuple(dataclasses.replace(o, duration_us=10.0 * (o.id + 1))
                                          for o in t.ops))  # fmt: skip
    assert Measured().predict_all(t2, device()).tolist() == pytest.approx([1e-5, 2e-5])
    with pytest.raises(LatencyError, match=r"ops\[0\] \(aten.add.Tensor\) has no duration"):
        Measured().predict_all(t, device())
    assert Fixed([1.0, 2.0]).predict(t.ops[1], t, device()) == 2.0
    with pytest.raises(LatencyError, match="2 durations for a trace of 3 ops"):
        Fixed([1.0, 2.0]).predict_all(make([add(1)] * 3), device())

"""The kernel model (NOTE [ Kernel model ]) on hand-worked ops: which unit an
op runs on, cuDNN's layout transforms, the second pass of a normalisation,
L2 reuse, the floor; and that it keeps no constant per model or GPU."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping

import numpy as np
import pytest
from memplan.hwmodels import kernels
from memplan.hwmodels.kernels import FITTED, KernelConstants, KernelModel, KernelOptions
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.profile import list_profiles, load_hardware
from memplan.traces.target import TargetDevice

from tests.hwmodels.handmade import Call, add, device, make, mm

HALF = KernelConstants(
    tensor_conv=0.5, tensor_matmul=0.5, cuda_cores=0.5, bandwidth=0.5, floor_s=1e-6
)
# 1 TFLOP/s on CUDA cores, 8 on TF32 and 16 on fp16 tensor cores, 100 GB/s:
# at half of each, 0.5e12, 4e12, 8e12 FLOP/s and 5e10 B/s
PEAKS = {"float32": 1e12, "tfloat32": 8e12, "float16": 16e12}


def gpu(**overrides):  # noqa: ANN003, ANN201
    return device(peak_flops=dict(PEAKS), compute_capability=(8, 0), **overrides)


def model(**options) -> KernelModel:  # noqa: ANN003
    return KernelModel(KernelOptions(constants=HALF, **options))


def test_an_fp32_matmul_runs_on_cuda_cores_unless_tf32_is_on():
    t = make([mm(1024, 512, 256)])
    # 268,435,456 FLOPs at 0.5e12 = 536.870912 us; 3,670,016 B at 5e10 = 73.40032 us
    assert model().predict_all(t, gpu())[0] == pytest.approx(1e-6 + 536.870912e-6, rel=1e-12)
    # TF32: 67.108864 us of math, so the 73.40032 us of traffic bounds it
    got = model(tf32_matmul=True).predict_all(t, gpu())[0]
    assert got == pytest.approx(1e-6 + 73.40032e-6, rel=1e-12)


def test_fp16_runs_on_tensor_cores_from_volta_on():
    t = make([dataclasses.replace(mm(1024, 512, 256), dtype="float16")])
    # 1,835,008 B at 5e10 = 36.70016 us beats 268,435,456 / 8e12 = 33.554432 us
    assert model().predict_all(t, gpu())[0] == pytest.approx(1e-6 + 36.70016e-6, rel=1e-12)
    # compute capability 6.0 has no tensor cores: its fp16 rate at the CUDA cores' share
    pascal = device(peak_flops={"float32": 1e12, "float16": 2e12}, compute_capability=(6, 0))
    got = model().predict_all(t, pascal)[0]
    assert got == pytest.approx(1e-6 + 268.435456e-6, rel=1e-12)


def _conv(channels_last: bool) -> Call:
    x, w, y = (8, 64, 32, 32), (64, 64, 3, 3), (8, 64, 32, 32)
    if channels_last:  # NHWC strides, the filter too (as .to(channels_last) makes it)
        x = (x, (65536, 1, 2048, 64))
        w = (w, (576, 1, 192, 64))
    call = Call("aten.convolution.default", (x, w), y, ["$0", "$1"], flops=603_979_776)
    return call


def test_a_tensor_core_conv_on_nchw_pays_the_layout_transforms():
    # x and y 2,097,152 B each, w 147,456 B: 4,341,760 B, 86.8352 us at 5e10
    # math 603,979,776 / 4e12 = 150.994944 us; transforms 2 x 86.8352 us
    t = make([_conv(channels_last=False)])
    expect = 1e-6 + 150.994944e-6 + 173.6704e-6
    assert model().predict_all(t, gpu())[0] == pytest.approx(expect, rel=1e-12)


def test_a_channels_last_conv_pays_none():
    t = make([_conv(channels_last=True)])
    # the output is channels-first in this hand-made trace: only it transforms
    expect = 1e-6 + 150.994944e-6 + 2 * 2_097_152 / 5e10
    assert model().predict_all(t, gpu())[0] == pytest.approx(expect, rel=1e-12)


def test_a_conv_takes_cuda_cores_where_tf32_is_no_faster():
    # GeForce-like: TF32 at the fp32 rate; 1207.959552 us of math either way,
    # and the CUDA-core kernel needs no transform
    geforce = device(
        peak_flops={"float32": 1e12, "tfloat32": 1e12, "float16": 2e12}, compute_capability=(8, 6)
    )
    t = make([_conv(channels_last=False)])
    assert model().predict_all(t, geforce)[0] == pytest.approx(1e-6 + 1207.959552e-6, rel=1e-12)


def test_a_norm_reads_its_input_twice():
    t = make([Call("aten.native_layer_norm.default", ((1 << 20,),), (1 << 20,), ["$0"])])
    # (2 x 4,194,304 + 4,194,304) B at 5e10 = 251.65824 us
    assert model().predict_all(t, gpu())[0] == pytest.approx(1e-6 + 251.65824e-6, rel=1e-12)


def _chained_adds():
    t = make([add(1 << 20), add(1 << 20)])
    out0 = t.ops[0].writes[0]
    ops = (t.ops[0], dataclasses.replace(t.ops[1], reads=(out0, t.ops[1].reads[1])))
    buffers = tuple(
        dataclasses.replace(b, freed_after=1) if b.id == t.views[out0].buffer else b
        for b in t.buffers
    )
    return dataclasses.replace(t, buffers=buffers, ops=ops)


def test_a_tensor_the_previous_kernel_wrote_is_read_from_l2_when_it_fits():
    t = _chained_adds()
    # op 1 reads 4 MiB op 0 wrote: with an 8 MiB L2 only its other 4 MiB input
    # and its 4 MiB output cross DRAM (167.77216 us); with 2 MiB, all 12 MiB
    big, small = gpu(l2_cache_bytes=8 << 20), gpu(l2_cache_bytes=2 << 20)
    assert model().predict_all(t, big)[1] == pytest.approx(1e-6 + 167.77216e-6, rel=1e-12)
    assert model().predict_all(t, small)[1] == pytest.approx(1e-6 + 251.65824e-6, rel=1e-12)
    assert model().predict_all(t, big)[0] == model().predict_all(t, small)[0]


def test_usage_stretches_and_a_cpu_profile_gets_the_roofline():
    t = make([mm(1024, 512, 256), add(1 << 20)])
    hw = gpu()
    alone = model().predict_all(t, hw)
    assert model().predict_all(t, hw, usage=0.5) == pytest.approx(2 * alone)
    cpu = device(device=TargetDevice.CPU)
    assert np.array_equal(model().predict_all(t, cpu), Roofline().predict_all(t, cpu))


def test_the_gpus_differ_only_by_their_figures():
    # no constant belongs to a GPU or a model: two profiles with the same
    # figures under different names time every op the same, and the module
    # holds no table keyed by a profile's or a model's name
    t = make([mm(1024, 512, 256), _conv(False), add(1 << 20)])
    a, b = gpu(name="a100-sxm-80gb"), gpu(name="someone-elses-gpu")
    assert np.array_equal(KernelModel().predict_all(t, a), KernelModel().predict_all(t, b))
    names = {*list_profiles(), "resnet50", "bert-base", "bert_base", "gpt2"}
    for value in vars(kernels).values():
        if isinstance(value, Mapping):
            assert not names & {str(k).lower() for k in value}
    assert all(isinstance(getattr(FITTED, f.name), float) for f in dataclasses.fields(FITTED))
    source = inspect.getsource(kernels)
    assert not [n for n in list_profiles() if n in source]


def test_every_shipped_gpu_profile_times_a_trace():
    t = make([mm(1024, 512, 256), _conv(False), add(1 << 20)])
    for name in list_profiles():
        got = KernelModel().predict_all(t, load_hardware(name))
        assert np.isfinite(got).all() and (got > 0).all(), name


@pytest.mark.parametrize(
    "field, value", [("bandwidth", 0.0), ("tensor_conv", 1.5), ("floor_s", -1e-6)]
)
def test_constants_out_of_range_are_refused(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(HALF, **{field: value})

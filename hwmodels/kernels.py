"""The kernel model: op latency on a GPU from the kernels PyTorch's defaults
launch for it, with a handful of global constants fitted on measured
training throughput (NOTE [ Kernel model ], NOTE [ Kernel model constants ]).

It keeps the roofline's interface (`LatencyModel`) and its costs per op
(`hwmodels.features.op_costs`); what it adds is which math unit an op runs
on, the traffic of kernels the trace does not show (cuDNN's layout
transforms, the second pass of a normalisation), achieved rather than
datasheet rates, L2 reuse between kernels, and a floor per op.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass, field

import numpy as np
from memplan.hwmodels.features import DTYPE_NAMES, op_costs
from memplan.hwmodels.latency import LatencyModel, Roofline, check_usage, usage_stretch
from memplan.hwmodels.opclass import OP_CLASSES, OpClass
from memplan.hwmodels.profile import Hardware
from memplan.traces.io import DTYPE_BYTES
from memplan.traces.model import Trace
from memplan.traces.target import TargetDevice

# NOTE [ Kernel model ]
# Per op on a GPU profile, F its FLOPs and B its bytes (op_costs: each distinct view once):
#     t = floor + max(F / (P_unit * e_unit),
#                     (B - L2 hits + second pass) / (BW * e_bw)) [+ transform]
# - Unit, as PyTorch's defaults pick it: fp16/bf16 conv, matmul and attention on tensor
#   cores (cc 7.0+); fp32 conv on TF32 where the profile lists `tfloat32`; fp32 matmul on
#   CUDA cores unless `tf32_matmul`. Conv or TF32 work takes the faster of that and a
#   CUDA-core kernel (cudnn.benchmark times both).
# - Transform: a tensor-core conv reads and writes each channels-first tensor once more
#   (NVIDIA Deep Learning Performance guide, "Tensor layouts in memory").
# - Second pass: batch and layer norm read their input twice. L2 hits: a view the previous
#   kernel wrote, within `l2_cache_bytes`, is read from L2.
# - e_unit, e_bw and the floor are global (NOTE [ Kernel model constants ]); GPUs differ only
#   by profile. View ops cost 0; `usage` stretches as the roofline's (NOTE [ Usage ]); a cpu
#   profile gets the roofline. Full text: docs/notes.md, "Kernel model".


@dataclass(frozen=True, slots=True)
class KernelConstants:
    """The fitted constants (NOTE [ Kernel model constants ]): achieved
    fractions of peak per unit, achieved fraction of datasheet bandwidth,
    and each op's fixed time in seconds."""

    tensor_conv: float
    tensor_matmul: float
    cuda_cores: float
    bandwidth: float
    floor_s: float

    def __post_init__(self) -> None:
        for name in ("tensor_conv", "tensor_matmul", "cuda_cores", "bandwidth"):
            v = getattr(self, name)
            if not (isinstance(v, int | float) and 0.0 < v <= 1.0):
                raise ValueError(f"KernelConstants.{name}={v!r}: a fraction of peak in (0, 1]")
        v = self.floor_s
        if not (isinstance(v, int | float) and 0.0 <= v < 1e-2 and math.isfinite(v)):
            raise ValueError(f"KernelConstants.floor_s={v!r}: seconds in [0, 0.01)")


# NOTE [ Kernel model constants ]
# Fitted by `benchmarks/gpu_time.py --fit` (Nelder-Mead on squared log error
# of iteration time) on the 16 rows of the four fitted GPUs in
# benchmarks/data/gpu_time.toml (V100-SXM2-16GB, A100-SXM4-80GB, RTX A6000,
# H100 SXM5; ResNet-50 and BERT-base, fp32 and AMP). No constant belongs to a
# model or a GPU. Two fractions sit at their bound of 1: at these batches
# convolutions and CUDA-core work run at the datasheet peak, and what limits
# them is memory traffic. The floor, 39 us, is far above a kernel launch
# (about 5 us): it holds eager PyTorch's host time per op (Python, dispatch,
# autograd), which a fit of a separate host floor put here instead. The
# errors, fitted and held out, are in docs/latency.md.
FITTED = KernelConstants(
    tensor_conv=1.0,
    tensor_matmul=0.7218,
    cuda_cores=1.0,
    bandwidth=0.6785,
    floor_s=3.892e-05,
)


@dataclass(frozen=True, slots=True)
class KernelOptions:
    """PyTorch's math settings the model follows (NOTE [ Kernel model ])."""

    constants: KernelConstants = field(default_factory=lambda: FITTED)
    tf32_conv: bool = True
    tf32_matmul: bool = False


@dataclass(frozen=True, eq=False)
class _Extra:
    """Per-op arrays the roofline does not need: bytes of channels-first conv
    activations, and what a normalisation's second pass reads."""

    nchw_conv_bytes: np.ndarray
    second_pass_bytes: np.ndarray
    # reads of a tensor the previous kernel wrote: (op index, bytes) pairs
    reuse_op: np.ndarray
    reuse_bytes: np.ndarray


_EXTRA: weakref.WeakKeyDictionary[Trace, _Extra] = weakref.WeakKeyDictionary()
_CONV = OP_CLASSES.index(OpClass.CONV)
_NORM = OP_CLASSES.index(OpClass.NORM)
_VIEW = OP_CLASSES.index(OpClass.VIEW)
_TENSOR_DTYPES = ("float16", "bfloat16")
_FLOAT32 = DTYPE_NAMES.index("float32")


def _channels_first(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """A convolution's tensor laid out channels-first: more than one channel,
    and the channel dimension not the innermost one (NCHW, KCRS, NCDHW)."""
    return len(shape) >= 4 and shape[1] > 1 and stride[1] != 1


def _extra(trace: Trace) -> _Extra:
    got = _EXTRA.get(trace)
    if got is not None:
        return got
    c = op_costs(trace)
    nchw = np.zeros(trace.n_ops, np.float64)
    second = np.zeros(trace.n_ops, np.float64)
    reuse_op: list[int] = []
    reuse_bytes: list[float] = []
    just_written: set[int] = set()  # buffers the previous kernel wrote
    for op in trace.ops:
        if c.cls[op.id] == _VIEW:
            continue
        for v in set(op.reads):
            view = trace.views[v]
            if view.buffer in just_written:
                reuse_op.append(op.id)
                reuse_bytes.append(math.prod(view.shape) * DTYPE_BYTES[view.dtype])
        just_written = {trace.views[v].buffer for v in op.writes}
        if c.cls[op.id] == _CONV:
            for v in {*op.reads, *op.writes}:
                view = trace.views[v]
                if _channels_first(view.shape, view.stride):
                    nchw[op.id] += math.prod(view.shape) * DTYPE_BYTES[view.dtype]
        elif c.cls[op.id] == _NORM:
            second[op.id] = c.bytes_read[op.id]
    got = _EXTRA[trace] = _Extra(
        nchw, second, np.array(reuse_op, np.int64), np.array(reuse_bytes, np.float64)
    )
    return got


class KernelModel(LatencyModel):
    """GPU op latency from the kernels PyTorch launches (NOTE [ Kernel model ])."""

    name = "kernel"

    def __init__(self, options: KernelOptions | None = None):
        self.options = options or KernelOptions()
        self._cpu = Roofline()

    def _unit_table(self, hw: Hardware) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Peak FLOP/s, achieved fraction and tensor-core use per (class, dtype)."""
        k = self.options.constants
        tensor_cores = hw.compute_capability is not None and hw.compute_capability >= (7, 0)
        peak = np.empty((len(OP_CLASSES), len(DTYPE_NAMES)), np.float64)
        eff = np.empty_like(peak)
        tensor = np.zeros(peak.shape, bool)
        for ci in range(len(OP_CLASSES)):
            conv = ci == _CONV
            for di, dtype in enumerate(DTYPE_NAMES):
                tf32 = self.options.tf32_conv if conv else self.options.tf32_matmul
                if tensor_cores and dtype in _TENSOR_DTYPES and dtype in hw.peak_flops:
                    peak[ci, di] = hw.peak_flops[dtype]
                    eff[ci, di] = k.tensor_conv if conv else k.tensor_matmul
                    tensor[ci, di] = True
                elif dtype == "float32" and tf32 and "tfloat32" in hw.peak_flops:
                    peak[ci, di] = hw.peak_flops["tfloat32"]
                    eff[ci, di] = k.tensor_conv if conv else k.tensor_matmul
                    tensor[ci, di] = True
                else:
                    peak[ci, di] = hw.flops_for(dtype)
                    eff[ci, di] = k.cuda_cores
        return peak, eff, tensor

    def alone(self, trace: Trace, hw: Hardware) -> np.ndarray:
        """Seconds per op with the device to itself."""
        k = self.options.constants
        c = op_costs(trace)
        x = _extra(trace)
        peak, eff, tensor = self._unit_table(hw)
        p, e = peak[c.cls, c.dtype], eff[c.cls, c.dtype]
        compute = c.flops / (p * e)
        bw = hw.mem_bw_bytes_per_s * k.bandwidth
        hits = np.zeros(trace.n_ops, np.float64)
        fits = x.reuse_bytes <= hw.l2_cache_bytes
        np.add.at(hits, x.reuse_op[fits], x.reuse_bytes[fits])
        memory = (c.bytes_read - hits + c.bytes_written + x.second_pass_bytes) / bw
        t = np.maximum(compute, memory)
        on_tensor = tensor[c.cls, c.dtype]
        t = np.where(on_tensor & (c.cls == _CONV), t + 2.0 * x.nchw_conv_bytes / bw, t)
        # the faster of that and a CUDA-core kernel: convolutions, which
        # cudnn.benchmark times, and TF32 work, where cuBLAS and cuDNN fall
        # back to fp32 kernels wherever those are faster
        either = on_tensor & ((c.cls == _CONV) | (c.dtype == _FLOAT32))
        if either.any():
            cores = c.flops[either] / (hw.flops_for("float32") * k.cuda_cores)
            t[either] = np.minimum(t[either], np.maximum(cores, memory[either]))
        t = k.floor_s + t
        t[c.cls == _VIEW] = 0.0
        return t

    def predict_all(self, trace: Trace, hw: Hardware, usage: float = 0.0) -> np.ndarray:
        if hw.device is TargetDevice.CPU:
            return self._cpu.predict_all(trace, hw, usage)
        usage = check_usage(usage)
        return self.alone(trace, hw) * usage_stretch(usage)

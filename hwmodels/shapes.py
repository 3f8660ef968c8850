"""Seeded random op samples per op class, described as a target + JSON args.

A `SampleSpec` is exactly what a trace op holds (`target`, `args` with
tensors as ``{"view": k}``) plus how to make its input tensors, so the
microbenchmark's samples and captured ops go through one featurizer.
Shapes are modest (a CPU measures the whole set in minutes) but reach the
sizes of the shipped traces: ResNet-50 at batch 16 (convs up to ~4 GFLOP,
activations up to 2^24 elements). A conv backward computes two gradients,
so its forward-equivalent FLOPs are capped at half the forward's cap.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from memplan.hwmodels.opclass import OpClass

MAX_CONV_FLOPS = 4e9
MAX_MM_FLOPS = 8e9
MAX_NUMEL = 2**24


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """How to make one input: `fill` is randn, positive (uniform in [0.1, 1.1)),
    ones, or index:<high> (int64 in [0, high)); `transposed` stores the last
    two dims column-major (a `.t()` view of a contiguous tensor)."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    fill: str = "randn"
    transposed: bool = False


@dataclass(frozen=True, slots=True)
class SampleSpec:
    op_class: OpClass
    target: str
    tensors: tuple[TensorSpec, ...]
    args: dict[str, Any]


def _v(k: int) -> dict[str, int]:
    return {"view": k}


def _call(*args: Any, **kwargs: Any) -> dict[str, Any]:
    return {"args": list(args), "kwargs": kwargs}


def _logu(rng: np.random.Generator, lo: float, hi: float) -> int:
    return max(1, int(round(math.exp(rng.uniform(math.log(lo), math.log(hi))))))


def _split(rng: np.random.Generator, numel: int, rank: int) -> tuple[int, ...]:
    """A shape of `rank` dims whose product is close to `numel`."""
    cuts = np.sort(rng.uniform(0, math.log(numel), rank - 1))
    edges = np.concatenate([[0.0], cuts, [math.log(numel)]])
    return tuple(max(1, int(round(math.exp(d)))) for d in np.diff(edges))


def _pick(rng: np.random.Generator, items: list[Any], p: list[float] | None = None) -> Any:
    return items[int(rng.choice(len(items), p=p))]


def _channels(rng: np.random.Generator) -> int:
    return _pick(rng, [3, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 2048])


# feature-map sides of the zoo's CNNs (ResNet/VGG/DenseNet: 224..7, Inception: 299..8)
_SIDES = [7, 8, 14, 17, 28, 35, 56, 71, 73, 112, 147, 224]


def _side(rng: np.random.Generator) -> int:
    return _pick(rng, _SIDES) if rng.random() < 0.7 else _logu(rng, 4, 230)


# ---- conv ------------------------------------------------------------------------
def _conv(rng: np.random.Generator) -> SampleSpec | None:
    """Dense 2-D convolutions as CNNs use them (groups = 1: grouped and
    depthwise convs are outside the training range and fall back)."""
    n = _pick(rng, [1, 2, 4, 8, 16, 32])
    cin, cout = _channels(rng), _channels(rng)
    if cout == 3:
        return None  # no network maps back to 3 channels
    h = _side(rng)
    w = h if rng.random() < 0.9 else _side(rng)
    k = _pick(rng, [1, 3, 5, 7], [0.4, 0.42, 0.05, 0.13])
    kh, kw = (k, k) if rng.random() < 0.93 else _pick(rng, [(1, 7), (7, 1), (1, 3), (3, 1)])
    stride = _pick(rng, [1, 2], [0.75, 0.25])
    ph, pw = (kh // 2, kw // 2) if rng.random() < 0.85 else (0, 0)
    bias = rng.random() < 0.3
    if cin == 3 and kh * kw not in (9, 49):
        return None  # 3 channels only as a network's stem, as in real models
    ho = (h + 2 * ph - kh) // stride + 1
    wo = (w + 2 * pw - kw) // stride + 1
    if ho < 1 or wo < 1 or max(n * cin * h * w, n * cout * ho * wo) > MAX_NUMEL:
        return None
    flops = 2.0 * n * cout * ho * wo * cin * kh * kw
    backward = rng.random() >= 0.45
    if not 1e4 <= flops <= MAX_CONV_FLOPS / (2 if backward else 1):
        return None
    x = TensorSpec((n, cin, h, w))
    wt = TensorSpec((cout, cin, kh, kw))
    geo = ([stride, stride], [ph, pw], [1, 1], False, [0, 0], 1)
    if not backward:
        tensors = (x, wt) + ((TensorSpec((cout,)),) if bias else ())
        return SampleSpec(OpClass.CONV, "aten.convolution.default", tensors,
                          _call(_v(0), _v(1), _v(2) if bias else None, *geo))  # fmt: skip
    masks = [[True, True, False], [False, True, False], [True, True, True]]
    mask = _pick(rng, masks, [0.8, 0.1, 0.1])
    gy = TensorSpec((n, cout, ho, wo))
    bias_sizes = [cout] if mask[2] else None
    return SampleSpec(OpClass.CONV, "aten.convolution_backward.default", (gy, x, wt),
                      _call(_v(0), _v(1), _v(2), bias_sizes, *geo, mask))  # fmt: skip


# ---- matmul ----------------------------------------------------------------------
_WIDTHS = [64, 128, 256, 384, 512, 768, 1000, 1024, 1536, 2048, 3072, 4096]


def _width(rng: np.random.Generator) -> int:
    """A layer width: a common one, or any in 8..4096."""
    return _pick(rng, _WIDTHS) if rng.random() < 0.6 else _logu(rng, 8, 4096)


def _matmul(rng: np.random.Generator) -> SampleSpec | None:
    """Linear layers and attention as autograd runs them: forward
    x @ W.t() (+ bias), input grad g @ W, weight grad g.t() @ x; batched
    Q @ K.t() and P @ V with their backward transposes."""
    kind = _pick(rng, ["linear", "dgrad", "wgrad", "bmm"], [0.35, 0.2, 0.2, 0.25])
    rows, k, n = _logu(rng, 8, 16384), _width(rng), _width(rng)
    b = 1
    if kind == "bmm":
        b = _pick(rng, [12, 16, 24, 48, 96, 192, 384]) if rng.random() < 0.7 else _logu(rng, 2, 512)
        t, d = _logu(rng, 16, 1024), _pick(rng, [32, 64, 128])
        m, k, n = _pick(rng, [(t, d, t), (t, t, d), (d, t, t)])
        ta, tb = _pick(rng, [(False, True), (False, False), (True, False)])
    elif kind == "linear":
        m, ta, tb = rows, False, True
    elif kind == "dgrad":
        m, ta, tb = rows, False, False
    else:  # weight grad: (out, rows) @ (rows, in)
        m, k, ta, tb = k, rows, True, False
    if not 1e3 <= 2.0 * b * m * k * n <= MAX_MM_FLOPS or b * (m * k + k * n + m * n) > MAX_NUMEL:
        return None
    if kind == "bmm":
        a, bb = TensorSpec((b, m, k), transposed=ta), TensorSpec((b, k, n), transposed=tb)
        return SampleSpec(OpClass.MATMUL, "aten.bmm.default", (a, bb), _call(_v(0), _v(1)))
    a, bb = TensorSpec((m, k), transposed=ta), TensorSpec((k, n), transposed=tb)
    if kind == "linear" and rng.random() < 0.8:
        bias = TensorSpec((n,))
        return SampleSpec(OpClass.MATMUL, "aten.addmm.default", (bias, a, bb),
                          _call(_v(0), _v(1), _v(2)))  # fmt: skip
    return SampleSpec(OpClass.MATMUL, "aten.mm.default", (a, bb), _call(_v(0), _v(1)))


# ---- normalization -----------------------------------------------------------------
def _norm(rng: np.random.Generator) -> SampleSpec | None:
    if rng.random() < 0.7:  # batch norm over (N, C, H, W)
        n, c, h = _pick(rng, [1, 2, 4, 8, 16, 32]), _channels(rng), _side(rng)
        if n * c * h * h > MAX_NUMEL:
            return None
        x, ch = TensorSpec((n, c, h, h)), TensorSpec((c,))
        pos = TensorSpec((c,), fill="positive")
        if rng.random() < 0.5:
            training = rng.random() < 0.9
            return SampleSpec(OpClass.NORM, "aten.native_batch_norm.default", (x, ch, ch, ch, pos),
                              _call(_v(0), _v(1), _v(2), _v(3), _v(4), training, 0.1, 1e-5))  # fmt: skip
        mask = _pick(rng, [[True, True, True], [False, True, True]], [0.9, 0.1])
        tensors = (x, x, ch, ch, pos, ch, pos)
        return SampleSpec(OpClass.NORM, "aten.native_batch_norm_backward.default", tensors,
                          _call(_v(0), _v(1), _v(2), _v(3), _v(4), _v(5), _v(6), True, 1e-5, mask))  # fmt: skip
    d, rows = _width(rng), _logu(rng, 1, 16384)
    if d * rows > MAX_NUMEL // 2:
        return None
    shape = (rows, d) if rng.random() < 0.5 else (_logu(rng, 1, 16), max(1, rows // 16), d)
    x, ch = TensorSpec(shape), TensorSpec((d,))
    if rng.random() < 0.5:
        return SampleSpec(OpClass.NORM, "aten.native_layer_norm.default", (x, ch, ch),
                          _call(_v(0), [d], _v(1), _v(2), 1e-5))  # fmt: skip
    stats = TensorSpec((*shape[:-1], 1))
    pos = TensorSpec((*shape[:-1], 1), fill="positive")
    return SampleSpec(OpClass.NORM, "aten.native_layer_norm_backward.default",
                      (x, x, stats, pos, ch, ch),
                      _call(_v(0), _v(1), [d], _v(2), _v(3), _v(4), _v(5), [True, True, True]))  # fmt: skip


# ---- elementwise and optimizer updates ---------------------------------------------
_UNARY = ["relu", "relu_", "sqrt", "neg", "exp", "sigmoid", "tanh", "gelu", "rsqrt", "clone",
          "zero_", "silu", "abs", "ones_like"]  # fmt: skip
_BINARY = ["add.Tensor", "add_.Tensor", "mul.Tensor", "mul_.Tensor", "div.Tensor", "sub.Tensor",
           "threshold_backward", "gelu_backward", "tanh_backward", "copy_", "maximum",
           "le.Tensor"]  # fmt: skip
_SCALAR = ["mul.Tensor", "mul_.Tensor", "add_.Tensor", "div.Tensor", "div.Scalar", "div_.Scalar",
           "mul.Scalar", "fill_.Scalar", "pow.Tensor_Scalar", "bernoulli_.float"]  # fmt: skip


def _shape_of(rng: np.random.Generator, numel: int) -> tuple[int, ...]:
    return _split(rng, numel, _pick(rng, [1, 2, 3, 4], [0.25, 0.3, 0.1, 0.35]))


def _elementwise(rng: np.random.Generator) -> SampleSpec | None:
    shape = _shape_of(rng, _logu(rng, 1, MAX_NUMEL))
    # a transposed (non-contiguous) first operand now and then, as after a .t()
    x = TensorSpec(shape, transposed=len(shape) >= 2 and rng.random() < 0.15)
    u = rng.random()
    if u < 0.03:  # integer counters (BatchNorm's num_batches_tracked += 1)
        n = TensorSpec(_shape_of(rng, _logu(rng, 1, 2**16)), "int64", "index:100")
        return SampleSpec(OpClass.ELEMENTWISE, "aten.add_.Tensor", (n,), _call(_v(0), 1))
    if u < 0.3:
        name = _pick(rng, _UNARY)
        fill = "positive" if name in ("sqrt", "rsqrt") else "randn"
        target = f"aten.{name}.default"
        arg = TensorSpec(shape, fill=fill, transposed=x.transposed)
        return SampleSpec(OpClass.ELEMENTWISE, target, (arg,), _call(_v(0)))
    if u < 0.7:
        name = _pick(rng, _BINARY)
        target = name if "." in name else f"{name}.default"
        args: list[Any] = [_v(0), _v(1)]
        if name == "threshold_backward":
            args.append(0)
        other = x
        if rng.random() < 0.25 and len(shape) >= 2 and "backward" not in name:
            # broadcast a per-channel / per-row operand: (1, C, 1, 1) or (D,)
            other = TensorSpec(tuple(d if i == 1 else 1 for i, d in enumerate(shape))
                               if len(shape) == 4 else shape[-1:])  # fmt: skip
        alpha = name.startswith("add") and rng.random() < 0.3
        kwargs = {"alpha": float(rng.uniform(-1, 1))} if alpha else {}
        return SampleSpec(OpClass.ELEMENTWISE, f"aten.{target}", (x, other), _call(*args, **kwargs))
    if u < 0.93:
        name = _pick(rng, _SCALAR)
        value = 0.1 if name.startswith("bernoulli") else float(rng.uniform(0.5, 2))
        return SampleSpec(OpClass.ELEMENTWISE, f"aten.{name}", (x,), _call(_v(0), value))
    if u < 0.97:  # where(mask, a, b): attention masking
        mask = TensorSpec(shape, "bool", "mask")
        return SampleSpec(OpClass.ELEMENTWISE, "aten.where.self", (mask, x, x),
                          _call(_v(0), _v(1), _v(2)))  # fmt: skip
    return SampleSpec(OpClass.ELEMENTWISE, "aten.zeros.default", (),
                      _call(list(shape), dtype={"dtype": "float32"}, device={"device": "cpu"}))  # fmt: skip


def _optimizer(rng: np.random.Generator) -> SampleSpec | None:
    if rng.random() < 0.75:
        shape = _shape_of(rng, _logu(rng, 1, MAX_NUMEL // 2))
        x, pos = TensorSpec(shape), TensorSpec(shape, fill="positive")
        name = _pick(rng, ["addcmul_", "addcdiv_", "lerp_"])
        if name == "lerp_":
            return SampleSpec(
                OpClass.OPTIMIZER, "aten.lerp_.Scalar", (x, x), _call(_v(0), _v(1), 0.1)
            )
        return SampleSpec(OpClass.OPTIMIZER, f"aten.{name}.default", (x, x, pos),
                          _call(_v(0), _v(1), _v(2), value=float(rng.uniform(-1, 1))))  # fmt: skip
    k = _logu(rng, 1, 64)
    shapes = [_shape_of(rng, _logu(rng, 1, MAX_NUMEL // (4 * k))) for _ in range(k)]
    name = _pick(rng, ["_foreach_add_.List", "_foreach_mul_.Scalar", "_foreach_addcmul_.Scalar",
                       "_foreach_lerp_.Scalar"])  # fmt: skip
    a = [_v(i) for i in range(k)]
    b = [_v(k + i) for i in range(k)]
    tensors = tuple(TensorSpec(s) for s in shapes) * (3 if "addcmul" in name else 2)
    if name.startswith("_foreach_mul_"):
        return SampleSpec(OpClass.OPTIMIZER, f"aten.{name}", tensors[:k], _call(a, 0.9))
    if "addcmul" in name:
        c = [_v(2 * k + i) for i in range(k)]
        return SampleSpec(OpClass.OPTIMIZER, f"aten.{name}", tensors, _call(a, b, c, 0.1))
    extra = [0.1] if "lerp" in name else []
    return SampleSpec(OpClass.OPTIMIZER, f"aten.{name}", tensors, _call(a, b, *extra))


# ---- reductions ----------------------------------------------------------------------
def _reduction(rng: np.random.Generator) -> SampleSpec | None:
    u = rng.random()
    if u < 0.3:  # pooling over (N, C, H, W)
        n, c, h = _pick(rng, [1, 2, 4, 8, 16]), _channels(rng), _side(rng)
        if n * c * h * h > MAX_NUMEL:
            return None
        k, s = _pick(rng, [2, 3]), _pick(rng, [1, 2], [0.2, 0.8])
        p = k // 2 if k == 3 else 0
        ho = (h + 2 * p - k) // s + 1
        if ho < 1:
            return None
        x = TensorSpec((n, c, h, h))
        geo = ([k, k], [s, s], [p, p])
        names = ["max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d",
                 "avg_pool2d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward"]  # fmt: skip
        name = _pick(rng, names, [0.25, 0.25, 0.15, 0.15, 0.1, 0.1])
        target = f"aten.{name}.default"
        gy = TensorSpec((n, c, ho, ho))
        if name == "max_pool2d_with_indices":
            return SampleSpec(OpClass.REDUCTION, target, (x,), _call(_v(0), *geo, [1, 1], False))
        if name == "avg_pool2d":
            return SampleSpec(OpClass.REDUCTION, target, (x,), _call(_v(0), *geo))
        if name == "avg_pool2d_backward":
            return SampleSpec(OpClass.REDUCTION, target, (gy, x),
                              _call(_v(0), _v(1), *geo, False, True, None))  # fmt: skip
        if name == "_adaptive_avg_pool2d":
            return SampleSpec(OpClass.REDUCTION, target, (x,), _call(_v(0), [ho, ho]))
        if name == "_adaptive_avg_pool2d_backward":
            return SampleSpec(OpClass.REDUCTION, target, (gy, x), _call(_v(0), _v(1)))
        idx = TensorSpec((n, c, ho, ho), "int64", f"index:{h * h}")
        return SampleSpec(OpClass.REDUCTION, target, (gy, x, idx),
                          _call(_v(0), _v(1), *geo, [1, 1], False, _v(2)))  # fmt: skip
    if u < 0.55:  # row-wise softmax family and the loss
        rows, cols = _logu(rng, 1, 8192), _logu(rng, 2, 32768)
        if rows * cols > MAX_NUMEL:
            return None
        x = TensorSpec((rows, cols))
        name = _pick(rng, ["_log_softmax", "_softmax", "_log_softmax_backward_data",
                           "_softmax_backward_data", "nll_loss_forward", "nll_loss_backward"])  # fmt: skip
        if name in ("_log_softmax", "_softmax"):
            return SampleSpec(
                OpClass.REDUCTION, f"aten.{name}.default", (x,), _call(_v(0), 1, False)
            )
        if name.endswith("backward_data"):
            return SampleSpec(OpClass.REDUCTION, f"aten.{name}.default", (x, x),
                              _call(_v(0), _v(1), 1, {"dtype": "float32"}))  # fmt: skip
        tgt = TensorSpec((rows,), "int64", f"index:{cols}")
        if name == "nll_loss_forward":
            return SampleSpec(OpClass.REDUCTION, f"aten.{name}.default", (x, tgt),
                              _call(_v(0), _v(1), None, 1, -100))  # fmt: skip
        one = TensorSpec((), fill="ones")
        return SampleSpec(OpClass.REDUCTION, f"aten.{name}.default", (one, x, tgt, one),
                          _call(_v(0), _v(1), _v(2), None, 1, -100, _v(3)))  # fmt: skip
    if u < 0.7:  # a bias gradient: (rows, width) summed over rows
        rows, width = _logu(rng, 1, 16384), _width(rng)
        if rows * width > MAX_NUMEL:
            return None
        return SampleSpec(OpClass.REDUCTION, "aten.sum.dim_IntList", (TensorSpec((rows, width)),),
                          _call(_v(0), [0], True))  # fmt: skip
    shape = _shape_of(rng, _logu(rng, 2, MAX_NUMEL))
    x = TensorSpec(shape)
    if len(shape) == 4 and rng.random() < 0.4:
        return SampleSpec(OpClass.REDUCTION, "aten.mean.dim", (x,), _call(_v(0), [-1, -2], True))
    dims = sorted(
        {int(d) for d in rng.choice(len(shape), size=_logu(rng, 1, len(shape)), replace=False)}
    )
    name = _pick(rng, ["sum.dim_IntList", "mean.dim", "amax.default", "sum.default"])
    if name == "sum.default":
        return SampleSpec(OpClass.REDUCTION, "aten.sum.default", (x,), _call(_v(0)))
    return SampleSpec(
        OpClass.REDUCTION, f"aten.{name}", (x,), _call(_v(0), dims, bool(rng.random() < 0.5))
    )


# ---- other -----------------------------------------------------------------------------
def _other(rng: np.random.Generator) -> SampleSpec | None:
    name = _pick(rng, ["cat", "embedding", "embedding_dense_backward", "index_select",
                       "constant_pad_nd", "gather"])  # fmt: skip
    if name == "cat":
        k = _logu(rng, 2, 64)
        base = _shape_of(rng, _logu(rng, 1, MAX_NUMEL // (2 * k)))
        dim = int(rng.integers(len(base)))
        tensors = tuple(TensorSpec(base) for _ in range(k))
        return SampleSpec(
            OpClass.OTHER, "aten.cat.default", tensors, _call([_v(i) for i in range(k)], dim)
        )
    if name.startswith("embedding"):
        vocab, d, n = _logu(rng, 2, 50000), _logu(rng, 8, 1024), _logu(rng, 1, 8192)
        if vocab * d > MAX_NUMEL or n * d > MAX_NUMEL:
            return None
        idx = TensorSpec((n,), "int64", f"index:{vocab}")
        if name == "embedding":
            return SampleSpec(OpClass.OTHER, "aten.embedding.default", (TensorSpec((vocab, d)), idx),
                              _call(_v(0), _v(1)))  # fmt: skip
        return SampleSpec(OpClass.OTHER, "aten.embedding_dense_backward.default",
                          (TensorSpec((n, d)), idx), _call(_v(0), _v(1), vocab, -1, False))  # fmt: skip
    shape = _shape_of(rng, _logu(rng, 2, MAX_NUMEL // 2))
    x = TensorSpec(shape)
    dim = int(rng.integers(len(shape)))
    if name == "constant_pad_nd":
        pad = [int(rng.integers(0, 3)) for _ in range(2 * min(len(shape), 2))]
        return SampleSpec(
            OpClass.OTHER, "aten.constant_pad_nd.default", (x,), _call(_v(0), pad, 0.0)
        )
    m = _logu(rng, 1, shape[dim])
    if name == "index_select":
        idx = TensorSpec((m,), "int64", f"index:{shape[dim]}")
        return SampleSpec(
            OpClass.OTHER, "aten.index_select.default", (x, idx), _call(_v(0), dim, _v(1))
        )
    idx = TensorSpec(
        tuple(m if i == dim else s for i, s in enumerate(shape)), "int64", f"index:{shape[dim]}"
    )
    return SampleSpec(OpClass.OTHER, "aten.gather.default", (x, idx), _call(_v(0), dim, _v(1)))


GENERATORS: dict[OpClass, Callable[[np.random.Generator], SampleSpec | None]] = {
    OpClass.CONV: _conv,
    OpClass.MATMUL: _matmul,
    OpClass.NORM: _norm,
    OpClass.ELEMENTWISE: _elementwise,
    OpClass.REDUCTION: _reduction,
    OpClass.OPTIMIZER: _optimizer,
    OpClass.OTHER: _other,
}
MEASURED_CLASSES: tuple[OpClass, ...] = tuple(GENERATORS)


def sample_specs(op_class: OpClass, n: int, seed: int) -> list[SampleSpec]:
    """`n` seeded samples of one class (deterministic for a given seed)."""
    rng = np.random.default_rng([seed, MEASURED_CLASSES.index(op_class)])
    out: list[SampleSpec] = []
    while len(out) < n:
        s = GENERATORS[op_class](rng)
        if s is not None:
            out.append(s)
    return out

"""Per-trace cost and feature arrays, computed once and cached per `Trace`.

Two levels:
- `op_costs(trace)`: per op class, FLOPs, bytes read and written, compute
  dtype -- what the roofline needs, as numpy arrays.
- `class_features(trace)`: per op class, a matrix of MLP input features built
  from `Op.args` and view shapes (log-scaled dims, op parameters), and each
  op's base name for the model's one-hot vocabulary.

Both are cached in weak dictionaries keyed by the `Trace` object (traces are
immutable), so planners calling a model thousands of times pay once.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np
from memplan.hwmodels.opclass import (
    OP_CLASSES,
    OpClass,
    base_name,
    bind,
    classify,
    is_inplace,
    vocab_token,
)
from memplan.traces.io import DTYPE_BYTES
from memplan.traces.model import Op, Trace

DTYPE_NAMES: tuple[str, ...] = tuple(DTYPE_BYTES)
_INDEX_DTYPES = {"int64", "int32"}
_FLOATING = {"float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2"}


@dataclass(frozen=True, eq=False)
class OpCosts:
    """Per-op arrays (length n_ops): class index into `OP_CLASSES`, FLOPs
    (the trace's own, or an analytic count for conv/matmul ops where the
    trace has none), bytes read and written (distinct views, elements x
    itemsize), and the compute dtype as an index into `DTYPE_NAMES`."""

    cls: np.ndarray
    flops: np.ndarray
    bytes_read: np.ndarray
    bytes_written: np.ndarray
    dtype: np.ndarray


_COSTS: weakref.WeakKeyDictionary[Trace, OpCosts] = weakref.WeakKeyDictionary()


def op_costs(trace: Trace) -> OpCosts:
    """The trace's `OpCosts`, built on first use and cached."""
    got = _COSTS.get(trace)
    if got is None:
        got = _COSTS[trace] = _build_costs(trace)
    return got


def _build_costs(trace: Trace) -> OpCosts:
    n = trace.n_ops
    view_bytes = np.array(
        [math.prod(v.shape) * DTYPE_BYTES[v.dtype] for v in trace.views], dtype=np.float64
    )
    cls = np.zeros(n, np.int8)
    flops = np.zeros(n, np.float64)
    rd = np.zeros(n, np.float64)
    wr = np.zeros(n, np.float64)
    dt = np.zeros(n, np.int8)
    for op in trace.ops:
        c, flops[op.id], rd[op.id], wr[op.id], d = single_op_cost(op, trace, view_bytes)
        cls[op.id] = _CLS_INDEX[c]
        dt[op.id] = _DTYPE_INDEX[d]
    return OpCosts(cls, flops, rd, wr, dt)


_CLS_INDEX = {c: i for i, c in enumerate(OP_CLASSES)}
_DTYPE_INDEX = {d: i for i, d in enumerate(DTYPE_NAMES)}


def single_op_cost(
    op: Op, trace: Trace, view_bytes: np.ndarray | None = None
) -> tuple[OpClass, float, float, float, str]:
    """(class, FLOPs, bytes read, bytes written, compute dtype) of one op;
    VIEW ops cost nothing. The scalar twin of `op_costs`."""
    c = classify(op.target)
    if c is OpClass.VIEW:
        return c, 0.0, 0.0, 0.0, "float32"

    def nbytes(views: set[int]) -> float:
        if view_bytes is not None:
            return float(view_bytes[list(views)].sum()) if views else 0.0
        return float(
            sum(math.prod(trace.views[v].shape) * DTYPE_BYTES[trace.views[v].dtype] for v in views)
        )

    f = float(op.flops)
    if f <= 0 and c in (OpClass.CONV, OpClass.MATMUL):
        f = analytic_flops(op, trace)
    return c, f, nbytes(set(op.reads)), nbytes(set(op.writes)), _compute_dtype(trace, op)


def _compute_dtype(trace: Trace, op: Op) -> str:
    for v in (*op.reads, *op.writes):
        d = trace.views[v].dtype
        if d in _FLOATING:
            return d
    return trace.views[op.reads[0]].dtype if op.reads else "float32"


# ---- analytic FLOPs (torch.utils.flop_counter's conventions) -----------------
def _shape(trace: Trace, x: Any) -> tuple[int, ...] | None:
    if isinstance(x, dict) and "view" in x:
        return trace.views[x["view"]].shape
    return None


def _ints(x: Any, n: int, default: int) -> list[int]:
    if isinstance(x, int) and not isinstance(x, bool):
        return [x] * n
    if isinstance(x, list) and x:
        vals = [int(v) for v in x]
        return (vals * n)[:n] if len(vals) == 1 else vals[:n] + [default] * (n - len(vals))
    return [default] * n


def analytic_flops(op: Op, trace: Trace) -> float:
    """2 x multiply-adds of a conv or matmul op from its shapes (bias ignored,
    as torch's flop counter does); 0 for other ops or unreadable args."""
    a = bind(op.target, op.args)
    name = base_name(op.target)
    if classify(op.target) is OpClass.CONV:
        back = name.endswith("backward")
        x, w = _shape(trace, a.get("input")), _shape(trace, a.get("weight"))
        out = _shape(trace, a.get("grad_output")) if back else _out_shape(trace, op)
        if not x or not w or not out or len(x) < 3:
            return 0.0
        if a.get("transposed"):
            fwd = 2.0 * math.prod(x) * math.prod(w[1:])  # every input element scatters
        else:
            fwd = 2.0 * x[0] * math.prod(out[1:]) * math.prod(w[1:])
        if not back:
            return fwd
        mask = a.get("output_mask") or [True, True, True]
        return fwd * (int(bool(mask[0])) + int(bool(mask[1])))
    dims = matmul_dims(a, name, trace)
    return 2.0 * math.prod(dims[:4]) if dims else 0.0


def _out_shape(trace: Trace, op: Op) -> tuple[int, ...] | None:
    return trace.views[op.writes[0]].shape if op.writes else None


def matmul_dims(a: dict[str, Any], name: str, trace: Trace) -> tuple[int, ...] | None:
    """(batch, M, K, N, a_transposed, b_transposed) of a matmul-class call."""
    pairs = (("mat1", "mat2"), ("batch1", "batch2"), ("self", "mat2"), ("mat", "vec"),
             ("input", "weight"), ("self", "other"), ("self", "tensor"))  # fmt: skip
    for ka, kb in pairs:
        if ka in a and kb in a:
            va, vb = a[ka], a[kb]
            sa, sb = _shape(trace, va), _shape(trace, vb)
            if sa is None or sb is None:
                continue
            ta, tb = _transposed(trace, va), _transposed(trace, vb)
            if name == "linear":  # weight is (N, K)
                sb = tuple(reversed(sb)) if len(sb) == 2 else (sb[0], 1)
                tb = 1 - tb
            if len(sa) == 1:
                sa = (1, sa[0])
            if len(sb) == 1:
                sb = (sb[0], 1)
            batch = math.prod(sa[:-2]) if len(sa) > 2 else 1
            if name == "linear" or (len(sa) > 2 and len(sb) == 2):
                batch, m = 1, math.prod(sa[:-1])
            else:
                m = sa[-2]
            return (batch, m, sa[-1], sb[-1], ta, tb)
    return None


def _transposed(trace: Trace, x: Any) -> int:
    v = trace.views[x["view"]]
    return int(len(v.shape) >= 2 and v.stride[-1] != 1 and v.shape[-1] > 1)


# ---- MLP features --------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class ClassFeatures:
    """MLP inputs of every op of one class in a trace: `ops` (op ids),
    `X` float64[len(ops), len(names)] and each op's vocabulary token
    (`hwmodels.opclass.vocab_token`)."""

    ops: np.ndarray
    X: np.ndarray
    op_names: tuple[str, ...]


_FEATURES: weakref.WeakKeyDictionary[Trace, dict[OpClass, ClassFeatures]] = (
    weakref.WeakKeyDictionary()
)


def _lg(x: float) -> float:
    return math.log2(1.0 + max(float(x), 0.0))


COMMON_NAMES = ("log_flops", "log_bytes_read", "log_bytes_written", "itemsize")
CLASS_NAMES: dict[OpClass, tuple[str, ...]] = {
    OpClass.CONV: ("log_n", "log_cin", "log_h", "log_w", "log_cout", "log_kh", "log_kw",
                   "stride_h", "stride_w", "pad_h", "pad_w", "dilation", "log_groups",
                   "transposed", "backward", "grad_input", "grad_weight", "bias",
                   "log_hout", "log_wout", "log_gemm_m", "log_gemm_k", "cin_by16",
                   "cout_by16"),
    OpClass.MATMUL: ("log_batch", "log_m", "log_k", "log_n", "a_transposed", "b_transposed",
                     "bias", "m_by16", "k_by16", "n_by16"),
    OpClass.NORM: ("log_numel", "log_channels", "log_inner", "training", "backward",
                   "layer_norm", "grad_input", "grad_weight", "grad_bias"),
    OpClass.ELEMENTWISE: ("log_numel_out", "log_numel_in_max", "n_tensors",
                          "broadcast_log_ratio", "inplace", "contiguous", "n_int_scalars",
                          "n_float_scalars", "floating"),
    OpClass.REDUCTION: ("log_numel_in", "log_numel_out", "log_reduce_ratio", "last_dim_reduced",
                        "log_last_dim", "log_kernel", "log_stride", "backward"),
    OpClass.OTHER: ("log_numel_in_max", "log_numel_out", "n_tensors", "log_numel_index",
                    "log_outer", "log_inner"),
}  # fmt: skip
CLASS_NAMES[OpClass.OPTIMIZER] = CLASS_NAMES[OpClass.ELEMENTWISE]


def feature_names(c: OpClass) -> tuple[str, ...]:
    """Column names of the class's feature matrix (the one-hot name vocabulary
    and `usage` are appended by the model)."""
    return COMMON_NAMES + CLASS_NAMES[c]


def class_features(trace: Trace) -> dict[OpClass, ClassFeatures]:
    """Feature matrices per op class (VIEW ops have none), cached per trace."""
    got = _FEATURES.get(trace)
    if got is None:
        got = _FEATURES[trace] = _build_features(trace)
    return got


def _build_features(trace: Trace) -> dict[OpClass, ClassFeatures]:
    costs = op_costs(trace)
    rows: dict[OpClass, list[list[float]]] = {}
    ids: dict[OpClass, list[int]] = {}
    names: dict[OpClass, list[str]] = {}
    for op in trace.ops:
        i = op.id
        c = OP_CLASSES[costs.cls[i]]
        if c is OpClass.VIEW:
            continue
        cost = (c, costs.flops[i], costs.bytes_read[i], costs.bytes_written[i],
                DTYPE_NAMES[costs.dtype[i]])  # fmt: skip
        rows.setdefault(c, []).append(_row(op, trace, cost))
        ids.setdefault(c, []).append(i)
        names.setdefault(c, []).append(vocab_token(op.target))
    return {
        c: ClassFeatures(
            np.asarray(ids[c], np.int64), np.asarray(rows[c], np.float64), tuple(names[c])
        )  # fmt: skip
        for c in rows
    }


def single_op_features(op: Op, trace: Trace) -> tuple[OpClass, np.ndarray | None, str]:
    """(class, feature row or None for VIEW ops, vocabulary token) of one op:
    the scalar twin of `class_features`."""
    cost = single_op_cost(op, trace)
    if cost[0] is OpClass.VIEW:
        return cost[0], None, vocab_token(op.target)
    return cost[0], np.asarray(_row(op, trace, cost), np.float64), vocab_token(op.target)


def _row(op: Op, trace: Trace, cost: tuple[OpClass, float, float, float, str]) -> list[float]:
    c, flops, rd, wr, dtype = cost
    common = [_lg(flops), _lg(rd), _lg(wr), float(DTYPE_BYTES[dtype])]
    return common + _EXTRACT[c](op, trace)


def _tensors(trace: Trace, x: Any) -> list[int]:
    """View ids inside an argument (a view, or a list of views)."""
    if isinstance(x, dict) and "view" in x:
        return [x["view"]]
    if isinstance(x, list):
        return [v for y in x for v in _tensors(trace, y)]
    return []


def _conv(op: Op, trace: Trace) -> list[float]:
    a = bind(op.target, op.args)
    back = base_name(op.target).endswith("backward")
    x = _shape(trace, a.get("input")) or (1, 1, 1, 1)
    w = _shape(trace, a.get("weight")) or (1, 1, 1, 1)
    out = (_shape(trace, a.get("grad_output")) if back else _out_shape(trace, op)) or x
    nsp = max(len(x) - 2, 1)
    transposed = bool(a.get("transposed", False))
    groups = int(a.get("groups", 1) or 1)
    stride = _ints(a.get("stride"), 2, 1)
    pad = _ints(a.get("padding"), 2, 0)
    dil = max(_ints(a.get("dilation"), nsp, 1))
    cout = w[1] * groups if transposed else w[0]
    kh, kw = (w[2], math.prod(w[3:])) if len(w) > 2 else (1, 1)
    h, wd = (x[2], math.prod(x[3:])) if len(x) > 2 else (1, 1)
    ho, wo = (out[2], math.prod(out[3:])) if len(out) > 2 else (1, 1)
    if back:
        mask = [bool(m) for m in (a.get("output_mask") or [True, True, True])]
    else:
        mask = [True, False, a.get("bias") is not None]
    # the implicit GEMM: (N x Ho x Wo) rows by (Cin/groups x kh x kw) deep
    gemm_m, gemm_k = x[0] * ho * wo, (x[1] // max(groups, 1)) * kh * kw
    return [_lg(x[0]), _lg(x[1]), _lg(h), _lg(wd), _lg(cout), _lg(kh), _lg(kw),
            stride[0], stride[1], pad[0], pad[1], dil, _lg(groups), float(transposed),
            float(back), float(mask[0]), float(mask[1]), float(mask[2]), _lg(ho), _lg(wo),
            _lg(gemm_m), _lg(gemm_k), _by16(x[1] // max(groups, 1)), _by16(cout)]  # fmt: skip


def _matmul(op: Op, trace: Trace) -> list[float]:
    a = bind(op.target, op.args)
    name = base_name(op.target)
    b, m, k, n, ta, tb = matmul_dims(a, name, trace) or (1, 1, 1, 1, 0, 0)
    bias = name in ("addmm", "baddbmm", "addbmm", "addmv", "_addmm_activation") or (
        name == "linear" and a.get("bias") is not None
    )
    return [_lg(b), _lg(m), _lg(k), _lg(n), float(ta), float(tb), float(bias), _by16(m),
            _by16(k), _by16(n)]  # fmt: skip


def _norm(op: Op, trace: Trace) -> list[float]:
    a = bind(op.target, op.args)
    name = base_name(op.target)
    back = name.endswith("backward")
    x = _shape(trace, a.get("input")) or _shape(trace, a.get("self")) or (1,)
    layer = "layer_norm" in name or "rms_norm" in name
    ns = a.get("normalized_shape")
    if layer:
        c = math.prod(int(d) for d in ns) if isinstance(ns, list) and ns else x[-1]
    else:
        c = x[1] if len(x) > 1 else 1
    numel = math.prod(x)
    training = a.get("training", a.get("train", True))
    mask = [bool(m) for m in (a.get("output_mask") or [True, back, back])]
    return [_lg(numel), _lg(c), _lg(numel / max(c, 1)), float(bool(training)), float(back),
            float(layer), float(mask[0]), float(mask[1]), float(mask[2])]  # fmt: skip


def _elementwise(op: Op, trace: Trace) -> list[float]:
    a = bind(op.target, op.args)
    tensors = [v for x in a.values() for v in _tensors(trace, x)]
    in_numel = [math.prod(trace.views[v].shape) for v in tensors] or [1]
    outs = op.writes or tuple(tensors[:1])
    out_numel = max((math.prod(trace.views[v].shape) for v in outs), default=1)
    # NOTE [ Scalar arguments ]
    # A Python int (alpha=1, a counter's += 1) and a float (alpha=0.3, x * 1.7)
    # take different paths through dispatch and the kernel (a float is wrapped
    # and multiplied in); on a tiny op that is most of its time, so they are
    # counted apart.
    numbers = [x for x in a.values() if isinstance(x, int | float) and not isinstance(x, bool)]
    n_float = sum(1 for x in numbers if isinstance(x, float))
    contiguous = all(_contiguous(trace.views[v].shape, trace.views[v].stride) for v in tensors)
    ratio = math.log2(max(min(in_numel), 1) / max(out_numel, 1))
    floating = any(trace.views[v].dtype in _FLOATING for v in (*outs, *tensors))
    return [_lg(out_numel), _lg(max(in_numel)), float(len(tensors)), ratio,
            float(is_inplace(op.target)), float(contiguous), float(len(numbers) - n_float),
            float(n_float), float(floating)]  # fmt: skip


def _reduction(op: Op, trace: Trace) -> list[float]:
    a = bind(op.target, op.args)
    name = base_name(op.target)
    back = "backward" in name
    first = a.get("grad_output") if back else None
    x = _shape(trace, first) or _shape(trace, a.get("self")) or _shape(trace, a.get("input"))
    x = x or (1,)
    out = _out_shape(trace, op) or (1,)  # () for a scalar loss: numel 1
    n_in, n_out = math.prod(x), math.prod(out)
    dims = a.get("dim")
    if isinstance(dims, int):
        dims = [dims]
    if "pool" in name or not isinstance(dims, list) or not dims or not x:
        last = 1.0  # windows over the innermost dims, or a full reduction
    else:
        last = float(any(int(d) % len(x) == len(x) - 1 for d in dims))
    kernel = math.prod(_ints(a.get("kernel_size"), 2, 1)) if "kernel_size" in a else 1
    stride = math.prod(_ints(a.get("stride"), 2, 1)) if a.get("stride") else kernel
    big, small = max(n_in, n_out), min(n_in, n_out)
    return [_lg(n_in), _lg(n_out), math.log2(max(big, 1) / max(small, 1)), last, _lg(x[-1]),
            _lg(kernel), _lg(stride), float(back)]  # fmt: skip


def _other(op: Op, trace: Trace) -> list[float]:
    """Gathers, scatters, pads and concatenations: how much moves, how many
    indices pick it, and the extents around the indexed dimension (`dim`, or
    the last one): whole contiguous rows move fast, strided elements do not."""
    a = bind(op.target, op.args)
    numel_in = [math.prod(trace.views[v].shape) for v in op.reads] or [0]
    numel_out = [math.prod(trace.views[v].shape) for v in op.writes] or [0]
    index = [v for v in op.reads if trace.views[v].dtype in _INDEX_DTYPES]
    data = [v for v in op.reads if v not in index]
    first = data[0] if data else (op.reads[0] if op.reads else None)
    shape = trace.views[first].shape if first is not None else ()
    dim = 0 if base_name(op.target) == "embedding" else a.get("dim", -1)  # rows of the table
    if not isinstance(dim, int) or not shape:
        dim = -1
    d = dim % len(shape) if shape else 0
    outer, inner = math.prod(shape[:d]), math.prod(shape[d + 1 :])
    n_index = sum(math.prod(trace.views[v].shape) for v in index)
    return [_lg(max(numel_in)), _lg(max(numel_out)), float(len(op.reads)), _lg(n_index),
            _lg(outer), _lg(inner)]  # fmt: skip


def _by16(n: int) -> float:
    """1.0 when `n` fills whole 16-lane vectors (AVX-512 float32, tensor-core
    tiles): kernels take their fast paths; ragged sizes do not."""
    return float(n % 16 == 0)


def _contiguous(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    expect = 1
    for n, s in zip(reversed(shape), reversed(stride), strict=True):
        if n != 1 and s != expect:
            return False
        expect *= n
    return True


_EXTRACT = {
    OpClass.CONV: _conv,
    OpClass.MATMUL: _matmul,
    OpClass.NORM: _norm,
    OpClass.ELEMENTWISE: _elementwise,
    OpClass.OPTIMIZER: _elementwise,
    OpClass.REDUCTION: _reduction,
    OpClass.OTHER: _other,
}

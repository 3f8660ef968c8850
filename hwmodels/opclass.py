"""Op classes: which latency family an aten target belongs to, and its named arguments.

A trace op is `target` + `args` (the JSON form of the call). Both the
roofline's efficiency factors and the MLP's per-class networks key on the
class chosen here, so the same function classifies microbenchmark samples
and captured ops.
"""

from __future__ import annotations

import enum
import functools
from typing import Any


class OpClass(enum.Enum):
    CONV = "conv"
    MATMUL = "matmul"
    NORM = "norm"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    OPTIMIZER = "optimizer"
    OTHER = "other"
    # metadata-only ops (view, t, expand, detach, ...): no kernel, no bytes moved
    VIEW = "view"


OP_CLASSES: tuple[OpClass, ...] = tuple(OpClass)

# NOTE [ Op classes ]
# By what dominates an op's cost, from its target's packet (in-place `_` dropped):
# - CONV: convolutions forward and backward; MATMUL: mm, addmm, bmm, baddbmm, addbmm,
#   matmul, linear, dot/mv; NORM: batch/layer/group norm forward and backward.
# - REDUCTION: sum/mean/amax/var, (log-)softmax, nll_loss, pooling, embedding-bag gathers.
# - OPTIMIZER: addcmul, addcdiv, lerp, the _foreach_/_fused_ families (a for-loop Adam's
#   mul_/add_/sqrt/div stay ELEMENTWISE: same cost as in forward).
# - ELEMENTWISE: pointwise ops, copies, fills, activations and their backward.
# - VIEW: outputs aliasing an input without writing it (by schema), _unsafe_view, `empty*`;
#   they cost 0.
# - OTHER: the rest (cat, index, scatter, embedding, sort, ...), timed by bytes moved.
# Full text: docs/notes.md, "Op classes".

_CONV = {
    "convolution", "convolution_backward", "_convolution", "conv2d", "conv1d", "conv3d",
    "cudnn_convolution", "cudnn_convolution_transpose", "mkldnn_convolution",
    "_slow_conv2d_forward", "_slow_conv2d_backward", "thnn_conv2d", "conv_transpose2d",
}  # fmt: skip
_MATMUL = {
    "mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "mv", "addmv", "dot",
    "_addmm_activation",
}  # fmt: skip
_NORM = {
    "native_batch_norm", "native_batch_norm_backward", "_native_batch_norm_legit",
    "_native_batch_norm_legit_functional", "_native_batch_norm_legit_no_training",
    "batch_norm_backward", "cudnn_batch_norm", "cudnn_batch_norm_backward",
    "miopen_batch_norm", "native_layer_norm", "native_layer_norm_backward",
    "native_group_norm", "native_group_norm_backward", "_fused_rms_norm",
    "_fused_rms_norm_backward",
}  # fmt: skip
_REDUCTION = {
    "sum", "mean", "amax", "amin", "max", "min", "prod", "var", "var_mean", "std",
    "norm", "linalg_vector_norm", "argmax", "argmin", "logsumexp", "all", "any",
    "_softmax", "_log_softmax", "_softmax_backward_data", "_log_softmax_backward_data",
    "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward",
    "max_pool2d_with_indices", "max_pool2d_with_indices_backward", "avg_pool2d",
    "avg_pool2d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward",
    "adaptive_max_pool2d", "adaptive_max_pool2d_backward", "max_pool3d_with_indices",
    "cumsum",
}  # fmt: skip
_OPTIMIZER = {"addcmul", "addcdiv", "lerp"}
_OPTIMIZER_PREFIXES = ("_foreach_", "_fused_adam", "_fused_adamw", "_fused_sgd", "_fused_adagrad")
_ELEMENTWISE = {
    "add", "sub", "rsub", "mul", "div", "neg", "abs", "sqrt", "rsqrt", "reciprocal", "exp",
    "log", "log1p", "expm1", "pow", "sigmoid", "tanh", "relu", "threshold",
    "threshold_backward", "gelu", "gelu_backward", "silu", "silu_backward", "hardtanh",
    "hardtanh_backward", "sigmoid_backward", "tanh_backward", "leaky_relu",
    "leaky_relu_backward", "elu", "elu_backward", "erf", "sin", "cos", "clamp", "clamp_min",
    "clamp_max", "where", "masked_fill", "fill", "zero", "zeros_like", "ones_like",
    "full_like", "copy", "clone", "_to_copy", "contiguous", "sign", "eq", "ne", "lt", "le",
    "gt", "ge", "logical_not", "bitwise_not", "maximum", "minimum", "square", "native_dropout",
    "native_dropout_backward", "bernoulli", "floor", "ceil", "round", "trunc", "frac",
    "hardswish", "hardswish_backward", "softplus", "softplus_backward", "fmod", "remainder",
    # creation ops: a fill kernel over the output
    "zeros", "ones", "full", "arange", "scalar_tensor",
}  # fmt: skip
# alias in practice though their schema does not say so, or only allocate
_NO_KERNEL = {
    "_unsafe_view", "alias", "lift_fresh", "_reshape_alias", "view_as", "empty", "empty_like",
    "empty_strided", "new_empty", "new_empty_strided", "empty_permuted",
}  # fmt: skip


# NOTE [ Elementwise families ]
# The MLP tells ops of a class apart by a one-hot token. For most classes the
# token is the op's name (a handful per class), but pointwise ops are many and
# alike: ~30 names sharing a few hundred samples leave a dozen per name. Their
# token is "family/name": both columns are set, so every `add` teaches the
# network about `sub` too (same family), the name still tells them apart, and
# a pointwise op never measured is predicted from its family alone.
ELEMENTWISE_FAMILIES: dict[str, tuple[str, ...]] = {
    "copy": ("copy", "clone", "_to_copy", "contiguous"),
    "fill": ("fill", "zero", "zeros", "ones", "full", "zeros_like", "ones_like", "full_like",
             "scalar_tensor", "arange"),
    "arith": ("add", "sub", "rsub", "mul", "neg", "abs", "relu", "threshold",
              "threshold_backward", "maximum", "minimum", "eq", "ne", "lt", "le", "gt", "ge",
              "where", "masked_fill", "clamp", "clamp_min", "clamp_max", "sign", "hardtanh",
              "hardtanh_backward", "leaky_relu", "leaky_relu_backward", "logical_not",
              "bitwise_not", "square", "tanh_backward", "sigmoid_backward", "floor", "ceil",
              "round", "trunc", "frac", "native_dropout_backward"),
    "divide": ("div", "reciprocal", "sqrt", "rsqrt", "pow", "fmod", "remainder"),
    "transcendental": ("exp", "log", "log1p", "expm1", "sigmoid", "tanh", "gelu",
                       "gelu_backward", "silu", "silu_backward", "erf", "sin", "cos", "elu",
                       "elu_backward", "softplus", "softplus_backward", "hardswish",
                       "hardswish_backward"),
    "random": ("bernoulli", "native_dropout"),
}  # fmt: skip
_FAMILY = {name: fam for fam, names in ELEMENTWISE_FAMILIES.items() for name in names}


def vocab_token(target: str) -> str:
    """What the MLP's one-hot sees: "family/name" for a pointwise op of a known
    family, the base name otherwise (see NOTE [ Elementwise families ])."""
    name = base_name(target)
    if classify(target) is OpClass.ELEMENTWISE and name in _FAMILY:
        return f"{_FAMILY[name]}/{name}"
    return name


def packet(target: str) -> str:
    """`aten.add_.Tensor` -> `add_`; targets without a namespace pass through."""
    parts = target.split(".")
    return parts[1] if len(parts) >= 2 else parts[0]


def base_name(target: str) -> str:
    """The packet without the in-place `_` suffix: `aten.relu_.default` -> `relu`."""
    p = packet(target)
    return p[:-1] if is_inplace(target) else p


def is_inplace(target: str) -> bool:
    """In-place variants end in one `_` (`add_`, `_foreach_mul_`); `__iand__` does not count."""
    p = packet(target)
    return len(p) > 1 and p.endswith("_") and not p.endswith("__")


@functools.cache
def classify(target: str) -> OpClass:
    """The `OpClass` of an aten target (see NOTE [ Op classes ])."""
    name = base_name(target)
    if name in _CONV:
        return OpClass.CONV
    if name in _MATMUL:
        return OpClass.MATMUL
    if name in _NORM:
        return OpClass.NORM
    if name in _OPTIMIZER or name.startswith(_OPTIMIZER_PREFIXES):
        return OpClass.OPTIMIZER
    if name in _REDUCTION:
        return OpClass.REDUCTION
    if name in _ELEMENTWISE:
        return OpClass.ELEMENTWISE
    if name in _NO_KERNEL or _is_view_schema(target):
        return OpClass.VIEW
    return OpClass.OTHER


@functools.cache
def _schema(target: str) -> Any:
    """The torch schema of `ns.packet.overload`, or None when torch does not know it."""
    parts = target.split(".")
    if len(parts) != 3:
        return None
    import torch  # deferred: `memplan hw list` must not pay torch's import time

    try:
        ns = getattr(torch.ops, parts[0])
        return getattr(getattr(ns, parts[1]), parts[2])._schema
    except (AttributeError, RuntimeError):
        return None


def _is_view_schema(target: str) -> bool:
    s = _schema(target)
    if s is None or s.is_mutable or not s.returns:
        return False
    for r in s.returns:
        info = r.alias_info
        if info is None or info.is_write:
            return False
    return True


@functools.cache
def arg_names(target: str) -> tuple[str, ...]:
    """Positional argument names of `target` from its torch schema (empty if unknown)."""
    s = _schema(target)
    return tuple(a.name for a in s.arguments) if s is not None else ()


@functools.cache
def arg_defaults(target: str) -> dict[str, Any]:
    s = _schema(target)
    if s is None:
        return {}
    return {a.name: a.default_value for a in s.arguments if a.has_default_value()}


def bind(target: str, args: dict[str, Any]) -> dict[str, Any]:
    """Named arguments of a JSON call `{"args": [...], "kwargs": {...}}`,
    schema defaults filled in. Positional args beyond the schema are kept
    under `_<index>` so nothing is lost for targets torch does not know."""
    pos = args.get("args", []) or []
    names = arg_names(target)
    out: dict[str, Any] = dict(arg_defaults(target))
    for i, a in enumerate(pos):
        out[names[i] if i < len(names) else f"_{i}"] = a
    out.update(args.get("kwargs", {}) or {})
    return out

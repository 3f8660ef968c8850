"""`torch.autocast` as the target's device type runs it, on meta
(NOTE [ Autocast on meta ]), and the `GradScaler` of an fp16 capture on meta
(NOTE [ GradScaler on meta ]).

`cast_inputs` is called by `Emulation.__torch_function__` for every
torch-level call inside `Emulation.autocast_region`; the handlers registered
here (HANDLERS) run the few calls whose casts autocast makes below the
torch-level call the mode sees.
"""

from __future__ import annotations

import enum
import functools
import types
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from memplan.traces.emulate.mode import CASTERS, HANDLERS
from memplan.traces.target import TargetDevice

if TYPE_CHECKING:
    from memplan.traces.emulate.mode import Emulation


class CastPolicy(enum.Enum):
    """What autocast does to an op's inputs (autocast_mode.h `CastPolicy`)."""

    LOWER_PRECISION_FP = "lower_precision_fp"  # floating inputs to the autocast dtype
    FP32 = "fp32"  # floating inputs to float32
    FP32_SET_OPT_DTYPE = "fp32_set_opt_dtype"  # dtype=float32 unless the caller gave one
    FP32_APPEND_DTYPE = "fp32_append_dtype"  # the same, for the overloads without a dtype
    PROMOTE = "promote"  # floating inputs to the widest floating type among them


# NOTE [ Autocast on meta ]
# Read: torch 2.13.0's include/ATen/autocast_mode.h (`WrapFunction_` per `CastPolicy`,
# `is_eligible`, the cuda lists) and pytorch 008ec6b aten/src/ATen/autocast_mode.cpp
# (`cached_cast`, the AutocastCPU list). A torch-level call is looked up by its aten op's
# name in the target device type's list, and its tensor arguments (alone or in lists) are
# cast by that policy, the last argument first. Eligible: floating, not float64, on meta;
# `out=` calls are left alone. A float32 leaf requiring grad is cast once per region
# (`Emulation.cast_cache`). torch.nn.functional's Python composites run their body under
# the mode (`_body`), so their aten ops are cast one by one. Left out: ops inside C++
# composites (but CUDA's cross_entropy is rebuilt), composites outside
# torch.nn.functional (cast by their own name), and code asking
# `torch.is_autocast_enabled()` is told autocast is off. Full text: docs/notes.md.
def _ops(policy: CastPolicy, *names: str) -> dict[str, CastPolicy]:
    return dict.fromkeys(names, policy)


LOWER, FP32 = CastPolicy.LOWER_PRECISION_FP, CastPolicy.FP32
_CUDA_FP32_LOSSES = (
    "poisson_nll_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d",
    "hinge_embedding_loss", "kl_div", "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss",
    "margin_ranking_loss", "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss",
    "multi_margin_loss", "binary_cross_entropy_with_logits",
)  # fmt: skip
CUDA_POLICY: Mapping[str, CastPolicy] = {
    **_ops(
        LOWER,
        "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc", "conv_transpose1d",
        "conv_transpose2d", "conv_transpose3d", "convolution", "cudnn_convolution",
        "cudnn_convolution_transpose", "prelu", "addmm", "addmv", "addr", "matmul", "einsum",
        "mm", "mv", "linalg_vecdot", "linear", "addbmm", "baddbmm", "bmm", "chain_matmul",
        "linalg_multi_dot", "_thnn_fused_lstm_cell", "_thnn_fused_gru_cell", "lstm_cell",
        "gru_cell", "rnn_tanh_cell", "rnn_relu_cell", "_scaled_dot_product_flash_attention",
        "scaled_dot_product_attention",
    ),
    **_ops(
        FP32,
        "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
        "reciprocal", "rsqrt", "sinh", "tan", "pow", "softplus", "layer_norm",
        "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm", "nuclear_norm",
        "cosine_similarity", *_CUDA_FP32_LOSSES, "dist", "pdist", "cdist", "renorm", "logsumexp",
        "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
        "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
        "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
        "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
    ),
    **_ops(
        CastPolicy.FP32_SET_OPT_DTYPE,
        "prod", "softmax", "log_softmax", "cumprod", "cumsum", "linalg_vector_norm",
        "linalg_matrix_norm", "sum",
    ),
    "norm": CastPolicy.FP32_APPEND_DTYPE,
    **_ops(
        CastPolicy.PROMOTE,
        "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
        "index_put", "tensordot", "scatter_add",
    ),
}  # fmt: skip
CPU_POLICY: Mapping[str, CastPolicy] = {
    **_ops(
        LOWER,
        "conv1d", "conv2d", "conv3d", "bmm", "mm", "linalg_vecdot", "baddbmm", "addmm",
        "_addmm_activation", "addbmm", "linear", "_convolution", "matmul", "conv_tbc",
        "mkldnn_rnn_layer", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "prelu",
        "scaled_dot_product_attention", "_native_multi_head_attention",
    ),
    **_ops(
        FP32,
        "avg_pool3d", "binary_cross_entropy", "grid_sampler", "polar", "prod", "quantile",
        "nanquantile", "stft", "cdist", "grid_sampler_2d", "_grid_sampler_2d_cpu_fallback",
        "grid_sampler_3d", "trace", "view_as_complex", "cholesky", "cholesky_inverse",
        "cholesky_solve", "inverse", "lu_solve", "orgqr", "ormqr", "pinverse", "max_pool3d",
        "max_unpool2d", "max_unpool3d", "adaptive_avg_pool3d", "reflection_pad1d",
        "reflection_pad2d", "replication_pad1d", "replication_pad2d", "replication_pad3d",
        "mse_loss", "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss",
        "poisson_nll_loss", "smooth_l1_loss", "cross_entropy_loss", "l1_loss", "huber_loss",
        "margin_ranking_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
        "ctc_loss", "kl_div", "multilabel_margin_loss", "binary_cross_entropy_with_logits",
        "fft_fft", "fft_ifft", "fft_fft2", "fft_ifft2", "fft_fftn", "fft_ifftn", "fft_rfft",
        "fft_irfft", "fft_rfft2", "fft_irfft2", "fft_rfftn", "fft_irfftn", "fft_hfft",
        "fft_ihfft", "linalg_cond", "linalg_matrix_rank", "linalg_solve", "linalg_cholesky",
        "linalg_svdvals", "linalg_eigvals", "linalg_eigvalsh", "linalg_inv",
        "linalg_householder_product", "linalg_tensorinv", "linalg_tensorsolve",
        "fake_quantize_per_tensor_affine", "geqrf", "_lu_with_info", "qr", "svd",
        "triangular_solve", "fractional_max_pool2d", "fractional_max_pool3d",
        "adaptive_max_pool3d", "multilabel_margin_loss_forward", "linalg_qr",
        "linalg_cholesky_ex", "linalg_svd", "linalg_eig", "linalg_eigh", "linalg_lstsq",
        "linalg_inv_ex",
    ),
    **_ops(CastPolicy.PROMOTE, "stack", "cat", "index_copy"),
}  # fmt: skip
POLICIES: Mapping[TargetDevice, Mapping[str, CastPolicy]] = {
    TargetDevice.CUDA: CUDA_POLICY,
    TargetDevice.CPU: CPU_POLICY,
}
# CUDA autocast refuses binary_cross_entropy (autocast_mode.cpp,
# `binary_cross_entropy_banned`); this is its message's first line.
BANNED_ON_CUDA = {
    "binary_cross_entropy": "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss "
    "are unsafe to autocast."
}
# torch-level names whose aten op is named otherwise
ATEN_NAME = {
    "__matmul__": "matmul",
    "__rmatmul__": "matmul",
    "__pow__": "pow",
    "__rpow__": "pow",
    "nll_loss_nd": "nll_loss",  # a composite calling nll_loss or nll_loss2d (both fp32)
}
_REFLECTED = {"__rmatmul__", "__rpow__"}  # their aten op takes (other, self)
# torch.nn.functional's boolean-dispatched pools the mode sees as one function:
# with return_indices they call the `_with_indices` op instead
_INDEX_DISPATCHED = {"max_pool1d", "max_pool2d", "max_pool3d"}


def policy_of(device: TargetDevice, func: Callable, kwargs: Mapping[str, Any]) -> CastPolicy | None:
    """The policy autocast applies on `device` to the aten op `func` calls
    (None: not an autocast op)."""
    name = getattr(func, "__name__", None)
    if not isinstance(name, str) or kwargs.get("out") is not None:
        return None
    name = ATEN_NAME.get(name, name)
    if name in _INDEX_DISPATCHED and kwargs.get("return_indices"):
        name += "_with_indices"
    if device is TargetDevice.CUDA and name in BANNED_ON_CUDA:
        raise RuntimeError(BANNED_ON_CUDA[name])
    return POLICIES[device].get(name)


def cast_inputs(em: Emulation, func: Callable, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """`args` and `kwargs` as the target's autocast hands them to the op
    (NOTE [ Autocast on meta ]); the casts run here, recorded as `_to_copy`."""
    lower = em.autocast_dtype
    if lower is None or HANDLERS.get(func) is _run_body:
        return args, kwargs  # a composite: the calls of its body are cast
    policy = policy_of(em.target.device, func, kwargs)
    if policy is None:
        return args, kwargs
    if policy in (CastPolicy.FP32_SET_OPT_DTYPE, CastPolicy.FP32_APPEND_DTYPE):
        first = args[0] if args else None
        given = kwargs.get("dtype") is not None or any(isinstance(a, torch.dtype) for a in args)
        if isinstance(first, torch.Tensor) and _eligible(first) and not given:
            kwargs = {**kwargs, "dtype": torch.float32}
        return args, kwargs
    if policy is CastPolicy.LOWER_PRECISION_FP:
        to = lower
    elif policy is CastPolicy.FP32:
        to = torch.float32
    else:
        to = _promote_type(lower, args, kwargs)
    cast = functools.partial(_cached_cast, em, to)
    if func.__name__ in _REFLECTED:  # `b.__rmatmul__(a)` is matmul(a, b): cast in its order
        (b, a, *rest), kwargs = _cast_all((args[1], args[0], *args[2:]), kwargs, cast)
        return (a, b, *rest), kwargs
    return _cast_all(args, kwargs, cast)


def _eligible(t: torch.Tensor) -> bool:
    """autocast_mode.h `is_eligible`: floating, not float64, on the device."""
    return t.device.type == "meta" and t.is_floating_point() and t.dtype != torch.float64


def _cached_cast(em: Emulation, to: torch.dtype, t: torch.Tensor) -> torch.Tensor:
    """autocast_mode.cpp `cached_cast`: `t` in `to` if eligible; a float32
    leaf requiring grad cast to the autocast dtype comes from the cache."""
    if not _eligible(t) or t.dtype == to:
        return t
    weight = t.dtype == torch.float32 and t.requires_grad and t.is_leaf and not t._is_view()
    if weight and to == em.autocast_dtype:
        cast = em.cast_cache.get(t._cdata)
        if cast is None:
            cast = em.cast_cache[t._cdata] = t.to(to)
        return cast
    return t.to(to)


def _tensors(args: tuple, kwargs: dict) -> Iterator[torch.Tensor]:
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, list | tuple):
            yield from (t for t in a if isinstance(t, torch.Tensor))


def _promote_type(lower: torch.dtype, args: tuple, kwargs: dict) -> torch.dtype:
    """autocast_mode.h `promote_type`: float32 if an eligible input is
    float32, else the autocast dtype; float64 inputs are ignored."""
    current = lower
    for t in _tensors(args, kwargs):
        if t.device.type != "meta" or not t.is_floating_point() or t.dtype == torch.float64:
            continue
        if torch.float32 in (current, t.dtype):
            current = torch.float32
        elif t.dtype != lower:
            raise RuntimeError(
                f"Unexpected floating ScalarType in at::autocast::prioritize: {t.dtype} "
                f"under autocast to {lower}"
            )
    return current


def _cast_all(
    args: tuple, kwargs: dict, cast: Callable[[torch.Tensor], torch.Tensor]
) -> tuple[tuple, dict]:
    """`cast` applied to every tensor argument, alone or in a list, the last
    argument first (NOTE [ Autocast on meta ])."""
    values = [*args, *kwargs.values()]
    for i in reversed(range(len(values))):
        a = values[i]
        if isinstance(a, torch.Tensor):
            values[i] = cast(a)
        elif isinstance(a, list | tuple) and a and all(isinstance(t, torch.Tensor) for t in a):
            cast_list = [cast(t) for t in a]
            values[i] = cast_list if isinstance(a, list) else tuple(cast_list)
    n = len(args)
    return tuple(values[:n]), dict(zip(kwargs, values[n:], strict=True))


# ---- composites: calls whose casts autocast makes below the torch level ------
_CHECKS = ("has_torch_function", "has_torch_function_unary", "has_torch_function_variadic")


def _never(*_args: Any) -> bool:
    return False


@functools.cache
def _body(func: types.FunctionType) -> types.FunctionType:
    """A copy of `func` whose own check for torch-function overrides answers
    False, so called under the mode its body runs and the mode sees its calls."""
    scope = {**func.__globals__, **dict.fromkeys(_CHECKS, _never)}
    body = types.FunctionType(
        func.__code__, scope, func.__name__, func.__defaults__, func.__closure__
    )
    body.__kwdefaults__ = func.__kwdefaults__
    return body


def _composites() -> frozenset[Callable]:
    """torch.nn.functional's Python functions that check for overrides themselves."""
    return frozenset(
        f
        for f in vars(F).values()
        if isinstance(f, types.FunctionType)
        and f.__module__ == F.__name__
        and set(_CHECKS) & set(f.__code__.co_names)
    )


def _run_body(em: Emulation, func: Callable, args: tuple, kwargs: dict) -> Any:
    if em.autocast_dtype is None:
        return func(*args, **kwargs)
    with em:
        return _body(func)(*args, **kwargs)


def _cross_entropy_loss(em: Emulation, func: Callable, args: tuple, kwargs: dict) -> Any:
    """CUDA's cross_entropy_loss is a C++ composite that autocast does not
    wrap. With class indices it is `nll_loss_nd(log_softmax(x, class_dim,
    x.dtype), ...)` (LossNLL.cpp `cross_entropy_loss_symint`): log_softmax
    keeps the dtype it is given, nll_loss casts to float32; label smoothing
    (`cross_entropy_loss_label_smoothing`, without class weights) adds the
    smoothing term, whose sums are float32 on CUDA."""
    names = ("input", "target", "weight", "reduction", "ignore_index", "label_smoothing")
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    x, target, weight = bound["input"], bound["target"], bound.get("weight")
    reduction, ignore = bound.get("reduction", 1), bound.get("ignore_index", -100)
    smoothing = bound.get("label_smoothing", 0.0)
    if (
        em.autocast_dtype is None
        or em.target.device is not TargetDevice.CUDA
        or x.shape == target.shape  # class probabilities: as is (float32 targets' products)
        or (smoothing > 0.0 and weight is not None)
    ):
        return func(*args, **kwargs)
    class_dim = 0 if x.dim() == 1 else 1
    with em:
        log_p = torch.log_softmax(x, class_dim, dtype=x.dtype)
        nll = torch._C._nn.nll_loss_nd(log_p, target, weight, reduction, ignore)
        if smoothing == 0.0:
            return nll
        smooth = -log_p.sum(class_dim)
        ignored = target == ignore
        smooth.masked_fill_(ignored, 0.0)
        # C++ multiplies by Scalars and, built with GCC, evaluates the right
        # operand of `/` and `+` first
        if reduction == 1:  # mean (torch.nn._reduction: 0 none, 1 mean, 2 sum)
            kept = (~ignored).sum()
            smooth = smooth.sum() / kept
        elif reduction == 2:
            smooth = smooth.sum()
        smooth = torch.ops.aten.mul.Scalar(smooth, smoothing / x.shape[class_dim])
        return torch.ops.aten.mul.Scalar(nll, 1 - smoothing) + smooth


def _softmax(em: Emulation, func: Callable, args: tuple, kwargs: dict) -> Any:
    """On CUDA a float16 softmax asked for float32 is one kernel,
    `_softmax(x, dim, half_to_float=True)`, not a cast and a float32 softmax
    (SoftMax.cpp `softmax` / `log_softmax`): the float32 copy never exists."""
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    dtype = args[2] if len(args) > 2 else kwargs.get("dtype")
    if (
        em.autocast_dtype is None
        or em.target.device is not TargetDevice.CUDA
        or x.dtype != torch.float16
        or dtype != torch.float32
        or not isinstance(dim, int)
    ):
        return func(*args, **kwargs)
    fused = torch._log_softmax if func.__name__ == "log_softmax" else torch._softmax
    return fused(x, dim, True)


CASTERS.append(cast_inputs)
for _f in _composites() - HANDLERS.keys():  # what others route stays theirs
    HANDLERS[_f] = _run_body
HANDLERS.setdefault(torch._C._nn.cross_entropy_loss, _cross_entropy_loss)
for _f in (torch.softmax, torch.Tensor.softmax, torch.log_softmax, torch.Tensor.log_softmax):
    HANDLERS.setdefault(_f, _softmax)


# NOTE [ GradScaler on meta ]
# torch/amp/grad_scaler.py runs on meta as on a GPU (device "meta": only
# "cuda" is checked there): `scale` multiplies the loss by `_scale`, `step`
# unscales the grads with `_amp_foreach_non_finite_check_and_unscale_` into
# `found_inf`, `update` runs `_amp_update_scale_`; all are recorded. Two
# reads of values meta has not are answered by a rule instead:
# `_maybe_opt_step` sums `found_inf.item()` to decide whether to step, and
# `get_scale` is `_scale.item()`. On meta the grads are assumed finite: the
# optimizer step is always taken (as in any step worth recording, NOTE
# [ Warm-up under a GradScaler ] in traces/capture.py), so the scale never
# drops and `get_scale` answers the initial scale.
class GradScalerOnMeta(torch.amp.GradScaler):
    """The `GradScaler` of an fp16 capture on meta (NOTE [ GradScaler on meta ])."""

    def __init__(self) -> None:
        super().__init__("meta")

    def _maybe_opt_step(
        self, optimizer: torch.optim.Optimizer, optimizer_state: dict, *args: Any, **kwargs: Any
    ) -> Any:
        return optimizer.step(*args, **kwargs)

    def get_scale(self) -> float:
        return float(self._init_scale)

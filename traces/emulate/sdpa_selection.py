"""Which SDPA backend a target's dispatch runs a call with: torch's
`select_sdp_backend` and the filters of each backend (NOTE [ SDPA backend
selection ], NOTE [ SDPA filters ]), for `traces.emulate.attention`.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from memplan.traces.errors import TraceError
from memplan.traces.target import AttentionBackend, Target, TargetDevice

# NOTE [ SDPA backend selection ]
# Read: aten/src/ATen/native/transformers/cuda/sdp_utils.cpp at pytorch 001f694
# (`select_sdp_backend` and its filters), sdp_utils_cpp.cpp at 02315a4, and sdp_utils_cpp.h
# as the 2.13 wheel ships it.
# - CUDA tries flash, efficient, math, cuDNN; the first whose filters pass wins. cuDNN runs
#   only when pinned or preferred (cuDNN > 9.15 on sm 9.0/9.3/10.0/10.3); we assume a CUDA
#   12.x wheel with its cuDNN 9.10 (`CUDNN_VERSION`): never preferred.
# - cpu tries its flash kernel, then math.
# - A pinned backend (`Target.attention`) is the only one enabled; failing its filters is
#   torch's "No available kernel".
# Runtime switches are at their defaults; nested tensors are not modelled.
# Full text: docs/notes.md, "SDPA backend selection".
CUDNN_VERSION = 91002  # cuDNN 9.10.2, as cudnnGetVersion() reports it


@dataclass(frozen=True, slots=True)
class SdpaCall:
    """One SDPA call: what selection looks at (torch's `sdp_params`), and
    the `scale` the kernels are given."""

    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_mask: torch.Tensor | None = None
    dropout_p: float = 0.0
    is_causal: bool = False
    enable_gqa: bool = False
    scale: float | None = None

    @property
    def requires_grad(self) -> bool:
        """torch's `input_requires_grad`: grad mode on and q, k or v needing it."""
        qkv = (self.query, self.key, self.value)
        return torch.is_grad_enabled() and any(t.requires_grad for t in qkv)


# NOTE [ SDPA filters ]
# Each backend is a chain of filters in torch's order; the first to fail is
# the reason a pinned backend gives. Every fused backend needs: q, k, v 4-D;
# one batch size; the same heads, unless `enable_gqa` and the backend takes
# GQA (Hk == Hv dividing Hq; cuDNN lets Hk != Hv if each divides Hq); no
# zero sequence; last dims of stride 1 (on CUDA the mask's too; flash and
# cuDNN let a head dim of 1 pass). GQA is taken by flash, cuDNN and cpu's
# flash, not by efficient: 2.13 has it so (its docstring says flash and math,
# its meta backward returns query-head grads); main added efficient GQA in
# pytorch#191085, with the implicit MQA of Hk == Hv == 1, both left out.
# The rules of each backend are above its filter chain below.

# A filter: None when the backend can run the call, else why not (one line).
Filter = Callable[[Target, SdpaCall], str | None]


def _major(target: Target) -> int:
    return target.compute_capability[0] if target.compute_capability else 0


def _sm_in(target: Target, low: tuple[int, int], high: tuple[int, int]) -> bool:
    cc = target.compute_capability
    return cc is not None and low <= cc <= high


def _sm_range(what: str, low: tuple[int, int], high: tuple[int, int]) -> Filter:
    def check(target: Target, _c: SdpaCall) -> str | None:
        if _sm_in(target, low, high):
            return None
        span = f"{low[0]}.{low[1]}..{high[0]}.{high[1]}"
        return f"{what} needs sm {span}, {target.name} is sm {target.sm / 10:.1f}"

    return check


def _dtype_in(call: SdpaCall, allowed: tuple[torch.dtype, ...]) -> str | None:
    q = call.query.dtype
    if q == call.key.dtype == call.value.dtype and q in allowed:
        return None
    got = "/".join(str(t.dtype).removeprefix("torch.") for t in (call.query, call.key, call.value))
    names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
    return f"query/key/value dtypes {got} are not all one of {names}"


def _four_dims(_t: Target, call: SdpaCall) -> str | None:
    dims = (call.query.dim(), call.key.dim(), call.value.dim())
    return None if dims == (4, 4, 4) else f"query/key/value must be 4-D, got {dims}"


def _batch_and_heads(gqa: bool, same_kv_heads: bool = True) -> Filter:
    """torch's `check_batch_size_and_num_heads_dense<gqa, same_kv_heads>`."""

    def check(_t: Target, call: SdpaCall) -> str | None:
        q, k, v = call.query, call.key, call.value
        if not q.size(0) == k.size(0) == v.size(0):
            return f"batch sizes {q.size(0)}/{k.size(0)}/{v.size(0)} differ"
        hq, hk, hv = q.size(-3), k.size(-3), v.size(-3)
        if call.enable_gqa and gqa:
            if same_kv_heads and hk != hv:
                return f"key and value heads {hk}/{hv} differ"
            if hq % hk or hq % hv:
                return f"key/value heads {hk}/{hv} do not divide the {hq} query heads"
            return None
        if not hq == hk == hv:
            why = "enable_gqa is off" if gqa else "this backend takes no GQA"
            return f"query/key/value heads {hq}/{hk}/{hv} differ ({why})"
        return None

    return check


def _nonzero_seq(_t: Target, call: SdpaCall) -> str | None:
    if call.query.size(-2) == 0 or call.key.size(-2) == 0:
        return "a sequence length is 0"
    return None


def _last_dim_contiguous(ignore_singleton: bool) -> Filter:
    """torch's `check_last_dim_stride_equals_1_dense` (cpu ignores the mask)."""

    def check(target: Target, call: SdpaCall) -> str | None:
        qkv = (call.query, call.key, call.value)
        ok = all(t.stride(-1) == 1 for t in qkv) or (ignore_singleton and call.query.size(-1) == 1)
        mask = call.attn_mask
        if mask is not None and target.device is TargetDevice.CUDA:
            ok = ok and mask.stride(-1) == 1
        return None if ok else "a last dimension of query/key/value/mask has a stride other than 1"

    return check


def _mask_shape(_t: Target, call: SdpaCall) -> str | None:
    """torch's `check_attn_mask_shape`: 2-D, or 4-D broadcastable per dim."""
    m = call.attn_mask
    if m is None:
        return None
    if m.requires_grad:
        return "the attn_mask requires grad"
    q, s = call.query, call.key.size(2)
    fits = m.size(-2) in (q.size(2), 1) and m.size(-1) in (s, 1)
    if fits and m.dim() == 2:
        return None
    if fits and m.dim() == 4 and m.size(0) in (1, q.size(0)) and m.size(1) in (1, q.size(1)):
        return None
    return f"attn_mask of shape {tuple(m.shape)} is not (L|1, S|1) nor (B|1, H|1, L|1, S|1)"


def _low_precision(target: Target, call: SdpaCall) -> str | None:
    """fp16, and bf16 from sm 8.0 (`check_dtypes_low_precision`)."""
    allowed = (torch.float16, torch.bfloat16) if _major(target) >= 8 else (torch.float16,)
    return _dtype_in(call, allowed)


# ---- flash (CUDA): no mask; head dims equal and <= 256; sm 8.0..12.1;
# training on sm 8.6-8.9 / 12.0-12.1 needs head dim <= 192, or > 224 without
# dropout; is_causal needs seq_q == seq_k; fp16, bf16 on sm >= 8.0.
def _flash_no_mask(_t: Target, call: SdpaCall) -> str | None:
    return None if call.attn_mask is None else "flash attention takes no attn_mask"


def _flash_head_dim(_t: Target, call: SdpaCall) -> str | None:
    d = (call.query.size(-1), call.key.size(-1), call.value.size(-1))
    if d[0] == d[1] == d[2] and d[0] <= 256:
        return None
    return f"head dims {d[0]}/{d[1]}/{d[2]} must be equal and <= 256"


def _flash_training_head_dim(target: Target, call: SdpaCall) -> str | None:
    consumer = _sm_in(target, (8, 6), (8, 9)) or _sm_in(target, (12, 0), (12, 1))
    if not (call.requires_grad and consumer):
        return None
    d = call.query.size(-1)
    if d <= 192 or (call.dropout_p == 0.0 and d > 224):
        return None
    return f"flash attention cannot train head dim {d} on sm {target.sm / 10:.1f}"


def _flash_causal_square(_t: Target, call: SdpaCall) -> str | None:
    if call.is_causal and call.query.size(-2) != call.key.size(-2):
        return "flash attention takes is_causal only with seq_q == seq_k"
    return None


FLASH_CUDA: tuple[Filter, ...] = (
    _four_dims,
    _flash_no_mask,
    _flash_head_dim,
    _sm_range("flash attention", (8, 0), (12, 1)),
    _flash_training_head_dim,
    _flash_causal_square,
    _low_precision,
    _batch_and_heads(gqa=True),
    _nonzero_seq,
    _last_dim_contiguous(ignore_singleton=True),
)


# ---- efficient (CUDA): sm 5.0..12.1; head dims of q and k equal, q and v
# head dims multiples of the GEMM alignment, and q, k, v storage offsets too
# on sm >= 8.0; fp16, fp32, bf16 on sm >= 8.0. Takes a mask and dropout.
def _gemm_alignment(target: Target, call: SdpaCall) -> int:
    """torch's `minimum_gemm_alignment`, in elements: sm >= 8.0: 8 for 16-bit,
    4 for fp32; sm 7.x: 8 for 16-bit, 1 for fp32; older: 1."""
    half = call.query.dtype in (torch.float16, torch.bfloat16)
    tensor_cores = _major(target) >= 8 or (_major(target) >= 7 and half)
    align = 4 if _major(target) >= 8 else 1
    return max(align, 8 if half else 4) if tensor_cores else align


def _efficient_head_dim(target: Target, call: SdpaCall) -> str | None:
    a = _gemm_alignment(target, call)
    dq, dk, dv = call.query.size(-1), call.key.size(-1), call.value.size(-1)
    if dq == dk and dq % a == 0 and dq > 0 and dv % a == 0 and dv > 0:
        return None
    return (
        f"head dims {dq}/{dk}/{dv}: query's and key's equal, query's and value's multiples of {a}"
    )


def _efficient_offsets(target: Target, call: SdpaCall) -> str | None:
    if _major(target) < 8:
        return None
    a = _gemm_alignment(target, call)
    if any(t.numel() and t.storage_offset() % a for t in (call.query, call.key, call.value)):
        return f"a query/key/value storage offset is not a multiple of {a} elements"
    return None


def _efficient_dtype(target: Target, call: SdpaCall) -> str | None:
    sm80 = (torch.bfloat16,) if _major(target) >= 8 else ()
    return _dtype_in(call, (torch.float16, torch.float32, *sm80))


EFFICIENT_CUDA: tuple[Filter, ...] = (
    _sm_range("efficient attention", (5, 0), (12, 1)),
    _four_dims,
    _efficient_head_dim,
    _efficient_offsets,
    _nonzero_seq,
    _last_dim_contiguous(ignore_singleton=False),
    _batch_and_heads(gqa=False),
    _efficient_dtype,
)


# ---- cuDNN (CUDA): fp16, bf16 on sm >= 8.0; the mask shape; sm 8.0..12.1;
# dropout a multiple of 1/16; batch and heads <= 65535; head dims <= 128 at
# cuDNN 9.10 (up to 256 on sm 9.0/10.x from cuDNN 9.22), multiples of 8;
# seq_k != 1. `check_cudnn_tensor_shapes`' branches for cuDNN < 9.0 are left out.
def _cudnn_dropout(_t: Target, call: SdpaCall) -> str | None:
    p16 = call.dropout_p * 16.0
    return None if p16 == math.floor(p16) else "cuDNN dropout must be a multiple of 1/16"


def _cudnn_d256(target: Target) -> bool:
    """Whether cuDNN takes head dims up to 256 here (never at 9.10)."""
    cc = target.compute_capability or (0, 0)
    sm90_or_10x = cc == (9, 0) or cc[0] == 10
    sm107_too_old = cc == (10, 7) and CUDNN_VERSION <= 92500
    return sm90_or_10x and not sm107_too_old and CUDNN_VERSION > 92200


def _cudnn_shapes(target: Target, call: SdpaCall) -> str | None:
    """torch's `check_cudnn_tensor_shapes` and `check_cudnn_d256_bprop_head_dim`."""
    q, k, v = call.query, call.key, call.value
    if q.size(0) > 65535 or q.size(1) > 65535:
        return "cuDNN takes batch and heads up to 65535"
    d_qk, d_v = q.size(3), v.size(3)
    cc = target.compute_capability or (0, 0)
    limit = 128
    if _cudnn_d256(target):
        limit = 256
    elif (cc == (9, 0) or cc[0] == 10) and CUDNN_VERSION >= 91100 and (d_qk, d_v) == (192, 128):
        limit = 192
    if d_qk > limit or d_v > limit:
        return f"cuDNN {CUDNN_VERSION} takes head dims up to {limit}, got {d_qk}/{d_v}"
    if d_qk % 8 or d_v % 8:
        return f"cuDNN takes head dims that are multiples of 8, got {d_qk}/{d_v}"
    if k.size(2) == 1:
        return "cuDNN takes no key/value sequence of length 1"
    if call.dropout_p != 0.0 and q.size(2) == 1:
        return "cuDNN takes no query sequence of length 1 with dropout"
    backward_dims = (d_qk <= 128 and d_v <= 128) or (d_qk, d_v) in ((192, 128), (256, 256))
    if call.requires_grad and _cudnn_d256(target) and not backward_dims:
        return f"cuDNN has no backward for head dims {d_qk}/{d_v}"
    return None


CUDNN_CUDA: tuple[Filter, ...] = (
    _four_dims,
    _low_precision,
    _mask_shape,
    _sm_range("cuDNN attention", (8, 0), (12, 1)),
    _cudnn_dropout,
    _nonzero_seq,
    _last_dim_contiguous(ignore_singleton=True),
    _batch_and_heads(gqa=True, same_kv_heads=False),
    _cudnn_shapes,
)


# ---- flash (cpu): no dropout; the mask shape; head dims equal; fp32, fp64,
# bf16, fp16.
def _no_dropout(_t: Target, call: SdpaCall) -> str | None:
    if call.dropout_p <= 0.0:
        return None
    return f"cpu flash attention takes no dropout (got {call.dropout_p})"


def _same_head_dims(_t: Target, call: SdpaCall) -> str | None:
    d = (call.query.size(-1), call.key.size(-1), call.value.size(-1))
    return None if d[0] == d[1] == d[2] else f"head dims {d[0]}/{d[1]}/{d[2]} differ"


def _cpu_dtype(_t: Target, call: SdpaCall) -> str | None:
    return _dtype_in(call, (torch.float32, torch.float64, torch.bfloat16, torch.float16))


FLASH_CPU: tuple[Filter, ...] = (
    _no_dropout,
    _four_dims,
    _batch_and_heads(gqa=True),
    _mask_shape,
    _same_head_dims,
    _nonzero_seq,
    _last_dim_contiguous(ignore_singleton=False),
    _cpu_dtype,
)

FILTERS: dict[tuple[TargetDevice, AttentionBackend], tuple[Filter, ...]] = {
    (TargetDevice.CUDA, AttentionBackend.FLASH): FLASH_CUDA,
    (TargetDevice.CUDA, AttentionBackend.EFFICIENT): EFFICIENT_CUDA,
    (TargetDevice.CUDA, AttentionBackend.CUDNN): CUDNN_CUDA,
    (TargetDevice.CUDA, AttentionBackend.MATH): (),
    (TargetDevice.CPU, AttentionBackend.FLASH): FLASH_CPU,
    (TargetDevice.CPU, AttentionBackend.MATH): (),
}


def refusal(target: Target, backend: AttentionBackend, call: SdpaCall) -> str | None:
    """Why `backend` cannot run `call` on `target` (its first failing filter),
    or None when it can."""
    filters = FILTERS.get((target.device, backend))
    if filters is None:
        return f"{target.device.value} has no {backend.value} attention"
    for check in filters:
        reason = check(target, call)
        if reason is not None:
            return reason
    return None


def prefers_cudnn(target: Target) -> bool:
    """torch's `check_prefer_cudnn_attention` for a CUDA 12.x build at
    `CUDNN_VERSION` (NOTE [ SDPA backend selection ])."""
    cc = target.compute_capability or (0, 0)
    return CUDNN_VERSION > 91500 and cc[0] in (9, 10) and cc[1] in (0, 3)


def priority_order(target: Target) -> tuple[AttentionBackend, ...]:
    """The order the target's dispatch tries backends in."""
    if target.device is TargetDevice.CPU:
        return (AttentionBackend.FLASH, AttentionBackend.MATH)
    fused = (AttentionBackend.FLASH, AttentionBackend.EFFICIENT)
    if prefers_cudnn(target):
        return (AttentionBackend.CUDNN, *fused, AttentionBackend.MATH)
    return (*fused, AttentionBackend.MATH, AttentionBackend.CUDNN)


def select_backend(
    target: Target,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    enable_gqa: bool = False,
) -> AttentionBackend:
    """The backend `target` runs this SDPA call with (never AUTO): the first
    of `priority_order` whose filters pass, or the pinned `target.attention`,
    which must pass (else a one-line `TraceError`). Grad mode is read now."""
    call = SdpaCall(query, key, value, attn_mask, float(dropout_p), bool(is_causal), enable_gqa)
    return _select(target, call)


def _select(target: Target, call: SdpaCall) -> AttentionBackend:
    pinned = target.attention
    if pinned is not AttentionBackend.AUTO:
        reason = refusal(target, pinned, call)
        if reason is not None:
            raise TraceError(
                f"target {target.describe()}: no available kernel for "
                f"scaled_dot_product_attention{_caller()}: {reason}"
            )
        return pinned
    for backend in priority_order(target):
        if refusal(target, backend, call) is None:
            return backend
    raise AssertionError("math attention has no filter")  # unreachable


_HERE = os.path.dirname(os.path.abspath(__file__))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))


def _caller() -> str:
    """` (at file:line)` of the innermost frame outside torch and this package."""
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith((_HERE, _TORCH, "<")) and os.path.exists(path):
            return f" (at {os.path.basename(path)}:{frame.f_lineno})"
        frame = frame.f_back
    return ""

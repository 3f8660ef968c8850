"""`F.scaled_dot_product_attention` as the target's dispatch runs it.

On meta, SDPA always takes the math path (`_fused_sdp_choice_meta` answers
math for anything without a CUDA key), which materialises the (seq x seq)
scores and probabilities and saves them for backward. A GPU runs one fused
kernel that keeps its output and a logsumexp. Under `Emulation` this module
picks the backend the target would pick (`sdpa_selection.py`, NOTE [ SDPA
backend selection ], NOTE [ SDPA filters ]; re-exported here) and calls the
aten op the composite calls for it (NOTE [ SDPA calls per backend ]);
autograd then records that op's own backward. `host_outputs` names the outputs a CUDA target keeps in host
memory (NOTE [ Philox outputs on the host ]).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from memplan.traces.emulate.mode import handles
from memplan.traces.emulate.sdpa_selection import (
    CUDNN_CUDA,
    CUDNN_VERSION,
    EFFICIENT_CUDA,
    FILTERS,
    FLASH_CPU,
    FLASH_CUDA,
    Filter,
    SdpaCall,
    _select,
    prefers_cudnn,
    priority_order,
    refusal,
    select_backend,
)
from memplan.traces.target import AttentionBackend, Target, TargetDevice

if TYPE_CHECKING:
    from memplan.traces.emulate.mode import Emulation

__all__ = [
    "CUDNN_CUDA", "CUDNN_VERSION", "EFFICIENT_CUDA", "EFFICIENT_PHILOX", "FILTERS", "FLASH_CPU",
    "FLASH_CUDA", "Filter", "SdpaCall", "host_outputs", "prefers_cudnn", "priority_order",
    "refusal", "scaled_dot_product_attention", "select_backend",
]  # fmt: skip

aten = torch.ops.aten


# NOTE [ SDPA calls per backend ]
# What attention.cpp's composite `scaled_dot_product_attention` calls per backend (a recent
# main; its commit not known to us):
# - flash (CUDA): q, k, v zero-padded to a head dim multiple of 8 where needed, the scale
#   from the unpadded dim, `_scaled_dot_product_flash_attention`, the output sliced back.
# - efficient: a bool mask made additive (0 / -inf), padded where its strides are not
#   multiples of 8, expanded to (B, H, L, S); `compute_log_sumexp` only for backward.
# - cuDNN: as efficient without the padding, masked-out entries -65504.
# - cpu flash: the additive mask, `_scaled_dot_product_flash_attention_for_cpu`.
# - math: the call itself (meta's composite; K/V heads repeated for enable_gqa).
# Full text: docs/notes.md, "SDPA calls per backend".
_POSITIONAL = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal")
_KEYWORDS = frozenset((*_POSITIONAL, "scale", "enable_gqa"))


def _bind(args: tuple, kwargs: dict) -> SdpaCall | None:
    """The call's arguments, or None when they do not bind (torch's own call
    then raises its own error)."""
    if len(args) > len(_POSITIONAL) or not kwargs.keys() <= _KEYWORDS:
        return None
    named = dict(zip(_POSITIONAL, args, strict=False)) | kwargs
    if not all(isinstance(named.get(n), torch.Tensor) for n in _POSITIONAL[:3]):
        return None
    call = SdpaCall(**named)
    if any(t.is_nested for t in (call.query, call.key, call.value)):
        return None
    return call


def _additive_mask(
    mask: torch.Tensor | None, dtype: torch.dtype, masked_out: float
) -> torch.Tensor | None:
    if mask is None or mask.dtype != torch.bool:
        return mask
    blocked = torch.scalar_tensor(masked_out, dtype=dtype, device=mask.device)
    kept = torch.scalar_tensor(0.0, dtype=dtype, device=mask.device)
    return torch.where(mask, kept, blocked)


def _efficient_mask(mask: torch.Tensor, call: SdpaCall) -> torch.Tensor:
    """attention.cpp's `preprocess_mask`: pad to aligned strides, expand."""
    aligned = all(mask.stride(i) % 8 == 0 for i in range(mask.dim() - 1)) and mask.stride(-1) == 1
    if not aligned:
        last = mask.size(-1)
        mask = F.pad(mask, (0, 8 - last % 8))[..., :last]
    q = call.query
    return mask.expand(q.size(0), q.size(1), q.size(2), call.key.size(2))


def _flash_cuda(call: SdpaCall) -> torch.Tensor:
    q, k, v = call.query, call.key, call.value
    head_dim = q.size(-1)
    scale = call.scale if call.scale is not None else 1.0 / math.sqrt(head_dim)
    if head_dim % 8:
        pad = (0, 8 - head_dim % 8)
        q, k, v = F.pad(q, pad), F.pad(k, pad), F.pad(v, pad)
    out = aten._scaled_dot_product_flash_attention(
        q, k, v, call.dropout_p, call.is_causal, False, scale=scale
    )[0]
    return out[..., :head_dim] if out.size(-1) != head_dim else out


def _run_fused(backend: AttentionBackend, target: Target, call: SdpaCall) -> torch.Tensor:
    """The output of `backend`'s aten op (NOTE [ SDPA calls per backend ])."""
    q, k, v = call.query, call.key, call.value
    p, causal, scale = call.dropout_p, call.is_causal, call.scale
    if target.device is TargetDevice.CPU:
        mask = _additive_mask(call.attn_mask, q.dtype, -math.inf)
        return aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, p, causal, attn_mask=mask, scale=scale
        )[0]
    if backend is AttentionBackend.FLASH:
        return _flash_cuda(call)
    lse = call.requires_grad
    if backend is AttentionBackend.EFFICIENT:
        mask = _additive_mask(call.attn_mask, q.dtype, -math.inf)
        mask = None if mask is None else _efficient_mask(mask, call)
        return aten._scaled_dot_product_efficient_attention(
            q, k, v, mask, lse, p, causal, scale=scale
        )[0]
    mask = _additive_mask(call.attn_mask, q.dtype, -65504.0)
    return aten._scaled_dot_product_cudnn_attention(
        q, k, v, mask, lse, p, causal, False, scale=scale
    )[0]


@handles(F.scaled_dot_product_attention)
def scaled_dot_product_attention(em: Emulation, func: Callable, args: tuple, kwargs: dict) -> Any:
    """SDPA as `em.target` runs it (NOTE [ SDPA calls per backend ])."""
    call = _bind(args, kwargs)
    if call is None:
        return func(*args, **kwargs)
    backend = _select(em.target, call)
    if backend is AttentionBackend.MATH:
        return func(*args, **kwargs)
    return _run_fused(backend, em.target, call)


# NOTE [ Philox outputs on the host ]
# The fused CUDA ops return a philox seed and offset for backward's dropout.
# Where they live, read in cuda/attention.cu (recent main) and
# flash_attn/flash_api.cpp (03b7c19):
# - efficient (`_efficient_attention_forward`, Note [Seed and Offset Device]):
#   CPU scalars unless a CUDA graph is being captured, dropout or not, so
#   outputs 2 and 3 of `_scaled_dot_product_efficient_attention` are host
#   memory, not device buffers.
# - flash (`mha_fwd`, "[Note] BC breaking change to flash seed/offset"): a
#   (2,) uint64 `rng_state` and a () uint64 allocated on CUDA, always: device
#   buffers (24 bytes, saved for backward), as meta's kernel returns them.
# - cuDNN (`_cudnn_attention_forward`): two () int64 on CUDA: device buffers.
# CUDA graph capture is not modelled; a cpu target keeps all in its memory.
EFFICIENT_PHILOX = ("aten._scaled_dot_product_efficient_attention.default", (2, 3))


def host_outputs(target: Target) -> Mapping[str, tuple[int, ...]]:
    """aten target -> the positions of its outputs `target` keeps in host memory."""
    if target.device is not TargetDevice.CUDA:
        return {}
    return dict([EFFICIENT_PHILOX])

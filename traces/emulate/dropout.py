"""Dropout as a CUDA target runs it: one fused `native_dropout`."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from memplan.traces.emulate.mode import handles
from memplan.traces.target import TargetDevice

if TYPE_CHECKING:
    from memplan.traces.emulate.mode import Emulation


# NOTE [ Dropout on a CUDA target ]
# aten's `dropout` (aten/src/ATen/native/Dropout.cpp) returns
# `native_dropout(input, p, train)[0]` when training and
# `is_fused_kernel_acceptable`: a CUDA (or xpu, lazy, privateuse1) input with
# elements and 0 < p < 1. Its autograd saves a bool mask, one byte per
# element, and backward is one `native_dropout_backward`. Anywhere else --
# cpu, and meta's own dispatch -- `_dropout_impl` draws a noise tensor of the
# input's dtype (`empty_like`, `bernoulli_`, `div_`) and multiplies: the mask
# saved is 4 bytes per element in float32. The in-place `dropout_` takes
# `_dropout_impl` on every device, so only the out-of-place call changes.
@handles(F.dropout, torch.dropout)
def _dropout(em: Emulation, func: Callable, args: tuple, kwargs: dict) -> Any:
    names = ("input", "p", "training", "inplace") if func is F.dropout else ("input", "p", "train")
    bound = {**dict(zip(names, args, strict=False)), **kwargs}
    x = bound["input"]
    p = float(bound.get("p", 0.5))
    train = bool(bound.get("training", bound.get("train", True)))
    if (
        em.target.device is not TargetDevice.CUDA
        or bound.get("inplace", False)
        or not train
        or not 0.0 < p < 1.0
        or x.numel() == 0
    ):
        return func(*args, **kwargs)
    return torch.native_dropout(x, p, True)[0]

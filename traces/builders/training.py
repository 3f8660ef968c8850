"""The options applied to any workload's model once built: its dtype
(NOTE [ Low-precision training ]), gradient checkpointing (NOTE [ Recompute
under emulation ]), frozen parameters and LoRA adapters, in the order of
NOTE [ Model options ]."""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import functools
import warnings
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import torch
from memplan.traces.builders.options import Dtype, Lora, ModelOptions
from memplan.traces.builders.packages import _first_line, _package
from memplan.traces.errors import TraceError
from torch import Tensor, nn

if TYPE_CHECKING:
    from memplan.traces.workload import Workload


# ---- the options, applied ----------------------------------------------------------------
# NOTE [ Low-precision training ]
# `dtype` bf16 or fp16 is pure low-precision training: parameters, grads,
# optimizer state and activations all in that dtype, as after
# `model.to(torch.bfloat16)` -- not `--amp`, which keeps fp32 parameters and
# casts inside autocast. tv: and hf: models are built in the dtype (hf: with
# transformers' `dtype=`, which may keep modules it lists in fp32); zoo names
# and package.module:callable have their model converted with `.to(dtype)`
# (buffers too: BatchNorm statistics) and their floating inputs and targets
# with it; integer inputs (ids, class labels) stay as they are. LoRA
# adapters are fp32 over a low-precision model (peft's
# `autocast_adapter_dtype`), as in a real peft run.
def with_options(
    factory: Callable[[int], Workload], options: ModelOptions, name: str
) -> Callable[[int], Workload]:
    """`factory` (a zoo name's or package.module:callable's) with `options`
    applied to what it builds."""
    return functools.partial(_build_with_options, factory, options, name)


def _build_with_options(
    factory: Callable[[int], Workload], options: ModelOptions, name: str, batch_size: int
) -> Workload:
    from memplan.traces.workload import Workload

    w = factory(batch_size)
    if not isinstance(w, Workload):
        return w  # capture and zoo.build say what is wrong with it
    if options.dtype is not Dtype.FP32:
        dtype = options.dtype.torch

        def cast(t: Any) -> Any:
            return t.to(dtype) if isinstance(t, Tensor) and t.is_floating_point() else t

        inputs, targets = tuple(map(cast, w.inputs)), tuple(map(cast, w.targets))
        w = Workload(w.model.to(dtype), inputs, targets, w.loss_fn)
    return finish(w, options, name)


def finish(w: Workload, options: ModelOptions, name: str) -> Workload:
    """Gradient checkpointing, freezing and LoRA, in that order
    (NOTE [ Model options ]), on a model already in its dtype."""
    model = w.model
    if options.gradient_checkpointing:
        _checkpointing(model, name)
    if options.freeze:
        freeze(model, options.freeze, name)
    if options.lora is not None:
        model = _lora(model, options.lora, name)
    return dataclasses.replace(w, model=model)


def freeze(model: nn.Module, patterns: tuple[str, ...], name: str) -> list[str]:
    """Set ``requires_grad=False`` on the parameters whose names match a
    pattern (fnmatch); every pattern must match one. Returns the names frozen."""
    names = [n for n, _ in model.named_parameters()]
    frozen: list[str] = []
    for pattern in patterns:
        hits = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not hits:
            shown = ", ".join(names[:4]) + (", ..." if len(names) > 4 else "")
            raise TraceError(
                f"{name} --freeze {pattern!r}: matches no parameter (names are like {shown})"
            )
        frozen += [n for n in hits if n not in frozen]
    params = dict(model.named_parameters())
    for n in frozen:
        params[n].requires_grad_(False)
    return frozen


def _checkpointing(model: nn.Module, name: str) -> None:
    """transformers' own gradient checkpointing, non-reentrant (the form
    torch recommends; the reentrant one needs inputs that require grad)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    kwargs_name = "activation_checkpointing_kwargs"
    if enable is None:  # transformers before the rename
        enable = getattr(model, "gradient_checkpointing_enable", None)
        kwargs_name = "gradient_checkpointing_kwargs"
    if enable is None:
        raise TraceError(f"{name} --gradient-checkpointing: the model is not a transformers model")
    try:
        enable(**{kwargs_name: {"use_reentrant": False, "context_fn": _forward_modes}})
    except ValueError as e:  # "... does not support activation checkpointing."
        raise TraceError(f"{name} --gradient-checkpointing: {_first_line(e)}") from None


# NOTE [ Recompute under emulation ]
# Non-reentrant checkpointing recomputes a layer's forward inside backward
# (torch/utils/checkpoint.py, `_checkpoint_without_reentrant_generator`'s
# `recompute_fn`), where the torch-function modes entered around the step
# are not active: torch dispatch modes reach backward, function modes do
# not. Torch itself restores the forward's autocast state for the
# recompute, and a GPU's dispatch picks the same kernels both times; but on
# meta with a target, the `Emulation` function mode that routes SDPA,
# dropout and autocast to the target (traces/emulate/) would be missing, so
# the recompute would take meta's math attention -- a different count of
# saved tensors (checkpoint's CheckpointError), or silently other buffers.
# So checkpointing gets a `context_fn` that notes the function modes at
# forward and enters them again around the recompute, with the emulated
# autocast region the forward ran in. Nothing changes without a mode (cpu).
def _forward_modes() -> tuple[AbstractContextManager, AbstractContextManager]:
    """checkpoint's `context_fn` (NOTE [ Recompute under emulation ]):
    nothing around the forward; the forward's modes around the recompute."""
    from torch.overrides import _get_current_function_mode_stack

    modes = _get_current_function_mode_stack()
    return contextlib.nullcontext(), _entered_again(modes, [_autocast_of(m) for m in modes])


def _autocast_of(mode: object) -> torch.dtype | None:
    from memplan.traces.emulate.mode import Emulation

    return mode.autocast_dtype if isinstance(mode, Emulation) else None


@contextlib.contextmanager
def _entered_again(modes: list, autocast: list[torch.dtype | None]) -> Iterator[None]:
    with contextlib.ExitStack() as stack:
        for mode, dtype in zip(modes, autocast, strict=True):
            stack.enter_context(mode)
            if dtype is not None:
                stack.enter_context(mode.autocast_region(dtype))
        yield


def _lora(model: nn.Module, lora: Lora, name: str) -> nn.Module:
    peft = _package("peft", f"{name} --lora", "pip install 'memplan[lora]'")
    kwargs: dict[str, Any] = {"r": lora.r, "lora_dropout": lora.dropout}
    if lora.alpha is not None:
        kwargs["lora_alpha"] = lora.alpha
    if lora.target_modules is not None:
        kwargs["target_modules"] = list(lora.target_modules)
    elif not hasattr(model, "config"):
        raise TraceError(
            f"{name} --lora: give target_modules=NAME,... (peft has defaults for transformers "
            "architectures only)"
        )
    try:
        with warnings.catch_warnings():  # peft asks transformers' deprecated names
            warnings.simplefilter("ignore", FutureWarning)
            return peft.get_peft_model(model, peft.LoraConfig(**kwargs))
    except (ValueError, TypeError, KeyError) as e:  # target modules the model has not, ...
        raise TraceError(f"{name} --lora: {_first_line(e)}") from None

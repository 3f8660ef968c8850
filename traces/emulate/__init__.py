"""What PyTorch's dispatch would run on a target device, emulated on meta.

A capture on meta for a `Target` runs its training step under `Emulation`,
a `TorchFunctionMode` scoped to the capture (torch itself is never patched).
It sees each torch-level call before autograd does and routes it to what the
target runs:

- `attention.py`: `F.scaled_dot_product_attention` to the SDPA backend the
  target's dispatch picks (flash, memory-efficient, cuDNN, math);
- `rnn.py`: `nn.LSTM` / `GRU` / `RNN` to the fused `_cudnn_rnn` kernel;
- `autocast.py`: `--amp` casts as the target device type's autocast does.

Below autograd, the recorder asks `dispatch_rules(target)` for the few aten
kernels meta lacks (cuDNN's RNN backward) and for outputs the target keeps on
the host (the philox seed and offset of CUDA's attention kernels).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from memplan.traces.target import Target
from torch.overrides import TorchFunctionMode

# A handler runs in place of a torch-level function: (emulation, func, args, kwargs) -> result.
Handler = Callable[["Emulation", Callable, tuple, dict], Any]

# torch-level function -> handler, filled by the modules of this package
HANDLERS: dict[Callable, Handler] = {}


def handles(*funcs: Callable) -> Callable[[Handler], Handler]:
    """Register a handler for the torch-level functions `funcs`."""

    def register(handler: Handler) -> Handler:
        for f in funcs:
            HANDLERS[f] = handler
        return handler

    return register


@dataclass(frozen=True, slots=True)
class DispatchRules:
    """What the recorder's dispatch mode does differently for a target:
    `kernels` maps an aten target (`aten._cudnn_rnn_backward.default`) to a
    Python function computing its outputs on meta, for ops with no meta
    kernel; `host_outputs` maps an aten target to the positions of its outputs
    that the target keeps in host memory (not device buffers)."""

    kernels: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    host_outputs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


NO_RULES = DispatchRules()


class Emulation(TorchFunctionMode):
    """Routes torch-level calls to what `target` runs (see the module doc).
    `autocast_dtype` is set inside `autocast_region` only."""

    def __init__(self, target: Target) -> None:
        super().__init__()
        self.target = target
        self.autocast_dtype: torch.dtype | None = None
        # autocast's cache of cast leaf tensors, for one region (autocast.py)
        self.cast_cache: dict[int, torch.Tensor] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if self.autocast_dtype is not None:
            from memplan.traces.emulate import autocast

            args, kwargs = autocast.cast_inputs(self, func, args, kwargs)
        handler = HANDLERS.get(func)
        if handler is None:
            return func(*args, **kwargs)
        return handler(self, func, args, kwargs)

    @contextmanager
    def autocast_region(self, dtype: torch.dtype) -> Iterator[None]:
        """Forward and loss under the target's autocast to `dtype`; the cast
        cache lives for the region, as `torch.autocast`'s does."""
        before = self.autocast_dtype
        self.autocast_dtype = dtype
        try:
            yield
        finally:
            self.autocast_dtype = before
            if before is None:
                self.cast_cache.clear()


def dispatch_rules(target: Target | None) -> DispatchRules:
    """The recorder's rules for `target` (NO_RULES for none)."""
    if target is None:
        return NO_RULES
    from memplan.traces.emulate import attention, rnn

    return DispatchRules(
        kernels={**rnn.meta_kernels(target)},
        host_outputs={**attention.host_outputs(target)},
    )


def load_handlers() -> None:
    """Import the modules that register handlers (once; cheap after)."""
    from memplan.traces.emulate import attention, rnn  # noqa: F401

"""The emulation's core: the `Emulation` mode, the registry of handlers its
modules fill, and the `DispatchRules` the recorder reads (the package's
docstring says what each module emulates)."""

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

# A caster rewrites a call's arguments first, inside an autocast region:
# (emulation, func, args, kwargs) -> (args, kwargs).
Caster = Callable[["Emulation", Callable, tuple, dict], tuple[tuple, dict]]

# torch-level function -> handler, filled by the modules of this package
HANDLERS: dict[Callable, Handler] = {}
# autocast.py's `cast_inputs`, registered when it is imported (traces/step.py does)
CASTERS: list[Caster] = []


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
    that the target keeps in host memory (not device buffers); `flops` maps
    an aten target to its FLOP count from the op's arguments, for kernels
    torch's FLOP counter does not know."""

    kernels: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    host_outputs: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    flops: Mapping[str, Callable[..., int]] = field(default_factory=dict)


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
            for cast in CASTERS:
                args, kwargs = cast(self, func, args, kwargs)
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

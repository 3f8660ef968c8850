"""The trace's views as tensors over the device pool's storages: each made
once, kept until its buffer's device copy changes (bound or dropped)."""

from __future__ import annotations

import torch
from memplan.traces.model import Trace


class ViewCache:
    """Views over `storage` (the pool's list of device copies, by buffer):
    the pool calls `forget(b)` whenever it changes `storage[b]`."""

    def __init__(
        self, trace: Trace, device: torch.device, storage: list[torch.UntypedStorage | None]
    ):
        self.trace = trace
        self.device = device
        self._storage = storage
        self._views_of: list[list[int]] = [[] for _ in range(trace.n_buffers)]
        for v in trace.views:
            self._views_of[v.buffer].append(v.id)
        self._cache: dict[int, torch.Tensor] = {}

    def get(self, v: int) -> torch.Tensor:
        """View `v` over its buffer's current device storage."""
        t = self._cache.get(v)
        if t is None:
            view = self.trace.views[v]
            storage = self._storage[view.buffer]
            if storage is None:
                raise AssertionError(f"view {v}: buffer {view.buffer} is not on the device")
            t = torch.empty(0, dtype=getattr(torch, view.dtype), device=self.device)
            t.set_(storage, view.offset, view.shape, view.stride)
            self._cache[v] = t
        return t

    def forget(self, b: int) -> None:
        """Buffer `b`'s device copy changed: its views are made again."""
        for v in self._views_of[b]:
            self._cache.pop(v, None)

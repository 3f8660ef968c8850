"""Host memory for copies off the device: a pool of flat byte buffers,
pinned where the runtime copies to and from CUDA."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch


class PinnedPool:
    """Host buffers by size, reused across steps; pinned on CUDA. A buffer
    is free again once the copy that last read it has completed."""

    def __init__(self, pin: bool):
        self.pin = pin
        self._free: defaultdict[int, list[tuple[torch.Tensor, Any]]] = defaultdict(list)

    def get(self, nbytes: int) -> torch.Tensor:
        free = self._free[nbytes]
        for i, (t, event) in enumerate(free):
            if event is None or event.query():
                del free[i]
                return t
        return torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)

    def put(self, t: torch.Tensor, event: Any = None) -> None:
        self._free[t.numel()].append((t, event))


def flat(t: torch.Tensor) -> torch.Tensor:
    """The whole storage of `t` as flat bytes."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())

"""`nn.LSTM` / `GRU` / `RNN` as the target runs them (placeholder)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from memplan.traces.target import Target


def meta_kernels(target: Target) -> Mapping[str, Callable[..., Any]]:
    return {}

"""`torch.autocast` as the target's device type does it (placeholder)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from memplan.traces.emulate import Emulation


def cast_inputs(em: Emulation, func: Callable, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return args, kwargs

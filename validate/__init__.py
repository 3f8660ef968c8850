"""Does the plan hold: replay a trace with real tensors, with and without a
plan, and check that nothing computed changed.

Three rooms: `replay/` (the executor), `calibrate/` (simulated against
measured) and `runtime/` (a plan in a real training loop, which loads
neither SimPy nor the replay engine). So importing this package loads none
of them: the names below are looked up on first use.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memplan.validate.errors import ValidationError
    from memplan.validate.replay.executor import replay
    from memplan.validate.replay.result import ReplayResult, compare_results
    from memplan.validate.replay.transfer import Direction, TransferRecord

__all__ = [
    "Direction",
    "ReplayResult",
    "TransferRecord",
    "ValidationError",
    "compare_results",
    "replay",
]

_WHERE = {
    "Direction": "memplan.validate.replay.transfer",
    "ReplayResult": "memplan.validate.replay.result",
    "TransferRecord": "memplan.validate.replay.transfer",
    "ValidationError": "memplan.validate.errors",
    "compare_results": "memplan.validate.replay.result",
}


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


# NOTE [ replay, the function and the room ]
# `memplan.validate.replay` names two things: the function that replays a
# trace, and the room (subpackage) it lives in. Importing any module of the
# room makes the import system set this package's attribute `replay` to the
# room, after which a module `__getattr__` is never asked for it again. So
# `replay` is a property of this module's class: it always gives the
# function (imported on first use), and ignores the import system's
# binding; the room stays `sys.modules["memplan.validate.replay"]`.
class _Validate(types.ModuleType):
    @property
    def replay(self) -> Any:
        from memplan.validate.replay.executor import replay

        return replay

    @replay.setter
    def replay(self, room: types.ModuleType) -> None:
        pass  # the room, bound by the import system: reached through sys.modules


sys.modules[__name__].__class__ = _Validate

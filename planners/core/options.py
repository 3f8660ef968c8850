"""Planner options as data: the empty options of a planner without any, and
an options dataclass as JSON values for `PlanResult.options`.

Parsing options from strings (the CLI's ``key=value``) happens once, at the
registry (`memplan.planners.registry.make_options`); a planner receives an
instance of its options dataclass.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class NoOptions:
    """The options of a planner that has none."""


def options_dict(options: Any) -> dict[str, Any]:
    """An options dataclass as JSON values (enums by value), for `PlanResult.options`."""
    return {f.name: _json(getattr(options, f.name)) for f in dataclasses.fields(options)}


def _json(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, tuple | list):
        return [_json(x) for x in v]
    return v

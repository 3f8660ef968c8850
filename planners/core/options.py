"""Planner options as data: the empty options of a planner without any, and
an options dataclass as JSON values for `PlanResult.options`.

Parsing options from strings (the CLI's ``key=value``) happens once, at the
registry (`memplan.planners.registry.make_options`); a planner receives an
instance of its options dataclass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from memplan.traces.fields import record


@dataclass(frozen=True, slots=True)
class NoOptions:
    """The options of a planner that has none."""


def options_dict(options: Any) -> dict[str, Any]:
    """An options dataclass as JSON values (enums by value), for `PlanResult.options`."""
    return record(options)

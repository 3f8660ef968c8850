"""What to move and when: the Plan model, the checker, one module per planner."""

from planners.check import check
from planners.errors import PlanError
from planners.plan import (
    Event,
    Plan,
    PlanResult,
    Recompute,
    Release,
    SwapIn,
    SwapOut,
    empty_plan,
    validate,
)

__all__ = [
    "Event",
    "Plan",
    "PlanError",
    "PlanResult",
    "Recompute",
    "Release",
    "SwapIn",
    "SwapOut",
    "check",
    "empty_plan",
    "validate",
]

"""What to move and when: the Plan model, the checker, one module per planner."""

from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import (
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

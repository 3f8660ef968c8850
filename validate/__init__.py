"""Does the plan hold: replay a trace with real tensors, with and without a
plan, and check that nothing computed changed."""

from validate.errors import ValidationError
from validate.executor import replay
from validate.lanes import Direction, TransferRecord
from validate.result import ReplayResult, compare_results

__all__ = [
    "Direction",
    "ReplayResult",
    "TransferRecord",
    "ValidationError",
    "compare_results",
    "replay",
]

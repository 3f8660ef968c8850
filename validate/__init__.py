"""Does the plan hold: replay a trace with real tensors, with and without a
plan, and check that nothing computed changed."""

from memplan.validate.errors import ValidationError
from memplan.validate.replay.executor import replay
from memplan.validate.replay.lanes import Direction, TransferRecord
from memplan.validate.replay.result import ReplayResult, compare_results

__all__ = [
    "Direction",
    "ReplayResult",
    "TransferRecord",
    "ValidationError",
    "compare_results",
    "replay",
]

"""What a training step does: the trace data model, capture, the zoo, file IO."""

from memplan.traces.errors import MemplanError, TraceError
from memplan.traces.model import Buffer, BufferKind, Op, Phase, SavedTensor, Trace, TraceMeta, View

__all__ = [
    "Buffer",
    "BufferKind",
    "MemplanError",
    "Op",
    "Phase",
    "SavedTensor",
    "Trace",
    "TraceError",
    "TraceMeta",
    "View",
]

"""The validation layer's exception: a replay that cannot run, or results
that differ where a plan promised they would not."""

from memplan.traces.errors import MemplanError


class ValidationError(MemplanError):
    """A replay that cannot proceed (a plan reads data that is gone, an op
    the trace cannot call again) or two replays that differ; the message
    names the op, the buffer and the reason."""

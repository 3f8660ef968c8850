"""The planners' exception: a malformed plan, or a plan that cannot run."""

from memplan.traces.errors import MemplanError


class PlanError(MemplanError):
    """A plan that does not fit its trace or would read data that is gone;
    the message names the event (or the op), the buffer and the reason."""

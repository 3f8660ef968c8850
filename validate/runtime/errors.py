"""The runtime's exception: a plan that does not fit the model or the step
it is applied to, or a runtime plan file that cannot be read. Its own, so
that the runtime imports nothing of the replay engine."""

from memplan.traces.errors import MemplanError


class RuntimePlanError(MemplanError):
    """A runtime plan that cannot be applied (a module of the trace missing
    from the model, a saved tensor that differs from the recorded one) or
    read; the message names the saved tensor, module or field."""

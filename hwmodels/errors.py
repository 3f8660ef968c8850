from memplan.traces.errors import MemplanError


class LatencyError(MemplanError):
    """A bad hardware profile or latency model, or an op a model cannot time."""

"""The simulator's exception: bad simulation settings or a job it cannot run."""

from memplan.traces.errors import MemplanError


class SimError(MemplanError):
    """Bad `simulate` arguments (budget, lanes, iterations), or a job whose
    plan leaves it without data at run time; the message names what and where."""

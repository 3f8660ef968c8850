"""The simulator's exceptions: bad simulation settings or a job it cannot run,
and the out-of-memory signal that stops a job inside a run."""

from memplan.traces.errors import MemplanError


class SimError(MemplanError):
    """Bad `simulate` arguments (budget, lanes, iterations), or a job whose
    plan leaves it without data at run time; the message names what and where."""


class OutOfMemory(Exception):
    """An allocation for `op` (-1: at the start of an iteration) whose first
    buffer is `buffer` cannot fit under the pool's policy (NOTE [ Out of
    memory ] in sim/memory.py). Internal: the job that asked stops, and the
    result says so; it never leaves `simulate`."""

    def __init__(self, op: int, buffer: int):
        super().__init__(op, buffer)
        self.op = op
        self.buffer = buffer

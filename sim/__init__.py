"""What a plan costs: the SimPy model of compute, PCIe lane(s) and memory;
metrics and timelines."""

from memplan.sim.errors import SimError
from memplan.sim.job import Job
from memplan.sim.log import LogEntry, LogKind
from memplan.sim.metrics import JobResult, MemoryCurve, Metrics, Savings, SimResult, savings
from memplan.sim.simulate import simulate
from memplan.sim.state import OomPolicy

__all__ = [
    "Job",
    "JobResult",
    "LogEntry",
    "LogKind",
    "MemoryCurve",
    "Metrics",
    "OomPolicy",
    "Savings",
    "SimError",
    "SimResult",
    "savings",
    "simulate",
]

"""What a plan costs: the SimPy model of compute, PCIe lane(s) and memory;
metrics and timelines."""

from sim.errors import SimError
from sim.job import Job
from sim.log import LogEntry, LogKind
from sim.metrics import Comparison, JobResult, MemoryCurve, Metrics, SimResult, compare
from sim.simulate import simulate
from sim.state import OomPolicy

__all__ = [
    "Comparison",
    "Job",
    "JobResult",
    "LogEntry",
    "LogKind",
    "MemoryCurve",
    "Metrics",
    "OomPolicy",
    "SimError",
    "SimResult",
    "compare",
    "simulate",
]

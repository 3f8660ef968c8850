"""What a plan costs: the SimPy model of compute, PCIe lane(s) and memory;
metrics and timelines."""

from memplan.sim.control import Controller, IterationReport, LateSwapIn, PlanChange
from memplan.sim.dynamics import LaneSlowdown
from memplan.sim.errors import SimError
from memplan.sim.job import Job
from memplan.sim.log import LogEntry, LogKind
from memplan.sim.metrics import JobResult, MemoryCurve, Metrics, Savings, SimResult, savings
from memplan.sim.simulate import simulate
from memplan.sim.state import OomPolicy

__all__ = [
    "Controller",
    "IterationReport",
    "LaneSlowdown",
    "LateSwapIn",
    "PlanChange",
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

"""Run-time state of the model, per job: its buffers (a `Buffers` store:
where each is and the flags of its life, written only by the transition
function's drivers in `planners/core/lifecycle.py`), its processes and
counters. See NOTE [ Event semantics ] in `sim/model.py`.
"""

from __future__ import annotations

import enum
from collections.abc import Generator
from typing import Any

import simpy
from memplan.planners.core.evaluate import OomPolicy
from memplan.planners.core.lifecycle import ARRIVING, DEV, LEAVING, OFF, Buffers
from memplan.sim.job import CompiledJob

Gen = Generator[simpy.Event, Any, Any]

__all__ = ["ARRIVING", "DEV", "LEAVING", "OFF", "Allocator", "Gen", "JobState", "OomPolicy"]


class Allocator(enum.Enum):
    """How device memory is handed out (NOTE [ The memory a GPU really uses ]
    in sim/simulate.py): tensor bytes exactly, PyTorch's caching allocator,
    or SmartPool's offline layout."""

    EXACT = "exact"
    CACHING = "caching"
    SMARTPOOL = "smartpool"


class JobState(Buffers):
    """The run-time state of one job: its buffers (`Buffers`), its processes
    and counters."""

    def __init__(self, c: CompiledJob):
        nb = len(c.nbytes)
        super().__init__(nb)
        self.c = c
        self.in_ev: dict[int, simpy.Event] = {}
        self.pinned: tuple[int, ...] = ()
        self.deadlines: dict[tuple[int, int], list[tuple[int, simpy.Event]]] = {}
        self.dur: list[float] = c.durations
        self.iteration = 0
        # NOTE [ Stopping a job ]: the job's own process and its planned
        # copies still running (a dict: interrupted in the order they started).
        self.proc: simpy.Process | None = None
        self.copy_procs: dict[simpy.Process, None] = {}
        self.stopped = False
        self.oom: tuple[int, int, int] | None = None  # (iteration, op, buffer)
        self.start_us = self.end_us = float("nan")
        self.iter_start_us: list[float] = []
        self.iter_end_us: list[float] = []
        self.stall_us = self.recompute_us = 0.0
        self.remat_us = 0.0  # the part of recompute_us that DTR's remakes took
        self.bytes_h2d = self.bytes_d2h = self.passive = 0
        # what the OOM policy evicted (NOTE [ Out of memory ] in sim/memory.py)
        self.evictions = self.evicted_bytes = 0
        # NOTE [ DTR ] in sim/remat.py: when each buffer was last used (us)
        self.last_use = [0.0] * nb
        # NOTE [ Pinned host memory ] in sim/memory.py: off the device, data on the host
        self.parked = [False] * nb
        # how many are; at 0 nothing reads `parked` (NOTE [ Fewer streams per op ])
        self.n_parked = 0
        self.parked_bytes = self.parked_peak = 0
        self.scratch_bytes = 0  # the current op's workspace
        self.context_bytes = 0  # its CUDA context, while the job runs
        # NOTE [ Plan changes at a boundary ] in sim/boundary.py
        self.plan_versions: list[int] = []
        self.plan_changes: list[tuple[int, float, str]] = []
        self.depart_proc: simpy.Process | None = None  # NOTE [ Departures ]
        self.departed = False
        self.ready_us = [0.0] * c.n_ops  # when each op last queued for compute (shared)

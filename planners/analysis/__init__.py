"""What every planner needs to know about its jobs: when each op runs, what a
copy costs, where the memory peaks and which lane time is still free.

This is TENSILE's machinery (§III-A, §IV-B Algorithm 1, §IV-C feasible
intervals), shared by every planner. It lives in one module per concept;
this module re-exports their public names, so planners import from one place:

- `planners.core.jobs`: `as_traces`, `check_budget` -- a planner's arguments.
- `planners.analysis.optimes`: `Timeline`, `predict_timeline(s)`, `op_durations_us`,
  `EPS_US` -- when each op runs (NOTE [ Jobs on
  one GPU ]) and what a copy costs.
- `planners.analysis.accesses`: `AccessTable`, `access_table` -- per-buffer access
  lists with write flags, and the gap between two accesses around an op.
- `planners.analysis.opgrid`: `MemoryState`, `FIRST` / `STEADY` / `BOTH`,
  `PeakAnalysis`, `peak_analysis`, `memory_of_plan` -- residency and its peak
  on the op grid (NOTE [ Peak analysis on the op grid ]).
- `planners.analysis.queued`: `queued_peak` -- one job's peak with its copies
  queued FIFO on the lane(s), as vDNN predicts it.
- `planners.analysis.lanes`: `LaneSet` -- the PCIe lane timeline(s) and their free
  intervals (NOTE [ Lane timelines ]).

Lower bounds are imported from their modules, not from here (the multi-op
bound loads OR-tools' min-cost flow): `planners.analysis.bounds` (peak and
single-op time, NOTE [ Lower bounds ]), `planners.analysis.gaps` (what an
absence costs, NOTE [ Absences ]) and `planners.analysis.window_bound`
(`best_time_bound`, NOTE [ Window bounds ]).

Times are microseconds throughout (what `delay_us` in a plan is), sizes bytes.
"""

from memplan.planners.analysis.accesses import AccessTable, access_table
from memplan.planners.analysis.lanes import LaneSet
from memplan.planners.analysis.opgrid import (
    BOTH,
    FIRST,
    STEADY,
    MemoryState,
    PeakAnalysis,
    memory_of_plan,
    peak_analysis,
)
from memplan.planners.analysis.optimes import (
    EPS_US,
    Timeline,
    op_durations_us,
    predict_timeline,
    predict_timelines,
)
from memplan.planners.analysis.queued import queued_peak
from memplan.planners.core.jobs import as_traces, check_budget

__all__ = [
    "BOTH",
    "EPS_US",
    "FIRST",
    "STEADY",
    "AccessTable",
    "LaneSet",
    "MemoryState",
    "PeakAnalysis",
    "Timeline",
    "access_table",
    "as_traces",
    "check_budget",
    "memory_of_plan",
    "op_durations_us",
    "peak_analysis",
    "predict_timeline",
    "predict_timelines",
    "queued_peak",
]

"""The model's event log: what happened, when, to which job, op and buffer.

Metrics and timelines are computed from this log (and the memory samples),
never from prints inside the model. Times are microseconds of simulated time.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class LogKind(enum.Enum):
    ITER_START = "iter_start"
    ITER_END = "iter_end"
    OP_START = "op_start"
    OP_END = "op_end"
    RECOMPUTE_START = "recompute_start"  # op = the re-run op, buffer = the recomputed one
    RECOMPUTE_END = "recompute_end"
    SWAP_OUT_START = "swap_out_start"  # a planned D2H copy holds its lane
    SWAP_OUT_END = "swap_out_end"
    SWAP_IN_START = "swap_in_start"  # a planned H2D copy holds its lane
    SWAP_IN_END = "swap_in_end"
    EVICT_START = "evict_start"  # passive: synchronous D2H copy to make room
    EVICT_END = "evict_end"
    FETCH_START = "fetch_start"  # passive: on-demand H2D copy of an absent input
    FETCH_END = "fetch_end"
    DISCARD = "discard"  # device copy dropped, the host copy is still valid: no transfer
    DROP = "drop"  # dtr: device copy dropped, to be remade by recompute (NOTE [ DTR ])
    RELEASE = "release"
    STALL_START = "stall_start"  # compute waits for a swap-in or for memory
    STALL_END = "stall_end"
    SKIP = "skip"  # a plan event found nothing to do (see NOTE [ Event semantics ])
    OOM = "oom"
    DEPART = "depart"  # the job leaves at its departure_s (NOTE [ Departures ] in sim/dynamics.py)
    PLAN = "plan"  # a plan change takes effect; buffer = the plan's version (sim/boundary.py)


class LogEntry(NamedTuple):
    """One instant. `op` is -1 where no op applies (iteration start), `buffer`
    -1 where no buffer does, `lane` -1 unless a copy holds a lane."""

    t_us: float
    job: int
    iteration: int
    kind: LogKind
    op: int = -1
    buffer: int = -1
    lane: int = -1

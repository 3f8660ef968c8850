"""Persistent buffers off the device while memory peaks (NOTE [ Offload
at the iteration start ]): a start for squeeze's seeds that the heuristics'
plans and the nets' choices are then laid over."""

from __future__ import annotations

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction
from memplan.planners.analysis.accesses import access_table
from memplan.planners.analysis.opgrid import MemoryState
from memplan.planners.analysis.optimes import Timeline
from memplan.planners.core.plan import Event, SwapIn, SwapOut
from memplan.traces.model import Trace

# NOTE [ Offload at the iteration start ]
# Persistent buffers first used after the peak (optimizer state) sit on the device through
# forward and backward for nothing, and TENSILE's cross-iteration swap cannot take them off
# in the first iteration (NOTE [ Cross-iteration swaps ]). So each iteration swaps them out
# after op -1 and in before their first access m. The copies out queue at the start,
# largest first, each with as deadline the first op predicted to start after the copies
# queued up to it end. The swap-ins are packed as late as possible, back to back in order of
# first access, each triggered after the last op ending before its copy must start -- not
# before its copy out is over, nor before the last op where the release-only memory has no
# room for it. `fraction` takes the largest of them up to that share of their bytes: the
# lane they use is lane the heuristics' swaps lose. Figures: docs/notes.md.


def offload_candidates(trace: Trace) -> list[tuple[int, int]]:
    """(first access, buffer) of the persistent buffers first accessed after
    the op where the release-only memory peaks (steady iterations), by first
    access."""
    st = MemoryState(trace, "liveness", count_first_iteration=False)
    _, peak_op = st.peak()
    table = access_table(trace)
    out = []
    for b in np.flatnonzero(trace.persistent).tolist():
        acc = table.accesses(b)
        if len(acc) and int(acc[0]) > peak_op and trace.nbytes[b] > 0:
            out.append((int(acc[0]), b))
    return sorted(out)


def offload_events(
    trace: Trace,
    device: DeviceModel,
    timeline: Timeline,
    candidates: list[tuple[int, int]],
    fraction: float,
    budget: int,
) -> tuple[tuple[Event, ...], int]:
    """The events taking the largest `candidates` (up to `fraction` of their
    bytes) off the device from the iteration start to their first access
    (NOTE [ Offload at the iteration start ]) under `budget` bytes, and the
    bytes they take off."""
    nbytes = trace.nbytes
    total = sum(int(nbytes[b]) for _, b in candidates)
    chosen: list[tuple[int, int]] = []
    taken = 0
    for m, b in sorted(candidates, key=lambda c: (-int(nbytes[c[1]]), c[1])):
        if taken >= fraction * total:
            break
        chosen.append((m, b))
        taken += int(nbytes[b])
    events: list[Event] = []
    out_by: dict[int, int] = {}
    t = 0.0
    for m, b in chosen:  # largest first
        t += float(device.copy_time(int(nbytes[b]), Direction.D2H))
        out_by[b] = min(int(np.searchsorted(timeline.start_us, t, "left")), m)
        events.append(SwapOut(b, -1, before_op=out_by[b]))
    # the release-only curve with all of them off: where one cannot be back
    rest = MemoryState(trace, "liveness", count_first_iteration=False).curve - taken
    nxt = float("inf")
    for m, b in sorted(chosen, reverse=True):
        end = min(float(timeline.start_us[m]), nxt)
        nxt = end - float(device.copy_time(int(nbytes[b]), Direction.H2D))
        k = int(np.searchsorted(timeline.end_us, nxt, "right")) - 1
        short = np.flatnonzero(rest[:m] + int(nbytes[b]) > budget)
        floor = max(out_by[b], int(short[-1]) if len(short) else -1)
        events.append(SwapIn(b, min(max(k, floor, 0), m - 1), m))
    return tuple(events), taken

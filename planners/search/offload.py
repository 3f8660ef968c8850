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
# Under a tight budget the persistent buffers first used after the peak --
# optimizer state, which only the optimizer phase reads -- sit on the device
# through the forward and backward passes for nothing (bert_base: 835 of
# 1253 persistent MiB; vgg16: 1056 of 1583). TENSILE's cross-iteration swap
# (out after the last access, back in the next iteration) cannot take them
# off in the first iteration, where every persistent buffer starts resident
# (NOTE [ Cross-iteration swaps ]), so a plan that needs the room from the
# first iteration on swaps them out at the iteration start instead: each
# iteration, SwapOut after op -1 (a D2H copy: the optimizer wrote them) and
# SwapIn before the first access m, in the same iteration. The copies out
# queue on the lane at the start, largest first; each has as deadline the
# first op whose predicted start is past the predicted end of the copies
# queued up to it (so no op runs short of the room, and on an otherwise idle
# lane none waits). The swap-ins are packed as late as possible on the
# lane, back to back, in order of their first access (ALAP: each ends by its
# own m and by the start of the next one's copy), each triggered after the
# last op that ends before its copy must start -- and not before its copy
# out must be over (a swap-in of a buffer still leaving cancels its free),
# nor before the last op where the release-only memory, with all of them
# off, has no room for it under the budget. `fraction` takes the largest
# of them up to that share of their bytes: the lane they use is lane the
# heuristics' own swaps lose.


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

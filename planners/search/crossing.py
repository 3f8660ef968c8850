"""Persistent buffers off the device across the iteration boundary (NOTE
[ State swaps across the boundary ]): a start for squeeze's seeds and a kind
of move of its rounds."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction
from memplan.planners.analysis.accesses import access_table
from memplan.planners.analysis.opgrid import MemoryState
from memplan.planners.analysis.optimes import Timeline
from memplan.planners.core.plan import Event, Plan, SwapIn, SwapOut
from memplan.planners.search.moves import Move
from memplan.traces.model import Trace

# NOTE [ State swaps across the boundary ]
# A persistent buffer last accessed at op l (the optimizer's write) and first accessed at
# op f of the next iteration may be off the device from after l to before f: `SwapOut(b,
# l)` and a swap-in of the same iteration, `SwapIn(b, k, f)` with k < f (k = -1: at the
# iteration start). It costs one copy each way per iteration. In iteration 0 the buffer is
# resident (NOTE [ Cross-iteration swaps ]) and the swap-in finds it there and does
# nothing, so the ops before f must fit with it in that iteration: buffers first used after
# the peak are NOTE [ Offload at the iteration start ]'s instead. The swap-out's deadline is
# the first op after l where the release-only memory is over the budget with the buffer;
# the swap-in is packed as late as the lane allows, not before the last op before f where
# there is no room for it. A host copy made after l stays valid until the next write, so the
# buffer's swap-outs within the iteration (a backward read to the optimizer) copy nothing.
# As a move of squeeze's rounds it only adds lane work, which rarely pays: it is tried in a
# search's first round only, `rounds.CROSS_EVALS` evaluations at most. Figures:
# docs/planners.md, "State swaps across the boundary".


def cross_candidates(trace: Trace, budget: int) -> list[tuple[int, int, int]]:
    """(last access l, first access f, buffer) of the persistent buffers
    first accessed no later than the op where the release-only memory peaks
    (steady iterations) and last accessed before the last op, where that
    memory is over `budget` bytes at some op after l or before f; by l."""
    st = MemoryState(trace, "liveness", count_first_iteration=False)
    curve, (_, peak_op) = st.curve, st.peak()
    table = access_table(trace)
    out = []
    for b in np.flatnonzero(trace.persistent).tolist():
        acc = table.accesses(b)
        if not len(acc) or trace.nbytes[b] == 0:
            continue
        f, last = int(acc[0]), int(acc[-1])
        if f > peak_op or last >= trace.n_ops - 1 or last < f:
            continue
        if _over(curve, budget, last, f):
            out.append((last, f, b))
    return sorted(out)


def _over(curve: np.ndarray, budget: int, last: int, first: int) -> bool:
    """`curve` (bytes per op) is over `budget` at an op after `last` or before `first`."""
    return bool(curve[last + 1 :].max() > budget) or bool(
        first > 0 and curve[:first].max() > budget
    )


def cross_pair(
    trace: Trace,
    device: DeviceModel,
    timeline: Timeline,
    curve: np.ndarray,
    budget: int,
    b: int,
    last: int,
    first: int,
    end_us: float = float("inf"),
) -> tuple[SwapOut, SwapIn]:
    """Buffer `b` off from after op `last` to before op `first` of the next
    iteration on `curve` (bytes per op with `b` resident) under `budget`
    bytes, its copy in ending by `end_us` as well as by `first`'s predicted
    start (NOTE [ State swaps across the boundary ])."""
    nbytes = int(trace.nbytes[b])
    over = np.flatnonzero(curve[last + 1 :] > budget)
    deadline = last + 1 + int(over[0]) if len(over) else -1
    end = min(float(timeline.start_us[first]), end_us)
    start = end - float(device.copy_time(nbytes, Direction.H2D))
    k = int(np.searchsorted(timeline.end_us, start, "right")) - 1
    short = np.flatnonzero(curve[:first] > budget)  # no room for it there
    floor = int(short[-1]) if len(short) else -1
    k = min(max(k, floor), first - 1)
    return SwapOut(b, last, before_op=deadline), SwapIn(b, k, first)


def cross_events(
    trace: Trace,
    device: DeviceModel,
    timeline: Timeline,
    candidates: list[tuple[int, int, int]],
    fraction: float,
    budget: int,
) -> tuple[Event, ...]:
    """The events taking the largest `candidates` (up to `fraction` of their
    bytes) off the device across the boundary (NOTE [ State swaps across the
    boundary ]) under `budget` bytes; the swap-ins back to back, in order of
    first access."""
    nbytes = trace.nbytes
    total = sum(int(nbytes[b]) for _, _, b in candidates)
    chosen: list[tuple[int, int, int]] = []
    taken = 0
    for c in sorted(candidates, key=lambda c: (-int(nbytes[c[2]]), c[2])):
        if taken >= fraction * total:
            break
        chosen.append(c)
        taken += int(nbytes[c[2]])
    curve = MemoryState(trace, "liveness", count_first_iteration=False).curve
    # with every chosen buffer off, but the one placed
    rest = curve.copy()
    for last, first, b in chosen:
        rest[last + 1 :] -= int(nbytes[b])
        rest[:first] -= int(nbytes[b])
    outs: list[Event] = []
    ins: list[Event] = []
    nxt = float("inf")
    for last, first, b in sorted(chosen, key=lambda c: (-c[1], c[2])):
        mine = rest.copy()  # the others off, this one back
        mine[last + 1 :] += int(nbytes[b])
        mine[:first] += int(nbytes[b])
        out, back = cross_pair(trace, device, timeline, mine, budget, b, last, first, nxt)
        h2d = float(device.copy_time(int(nbytes[b]), Direction.H2D))
        nxt = min(float(timeline.start_us[first]), nxt) - h2d
        outs.append(out)
        ins.append(back)
    return (*outs, *ins)


def cross_moves(
    traces: Sequence[Trace],
    device: DeviceModel,
    timelines: Sequence[Timeline],
    budget: int,
    plans: Sequence[Plan],
) -> list[Move]:
    """Per persistent buffer that no event of the plan takes off after its
    last access l or before its first access f, where the release-only
    memory is over `budget` bytes at some op after l or before f, the pair
    that takes it off across the boundary (NOTE [ State swaps across the
    boundary ]), largest first; the checker refuses those the plan's other
    events contradict."""
    moves = []
    for j, (t, tl, p) in enumerate(zip(traces, timelines, plans, strict=True)):
        curve = MemoryState(t, "liveness", count_first_iteration=False).curve
        table = access_table(t)
        busy: set[int] = set()
        for e in p.events:
            if isinstance(e, SwapOut) and e.after_op == -1:
                busy.add(e.buffer)
            elif isinstance(e, SwapOut) and t.persistent[e.buffer]:
                if e.after_op >= int(table.accesses(e.buffer)[-1]):
                    busy.add(e.buffer)
            elif isinstance(e, SwapIn) and e.next_iteration:
                busy.add(e.buffer)
        for b in np.flatnonzero(t.persistent).tolist():
            acc = table.accesses(b)
            if b in busy or not len(acc) or t.nbytes[b] == 0:
                continue
            f, last = int(acc[0]), int(acc[-1])
            if last >= t.n_ops - 1 or last < f or not _over(curve, budget, last, f):
                continue
            pair = cross_pair(t, device, tl, curve, budget, b, last, f)
            moves.append((int(t.nbytes[b]), (j, (), pair)))
    moves.sort(key=lambda m: -m[0])
    return [m[1] for m in moves]

"""Local moves on a plan that fits, each kept only if the simulation says
the plans still fit and run no slower (NOTE [ Batched acceptance ])."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction
from memplan.planners.analysis.accesses import access_table
from memplan.planners.analysis.optimes import Timeline
from memplan.planners.core.evaluate import Evaluation
from memplan.planners.core.plan import Event, Plan, Recompute, Release, SwapIn, SwapOut
from memplan.traces.model import Trace

# NOTE [ Batched acceptance ]
# Simulating a plan costs 0.1-1 s on the shipped traces, so a move per
# buffer, tried one at a time, would spend the whole time limit on a few
# dozen of a plan's hundreds of buffers. Moves are tried in batches instead,
# as delta debugging does: apply a whole batch; keep it if the plans still
# fit alone and are no slower (strictly faster for moves that add work);
# else split it in halves and try each, down to single moves, which are
# dropped when they fail. Many good moves cost a few evaluations, and a bad
# one costs about log2(batch) of them. Batches are taken in the order given
# (the caller sorts by expected gain; ties by a seeded shuffle). A kind of
# move that rarely gains on its own gets a cap on the candidates scored:
# dropping swap-out deadlines, one by one, cost resnet50 at 40% 518
# evaluations (40 s) for no gain, where the plan had 356 of them; yet one
# of vgg16's at 50% is worth 25 ms, so they go longest predicted wait first.


@dataclass
class Search:
    """The best plans so far and what scoring one more costs."""

    plans: list[Plan]
    best: Evaluation
    evaluate: Callable[[Sequence[Plan]], Evaluation | None]
    out_of_time: Callable[[], bool]
    evaluations: int = 0

    def score(self, plans: Sequence[Plan]) -> Evaluation | None:
        self.evaluations += 1
        return self.evaluate(plans)


Move = tuple[int, tuple[Event, ...], tuple[Event, ...]]  # (job, events out, events in)


def apply_moves(plans: Sequence[Plan], moves: Sequence[Move]) -> list[Plan]:
    out = list(plans)
    for job in {m[0] for m in moves}:
        gone = {e for m in moves if m[0] == job for e in m[1]}
        new = [e for m in moves if m[0] == job for e in m[2]]
        p = out[job]
        out[job] = Plan(
            p.trace_fingerprint, (*(e for e in p.events if e not in gone), *new), p.model
        )
    return out


def accept_batches(
    search: Search, moves: Sequence[Move], *, strict: bool, max_evaluations: int | None = None
) -> int:
    """Apply what the simulation accepts of `moves` to `search` (NOTE
    [ Batched acceptance ]), scoring at most `max_evaluations` candidates;
    returns how many were kept."""
    kept = 0
    stack = [list(moves)]
    stop = math.inf if max_evaluations is None else search.evaluations + max_evaluations
    while stack and not search.out_of_time() and search.evaluations < stop:
        batch = stack.pop()
        if not batch:
            continue
        trial = apply_moves(search.plans, batch)
        ev = search.score(trial)
        best = search.best.iteration_s
        ok = ev is not None and ev.fits
        if ok and (
            ev.iteration_s < best - 1e-12 or (not strict and ev.iteration_s <= best + 1e-12)
        ):
            search.plans, search.best = trial, ev
            kept += len(batch)
            continue
        if len(batch) > 1:
            half = len(batch) // 2
            stack += [batch[half:], batch[:half]]  # first half first
    return kept


def prune_moves(
    base: Sequence[Plan],
    plans: Sequence[Plan],
    cost: Callable[[int, Event], float],
    rng: random.Random,
) -> list[Move]:
    """Per (job, buffer), removing every event the search added beyond the
    base plans; costliest first (a buffer left resident costs nothing), ties
    in an order drawn from `rng`."""
    moves = []
    for j, (b0, p) in enumerate(zip(base, plans, strict=True)):
        kept = set(b0.events)
        groups: dict[int, list[Event]] = {}
        for e in p.events:
            if e not in kept:
                groups.setdefault(e.buffer, []).append(e)
        for evs in groups.values():
            moves.append((sum(cost(j, e) for e in evs), (j, tuple(evs), ())))
    rng.shuffle(moves)
    moves.sort(key=lambda m: -m[0])
    return [m[1] for m in moves]


def prefetch_moves(
    traces: Sequence[Trace],
    device: DeviceModel,
    timelines: Sequence[Timeline],
    plans: Sequence[Plan],
) -> list[Move]:
    """Swap-ins triggered later than the latest op whose end leaves time for
    the copy before `before_op` starts: move the trigger there (hidden), the
    longest copies first."""
    moves = []
    for j, (t, tl, p) in enumerate(zip(traces, timelines, plans, strict=True)):
        ends = tl.end_us
        outs: dict[int, list[int]] = {}  # buffer -> ops its swap-outs must be over by
        for e in p.events:
            if isinstance(e, SwapOut):
                outs.setdefault(e.buffer, []).append(max(e.after_op, e.before_op))
        for e in p.events:
            if not isinstance(e, SwapIn) or e.next_iteration:
                continue
            need = float(device.copy_time(int(t.nbytes[e.buffer]), Direction.H2D))
            latest = float(tl.start_us[e.before_op]) - need
            k = int(np.searchsorted(ends, latest, "right")) - 1
            floor = max((o for o in outs.get(e.buffer, ()) if o < e.before_op), default=-1)
            k = max(k, floor)
            if k < e.after_op:
                moved = SwapIn(e.buffer, k, e.before_op, 0.0, False)
                moves.append((need, (j, (e,), (moved,))))
    moves.sort(key=lambda m: -m[0])
    return [m[1] for m in moves]


def deadline_moves(
    traces: Sequence[Trace],
    device: DeviceModel,
    timelines: Sequence[Timeline],
    plans: Sequence[Plan],
) -> list[Move]:
    """Swap-outs with a deadline, without it: the op then need not wait for
    the copy (kept only if the plans still fit and run faster). Only those
    the predicted timeline says make their op wait, longest wait first: the
    copy's time past the predicted gap between its trigger and its deadline."""
    scored = []
    for j, (t, tl, p) in enumerate(zip(traces, timelines, plans, strict=True)):
        for e in p.events:
            if isinstance(e, SwapOut) and e.before_op >= 0:
                copy = float(device.copy_time(int(t.nbytes[e.buffer]), Direction.D2H))
                start = float(tl.end_us[e.after_op]) if e.after_op >= 0 else 0.0
                wait = copy - (float(tl.start_us[e.before_op]) - start)
                if wait > 0:  # else the op is not predicted to wait for it
                    scored.append((wait, (j, (e,), (SwapOut(e.buffer, e.after_op, e.delay_us),))))
    scored.sort(key=lambda m: -m[0])
    return [m[1] for m in scored]


def recompute_moves(
    traces: Sequence[Trace],
    device: DeviceModel,
    durations: Sequence[np.ndarray],
    plans: Sequence[Plan],
) -> list[Move]:
    """A swap pair of an activation (SwapOut after p, SwapIn before m, same
    iteration) as Release after p and Recompute of its producer before m,
    where the producer takes less time than the two copies; largest gain
    first. Whether the producer's inputs are still there is the checker's
    to say (a move that fails it is dropped)."""
    scored = []
    for j, (t, p) in enumerate(zip(traces, plans, strict=True)):
        table = access_table(t)
        outs = {e.buffer: e for e in p.events if isinstance(e, SwapOut)}
        for e in p.events:
            if not isinstance(e, SwapIn) or e.next_iteration or e.buffer not in outs:
                continue
            b = e.buffer
            if t.persistent[b]:
                continue
            writers = table.accesses(b)[table.writes[table.ptr[b] : table.ptr[b + 1]]]
            if len(writers) != 1 or t.ops[int(writers[0])].rng:
                continue
            producer = int(writers[0])
            nbytes = int(t.nbytes[b])
            copies = float(
                device.copy_time(nbytes, Direction.H2D) + device.copy_time(nbytes, Direction.D2H)
            )
            gain = copies - float(durations[j][producer])
            out = outs[b]
            if gain > 0 and out.after_op >= producer:
                new = (Release(b, out.after_op), Recompute(b, e.before_op, (producer,)))
                scored.append((gain, (j, (out, e), new)))
    scored.sort(key=lambda m: -m[0])
    return [m[1] for m in scored]


def swap_moves(
    traces: Sequence[Trace],
    device: DeviceModel,
    timelines: Sequence[Timeline],
    durations: Sequence[np.ndarray],
    plans: Sequence[Plan],
) -> list[Move]:
    """The inverse of `recompute_moves`: Release after p and Recompute before
    m of an activation as SwapOut after p and a SwapIn triggered where the
    predicted timeline hides it before m, where the chain takes longer than
    the two copies; longest chains first. A lane that recompute-heavy plans
    leave idle then carries what compute paid for."""
    scored = []
    for j, (t, tl, p) in enumerate(zip(traces, timelines, plans, strict=True)):
        releases: dict[int, list[Release]] = {}
        for e in p.events:
            if isinstance(e, Release):
                releases.setdefault(e.buffer, []).append(e)
        for e in p.events:
            if not isinstance(e, Recompute) or t.persistent[e.buffer]:
                continue
            before = [r for r in releases.get(e.buffer, ()) if r.after_op < e.before_op]
            if not before:
                continue
            rel = max(before, key=lambda r: r.after_op)
            nbytes = int(t.nbytes[e.buffer])
            h2d = float(device.copy_time(nbytes, Direction.H2D))
            copies = h2d + float(device.copy_time(nbytes, Direction.D2H))
            gain = float(sum(durations[j][k] for k in e.ops)) - copies
            if gain <= 0:
                continue
            k = int(np.searchsorted(tl.end_us, float(tl.start_us[e.before_op]) - h2d, "right")) - 1
            k = min(max(k, rel.after_op + 1), e.before_op - 1)
            if k <= rel.after_op:
                continue
            new = (SwapOut(b := e.buffer, rel.after_op), SwapIn(b, k, e.before_op))
            scored.append((gain, (j, (rel, e), new)))
    scored.sort(key=lambda m: -m[0])
    return [m[1] for m in scored]

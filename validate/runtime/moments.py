"""Training state in a runtime plan: when a parameter, its gradient or an
optimizer-state tensor leaves the device and when it is back, in moments
user code has (`Moment`), mapped from a plan's swaps of those buffers."""

from __future__ import annotations

import enum
from bisect import bisect_left, bisect_right
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from memplan.planners.core.plan import Event, SwapIn, SwapOut
from memplan.traces.model import BufferKind, Phase, Trace


class Moment(enum.Enum):
    STEP_START = "step_start"  # entering `PlanRuntime.step()`
    FORWARD = "forward"  # the first forward pre-hook of `When.module` in the step
    AFTER_BACKWARD = "after_backward"  # leaving `PlanRuntime.step()`
    OPTIMIZER_STEP = "optimizer_step"  # the optimizer's step pre-hook
    STEP_END = "step_end"  # the optimizer's step post-hook


@dataclass(frozen=True, slots=True)
class When:
    """A moment of a training step; `module` names the module for FORWARD."""

    moment: Moment
    module: str = ""


STATE_KINDS = (BufferKind.PARAM, BufferKind.GRAD, BufferKind.OPTIMIZER_STATE)


@dataclass(frozen=True, slots=True)
class StateSwap:
    """A tensor of parameter `param` -- the parameter (`kind` PARAM), its
    gradient (GRAD) or its optimizer state `key` (OPTIMIZER_STATE), `nbytes`
    bytes -- leaves the device at `out`, is copied back from `fetch` on and
    is back on the device at `back`: the first of these moments after `out`,
    in the next step if `back` comes before `out` in a step."""

    param: str
    kind: BufferKind
    key: str
    nbytes: int
    out: When
    fetch: When
    back: When

    @property
    def name(self) -> str:
        """The tensor as the trace names it."""
        if self.kind is BufferKind.GRAD:
            return f"{self.param}.grad"
        return f"{self.param}.{self.key}" if self.key else self.param


# NOTE [ From plan events to moments ]
# A step's moments, in firing order, sit between ops: STEP_START before op 0; FORWARD(m)
# before the first forward op in module m (outer modules first); AFTER_BACKWARD, then
# OPTIMIZER_STEP, before the first optimizer op; STEP_END after the last op. Per buffer of a
# named parameter, gradient or optimizer state, a `SwapOut` pairs with the `SwapIn` that
# follows it (a `next_iteration` one: the iteration's last swap-out):
# - out: the first moment after the swap-out's `after_op`; back: the last moment before the
#   swap-in's `before_op` (of the next step if `next_iteration`); fetch: the first moment
#   after the swap-in's `after_op`, clamped between the two. No access lies between them.
# - a parameter or gradient off across backward leaves at AFTER_BACKWARD instead (autograd
#   reads the one and writes the other there); a parameter off across the next step's backward
#   is skipped, as are intervals without a moment between out and back, intervals overlapping
#   another of the same tensor, and other persistent buffers (module buffers).
# - releases of persistent buffers are skipped (export's rule for releases).


@dataclass(frozen=True, slots=True)
class _Timeline:
    """A step's moments in firing order, each with the op it comes before."""

    moments: tuple[When, ...]
    before_op: tuple[int, ...]
    after_backward: int  # index of AFTER_BACKWARD in `moments`

    @staticmethod
    def of(trace: Trace) -> _Timeline:
        n = trace.n_ops
        first: dict[str, int] = {}
        for op in trace.ops:
            if op.phase is Phase.FORWARD and op.module:
                parts = op.module.split(".")
                for i in range(1, len(parts) + 1):
                    first.setdefault(".".join(parts[:i]), op.id)
        opt = [op.id for op in trace.ops if op.phase is Phase.OPTIMIZER]
        at_opt = opt[0] if opt else n
        rows = [(0, -1, When(Moment.STEP_START))]
        rows += [(k, m.count(".") + 1, When(Moment.FORWARD, m)) for m, k in first.items()]
        rows.append((at_opt, 1000, When(Moment.AFTER_BACKWARD)))
        if opt:
            rows.append((at_opt, 1001, When(Moment.OPTIMIZER_STEP)))
            rows.append((n, 1002, When(Moment.STEP_END)))
        rows.sort(key=lambda r: (r[0], r[1]))
        moments = tuple(r[2] for r in rows)
        return _Timeline(
            moments, tuple(r[0] for r in rows), moments.index(When(Moment.AFTER_BACKWARD))
        )

    def after(self, op: int) -> int:
        """Index of the first moment once `op` has ended (-1: the step's start)."""
        return min(bisect_left(self.before_op, op + 1), len(self.moments) - 1)

    def before(self, op: int) -> int:
        """Index of the last moment before `op` starts."""
        return bisect_right(self.before_op, op) - 1


def _owner(trace: Trace, b: int, params: set[str]) -> tuple[str, str] | None:
    """(parameter, optimizer-state key) of a named state buffer, else None."""
    buf = trace.buffers[b]
    if buf.kind is BufferKind.PARAM and buf.name in params:
        return buf.name, ""
    if buf.kind is BufferKind.GRAD and buf.name.removesuffix(".grad") in params:
        return buf.name.removesuffix(".grad"), ""
    param, _, key = buf.name.rpartition(".")
    if buf.kind is BufferKind.OPTIMIZER_STATE and param in params and key:
        return param, key
    return None


def _pairs(
    outs: list[SwapOut], ins: list[SwapIn], skip: Callable[[Event, str], None]
) -> list[tuple[SwapOut, SwapIn]]:
    """Each swap-in with the swap-out it brings back (NOTE [ From plan events
    to moments ]); the others skipped."""
    outs = sorted(outs, key=lambda e: e.after_op)
    used: set[int] = set()
    pairs = []
    for ev in sorted(ins, key=lambda e: (e.next_iteration, e.before_op)):
        cands = [i for i, o in enumerate(outs) if ev.next_iteration or o.after_op < ev.before_op]
        if not cands or cands[-1] in used:
            skip(ev, "no swap-out of this tensor before it (or a second swap-in for one)")
            continue
        used.add(cands[-1])
        pairs.append((outs[cands[-1]], ev))
    for i, o in enumerate(outs):
        if i not in used:
            skip(o, "no swap-in brings it back")
    return pairs


def state_swaps(
    trace: Trace, events: list[SwapOut | SwapIn], skip: Callable[[Event, str], None]
) -> tuple[StateSwap, ...]:
    """The swaps of parameters, gradients and optimizer state among `events`
    as moments of a step (NOTE [ From plan events to moments ]); `skip(ev,
    reason)` hears of every event that cannot be mapped."""
    params = {b.name for b in trace.buffers if b.kind is BufferKind.PARAM and b.name}
    line = _Timeline.of(trace)
    n = len(line.moments)
    by_buffer: defaultdict[int, tuple[list[SwapOut], list[SwapIn]]] = defaultdict(lambda: ([], []))
    for ev in events:
        owner = _owner(trace, ev.buffer, params)
        if owner is None:
            kind = trace.buffers[ev.buffer].kind.value
            skip(ev, f"swaps of this {kind} buffer are not covered (module buffers, unnamed)")
        elif isinstance(ev, SwapOut):
            by_buffer[ev.buffer][0].append(ev)
        else:
            by_buffer[ev.buffer][1].append(ev)
    out: list[StateSwap] = []
    for b in sorted(by_buffer):
        buf = trace.buffers[b]
        param, key = _owner(trace, b, params) or ("", "")
        taken: list[tuple[int, int]] = []
        for o, i in _pairs(*by_buffer[b], skip):
            start, end = line.after(o.after_op), line.before(i.before_op) + n * i.next_iteration
            ab = line.after_backward
            if buf.kind is not BufferKind.OPTIMIZER_STATE and start < ab <= end:
                start = ab  # autograd reads a parameter and writes a gradient in backward
            reason = ""
            if start >= end:
                reason = f"no user-code moment between op {o.after_op} and op {i.before_op}"
            elif buf.kind is BufferKind.PARAM and end >= ab + n:
                reason = "a parameter stays on the device through backward (autograd needs it)"
            elif any(s < end + d and start + d < e for s, e in taken for d in (-n, 0, n)):
                reason = "it overlaps another swap of the same tensor"
            if reason:
                skip(o, reason)
                skip(i, reason)
                continue
            taken.append((start, end))
            fetch = min(max(line.after(i.after_op), start), end)
            out.append(
                StateSwap(
                    param,
                    buf.kind,
                    key,
                    buf.nbytes,
                    line.moments[start],
                    line.moments[fetch % n],
                    line.moments[end % n],
                )
            )
    return tuple(out)

"""Traces of the zoo's small models and hand-built plans over them."""

from __future__ import annotations

import functools
import threading

from memplan.planners.core.plan import Event, Plan, fingerprint_of
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.model import Phase, Trace
from memplan.traces.zoo import ZOO
from memplan.validate import Direction, ReplayResult, replay
from memplan.validate.replay.transfer import Transfer


@functools.cache
def trace_of(model: str, batch: int = 4, device: str = "cpu") -> Trace:
    return capture(ZOO[model], batch, CaptureOptions(device=device), model_name=model)


@functools.cache
def vanilla(model: str, iterations: int = 2) -> ReplayResult:
    """The plan-free replay (seed 0, CPU) that plans are compared against."""
    return replay(trace_of(model), iterations=iterations)


def plan_of(trace: Trace, *events: Event) -> Plan:
    return Plan(fingerprint_of(trace), tuple(events), trace.meta.model)


def first_op(trace: Trace, target: str, start: int = 0) -> int:
    return next(op.id for op in trace.ops[start:] if op.target == target)


def output_of(trace: Trace, op: int) -> int:
    """The single buffer `op` creates."""
    (b,) = [int(b) for b in trace.op_writes(op) if trace.created_at[b] == op]
    return b


def writers(trace: Trace, b: int) -> list[int]:
    return [int(k) for k in trace.accesses_of(b) if b in trace.op_writes(int(k))]


def last_forward_use(trace: Trace, b: int) -> int:
    return max(int(k) for k in trace.accesses_of(b) if trace.ops[k].phase is Phase.FORWARD)


def first_backward_use(trace: Trace, b: int) -> int:
    return min(int(k) for k in trace.accesses_of(b) if trace.ops[k].phase is Phase.BACKWARD)


def recompute_chain(
    trace: Trace, b: int, before_op: int, missing: frozenset[int] = frozenset()
) -> tuple[int, ...]:
    """The ops that rebuild `b` before `before_op`: every op that wrote it,
    and, for inputs of those that are gone by then (freed by the framework,
    or in `missing`: released by the plan), their chains too."""
    ops: set[int] = set()
    todo = [b]
    while todo:
        x = todo.pop()
        for k in writers(trace, x):
            if k in ops:
                continue
            ops.add(k)
            for r in trace.op_reads(k):
                r = int(r)
                dead = not trace.buffers[r].persistent and trace.freed_after[r] < before_op
                dead = dead or r in missing
                if dead and r != x:
                    todo.append(r)
    return tuple(sorted(ops))


class Order:
    """Puts the compute thread and the copy lanes of a replay in a chosen
    order, without timing (NOTE [ Test synchronisation ] in
    `validate/replay/lanes.py`). Copies are named (direction, buffer, iteration
    queued), ops (iteration, op).

    - `after(op, "started" | "ended", copy)`: when `op` has ended and fired
      its events, the compute thread waits until `copy` has started / ended.
    - `hold(copy, op)`: `copy` does not end before `op` has ended.
    """

    TIMEOUT_S = 60.0  # a safety net against a wrong test hanging, never a pacing

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._ops: set[tuple[int, int]] = set()
        self._started: dict[tuple[Direction, int, int], Transfer] = {}
        self._waits: dict[tuple[int, int], list[tuple[str, tuple[Direction, int, int]]]] = {}
        self._holds: dict[tuple[Direction, int, int], tuple[int, int]] = {}

    def after(self, op: tuple[int, int], what: str, copy: tuple[Direction, int, int]) -> Order:
        assert what in ("started", "ended")
        self._waits.setdefault(op, []).append((what, copy))
        return self

    def hold(self, copy: tuple[Direction, int, int], op: tuple[int, int]) -> Order:
        self._holds[copy] = op
        return self

    def _wait_for(self, ready) -> None:
        if not self._cond.wait_for(ready, self.TIMEOUT_S):
            raise AssertionError("Order: the replay never got there")

    def op_done(self, iteration: int, op: int) -> None:
        with self._cond:
            self._ops.add((iteration, op))
            self._cond.notify_all()
        for what, copy in self._waits.get((iteration, op), ()):
            with self._cond:
                self._wait_for(lambda copy=copy: copy in self._started)
                t = self._started[copy]
            if what == "ended" and not t.done.wait(self.TIMEOUT_S):
                raise AssertionError(f"Order: copy {copy} never ended")

    def copy_started(self, t: Transfer) -> None:
        with self._cond:
            self._started[(t.direction, t.buffer, t.iteration)] = t
            self._cond.notify_all()

    def copy_ending(self, t: Transfer) -> None:
        until = self._holds.get((t.direction, t.buffer, t.iteration))
        if until is not None:
            with self._cond:
                self._wait_for(lambda: until in self._ops)

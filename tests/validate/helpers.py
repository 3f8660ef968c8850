"""Traces of the zoo's small models and hand-built plans over them."""

from __future__ import annotations

import functools

from planners.plan import Event, Plan, fingerprint_of
from traces.capture import CaptureOptions, capture
from traces.model import Phase, Trace
from traces.zoo import ZOO
from validate import ReplayResult, replay


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

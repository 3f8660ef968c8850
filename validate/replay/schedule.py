"""A `planners.core.plan.Plan` indexed by op for the executor: what to trigger
after each op, which swap-ins each op waits for, what to recompute before it.

Built once per replay from the plan's `IndexedPlan` (the simulator's
index); the loop over ops only looks lists up.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memplan.planners.core.plan import (
    Plan,
    Recompute,
    SwapIn,
    SwapOut,
    describe,
    empty_plan,
    validate,
)
from memplan.planners.core.semantics import IndexedPlan, Triggered, frees_in_order
from memplan.traces.model import Trace
from memplan.validate.errors import ValidationError

__all__ = ["Schedule", "Triggered", "build_schedule"]


@dataclass(frozen=True, slots=True)
class Schedule:
    """`after[i + 1]` are the events triggered when op i ends (`after[0]`:
    at the start of the iteration, after the inputs are loaded, with the
    inputs' releases), in plan order. `recompute[(b, i)]` rebuilds buffer b
    if op i needs it and it is absent (one per key: NOTE [ Duplicate events ]
    in `planners/core/semantics.py`). `rng_ops` are the RNG ops some
    recompute re-runs: the executor saves the generator state before their
    first run. `order` is the op ids in the order to run them (the plan's:
    NOTE [ Plans under another order ] in planners/core/plan.py) and
    `frees[i]` what the framework frees after op i under it (NOTE [ Frees
    under another order ]); None: the trace's order, the program's frees."""

    after: tuple[tuple[Triggered, ...], ...]
    recompute: dict[tuple[int, int], Recompute]
    rng_ops: frozenset[int]
    recompute_ops: frozenset[int]
    order: tuple[int, ...] = ()
    frees: tuple[tuple[int, ...], ...] | None = None


def build_schedule(plan: Plan | None, trace: Trace, max_delay_s: float = math.inf) -> Schedule:
    """Index `plan` (None: the vanilla run) by op. Raises `PlanError` if the
    plan does not fit the trace or recomputes one buffer twice before one op,
    `ValidationError` if a recompute would re-draw random numbers without
    restoring the generator or a swap's delay is over `max_delay_s`
    (NOTE [ Bounded waits ] in `validate/replay/executor.py`)."""
    if plan is not None:
        validate(plan, trace)
        for e, ev in enumerate(plan.events):
            if isinstance(ev, SwapOut | SwapIn) and ev.delay_us * 1e-6 > max_delay_s:
                raise ValidationError(
                    f"plan.events[{e}].delay_us: {ev.delay_us:g} us is longer than a replay "
                    f"waits out ({max_delay_s:g} s)"
                )
    ip = IndexedPlan.of(plan if plan is not None else empty_plan(trace), trace)
    for r in ip.recompute.values():
        ev = r.event
        rng = [k for k in ev.ops if trace.ops[k].rng]
        if rng and not ev.restore_rng:
            raise ValidationError(
                f"plan.events[{r.index}] ({describe(ev)}): op {rng[0]} "
                f"({trace.ops[rng[0]].target}) draws random numbers, but restore_rng "
                f"is false: the recompute would not reproduce the buffer"
            )
    groups = (ip.start_events(), *ip.triggered[1:])
    return Schedule(
        after=tuple(tuple(ev for _e, ev in g) for g in groups),
        recompute={key: r.event for key, r in ip.recompute.items()},
        rng_ops=ip.rng_ops,
        recompute_ops=ip.recompute_ops,
        order=ip.order,
        frees=None if plan is None or plan.order is None else frees_in_order(trace, plan.order),
    )

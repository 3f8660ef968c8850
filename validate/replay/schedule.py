"""A `planners.core.plan.Plan` indexed by op for the executor: what to trigger
after each op, which swap-ins each op waits for, what to recompute before it.

Built once per replay; the loop over ops only looks lists up.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from memplan.planners.core.plan import Plan, Recompute, Release, SwapIn, SwapOut, describe, validate
from memplan.traces.model import Trace
from memplan.validate.errors import ValidationError

Triggered = SwapOut | SwapIn | Release


@dataclass(frozen=True, slots=True)
class Schedule:
    """`after[i + 1]` are the events triggered when op i ends (`after[0]`:
    at the start of the iteration), in plan order. `recompute[(b, i)]`
    rebuilds buffer b if op i needs it and it is absent (the last such event
    of the plan, as in the simulator). `rng_ops` are the RNG ops some
    recompute re-runs: the executor saves the generator state before their
    first run."""

    after: tuple[tuple[Triggered, ...], ...]
    recompute: dict[tuple[int, int], Recompute]
    rng_ops: frozenset[int]
    recompute_ops: frozenset[int]


def build_schedule(plan: Plan | None, trace: Trace) -> Schedule:
    """Index `plan` (None: the vanilla run) by op. Raises `PlanError` if the
    plan does not fit the trace, `ValidationError` if a recompute would
    re-draw random numbers without restoring the generator."""
    n = trace.n_ops
    after: defaultdict[int, list[Triggered]] = defaultdict(list)
    recompute: dict[tuple[int, int], Recompute] = {}
    rng_ops: set[int] = set()
    recompute_ops: set[int] = set()
    if plan is not None:
        validate(plan, trace)
        for e, ev in enumerate(plan.events):
            if isinstance(ev, Recompute):
                rng = [k for k in ev.ops if trace.ops[k].rng]
                if rng and not ev.restore_rng:
                    raise ValidationError(
                        f"plan.events[{e}] ({describe(ev)}): op {rng[0]} "
                        f"({trace.ops[rng[0]].target}) draws random numbers, but restore_rng "
                        f"is false: the recompute would not reproduce the buffer"
                    )
                recompute[(ev.buffer, ev.before_op)] = ev  # the last wins, as in sim.job
                rng_ops.update(rng)
                recompute_ops.update(ev.ops)
            else:
                after[ev.after_op + 1].append(ev)
    return Schedule(
        after=tuple(tuple(after[i]) for i in range(n + 1)),
        recompute=recompute,
        rng_ops=frozenset(rng_ops),
        recompute_ops=frozenset(recompute_ops),
    )

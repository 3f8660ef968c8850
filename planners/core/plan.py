"""The plan: what to move and when, per job and periodic per iteration.

A `Plan` is a list of events bound to one trace by its fingerprint. Four
kinds of events (docs/design.md, "Plan"; TENSILE §III-C):

| event       | meaning                                                              |
| ----------- | -------------------------------------------------------------------- |
| `SwapOut`   | after `after_op` ends (+`delay_us`) copy D2H on a lane; the device    |
|             | memory is freed when the copy ends; `before_op`, if set, waits for it |
| `SwapIn`    | after `after_op` ends (+`delay_us`) copy H2D; the memory is taken    |
|             | when the copy starts; `before_op` waits for it (compute stalls)      |
| `Release`   | after `after_op` ends free the device copy (a host copy exists, or   |
|             | it will be recomputed, or nothing reads it again)                    |
| `Recompute` | re-run `ops` on the compute stream just before `before_op`, on       |
|             | demand: only when the buffer is absent then                          |

Triggers follow TENSILE's (trigger, Δtime) instructions: `after_op` is the op
whose end starts the clock (-1 = the start of the iteration), `delay_us` the
interval after it. See NOTE [ Cross-iteration swaps ] for `next_iteration`.

`validate(plan, trace)` checks that a plan fits its trace (fingerprint, ids,
field relations); `planners.core.check.check` goes further and replays the plan.
"""

from __future__ import annotations

import enum
import math
import operator
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from memplan.planners.core.errors import PlanError
from memplan.planners.core.order import check_order, positions
from memplan.traces.io import fingerprint
from memplan.traces.model import Trace


def _coerce(ev: object, ints: tuple[str, ...], delay: bool = False) -> None:
    """Store numpy integers (planners index arrays) as ints, delays as floats,
    so events compare, hash and serialise the same whatever built them."""
    for name in ints:
        object.__setattr__(ev, name, operator.index(getattr(ev, name)))
    if delay:
        object.__setattr__(ev, "delay_us", float(ev.delay_us))  # type: ignore[attr-defined]


# NOTE [ Cross-iteration swaps ]
# TENSILE swaps updated parameters out in the optimizer phase and back in
# before their first forward use in the *next* iteration. A `SwapIn` with
# `next_iteration=True` is triggered after `after_op` of iteration k and its
# `before_op` is an op of iteration k+1 (so `after_op` may be >= `before_op`).
# Only persistent buffers outlive an iteration, so only they may be swapped in
# across the boundary. In the first iteration nothing was triggered for it:
# iteration 0 starts with every persistent buffer resident. In the last
# simulated iteration there is no next one, and the event is not started.


# NOTE [ Plans under another order ]
# SwapAdvisor schedules the ops as well as the swaps, so a plan may carry an
# op order (`Plan.order`). Events keep naming ops by id: `after_op` is still
# "when that op ends" and `before_op` "before that op starts", wherever the
# order puts them. Where a rule says "after" or "before" it means positions
# in the order: a swap-in's `after_op` runs before its `before_op`, a
# swap-out's deadline after its trigger, a recompute's ops before the op
# they serve. The framework's frees move with the order (NOTE [ Frees under
# another order ] in planners/core/semantics.py). `validate` refuses an
# order that would change what is computed (planners/core/order.py NOTE
# [ Allowed orders ]).


# NOTE [ Swap-out deadlines ]
# A swap-out frees its device memory when its copy ends, and that moment is
# decided by the lane: a copy queued behind others ends whenever they let
# it. Whether it ends before or after some op allocates is then a race that
# a few percent of timing decides, in a simulation as on a device, and the
# peak goes with it (validate/calibrate/simvsreal.py NOTE [ Timing-sensitive peaks ]). A
# planner that counts on the memory by some op says so with `before_op`:
# that op of the same iteration does not start before the swap-out is over
# (its copy ended, or it found nothing to copy); the wait is compute stall,
# as for a late swap-in. -1, the default, sets no deadline. vDNN's layer-wise
# synchronisation is such a deadline (planners/heuristics/vdnn.py).


@dataclass(frozen=True, slots=True)
class SwapOut:
    """Copy `buffer` to the host after `after_op` (+`delay_us`); the device
    memory is freed when the copy ends. `before_op` (-1: none) does not start
    before the swap-out is over (NOTE [ Swap-out deadlines ])."""

    buffer: int
    after_op: int
    delay_us: float = 0.0
    before_op: int = -1

    def __post_init__(self) -> None:
        _coerce(self, ("buffer", "after_op", "before_op"), delay=True)


@dataclass(frozen=True, slots=True)
class SwapIn:
    """Copy `buffer` back after `after_op` (+`delay_us`); `before_op` (of the
    next iteration if `next_iteration`) does not start before it is done."""

    buffer: int
    after_op: int
    before_op: int
    delay_us: float = 0.0
    next_iteration: bool = False

    def __post_init__(self) -> None:
        _coerce(self, ("buffer", "after_op", "before_op"), delay=True)
        object.__setattr__(self, "next_iteration", bool(self.next_iteration))


@dataclass(frozen=True, slots=True)
class Release:
    """Free the device copy of `buffer` right after `after_op` ends."""

    buffer: int
    after_op: int

    def __post_init__(self) -> None:
        _coerce(self, ("buffer", "after_op"))


@dataclass(frozen=True, slots=True)
class Recompute:
    """If `buffer` is absent when `before_op` is due, re-run `ops` (ascending
    op ids, the last of which writes `buffer`) just before it. A chain that
    contains an op consuming RNG state (dropout) must set `restore_rng`: the
    executor then saves and restores the generator state around it."""

    buffer: int
    before_op: int
    ops: tuple[int, ...]
    restore_rng: bool = False

    def __post_init__(self) -> None:
        _coerce(self, ("buffer", "before_op"))
        object.__setattr__(self, "ops", tuple(operator.index(k) for k in self.ops))
        object.__setattr__(self, "restore_rng", bool(self.restore_rng))


Event = SwapOut | SwapIn | Release | Recompute

EVENT_TYPES: dict[str, type] = {
    "swap_out": SwapOut,
    "swap_in": SwapIn,
    "release": Release,
    "recompute": Recompute,
}
EVENT_NAMES: dict[type, str] = {cls: name for name, cls in EVENT_TYPES.items()}


def describe(event: Event) -> str:
    """`swap_in of buffer 7` -- how messages name an event."""
    return f"{EVENT_NAMES[type(event)]} of buffer {event.buffer}"


@dataclass(frozen=True, slots=True)
class Plan:
    """The events of one job, in the order they are applied when several share
    a trigger. `trace_fingerprint` binds the plan to `fingerprint(Trace)`.
    `order`, if set, is the op order the job runs (a permutation of the op
    ids that `planners.core.order.check_order` allows; None: the trace's
    order); events still name ops by id (NOTE [ Plans under another order ])."""

    trace_fingerprint: str
    events: tuple[Event, ...] = ()
    model: str = ""
    order: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.events, tuple):
            object.__setattr__(self, "events", tuple(self.events))
        if self.order is not None:
            object.__setattr__(self, "order", tuple(operator.index(k) for k in self.order))

    def counts(self) -> dict[str, int]:
        """Events per kind: {"swap_out": 3, "swap_in": 3, "release": 0, "recompute": 1}."""
        out = dict.fromkeys(EVENT_TYPES, 0)
        for ev in self.events:
            out[EVENT_NAMES[type(ev)]] += 1
        return out


class Status(enum.Enum):
    """What a planner's run came to (NOTE [ Planner outcomes ])."""

    PLANNED = "planned"
    INFEASIBLE = "infeasible"
    STOPPED = "stopped"


class Reason(enum.Enum):
    """Why a run is not `Status.PLANNED` (NOTE [ Planner outcomes ])."""

    NONE = "none"
    BELOW_BOUND = "budget below a proven bound"
    NO_BUDGET = "no budget given"
    NO_MOVE_LEFT = "no move left"
    TIME_LIMIT = "time limit"
    MODEL_INFEASIBLE = "no plan within the model's moves"


# NOTE [ Planner outcomes ]
# A planner's run ends in one of three ways. PLANNED: it returns plans that
# it predicts fit the budget (or there is no budget). INFEASIBLE is said of
# the problem, and only when it is proven: the budget is below a proven
# lower bound (`Reason.BELOW_BOUND`), so no planner can fit it. STOPPED: the
# planner gave up short of a fitting plan, in its own words -- it had no
# move left (`NO_MOVE_LEFT`, the plans so far are returned), ran out of time
# (`TIME_LIMIT`), needs a budget to act (`NO_BUDGET`), or its model has no
# plan (`MODEL_INFEASIBLE`: CP-SAT's moves are a subset of all plans). The
# `detail` says it with the numbers; `stats` holds figures only.


@dataclass(frozen=True, slots=True)
class PlanResult:
    """What every planner returns. Not fitting is a result (a `status` other
    than PLANNED, with its `reason` and `detail`; plans may be empty), never
    an exception. `options` holds the planner's options as JSON values
    (`options_dict` of its options dataclass); `stats` its figures (peak
    estimates, iterations, solver status)."""

    planner: str
    status: Status
    plans: tuple[Plan, ...]
    reason: Reason = Reason.NONE
    detail: str = ""
    solve_time_s: float = 0.0
    options: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not isinstance(self.plans, tuple):
            object.__setattr__(self, "plans", tuple(self.plans))
        if not isinstance(self.status, Status):
            raise PlanError(f"{self.planner}: status={self.status!r} is not a Status")
        if (self.status is Status.PLANNED) != (self.reason is Reason.NONE):
            raise PlanError(
                f"{self.planner}: status {self.status.value} with reason {self.reason.value!r}"
            )

    @property
    def feasible(self) -> bool:
        """The planner returned plans it predicts fit."""
        return self.status is Status.PLANNED

    def explain(self) -> str:
        """`planned`, or `stopped: no move left (peak 12 MiB over ...)`."""
        if self.status is Status.PLANNED:
            return "planned"
        tail = f" ({self.detail})" if self.detail else ""
        return f"{self.status.value}: {self.reason.value}{tail}"


def fit_result(
    planner: str,
    plans: Sequence[Plan],
    peak_bytes: int,
    budget_bytes: int | None,
    t0: float,
    *,
    options: dict[str, Any] | None = None,
    stats: dict[str, Any] | None = None,
) -> PlanResult:
    """The result of a heuristic that predicts `peak_bytes` for its plans:
    PLANNED when there is no budget or the peak fits it, else STOPPED with no
    move left. `t0` is the planner's `time.perf_counter()` at its start."""
    fits = budget_bytes is None or peak_bytes <= budget_bytes
    return PlanResult(
        planner=planner,
        status=Status.PLANNED if fits else Status.STOPPED,
        plans=tuple(plans),
        reason=Reason.NONE if fits else Reason.NO_MOVE_LEFT,
        detail="" if fits else f"predicted peak {peak_bytes} B is over the budget {budget_bytes} B",
        solve_time_s=time.perf_counter() - t0,
        options=options or {},
        stats=stats or {},
    )


# ---- binding a plan to its trace ---------------------------------------------
_FINGERPRINTS: weakref.WeakKeyDictionary[Trace, str] = weakref.WeakKeyDictionary()


def fingerprint_of(trace: Trace) -> str:
    """`fingerprint(trace)`, computed once per trace object (it hashes the
    whole trace, and every plan check needs it)."""
    fp = _FINGERPRINTS.get(trace)
    if fp is None:
        fp = _FINGERPRINTS[trace] = fingerprint(trace)
    return fp


def empty_plan(trace: Trace) -> Plan:
    """The plan with no events: the framework's own frees (the vanilla run)."""
    return Plan(fingerprint_of(trace), (), trace.meta.model)


def validate(plan: Plan, trace: Trace, where: str = "plan") -> None:
    """Raise `PlanError` unless `plan` belongs to `trace` and every event names
    existing buffers and ops with consistent fields. `where` prefixes messages
    (`plans[1]` when loading a file)."""
    fp = fingerprint_of(trace)
    if plan.trace_fingerprint != fp:
        label = f" ({plan.model})" if plan.model else ""
        raise PlanError(
            f"{where}: made for trace {plan.trace_fingerprint[:12]}{label}, "
            f"not for this trace {fp[:12]} ({trace.meta.model})"
        )
    pos: Sequence[int] = range(trace.n_ops)
    if plan.order is not None:
        pos = positions(check_order(trace, plan.order, f"{where}.order"))
        for e, ev in enumerate(plan.events):
            _validate_event(ev, trace, f"{where}.events[{e}]", pos)
        return
    seen = _VALID.get(trace)
    if seen is None or len(seen) > MAX_REMEMBERED:
        seen = _VALID[trace] = set()
    for e, ev in enumerate(plan.events):
        if type(ev) in EVENT_NAMES and ev in seen:  # NOTE [ Events validated once ]
            continue
        _validate_event(ev, trace, f"{where}.events[{e}]", pos)
        seen.add(ev)


# NOTE [ Events validated once ]
# A search checks thousands of candidate plans that share most of their
# events, and validating every event of each (its fields against the trace)
# was a sixth of squeeze's time on densenet121. Events are frozen values,
# and whether one is valid for a trace in the trace's own order depends on
# nothing else, so each trace object remembers the events it accepted (at
# most MAX_REMEMBERED, then it starts over). A refused event is never
# remembered; events under another order are validated every time.
_VALID: weakref.WeakKeyDictionary[Trace, set[Event]] = weakref.WeakKeyDictionary()
MAX_REMEMBERED = 1 << 18


def _validate_event(ev: Event, trace: Trace, where: str, pos: Sequence[int]) -> None:
    """`pos[op]`: the op's position in the plan's order (NOTE [ Plans under another order ])."""
    if type(ev) not in EVENT_NAMES:
        raise PlanError(f"{where}: not a plan event: {ev!r}")
    n_ops, n_buf = trace.n_ops, trace.n_buffers
    w = f"{where} ({describe(ev)})" if isinstance(ev.buffer, int) else where
    if not isinstance(ev.buffer, int) or not 0 <= ev.buffer < n_buf:
        raise PlanError(f"{w}: unknown buffer {ev.buffer!r} (the trace has 0..{n_buf - 1})")
    if isinstance(ev, SwapOut | SwapIn | Release):
        _op_index(ev.after_op, -1, n_ops, w, "after_op")
    if isinstance(ev, SwapOut | SwapIn):
        d = ev.delay_us
        if not isinstance(d, int | float) or not math.isfinite(d) or d < 0:
            raise PlanError(f"{w}: delay_us={d!r} must be a finite number >= 0")
    if isinstance(ev, SwapIn | Recompute):
        _op_index(ev.before_op, 0, n_ops, w, "before_op")
    if isinstance(ev, SwapOut) and ev.before_op != -1:
        _op_index(ev.before_op, 0, n_ops, w, "before_op")
        if ev.after_op >= 0 and pos[ev.before_op] <= pos[ev.after_op]:
            raise PlanError(
                f"{w}: before_op {ev.before_op} is not after after_op {ev.after_op} "
                f"(a swap-out's deadline is in its own iteration; -1 sets none)"
            )
    if isinstance(ev, SwapIn):
        if ev.next_iteration and not trace.buffers[ev.buffer].persistent:
            raise PlanError(
                f"{w}: next_iteration needs a persistent buffer; buffer {ev.buffer} "
                f"({trace.buffers[ev.buffer].kind.value}) dies at the end of every iteration"
            )
        if not ev.next_iteration and ev.after_op >= 0 and pos[ev.after_op] >= pos[ev.before_op]:
            raise PlanError(
                f"{w}: after_op {ev.after_op} is not before before_op {ev.before_op} "
                f"(set next_iteration for a swap-in that serves the next iteration)"
            )
    if isinstance(ev, Recompute):
        if not ev.ops:
            raise PlanError(f"{w}: ops is empty")
        for k in ev.ops:
            _op_index(k, 0, n_ops, w, "ops[]")
        if any(b <= a for a, b in zip(ev.ops, ev.ops[1:])):
            raise PlanError(f"{w}: ops {list(ev.ops)} must be strictly ascending")
        last = max(ev.ops, key=pos.__getitem__)
        if pos[last] >= pos[ev.before_op]:
            raise PlanError(f"{w}: op {last} does not run before before_op {ev.before_op}")
        if not any(ev.buffer in trace.op_writes(k) for k in ev.ops):
            raise PlanError(f"{w}: none of ops {list(ev.ops)} writes buffer {ev.buffer}")


def _op_index(value: Any, lo: int, n_ops: int, where: str, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value < n_ops:
        raise PlanError(f"{where}: {name} {value!r} is not an op of the trace ({lo}..{n_ops - 1})")

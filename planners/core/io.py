"""Plan files: JSON (or .json.gz) with ``"schema": "memplan.plan/1"``.

The only place where a plan is a dict. A file holds one `PlanResult`: the
planner, its options, its outcome (`status`, `reason`, `detail`:
NOTE [ Planner outcomes ]; `feasible` is written too, for readers of older
files), the solve time, its stats and one plan per job, each naming its
trace by fingerprint::

    {"schema": "memplan.plan/1", "planner": "release_only", "status": "planned",
     "reason": "none", "detail": "", "feasible": true,
     "solve_time_s": 0.01, "options": {}, "stats": {},
     "plans": [{"trace": "3f9c...", "model": "resnet50",
                "events": [{"type": "swap_out", "buffer": 7, "after_op": 12, "delay_us": 0.0,
                            "before_op": 15},
                           {"type": "swap_in", "buffer": 7, "after_op": 40, "before_op": 52,
                            "delay_us": 0.0, "next_iteration": false},
                           {"type": "release", "buffer": 9, "after_op": 13},
                           {"type": "recompute", "buffer": 4, "before_op": 60, "ops": [3, 4],
                            "restore_rng": false}]}]}

A swap-out's `before_op` (planners.core.plan NOTE [ Swap-out deadlines ]) is
written only when set; a file without it has none. So is a plan's `order`
(a list of op ids, NOTE [ Plans under another order ]): a file without it
runs the trace's order.

Every problem is a `PlanError` naming the location (``plans[0].events[3]``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import (
    EVENT_NAMES,
    EVENT_TYPES,
    Event,
    Plan,
    PlanResult,
    Reason,
    Recompute,
    Release,
    Status,
    SwapIn,
    SwapOut,
    validate,
)
from memplan.traces import fields
from memplan.traces.io import read_json, save_json
from memplan.traces.model import Trace

SCHEMA = "memplan.plan/1"


# ---- writing ---------------------------------------------------------------
def event_to_dict(ev: Event) -> dict[str, Any]:
    d: dict[str, Any] = {"type": EVENT_NAMES[type(ev)], "buffer": ev.buffer}
    if isinstance(ev, SwapOut):
        d.update(after_op=ev.after_op, delay_us=ev.delay_us)
        if ev.before_op != -1:
            d.update(before_op=ev.before_op)
    elif isinstance(ev, SwapIn):
        d.update(
            after_op=ev.after_op,
            before_op=ev.before_op,
            delay_us=ev.delay_us,
            next_iteration=ev.next_iteration,
        )
    elif isinstance(ev, Release):
        d.update(after_op=ev.after_op)
    else:
        d.update(before_op=ev.before_op, ops=list(ev.ops), restore_rng=ev.restore_rng)
    return d


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    d: dict[str, Any] = {
        "trace": plan.trace_fingerprint,
        "model": plan.model,
        "events": [event_to_dict(ev) for ev in plan.events],
    }
    if plan.order is not None:
        d["order"] = list(plan.order)
    return d


def to_dict(result: PlanResult, provenance: dict[str, Any] | None = None) -> dict[str, Any]:
    """The plan file's document; `provenance` (what made it, NOTE [ Plan
    fields ]) is written when given."""
    doc = {
        "schema": SCHEMA,
        "planner": result.planner,
        "status": result.status.value,
        "reason": result.reason.value,
        "detail": result.detail,
        "feasible": result.feasible,
        "solve_time_s": result.solve_time_s,
        "options": result.options,
        "stats": result.stats,
        "plans": [plan_to_dict(p) for p in result.plans],
    }
    if provenance is not None:
        doc["provenance"] = provenance
    return doc


def save(
    result: PlanResult, path: str | os.PathLike[str], provenance: dict[str, Any] | None = None
) -> None:
    """Write atomically; gzip-compressed when the name ends in `.gz`."""
    save_json(to_dict(result, provenance), path, indent=1)


# ---- reading ---------------------------------------------------------------
# NOTE [ Plan fields ]
# Every field of a plan file goes through `traces/fields.py` (NOTE [ Fields from files ]): `type`
# is one of the four event names; `buffer` an integer >= 0; `after_op` an integer >= -1 (-1: the
# iteration's start), `before_op` >= 0 (a swap-out's may be -1: no deadline), recompute `ops`
# integers >= 0; `delay_us` a finite number >= 0 and at most MAX_DELAY_US (a day: no training
# iteration is longer, and anything past it is surely garbage; the bound by the iteration
# itself needs a device, NOTE [ Delays within the iteration ] in `planners/core/check.py`);
# `next_iteration` and `restore_rng` true or false; a plan's optional `order` a list of
# integers >= 0 (a permutation the trace allows: `validate`); the fingerprint, model, planner,
# status, reason and detail strings; `solve_time_s` a finite number >= 0; `options` and `stats`
# objects; the optional `provenance` an object (what made the file: the app's NOTE [ Provenance ];
# read as a whole, never interpreted, and not kept in the `PlanResult`). Whether ids exist in
# the trace is `validate`'s (`planners.core.plan`), run when the traces are given. The document
# nests at most `fields.MAX_DEPTH` levels, and no object has a key its kind does not know
# (`_KEYS`): a typo (`delay_su`) would otherwise be ignored.
MAX_DELAY_US = 86_400e6
_KEYS = {
    "swap_out": ("type", "buffer", "after_op", "delay_us", "before_op"),
    "swap_in": ("type", "buffer", "after_op", "before_op", "delay_us", "next_iteration"),
    "release": ("type", "buffer", "after_op"),
    "recompute": ("type", "buffer", "before_op", "ops", "restore_rng"),
    "plan": ("trace", "model", "events", "order"),
    "result": (
        "schema", "planner", "status", "reason", "detail", "feasible", "solve_time_s",
        "options", "stats", "plans", "provenance",
    ),
}  # fmt: skip


def _known_keys(d: dict[str, Any], kind: str, where: str) -> None:
    for key in d:
        if key not in _KEYS[kind]:
            raise PlanError(
                f"{where}.{fields.printable(key)}: unknown field of a {kind} "
                f"(one of {', '.join(_KEYS[kind])})"
            )


def _int(d: dict[str, Any], key: str, where: str, lo: int = 0) -> int:
    if key not in d:
        raise PlanError(f"{where}.{key}: missing")
    return fields.integer(d[key], f"{where}.{key}", PlanError, lo=lo)


def _str(d: dict[str, Any], key: str, where: str, default: str | None = None) -> str:
    if key not in d:
        if default is not None:
            return default
        raise PlanError(f"{where}.{key}: missing")
    return fields.string(d[key], f"{where}.{key}", PlanError)


def _delay(d: dict[str, Any], where: str) -> float:
    if "delay_us" not in d:
        return 0.0
    return fields.number(d["delay_us"], f"{where}.delay_us", PlanError, 0.0, MAX_DELAY_US)


def _flag(d: dict[str, Any], key: str, where: str) -> bool:
    return fields.boolean(d[key], f"{where}.{key}", PlanError) if key in d else False


def event_from_dict(d: Any, where: str) -> Event:
    if not isinstance(d, dict):
        raise PlanError(f"{where}: expected an object, got {fields.shown(d)}")
    if "type" not in d:
        raise PlanError(f"{where}.type: missing (one of {', '.join(EVENT_TYPES)})")
    kind = d["type"]
    if not isinstance(kind, str) or kind not in EVENT_TYPES:
        raise PlanError(
            f"{where}.type: unknown event {fields.shown(kind)} (one of {', '.join(EVENT_TYPES)})"
        )
    _known_keys(d, kind, where)
    buffer = _int(d, "buffer", where)
    if kind == "release":
        return Release(buffer, _int(d, "after_op", where, -1))
    if kind == "swap_out":
        before = _int(d, "before_op", where, -1) if "before_op" in d else -1
        return SwapOut(buffer, _int(d, "after_op", where, -1), _delay(d, where), before)
    if kind == "swap_in":
        return SwapIn(
            buffer,
            _int(d, "after_op", where, -1),
            _int(d, "before_op", where),
            _delay(d, where),
            _flag(d, "next_iteration", where),
        )
    if "ops" not in d:
        raise PlanError(f"{where}.ops: missing")
    ops = d["ops"]
    if not isinstance(ops, list):
        raise PlanError(f"{where}.ops: expected a list of op indices, got {fields.shown(ops)}")
    return Recompute(
        buffer,
        _int(d, "before_op", where),
        tuple(fields.integer(k, f"{where}.ops[{j}]", PlanError) for j, k in enumerate(ops)),
        _flag(d, "restore_rng", where),
    )


def plan_from_dict(d: Any, where: str = "plan") -> Plan:
    if not isinstance(d, dict):
        raise PlanError(f"{where}: expected an object, got {fields.shown(d)}")
    _known_keys(d, "plan", where)
    fp = _str(d, "trace", where)
    if "events" not in d:
        raise PlanError(f"{where}.events: missing")
    events = d["events"]
    if not isinstance(events, list):
        raise PlanError(f"{where}.events: expected a list, got {fields.shown(events)}")
    order = None
    if "order" in d:
        raw = d["order"]
        if not isinstance(raw, list):
            raise PlanError(f"{where}.order: expected a list of op ids, got {fields.shown(raw)}")
        order = tuple(
            fields.integer(k, f"{where}.order[{j}]", PlanError) for j, k in enumerate(raw)
        )
    return Plan(
        fp,
        tuple(event_from_dict(e, f"{where}.events[{i}]") for i, e in enumerate(events)),
        _str(d, "model", where, ""),
        order,
    )


def from_dict(doc: Any, traces: Sequence[Trace] | None = None) -> PlanResult:
    """Build a `PlanResult`; with `traces` (one per plan, in order) also
    validate each plan against its trace (`planners.core.plan.validate`).
    Every field is checked (NOTE [ Plan fields ])."""
    fields.depth_at_most(doc, "plan", PlanError)
    if not isinstance(doc, dict):
        raise PlanError(f"top level: expected an object, got {fields.shown(doc)}")
    if doc.get("schema") != SCHEMA:
        raise PlanError(f"schema: expected {SCHEMA!r}, got {fields.shown(doc.get('schema'))}")
    _known_keys(doc, "result", "plan")
    raw_plans = doc.get("plans")
    if not isinstance(raw_plans, list):
        got = "missing" if raw_plans is None else f"got {fields.shown(raw_plans)}"
        raise PlanError(f"plans: expected a list of plans, {got}")
    plans = tuple(plan_from_dict(p, f"plans[{i}]") for i, p in enumerate(raw_plans))
    for key in ("options", "stats", "provenance"):
        if not isinstance(doc.get(key, {}), dict):
            raise PlanError(f"{key}: expected an object, got {fields.shown(doc[key])}")
    status, reason, detail = _outcome(doc)
    solve = fields.number(doc.get("solve_time_s"), "solve_time_s", PlanError)
    result = PlanResult(
        planner=_str(doc, "planner", "plan"),
        status=status,
        plans=plans,
        reason=reason,
        detail=detail,
        solve_time_s=solve,
        options=doc.get("options", {}),
        stats=doc.get("stats", {}),
    )
    if traces is not None:
        if len(traces) != len(plans):
            raise PlanError(f"plans: {len(plans)} plans for {len(traces)} traces")
        for i, (plan, trace) in enumerate(zip(plans, traces, strict=True)):
            validate(plan, trace, f"plans[{i}]")
    return result


def _outcome(doc: dict[str, Any]) -> tuple[Status, Reason, str]:
    """(status, reason, detail) of a file; a file older than `status` has
    only `feasible`: false reads as stopped with no move left."""
    if "status" not in doc:
        if "feasible" not in doc:
            raise PlanError("status: missing")
        if fields.boolean(doc["feasible"], "feasible", PlanError):
            return Status.PLANNED, Reason.NONE, ""
        return Status.STOPPED, Reason.NO_MOVE_LEFT, ""
    status = fields.enum_value(Status, _str(doc, "status", "plan"), "status", PlanError)
    reason = fields.enum_value(Reason, _str(doc, "reason", "plan"), "reason", PlanError)
    detail = _str(doc, "detail", "plan", "")
    if (status is Status.PLANNED) != (reason is Reason.NONE):
        raise PlanError(f"reason: {reason.value!r} does not go with status {status.value!r}")
    return status, reason, detail


def load(path: str | os.PathLike[str], traces: Sequence[Trace] | None = None) -> PlanResult:
    """Load (and with `traces`, validate) a plan file; problems are one-line `PlanError`s."""
    p, doc = read_json(path, PlanError, "plan file")
    try:
        return from_dict(doc, traces)
    except PlanError as e:
        raise PlanError(f"{p}: {e}") from None

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
written only when set; a file without it has none.

Every problem is a `PlanError` naming the location (``plans[0].events[3]``).
"""

from __future__ import annotations

import json
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
    Release,
    Status,
    SwapIn,
    SwapOut,
    validate,
)
from memplan.traces.io import enum_value, read_json, save_json
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
    return {
        "trace": plan.trace_fingerprint,
        "model": plan.model,
        "events": [event_to_dict(ev) for ev in plan.events],
    }


def to_dict(result: PlanResult) -> dict[str, Any]:
    return {
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


def save(result: PlanResult, path: str | os.PathLike[str]) -> None:
    """Write atomically; gzip-compressed when the name ends in `.gz`."""
    save_json(to_dict(result), path, indent=1)


# ---- reading ---------------------------------------------------------------
_FIELDS: dict[str, dict[str, type | tuple[type, ...]]] = {
    "swap_out": {"after_op": int, "delay_us": (int, float), "before_op": int},
    "swap_in": {
        "after_op": int,
        "before_op": int,
        "delay_us": (int, float),
        "next_iteration": bool,
    },
    "release": {"after_op": int},
    "recompute": {"before_op": int, "ops": list, "restore_rng": bool},
}
# defaults of the fields an event of each type may leave out
_OPTIONAL: dict[str, dict[str, Any]] = {
    "swap_out": {"delay_us": 0.0, "before_op": -1},
    "swap_in": {"delay_us": 0.0, "next_iteration": False},
    "release": {},
    "recompute": {"restore_rng": False},
}


def _field(
    d: dict[str, Any],
    key: str,
    typ: type | tuple[type, ...],
    where: str,
    optional: dict[str, Any] | None = None,
) -> Any:
    if key not in d:
        if optional is not None and key in optional:
            return optional[key]
        raise PlanError(f"{where}.{key}: missing")
    v = d[key]
    types = typ if isinstance(typ, tuple) else (typ,)
    if not isinstance(v, types) or (isinstance(v, bool) and bool not in types):
        names = "/".join(t.__name__ for t in types)
        raise PlanError(f"{where}.{key}: expected {names}, got {json.dumps(v)[:40]}")
    return v


def event_from_dict(d: Any, where: str) -> Event:
    if not isinstance(d, dict):
        raise PlanError(f"{where}: expected an object, got {type(d).__name__}")
    kind = d.get("type")
    if kind not in EVENT_TYPES:
        raise PlanError(f"{where}.type: unknown event {kind!r} (one of {', '.join(EVENT_TYPES)})")
    buffer = _field(d, "buffer", int, where)
    kw = {k: _field(d, k, t, where, _OPTIONAL[kind]) for k, t in _FIELDS[kind].items()}
    if kind == "recompute":
        ops = kw["ops"]
        for j, k in enumerate(ops):
            if not isinstance(k, int) or isinstance(k, bool):
                raise PlanError(f"{where}.ops[{j}]: expected an op index, got {json.dumps(k)[:40]}")
        kw["ops"] = tuple(ops)
    if "delay_us" in kw:
        kw["delay_us"] = float(kw["delay_us"])
    return EVENT_TYPES[kind](buffer=buffer, **kw)


def plan_from_dict(d: Any, where: str = "plan") -> Plan:
    if not isinstance(d, dict):
        raise PlanError(f"{where}: expected an object, got {type(d).__name__}")
    fp = _field(d, "trace", str, where)
    events = _field(d, "events", list, where)
    model = d.get("model", "")
    return Plan(
        fp,
        tuple(event_from_dict(e, f"{where}.events[{i}]") for i, e in enumerate(events)),
        model if isinstance(model, str) else "",
    )


def from_dict(doc: Any, traces: Sequence[Trace] | None = None) -> PlanResult:
    """Build a `PlanResult`; with `traces` (one per plan, in order) also
    validate each plan against its trace (`planners.core.plan.validate`)."""
    if not isinstance(doc, dict):
        raise PlanError(f"top level: expected an object, got {type(doc).__name__}")
    if doc.get("schema") != SCHEMA:
        raise PlanError(f"schema: expected {SCHEMA!r}, got {doc.get('schema')!r}")
    plans = tuple(
        plan_from_dict(p, f"plans[{i}]") for i, p in enumerate(_field(doc, "plans", list, "plan"))
    )
    options, stats = doc.get("options", {}), doc.get("stats", {})
    if not isinstance(options, dict) or not isinstance(stats, dict):
        raise PlanError("options/stats: expected objects")
    status, reason, detail = _outcome(doc)
    result = PlanResult(
        planner=_field(doc, "planner", str, "plan"),
        status=status,
        plans=plans,
        reason=reason,
        detail=detail,
        solve_time_s=float(_field(doc, "solve_time_s", (int, float), "plan")),
        options=options,
        stats=stats,
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
        feasible = _field(doc, "feasible", bool, "plan")
        return (
            (Status.PLANNED, Reason.NONE, "")
            if feasible
            else (
                Status.STOPPED,
                Reason.NO_MOVE_LEFT,
                "",
            )
        )
    status = enum_value(Status, _field(doc, "status", str, "plan"), "plan.status", PlanError)
    reason = enum_value(Reason, _field(doc, "reason", str, "plan"), "plan.reason", PlanError)
    detail = _field(doc, "detail", str, "plan") if "detail" in doc else ""
    if (status is Status.PLANNED) != (reason is Reason.NONE):
        raise PlanError(f"plan.reason: {reason.value!r} does not go with status {status.value!r}")
    return status, reason, detail


def load(path: str | os.PathLike[str], traces: Sequence[Trace] | None = None) -> PlanResult:
    """Load (and with `traces`, validate) a plan file; problems are one-line `PlanError`s."""
    p, doc = read_json(path, PlanError, "plan file")
    try:
        return from_dict(doc, traces)
    except PlanError as e:
        raise PlanError(f"{p}: {e}") from None

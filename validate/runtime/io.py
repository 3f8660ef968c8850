"""Runtime plan files: JSON (optionally .json.gz) with
``"schema": "memplan.runtime/2"`` (``/1`` files, without training-state
moves, still read), the only place a `RuntimePlan` is a dict. Every problem
is a one-line `RuntimePlanError` naming the field."""

from __future__ import annotations

import os
from typing import Any

from memplan.traces import fields
from memplan.traces.io import read_json, save_json
from memplan.traces.model import BufferKind
from memplan.validate.runtime.errors import RuntimePlanError
from memplan.validate.runtime.moments import STATE_KINDS, Moment, StateSwap, When
from memplan.validate.runtime.plan import Action, RecomputeOp, RuntimePlan, SavedDecision, Skipped

SCHEMA = "memplan.runtime/2"
READS = ("memplan.runtime/1", SCHEMA)  # /1: before `state` and `host_step`


def to_dict(rp: RuntimePlan) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "trace": rp.trace_fingerprint,
        "model": rp.model,
        "planner": rp.planner,
        "counts": rp.counts(),
        "saved": [fields.record(d) for d in rp.saved],
        "regions": list(rp.regions),
        "recompute": [fields.record(r) for r in rp.recompute],
        "skipped": [fields.record(s) for s in rp.skipped],
        "state": [_state_dict(m) for m in rp.state],
        "host_step": list(rp.host_step),
    }


def _state_dict(m: StateSwap) -> dict[str, Any]:
    def when(w: When) -> dict[str, str]:
        return {"moment": w.moment.value, "module": w.module}

    return {
        "param": m.param,
        "kind": m.kind.value,
        "key": m.key,
        "nbytes": m.nbytes,
        "out": when(m.out),
        "fetch": when(m.fetch),
        "back": when(m.back),
    }


# NOTE [ Runtime plan fields ]
# Checked as every file field is (traces/fields.py NOTE [ Fields from files ]):
# `saved[i].index` is i (pack order); `buffer`, `nbytes`, `invocation` and
# `occurrence` integers >= 0 within int64; `prefetch_after` null or a pack
# index of this plan (0..len(saved)-1); `persistent` true or false; `action`
# one of `Action`; module paths, targets and names strings; lists are lists;
# the document nests at most `fields.MAX_DEPTH` levels. `state[i]`: `kind` one of
# param, grad, optimizer_state, `key` non-empty exactly for optimizer state, each moment one of
# `Moment` with a module exactly for forward, `out` and `back` differ; `host_step` distinct names.
_INT, _STR, _BOOL = "int", "str", "bool"


def _get(d: Any, key: str, kind: str, where: str) -> Any:
    if not isinstance(d, dict):
        raise RuntimePlanError(f"{where}: expected an object, got {fields.shown(d)}")
    if key not in d:
        raise RuntimePlanError(f"{where}.{key}: missing")
    v, at = d[key], f"{where}.{key}"
    if kind == _INT:
        return fields.integer(v, at, RuntimePlanError)
    if kind == _BOOL:
        return fields.boolean(v, at, RuntimePlanError)
    return fields.string(v, at, RuntimePlanError)


def _list(d: dict[str, Any], key: str, where: str, default: list[Any] | None = None) -> list[Any]:
    if key not in d and default is not None:
        return default
    v = d.get(key)
    if not isinstance(v, list):
        got = "missing" if key not in d else f"expected a list, got {fields.shown(v)}"
        raise RuntimePlanError(f"{where}{key}: {got}")
    return v


def _saved(d: Any, i: int, n: int) -> SavedDecision:
    w = f"saved[{i}]"
    act = fields.enum_value(Action, _get(d, "action", _STR, w), f"{w}.action", RuntimePlanError)
    pre = d.get("prefetch_after")
    if pre is not None:
        pre = fields.integer(pre, f"{w}.prefetch_after", RuntimePlanError, 0, max(n - 1, 0))
    index = _get(d, "index", _INT, w)
    if index != i:
        raise RuntimePlanError(f"{w}.index: {index}, expected {i} (pack order)")
    return SavedDecision(
        index,
        _get(d, "module", _STR, w),
        _get(d, "buffer", _INT, w),
        _get(d, "nbytes", _INT, w),
        _get(d, "persistent", _BOOL, w),
        act,
        pre,
    )


def _recompute(r: Any, i: int) -> RecomputeOp:
    w = f"recompute[{i}]"
    return RecomputeOp(
        _get(r, "region", _STR, w),
        _get(r, "invocation", _INT, w),
        _get(r, "module", _STR, w),
        _get(r, "target", _STR, w),
        _get(r, "occurrence", _INT, w),
    )


def _when(d: Any, where: str) -> When:
    moment = fields.enum_value(
        Moment, _get(d, "moment", _STR, where), f"{where}.moment", RuntimePlanError
    )
    module = _get(d, "module", _STR, where)
    if (moment is Moment.FORWARD) != bool(module):
        raise RuntimePlanError(
            f"{where}.module: {fields.shown(module)}; a module is named exactly for 'forward'"
        )
    return When(moment, module)


def _state(d: Any, i: int) -> StateSwap:
    w = f"state[{i}]"
    kind = fields.enum_value(BufferKind, _get(d, "kind", _STR, w), f"{w}.kind", RuntimePlanError)
    if kind not in STATE_KINDS:
        raise RuntimePlanError(f"{w}.kind: {kind.value!r} is not param, grad or optimizer_state")
    key = _get(d, "key", _STR, w)
    if (kind is BufferKind.OPTIMIZER_STATE) != bool(key):
        raise RuntimePlanError(
            f"{w}.key: {fields.shown(key)}; a key is named exactly for optimizer state"
        )
    out, back = _when(d.get("out"), f"{w}.out"), _when(d.get("back"), f"{w}.back")
    if out == back:
        raise RuntimePlanError(
            f"{w}: leaves and comes back at the same moment ({out.moment.value})"
        )
    return StateSwap(
        _get(d, "param", _STR, w),
        kind,
        key,
        _get(d, "nbytes", _INT, w),
        out,
        _when(d.get("fetch"), f"{w}.fetch"),
        back,
    )


def _host_step(doc: dict[str, Any]) -> tuple[str, ...]:
    names = tuple(
        fields.string(n, f"host_step[{i}]", RuntimePlanError)
        for i, n in enumerate(_list(doc, "host_step", "", []))
    )
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise RuntimePlanError(f"host_step: {dup!r} listed twice")
    return names


def from_dict(doc: Any) -> RuntimePlan:
    """The inverse of `to_dict`; `RuntimePlanError` naming the bad field
    (NOTE [ Runtime plan fields ])."""
    fields.depth_at_most(doc, "runtime", RuntimePlanError)
    if not isinstance(doc, dict) or doc.get("schema") not in READS:
        got = doc.get("schema") if isinstance(doc, dict) else doc
        raise RuntimePlanError(
            f"schema: expected {' or '.join(map(repr, READS))}, got {fields.shown(got)}"
        )
    raw = _list(doc, "saved", "")
    saved = tuple(_saved(d, i, len(raw)) for i, d in enumerate(raw))
    recompute = tuple(_recompute(r, i) for i, r in enumerate(_list(doc, "recompute", "")))
    skipped = tuple(
        Skipped(_get(s, "event", _STR, f"skipped[{i}]"), _get(s, "reason", _STR, f"skipped[{i}]"))
        for i, s in enumerate(_list(doc, "skipped", "", []))
    )
    regions = tuple(
        fields.string(r, f"regions[{i}]", RuntimePlanError)
        for i, r in enumerate(_list(doc, "regions", ""))
    )
    return RuntimePlan(
        trace_fingerprint=_get(doc, "trace", _STR, "runtime"),
        model=_get(doc, "model", _STR, "runtime") if "model" in doc else "",
        planner=_get(doc, "planner", _STR, "runtime") if "planner" in doc else "",
        saved=saved,
        regions=regions,
        recompute=recompute,
        skipped=skipped,
        state=tuple(_state(d, i) for i, d in enumerate(_list(doc, "state", "", []))),
        host_step=_host_step(doc),
    )


def save(rp: RuntimePlan, path: str | os.PathLike[str]) -> None:
    """Write atomically; gzip-compressed when the name ends in `.gz`."""
    save_json(to_dict(rp), path, indent=1)


def load(path: str | os.PathLike[str]) -> RuntimePlan:
    p, doc = read_json(path, RuntimePlanError, "runtime plan file")
    try:
        return from_dict(doc)
    except RuntimePlanError as e:
        raise RuntimePlanError(f"{p}: {e}") from None

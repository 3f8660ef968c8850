"""Runtime plan files: JSON (optionally .json.gz) with
``"schema": "memplan.runtime/1"``, the only place a `RuntimePlan` is a dict.
Every problem is a one-line `RuntimePlanError` naming the field."""

from __future__ import annotations

import json
import os
from typing import Any

from memplan.traces.io import read_json, save_json
from memplan.validate.runtime.errors import RuntimePlanError
from memplan.validate.runtime.plan import Action, RecomputeOp, RuntimePlan, SavedDecision, Skipped

SCHEMA = "memplan.runtime/1"


def to_dict(rp: RuntimePlan) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "trace": rp.trace_fingerprint,
        "model": rp.model,
        "planner": rp.planner,
        "counts": rp.counts(),
        "saved": [
            {
                "index": d.index,
                "module": d.module,
                "buffer": d.buffer,
                "nbytes": d.nbytes,
                "persistent": d.persistent,
                "action": d.action.value,
                "prefetch_after": d.prefetch_after,
            }
            for d in rp.saved
        ],
        "regions": list(rp.regions),
        "recompute": [
            {
                "region": r.region,
                "invocation": r.invocation,
                "module": r.module,
                "target": r.target,
                "occurrence": r.occurrence,
            }
            for r in rp.recompute
        ],
        "skipped": [{"event": s.event, "reason": s.reason} for s in rp.skipped],
    }


def _get(d: Any, key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(d, dict) or key not in d:
        raise RuntimePlanError(f"{where}.{key}: missing")
    v = d[key]
    if not isinstance(v, typ) or (isinstance(v, bool) and typ is int):
        raise RuntimePlanError(f"{where}.{key}: unexpected value {json.dumps(v)[:40]}")
    return v


def from_dict(doc: Any) -> RuntimePlan:
    """The inverse of `to_dict`; `RuntimePlanError` naming the bad field."""
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise RuntimePlanError(f"schema: expected {SCHEMA!r}, got {got!r}")
    saved = []
    for i, d in enumerate(_get(doc, "saved", list, "runtime")):
        w = f"saved[{i}]"
        action = _get(d, "action", str, w)
        try:
            act = Action(action)
        except ValueError:
            raise RuntimePlanError(f"{w}.action: unknown action {action!r}") from None
        pre = d.get("prefetch_after") if isinstance(d, dict) else None
        if pre is not None and (not isinstance(pre, int) or isinstance(pre, bool)):
            raise RuntimePlanError(f"{w}.prefetch_after: expected a pack index or null")
        index = _get(d, "index", int, w)
        if index != i:
            raise RuntimePlanError(f"{w}.index: {index}, expected {i} (pack order)")
        saved.append(
            SavedDecision(
                index,
                _get(d, "module", str, w),
                _get(d, "buffer", int, w),
                _get(d, "nbytes", int, w),
                _get(d, "persistent", bool, w),
                act,
                pre,
            )
        )
    recompute = tuple(
        RecomputeOp(
            _get(r, "region", str, f"recompute[{i}]"),
            _get(r, "invocation", int, f"recompute[{i}]"),
            _get(r, "module", str, f"recompute[{i}]"),
            _get(r, "target", str, f"recompute[{i}]"),
            _get(r, "occurrence", int, f"recompute[{i}]"),
        )
        for i, r in enumerate(_get(doc, "recompute", list, "runtime"))
    )
    skipped = tuple(
        Skipped(_get(s, "event", str, f"skipped[{i}]"), _get(s, "reason", str, f"skipped[{i}]"))
        for i, s in enumerate(doc.get("skipped", []))
    )
    regions = _get(doc, "regions", list, "runtime")
    if not all(isinstance(r, str) for r in regions):
        raise RuntimePlanError("runtime.regions: expected module paths")
    return RuntimePlan(
        trace_fingerprint=_get(doc, "trace", str, "runtime"),
        model=str(doc.get("model", "")),
        planner=str(doc.get("planner", "")),
        saved=tuple(saved),
        regions=tuple(regions),
        recompute=recompute,
        skipped=skipped,
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

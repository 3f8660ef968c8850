"""A regression baseline: the gated figures of every scenario of a suite, by
scenario identity (NOTE [ Baseline files ])."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

from memplan.sweep.scenario import METRICS, STATUSES
from memplan.traces import fields
from memplan.traces.errors import MemplanError

SCHEMA = "memplan.baseline/1"

# NOTE [ Baseline files ]
# JSON, `"schema": "memplan.baseline/1"`:
#   memplan_version  the memplan that wrote it (a string)
#   suite            the fingerprint of the suite it was made for (16 hex)
#   metrics          the gated metric names, in the suite's order
#   scenarios        identity (16 hex: `SweepTask.identity`, stable across
#                    memplan versions) -> {name, planner, status, metrics}:
#                    the scenario's label, its planner, its status (one of
#                    the sweep's STATUSES) and {metric: number, string for
#                    bound_name, or null}
#   provenance       optional object (NOTE [ Provenance ]), never interpreted
# Nothing else, at any level: a typo is refused, as the other loaders do.
# Entries are sorted by identity and the file has no timestamp, so updating
# an unchanged baseline rewrites the same bytes and a changed one diffs
# line by line in review.
_TOP = ("schema", "memplan_version", "suite", "metrics", "scenarios", "provenance")
_ENTRY = ("name", "planner", "status", "metrics")
_HEX16 = re.compile(r"[0-9a-f]{16}")


class BaselineError(MemplanError):
    """A baseline file that cannot be read."""


@dataclass(frozen=True)
class Entry:
    """One scenario's figures in a baseline."""

    name: str
    planner: str
    status: str
    metrics: dict[str, Any]


@dataclass(frozen=True)
class Baseline:
    version: str
    suite: str
    metrics: tuple[str, ...]
    entries: dict[str, Entry]
    provenance: dict[str, Any] | None = field(default=None)


def entry_of(record: dict[str, Any], metrics: tuple[str, ...]) -> Entry:
    """The baseline entry of a sweep record, keeping the gated `metrics`."""
    return Entry(
        record["name"],
        record["inputs"]["planner"],
        record["status"],
        {m: record["metrics"][m] for m in metrics},
    )


def to_dict(b: Baseline) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "memplan_version": b.version,
        "suite": b.suite,
        "metrics": list(b.metrics),
        "scenarios": {k: fields.record(e) for k, e in sorted(b.entries.items())},
    }
    if b.provenance is not None:
        doc["provenance"] = b.provenance
    return doc


def save(b: Baseline, path: str | os.PathLike[str]) -> None:
    """Write atomically (NOTE [ Output paths ] is the caller's, before any work)."""
    from memplan.outputs import writing
    from memplan.traces.io import save_json

    with writing(path, "--baseline"):
        save_json(to_dict(b), path, indent=1)


def _keys(d: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in d:
        if key not in allowed:
            raise BaselineError(
                f"{where}.{fields.printable(key)}: unknown field (one of {', '.join(allowed)})"
            )
    for key in allowed:
        if key not in d and key != "provenance":
            raise BaselineError(f"{where}.{key}: missing")


def _metric_value(value: Any, where: str) -> Any:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return fields.integer(value, where, BaselineError, -fields.INT64_MAX)
    return fields.number(value, where, BaselineError, -float("inf"))


def _entry(d: Any, metrics: tuple[str, ...], where: str) -> Entry:
    d = fields.obj(d, where, BaselineError)
    _keys(d, _ENTRY, where)
    status = fields.string(d["status"], f"{where}.status", BaselineError)
    if status not in STATUSES:
        raise BaselineError(
            f"{where}.status: unknown status {fields.shown(status)} (one of {', '.join(STATUSES)})"
        )
    values = fields.obj(d["metrics"], f"{where}.metrics", BaselineError)
    for name in values:
        if name not in metrics:
            raise BaselineError(
                f"{where}.metrics.{fields.printable(name)}: not one of the baseline's metrics"
            )
    for name in metrics:
        if name not in values:
            raise BaselineError(f"{where}.metrics.{name}: missing (the baseline gates it)")
    return Entry(
        fields.string(d["name"], f"{where}.name", BaselineError),
        fields.string(d["planner"], f"{where}.planner", BaselineError),
        status,
        {k: _metric_value(v, f"{where}.metrics.{k}") for k, v in values.items()},
    )


def from_dict(doc: Any, where: str) -> Baseline:
    """A `Baseline` from a parsed document; every field checked (NOTE
    [ Baseline files ]), errors start with `where`."""
    fields.depth_at_most(doc, where, BaselineError)
    doc = fields.obj(doc, f"{where}: top level", BaselineError)
    if doc.get("schema") != SCHEMA:
        got = fields.shown(doc.get("schema"))
        raise BaselineError(f"{where}: schema: expected {SCHEMA!r}, got {got}")
    _keys(doc, _TOP, f"{where}: baseline")
    version = fields.string(doc["memplan_version"], f"{where}: memplan_version", BaselineError)
    suite = fields.string(doc["suite"], f"{where}: suite", BaselineError)
    if not _HEX16.fullmatch(suite):
        raise BaselineError(f"{where}: suite: expected 16 hex digits, got {fields.shown(suite)}")
    names = fields.array(doc["metrics"], f"{where}: metrics", BaselineError)
    for i, m in enumerate(names):
        if m not in METRICS:
            raise BaselineError(f"{where}: metrics[{i}]: unknown metric {fields.shown(m)}")
    metrics = tuple(names)
    raw = fields.obj(doc["scenarios"], f"{where}: scenarios", BaselineError)
    entries = {}
    for key, d in raw.items():
        w = f"{where}: scenarios.{fields.printable(key)}"
        if not _HEX16.fullmatch(key):
            raise BaselineError(f"{w}: expected a scenario identity of 16 hex digits")
        entries[key] = _entry(d, metrics, w)
    prov = doc.get("provenance")
    if prov is not None:
        prov = fields.obj(prov, f"{where}: provenance", BaselineError)
    return Baseline(version, suite, metrics, entries, prov)


def load(path: str | os.PathLike[str]) -> Baseline:
    """Load and check a baseline file; problems are one-line `BaselineError`s."""
    from memplan.traces.io import read_json

    p, doc = read_json(path, BaselineError, "baseline file")
    return from_dict(doc, str(p))

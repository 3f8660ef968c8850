"""A regression suite: scenarios (grids in the sweep's `[grid]` format), which
of them form the fast subset, and the metrics gated with their tolerances.

Every field is checked before any scenario runs; a bad one is a one-line
`SuiteError` naming the file and the field (docs/regress.md has the format).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from memplan.sweep.grid import parse_grid
from memplan.sweep.scenario import METRICS, SweepTask
from memplan.traces import fields
from memplan.traces.errors import MemplanError
from memplan.traces.io import read_toml

# Keys a grid of a suite may hold besides the sweep's own (memplan/sweep/grid.py).
GRID_EXTRAS = ("fast", "name")
TOP_LEVEL = ("grid", "grids", "metrics")
STATUS = "status"
EXACT = "exact"
MAX_TOLERANCE = 1e12  # beyond any figure a scenario has: surely a typo


class SuiteError(MemplanError):
    """A suite file that cannot be run."""


# NOTE [ Regression tolerances ]
# A figure is within tolerance when |now - baseline| <= max(abs, rel * |baseline|) (`abs`
# guards figures near zero; the boundary passes). "exact" (the only one `status` and
# `bound_name` take) asks for the same value; null equals only null. The run's status is
# always gated: a scenario that fit alone and now needs the net, or no longer finishes, is a
# regression and its figures are not compared. Beyond tolerance, the direction decides
# (`BETTER`): the good way is an improvement and passes (update the baseline to lock it in),
# the bad way a regression; a yardstick with no better direction (vanilla run, budget,
# bound) that moved is a change and fails. Full text: docs/notes.md; verdicts: docs/regress.md.
@dataclass(frozen=True, slots=True)
class Tolerance:
    """How far a metric may move (NOTE [ Regression tolerances ])."""

    abs: float = 0.0
    rel: float = 0.0
    exact: bool = False

    def allows(self, baseline: Any, now: Any) -> bool:
        """Is `now` within tolerance of `baseline`?"""
        if baseline is None or now is None or isinstance(baseline, str) or isinstance(now, str):
            return baseline == now
        if self.exact:
            return now == baseline
        return abs(now - baseline) <= max(self.abs, self.rel * abs(baseline))

    def text(self) -> str:
        if self.exact:
            return EXACT
        parts = [f"abs {self.abs:g}" if self.abs else "", f"rel {self.rel:g}" if self.rel else ""]
        return ", ".join(p for p in parts if p) or "0"


@dataclass(frozen=True)
class Suite:
    """The scenarios of a suite (in file order, each once), the identities of
    the fast subset, the gated metrics in file order, and a fingerprint of
    the suite's text content (its TOML document, canonically)."""

    where: str
    scenarios: tuple[SweepTask, ...]
    fast: frozenset[str]
    metrics: dict[str, Tolerance]
    fingerprint: str

    def selected(self, only_fast: bool) -> list[SweepTask]:
        return [s for s in self.scenarios if not only_fast or s.identity() in self.fast]


def load_suite(path: str | Path, only_fast: bool = False) -> Suite:
    """The suite in the TOML file at `path`. With `only_fast`, grids not
    marked fast are skipped unparsed (their traces are not even loaded)."""
    p, doc = read_toml(path, SuiteError, "suite file")
    return parse_suite(doc, str(p), base=p.parent, only_fast=only_fast)


def parse_suite(
    doc: dict[str, Any], where: str, *, base: Path | None = None, only_fast: bool = False
) -> Suite:
    """The suite in `doc` (a parsed TOML document); `where` starts every
    error, `base` is the folder relative trace paths are in."""
    unknown = sorted(set(doc) - set(TOP_LEVEL))
    if unknown:
        raise SuiteError(
            f"{where}: unknown table {fields.shown(unknown[0])} "
            f"(a suite has {', '.join(TOP_LEVEL)})"
        )
    metrics = _metrics(doc, where)
    grids = _grids(doc, where)
    scenarios: dict[str, SweepTask] = {}  # identity -> scenario, first seen first
    fast: set[str] = set()
    for table, w in grids:
        is_fast = fields.boolean(table.get("fast", False), f"{w}.fast", SuiteError)
        if "name" in table:
            fields.text(table["name"], f"{w}.name", SuiteError)
        if only_fast and not is_fast:
            continue
        sweep_table = {k: v for k, v in table.items() if k not in GRID_EXTRAS}
        for s in parse_grid(sweep_table, w, base=base).scenarios:
            key = s.identity()
            scenarios.setdefault(key, s)  # a fast grid may repeat a full grid's scenarios
            if is_fast:
                fast.add(key)
    if not scenarios:
        what = "no grid marked fast = true" if only_fast else "no scenarios"
        raise SuiteError(f"{where}: {what}")
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:16]
    return Suite(where, tuple(scenarios.values()), frozenset(fast), metrics, digest)


def _grids(doc: dict[str, Any], where: str) -> list[tuple[dict[str, Any], str]]:
    """(table, where) of the `[grid]` table and each `[[grids]]` entry."""
    out = []
    if "grid" in doc:
        out.append((fields.obj(doc["grid"], f"{where}: grid", SuiteError), f"{where}: grid"))
    if "grids" in doc:
        tables = fields.array(doc["grids"], f"{where}: grids", SuiteError)
        for i, t in enumerate(tables):
            w = f"{where}: grids[{i}]"
            out.append((fields.obj(t, w, SuiteError), w))
    if not out:
        raise SuiteError(f"{where}: no scenarios: give a [grid] table or [[grids]] tables")
    return out


def _metrics(doc: dict[str, Any], where: str) -> dict[str, Tolerance]:
    """The `[metrics]` table: metric name -> tolerance (NOTE [ Regression
    tolerances ]); `status` is gated whether listed or not."""
    if "metrics" not in doc:
        raise SuiteError(f"{where}: no [metrics] table (the metrics to gate and their tolerances)")
    table = fields.obj(doc["metrics"], f"{where}: metrics", SuiteError)
    out: dict[str, Tolerance] = {}
    for name, spec in table.items():
        w = f"{where}: metrics.{fields.printable(name)}"
        if name != STATUS and name not in METRICS:
            known = ", ".join((STATUS, *METRICS))
            raise SuiteError(f"{w}: unknown metric (one of {known})")
        if spec == EXACT:
            out[name] = Tolerance(exact=True)
            continue
        if name in (STATUS, "bound_name"):
            raise SuiteError(f'{w}: expected "exact", got {fields.shown(spec)}')
        out[name] = _tolerance(spec, w)
    if not any(name != STATUS for name in out):
        raise SuiteError(f"{where}: metrics: no metric to gate besides status")
    return {k: v for k, v in out.items() if k != STATUS}


def _tolerance(spec: Any, where: str) -> Tolerance:
    if not isinstance(spec, dict):
        raise SuiteError(
            f'{where}: expected "exact" or a table {{ rel = R, abs = A }}, got {fields.shown(spec)}'
        )
    unknown = sorted(set(spec) - {"abs", "rel"})
    if unknown:
        raise SuiteError(f"{where}.{fields.printable(unknown[0])}: unknown field (abs, rel)")
    if not spec:
        raise SuiteError(f'{where}: an empty table; give abs, rel or both (or "exact")')
    values = {
        k: fields.number(v, f"{where}.{k}", SuiteError, 0.0, MAX_TOLERANCE) for k, v in spec.items()
    }
    return Tolerance(abs=values.get("abs", 0.0), rel=values.get("rel", 0.0))

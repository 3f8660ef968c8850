"""A suite's run against its baseline: one line per scenario and gated
metric, with its verdict (NOTE [ Regression tolerances ] in
memplan/regress/suite.py), and the tables a terminal and a CI page show."""

from __future__ import annotations

import enum
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from memplan.regress.baseline import Baseline
from memplan.regress.suite import Tolerance

# +1: higher is better, -1: lower is better; metrics not named here are the
# yardstick (the vanilla run, the budget, the bound): any move is a change.
BETTER = {
    "iteration_ms": -1, "peak_bytes": -1, "msr": +1, "eor": -1, "cbr": +1, "gap": -1,
    "stall_ms": -1, "recompute_ms": -1, "bytes_out": -1, "bytes_in": -1, "net_evictions": -1,
}  # fmt: skip
SCENARIO = "(scenario)"  # the metric column of a line about the whole scenario
COLUMNS = ("scenario", "planner", "metric", "baseline", "now", "tolerance", "verdict")


class Verdict(enum.Enum):
    OK = "ok"
    IMPROVED = "improved"
    REGRESSED = "regressed"
    CHANGED = "changed"
    STATUS = "status changed"
    MISSING = "not in baseline"


FAILING = frozenset({Verdict.REGRESSED, Verdict.CHANGED, Verdict.STATUS, Verdict.MISSING})


@dataclass(frozen=True, slots=True)
class Line:
    """One scenario's metric, then and now."""

    identity: str
    scenario: str
    planner: str
    metric: str
    baseline: Any
    now: Any
    tolerance: str
    verdict: Verdict

    @property
    def failed(self) -> bool:
        return self.verdict in FAILING

    def cells(self) -> tuple[str, ...]:
        verdict = self.verdict.value
        change = relative_change(self.baseline, self.now)
        if change is not None and self.verdict is not Verdict.OK:
            verdict += f" ({change:+.2%})"
        return (self.scenario, self.planner, self.metric, shown(self.baseline), shown(self.now),
                self.tolerance, verdict)  # fmt: skip


def shown(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def relative_change(baseline: Any, now: Any) -> float | None:
    numbers = all(isinstance(x, int | float) and not isinstance(x, bool) for x in (baseline, now))
    if not numbers or baseline == 0:
        return None
    return (now - baseline) / abs(baseline)


def verdict(metric: str, tolerance: Tolerance, baseline: Any, now: Any) -> Verdict:
    """OK within tolerance; beyond it, by the metric's direction (NOTE
    [ Regression tolerances ])."""
    if tolerance.allows(baseline, now):
        return Verdict.OK
    change = relative_change(baseline, now)
    direction = BETTER.get(metric)
    if direction is None or baseline is None or now is None or isinstance(now, str):
        return Verdict.CHANGED
    if change is None:  # from 0: the sign of the move alone
        change = now - baseline
    return Verdict.IMPROVED if change * direction > 0 else Verdict.REGRESSED


def diff(
    records: Iterable[dict[str, Any]], baseline: Baseline, metrics: dict[str, Tolerance]
) -> list[Line]:
    """Every record against its baseline entry (matched on identity): a line
    per gated metric, or one line when the scenario is not in the baseline
    or its status changed (NOTE [ Regression tolerances ])."""
    out = []
    for r in records:
        key, name, planner = r["identity"], r["name"], r["inputs"]["planner"]
        e = baseline.entries.get(key)
        if e is None:
            out.append(Line(key, name, planner, SCENARIO, None, r["status"], "-", Verdict.MISSING))
            continue
        if e.status != r["status"]:
            out.append(Line(key, name, planner, "status", e.status, r["status"], "exact",
                            Verdict.STATUS))  # fmt: skip
            continue
        for m, tol in metrics.items():
            now = r["metrics"].get(m)
            if m not in e.metrics:
                out.append(Line(key, name, planner, m, None, now, tol.text(), Verdict.MISSING))
                continue
            then = e.metrics[m]
            out.append(
                Line(key, name, planner, m, then, now, tol.text(), verdict(m, tol, then, now))
            )
    return out


@dataclass(frozen=True, slots=True)
class Counts:
    scenarios: int
    failed: int
    improved: int  # scenarios with an improvement and no failure

    @property
    def passed(self) -> int:
        return self.scenarios - self.failed


def counts(lines: Sequence[Line]) -> Counts:
    ids = {x.identity for x in lines}
    failed = {x.identity for x in lines if x.failed}
    improved = {x.identity for x in lines if x.verdict is Verdict.IMPROVED} - failed
    return Counts(len(ids), len(failed), len(improved))


def text_table(rows: Sequence[tuple[str, ...]], columns: Sequence[str] = COLUMNS) -> str:
    """Columns padded to their widest cell."""
    width = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, width, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, width, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def markdown_table(rows: Sequence[tuple[str, ...]], columns: Sequence[str] = COLUMNS) -> str:
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def verdict_line(c: Counts) -> str:
    word = "FAIL" if c.failed else "PASS"
    extra = f", {c.improved} improved beyond tolerance" if c.improved else ""
    return f"{word}: {c.scenarios} scenarios, {c.passed} within tolerance, {c.failed} failed{extra}"


def medians(
    records: Sequence[dict[str, Any]], baseline: Baseline, metrics: Sequence[str]
) -> list[tuple[str, ...]]:
    """Per planner: scenario count, then each metric's median over the
    planner's scenarios as `baseline -> now` (numbers only; nulls left out)."""
    by_planner: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_planner.setdefault(r["inputs"]["planner"], []).append(r)
    rows = []
    for planner, rs in by_planner.items():
        cells = [planner, str(len(rs))]
        for m in metrics:
            now = _median(r["metrics"].get(m) for r in rs)
            then = _median(
                baseline.entries[r["identity"]].metrics.get(m)
                for r in rs
                if r["identity"] in baseline.entries
            )
            cells.append(f"{shown(then)} -> {shown(now)}")
        rows.append(tuple(cells))
    return rows


def _median(values: Iterable[Any]) -> float | None:
    xs = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    return statistics.median(xs) if xs else None


def markdown(
    lines: Sequence[Line],
    records: Sequence[dict[str, Any]],
    baseline: Baseline,
    metrics: Sequence[str],
    title: str,
) -> str:
    """The CI page: the verdict, pass/fail counts, the lines that are not
    ok, and each planner's medians."""
    c = counts(lines)
    out = [f"# {title}\n", f"**{verdict_line(c)}**\n"]
    shown_lines = [x.cells() for x in lines if x.verdict is not Verdict.OK]
    out.append("## Differences\n")
    out.append(
        markdown_table(shown_lines) if shown_lines else "None: every figure within tolerance.\n"
    )
    numeric = [m for m in metrics if m != "bound_name"]
    out.append("\n## Medians per planner (baseline -> now)\n")
    out.append(
        markdown_table(medians(records, baseline, numeric), ("planner", "scenarios", *numeric))
    )
    return "\n".join(out)

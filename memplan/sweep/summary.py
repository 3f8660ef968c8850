"""A sweep's summary per planner: how its scenarios ended, and the Pareto
front of memory saved (MSR, higher is better) against the time it cost
(EOR, lower is better), as summary.md and pareto.png."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memplan.outputs import writing
from memplan.sweep.scenario import STATUSES
from memplan.traces.fields import printable
from memplan.traces.io import atomic_write_bytes

FINISHED = ("alone", "net")


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indexes of the (msr, eor) points no other point dominates -- another
    with msr >= and eor <= and one of them strictly -- sorted by eor, then
    by index; equal points are all kept."""
    order = sorted(range(len(points)), key=lambda i: (points[i][1], -points[i][0], i))
    front: list[int] = []
    best: tuple[float, float] | None = None  # (msr, eor) of the last point that raised msr
    for i in order:
        msr, eor = points[i]
        if best is None or msr > best[0]:
            best = (msr, eor)
            front.append(i)
        elif (msr, eor) == best:
            front.append(i)
    return front


def by_planner(records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The records grouped by planner, planners in order of first appearance."""
    out: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        out.setdefault(r["inputs"]["planner"], []).append(r)
    return out


def _finished(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        r
        for r in records
        if r["status"] in FINISHED
        and r["metrics"]["msr"] is not None
        and r["metrics"]["eor"] is not None
    ]


def fronts(records: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Per planner, the records on its Pareto front (finished scenarios only)."""
    out = {}
    for planner, rs in by_planner(records).items():
        done = _finished(rs)
        idx = pareto_front([(r["metrics"]["msr"], r["metrics"]["eor"]) for r in done])
        out[planner] = [done[i] for i in idx]
    return out


def markdown(records: Sequence[dict[str, Any]]) -> str:
    """summary.md: the status counts of every planner, then its front."""
    groups = by_planner(records)
    lines = [f"# Sweep summary: {len(records)} scenarios", ""]
    lines += ["| planner | " + " | ".join(STATUSES) + " |", "|---" * (len(STATUSES) + 1) + "|"]
    for planner, rs in groups.items():
        counts = [sum(r["status"] == s for r in rs) for s in STATUSES]
        lines.append(f"| {planner} | " + " | ".join(str(n) for n in counts) + " |")
    for planner, front in fronts(records).items():
        lines += ["", f"## {planner}: Pareto front of MSR (higher) against EOR (lower)", ""]
        if not front:
            lines.append("No scenario finished.")
            continue
        lines += ["| MSR | EOR | status | scenario |", "|---|---|---|---|"]
        for r in front:
            m = r["metrics"]
            name = printable(r["name"]).replace("|", "\\|")
            lines.append(f"| {m['msr']:.4f} | {m['eor']:.4f} | {r['status']} | {name} |")
    return "\n".join(lines) + "\n"


def figure(records: Sequence[dict[str, Any]]) -> bytes:
    """pareto.png: every finished scenario as a dot, each planner's front as
    a step line, one colour per planner."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5), dpi=110)
    colours = plt.get_cmap("tab10")
    for n, (planner, front) in enumerate(fronts(records).items()):
        colour = colours(n % 10)
        done = _finished(by_planner(records)[planner])
        ax.scatter([r["metrics"]["eor"] for r in done], [r["metrics"]["msr"] for r in done],
                   s=14, alpha=0.35, color=colour)  # fmt: skip
        if front:
            xs = [r["metrics"]["eor"] for r in front]
            ys = [r["metrics"]["msr"] for r in front]
            ax.step(xs, ys, where="post", color=colour, label=f"{planner} ({len(done)})")
            ax.scatter(xs, ys, s=22, color=colour, edgecolor="black", linewidth=0.5)
    ax.set_xlabel("EOR: iteration time / vanilla (lower is better)")
    ax.set_ylabel("MSR: memory saved (higher is better)")
    ax.set_title(f"Pareto fronts per planner ({len(records)} scenarios)")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def write(records: Sequence[dict[str, Any]], out: Path) -> list[str]:
    """Write summary.md and pareto.png into `out`; returns their names."""
    for name, data in (("summary.md", markdown(records).encode()), ("pareto.png", figure(records))):
        with writing(out / name):
            atomic_write_bytes(out / name, data)
    return ["summary.md", "pareto.png"]

"""The capacity report: a table for the terminal, markdown and JSON files,
and a figure of peak and iteration time against the batch (the sequence
length, or the number of jobs) per planner, with the device's memory."""

from __future__ import annotations

import json
import math
from pathlib import Path

from memplan.capacity import Capacity, at_x
from memplan.outputs import report_dir
from memplan.sim.state import Allocator
from memplan.traces.io import atomic_write_bytes
from memplan.units import format_bytes

COLUMNS = ("planner", "largest", "fit", "peak", "EOR", "iteration", "probes", "search")


def _ms(x: float | None) -> str:
    return "-" if x is None or math.isnan(x) else f"{x * 1e3:.2f} ms"


def cells(c: Capacity) -> list[tuple[str, ...]]:
    rows = []
    for a in c.answers:
        at = a.at
        top = " (top of range)" if a.largest == c.hi and c.lo < c.hi else ""
        rows.append(
            (
                a.planner,
                "none" if a.largest is None else f"{a.largest}{top}",
                at.fit.value if at else "-",
                format_bytes(at.peak_bytes) if at and at.peak_bytes is not None else "-",
                f"{at.eor:.3f}" if at and not math.isnan(at.eor) else "-",
                _ms(at.iteration_time_s) if at else "-",
                str(len(a.probes)),
                f"{a.search_s:.1f} s",
            )
        )
    return rows


def header(c: Capacity) -> str:
    s, run = c.settings, c.settings.config
    what = {
        "batch": f"largest batch of {c.jobs}",
        "seq": f"longest seq of {c.jobs} at batch {c.batch}",
    }.get(c.axis, f"most jobs of {c.jobs} at batch {c.batch}")
    eor = f", EOR <= {s.max_eor:g}" if s.max_eor is not None else ""
    if run.allocator is not Allocator.EXACT or c.context_bytes:
        eor += f", {run.allocator.value} allocator, {format_bytes(c.context_bytes)} context per job"
    return (
        f"{what} on {c.hardware} ({format_bytes(c.memory_bytes)}): budget "
        f"{format_bytes(s.budget_bytes)}, fallback {run.fallback}{eor}, range {c.lo}..{c.hi}"
    )


def _scaling_lines(c: Capacity) -> list[str]:
    lines = [
        f"{m}: scaled trace checked against a capture at batch {k.batch}: peak "
        f"{format_bytes(k.scaled_peak_bytes)} scaled, {format_bytes(k.captured_peak_bytes)} "
        f"captured ({f'ok, largest error {k.max_rel_error:.2%}' if k.ok else k.reason})"
        for m, k in c.checks
    ]
    above = at_x(c.axis, c.ceiling)
    if c.ceiling < c.hi:
        lines.append(f"no plan fits above {above} (the jobs' peak lower bound)")
    else:
        lines.append(f"the jobs' peak lower bound leaves the whole range open (up to {above})")
    if c.axis == "batch":
        lines.append(f"{c.captures} captures; every other batch scaled (NOTE [ Batch scaling ])")
    elif c.axis == "seq":
        lines.append(
            f"{c.captures} captures, one per seq used (NOTE [ Capacity over the sequence ])"
        )
    return lines


def text(c: Capacity) -> str:
    rows = [COLUMNS, *cells(c)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = [header(c), ""]
    for r in rows:
        lines.append(
            "  ".join(
                s.ljust(w) if i < 3 else s.rjust(w) for i, (s, w) in enumerate(zip(r, widths))
            )
        )
    lines += ["", *_scaling_lines(c)]
    return "\n".join(lines)


def markdown(c: Capacity) -> str:
    lines = ["# memplan capacity", "", header(c), ""]
    lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(r) + " |" for r in cells(c)]
    lines += ["", *(f"- {x}" for x in _scaling_lines(c)), *(f"- note: {x}" for x in c.notes)]
    return "\n".join(lines) + "\n"


def figure(c: Capacity):  # noqa: ANN201
    """Peak and iteration time against the batch (or jobs), per planner:
    probes that fit joined by lines, those that did not as crosses (at the
    peak the run reached), each planner's answer a dotted line; the
    device's memory (and the budget, when smaller) across."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 7), layout="constrained")
    mem, times = fig.subplots(2, 1, sharex=True)
    # a device far above the budget would squash the curves: then the axis
    # stops above the budget and the legend says the device line is above
    budget = c.settings.budget_bytes
    top = c.memory_bytes if c.memory_bytes <= 2 * budget else budget
    above = "" if top == c.memory_bytes else " (above)"
    scale, unit = (2**30, "GiB") if top >= 2**30 else (2**20, "MiB")
    memory = f"{c.hardware} memory {c.memory_bytes / scale:.2f} {unit}{above}"
    for i, a in enumerate(c.answers):
        color = f"C{i % 10}"
        ran = sorted((p for p in a.probes if p.peak_bytes is not None), key=lambda p: p.x)
        ok = [p for p in ran if p.fits]
        bad = [p for p in ran if not p.fits]
        label = a.planner if a.largest is None else f"{a.planner}: {a.largest}"
        mem.plot([p.x for p in ok], [p.peak_bytes / scale for p in ok], "o-", color=color,
                 ms=3, lw=1, label=label)  # fmt: skip
        mem.plot([p.x for p in bad], [p.peak_bytes / scale for p in bad], "x", color=color, ms=5)
        times.plot([p.x for p in ok], [p.iteration_time_s * 1e3 for p in ok], "o-", color=color,
                   ms=3, lw=1)  # fmt: skip
        if a.largest is not None:
            for ax in (mem, times):
                ax.axvline(a.largest, color=color, lw=0.6, ls=":")
    mem.axhline(c.memory_bytes / scale, color="black", lw=1.2, label=memory)
    if budget != c.memory_bytes:
        mem.axhline(budget / scale, color="black", ls="--", lw=1, label="budget")
    mem.set_ylabel(f"peak ({unit})")
    mem.set_ylim(0, top * 1.08 / scale)
    mem.set_title(header(c), fontsize="small")
    fig.legend(*mem.get_legend_handles_labels(), loc="outside right upper", fontsize="small")
    times.set_ylabel("iteration time (ms)")
    times.set_ylim(bottom=0)
    times.set_xlabel({"batch": "batch size", "seq": "sequence length (tokens)"}.get(c.axis, "jobs"))
    return fig


def to_json(c: Capacity, provenance: dict | None = None) -> str:
    """report.json's text, with "provenance" (NOTE [ Provenance ] in
    memplan/provenance.py) when given."""
    doc = c.to_dict()
    if provenance is not None:
        doc["provenance"] = provenance
    return json.dumps(doc, indent=2)


def write(c: Capacity, out: Path, provenance: dict | None = None) -> list[str]:
    """report.md, report.json and capacity.png in `out`, whole or not at all
    (NOTE [ Report directories ] in memplan/outputs.py)."""
    from memplan.sim.exports import save_figure

    fig = figure(c)  # drawn before the directory exists
    with report_dir(out) as tmp:
        atomic_write_bytes(tmp / "report.md", markdown(c).encode())
        atomic_write_bytes(tmp / "report.json", (to_json(c, provenance) + "\n").encode())
        save_figure(fig, tmp / "capacity.png")
    return ["report.md", "report.json", "capacity.png"]

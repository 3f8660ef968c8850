"""The comparison report: a table for the terminal, markdown and JSON files,
and one figure with every planner's memory curve over the vanilla curve."""

from __future__ import annotations

import json
import math
from pathlib import Path

from memplan.comparison import WITNESSES, Comparison, Fit, Row
from memplan.outputs import report_dir
from memplan.planners.core import io as plan_io
from memplan.traces.io import atomic_write_bytes
from memplan.units import format_bytes

COLUMNS = (
    "planner",
    "fit",
    "peak",
    "pinned",
    "MSR",
    "EOR",
    "CBR",
    "iteration",
    "gap",
    "stall",
    "moved",
    "plan time",
)


def _num(x: float, fmt: str) -> str:
    return "-" if x is None or math.isnan(x) else format(x, fmt)


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1e3:.2f} ms"


def _peak(row: Row) -> str:
    if row.peak_bytes is None:
        return "-"
    if row.sim is not None and row.sim.oom:
        return "OOM"
    return format_bytes(row.peak_bytes)


def _fit(row: Row) -> str:
    if row.fit == Fit.NET:
        return f"net ({row.evictions} ev)"
    return {Fit.ALONE: "alone", Fit.OOM: "OOM"}.get(row.fit, row.fit)


def cells(row: Row) -> tuple[str, ...]:
    moved = row.bytes_h2d + row.bytes_d2h
    pinned = row.pinned_peak_bytes
    return (
        row.planner,
        _fit(row),
        _peak(row),
        "-" if pinned is None else format_bytes(pinned),
        _num(row.msr, ".3f"),
        _num(row.eor, ".3f"),
        _num(row.cbr, ".3f"),
        _ms(row.iteration_time_s),
        "-" if math.isnan(row.gap) else f"{max(row.gap, 0.0):.1%}",  # -1e-9: ns rounding
        _ms(row.stall_s) if row.peak_bytes is not None else "-",
        format_bytes(moved) if row.peak_bytes is not None else "-",
        f"{row.plan_time_s:.2f} s",
    )


def header(c: Comparison) -> str:
    v = c.vanilla
    jobs = ", ".join(j.name for j in v.jobs)
    net = {r.fallback for r in c.rows if r.planner not in WITNESSES and r.sim} or {"none"}
    bound = sorted({r.bound for r in c.rows if r.bound})
    return (
        f"{v.hardware}, {len(v.lanes)} lane(s); jobs: {jobs}; vanilla peak "
        f"{format_bytes(v.device_peak_bytes)}, iteration {_ms(_vanilla_iter(c))}; fallback "
        f"{', '.join(sorted(net))}"
        + (f"; gap against the {', '.join(bound)} bound" if bound else "")
        + _memory(c)
    )


def _memory(c: Comparison) -> str:
    """The allocator model and contexts, when not exact (NOTE [ The memory a
    GPU really uses ] in sim/simulate.py); peaks are device peaks, `pinned`
    the most host bytes a plan parks (NOTE [ Pinned host memory ])."""
    v = c.vanilla
    if v.allocator.value == "exact" and not v.context_reserve_bytes:
        return ""
    return (
        f"; allocator {v.allocator.value}, {len(v.jobs)} CUDA context(s) of "
        f"{format_bytes(v.context_reserve_bytes)} in every peak"
    )


def _vanilla_iter(c: Comparison) -> float:
    times = [j.iteration_time_s for j in c.vanilla.jobs]
    return sum(times) / len(times)


def _modelled(c: Comparison) -> bool:
    return c.vanilla.allocator.value != "exact"


def _columns(c: Comparison) -> tuple[str, ...]:
    """COLUMNS, and with an allocator model its allocated and reserved peaks
    and fragmentation (NOTE [ Device peaks ] in sim/metrics.py)."""
    return COLUMNS + (("allocated", "reserved", "frag") if _modelled(c) else ())


def _cells(c: Comparison, row: Row) -> tuple[str, ...]:
    if not _modelled(c):
        return cells(row)
    more = (row.allocated_peak_bytes, row.reserved_peak_bytes, row.fragmentation_bytes)
    return cells(row) + tuple("-" if x is None else format_bytes(x) for x in more)


def text_table(c: Comparison) -> str:
    columns = _columns(c)
    rows = [columns, *(_cells(c, r) for r in c.rows)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    lines = [header(c), ""]
    for r in rows:
        lines.append(
            "  ".join(
                s.ljust(w) if i < 2 else s.rjust(w)
                for i, (s, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    notes = [f"  {r.planner}: {r.reason}" for r in c.rows if r.reason]
    if notes:
        lines += ["", "notes:", *notes]
    return "\n".join(lines)


def markdown(c: Comparison) -> str:
    lines = [
        "# memplan compare",
        "",
        header(c),
        "",
        "| " + " | ".join(_columns(c)) + " |",
        "|" + "---|" * len(_columns(c)),
    ]
    lines += ["| " + " | ".join(_cells(c, r)) + " |" for r in c.rows]
    lines += [
        "",
        "MSR = (VMP - EMP) / VMP, EOR = ETC / VTC, CBR = MSR / EOR (TENSILE), "
        "against the vanilla run of the same jobs on the same hardware; gap = (iteration - "
        "lower bound) / lower bound at the same budget, against the strongest bound proven for "
        "every plan (planners/analysis/bounds.py; for several jobs the bound holds for runs that "
        "keep the jobs in step, NOTE [ Jobs in step ]). fit: alone = the plan fits the budget on its "
        "own; net (n ev) = it finished because the fallback net evicted n buffers; OOM = it ran out "
        "even so; passive and dtr rows are witnesses: no plan, the online policy alone.",
        "",
    ]
    for r in c.rows:
        if r.reason:
            lines.append(f"- **{r.planner}**: {r.reason}")
    return "\n".join(lines) + "\n"


def memory_figure(c: Comparison):  # noqa: ANN201
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(11, 5))
    v = c.vanilla.memory
    ax.step(
        v.t_s * 1e3, v.bytes / 2**30, where="post", color="black", lw=1.5, ls="--", label="vanilla"
    )
    for r in c.rows:
        if r.sim is None:
            continue
        m = r.sim.memory
        ax.step(
            m.t_s * 1e3,
            m.bytes / 2**30,
            where="post",
            lw=1,
            label=f"{r.planner}" + ("" if r.fit == Fit.ALONE else f" ({_fit(r)})"),
        )
    budgets = {r.budget_bytes for r in c.rows if r.budget_bytes}
    for b in sorted(budgets):
        ax.axhline(b / 2**30, color="grey", lw=0.8, ls=":")
    ax.set_xlabel("time (ms)")
    ax.set_ylabel("device memory (GiB)")
    ax.set_title(header(c).split(";")[0] + ": memory per planner")
    ax.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    return fig


def to_json(c: Comparison, provenance: dict | None = None) -> str:
    """The comparison as report.json's text, with its "provenance" (NOTE
    [ Provenance ] in memplan/provenance.py) when given."""
    doc = c.to_dict()
    if provenance is not None:
        doc["provenance"] = provenance
    return json.dumps(doc, indent=2)


def write(c: Comparison, out: Path, provenance: dict | None = None) -> list[str]:
    """Plans, report.md, report.json, memory.png and a PyTorch memory
    snapshot per simulation (snapshots/vanilla.pickle, snapshots/PLANNER.pickle:
    NOTE [ Snapshot format ] in sim/snapshot.py) in the directory `out`, which
    appears whole or not at all (NOTE [ Report directories ] in
    memplan/outputs.py); returns the names. Plan files and report.json carry
    `provenance` when given."""
    from memplan.sim.exports import save_figure
    from memplan.sim.snapshot import write_snapshot

    figure = memory_figure(c)  # drawn before the directory exists
    written = []
    with report_dir(out) as tmp:
        for r in c.rows:
            if r.result is not None and r.result.plans:
                plan_io.save(r.result, tmp / "plans" / f"{r.planner}.json", provenance)
                written.append(f"plans/{r.planner}.json")
        atomic_write_bytes(tmp / "report.md", markdown(c).encode())
        atomic_write_bytes(tmp / "report.json", (to_json(c, provenance) + "\n").encode())
        save_figure(figure, tmp / "memory.png")
        sims = [("vanilla", c.vanilla)] + [(r.planner, r.sim) for r in c.rows if r.sim is not None]
        for name, sim in sims:
            write_snapshot(sim, tmp / "snapshots" / f"{name}.pickle")
    snapshots = [f"snapshots/{name}.pickle" for name, _ in sims]
    return [*written, "report.md", "report.json", "memory.png", *snapshots]

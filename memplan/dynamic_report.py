"""Reports of dynamic runs: the per-phase table (text and markdown), the
paper's Fig. 6 (MSR, EOR, CBR against the number of workloads, per method)
and a timeline of one scenario (arrivals, plan changes, memory per job)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from memplan.dynamic import DynamicRun, MethodRun, Phase, phases
from memplan.sim.metrics import Metrics, savings
from memplan.traces.fields import nan_to_none
from memplan.units import format_bytes

COLUMNS = ("method", "phase", "its", "peak", "MSR", "EOR", "CBR", "passive", "stall")


def _num(x: float, fmt: str = ".3f") -> str:
    return "-" if math.isnan(x) else format(x, fmt)


def phase_cells(p: Phase) -> tuple[str, ...]:
    m = p.metrics
    return (
        p.method,
        p.label,
        str(p.iterations),
        format_bytes(p.peak_bytes),
        _num(m.msr),
        _num(m.eor),
        _num(m.cbr),
        str(p.passive_swaps),
        f"{p.stall_s * 1e3:.1f} ms",
    )


def text_table(rows: Sequence[tuple[str, ...]], columns: Sequence[str] = COLUMNS) -> str:
    """Columns padded to their widest cell."""
    width = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, width, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, width, strict=True)) for r in rows]
    return "\n".join(line.rstrip() for line in lines)


def markdown_table(rows: Sequence[tuple[str, ...]], columns: Sequence[str] = COLUMNS) -> str:
    out = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def phase_rows(run: DynamicRun) -> list[tuple[str, ...]]:
    return [phase_cells(p) for p in phases(run)]


def totals(run: DynamicRun) -> dict[str, Metrics]:
    """Each method's whole-run MSR, EOR, CBR (global peak, makespan) against vanilla."""
    return {mr.method: savings(run.vanilla.result, mr.result).total for mr in run.runs}


def fig6(points: Mapping[str, Mapping[str, Mapping[int, Metrics]]]):  # noqa: ANN201
    """Fig. 6: `points[model][method][n_workloads]` -> metrics; one column
    per model, rows MSR, EOR, CBR, a line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(points)
    fig, axes = plt.subplots(3, len(models), figsize=(3.2 * len(models), 7.5), squeeze=False)
    for c, model in enumerate(models):
        for method, by_n in points[model].items():
            ns = sorted(by_n)
            for r, key in enumerate(("msr", "eor", "cbr")):
                axes[r][c].plot(ns, [getattr(by_n[n], key) for n in ns], marker="o", label=method)
        axes[0][c].set_title(model)
        axes[2][c].set_xlabel("workloads")
        for r, key in enumerate(("MSR", "EOR", "CBR")):
            axes[r][0].set_ylabel(key)
            axes[r][c].set_xticks(range(1, 5))
            axes[r][c].grid(alpha=0.3)
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    return fig


def timeline_figure(run: DynamicRun, methods: Sequence[str] | None = None):  # noqa: ANN201
    """Memory per job over time, one panel per method (vanilla first), with
    each arrival (dashed) and each plan change taking effect (dotted)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    mrs = [run.vanilla] + [m for m in run.runs if methods is None or m.method in methods]
    fig, axes = plt.subplots(len(mrs), 1, figsize=(11, 2.2 * len(mrs)), sharex=True)
    axes = list(axes) if len(mrs) > 1 else [axes]
    for ax, mr in zip(axes, mrs, strict=True):
        _timeline_panel(ax, mr, run.budget_bytes)
    axes[-1].set_xlabel("time (s)")
    axes[0].legend(loc="upper left", fontsize=7, ncol=4)
    fig.tight_layout()
    return fig


def _timeline_panel(ax, mr: MethodRun, budget: int) -> None:  # noqa: ANN001
    res = mr.result
    mem = res.memory
    ax.stackplot(
        mem.t_s,
        (mem.by_job.T / 2**30) if len(mem.t_s) else [],
        step="post",
        labels=[j.name for j in res.jobs],
    )
    if mr.method != "vanilla":
        ax.axhline(budget / 2**30, color="grey", lw=0.8, ls=":")
    starts = {(r.job, r.iteration): r.start_s for r in mr.record.reports}
    for j in res.jobs:
        ax.axvline(j.start_s, color="black", lw=0.8, ls="--")
        for it, _ready, _reason in j.plan_changes:
            t = starts.get((j.index, it))
            if t is not None:
                ax.axvline(t, color="red", lw=0.6, ls=":")
    ax.set_ylabel("GiB")
    ax.set_title(f"{mr.method}: memory per job, arrivals (--), plan changes (red :)", fontsize=9)


def save(fig, path: Path) -> None:  # noqa: ANN001
    from memplan.sim.exports import save_figure

    save_figure(fig, path)


def methods_of(text: str) -> list[str]:
    """`--dynamic tensile_cs,capuchin` (or `all`) as method names."""
    from memplan.controllers import Method
    from memplan.traces.errors import MemplanError

    allowed = [m.value for m in Method]
    names: list[str] = []
    for n in (x.strip() for x in text.split(",")):
        for name in allowed if n == "all" else [n] if n else []:
            if name not in allowed:
                raise MemplanError(
                    f"--dynamic: unknown method {name!r}; one of {', '.join(allowed)}"
                )
            if name not in names:
                names.append(name)
    if not names:
        raise MemplanError(f"--dynamic: give 'all' or methods of {', '.join(allowed)}")
    return names


def to_dict(run: DynamicRun) -> dict:
    """The phases and totals as JSON values (NaN as null)."""

    def metrics(m: Metrics) -> dict:
        return {"msr": nan_to_none(m.msr), "eor": nan_to_none(m.eor), "cbr": nan_to_none(m.cbr)}

    return {
        "budget_bytes": run.budget_bytes,
        "phases": [
            {
                "method": p.method,
                "phase": p.label,
                "iterations": p.iterations,
                "peak_bytes": p.peak_bytes,
                "mean_iteration_s": nan_to_none(p.mean_iteration_s),
                **metrics(p.metrics),
                "passive_swaps": p.passive_swaps,
                "stall_s": p.stall_s,
            }
            for p in phases(run)
        ],
        "totals": {k: metrics(m) for k, m in totals(run).items()},
        "plan_changes": {
            mr.method: [
                {"job": j.index, "iteration": it, "ready_s": r, "reason": why}
                for j in mr.result.jobs
                for it, r, why in j.plan_changes
            ]
            for mr in run.runs
        },
    }


def markdown(run: DynamicRun) -> str:
    rows = phase_rows(run)
    tot = [(k, _num(m.msr), _num(m.eor), _num(m.cbr)) for k, m in totals(run).items()]
    return (
        f"# Dynamic run\n\nbudget {format_bytes(run.budget_bytes)}\n\n## Phases\n\n"
        + markdown_table(rows)
        + "\n## Whole run\n\n"
        + markdown_table(tot, ("method", "MSR", "EOR", "CBR"))
    )


def write(run: DynamicRun, out: Path, provenance: dict | None = None) -> list[str]:
    """report.md, report.json (with `provenance`, NOTE [ Provenance ] in
    memplan/provenance.py) and timeline.png in the directory `out` (NOTE
    [ Report directories ] in memplan/outputs.py)."""
    import json

    from memplan.outputs import report_dir
    from memplan.traces.io import atomic_write_bytes

    fig = timeline_figure(run)
    with report_dir(out) as tmp:
        atomic_write_bytes(tmp / "report.md", markdown(run).encode())
        doc = json.dumps({**to_dict(run), "provenance": provenance}, indent=2) + "\n"
        atomic_write_bytes(tmp / "report.json", doc.encode())
        save(fig, tmp / "timeline.png")
    return ["report.md", "report.json", "timeline.png"]


def run_command(args, mix, traces, device) -> int:  # noqa: ANN001
    """`memplan compare ... --dynamic METHODS`: each method's scheduler over
    the job mix `mix`, the per-phase table (NOTE [ Phases of a dynamic run ])."""
    import json

    from memplan import provenance
    from memplan.commands import machine
    from memplan.dynamic import DEFAULT_BUDGET_FRACTION, run_dynamic
    from memplan.outputs import check_dir
    from memplan.traces.fields import printable

    if args.out is not None:
        check_dir(args.out)
    methods = methods_of(args.dynamic)
    frac = machine.budget_fraction(args)
    nbytes = machine.check_budget(machine.budget(args), device.hw, args)
    jobs = mix.jobs(traces, [None] * len(traces))
    run = run_dynamic(
        jobs,
        device,
        methods,
        budget_bytes=nbytes,
        budget_fraction=frac or DEFAULT_BUDGET_FRACTION,
        iterations=args.iterations,
        config=machine.run_config(args),
        **mix.options(),
    )
    prov = provenance.of_command(args, traces, device.hw, seed=mix.moves.seed)
    written = write(run, Path(args.out), prov) if args.out else []
    if args.json:
        print(json.dumps({**to_dict(run), "provenance": prov}, indent=2))
        return 0
    print(f"budget {format_bytes(run.budget_bytes)}")
    print(printable(text_table(phase_rows(run))))
    tot = [(k, _num(m.msr), _num(m.eor), _num(m.cbr)) for k, m in totals(run).items()]
    print("\nwhole run\n" + printable(text_table(tot, ("method", "MSR", "EOR", "CBR"))))
    if written:
        print(f"\nwrote {Path(args.out)}/: {', '.join(written)}")
    return 0

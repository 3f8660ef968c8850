"""Planners under memory pressure: the table of issue 16.

For each shipped model at batch 16 (Adam) on rtx-a6000 (kernel-model latencies,
one PCIe lane) and each budget of 90, 75, 60, 50 and 40% of the simulated
vanilla peak (skipped, and said so, when below the proven peak floor of
`planners/analysis/bounds.py`): every planner through `memplan.comparison`
with the `--fallback` net (default dtr), so each row says whether its plan
fit alone, fit with the net, or ran out; the passive and dtr witnesses (no
plan, the online policy alone); the best lower bound and its name. Iteration
times are simulated (3 iterations, steady state; deterministic); planning
time is this machine's wall time (`time.perf_counter`), one run per cell.

Per cell it prints the row of each planner, then the best plan that fits
alone, its gap to the bound and the faster witness; at the end the three
targets of the issue: a plan fits alone wherever a witness runs; the best
plan is never slower than a witness and within 10% of the bound in >= 80% of
cells; every planning time <= 60 s. `--markdown FILE` writes the summary
table for the README.

Usage: python benchmarks/pressure.py [--models resnet50,...] [--budgets 90,75,60,50,40]
       [--planners tensile,capuchin,vdnn,checkpoint,autoswap,squeeze,swapadvisor,cpsat] [--time-limit 60]
       [--fallback dtr] [--markdown FILE]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memplan.hwmodels.device import DeviceModel  # noqa: E402
from memplan.hwmodels.kernels import KernelModel  # noqa: E402
from memplan.hwmodels.profile import load_hardware  # noqa: E402
from memplan.planners.analysis.bounds import peak_lower_bound  # noqa: E402
from memplan.traces import io  # noqa: E402

from memplan.comparison import WITNESSES, Fit, compare_planners, vanilla_peak  # noqa: E402
from memplan.report import text_table  # noqa: E402
from memplan.runconfig import RunConfig  # noqa: E402

MODELS = ("resnet50", "vgg16", "inception_v3", "densenet121", "bert_base", "gpt2")
BUDGETS = (90, 75, 60, 50, 40)
PLANNERS = (
    "tensile",
    "capuchin",
    "vdnn",
    "checkpoint",
    "autoswap",
    "squeeze",
    "swapadvisor",
    "cpsat",
)


def _ms(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x * 1e3:.1f}"


def cell(trace, device, pct, planners, fallback, limit):
    peak = vanilla_peak([trace], device)
    budget = int(peak * pct / 100)
    floor = peak_lower_bound(trace).nbytes
    if budget < floor:
        return None, f"skipped: {budget} B is below the proven peak floor {floor} B"
    options = {k: [f"time_limit_s={limit}"] for k in ("cpsat", "squeeze", "swapadvisor")}
    names = [*planners, *WITNESSES]
    options = {k: v for k, v in options.items() if k in names}
    run = RunConfig(fallback=fallback)
    c = compare_planners([trace], device, names, budget=budget, options=options, config=run)
    return c, ""


def summarise(c):
    rows = {r.planner: r for r in c.rows}
    plans = [r for r in c.rows if r.planner not in WITNESSES and r.fit == Fit.ALONE]
    best = min(plans, key=lambda r: r.iteration_time_s, default=None)
    witnesses = [rows[w] for w in WITNESSES if w in rows and rows[w].finished]
    fastest_w = min(witnesses, key=lambda r: r.iteration_time_s, default=None)
    bound_s = (
        best.iteration_time_s / (1 + best.gap)
        if best is not None and not math.isnan(best.gap)
        else math.nan
    )
    return best, fastest_w, bound_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="shipped models, comma-separated")
    ap.add_argument(
        "--budgets",
        default=",".join(map(str, BUDGETS)),
        help="percentages of the simulated vanilla peak, comma-separated",
    )
    ap.add_argument("--planners", default=",".join(PLANNERS), help="planners besides the witnesses")
    ap.add_argument(
        "--time-limit",
        type=float,
        default=60.0,
        help="seconds for squeeze, swapadvisor and cpsat (default 60)",
    )
    ap.add_argument("--fallback", default="dtr", help="the net under every plan: none|passive|dtr")
    ap.add_argument("--gpu", default="rtx-a6000", help="hardware profile (default rtx-a6000)")
    ap.add_argument("--markdown", help="write the summary table here")
    args = ap.parse_args()
    device = DeviceModel(load_hardware(args.gpu), KernelModel())
    planners = [p for p in args.planners.split(",") if p]
    lines = [
        "| trace | budget | best plan (fits alone) | iteration ms | gap | bound (name) | "
        "passive ms | dtr ms | slowest planning s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    n_cells = n_fit = n_not_slower = n_close = 0
    worst_plan_s = 0.0
    for model in args.models.split(","):
        trace = io.load(ROOT / "traces" / "data" / f"{model}_b16_adam.json.gz")
        for pct in (int(x) for x in args.budgets.split(",")):
            t0 = time.perf_counter()
            c, why = cell(trace, device, pct, planners, args.fallback, args.time_limit)
            print(f"== {model} at {pct}% of the vanilla peak ({time.perf_counter() - t0:.0f} s)")
            if c is None:
                print(why, "\n")
                lines.append(f"| {model} | {pct}% | {why} | | | | | | |")
                continue
            print(text_table(c), "\n")
            best, fastest_w, bound_s = summarise(c)
            rows = {r.planner: r for r in c.rows}
            plan_s = max(r.plan_time_s for r in c.rows if r.planner not in WITNESSES)
            worst_plan_s = max(worst_plan_s, plan_s)
            n_cells += 1
            witness_runs = fastest_w is not None
            n_fit += best is not None or not witness_runs
            if best is not None:
                n_not_slower += (
                    fastest_w is None
                    or best.iteration_time_s <= fastest_w.iteration_time_s * (1 + 1e-9)
                )
                n_close += not math.isnan(best.gap) and best.gap <= 0.10
            w = {k: _ms(rows[k].iteration_time_s) if rows[k].finished else "OOM" for k in WITNESSES}
            lines.append(
                f"| {model} | {pct}% | {best.planner if best else 'none'} | "
                f"{_ms(best.iteration_time_s) if best else '-'} | "
                f"{'-' if best is None or math.isnan(best.gap) else f'{max(best.gap, 0):.1%}'} | "
                f"{_ms(bound_s)} ({best.bound if best else '-'}) | {w['passive']} | {w['dtr']} | {plan_s:.1f} |"
            )
    print("\n".join(lines))
    print(
        f"\n{n_cells} cells: a plan fits alone where a witness runs in {n_fit}; the best plan is no "
        f"slower than the witnesses in {n_not_slower}; within 10% of the bound in {n_close} "
        f"({n_close / max(n_cells, 1):.0%}, target >= 80%); slowest planner {worst_plan_s:.1f} s "
        f"(target <= 60 s)"
    )
    if args.markdown:
        Path(args.markdown).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()

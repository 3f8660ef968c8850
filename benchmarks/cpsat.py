"""The optimality gap of every planner, and CP-SAT's solve times.

For each instance (20 synthetic training steps of 40-200 ops, and the six
shipped traces) at two budgets, every registered planner (but vanilla) plans
the job; `memplan.comparison` checks and simulates each plan (one lane, OOM
policy "fail"); the table shows, per planner,

    gap = (simulated iteration time - bound) / bound

against the analytic lower bound of `planners.analysis.bounds` (valid for every plan),
"-" where the planner found no plan or its plan ran out of memory. CP-SAT's
own status, best bound (the larger of the analytic one and, for an exact
search, its model's), search mode and wall time are listed beside it.

Budgets: for synthetic steps, the peak lower bound plus 75% and 50% of the
way from it to the release-only peak; for shipped traces, 95% and 90% of
the release-only peak. Synthetic steps run on a100-pcie-40gb with their own
durations (5-100 us per op, so that 4 MiB copies of about 170 us do not all
hide behind compute), shipped traces with the roofline model.

    python benchmarks/cpsat.py [--time-limit S] [--workers N] [--only synthetic|shipped] [--quick]

`--solve-times` instead times CP-SAT alone on the synthetic steps of at most
60 ops (the issue's "proves optimality within 10 s") at a tight (50%) and a
loose (75%) budget, hint from the best heuristic as by default, and prints each status
and wall time with their median and worst.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memplan.hwmodels.device import DeviceModel  # noqa: E402
from memplan.hwmodels.latency import LatencyModel, Measured, Roofline  # noqa: E402
from memplan.hwmodels.profile import load_hardware  # noqa: E402
from memplan.planners import registry  # noqa: E402
from memplan.planners.analysis.bounds import bounds, gap_to_bound, peak_lower_bound  # noqa: E402
from memplan.planners.cpsat.planner import CpsatOptions, cpsat  # noqa: E402
from memplan.traces import io  # noqa: E402
from memplan.traces.model import Trace  # noqa: E402
from memplan.traces.synthetic import Durations, Grain, chain, random_dag, residual, unet  # noqa: E402

from memplan.comparison import compare_planners  # noqa: E402

GPU = "a100-pcie-40gb"
SYNTHETIC_FRACTIONS = (0.75, 0.5)  # of the way from the peak bound to the release-only peak
SHIPPED_FRACTIONS = (0.95, 0.9)  # of the release-only peak


def synthetic(quick: bool) -> list[tuple[str, Trace]]:
    d = Durations(Grain.US, 5, 100)
    out = [
        (f"random_dag({n})", random_dag(n, seed=n, durations=d))
        for n in (40, 60, 80, 100, 120, 140, 160, 180, 200)
    ]
    out += [
        (f"random_dag({n}, dropout)", random_dag(n, seed=n + 1, dropout=True, durations=d))
        for n in (70, 150)
    ]
    out += [
        (f"chain({n})", chain(n, act_mib=4, param_mib=2, seed=n, durations=d)) for n in (13, 30, 60)
    ]
    out += [
        (f"residual({n})", residual(n, act_mib=4, param_mib=2, seed=n, durations=d))
        for n in (4, 9, 19)
    ]
    out += [
        (f"unet({n})", unet(n, act_mib=4, param_mib=2, seed=n, durations=d)) for n in (3, 6, 12)
    ]
    return out[::4] if quick else out


def shipped(quick: bool) -> list[tuple[str, Trace]]:
    paths = sorted((ROOT / "traces" / "data").glob("*.json.gz"))
    out = [(p.name.removesuffix(".json.gz"), io.load(p)) for p in paths]
    return out[:2] if quick else out


def budget_at(trace: Trace, frac: float, between: bool) -> int:
    """`frac` of the release-only peak, or (`between`) of the way from the
    peak bound to it."""
    lb, peak = peak_lower_bound(trace).nbytes, trace.peak("liveness")[0]
    return int(lb + frac * (peak - lb)) if between else max(int(frac * peak), lb)


def run_instance(
    name, trace, latency: LatencyModel, frac, between, planners, args, hw, table, solves
):
    budget = budget_at(trace, frac, between)
    device = DeviceModel(hw, latency)  # one lane
    b = bounds(trace, device, budget_bytes=budget)
    opts = {"cpsat": [f"time_limit_s={args.time_limit}", f"num_workers={args.workers}"]}
    t0 = time.perf_counter()
    c = compare_planners([trace], device, planners, budget=budget, options=opts)
    wall = time.perf_counter() - t0
    label = f"{name} {'@lb+' if between else '@'}{frac:.2f}"
    row = {"instance": label, "ops": trace.n_ops, "bound_ms": b.time.seconds * 1e3}
    for r in c.rows:
        ok = r.feasible and not math.isnan(r.iteration_time_s)
        row[r.planner] = gap_to_bound(r.iteration_time_s, b.time.seconds) if ok else None
        if r.planner == "cpsat" and r.result is not None:
            s = r.result.stats
            solves.append(
                {
                    "instance": row["instance"],
                    "ops": trace.n_ops,
                    "status": s["status"],
                    "search": s.get("search"),
                    "time_s": r.plan_time_s,
                    "objective_ms": None if s.get("objective") is None else s["objective"] * 1e3,
                    "best_bound_ms": None if s.get("best_bound") is None else s["best_bound"] * 1e3,
                    "sim_ms": r.iteration_time_s * 1e3 if ok else None,
                    "hint": s.get("hint"),
                }
            )
    table.append(row)
    print(_fmt_row(row, planners), f"  ({wall:.0f} s)", flush=True)


def _fmt_gap(x: float | None) -> str:
    if x is None or math.isnan(x):
        return "-"
    return f"{100 * x + 0.0:6.2f}%" if abs(x) >= 5e-7 else "  0.00%"  # (float noise at 0)


def _fmt_row(row: dict, planners: list[str]) -> str:
    cells = "".join(f"{_fmt_gap(row.get(p)):>13}" for p in planners)
    return f"{row['instance']:<34}{row['ops']:>6}{row['bound_ms']:>12.3f}{cells}"


def small_synthetic() -> list[tuple[str, Trace]]:
    """Synthetic steps of at most 60 ops."""
    d = Durations(Grain.US, 5, 100)
    out = [(f"random_dag({n})", random_dag(n, seed=n, durations=d)) for n in (30, 40, 50, 60)]
    out.append(("random_dag(45, dropout)", random_dag(45, seed=46, dropout=True, durations=d)))
    out += [
        (f"chain({n})", chain(n, act_mib=4, param_mib=2, seed=n, durations=d))
        for n in (8, 13, 16, 19)
    ]
    out += [
        (f"residual({n})", residual(n, act_mib=4, param_mib=2, seed=n, durations=d))
        for n in (3, 4, 5)
    ]
    out += [(f"unet({n})", unet(n, act_mib=4, param_mib=2, seed=n, durations=d)) for n in (2, 3)]
    return out


def solve_times(args: argparse.Namespace, hw) -> None:
    print(f"cpsat solve times on {GPU}, time limit {args.time_limit:g} s, {args.workers} workers")
    print(f"{'instance':<28}{'ops':>5}{'budget':>8}{'status':>12}{'time s':>9}{'plan ms':>10}")
    times, proven = [], 0
    for name, trace in small_synthetic():
        for label, frac in (("tight", 0.5), ("loose", 0.75)):
            budget = budget_at(trace, frac, True)
            t0 = time.perf_counter()
            opts = CpsatOptions(time_limit_s=args.time_limit, num_workers=args.workers)
            r = cpsat([trace], DeviceModel(hw, Measured()), budget_bytes=budget, options=opts)
            wall = time.perf_counter() - t0
            s = r.stats
            times.append(wall)
            done = s["status"] in ("OPTIMAL", "INFEASIBLE")
            proven += done and wall <= 10.0
            obj = "-" if s.get("objective") is None else f"{s['objective'] * 1e3:.3f}"
            print(f"{name:<28}{trace.n_ops:>5}{label:>8}{s['status']:>12}{wall:>9.2f}{obj:>10}",
                  flush=True)  # fmt: skip
    print(
        f"median {statistics.median(times):.2f} s, worst {max(times):.2f} s; "
        f"{proven} of {len(times)} proven (optimal or infeasible) within 10 s"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--time-limit", type=float, default=60.0, help="CP-SAT seconds per instance")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", choices=("synthetic", "shipped"))
    ap.add_argument("--quick", action="store_true", help="a few instances only")
    ap.add_argument("--solve-times", action="store_true", help="CP-SAT alone on <= 60 ops")
    args = ap.parse_args()
    hw = load_hardware(GPU)
    if args.solve_times:
        solve_times(args, hw)
        return
    planners = [n for n in registry.names() if n != "vanilla"]
    print(
        f"gap to the analytic bound on {GPU}, one lane; cpsat time limit {args.time_limit:g} s, "
        f"{args.workers} workers"
    )
    print(f"{'instance':<34}{'ops':>6}{'bound ms':>12}" + "".join(f"{p:>13}" for p in planners))
    table: list[dict] = []
    solves: list[dict] = []
    groups = []
    if args.only in (None, "synthetic"):
        groups.append((synthetic(args.quick), Measured(), SYNTHETIC_FRACTIONS, True))
    if args.only in (None, "shipped"):
        groups.append((shipped(args.quick), Roofline(), SHIPPED_FRACTIONS, False))
    for instances, latency, fracs, between in groups:
        for name, trace in instances:
            for frac in fracs:
                run_instance(name, trace, latency, frac, between, planners, args, hw, table, solves)
    print()
    print(
        f"{'planner':<14}{'plans':>7}{'mean gap':>10}{'median':>10}{'max gap':>10}{'at bound':>10}"
    )
    for p in planners:
        gaps = [r[p] for r in table if r.get(p) is not None and not math.isnan(r[p])]
        if not gaps:
            print(f"{p:<14}{0:>7}")
            continue
        at = sum(1 for g in gaps if g <= 1e-6)
        print(
            f"{p:<14}{len(gaps):>7}{_fmt_gap(statistics.mean(gaps)):>10}"
            f"{_fmt_gap(statistics.median(gaps)):>10}{_fmt_gap(max(gaps)):>10}{at:>10}"
        )
    print()
    print("cpsat solves:")
    print(
        f"{'instance':<34}{'ops':>6}{'status':>11}{'search':>8}{'time s':>9}{'plan ms':>11}"
        f"{'bound ms':>11}{'sim ms':>11}  hint"
    )
    for s in solves:

        def ms(x):
            return "-" if x is None else f"{x:.3f}"

        print(
            f"{s['instance']:<34}{s['ops']:>6}{s['status']:>11}{s['search'] or '-':>8}"
            f"{s['time_s']:>9.1f}{ms(s['objective_ms']):>11}{ms(s['best_bound_ms']):>11}"
            f"{ms(s['sim_ms']):>11}  {s['hint']}"
        )
    statuses = Counter(s["status"] for s in solves)
    by_search: dict[str, list[float]] = defaultdict(list)
    for s in solves:
        by_search[s["search"] or "-"].append(s["time_s"])
    print("statuses:", dict(statuses))
    for k, v in by_search.items():
        print(
            f"solve time ({k}): median {statistics.median(v):.1f} s, max {max(v):.1f} s, n={len(v)}"
        )
    agree = [
        abs(s["sim_ms"] / s["objective_ms"] - 1)
        for s in solves
        if s["sim_ms"] is not None and s["objective_ms"]
    ]
    if agree:
        print(
            f"model vs simulator: max relative difference {max(agree):.2e} over {len(agree)} plans"
        )


if __name__ == "__main__":
    main()

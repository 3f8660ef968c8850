"""`memplan bounds TRACE --gpu G [--budget B] [--json]`: what no plan can beat.

Prints the peak lower bound, every iteration-time lower bound under the
budget and which of them is the best (NOTE [ Lower bounds ] in
planners/analysis/bounds.py, NOTE [ Window bounds ] in
planners/analysis/window_bound.py: each holds for every plan) and, unless
`--time-limit 0`, what the CP-SAT planner proves within that time (its bound
holds for the plans its model can express only, so it is never the best).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any

from memplan.commands import machine
from memplan.units import format_bytes, number


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "bounds",
        help="lower bounds on peak memory and iteration time under a budget",
        description=(
            "Lower bounds that hold for every plan of one trace: the peak (largest working "
            "set, or what is resident when an iteration starts) and the iteration time "
            "under a memory budget (compute, and the copies or recomputations needed to get "
            "every op under the budget: one op at a time, split at one op, or every op at "
            "once), naming the best. Optionally runs the CP-SAT planner for its bound, which "
            "holds only for the plans its model can express."
        ),
    )
    p.add_argument("trace", help="trace file (.json or .json.gz), or zoo:NAME for a shipped trace")
    machine.add_gpu(p)
    machine.add_budget(p)
    machine.add_lanes(p)
    machine.add_latency(p)
    p.add_argument(
        "--time-limit",
        type=number(0, 86400),
        default=10.0,
        metavar="SECONDS",
        help="CP-SAT time limit; 0 skips the solver (default 10)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    p.set_defaults(func=run)


def cpsat_bound(trace: Any, device: Any, budget: int, limit: float) -> dict:
    """The CP-SAT planner's status, objective and bound (seconds) within `limit`."""
    from memplan.planners.cpsat.planner import CpsatOptions, cpsat

    r = cpsat([trace], device, budget_bytes=budget, options=CpsatOptions(time_limit_s=limit))
    s = r.stats
    return {
        "status": s["status"],
        "search": s.get("search"),
        "iteration_time_s": s.get("iteration_time_s"),
        "best_bound_s": s.get("best_bound"),
        "model_bound_s": s.get("model_bound_s"),
        "relative_gap": s.get("relative_gap"),
        "solve_time_s": r.solve_time_s,
    }


def run(args: argparse.Namespace) -> int:
    from memplan.hwmodels.device import DeviceModel
    from memplan.planners.analysis.bounds import Bounds, peak_lower_bound, time_lower_bound
    from memplan.planners.analysis.window_bound import time_bounds

    trace = machine.one_trace(args.trace, "bounds")
    hw = machine.hardware(args)
    machine.check_measured(args, [trace], hw)
    latency = machine.latency_model(args.latency)
    device = DeviceModel(hw, latency, lanes=args.lanes)
    budget = machine.resolve_budget(args, [trace], device) or hw.memory_bytes
    tb = time_bounds(trace, device, budget)
    # time bounds count no workspace (the simulator allocates none); the peak does
    single = tb.single_op or time_lower_bound(trace, device, budget, workspace=False)
    b = Bounds(budget, peak_lower_bound(trace), single)
    solver = None
    if args.time_limit > 0 and b.time.feasible:
        solver = cpsat_bound(trace, device, budget, args.time_limit)
    if args.json:
        from memplan.provenance import of_command

        out = {"trace": trace.meta.model, "gpu": hw.name, "lanes": args.lanes, **b.to_dict()}
        out["time_bounds"] = tb.to_dict()
        out["cpsat"] = solver
        out["provenance"] = of_command(args, [trace], hw)
        print(json.dumps(out, indent=2))
        return 0
    print(f"{trace.meta.model} on {hw.name}, budget {format_bytes(budget)}, lanes {args.lanes}")
    pk = b.peak
    where = f"working set of op {pk.op}" if pk.op >= 0 else "resident at the iteration start"
    print(f"peak  >= {format_bytes(pk.nbytes):>12}   ({where})")
    best = tb.best
    if math.isinf(best.seconds):
        print(f"time  >=          inf   (no plan fits this budget: {best.where})")
    else:
        print(f"time  >= {best.seconds * 1e3:>9.3f} ms   (best: {best.name}, {best.where})")
        for x in tb.bounds:
            print(f"  {x.name:<10} {x.seconds * 1e3:>9.3f} ms   {x.where}")
    if solver is not None:
        line = f"cpsat    {solver['status']}"
        if solver["iteration_time_s"] is not None:
            line += f", plan {solver['iteration_time_s'] * 1e3:.3f} ms"
        if solver["best_bound_s"] is not None:
            line += f", bound {solver['best_bound_s'] * 1e3:.3f} ms within its model"
        line += f" ({solver['search']} search, {solver['solve_time_s']:.1f} s)"
        print(line)
    return 0

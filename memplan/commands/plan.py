"""`memplan plan TRACE --planner NAME --gpu G`: one planner's plan for a trace."""

from __future__ import annotations

import argparse
import json

from memplan.commands import machine
from memplan.commands.compare import parse_jobs
from memplan.units import format_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="make a swap / recompute / release plan with one planner",
        description="Plan the trace(s) with one planner, check the plan, and write it as JSON.",
    )
    p.add_argument("traces", nargs="+", metavar="TRACE[:COUNT]", help="trace files, or zoo:NAME for shipped traces")
    p.add_argument("--planner", required=True, help="tensile, capuchin, vdnn, checkpoint, ...")
    machine.add_gpu(p)
    machine.add_budget(p, "none")
    machine.add_latency(p)
    machine.add_lanes(p)
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a planner option (repeatable); see the planner's options dataclass",
    )
    p.add_argument("--out", metavar="PLAN", help="write the plan (memplan.plan/1 JSON) here")
    p.add_argument("--json", action="store_true", help="print the plan result summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memplan.planners import registry
    from memplan.planners.core import io as plan_io
    from memplan.planners.core.check import check

    device = machine.device(args)
    budget = machine.budget(args)
    traces = parse_jobs(args.traces)
    result = registry.run(args.planner, traces, device, budget_bytes=budget, options=args.option)
    for p, t in zip(result.plans, traces, strict=False):
        check(p, t)
    if args.out and result.plans:
        plan_io.save(result, args.out)
    summary = {
        "planner": result.planner,
        "status": result.status.value,
        "reason": result.reason.value,
        "detail": result.detail,
        "solve_time_s": result.solve_time_s,
        "events": [p.counts() for p in result.plans],
        "options": result.options,
        "stats": {k: v for k, v in result.stats.items() if _jsonable(v)},
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(
        f"{result.planner}: {result.explain()}, planned in {result.solve_time_s:.2f} s"
        + (f" for a budget of {format_bytes(budget)}" if budget else "")
    )
    for i, p in enumerate(result.plans):
        counts = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in p.counts().items() if n)
        print(f"  job {i} ({traces[i].meta.model}): {counts or 'no events'}")
    if args.out:
        print(f"wrote {args.out}" if result.plans else "no plan to write")
    return 0


def _jsonable(v: object) -> bool:
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        return False
    return True

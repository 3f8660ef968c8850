"""`memplan export PLAN --trace TRACE --out runtime_plan.json`: a plan for a
real PyTorch training loop (`memplan.validate.runtime.hooks.apply_plan`)."""

from __future__ import annotations

import argparse
import json
from collections import Counter

from memplan.traces.errors import MemplanError
from memplan.units import format_bytes, integer


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="turn a plan into a runtime plan for a PyTorch training loop",
        description=(
            "Map a plan's swaps and recomputes onto the tensors autograd saves (keyed by "
            "module path and pack order, as recorded at capture): which are offloaded and "
            "where they are prefetched, which modules are checkpointed and which of their ops "
            "recomputed. Use it with memplan.validate.runtime.hooks.apply_plan(model, runtime_plan)."
        ),
    )
    p.add_argument("plan", metavar="PLAN", help="plan file (memplan.plan/1)")
    p.add_argument("--trace", required=True, help="the trace the plan was made for")
    p.add_argument(
        "--job", type=integer(0, 1_000_000), default=0, help="which plan of the file (default 0)"
    )
    p.add_argument(
        "--out",
        required=True,
        metavar="FILE",
        help="runtime plan to write (memplan.runtime/2 JSON, .gz compresses)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memplan import outputs, provenance
    from memplan.commands.machine import one_trace
    from memplan.planners.core import io as plan_io
    from memplan.planners.core.plan import validate
    from memplan.traces.fields import printable
    from memplan.validate.runtime.io import save
    from memplan.validate.runtime.plan import Action, export

    outputs.check_file(args.out)  # before any work: NOTE [ Output paths ]
    trace = one_trace(args.trace, "export")
    result = plan_io.load(args.plan)
    if not 0 <= args.job < len(result.plans):
        raise MemplanError(f"--job={args.job}: {args.plan} has {len(result.plans)} plans")
    plan = result.plans[args.job]
    validate(plan, trace, f"{args.plan}: plans[{args.job}]")  # the rejection names the file
    rp = export(plan, trace, result.planner)
    with outputs.writing(args.out):
        save(rp, args.out)
    reasons = Counter(s.reason for s in rp.skipped)
    summary = {
        "out": args.out,
        "model": rp.model,
        "planner": rp.planner,
        "saved_tensors": rp.counts(),
        "offloaded_bytes": rp.held_bytes(frozenset({Action.OFFLOAD})),
        "kept_bytes": rp.held_bytes(),
        "regions": list(rp.regions),
        "recomputed_ops": len(rp.recompute),
        "skipped": dict(reasons),
        "provenance": provenance.of_command(args, [trace], None),
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    c = rp.counts()
    print(
        f"{printable(rp.model or args.trace)} ({printable(rp.planner)}): "
        f"{len(rp.saved)} saved tensors: "
        f"{c['keep']} kept, {c['offload']} offloaded "
        f"({format_bytes(summary['offloaded_bytes'])}), "
        f"{c['recompute']} recomputed and {c['region']} cached in checkpointed modules"
    )
    if rp.regions:
        print(f"checkpointed: {', '.join(rp.regions)} ({len(rp.recompute)} ops recomputed)")
    for reason, n in reasons.most_common():
        print(f"not covered: {n} event(s): {reason}")
    print(f"wrote {args.out}")
    return 0

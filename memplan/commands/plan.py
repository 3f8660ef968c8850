"""`memplan plan TRACE --planner NAME --gpu G`: one planner's plan for a trace."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from memplan.commands import machine
from memplan.commands.compare import options_of
from memplan.traces.fields import printable
from memplan.units import format_bytes

if TYPE_CHECKING:
    from memplan.runconfig import RunConfig


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="make a swap / recompute / release plan with one planner",
        description=(
            "Plan the trace(s) with one planner, check the plan, simulate it under the budget "
            "with the --fallback net (does it fit on its own, with the net, or not at all?), "
            "and write it as JSON."
        ),
    )
    p.add_argument(
        "traces",
        nargs="+",
        metavar="TRACE[:COUNT]",
        help="trace files, or zoo:NAME for shipped traces; TRACE:4 plans four jobs of that "
        f"trace together (at most {machine.MAX_JOBS} jobs)",
    )
    p.add_argument("--planner", required=True, help="tensile, capuchin, vdnn, checkpoint, ...")
    machine.add_gpu(p)
    machine.add_budget(p, "none")
    machine.add_allocator(p)
    machine.add_fallback(p)
    machine.add_latency(p)
    machine.add_lanes(p)
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a planner option (repeatable; KEY=VALUE or, as compare takes them, "
        "PLANNER.KEY=VALUE); see the planner's options dataclass",
    )
    p.add_argument("--out", metavar="PLAN", help="write the plan (memplan.plan/1 JSON) here")
    p.add_argument("--json", action="store_true", help="print the plan result summary as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memplan import outputs, provenance
    from memplan.planners import registry
    from memplan.planners.core import io as plan_io
    from memplan.planners.core.check import check

    if args.out is not None:  # an empty --out is refused, not ignored
        outputs.check_file(args.out)  # before any work: NOTE [ Output paths ]
    device = machine.device(args)
    traces = machine.parse_jobs(args.traces)
    machine.check_measured(args, traces, device.hw)
    budget = machine.resolve_budget(args, traces, device)
    from memplan.evaluator import sim_evaluator
    from memplan.plannerview import planner_view, rebound_result

    config = machine.run_config(args)
    sim_budget = budget if budget is not None else device.hw.memory_bytes
    evaluator = sim_evaluator(traces, device, sim_budget, config=config)
    seen, plan_budget = planner_view(traces, device, budget, config)
    result = registry.run(
        args.planner, seen, device, budget_bytes=plan_budget,
        options=options_of(args.planner, args.option),
        evaluator=evaluator,
    )  # fmt: skip
    result = rebound_result(result, traces)
    for p, t in zip(result.plans, traces, strict=False):
        check(p, t)
    fit = _simulated_fit(result.plans, traces, device, budget, config)
    prov = provenance.of_command(args, traces, device.hw)
    if args.out and result.plans:
        with outputs.writing(args.out):
            plan_io.save(result, args.out, prov)
    summary = {
        "planner": result.planner,
        "status": result.status.value,
        "reason": result.reason.value,
        "detail": result.detail,
        "solve_time_s": result.solve_time_s,
        "events": [p.counts() for p in result.plans],
        "options": result.options,
        "stats": {k: v for k, v in result.stats.items() if _jsonable(v)},
        "simulated": fit,
        "provenance": prov,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return 0
    print(
        f"{result.planner}: {printable(result.explain())}, planned in {result.solve_time_s:.2f} s"
        + (f" for a budget of {format_bytes(budget)}" if budget else "")
    )
    for i, p in enumerate(result.plans):
        counts = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in p.counts().items() if n)
        print(f"  job {i} ({printable(traces[i].meta.model)}): {counts or 'no events'}")
    if fit is not None:
        print(f"simulated: {fit['verdict']}")
    if args.out:
        print(f"wrote {args.out}" if result.plans else "no plan to write")
    return 0


def _simulated_fit(
    plans: list,
    traces: list,
    device: object,
    budget: int | None,
    config: RunConfig,
) -> dict | None:
    """The plan simulated for 2 iterations under the budget with `config`'s
    net: fit (alone / net / oom), iteration time, evictions (NOTE [ The
    safety net ])."""
    if not plans:
        return None
    from memplan.comparison import Fit, fit_of, planned_jobs
    from memplan.runconfig import Fallback
    from memplan.sim import simulate

    fallback = config.fallback
    sim = simulate(
        planned_jobs(traces, plans),
        device,
        iterations=2,
        budget=budget if budget is not None else device.hw.memory_bytes,
        oom=fallback.policy,
        check=False,
        **config.memory,
    )
    jobs = sim.jobs
    fit = fit_of(sim)
    iteration = max(j.iteration_time_s for j in jobs)
    evictions = sum(j.evictions for j in jobs)
    verdict = {
        Fit.ALONE: f"fits on its own, iteration {iteration * 1e3:.2f} ms",
        Fit.NET: f"fits with the {fallback} net ({evictions} evictions), "
        f"iteration {iteration * 1e3:.2f} ms",
        Fit.OOM: "runs out of memory"
        + ("" if fallback == Fallback.NONE else f" even with the {fallback} net"),
    }[fit]
    return {
        "fit": fit.value,
        "fallback": fallback.value,
        "iteration_time_s": None if fit == Fit.OOM else iteration,
        "evictions": evictions,
        "peak_bytes": sim.device_peak_bytes,
        "allocator": sim.allocator.value,
        "allocated_peak_bytes": sim.allocated_peak_bytes,
        "reserved_peak_bytes": sim.reserved_peak_bytes,
        "fragmentation_bytes": sim.fragmentation_bytes,
        "pinned_peak_bytes": sim.pinned_peak_bytes,
        "verdict": verdict,
    }


def _jsonable(v: object) -> bool:
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        return False
    return True

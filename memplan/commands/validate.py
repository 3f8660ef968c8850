"""`memplan validate TRACE --plan PLAN|--planner NAME`: simulated versus measured.

Exit code 0 when the plan computed bit-identical results to the vanilla
replay, 1 when it did not (the report says where), 2 for bad input or a plan
that cannot be replayed.
"""

from __future__ import annotations

import argparse
import json
import math

from memplan.commands import machine
from memplan.commands.compare import options_of
from memplan.planners.core.errors import PlanError
from memplan.traces.errors import MemplanError
from memplan.units import format_bytes, integer, parse_rate


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate",
        help="replay a plan with real tensors and compare it with the simulation",
        description=(
            "Measure op latencies and the copy lane with vanilla replays on the device, "
            "simulate the plan with them, replay the plan, and report predicted against "
            "measured steady iteration time and peak bytes with their errors, and whether "
            "the plan left every result bit-identical."
        ),
    )
    p.add_argument(
        "trace",
        metavar="TRACE",
        help="trace file (.json or .json.gz), or zoo:NAME for a shipped trace",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--plan", metavar="PLAN", help="plan file (memplan.plan/1) for this trace")
    src.add_argument(
        "--planner",
        metavar="NAME",
        help="plan on the measured device with this planner (tensile, vdnn, ...)",
    )
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or cuda:N")
    p.add_argument(
        "--bandwidth",
        metavar="RATE",
        help="throttle the copy lanes to this rate (2GB/s, 500MiB/s); default: the "
        "device's measured copy speed",
    )
    p.add_argument(
        "--iterations",
        type=integer(2, 1000),
        default=4,
        help="iterations per replay and simulation (default 4; the first is warm-up)",
    )
    p.add_argument(
        "--runs", type=integer(1, 100), default=3, help="runs to take medians over (default 3)"
    )
    p.add_argument(
        "--samples",
        type=integer(1, 100),
        default=3,
        help="vanilla/plan pairs per run, the least contended kept (default 3)",
    )
    p.add_argument(
        "--lanes",
        type=int,
        choices=(1, 2),
        default=1,
        help="copy lanes: 1 shared by both directions (default), 2 one per direction",
    )
    p.add_argument("--budget", help="device memory for --planner: 8GiB, 512MB or whole bytes")
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an option of --planner (repeatable; KEY=VALUE or PLANNER.KEY=VALUE)",
    )
    p.add_argument(
        "--seed", type=integer(0, 2**63 - 1), default=0, help="seed of the replays (default 0)"
    )
    p.add_argument(
        "--threads",
        type=integer(1, 1024),
        default=1,
        help="intra-op threads while measuring on CPU (default 1: a core is left to the copy lane)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memplan.hwmodels.hostmem import cache_host_allocations
    from memplan.planners.core import io as plan_io
    from memplan.validate.calibrate.simvsreal import validate_plan

    bandwidth = None if args.bandwidth is None else parse_rate(args.bandwidth, "--bandwidth")
    if machine.budget_fraction(args) is not None:  # machine.budget would read it as no budget
        raise MemplanError(f"--budget={args.budget!r}: validate takes bytes (8GiB), not a share")
    budget = machine.budget(args)
    trace = machine.one_trace(args.trace, "validate")
    target = trace.meta.target
    if target is not None and target.device.value != (
        "cuda" if args.device.startswith("cuda") else "cpu"
    ):
        raise MemplanError(
            f"{args.trace}: captured for {target.describe()}, whose kernels "
            f"{args.device} does not run: validate it on {target.device.value}, or capture "
            f"the model with --device {args.device}"
        )
    if args.plan:
        result = plan_io.load(args.plan, [trace])  # one plan, made for this trace
        plan: object = result.plans[0]
    else:
        plan = args.planner
    if args.option and not args.planner:
        raise MemplanError("--option applies to --planner")
    if not args.device.startswith("cuda"):
        cache_host_allocations()  # hwmodels/hostmem.py NOTE [ Host allocations ]
    try:
        report = validate_plan(
            trace,
            plan,  # type: ignore[arg-type]
            device=args.device,
            bandwidth=bandwidth,
            iterations=args.iterations,
            runs=args.runs,
            samples=args.samples,
            seed=args.seed,
            lanes=args.lanes,
            budget_bytes=budget,
            options=options_of(args.planner, args.option) if args.option else None,
            threads=args.threads if not args.device.startswith("cuda") else None,
        )
    except PlanError as e:  # a plan file's delays, checked on the measured device: name the file
        if not args.plan:
            raise
        raise PlanError(f"{args.plan}: {e}") from None
    if args.json:
        out = report.to_dict()
        out["trace"] = args.trace
        print(json.dumps(out, indent=2))
    else:
        print_report(report, args.trace)
    return 0 if report.correct else 1


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1e3:.2f} ms"


def _pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 100:+.1f}%"


def print_report(r: object, trace: str) -> None:
    from memplan.validate.calibrate.report import ValidationReport
    from memplan.validate.calibrate.simvsreal import PEAK_SPREAD

    assert isinstance(r, ValidationReport)
    lane = r.lane
    how = "throttled" if lane.throttled else "measured"
    events = ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in r.events.items() if n) or "none"
    print(
        f"{r.model or trace} on {r.device}: plan {r.planner}"
        + ("" if r.planner_feasible else " (the planner says infeasible)")
        + f"; events: {events}"
    )
    print(
        f"lane: {lane.bandwidth_bytes_per_s / 1e9:.2f} GB/s ({how}), "
        f"{lane.fixed_s * 1e6:.0f} us per transfer, {r.lanes} lane(s); "
        f"{r.iterations} iterations, medians of {r.runs} runs"
    )
    rows = [
        ("iteration (steady)", _ms(r.time_pred_s), _ms(r.time_meas_s), _pct(r.time_err)),
        (
            "peak",
            format_bytes(r.peak_pred_bytes),
            format_bytes(r.peak_meas_bytes),
            _pct(r.peak_err),
        ),
        ("stall / iteration", _ms(r.stall_pred_s), _ms(r.stall_meas_s), ""),
        ("recompute / iteration", _ms(r.recompute_pred_s), _ms(r.recompute_meas_s), ""),
        ("swapped out", format_bytes(r.bytes_d2h_pred), format_bytes(r.bytes_d2h_meas), ""),
        ("swapped in", format_bytes(r.bytes_h2d_pred), format_bytes(r.bytes_h2d_meas), ""),
    ]
    head = ("", "predicted", "measured", "error")
    widths = [max(len(row[k]) for row in (head, *rows)) for k in range(4)]
    for row in (head, *rows):
        print(
            "  ".join(
                c.ljust(w) if k == 0 else c.rjust(w)
                for k, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
    lo, hi = r.peak_pred_lo_bytes, r.peak_pred_hi_bytes
    if hi > lo:  # validate/calibrate/simvsreal.py NOTE [ Timing-sensitive peaks ]
        print(
            f"the simulated peak depends on timing: {format_bytes(lo)} to {format_bytes(hi)} "
            f"with compute {PEAK_SPREAD:.0%} faster or slower"
        )
    print(
        f"vanilla: {_ms(r.vanilla_time_s)} per iteration, peak {format_bytes(r.vanilla_peak_bytes)}"
    )
    waited = (
        ""
        if math.isnan(r.contention)
        else (f"; the compute thread waited for a CPU {r.contention * 100:.0f}% of the time")
    )
    print(
        f"machine: vanilla replays around the plan's {r.drift * 100:.1f}% apart{waited} "
        f"(timings are only as good as these are low)"
    )
    verdict = "bit-identical to the vanilla replay" if r.correct else f"DIFFERS: {r.mismatch}"
    print(f"results: {verdict}")

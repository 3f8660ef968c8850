"""`memplan compare TRACE[:COUNT]... --gpu G`: every planner side by side."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from memplan.commands import machine
from memplan.hwmodels.device import DeviceModel
from memplan.traces.errors import MemplanError
from memplan.traces.fields import printable
from memplan.traces.model import Trace
from memplan.units import integer, number


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "compare",
        help="plan with several planners, check, simulate and score them against vanilla",
        description=(
            "Plan the jobs with each planner, check every plan, simulate it and the vanilla "
            "run on the same GPU, and print planner, fit (alone: the plan fits the budget on "
            "its own; net: it finished because the --fallback net evicted; OOM), peak, MSR, "
            "EOR, CBR, steady iteration time, gap to the best lower bound, stall, bytes moved "
            "and planning time. The rows 'passive' and 'dtr' are witnesses: no plan, the "
            "online policy alone."
        ),
    )
    p.add_argument(
        "traces",
        nargs="*",
        metavar="TRACE[:COUNT]",
        help=f"trace files; TRACE:4 runs four jobs of that trace together (at most "
        f"{machine.MAX_JOBS} jobs; more with --job and --scenario)",
    )
    machine.add_gpu(p)
    p.add_argument(
        "--planners",
        default="all",
        help="'all' (default: every heuristic planner and the passive and dtr witnesses) "
        "or a comma-separated list of planner names; cpsat, the exact baseline, and "
        "swapadvisor, a genetic search of up to --time-limit, run only when named",
    )
    p.add_argument(
        "--time-limit",
        type=number(0, 86400, lo_open=True),
        default=60.0,
        metavar="S",
        help="cpsat's time limit in seconds (default 60)",
    )
    machine.add_budget(p, "none; capuchin then gets the peak TENSILE reached")
    machine.add_allocator(p)
    machine.add_fallback(p)
    machine.add_lanes(p)
    p.add_argument(
        "--iterations", type=integer(1, 1000), default=3, help="simulated iterations (default 3)"
    )
    machine.add_latency(p)
    machine.add_workload(p)
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="PLANNER.KEY=VALUE",
        help="a planner option, e.g. checkpoint.segments=4 (repeatable)",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="write the plans, report.md, report.json, memory.png and snapshots/ (a PyTorch "
        "memory snapshot per simulation, vanilla.pickle and PLANNER.pickle: `python -m "
        "torch.cuda._memory_viz trace_plot`, pytorch.org/memory_viz, `memplan inspect`) to DIR",
    )
    p.add_argument(
        "--dynamic",
        metavar="METHODS",
        help="instead of the planners: run each method's scheduler over the workload "
        "(tensile_cs, tensile_up, capuchin, vdnn or 'all': plans made at arrivals, EWMA "
        "re-plans, Capuchin's measured first iteration and feedback) and print MSR, EOR, "
        "CBR, passive swaps and stalls per phase (cold start, steady state between "
        "arrivals, after a plan update); --budget defaults to 70%% of the vanilla peak",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run)


def parse_jobs(specs: list[str]) -> list[Trace]:
    """`path` or `path:COUNT` -> that trace COUNT times (NOTE [ Job copies ]
    in memplan/commands/machine.py)."""
    return machine.parse_jobs(specs)


def planner_names(text: str) -> list[str]:
    """`all` is every heuristic planner (not vanilla, not cpsat or
    swapadvisor: searches that take their whole time limit) and the
    witnesses; names may be mixed with it: `all,cpsat`."""
    from memplan.comparison import WITNESSES
    from memplan.planners import registry

    whole = registry.Search.WHOLE_LIMIT
    heuristics = [
        n for n in registry.names() if n != "vanilla" and registry.traits(n).search is not whole
    ]
    names: list[str] = []
    for n in (x.strip() for x in text.split(",")):
        for name in [*heuristics, *WITNESSES] if n == "all" else [n] if n else []:
            if name not in names:
                if name not in WITNESSES:
                    registry.get(name)
                names.append(name)
    if not names:
        raise MemplanError("--planners: give 'all' or planner names separated by commas")
    return names


def parse_options(items: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in items:
        planner, dot, kv = item.partition(".")
        if not dot or "=" not in kv:
            raise MemplanError(f"--option {item!r}: expected PLANNER.KEY=VALUE")
        out.setdefault(planner, []).append(kv)
    return out


def options_of(planner: str, items: list[str]) -> list[str]:
    """`--option` items of the commands that run one planner (`plan`,
    `validate`): KEY=VALUE, or PLANNER.KEY=VALUE as `compare` takes them
    when PLANNER is that planner (an option key has no dot)."""
    out = []
    for item in items:
        key, eq, value = item.partition("=")
        head, dot, rest = key.partition(".")
        if eq and dot:
            if head.strip() != planner:
                raise MemplanError(
                    f"--option {item!r}: an option of {head.strip()!r}, "
                    f"but the planner is {planner!r}"
                )
            item = f"{rest}={value}"
        out.append(item)
    return out


def run(args: argparse.Namespace) -> int:
    from memplan import provenance, report
    from memplan.comparison import compare_planners
    from memplan.outputs import check_dir
    from memplan.scenario import JobMix

    if args.out is not None:  # an empty --out is refused, not ignored
        check_dir(args.out)  # before any work: NOTE [ Output paths ]
    hw = machine.hardware(args)
    latency = machine.latency_model(args.latency)
    names = planner_names(args.planners)
    options = parse_options(args.option)
    if "cpsat" in names:
        extra = [f"time_limit_s={args.time_limit}"]
        options["cpsat"] = extra + options.get("cpsat", [])
    pairs, moves = machine.workload(args)
    traces = [t for _s, t in pairs]
    for spec, _t in pairs:
        if spec.plan is not None:
            raise MemplanError(f"--scenario: job {spec.trace!r} names a plan; compare plans itself")
    mix = JobMix(tuple(s for s, _t in pairs), moves)
    machine.check_measured(args, traces, hw)
    device = DeviceModel(hw, latency, lanes=args.lanes)
    if args.dynamic is not None:
        from memplan.dynamic_report import run_command

        return run_command(args, mix, traces, device)
    budget = machine.resolve_budget(args, traces, device)  # a share: cut to the device, warned
    tty = sys.stderr.isatty()

    def progress(msg: str) -> None:
        if tty:
            print(f"\r\033[K{msg} ...", end="", file=sys.stderr, flush=True)

    c = compare_planners(
        traces,
        device,
        names,
        budget=budget,
        iterations=args.iterations,
        options=options,
        progress=progress,
        config=machine.run_config(args),
        mix=mix,
    )
    if tty:
        print("\r\033[K", end="", file=sys.stderr)
    prov = provenance.of_command(args, traces, hw, seed=moves.seed)
    written = report.write(c, Path(args.out), prov) if args.out else []
    if args.json:
        print(report.to_json(c, prov))
    else:
        print(printable(report.text_table(c)))
        if written:
            print(f"\nwrote {Path(args.out)}/: {', '.join(written)}")
    return 0

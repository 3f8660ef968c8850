"""`memplan simulate TRACE... --gpu NAME`: what plans cost on a model of one GPU."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from memplan.commands import machine
from memplan.hwmodels.device import DeviceModel
from memplan.planners.core import io as plan_io
from memplan.planners.core.check import check_delays
from memplan.planners.core.errors import PlanError
from memplan.planners.core.evaluate import OomPolicy
from memplan.planners.core.plan import Plan, validate
from memplan.planners.heuristics.vanilla import release_only_plan, vanilla_plan
from memplan.sim import Job, SimResult, simulate
from memplan.traces.fields import printable
from memplan.traces.io import atomic_write_bytes
from memplan.traces.model import Trace
from memplan.units import format_bytes, integer

BUILTIN_PLANS = {"vanilla": vanilla_plan, "release_only": release_only_plan}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate training steps under memory plans on one GPU",
        description=(
            "Run one or more traces together on a discrete-event model of one GPU "
            "(compute, PCIe lanes, device memory), each under its plan, and report "
            "iteration time, peak memory, stalls and bytes moved per job."
        ),
    )
    p.add_argument(
        "traces",
        nargs="*",
        metavar="TRACE[:COUNT]",
        help="trace files (.json or .json.gz), or zoo:NAME for shipped traces; TRACE:4 runs "
        f"four jobs of that trace, arriving at 0 (at most {machine.MAX_JOBS} jobs; more with "
        "--job and --scenario)",
    )
    machine.add_gpu(p)
    p.add_argument(
        "--plan",
        action="append",
        default=[],
        metavar="PLAN",
        help="plan file (memplan.plan/1), or 'vanilla' / 'release_only'; the plans of all "
        "--plan options go to the traces in order (one built-in name alone goes to every "
        "trace); default: vanilla",
    )
    machine.add_latency(p)
    p.add_argument(
        "--iterations", type=integer(1, 1000), default=3, help="iterations per job (default 3)"
    )
    machine.add_lanes(p)
    machine.add_budget(p)
    machine.add_allocator(p)
    machine.add_workload(p)
    p.add_argument(
        "--fallback",
        "--oom",
        dest="fallback",
        choices=["none", *(x.value for x in OomPolicy)],
        default="none",
        help="when an allocation does not fit: none (default; also 'fail': the job stops "
        "out of memory), stall (wait for swap-outs in flight), passive (Capuchin's LRU "
        "swapping to host) or dtr (DTR's eviction by cost / (bytes x staleness), "
        "rematerialising by recompute or fetch); --oom is the old name",
    )
    p.add_argument(
        "--out",
        metavar="DIR",
        help="write result.json, timeline.json, memory.png, gantt.png and snapshot.pickle (a "
        "PyTorch memory snapshot: `python -m torch.cuda._memory_viz trace_plot`, "
        "pytorch.org/memory_viz, `memplan inspect`) to DIR",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.set_defaults(func=run)


def plans_for(
    sources: list[str], traces: list[Trace], device: DeviceModel | None = None
) -> list[Plan]:
    """One plan per trace from the `--plan` options (see the option's help);
    with `device`, a plan file's delays must fit the iteration on it
    (planners/core/check.py NOTE [ Delays within the iteration ])."""
    if not sources:
        return [vanilla_plan(t) for t in traces]
    if len(sources) == 1 and sources[0] in BUILTIN_PLANS:
        return [BUILTIN_PLANS[sources[0]](t) for t in traces]
    # (label, plan file entry or a built-in's name), in trace order
    entries: list[tuple[str, Plan | str]] = []
    for src in sources:
        if src in BUILTIN_PLANS:
            entries.append((src, src))
        else:
            result = plan_io.load(src)
            entries += [(f"{src}: plans[{k}]", p) for k, p in enumerate(result.plans)]
    if len(entries) != len(traces):
        raise PlanError(f"--plan: {len(entries)} plans for {len(traces)} traces (one per trace)")
    plans = []
    for (where, entry), trace in zip(entries, traces, strict=True):
        if isinstance(entry, str):
            plans.append(BUILTIN_PLANS[entry](trace))
        else:
            validate(entry, trace, where)
            if device is not None:
                check_delays(entry, trace, device, where)
            plans.append(entry)
    return plans


def own_plan(source: str, trace: Trace, device: DeviceModel) -> Plan:
    """A scenario job's own `plan`: a built-in name, or a file of one plan."""
    if source in BUILTIN_PLANS:
        return BUILTIN_PLANS[source](trace)
    plans = plan_io.load(source).plans
    if len(plans) != 1:
        raise PlanError(f"{source}: {len(plans)} plans; a scenario job takes a file of one plan")
    validate(plans[0], trace, source)
    check_delays(plans[0], trace, device, source)
    return plans[0]


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from memplan import provenance
    from memplan.outputs import check_dir

    if args.out is not None:  # an empty --out is refused, not ignored
        check_dir(args.out)  # before any work: NOTE [ Output paths ]
    device = machine.device(args)
    pairs, moves = machine.workload(args)
    traces = [t for _s, t in pairs]
    machine.check_measured(args, traces, device.hw)
    budget = machine.resolve_budget(args, traces, device)
    plans = plans_for(args.plan, traces, device)
    jobs = [
        Job(
            t,
            own_plan(spec.plan, t, device) if spec.plan else p,
            arrival_s=spec.arrival_s,
            iterations=spec.iterations,
            name=spec.name or _job_name(spec.trace, t),
            departure_s=spec.departure_s,
        )
        for (spec, t), p in zip(pairs, plans, strict=True)
    ]
    total = sum(args.iterations if j.iterations is None else j.iterations for j in jobs)
    quiet = total <= 100 or not sys.stderr.isatty()  # a bar for long runs only
    with tqdm(total=total, unit="it", desc="simulate", disable=quiet) as bar:
        result = simulate(
            jobs,
            device,
            iterations=args.iterations,
            budget=budget,
            oom=OomPolicy.FAIL if args.fallback == "none" else OomPolicy(args.fallback),
            progress=None if quiet else (lambda done: bar.update(done - bar.n)),
            **machine.run_config(args, net=False).memory,
            **moves.options(),
        )
    summary = result.to_dict()
    summary["latency"] = args.latency
    summary["traces"] = [spec.trace for spec, _t in pairs]
    summary["provenance"] = provenance.of_command(args, traces, device.hw, seed=moves.seed)
    if args.out:
        write_report(result, summary, Path(args.out))
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print_table(result, args.latency)
        if args.out:
            print(
                f"\nwrote {Path(args.out)}/result.json, timeline.json, memory.png, gantt.png, "
                "snapshot.pickle"
            )
    return 0


def _job_name(path: str, trace: Trace) -> str:
    return trace.meta.model or Path(path).name.split(".")[0]


def write_report(result: SimResult, summary: dict, out: Path) -> None:
    """result.json, timeline.json (Perfetto), memory.png, gantt.png and
    snapshot.pickle (PyTorch's memory snapshot, NOTE [ Snapshot format ] in
    sim/snapshot.py) in `out`, which appears whole or not at all
    (NOTE [ Report directories ] in memplan/outputs.py)."""
    from memplan.outputs import report_dir
    from memplan.sim.exports import gantt_figure, memory_figure, save_figure, write_chrome_trace
    from memplan.sim.snapshot import write_snapshot

    with report_dir(out) as tmp:
        atomic_write_bytes(tmp / "result.json", (json.dumps(summary, indent=2) + "\n").encode())
        write_chrome_trace(result, tmp / "timeline.json")
        save_figure(memory_figure(result), tmp / "memory.png")
        save_figure(gantt_figure(result), tmp / "gantt.png")
        write_snapshot(result, tmp / "snapshot.pickle")


def _ms(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 1e3:.3f} ms"


def _oom_text(at: tuple[int, int, int] | None) -> str:
    if at is None:
        return "-"
    it, op, _b = at
    return f"iteration {it} " + ("start" if op < 0 else f"op {op}")


def _net_text(j: Any) -> str:
    """What the OOM policy did for the job: evictions and bytes, or '-'."""
    if not j.net_used:
        return "-"
    return f"{j.evictions} ev, {format_bytes(j.evicted_bytes)}"


def print_table(result: SimResult, latency: str) -> None:
    lanes = "1 shared lane" if len(result.lanes) == 1 else "2 lanes (h2d, d2h)"
    print(
        f"{printable(result.hardware)}: {lanes}, budget {format_bytes(result.budget_bytes)}, "
        f"oom {result.oom_policy.value}, latency {latency}"
    )
    head = (
        "job",
        "name",
        "iteration",
        "peak",
        "stall",
        "recompute",
        "H2D",
        "D2H",
        "net",
        "OOM",
    )
    rows = [
        (
            str(j.index),
            printable(j.name),
            _ms(j.iteration_time_s),
            format_bytes(j.device_peak_bytes),
            _ms(j.stall_s),
            _ms(j.recompute_s),
            format_bytes(j.bytes_h2d),
            format_bytes(j.bytes_d2h),
            _net_text(j),
            _oom_text(j.oom_at),
        )
        for j in result.jobs
    ]
    if any(j.start_s > 0 or j.departed for j in result.jobs):  # a scenario: when each ran
        head += ("arrived", "ended")
        rows = [
            (*r, _ms(j.start_s), _ms(j.end_s) + (" (left)" if j.departed else ""))
            for r, j in zip(rows, result.jobs, strict=True)
        ]
    widths = [max(len(r[k]) for r in (head, *rows)) for k in range(len(head))]
    for r in (head, *rows):
        print(
            "  ".join(
                c.ljust(w) if k < 2 else c.rjust(w)
                for k, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    short = sum(1 for j in result.jobs if j.oom_at is not None)
    end = f"{short} of {len(result.jobs)} job(s) ran out of memory" if short else "makespan"
    if result.allocator.value != "exact" or result.context_reserve_bytes:
        print(f"\n{memory_text(result)}")
    print(
        f"\npeak {format_bytes(result.device_peak_bytes)} of {format_bytes(result.budget_bytes)}; "
        f"pinned host {format_bytes(result.pinned_peak_bytes)}; "
        + (end if short else f"{end} {_ms(result.makespan_s)}")
    )


def memory_text(result: SimResult) -> str:
    """The allocator's peaks in one line (NOTE [ Device peaks ] in sim/metrics.py)."""
    f, kind = format_bytes, result.allocator.value
    held = {
        "exact": f"tensors {f(result.allocated_peak_bytes)}",
        "caching": f"allocated {f(result.allocated_peak_bytes)}, reserved "
        f"{f(result.reserved_peak_bytes)}, fragmentation {f(result.fragmentation_bytes)} at the "
        "reserved peak",
        "smartpool": f"live {f(result.allocated_peak_bytes)}, footprint "
        f"{f(result.reserved_peak_bytes)} ({f(result.fragmentation_bytes)} over the live bound)",
    }[kind]
    return (
        f"allocator {kind}: {held}; {len(result.jobs)} CUDA context(s) of "
        f"{f(result.context_reserve_bytes)}; device peak {f(result.device_peak_bytes)}"
    )

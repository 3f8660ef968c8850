"""The options every command that plans or simulates shares: which GPU, which
latency model, how many PCIe lanes, what memory budget -- defined once here."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memplan.traces.errors import MemplanError
from memplan.units import format_bytes, parse_size

if TYPE_CHECKING:
    from memplan.hwmodels.device import DeviceModel
    from memplan.hwmodels.latency import LatencyModel
    from memplan.hwmodels.profile import Hardware
    from memplan.runconfig import RunConfig
    from memplan.traces.model import Trace

LATENCY_CHOICES = "kernel|roofline|measured|mlp|MODEL"
DEFAULT_LATENCY = "kernel"  # the GPU kernel model; the roofline on a cpu profile


def add_gpu(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", required=True, help="hardware profile name (rtx-a6000) or .toml path")


def add_latency(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--latency",
        default=DEFAULT_LATENCY,
        metavar=LATENCY_CHOICES,
        help="op latency model: kernel (default: the kernels PyTorch runs on the GPU, fitted "
        "on measured GPUs; the roofline on a cpu profile), roofline, measured (the trace's durations, "
        "refused when they were measured on another kind of device than --gpu's), "
        "mlp (the shipped model) or a saved latency model file",
    )
    p.add_argument(
        "--allow-foreign-measurements",
        action="store_true",
        help="with --latency measured: use durations measured on cpu for a GPU profile "
        "(or on cuda for a cpu profile) anyway",
    )


def add_lanes(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lanes",
        type=int,
        choices=(1, 2),
        default=1,
        help="1: one PCIe lane shared by both directions (default); 2: one per direction",
    )


def add_budget(p: argparse.ArgumentParser, default: str = "the GPU's memory") -> None:
    p.add_argument(
        "--budget",
        help="device memory for all jobs, their CUDA contexts included (--allocator, "
        "--context-reserve): 8GiB, 512MB, whole bytes, or 60%% of the jobs' vanilla peak "
        "with the same allocator; at most the GPU's memory (a share above it is cut to it, "
        f"with a warning) (default: {default})",
    )


def add_allocator(p: argparse.ArgumentParser) -> None:
    """`--allocator` and `--context-reserve` (NOTE [ The memory a GPU really
    uses ] in sim/simulate.py)."""
    from memplan.sim.state import Allocator

    p.add_argument(
        "--allocator",
        choices=[a.value for a in Allocator],
        default="exact",
        help="device memory model: exact (default: tensor bytes only), caching (PyTorch's "
        "CUDA caching allocator per job: 512 B rounding, 2 MiB / 20 MiB segments, "
        "fragmentation; plus each job's CUDA context and op workspaces) or smartpool "
        "(SmartPool's offline best-fit layout per job, with contexts and workspaces)",
    )
    p.add_argument(
        "--context-reserve",
        metavar="BYTES",
        help="device memory each job's CUDA context and library handles take, inside the "
        "budget: 400MiB, 0, ... (default: the profile's estimate, see `memplan hw show`, "
        "with caching or smartpool; none with exact)",
    )


def run_config(args: argparse.Namespace, *, net: bool = True) -> RunConfig:
    """`--allocator`, `--context-reserve` and `--fallback` as the run's
    `RunConfig` (the defaults for a command without them). `net=False`:
    --fallback is not read (`simulate`'s is the simulator's OOM policy
    itself, not a net under a plan) and the config's net is none."""
    from memplan.runconfig import RunConfig

    text = getattr(args, "context_reserve", None)
    reserve = None if text is None else parse_size(text, "--context-reserve", least=0)
    fallback = getattr(args, "fallback", "none") if net else "none"
    return RunConfig(getattr(args, "allocator", "exact"), reserve, fallback)


def add_fallback(p: argparse.ArgumentParser) -> None:
    from memplan.runconfig import Fallback

    p.add_argument(
        "--fallback",
        choices=[f.value for f in Fallback],
        default="none",
        help="the runtime safety net when a plan leaves memory short: none (default: the run "
        "stops out of memory), passive (Capuchin's LRU swapping to host) or dtr (DTR's "
        "eviction by cost / (bytes x staleness), rematerialising by recompute or fetch)",
    )


def latency_model(spec: str) -> LatencyModel:
    """The `--latency` choice as a `LatencyModel` (imported lazily)."""
    from memplan.hwmodels.latency import Measured, Roofline

    if spec == "kernel":
        from memplan.hwmodels.kernels import KernelModel

        return KernelModel()
    if spec == "roofline":
        return Roofline()
    if spec == "measured":
        return Measured()
    from memplan.hwmodels.mlp import MLPLatency

    if spec != "mlp" and (
        not spec.strip() or (Path(spec).is_file() and not Path(spec).stat().st_size)
    ):
        what = "an empty file" if spec.strip() else "empty"
        raise MemplanError(f"--latency={spec!r}: {what}; expected {LATENCY_CHOICES}")

    return MLPLatency.load(None if spec == "mlp" else spec)


# NOTE [ Job copies ]
# `TRACE:N` runs N copies of one trace as N jobs on one GPU (loaded once).
# Every command that takes traces reads them with `parse_jobs`: plan,
# compare and simulate run the copies; commands about one trace take `:1`
# and refuse more. N and the jobs of all arguments together are capped at
# MAX_JOBS: each job costs the planners and the simulator per-op arrays, and
# `TRACE:1000` once grew to 14 GB before printing anything. A file whose
# name itself ends in `:N` is read as that file.
MAX_JOBS = 64


def job_specs(specs: list[str]) -> list[tuple[str, int]]:
    """`path` or `path:N` (a path may be `zoo:NAME`) -> (path, N), checked
    against MAX_JOBS (NOTE [ Job copies ])."""
    out: list[tuple[str, int]] = []
    for spec in specs:
        path, count = spec, 1
        head, sep, tail = spec.rpartition(":")
        if sep and head and not Path(spec).exists():
            if tail.isascii() and tail.isdigit():
                if len(tail) > 6 or not 1 <= int(tail) <= MAX_JOBS:
                    raise MemplanError(
                        f"{spec!r}: COUNT after ':' must be from 1 to {MAX_JOBS} (jobs on one GPU)"
                    )
                path, count = head, int(tail)
            elif head != "zoo" and "/" not in tail and "." not in tail:
                raise MemplanError(f"{spec!r}: COUNT after ':' must be a positive integer")
        out.append((path, count))
    total = sum(n for _, n in out)
    if total > MAX_JOBS:
        raise MemplanError(f"{total} jobs: at most {MAX_JOBS} jobs run together on one GPU")
    return out


def parse_jobs(specs: list[str]) -> list[Trace]:
    """The traces of `TRACE[:N]` arguments, each N times (loaded once)."""
    from memplan.traces import io

    traces: list[Trace] = []
    for path, count in job_specs(specs):
        traces += [io.load(path)] * count
    return traces


def one_trace(spec: str, command: str) -> Trace:
    """The trace of a command that works on one job: `TRACE` or `TRACE:1`."""
    from memplan.traces import io

    ((path, count),) = job_specs([spec])
    if count != 1:
        raise MemplanError(
            f"{spec!r}: `memplan {command}` works on one trace; COUNT is for plan, "
            "compare and simulate"
        )
    return io.load(path)


# NOTE [ Measured on ]
# Durations a capture measured belong to the device they were measured on:
# the trace's `meta.device` (cpu, cuda, cuda:N), and `meta.extra
# ["measured_on"]` with the CPU's description, threads and how busy the
# other cores were. Profiles carry no device kind, so a profile whose name
# starts with "cpu" (cpu-local, what `microbench --profile-out` writes on
# CPU) is a CPU and every other one a GPU. `--latency measured` with a trace
# measured on one kind and a profile of the other is refused -- CPU op
# times on a GPU's lanes and memory are 10-100x off -- unless the user passes
# --allow-foreign-measurements. Which GPU model measured them is not checked:
# profile names and CUDA device names do not match reliably.
def device_kind(name: str) -> str:
    """cpu or cuda: the kind of device `name` (a device or a profile name) is."""
    return "cpu" if name.lower().startswith("cpu") else "cuda"


def check_measured(args: argparse.Namespace, traces: list[Trace], hw: Hardware) -> None:
    """`--latency measured` only with durations measured on the profile's kind
    of device (NOTE [ Measured on ])."""
    if getattr(args, "latency", None) != "measured" or args.allow_foreign_measurements:
        return
    for trace in traces:
        on = trace.meta.device
        measured = any(op.duration_us is not None for op in trace.ops)
        if measured and on not in ("", "meta") and device_kind(on) != device_kind(hw.name):
            raise MemplanError(
                f"--latency measured: {trace.meta.model or 'the trace'}'s durations were "
                f"measured on {on}, and {hw.name} is a "
                f"{'CPU' if device_kind(hw.name) == 'cpu' else 'GPU'} profile; "
                "capture on that device, use --latency roofline or mlp, or pass "
                "--allow-foreign-measurements"
            )


def hardware(args: argparse.Namespace) -> Hardware:
    from memplan.hwmodels.profile import load_hardware

    return load_hardware(args.gpu)


def device(args: argparse.Namespace) -> DeviceModel:
    """`--gpu`, `--latency` and `--lanes` (1 when the command has none) as the
    `DeviceModel` planners and the simulator cost with."""
    from memplan.hwmodels.device import DeviceModel

    return DeviceModel(hardware(args), latency_model(args.latency), getattr(args, "lanes", 1))


def budget(args: argparse.Namespace) -> int | None:
    """`--budget` in bytes, or None when not given or given as a share of
    the vanilla peak (`budget_fraction`)."""
    if args.budget is None or budget_fraction(args) is not None:
        return None
    return parse_size(args.budget, "--budget")


# NOTE [ Budgets above the device ]
# A budget in bytes larger than the GPU's memory is refused: it plans for
# memory the device does not have (to study a larger GPU, pass a profile of
# it, a .toml path). A share of the vanilla peak (`--budget 150%`) is not the
# user's figure in bytes: when it comes out above the device it is cut to the
# device's memory, with a warning on stderr.
def check_budget(nbytes: int | None, hw: Hardware, args: argparse.Namespace) -> int | None:
    """`nbytes` checked against `hw`'s memory (NOTE [ Budgets above the device ]),
    a cut share warned about on stderr."""
    nbytes, cut = _within_device(nbytes, hw, args)
    if cut:
        print(f"warning: {cut}", file=sys.stderr)
    return nbytes


def _within_device(
    nbytes: int | None, hw: Hardware, args: argparse.Namespace
) -> tuple[int | None, str]:
    """(`nbytes`, "") if it fits `hw`; a share above it cut to the device's
    memory, with what was cut in words; a size above it is an error."""
    if nbytes is None or nbytes <= hw.memory_bytes:
        return nbytes, ""
    have = f"{hw.name} has {format_bytes(hw.memory_bytes)} ({hw.memory_bytes} B)"
    if budget_fraction(args) is None:
        raise MemplanError(
            f"--budget={args.budget!r} is more than the device memory: {have}; "
            "use the profile of a larger GPU (--gpu NAME or a .toml path)"
        )
    cut = (
        f"--budget {args.budget} is {format_bytes(nbytes)}, more than the device memory: "
        f"{have}; using {format_bytes(hw.memory_bytes)}"
    )
    return hw.memory_bytes, cut


def budget_fraction(args: argparse.Namespace) -> float | None:
    """`--budget 60%` as 0.6; None when the budget is not a percentage."""
    text = (args.budget or "").strip()
    if not text.endswith("%"):
        return None
    try:
        share = float(text[:-1]) / 100
    except ValueError:
        share = math.nan
    if not 0 < share <= 10:
        raise MemplanError(f"--budget={args.budget!r}: a share must be a number in (0%, 1000%]")
    return share


def resolve_budget(args: argparse.Namespace, traces: list, device: DeviceModel) -> int | None:
    """`--budget` in bytes; a percentage is of the jobs' vanilla peak, from a
    vanilla simulation of them without a budget; a cut share warned about."""
    nbytes, cut = resolve_budget_quietly(args, traces, device)
    if cut:
        print(f"warning: {cut}", file=sys.stderr)
    return nbytes


def resolve_budget_quietly(
    args: argparse.Namespace, traces: list, device: DeviceModel
) -> tuple[int | None, str]:
    """`resolve_budget`, with what a cut share says returned instead of
    printed (a sweep puts it in its record's reason)."""
    share = budget_fraction(args)
    if share is None:
        return _within_device(budget(args), device.hw, args)
    from memplan.comparison import vanilla_peak

    peak = vanilla_peak(traces, device, run_config(args, net=False))  # no plan, no net
    return _within_device(int(peak * share), device.hw, args)


# ---- workloads: arrivals, departures, what moves (memplan/scenario.py) -------------
def add_workload(p: argparse.ArgumentParser) -> None:
    """--job, --scenario, --jitter, --usage, --lane-slowdown, --seed."""
    from memplan.units import integer, number

    p.add_argument(
        "--job",
        action="append",
        default=[],
        metavar="TRACE@T:N",
        help="a job arriving later: TRACE as the positional traces take it, @T its arrival "
        "(e.g. @2.5s, @500ms; default @0s), :N its iterations or :until=T its departure "
        f"(it then iterates until T, at most {MAX_ITERATIONS_UNTIL} times); repeatable",
    )
    p.add_argument(
        "--scenario",
        metavar="FILE.toml",
        help="a scenario file: jobs with arrival_s, iterations or departure_s, an optional "
        "random launch order, jitter, usage and lane slowdowns (README, 'Scenarios')",
    )
    p.add_argument(
        "--jitter",
        type=number(0, 2),
        metavar="SIGMA",
        help="noise on every kernel: a log-normal factor of mean 1 and sigma SIGMA, drawn "
        "from --seed (default 0: none)",
    )
    p.add_argument(
        "--usage",
        type=number(0, 1),
        metavar="U",
        help="load from outside the simulated jobs, a fraction of the device: every kernel "
        "is predicted at usage U (default 0); the jobs' own sharing is the compute queue",
    )
    p.add_argument(
        "--lane-slowdown",
        action="append",
        default=[],
        metavar="Fx@T1-T2",
        help="PCIe lanes F times slower from T1 to T2, e.g. 4x@1s-3s (repeatable)",
    )
    p.add_argument(
        "--seed", type=integer(0, 2**32 - 1), help="seed of the jitter (default: the file's, or 0)"
    )


MAX_ITERATIONS_UNTIL = 1000


def workload(args: argparse.Namespace) -> tuple[list[tuple[Any, Trace]], Any]:
    """(job spec, trace) per job -- the positional traces (arriving at 0),
    then --job, then the scenario file's -- and the `Scenario` of what moves,
    command-line options over the file's."""
    from dataclasses import replace

    from memplan import scenario as sc
    from memplan.traces import io

    specs = [
        sc.JobSpec(path)
        for path, count in job_specs(list(getattr(args, "traces", None) or []))
        for _ in range(count)
    ]
    specs += [sc.job_spec(text) for text in args.job]
    base = sc.load(args.scenario) if args.scenario else sc.Scenario()
    specs += list(base.jobs)
    if not specs:
        raise MemplanError("no jobs: give traces, --job or --scenario")
    if len(specs) > MAX_JOBS:
        raise MemplanError(f"{len(specs)} jobs: at most {MAX_JOBS} jobs run together on one GPU")
    specs = [
        replace(s, iterations=MAX_ITERATIONS_UNTIL)
        if s.departure_s is not None and s.iterations is None
        else s
        for s in specs
    ]
    loaded: dict[str, Trace] = {}
    out = []
    for s in specs:
        if s.trace not in loaded:
            loaded[s.trace] = io.load(s.trace)
        out.append((s, loaded[s.trace]))
    moves = replace(
        base,
        jobs=(),
        seed=base.seed if args.seed is None else args.seed,
        jitter=base.jitter if args.jitter is None else args.jitter,
        usage=base.usage if args.usage is None else args.usage,
        lane_slowdowns=base.lane_slowdowns + tuple(sc.lane_slowdown(x) for x in args.lane_slowdown),
    )
    return out, moves

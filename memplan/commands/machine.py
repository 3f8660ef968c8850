"""The options every command that plans or simulates shares: which GPU, which
latency model, how many PCIe lanes, what memory budget -- defined once here."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

from memplan.traces.errors import MemplanError
from memplan.units import parse_size

if TYPE_CHECKING:
    from memplan.hwmodels.device import DeviceModel
    from memplan.hwmodels.latency import LatencyModel
    from memplan.hwmodels.profile import Hardware

LATENCY_CHOICES = "roofline|measured|mlp|MODEL"


def add_gpu(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gpu", required=True, help="hardware profile name (rtx-a6000) or .toml path")


def add_latency(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--latency",
        default="roofline",
        metavar=LATENCY_CHOICES,
        help="op latency model: roofline (default), measured (the trace's durations), "
        "mlp (the shipped model) or a saved latency model file",
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
        help="device memory for all jobs: 8GiB, 512MB, bytes, or 60%% of the jobs' vanilla "
        f"peak (default: {default})",
    )


def add_fallback(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--fallback",
        choices=("none", "passive", "dtr"),
        default="none",
        help="the runtime safety net when a plan leaves memory short: none (default: the run "
        "stops out of memory), passive (Capuchin's LRU swapping to host) or dtr (DTR's "
        "eviction by cost / (bytes x staleness), rematerialising by recompute or fetch)",
    )


def latency_model(spec: str) -> LatencyModel:
    """The `--latency` choice as a `LatencyModel` (imported lazily)."""
    from memplan.hwmodels.latency import Measured, Roofline

    if spec == "roofline":
        return Roofline()
    if spec == "measured":
        return Measured()
    from memplan.hwmodels.mlp import MLPLatency

    return MLPLatency.load(None if spec == "mlp" else spec)


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
    if not args.budget or budget_fraction(args) is not None:
        return None
    return parse_size(args.budget, "--budget")


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
    vanilla simulation of them without a budget."""
    share = budget_fraction(args)
    if share is None:
        return budget(args)
    from memplan.comparison import vanilla_peak

    return int(vanilla_peak(traces, device) * share)

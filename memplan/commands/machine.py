"""The options every command that plans or simulates shares: which GPU, which
latency model, how many PCIe lanes, what memory budget -- defined once here."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

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
        "--budget", help=f"device memory for all jobs: 8GiB, 512MB or bytes (default: {default})"
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
    """`--budget` in bytes, or None when not given."""
    return parse_size(args.budget, "--budget") if args.budget else None

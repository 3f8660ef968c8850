"""`memplan hw list` and `memplan hw show NAME|PATH`: the hardware profiles."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from memplan.hwmodels.profile import Hardware, list_profiles, load_hardware, profile_path
from memplan.units import format_bytes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "hw",
        help="list and show hardware profiles (GPU figures, measured CPU)",
        description=(
            "Hardware profiles: device memory, PCIe copy rates, peak FLOP/s, memory "
            "bandwidth, launch overhead, each with its source. Pass a .toml path "
            "anywhere a profile name is accepted to use your own."
        ),
    )
    hw_sub = p.add_subparsers(dest="hw_command", metavar="ACTION")
    hw_sub.required = True
    ls = hw_sub.add_parser("list", help="one line per shipped profile")
    ls.add_argument("--json", action="store_true", help="print JSON instead of a table")
    ls.set_defaults(func=run_list)
    show = hw_sub.add_parser("show", help="every figure of one profile, with its source")
    show.add_argument("name", help="a profile name (see `memplan hw list`) or a .toml path")
    show.add_argument("--json", action="store_true", help="print JSON instead of text")
    show.set_defaults(func=run_show)


def _gbs(x: float) -> str:
    return f"{x / 1e9:.1f} GB/s"


def _tflops(hw: Hardware, dtype: str) -> str:
    v = hw.peak_flops.get(dtype)
    return "-" if v is None else f"{v / 1e12:.3g}"


def run_list(args: argparse.Namespace) -> int:
    profiles = [load_hardware(n) for n in list_profiles()]
    if args.json:
        print(json.dumps([asdict(h) for h in profiles], indent=2))
        return 0
    head = f"{'name':<16}{'memory':>11}{'H2D':>11}{'D2H':>11}{'fp32 TF':>9}{'fp16 TF':>9}{'mem BW':>12}  description"
    print(head)
    for h in profiles:
        print(
            f"{h.name:<16}{format_bytes(h.memory_bytes):>11}{_gbs(h.h2d_bytes_per_s):>11}"
            f"{_gbs(h.d2h_bytes_per_s):>11}{_tflops(h, 'float32'):>9}{_tflops(h, 'float16'):>9}"
            f"{_gbs(h.mem_bw_bytes_per_s):>12}  {h.description}"
        )
    return 0


def run_show(args: argparse.Namespace) -> int:
    hw = load_hardware(args.name)
    if args.json:
        doc = {**asdict(hw), "device": hw.device.value}
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{hw.name}: {hw.description}  ({profile_path(args.name)})")
    rows = [
        ("memory_bytes", f"{hw.memory_bytes} ({format_bytes(hw.memory_bytes)})"),
        ("h2d_bytes_per_s", _gbs(hw.h2d_bytes_per_s)),
        ("d2h_bytes_per_s", _gbs(hw.d2h_bytes_per_s)),
        ("transfer_fixed_s", f"{hw.transfer_fixed_s * 1e6:.2f} us"),
        ("copy_engines", str(hw.copy_engines)),
        ("h2d_duplex_factor", f"{hw.h2d_duplex_factor:.2f}"),
        ("peak_flops", ", ".join(f"{k} {v / 1e12:.3g} TFLOP/s" for k, v in hw.peak_flops.items())),
        ("mem_bw_bytes_per_s", _gbs(hw.mem_bw_bytes_per_s)),
        ("launch_overhead_s", f"{hw.launch_overhead_s * 1e6:.2f} us"),
    ]
    # counted with --allocator caching|smartpool (NOTE [ Context reserve ] in
    # sim/simulate.py, NOTE [ Workspaces ] in hwmodels/device.py)
    for key in (
        "context_reserve_bytes",
        "conv_workspace_bytes",
        "matmul_workspace_bytes",
        "l2_cache_bytes",
    ):
        n = getattr(hw, key)
        rows.append((key, f"{n} ({format_bytes(n)})"))
    if hw.roofline_efficiency:
        eff = ", ".join(f"{k} {v:.3g}" for k, v in hw.roofline_efficiency.items())
        rows.append(("roofline_efficiency", eff))
    for key, value in rows:
        print(f"  {key:<24}{value}")
        print(f"  {'':<24}source: {hw.source.get(key, '-')}")
    return 0

"""`memplan microbench`: measure op latencies under load, the MLP's training data."""

from __future__ import annotations

import argparse
import sys

from memplan.hwmodels.errors import LatencyError
from memplan.units import format_bytes, integer, number


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "microbench",
        help="measure op latencies over random shapes under background load",
        description=(
            "Measure aten op latencies over seeded random shapes per op class, at each "
            "background load level (TENSILE's gpu_usage: on CUDA a side stream kept busy, "
            "on CPU competing processes on the same cores), plus copy bandwidth. The "
            "result trains `memplan latency train`."
        ),
    )
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument(
        "--samples", type=integer(1, 100_000), default=200, help="shapes per op class (default 200)"
    )
    p.add_argument(
        "--usage",
        default="0,0.5,1",
        help="background load levels, fractions of the device (default 0,0.5,1)",
    )
    p.add_argument("--out", required=True, metavar="DATA", help="dataset file (.json.gz)")
    p.add_argument("--seed", type=integer(0, 2**63 - 1), default=0)
    p.add_argument(
        "--repeats",
        type=integer(1, 1000),
        default=5,
        help="timed blocks per measurement (default 5)",
    )
    p.add_argument(
        "--min-block-ms",
        type=number(0, 10_000, lo_open=True),
        default=10.0,
        help="least duration of a timed block (ms, default 10)",
    )
    p.add_argument(
        "--threads", type=integer(1, 1024), default=1, help="CPU intra-op threads (default 1)"
    )
    p.add_argument(
        "--classes",
        default="",
        help="comma-separated op classes to measure (default: all; see `hwmodels.opclass`)",
    )
    p.add_argument(
        "--hardware-name",
        default="",
        help="profile name the data is recorded for (default: cpu-local, or cuda-local)",
    )
    p.add_argument(
        "--profile-out",
        default="",
        metavar="TOML",
        help="also measure this machine's profile and write it here, roofline "
        "efficiencies fitted on the new data's training split",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def parse_fractions(text: str, what: str) -> tuple[float, ...]:
    """`0,0.5,1` -> (0.0, 0.5, 1.0); LatencyError naming `what` otherwise."""
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise LatencyError(
            f"{what}={text!r}: expected comma-separated fractions such as 0,0.5,1"
        ) from None
    if not values or any(not 0 <= v <= 1 for v in values):
        raise LatencyError(f"{what}={text!r}: every value must be a fraction in [0, 1]")
    return values


def run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from memplan import outputs
    from memplan.hwmodels.dataset import save_dataset
    from memplan.hwmodels.microbench import MicrobenchOptions, busy_warning, run_microbench
    from memplan.hwmodels.opclass import OpClass
    from memplan.hwmodels.shapes import MEASURED_CLASSES

    outputs.check_file(args.out)  # before any work: NOTE [ Output paths ]
    if args.profile_out:
        outputs.check_file(args.profile_out, "--profile-out")
    classes = MEASURED_CLASSES
    if args.classes:
        try:
            classes = tuple(OpClass(c.strip()) for c in args.classes.split(",") if c.strip())
        except ValueError:
            known = ",".join(c.value for c in MEASURED_CLASSES)
            raise LatencyError(f"--classes={args.classes!r}: known classes are {known}") from None
    name = args.hardware_name or ("cpu-local" if args.device == "cpu" else "cuda-local")
    opts = MicrobenchOptions(
        device=args.device,
        samples=args.samples,
        usage_levels=parse_fractions(args.usage, "--usage"),
        seed=args.seed,
        repeats=args.repeats,
        min_block_s=args.min_block_ms * 1e-3,
        threads=args.threads,
        classes=classes,
        hardware_name=name,
    )
    total = opts.samples * len(classes)
    with tqdm(total=total, unit="shape", disable=args.no_progress, desc="microbench") as bar:
        ds = run_microbench(opts, progress=lambda done, _n: bar.update(done - bar.n))
    with outputs.writing(args.out):
        save_dataset(ds, args.out)
    m = ds.meta
    print(
        f"{ds.trace.n_ops} shapes x {len(opts.usage_levels)} load levels = {len(ds.op)} "
        f"measurements in {m.elapsed_s:.0f} s ({m.skipped} shapes rejected by their kernels)"
    )
    print(
        f"copy: {format_bytes(m.copy['h2d_bytes_per_s'])}/s H2D, "
        f"{format_bytes(m.copy['d2h_bytes_per_s'])}/s D2H, "
        f"{m.copy['fixed_s'] * 1e6:.2f} us fixed"
    )
    busy = busy_warning(m.other_busy_cores)
    if busy:
        print(busy, file=sys.stderr)
    print(f"wrote {args.out}")
    if args.profile_out:
        from memplan.hwmodels.calibrate import measure_profile, with_efficiency
        from memplan.hwmodels.evaluate import fit_efficiency
        from memplan.hwmodels.profile import to_toml
        from memplan.traces.io import atomic_write_bytes

        hw = measure_profile(args.device, args.threads, name)
        eff = fit_efficiency(ds, hw)
        hw = with_efficiency(
            hw,
            eff,
            f"fitted by `memplan microbench` on the training split of {len(ds.op)} "
            f"measurements: per class, the efficiency minimising the median |log error|",
        )
        header = (
            f"{hw.description}\nMeasured here; regenerate with `memplan microbench --profile-out`."
        )
        with outputs.writing(args.profile_out, "--profile-out"):
            atomic_write_bytes(args.profile_out, to_toml(hw, header).encode())
        print(f"wrote {args.profile_out}")
    return 0

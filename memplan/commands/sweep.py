"""`memplan sweep GRID.toml --out DIR`: every scenario of a grid, on local
processes or a Ray cluster, resumable, summarised per planner."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from memplan.units import integer

if TYPE_CHECKING:
    from memplan.sweep.grid import Capture
    from memplan.sweep.scenario import SweepTask
    from memplan.sweep.store import Results

GRID_HELP = """\
The grid is a TOML file with one [grid] table; every axis takes one value or a
list, and the scenarios are the product of all axes (docs/sweep.md):

  [grid]
  traces = ["zoo:resnet50", "runs/mlp.json:2", ["a.json", "b.json"]]  # job mixes
  models = ["mlp", "small_cnn"]      # or/and: captured on meta into DIR/traces/
  batch_sizes = [16, 32]             # ... at each batch size (optimizer = "adam")
  gpus = ["rtx-a6000", "my-gpu.toml"]
  planners = ["tensile", {name = "squeeze", max_evaluations = 200}, "dtr"]
  budgets = ["60%", "80%", "12GiB", "none"]   # share of the vanilla peak, size
  fallbacks = ["none", "dtr"]        # none, passive, dtr
  allocators = ["exact"]             # exact, caching, smartpool
  lanes = [1]                        # 1 or 2
  latency = ["kernel"]               # kernel, roofline, measured, mlp, a model file
  iterations = 3
  seeds = [0]                        # a planner's seed option, where it has one

Paths are relative to the grid file. DIR gets results.jsonl (one record per
scenario, in grid order once complete), timings.jsonl (wall seconds per
scenario), summary.md and pareto.png (the Pareto front of MSR against EOR per
planner), and results.parquet with --parquet. Running the same sweep into the
same DIR again resumes it: finished scenarios are not run again."""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "sweep",
        help="run a grid of scenarios (traces, GPUs, planners, budgets, ...) locally or on Ray",
        description=(
            "Run every scenario of a grid -- jobs, GPUs, planners with options, budgets,\n"
            "fallbacks, allocators -- through `memplan compare`'s code, one task per\n"
            "scenario, and stream one JSON record per scenario to DIR/results.jsonl.\n\n"
            + GRID_HELP
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("grid", metavar="GRID.toml", help="the grid file (format above)")
    p.add_argument("--out", required=True, metavar="DIR", help="the sweep's directory (resumed)")
    p.add_argument(
        "--backend",
        choices=("local", "ray"),
        default="local",
        help="local (default): a pool of --workers processes; ray: one Ray task per scenario "
        "(pip install 'memplan[ray]')",
    )
    p.add_argument(
        "--address",
        metavar="A",
        help="with --backend ray: join the Ray cluster at A (default: start a local Ray "
        "instance of --workers CPUs)",
    )
    p.add_argument(
        "--workers",
        type=integer(1, 1024),
        metavar="N",
        help=f"processes (local) or CPUs of a local Ray instance (default: the CPU count, "
        f"{os.cpu_count()} here); 1 runs the scenarios in this process",
    )
    p.add_argument(
        "--parquet",
        action="store_true",
        help="also write DIR/results.parquet (pip install 'memplan[parquet]')",
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from memplan.sweep import backends, store, summary
    from memplan.sweep.grid import load_grid
    from memplan.traces.errors import MemplanError

    out = store.check_out(args.out)  # before any work: NOTE [ Output paths ]
    if args.address is not None and args.backend != "ray":
        raise MemplanError("--address joins a Ray cluster: use it with --backend ray")
    if args.backend == "ray":
        backends.ray_module()
        if args.address is not None:
            backends.check_address(args.address)
    if args.parquet:
        store.check_parquet()
    workers = args.workers or os.cpu_count() or 1
    grid = load_grid(args.grid, traces_dir=out / store.TRACES)
    out.mkdir(exist_ok=True)
    _capture(grid.captures, args.no_progress)
    scenarios = grid.scenarios
    keys = [s.key() for s in scenarios]
    results = store.Results(out, keys)
    try:
        resumed = results.resume()
        todo = [s for s, k in zip(scenarios, keys, strict=True) if k not in results.done]
        _run(results, todo, args, workers, len(scenarios), resumed)
    finally:
        results.close()
    records = results.finish()
    written = [store.RESULTS, store.TIMINGS]
    if args.parquet:
        store.write_parquet(records, out / store.PARQUET)
        written.append(store.PARQUET)
    written += summary.write(records, out)
    counts = {s: sum(r["status"] == s for r in records) for s in summary.STATUSES}
    said = ", ".join(f"{n} {s}" for s, n in counts.items() if n)
    print(
        f"sweep: {len(records)} scenarios ({len(todo)} run, {resumed} resumed"
        f"{f', {results.dropped} old lines dropped' if results.dropped else ''}): {said} "
        f"-> {args.out}/: {', '.join(written)}"
    )
    return 0


def _run(
    results: Results,
    todo: list[SweepTask],
    args: argparse.Namespace,
    workers: int,
    total: int,
    resumed: int,
) -> None:
    """Run the scenarios not done yet, storing each as it finishes."""
    from tqdm import tqdm

    from memplan.sweep import backends

    with tqdm(
        total=total, initial=resumed, unit="scenario", desc="sweep", disable=args.no_progress,
        file=sys.stderr,
    ) as bar:  # fmt: skip
        for done in backends.run(args.backend, todo, workers, args.address):
            results.add(done.record, done.seconds, done.worker)
            bar.update(1)


def _capture(captures: list[Capture], quiet: bool) -> None:
    """Capture the grid's models on the meta device (those not yet in DIR/traces)."""
    from memplan.outputs import writing
    from memplan.traces import io
    from memplan.traces.capture import CaptureOptions, capture
    from memplan.traces.zoo import resolve

    for c in captures:
        if Path(c.path).is_file():
            continue
        if not quiet:
            print(f"sweep: capturing {c.model} batch {c.batch} -> {c.path}", file=sys.stderr)
        trace = capture(
            resolve(c.model), c.batch, CaptureOptions(optimizer=c.optimizer), model_name=c.model
        )
        with writing(c.path):
            io.save(trace, c.path)

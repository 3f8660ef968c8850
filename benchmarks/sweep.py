"""`memplan sweep`'s backends: scenarios per second on 2 local workers
against 1, and what the Ray backend costs per scenario on one machine.

`python benchmarks/sweep.py [--rounds N]` writes synthetic traces and a grid
of 72 scenarios (about a fifth of a second each) to a temporary folder and,
in this process, runs the whole grid through the backends the way `memplan
sweep` does (`memplan.sweep.backends`, every record collected), timed with
`time.perf_counter`:

- local, 1 worker (the scenarios in this process), local, 2 workers (a new
  process pool per run, forked from the forkserver) and Ray with 2 CPUs
  (tasks on the already started local instance), interleaved round by round
  (default 3 rounds) so that drifting machine load hits each alike; each
  figure is the median over rounds; scenarios per second = 72 / median wall
  seconds;
- start-up, reported separately and not in the medians: the first local
  2-worker run (it starts the forkserver, which imports torch and memplan),
  `ray.init(num_cpus=2)`, and the first Ray run (Ray starts its workers,
  which import memplan and torch on their first task);
- ms per scenario in a worker: the median over rounds of the scenarios'
  own wall seconds, summed, / 72: when it grows with the worker count, the
  workers waited for a CPU (others' load), not for the backend;
- Ray's overhead per scenario = (median Ray - median local 2) / 72: the
  same work on the same number of processes, so the difference is Ray's
  scheduling, serialisation and object store.

Every run's records are checked to be the same as the first run's (the
sweep's determinism). The machine is shared: the load average before and
after is printed, and with a load above the CPU count the figures say more
about the neighbours than about the backends.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from memplan.traces import io, synthetic

from memplan.sweep import backends
from memplan.sweep.grid import load_grid
from memplan.sweep.scenario import SweepTask

GRID = """
[grid]
traces = ["chain.json", "residual.json", ["chain.json", "residual.json"]]
gpus = "rtx-a6000"
planners = ["tensile", "capuchin", "checkpoint", "dtr"]
budgets = ["80%", "60%", "40%"]
fallbacks = ["none", "dtr"]
"""


def _write_grid(folder: Path) -> list[SweepTask]:
    io.save(synthetic.chain(48, act_mib=4), folder / "chain.json")
    io.save(synthetic.residual(16, act_mib=4), folder / "residual.json")
    (folder / "grid.toml").write_text(GRID)
    scenarios = load_grid(folder / "grid.toml").scenarios
    for s in scenarios:
        s.key()  # traces loaded and fingerprinted here, before any timing
    return scenarios


def _timed(run: Callable[[], Iterable[backends.Done]]) -> tuple[float, float, str]:
    """Wall seconds of one whole run, the seconds its scenarios took inside
    their workers (summed), and its records as canonical text."""
    t0 = time.perf_counter()
    done = list(run())
    seconds = time.perf_counter() - t0
    records = sorted(json.dumps(d.record, sort_keys=True) for d in done)
    return seconds, sum(d.seconds for d in done), "\n".join(records)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import ray

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        scenarios = _write_grid(Path(tmp))
        n = len(scenarios)
        runs: dict[str, Callable[[], Iterable[backends.Done]]] = {
            "local, 1 worker": lambda: backends.local(scenarios, 1),
            "local, 2 workers": lambda: backends.local(scenarios, 2),
            "ray, 2 CPUs": lambda: backends.ray(scenarios, 2),
        }
        first_local, _busy, expected = _timed(runs["local, 2 workers"])
        t0 = time.perf_counter()
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="warning")
        ray_init = time.perf_counter() - t0
        try:
            first_ray, _busy, records = _timed(runs["ray, 2 CPUs"])
            assert records == expected, "ray's records differ from local's"
            times: dict[str, list[float]] = {name: [] for name in runs}
            inside: dict[str, list[float]] = {name: [] for name in runs}
            for r in range(args.rounds):
                for name, run in runs.items():
                    seconds, busy, records = _timed(run)
                    assert records == expected, f"{name}'s records differ (round {r})"
                    times[name].append(seconds)
                    inside[name].append(busy)
                    print(f"round {r + 1}: {name}: {seconds:.2f} s", file=sys.stderr)
        finally:
            ray.shutdown()
    med = {name: statistics.median(ts) for name, ts in times.items()}
    load = ", ".join(f"{a:.1f}" for a in (*load_before, *os.getloadavg()))
    print(f"{n} scenarios, {os.cpu_count()} CPUs, medians of {args.rounds} interleaved rounds")
    print(f"load average (1, 5, 15 min) before and after: {load}: others' work shares the CPUs")
    print("| backend | wall s (median) | scenarios/s | runs (s) | ms per scenario in a worker |")
    print("|---|---|---|---|---|")
    for name, ts in times.items():
        runs_s = ", ".join(f"{t:.2f}" for t in ts)
        each = statistics.median(inside[name]) / n * 1e3
        print(f"| {name} | {med[name]:.2f} | {n / med[name]:.1f} | {runs_s} | {each:.0f} |")
    speedup = med["local, 1 worker"] / med["local, 2 workers"]
    overhead = (med["ray, 2 CPUs"] - med["local, 2 workers"]) / n
    print(f"2 local workers against 1: {speedup:.2f}x the scenarios per second")
    print(f"Ray's overhead per scenario against local, 2 processes each: {overhead * 1e3:.1f} ms")
    print(
        f"start-up, not in the medians: first local 2-worker run {first_local:.2f} s "
        f"(its forkserver start included), ray.init(num_cpus=2) {ray_init:.2f} s, first Ray run "
        f"{first_ray:.2f} s (its workers start included)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Dynamic workloads (issue 19; TENSILE §V-D, §V-E) on rtx-a6000.

1. For each shipped CNN (resnet50, vgg16, inception_v3, densenet121, all
   b16 with Adam): 1 to 4 jobs of it, launched one after another, each one
   vanilla iteration of the model alone after the last; each job runs
   `--iterations` iterations. Every method (tensile_cs, tensile_up,
   capuchin, vdnn) runs under 70% of the scenario's vanilla device peak
   with the passive net underneath (NOTE [ Budget of a dynamic run ] in
   memplan/dynamic.py); MSR, EOR and CBR of the whole run (global peak,
   makespan) against vanilla are Fig. 6's points.
2. The mixed launch: five different models (the four CNNs and bert_base)
   launched one by one in a random order (seeds 0, 1, 2), the same gaps.

Latencies: the roofline model is both what the schedulers predict with and
what the simulator runs, plus seeded log-normal jitter (`--jitter`, default
0.05, the run's seed) -- the only drift TENSILE_up's EWMA can see (the other
jobs' load reaches a job through the shared compute queue, which the
planners already model; NOTE [ Usage and jitter ] in sim/dynamics.py).

Prints the per-phase table of the 4-job runs and of each mixed launch, the
Fig. 6 points, and how long it took; writes docs/dynamic_fig6.png and
docs/dynamic_timeline.png (the mixed launch of seed 0).

    .venv/bin/python benchmarks/dynamic.py [--iterations 6] [--models resnet50,vgg16]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from memplan.hwmodels.device import DeviceModel  # noqa: E402
from memplan.hwmodels.latency import Roofline  # noqa: E402
from memplan.hwmodels.profile import load_hardware  # noqa: E402
from memplan.sim import Job, simulate  # noqa: E402
from memplan.traces import io  # noqa: E402
from tqdm import tqdm  # noqa: E402

from memplan.dynamic import run_dynamic  # noqa: E402
from memplan.dynamic_report import (  # noqa: E402
    fig6,
    phase_rows,
    save,
    text_table,
    timeline_figure,
    totals,
)

CNNS = ("resnet50", "vgg16", "inception_v3", "densenet121")
MIXED = (*CNNS, "bert_base")
METHODS = ("tensile_cs", "tensile_up", "capuchin", "vdnn")


def trace(model: str):  # noqa: ANN201
    return io.load(ROOT / "traces" / "data" / f"{model}_b16_adam.json.gz")


def alone_s(t, device: DeviceModel) -> float:  # noqa: ANN001
    """One vanilla iteration of `t` alone (seconds): the launch gap."""
    return simulate([t], device, iterations=1).jobs[0].iteration_times_s[0]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(CNNS))
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--jitter", type=float, default=0.05)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", default=str(ROOT / "docs"))
    a = ap.parse_args()
    t0 = time.perf_counter()
    device = DeviceModel(load_hardware("rtx-a6000"), Roofline())
    models = [m for m in a.models.split(",") if m]
    seeds = [int(s) for s in a.seeds.split(",") if s]
    traces = {m: trace(m) for m in dict.fromkeys([*models, *MIXED])}
    gaps = {m: alone_s(t, device) for m, t in traces.items()}
    points: dict = {}
    bar = tqdm(total=4 * len(models) + len(seeds), file=sys.stderr, desc="scenarios")
    tables = []
    for m in models:
        for n in range(1, 5):
            jobs = [
                Job(traces[m], arrival_s=k * gaps[m], iterations=a.iterations, name=f"{m}#{k}")
                for k in range(n)
            ]
            run = run_dynamic(jobs, device, METHODS, iterations=a.iterations, jitter=a.jitter)
            for method, met in totals(run).items():
                points.setdefault(m, {}).setdefault(method, {})[n] = met
            if n == 4:
                tables.append((f"{m} x4, one launch per {gaps[m] * 1e3:.1f} ms", run))
            bar.update()
    mixed_runs = []
    for seed in seeds:
        order = [MIXED[i] for i in np.random.default_rng(seed).permutation(len(MIXED))]
        gap = float(np.mean([gaps[x] for x in MIXED]))
        jobs = [
            Job(traces[x], arrival_s=k * gap, iterations=a.iterations, name=f"{x}#{k}")
            for k, x in enumerate(order)
        ]
        run = run_dynamic(
            jobs, device, METHODS, iterations=a.iterations, jitter=a.jitter, seed=seed
        )
        mixed_runs.append(run)
        tables.append(
            (f"mixed launch, seed {seed}: {', '.join(order)} ({gap * 1e3:.1f} ms apart)", run)
        )
        bar.update()
    bar.close()
    for title, run in tables:
        print(f"\n## {title} (budget {run.budget_bytes / 2**30:.2f} GiB)\n")
        print(text_table(phase_rows(run)))
    print("\n## Fig. 6: whole run against vanilla (global peak, makespan)\n")
    rows = [
        (m, method, str(n), f"{x.msr:.3f}", f"{x.eor:.3f}", f"{x.cbr:.3f}")
        for m, by in points.items()
        for method, by_n in by.items()
        for n, x in sorted(by_n.items())
    ]
    print(text_table(rows, ("model", "method", "jobs", "MSR", "EOR", "CBR")))
    mixed = [
        (str(seed), k, f"{x.msr:.3f}", f"{x.eor:.3f}", f"{x.cbr:.3f}")
        for seed, run in zip(seeds, mixed_runs, strict=True)
        for k, x in totals(run).items()
    ]
    print("\n## Mixed launch: whole run\n")
    print(text_table(mixed, ("seed", "method", "MSR", "EOR", "CBR")))
    out = Path(a.out)
    save(fig6(points), out / "dynamic_fig6.png")
    if mixed_runs:
        save(timeline_figure(mixed_runs[0]), out / "dynamic_timeline.png")
    print(f"\nwrote {out}/dynamic_fig6.png, dynamic_timeline.png")
    print(f"took {time.perf_counter() - t0:.1f} s (wall clock, shared machine: noisy)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

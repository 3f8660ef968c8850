"""Simulated versus measured on CPU with a throttled copy lane.

For the built-in small models (batch sizes chosen so a step takes tens of
milliseconds with one intra-op thread) and every heuristic planner, this
runs `validate.calibrate.simvsreal.validate_plan`: vanilla replays measure per-op
latencies and the lane (bandwidth = the throttle, fixed cost and
compute-thread cost per transfer from a probe replay), the planner plans
for that measured device, the simulator predicts the plan, and the plan is
replayed between two vanilla replays. Figures are medians over 3 runs;
each run keeps the steadiest of 3 brackets (vanilla, plan, vanilla), and a
replay's time is its best steady iteration (NOTE [ Paired runs ] in
validate/calibrate/brackets.py, NOTE [ Steady figures ] in
validate/calibrate/report.py); the lane is measured on 7 vanilla/probe
pairs before planning, and its cost per transfer on the compute thread is
pooled with a probe in every bracket. Capuchin gets a budget of 80% of the
vanilla peak.
The acceptance item is about the four heuristic planners; release_only
(no copies, no recomputes: its error is the machine's noise floor) is the
control.

Acceptance: |peak error| <= 1% and |time error| <= 15%, and every plan
bit-identical to the vanilla replay. `drift`: how far apart the two vanilla
replays around the plan's were; `cont`: the share of the compute thread's
wall time spent waiting for a CPU. Time errors mean little when either is
high (the machine is shared). `lane us`: the lane's measured fixed cost per
transfer; `xfer`: each transfer's measured cost on the compute thread, in
microseconds (validate/calibrate/measure.py
NOTE [ Transfers cost the compute thread too ]). `peak ±5%`: where the
simulated peak changes with compute 5% faster or slower, its range; a plan
whose peak hinges on such a race can land on either side of it in a replay
(validate/calibrate/simvsreal.py NOTE [ Timing-sensitive peaks ]).

    .venv/bin/python benchmarks/validate.py [--bandwidth 1.5GB/s] [--models a,b] [--planners a,b]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from memplan.hwmodels.hostmem import cache_host_allocations  # noqa: E402
from memplan.traces.capture import CaptureOptions, capture  # noqa: E402
from memplan.traces.errors import MemplanError  # noqa: E402
from memplan.traces.zoo import ZOO  # noqa: E402
from memplan.validate.calibrate.report import ValidationReport  # noqa: E402
from memplan.validate.calibrate.simvsreal import validate_plan  # noqa: E402

from memplan.units import parse_rate  # noqa: E402

BATCH = {"mlp": 256, "small_cnn": 16, "linear_chain": 64, "tiny_resnet": 8, "tiny_transformer": 32}
MODELS = ("mlp", "small_cnn", "linear_chain", "tiny_resnet", "tiny_transformer")
PLANNERS = ("release_only", "tensile", "capuchin", "vdnn", "checkpoint")
HEURISTIC = ("tensile", "capuchin", "vdnn", "checkpoint")  # the acceptance item's planners
PEAK_TARGET, TIME_TARGET = 0.01, 0.15
LANE_SAMPLES = 7  # vanilla/probe pairs measuring the lane (its cost per transfer is noisy)


def pct(x: float) -> str:
    return "-" if math.isnan(x) else f"{x * 100:+.1f}%"


def row(model: str, planner: str, r: ValidationReport) -> str:
    model = f"{model:<15} "  # tiny_transformer/32 is one column too wide
    ev = r.events
    events = f"{ev['swap_out']}s/{ev['recompute']}r"
    ok = abs(r.peak_err) <= PEAK_TARGET and abs(r.time_err) <= TIME_TARGET and r.correct
    lo, hi = r.peak_pred_lo_bytes, r.peak_pred_hi_bytes
    span = f"{lo / 2**20:.2f}-{hi / 2**20:.2f}" if hi > lo else "-"
    return (
        f"{model}{planner:<13}{events:>8} {'yes' if r.correct else 'NO':>4} "
        f"{r.peak_pred_bytes / 2**20:8.2f} {r.peak_meas_bytes / 2**20:8.2f} {pct(r.peak_err):>7} "
        f"{r.time_pred_s * 1e3:7.2f} {r.time_meas_s * 1e3:7.2f} {pct(r.time_err):>7} "
        f"{r.stall_pred_s * 1e3:6.2f} {r.stall_meas_s * 1e3:6.2f} "
        f"{r.recompute_pred_s * 1e3:5.2f} {r.recompute_meas_s * 1e3:5.2f} "
        f"{r.bytes_d2h_pred / 2**20:6.2f} {r.bytes_d2h_meas / 2**20:6.2f} "
        f"{r.drift * 100:5.1f}% {r.contention * 100:4.0f}% "
        f"{r.lane.fixed_s * 1e6:4.0f} {r.lane.compute_s * 1e6:4.0f} {span:>11} "
        f"{'ok' if ok else 'MISS'}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bandwidth", default="1.5GB/s")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--planners", default=",".join(PLANNERS))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--samples", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=4)
    args = ap.parse_args()
    bw = parse_rate(args.bandwidth, "--bandwidth")
    torch.set_num_threads(1)
    cached = cache_host_allocations()
    print(
        f"CPU replay, 1 intra-op thread, lane throttled to {bw / 1e9:.2f} GB/s, one shared lane; "
        f"{args.iterations} iterations, medians of {args.runs} runs x best of {args.samples} "
        f"pairs; host allocations cached: {cached}; load average {os.getloadavg()[0]:.1f} "
        f"on {os.cpu_count()} cores"
    )
    head = (
        f"{'model/batch':<16}{'planner':<13}{'events':>8} {'same':>4} {'peak MiB':>8} {'meas':>8} "
        f"{'err':>7} {'time ms':>7} {'meas':>7} {'err':>7} {'stall':>6} {'meas':>6} "
        f"{'rc ms':>5} {'meas':>5} "
        f"{'D2H MiB':>6} {'meas':>6} {'drift':>6} {'cont':>5} {'lane us':>4} {'xfer':>4} "
        f"{'peak ±5%':>11}"
    )
    print("predicted vs measured; events = swap-outs / recomputes per iteration\n" + head)
    misses, total, t0 = 0, 0, time.perf_counter()
    accepted, heuristic = 0, 0
    for model in args.models.split(","):
        batch = BATCH[model]
        trace = capture(ZOO[model], batch, CaptureOptions(device="cpu"), model_name=model)
        for planner in args.planners.split(","):
            budget = int(0.8 * trace.peak("framework")[0]) if planner == "capuchin" else None
            total += 1
            try:
                r = validate_plan(
                    trace,
                    planner,
                    bandwidth=bw,
                    iterations=args.iterations,
                    runs=args.runs,
                    samples=args.samples,
                    budget_bytes=budget,
                    threads=1,
                    lane_samples=LANE_SAMPLES,
                )
            except MemplanError as e:
                misses += 1
                heuristic += planner in HEURISTIC
                print(f"{model}/{batch:<{15 - len(model)}}{planner:<13}  cannot validate: {e}")
                continue
            line = row(f"{model}/{batch}", planner, r)
            misses += line.endswith("MISS")
            if planner in HEURISTIC:
                heuristic += 1
                accepted += not line.endswith("MISS")
            print(line, flush=True)
    print(
        f"\n{total - misses} of {total} within |peak err| <= {PEAK_TARGET:.0%} and "
        f"|time err| <= {TIME_TARGET:.0%} and bit-identical ({accepted} of {heuristic} of the "
        f"heuristic planners); {time.perf_counter() - t0:.0f} s; "
        f"load average now {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()

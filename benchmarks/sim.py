"""Simulator speed.

Figures (wall-clock `time.perf_counter` on this machine, best of 3 runs after
one warm-up; machines are noisy, compare ratios measured in one run):
- three iterations of resnet50 (the shipped trace, or a synthetic step of the
  same size when it is absent) with `release_only`, roofline latencies on
  rtx-a6000: wall time per simulated iteration, SimPy events per second, log
  entries per second -- targets < 1 s per iteration and >= 100k events/s;
- the same with the vanilla plan, two jobs sharing the GPU, and passive mode
  under a budget of 60% of the liveness peak (swaps on every iteration).
Compiling a job (building its per-op tables and latencies) is timed apart.
- scaling: release_only on synthetic residual steps of 1k, 3k, 10k and 30k
  ops, events per second: one warm-up call per size (its op table and
  latencies are built then), then 21 rounds, the four sizes interleaved in each (a
  small step run again until its round has simulated 90k ops, as the 30k
  step does once), the median over rounds and the range of the rounds --
  target: flat within 20% from 1k to 30k ops (NOTE [ Garbage collection in
  simulate ], NOTE [ Fewer streams per op ]), one event per op (a kernel the clock skips counts as one:
  NOTE [ Kernels that nothing interleaves ]);
- densenet121 x 4 jobs x 3 iterations, vanilla (the workload of the
  garbage-collection finding).

`--against REV` instead times the simulator at commit REV against this
checkout, interleaved in one run, and prints the ratio (benchmarks/against.py).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from memplan.hwmodels.device import DeviceModel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memplan.hwmodels.latency import Roofline  # noqa: E402
from memplan.hwmodels.profile import load_hardware  # noqa: E402
from memplan.planners.heuristics.vanilla import release_only_plan  # noqa: E402
from memplan.sim import Job, simulate  # noqa: E402
from memplan.traces import io, synthetic  # noqa: E402

ITERATIONS = 3
TARGET_EVENTS_PER_S = 100_000
SCALING_ROUNDS = 21
SCALING_OPS = 90_000  # simulated ops per size and round: 30k ops x 3 iterations
TARGET_S_PER_ITERATION = 1.0


def resnet50():
    path = ROOT / "traces" / "data" / "resnet50_b16_adam.json.gz"
    if path.exists():
        return io.load(path), path.name
    t = synthetic.sized(7000, seed=0, family=synthetic.Family.RESIDUAL)
    return t, "synthetic residual step of 7000 ops (resnet50 trace not shipped yet)"


def best_of(fn, repeats: int = 3):
    fn()
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def report(label: str, wall: float, result, iterations: int) -> None:
    n_log = len(result.log)
    print(
        f"{label:<34} {wall * 1e3:8.1f} ms total  {wall / iterations * 1e3:7.1f} ms/iteration  "
        f"{result.n_events / wall / 1e3:7.0f}k events/s  {n_log / wall / 1e3:6.0f}k log entries/s"
    )


def median_of(fn, repeats: int = 3):
    fn()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        runs.append((time.perf_counter() - t0, out))
    runs.sort(key=lambda r: r[0])
    return runs[repeats // 2]


def scaling(hw, latency) -> None:
    print(
        f"\nscaling: release_only on synthetic residual steps, {ITERATIONS} iterations; "
        f"{SCALING_ROUNDS} rounds, the sizes interleaved in each, a small step run until "
        f"its round has {SCALING_OPS // 1000}k ops; median over rounds:"
    )
    sizes = (1000, 3000, 10_000, 30_000)
    cases = []
    for n in sizes:
        t = synthetic.sized(n, seed=0, family=synthetic.Family.RESIDUAL)
        p = release_only_plan(t)
        simulate([Job(t, p)], DeviceModel(hw, latency), iterations=1, check=False)  # warm-up
        cases.append((n, t, p, max(1, SCALING_OPS // (ITERATIONS * n))))
    samples: dict[int, list[float]] = {n: [] for n in sizes}
    per_op = {}
    for _ in range(SCALING_ROUNDS):
        for n, t, p, repeats in cases:
            events, t0 = 0, time.perf_counter()
            for _ in range(repeats):
                r = simulate(
                    [Job(t, p)], DeviceModel(hw, latency), iterations=ITERATIONS, check=False
                )
                events += r.n_events
            samples[n].append(events / (time.perf_counter() - t0))
            per_op[n] = r.n_events / (ITERATIONS * t.n_ops)
    rates = []
    for n in sizes:
        rates.append(statistics.median(samples[n]))
        lo, hi = min(samples[n]), max(samples[n])
        print(
            f"  {n:>6} ops  {rates[-1] / 1e3:6.0f}k events/s (rounds: {lo / 1e3:.0f}k-{hi / 1e3:.0f}k)"
            f"  {per_op[n]:.2f} events/op"
        )
    spread = max(rates) / min(rates)
    verdict = "met" if spread <= 1.2 else "MISSED"
    print(f"  fastest / slowest {spread:.3f}; target flat within 20%: {verdict}")
    dense = ROOT / "traces" / "data" / "densenet121_b16_adam.json.gz"
    if dense.exists():
        t = io.load(dense)
        wall, r = median_of(lambda: simulate([t] * 4, DeviceModel(hw, latency), iterations=3))
        report("densenet121 x4 jobs, vanilla", wall, r, 3)


def main() -> None:
    trace, what = resnet50()
    hw = load_hardware("rtx-a6000")
    latency = Roofline()
    print(f"trace: {what}: {trace.n_ops} ops, {trace.n_buffers} buffers; {hw.name}, roofline")
    plan = release_only_plan(trace)
    print(f"release_only: {len(plan.events)} releases")

    t0 = time.perf_counter()
    r = simulate([Job(trace, plan)], DeviceModel(hw, latency), iterations=1, check=False)
    print(
        f"first call (compiles latencies, caches trace arrays): {(time.perf_counter() - t0) * 1e3:.1f} ms"
    )

    wall, r = best_of(
        lambda: simulate([Job(trace, plan)], DeviceModel(hw, latency), iterations=ITERATIONS)
    )
    report("release_only, 3 iterations", wall, r, ITERATIONS)
    per_it, ev_s = wall / ITERATIONS, r.n_events / wall
    print(
        f"  {r.n_events} SimPy events, {len(r.log)} log entries; target < {TARGET_S_PER_ITERATION:.0f} s/iteration: "
        f"{'met' if per_it < TARGET_S_PER_ITERATION else 'MISSED'}; target >= 100k events/s: "
        f"{'met' if ev_s >= TARGET_EVENTS_PER_S else 'MISSED'}"
    )
    wall, r = best_of(
        lambda: simulate(
            [Job(trace, plan)], DeviceModel(hw, latency), iterations=ITERATIONS, check=False
        )
    )
    report("  same without planners.core.check", wall, r, ITERATIONS)

    wall, r = best_of(lambda: simulate([trace], DeviceModel(hw, latency), iterations=ITERATIONS))
    report("vanilla, 3 iterations", wall, r, ITERATIONS)

    jobs = [Job(trace, plan), Job(trace, plan, arrival_s=0.001)]
    wall, r = best_of(lambda: simulate(jobs, DeviceModel(hw, latency), iterations=ITERATIONS))
    report("two jobs, release_only", wall, r, 2 * ITERATIONS)

    budget = int(trace.peak("liveness")[0] * 0.6)
    wall, r = best_of(
        lambda: simulate([Job(trace, plan)], DeviceModel(hw, latency), iterations=ITERATIONS, budget=budget, oom="passive"),
        repeats=1,
    )  # fmt: skip
    report("passive, budget 60% of liveness", wall, r, ITERATIONS)
    j = r.jobs[0]
    print(
        f"  {j.passive_swaps} passive swaps, oom={j.oom}, iteration {j.iteration_time_s * 1e3:.2f} ms"
    )

    print("\nrelease_only, 3 iterations, per trace:")
    shipped = sorted((ROOT / "traces" / "data").glob("*.json.gz"))
    big = synthetic.sized(7000, seed=0, family=synthetic.Family.RESIDUAL)
    cases = [(p.name, io.load(p)) for p in shipped] + [("synthetic residual", big)]
    for name, t in cases:
        p = release_only_plan(t)
        wall, r = best_of(
            lambda t=t, p=p: simulate([Job(t, p)], DeviceModel(hw, latency), iterations=ITERATIONS)
        )
        report(f"  {name} ({t.n_ops} ops)", wall, r, ITERATIONS)
    scaling(hw, latency)


if __name__ == "__main__":
    from benchmarks.against import main_or_against

    main_or_against(main, "sim")

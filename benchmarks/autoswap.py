"""AutoSwap's scores against its Bayesian optimisation: issue 20's acceptance.

For each shipped model at batch 16 (Adam) on rtx-a6000 (roofline
latencies, one PCIe lane) at 60% of the simulated vanilla peak: the
`autoswap` planner ranked by each single priority score (DOA, AOA, WDOA,
SWDOA) and by BO (their weighted sum, weights tuned by optuna's TPE over
`--trials` simulated trials, seed `--seed`; NOTE [ AutoSwap BO ] in
planners/heuristics/autoswap/bo.py), each through `memplan.comparison`
with no safety net (`--fallback none`): the row says whether the plan fit
on its own. Iteration times are simulated (3 iterations, steady state;
deterministic); planning time is this machine's wall time
(`time.perf_counter`), one run per cell, noisy on a shared machine.

The acceptance: BO's simulated iteration time is below the best single
score's on at least one trace.

Usage: python benchmarks/autoswap.py [--models resnet50,...] [--budget 60]
       [--trials 30] [--seed 0]
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memplan.hwmodels.device import DeviceModel  # noqa: E402
from memplan.hwmodels.latency import Roofline  # noqa: E402
from memplan.hwmodels.profile import load_hardware  # noqa: E402
from memplan.traces import io  # noqa: E402

from memplan.comparison import Fit, compare_planners, vanilla_peak  # noqa: E402

MODELS = ("resnet50", "vgg16", "inception_v3", "densenet121", "bert_base", "gpt2")
SINGLES = ("doa", "aoa", "wdoa", "swdoa")


def _ms(x: float) -> str:
    return "-" if x is None or math.isnan(x) or math.isinf(x) else f"{x * 1e3:.2f}"


def row(trace, device, budget, options):
    c = compare_planners(
        [trace], device, ["autoswap"], budget=budget, options={"autoswap": options}
    )
    r = c.rows[0]
    t = r.iteration_time_s if r.fit == Fit.ALONE else math.inf
    return r, t, c.vanilla.jobs[0].iteration_time_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS), help="shipped models, comma-separated")
    ap.add_argument("--budget", type=float, default=60.0, help="percent of the vanilla peak")
    ap.add_argument("--trials", type=int, default=30, help="BO trials (default 30)")
    ap.add_argument("--seed", type=int, default=0, help="BO sampler seed (default 0)")
    ap.add_argument("--gpu", default="rtx-a6000", help="hardware profile (default rtx-a6000)")
    args = ap.parse_args()
    device = DeviceModel(load_hardware(args.gpu), Roofline())
    print(__doc__.split("\n\n")[1].replace("\n", " "), "\n")
    head = f"{'trace':<13}{'vanilla':>9}" + "".join(f"{s:>9}" for s in SINGLES)
    head += f"{'BO':>9}  {'BO vs best':>10}  planning s (singles / BO)  fits"
    print(f"iteration ms at {args.budget:g}% of the vanilla peak, BO with {args.trials} trials")
    print(head)
    improved = []
    for model in args.models.split(","):
        trace = io.load(ROOT / "traces" / "data" / f"{model}_b16_adam.json.gz")
        budget = int(vanilla_peak([trace], device) * args.budget / 100)
        times, plan_s, fits = {}, {}, []
        for s in SINGLES:
            r, times[s], van = row(trace, device, budget, [f"score={s}"])
            plan_s[s], _ = r.plan_time_s, fits.append(r.fit)
        bo_opts = ["score=bo", f"trials={args.trials}", f"seed={args.seed}"]
        r, times["bo"], van = row(trace, device, budget, bo_opts)
        plan_s["bo"], _ = r.plan_time_s, fits.append(r.fit)
        best = min(times[s] for s in SINGLES)
        gain = (best - times["bo"]) / best if math.isfinite(best) else math.nan
        if times["bo"] < best:
            improved.append(model)
        single_s = max(plan_s[s] for s in SINGLES)
        cells = "".join(f"{_ms(times[s]):>9}" for s in (*SINGLES, "bo"))
        verdict = "-" if math.isnan(gain) else f"{gain * 100:+.1f}%"
        print(
            f"{model:<13}{_ms(van):>9}{cells}  {verdict:>10}  "
            f"{single_s:>8.2f} / {plan_s['bo']:>6.2f}         {','.join(sorted(set(fits)))}"
        )
        if r.result is not None:
            w = ", ".join(f"{x:+.2f}" for x in r.result.stats.get("weights", []))
            print(f"{'':13}BO weights (DOA, AOA, WDOA, SWDOA): {w}; stopped by "
                  f"{r.result.stats.get('bo_stopped_by')}")  # fmt: skip
    print()
    ok = bool(improved)
    print(
        f"acceptance: BO below the best single score on {len(improved)} trace(s)"
        f"{' (' + ', '.join(improved) + ')' if improved else ''}: {'PASS' if ok else 'FAIL'}"
    )


if __name__ == "__main__":
    main()

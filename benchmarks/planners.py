"""The comparison table of every heuristic planner on the shipped traces.

For each shipped model at batch 16 (Adam) on the rtx-a6000 profile with the
roofline latency model: one job, then four jobs of the same model sharing the
GPU and its one PCIe lane. Each planner plans, its plans are checked and
simulated for 3 iterations, and TENSILE's metrics are computed against the
vanilla run of the same jobs (memplan.comparison). Capuchin's budget is the peak
TENSILE reached. "plan" is the planner's wall time (time.perf_counter) on
this machine, one run each; everything else is simulated and deterministic.

Usage: python benchmarks/planners.py [--models resnet50,bert_base] [--jobs 1,4]
       python benchmarks/planners.py --against REV   (planning time at commit REV
       against this checkout, interleaved in one run, ratio printed: benchmarks/against.py)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from memplan.hwmodels.device import DeviceModel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memplan.hwmodels.latency import Roofline  # noqa: E402
from memplan.hwmodels.profile import load_hardware  # noqa: E402
from memplan.traces import io  # noqa: E402

from memplan.comparison import compare_planners  # noqa: E402
from memplan.report import text_table  # noqa: E402

MODELS = ("resnet50", "vgg16", "inception_v3", "densenet121", "bert_base", "gpt2")
PLANNERS = ("release_only", "tensile", "capuchin", "vdnn", "checkpoint")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--jobs", default="1,4")
    ap.add_argument("--gpu", default="rtx-a6000")
    args = ap.parse_args()
    hw = load_hardware(args.gpu)
    latency = Roofline()
    for model in args.models.split(","):
        trace = io.load(ROOT / "traces" / "data" / f"{model}_b16_adam.json.gz")
        for n in (int(x) for x in args.jobs.split(",")):
            t0 = time.perf_counter()
            c = compare_planners([trace] * n, DeviceModel(hw, latency), PLANNERS)
            print(f"== {model} x{n} (whole comparison {time.perf_counter() - t0:.1f} s)")
            print(text_table(c))
            print()


if __name__ == "__main__":
    from benchmarks.against import main_or_against

    main_or_against(main, "planners")

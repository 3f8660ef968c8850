"""CP-SAT on Checkmate's linear chain at Checkmate's budget.

For each n, `traces.synthetic.checkmate_chain(n)` (2n + 1 ops of 1 us, one
64 MiB buffer each, copies of milliseconds: only recomputation pays) is
planned by CP-SAT at B = (n + 2) // 2 units on rtx-a6000 (the trace's own
durations), where the optimum is 2n + 1 + B op times (Checkmate; the tests
re-derive it by brute force at small n). Each run is timed from the call
to the result (wall clock, model building and the hint phase included),
`--runs` times per n; the table gives the plan found (in op times), whether
CP-SAT proved it optimal, the median and worst time, and the model's size
(recomputable gaps and recompute points, NOTE [ Recompute chains ] in
planners/cpsat/chains.py). Every plan is checked and simulated (OOM policy
"fail"): the simulated time must equal the model's.

    python benchmarks/checkmate.py [--n 16,32,64] [--runs 5] [--workers 2]
        [--hint best|none|NAME] [--time-limit S]

The acceptance target: the optimum proven for n = 16, 32 and 64, n = 64 in
under 16 s on two cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memplan.hwmodels.device import DeviceModel  # noqa: E402
from memplan.hwmodels.latency import Measured  # noqa: E402
from memplan.hwmodels.profile import load_hardware  # noqa: E402
from memplan.planners.core.check import check  # noqa: E402
from memplan.planners.cpsat.data import build_data  # noqa: E402
from memplan.planners.cpsat.planner import CpsatOptions, cpsat  # noqa: E402
from memplan.sim import Job, simulate  # noqa: E402
from memplan.traces.synthetic import checkmate_chain  # noqa: E402

GPU = "rtx-a6000"
UNIT = 64 << 20


def one(n: int, opts: CpsatOptions, device: DeviceModel) -> tuple[float | None, bool, float]:
    """(plan in op times or None, proven optimal, wall seconds) of one run."""
    t = checkmate_chain(n)
    big = (n + 2) // 2
    t0 = time.perf_counter()
    r = cpsat([t], device, budget_bytes=big * UNIT, options=opts)
    wall = time.perf_counter() - t0
    if not r.plans:
        return None, False, wall
    check(r.plans[0], t)
    sim = simulate([Job(t, r.plans[0])], device, budget=big * UNIT, iterations=3, oom="fail")
    model_us = r.stats["iteration_time_s"] * 1e6
    sim_us = sim.jobs[0].iteration_time_s * 1e6
    if sim.jobs[0].oom or abs(sim_us - model_us) > 1e-6:
        raise SystemExit(f"n={n}: simulated {sim_us} us (oom {sim.jobs[0].oom}), model {model_us}")
    return model_us, r.stats["status"] == "OPTIMAL", wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", default="16,32,64", help="chain lengths (default 16,32,64)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--hint", default="best", help="best (default), none or a planner name")
    ap.add_argument("--time-limit", type=float, default=60.0)
    args = ap.parse_args()
    device = DeviceModel(load_hardware(GPU), Measured())
    opts = CpsatOptions(
        num_workers=args.workers,
        time_limit_s=args.time_limit,
        hint=None if args.hint == "none" else args.hint,
        progress=False,
    )
    print(f"{GPU}, {args.workers} workers, hint {args.hint}, {args.runs} runs each")
    print(f"{'n':>4}{'B':>4}{'optimum':>9}{'found':>9}{'proven':>8}{'median s':>10}{'worst s':>9}"
          f"{'rec gaps':>10}{'points':>8}")  # fmt: skip
    for n in (int(x) for x in args.n.split(",")):
        big = (n + 2) // 2
        data = build_data(checkmate_chain(n), device, big * UNIT, chain_depth=opts.chain_depth)
        rec = [g for g in data.gaps if g.recomputable]
        runs = [one(n, opts, device) for _ in range(args.runs)]
        found = {r[0] for r in runs}
        shown = "none" if found == {None} else "/".join(f"{x:g}" for x in sorted(found - {None}))
        proven = sum(r[1] for r in runs)
        walls = [r[2] for r in runs]
        print(
            f"{n:>4}{big:>4}{2 * n + 1 + big:>9}{shown:>9}{f'{proven}/{len(runs)}':>8}"
            f"{statistics.median(walls):>10.2f}{max(walls):>9.2f}"
            f"{len(rec):>10}{sum(len(g.rec_points) for g in rec):>8}",
            flush=True,
        )


if __name__ == "__main__":
    main()

"""Old commit against new: the simulator's and the planners' speed at two
commits of this repository, measured in one run.

`python benchmarks/against.py [--rev REV] [--rounds N] [--only sim|planners]`
checks REV (default: 0f2f132, the last commit before the namespace move) out
into a temporary git worktree and times the same workloads there and in this
checkout, each in a fresh subprocess of this interpreter, alternating old and
new for N rounds (default 5) so that drifting machine load hits both alike.
Each subprocess times every workload with `time.perf_counter`: one warm-up
call, then the median of 5 calls, each after a `gc.collect()` so that a
collection of earlier garbage does not land in it; the figures are the median of those over
rounds, and the ratio is new / old (below 1: the new code is faster). The subprocess for REV imports
only REV's code (this checkout's editable-install finder is removed from
`sys.meta_path` there, and for a REV with the `memplan.<layer>` layout a
finder maps those names onto REV's folders), whichever API generation REV has.

Workloads, on the shipped traces with roofline latencies on rtx-a6000, one job:
- sim: `simulate` of resnet50 for 3 iterations under release_only (plans
  checked first), vanilla, and passive mode at 60% of the liveness peak;
  densenet121 vanilla, four jobs sharing the GPU, 3 iterations; and one
  evaluation of a search planner (`memplan.evaluator`, where REV has it):
  capuchin's plan for densenet121 at 50% of its peak under the dtr net,
  2 iterations, and the net's moves read from the log;
- planners: tensile, capuchin, vdnn and checkpoint on resnet50 and
  bert_base, each with a budget of 80% of the vanilla peak.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_REV = "0f2f132"

# The start of a subprocess that imports one commit's code: the code root is
# argv[1], "isolate" or "installed" argv[3] (argv[2] is the caller's).
ISOLATE = r"""
import gc, json, os, sys, time
root, isolate = sys.argv[1], sys.argv[3] == "isolate"
if isolate:  # REV's code only: drop this checkout's editable-install finder
    sys.meta_path = [
        f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable__")
    ]
sys.path.insert(0, root)
if isolate and os.path.exists(os.path.join(root, "traces", "__init__.py")) and os.path.exists(
        os.path.join(root, "memplan", "__init__.py")):
    # REV has the memplan.<layer> layout (package-dir): map it onto REV's folders
    import importlib.util
    LAYERS = ("traces", "hwmodels", "planners", "sim", "validate")
    class Layout:
        def find_spec(self, name, path=None, target=None):
            parts = name.split(".")
            if parts[0] != "memplan":
                return None
            rest = parts[1:]
            base = [root, rest[0]] + rest[1:] if rest and rest[0] in LAYERS else [root, "memplan", *rest]
            loc = os.path.join(*base)
            if os.path.exists(os.path.join(loc, "__init__.py")):
                return importlib.util.spec_from_file_location(
                    name, os.path.join(loc, "__init__.py"), submodule_search_locations=[loc])
            if os.path.exists(loc + ".py"):
                return importlib.util.spec_from_file_location(name, loc + ".py")
            return None
    sys.meta_path.insert(0, Layout())
"""

# Runs inside the subprocess after ISOLATE, with the workload as argv[2].
_PROBE_BODY = r"""
only = sys.argv[2]
try:
    from memplan.hwmodels.device import DeviceModel
    from memplan.hwmodels.latency import Roofline
    from memplan.hwmodels.profile import load_hardware
    from memplan.planners import registry
    from memplan.planners.heuristics.vanilla import release_only_plan
    from memplan.sim import Job, simulate
    from memplan.traces import io
    new = True
except ImportError:
    from hwmodels.latency import Roofline
    from hwmodels.profile import load_hardware
    from planners import registry
    from planners.vanilla import release_only_plan
    from sim import Job, simulate
    from traces import io
    new = False
hw, lat = load_hardware("rtx-a6000"), Roofline()
dev = DeviceModel(hw, lat) if new else None
def sim(jobs, **kw):
    return simulate(jobs, dev, **kw) if new else simulate(jobs, hw, lat, **kw)
def plan(name, t, budget):
    if new:
        return registry.run(name, [t], dev, budget_bytes=budget)
    return registry.run(name, [t], hw, lat, budget_bytes=budget)
def load(model):
    return io.load(f"{root}/traces/data/{model}_b16_adam.json.gz")
def timed(fn, repeats=5):
    fn()
    times = []
    for _ in range(repeats):
        gc.collect()  # earlier garbage is not this call's cost
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return sorted(times)[repeats // 2]
out = {}
if only in ("sim", "all"):
    t = load("resnet50")
    p = release_only_plan(t)
    budget = int(t.peak("liveness")[0] * 0.6)
    out["sim release_only x3"] = timed(lambda: sim([Job(t, p)], iterations=3))
    out["sim vanilla x3"] = timed(lambda: sim([t], iterations=3))
    out["sim passive 60% x3"] = timed(
        lambda: sim([Job(t, p)], iterations=3, budget=budget, oom="passive"))
    d = load("densenet121")
    out["sim densenet121 x4 jobs x3"] = timed(lambda: sim([d] * 4, iterations=3))
    try:  # a search planner's evaluation: the run and what the net did, from the log
        from memplan.evaluator import sim_evaluator
    except ImportError:
        sim_evaluator = None
    if sim_evaluator is not None:
        half = int(d.peak("framework")[0] * 0.5)
        cp = plan("capuchin", d, half).plans[0]
        ev = sim_evaluator([d], dev, half)
        out["evaluate densenet121 50% dtr"] = timed(lambda: ev([cp], "dtr"))
if only in ("planners", "all"):
    for model in ("resnet50", "bert_base"):
        t = load(model)
        budget = int(t.peak("framework")[0] * 0.8)
        for name in ("tensile", "capuchin", "vdnn", "checkpoint"):
            out[f"plan {name} {model}"] = timed(lambda name=name, t=t: plan(name, t, budget))
print(json.dumps({"api": "memplan.*" if new else "top-level", "seconds": out}))
"""
PROBE = ISOLATE + _PROBE_BODY


@contextmanager
def worktree(rev: str) -> Iterator[Path]:
    """Commit `rev` checked out into a temporary git worktree, removed on exit."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "old"
        subprocess.run(
            ["git", "worktree", "add", "--detach", "-q", str(root), rev], cwd=ROOT, check=True
        )
        try:
            yield root
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(root)], cwd=ROOT)


def run_probe(root: Path, only: str, isolate: bool) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(root), only, "isolate" if isolate else "installed"],
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
        check=False,
    )
    if out.returncode != 0:
        raise SystemExit(f"probe in {root} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default=DEFAULT_REV, help=f"the old commit (default {DEFAULT_REV})")
    ap.add_argument("--rounds", type=int, default=5, help="old/new pairs, interleaved")
    ap.add_argument("--only", choices=("sim", "planners", "all"), default="all")
    args = ap.parse_args()
    with worktree(args.rev) as old_root:
        old_runs, new_runs = [], []
        for r in range(args.rounds):
            old_runs.append(run_probe(old_root, args.only, isolate=True))
            new_runs.append(run_probe(ROOT, args.only, isolate=False))
            print(f"round {r + 1}/{args.rounds} done", file=sys.stderr)
    print(
        f"old: {args.rev} ({old_runs[0]['api']} API), new: this checkout "
        f"({new_runs[0]['api']} API); {args.rounds} interleaved rounds, each a fresh "
        f"process timing each workload as the median of 5 calls after a warm-up; medians over rounds, ms"
    )
    print(f"{'workload':<34}{'old':>10}{'new':>10}{'new/old':>9}")
    ratios = []
    for key in old_runs[0]["seconds"]:
        if key not in new_runs[0]["seconds"]:
            continue  # a workload only one of the commits has
        old = statistics.median(r["seconds"][key] for r in old_runs)
        new = statistics.median(r["seconds"][key] for r in new_runs)
        ratios.append(new / old)
        print(f"{key:<34}{old * 1e3:10.1f}{new * 1e3:10.1f}{new / old:9.3f}")
    print(f"{'geometric mean of ratios':<54}{statistics.geometric_mean(ratios):9.3f}")


def main_or_against(own_main: Callable[[], None], only: str) -> None:
    """A benchmark's entry: its own `own_main`, or with `--against REV` this
    module's old-against-new timing of its workloads."""
    if "--against" not in sys.argv:
        own_main()
        return
    rev = sys.argv[sys.argv.index("--against") + 1]
    sys.argv = [sys.argv[0], "--rev", rev, "--only", only]
    main()


if __name__ == "__main__":
    main()

"""The comparison table of every heuristic planner on the shipped traces, and
the planning-time ladder.

Comparison (the default): for each shipped model at batch 16 (Adam) on the
rtx-a6000 profile with the roofline latency model: one job, then four jobs of
the same model sharing the GPU and its one PCIe lane. Each planner plans, its
plans are checked and simulated for 3 iterations, and TENSILE's metrics are
computed against the vanilla run of the same jobs (memplan.comparison).
Capuchin's budget is the peak TENSILE reached. "plan" is the planner's wall
time (time.perf_counter) on this machine, one run each; everything else is
simulated and deterministic.

Ladder (`--ladder`, issue 36): planning time on synthetic steps
(`synthetic.sized(n, seed=0, family=F)`) of four families (residual, chain,
unet, random_dag) x 1k, 3k, 10k and 30k ops, rtx-a6000, roofline latencies,
one job: tensile without a budget, capuchin and autoswap at 80% of the
framework peak (`--budget F` sets one fraction for all three; `--shipped`
adds the six shipped traces). A long-lived worker process, warmed up on a
300-op step, makes each cell's trace and calls `registry.run` three times,
each timed with `time.perf_counter` after a `gc.collect()`: on the fresh
trace ("s": what a user waits, the trace's own caches -- its fingerprint,
op costs, lifetimes -- built inside), on the same trace again, and again
capped at one round (tensile `max_iterations=1`, capuchin `max_rounds=1`).
"ms/round" is (second call - capped call) / (rounds - 1): what a round
costs with the setup taken out. Rounds are tensile's swap rounds (shown
as "-" where it also recomputed: the capped call recomputes from another
state) and Capuchin's rounds; AutoSwap has none. Every figure is
the median over `--rounds` (default 3). Targets: tensile under 1 s at 3k
ops and 5 s at 30k on every family, and ms/round within 3x from 1k to 30k
ops on each family. A cell whose three calls run past `--cell-timeout`
(default 300 s) is shown as `>T` and not run again.
With `--against REV` the same cells run at commit REV too (a git worktree,
imported alone: benchmarks/against.py), one worker per commit, old and new
alternating per cell in each round (the first in one round goes second in
the next); the ratio is new / old of "s", and `plan` says whether the two
commits' plans have the same events in the same order (a digest of them).

Usage: python benchmarks/planners.py [--models resnet50,bert_base] [--jobs 1,4]
       python benchmarks/planners.py --ladder [--sizes 1000,3000] [--families residual]
              [--planners tensile] [--rounds 3] [--budget 0.6] [--shipped] [--against REV]
       python benchmarks/planners.py --against REV   (planning time at commit REV
       against this checkout, interleaved in one run, ratio printed: benchmarks/against.py)
"""

from __future__ import annotations

import argparse
import json
import select
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from memplan.hwmodels.device import DeviceModel

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memplan.hwmodels.latency import Roofline  # noqa: E402
from memplan.hwmodels.profile import load_hardware  # noqa: E402
from memplan.traces import io  # noqa: E402

from benchmarks.against import ISOLATE, worktree  # noqa: E402
from memplan.comparison import compare_planners  # noqa: E402
from memplan.report import text_table  # noqa: E402

MODELS = ("resnet50", "vgg16", "inception_v3", "densenet121", "bert_base", "gpt2")
PLANNERS = ("release_only", "tensile", "capuchin", "vdnn", "checkpoint")
FAMILIES = ("residual", "chain", "unet", "random_dag")
SIZES = (1000, 3000, 10000, 30000)
LADDER_PLANNERS = ("tensile", "capuchin", "autoswap")
# a planner's budget on the ladder, as a fraction of the framework peak (None: no budget)
LADDER_BUDGETS: dict[str, float | None] = {"tensile": None, "capuchin": 0.8, "autoswap": 0.8}


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


# ---- the ladder ------------------------------------------------------------------------
# Runs in a worker after ISOLATE: one JSON cell per stdin line, one JSON answer per line.
_WORKER_BODY = r"""
import hashlib
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners import registry
from memplan.traces import io, synthetic
dev = DeviceModel(load_hardware("rtx-a6000"), Roofline())
ONE_ROUND = {"tensile": "max_iterations=1", "capuchin": "max_rounds=1"}
def trace(source):
    family, _, n = source.partition("/")
    if n:
        return synthetic.sized(int(n), seed=0, family=synthetic.Family(family))
    return io.load(f"{root}/traces/data/{source}_b16_adam.json.gz")
def rounds(stats):
    if "rounds" in stats:  # tensile: its swap rounds; None if it recomputed too
        return None if stats.get("recompute_picks") else stats["rounds"]
    if "jobs" in stats:
        return sum(j.get("rounds", 0) for j in stats["jobs"])
    return None
def timed(cell, t, options=None):
    frac = cell["budget"]
    budget = None if frac is None else int(t.peak("framework")[0] * frac)
    gc.collect()
    t0 = time.perf_counter()
    r = registry.run(cell["planner"], [t], dev, budget_bytes=budget, options=options)
    return time.perf_counter() - t0, r
for name in ("tensile", "capuchin", "autoswap"):  # imports and first-call caches
    timed({"planner": name, "budget": 0.8}, trace("residual/300"))
print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    cell = json.loads(line)
    t = trace(cell["source"])
    cold, r = timed(cell, t)
    warm, _ = timed(cell, t)
    one = ONE_ROUND.get(cell["planner"])
    one_s = timed(cell, t, [one])[0] if one else None
    digest = hashlib.sha1(repr([(p.events, getattr(p, "order", None)) for p in r.plans]).encode())
    print(json.dumps({"cold": cold, "warm": warm, "one": one_s, "rounds": rounds(r.stats),
                      "events": sum(len(p.events) for p in r.plans),
                      "digest": digest.hexdigest()[:12]}), flush=True)
"""
WORKER = ISOLATE + _WORKER_BODY


@dataclass(frozen=True, slots=True)
class Cell:
    """One ladder cell: `planner` on `source` ("family/ops" or a shipped
    model), at `budget` times the framework peak (None: no budget)."""

    source: str
    planner: str
    budget: float | None

    def request(self) -> str:
        return json.dumps({"source": self.source, "planner": self.planner, "budget": self.budget})


@dataclass(slots=True)
class Worker:
    """A long-lived ladder worker importing one commit's code."""

    label: str
    root: Path
    isolate: bool
    proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(self.root), "ladder", _mode(self.isolate)],
            cwd=tempfile.gettempdir(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        if self._read(600.0) is None:
            raise SystemExit(f"ladder worker for {self.label} ({self.root}) did not start")

    def ask(self, cell: Cell, timeout_s: float) -> dict | None:
        """The worker's answer for `cell`, or None if it ran past `timeout_s`
        (the worker is then stopped; the next call starts a new one)."""
        if self.proc is None:
            self.start()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(cell.request() + "\n")
        self.proc.stdin.flush()
        out = self._read(timeout_s)
        if out is None:
            self.stop()
        return out

    def _read(self, timeout_s: float) -> dict | None:
        assert self.proc is not None and self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout_s)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            if self.proc.poll() is not None:
                raise SystemExit(f"ladder worker for {self.label} exited ({self.proc.returncode})")
            return None
        return json.loads(line)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def _mode(isolate: bool) -> str:
    return "isolate" if isolate else "installed"


@dataclass(slots=True)
class Runs:
    """One commit's answers for one cell, over rounds."""

    answers: list[dict] = field(default_factory=list)
    timed_out: bool = False

    def cold_s(self) -> float | None:
        """The median call on a fresh trace (s)."""
        return statistics.median(a["cold"] for a in self.answers) if self.answers else None

    def per_round_s(self) -> float | None:
        """The median over runs of (warm call - call capped at one round) /
        (rounds - 1): what one more round costs, setup apart (s)."""
        rounds = self.answers[0]["rounds"] if self.answers else None
        if not rounds or rounds < 2 or self.answers[0]["one"] is None:
            return None
        return statistics.median((a["warm"] - a["one"]) / (rounds - 1) for a in self.answers)


def ladder_cells(args: argparse.Namespace) -> list[Cell]:
    sources = [f"{f}/{n}" for f in args.families.split(",") for n in _ints(args.sizes)]
    if args.shipped:
        sources += list(MODELS)
    cells = []
    for source in sources:
        for planner in args.planners.split(","):
            budget = LADDER_BUDGETS.get(planner) if args.budget is None else args.budget
            cells.append(Cell(source, planner, budget))
    return cells


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def run_ladder(cells: list[Cell], workers: list[Worker], rounds: int, timeout_s: float):
    """{(cell, worker label): Runs}, old and new alternating per cell."""
    runs = {(c, w.label): Runs() for c in cells for w in workers}
    for r in range(rounds):
        for c in cells:
            for w in workers if r % 2 == 0 else workers[::-1]:
                got = runs[c, w.label]
                if got.timed_out:
                    continue
                answer = w.ask(c, timeout_s)
                if answer is None:
                    got.timed_out = True
                else:
                    got.answers.append(answer)
        print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    return runs


def _side(got: Runs, timeout_s: float) -> str:
    s = got.cold_s()
    if s is None:
        return f"{'>' + format(timeout_s, '.0f'):>9}{'':>7}{'':>10}"
    n, per = got.answers[0]["rounds"], got.per_round_s()
    return f"{s:9.3f}{'-' if n is None else n:>7}{'-' if per is None else format(per * 1e3, '.2f'):>10}"


def print_ladder(cells: list[Cell], workers: list[Worker], runs, timeout_s: float) -> None:
    head = f"{'source':<18}{'planner':<10}"
    for w in workers:
        head += f"{w.label + ' s':>9}{'rounds':>7}{'ms/round':>10}"
    if len(workers) == 2:
        head += f"{'new/old':>9}{'plan':>6}"
    print(head)
    for c in cells:
        line = f"{c.source:<18}{c.planner:<10}"
        for w in workers:
            line += _side(runs[c, w.label], timeout_s)
        if len(workers) == 2:
            old, new = (runs[c, w.label] for w in workers)
            so, sn = old.cold_s(), new.cold_s()
            line += f"{sn / so:9.3f}" if so and sn else f"{'-':>9}"
            if old.answers and new.answers:
                same = old.answers[0]["digest"] == new.answers[0]["digest"]
                line += f"{'same' if same else 'DIFF':>6}"
        print(line)


def ladder_main() -> None:
    ap = argparse.ArgumentParser(description="the planning-time ladder (see the docstring)")
    ap.add_argument("--ladder", action="store_true")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--sizes", default=",".join(str(n) for n in SIZES))
    ap.add_argument("--planners", default=",".join(LADDER_PLANNERS))
    ap.add_argument("--budget", type=float, default=None, help="one budget fraction for all")
    ap.add_argument("--shipped", action="store_true", help="add the six shipped traces")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cell-timeout", type=float, default=300.0)
    ap.add_argument("--against", default=None, help="an old commit to time alongside")
    args = ap.parse_args()
    cells = ladder_cells(args)
    with ExitStack() as stack:
        workers = []
        if args.against:
            old_root = stack.enter_context(worktree(args.against))
            workers.append(Worker("old", old_root, isolate=True))
        workers.append(Worker("new", ROOT, isolate=False))
        for w in workers:
            stack.callback(w.stop)
        runs = run_ladder(cells, workers, args.rounds, args.cell_timeout)
    where = f"old: {args.against}, new: this checkout; " if args.against else ""
    print(
        f"{where}rtx-a6000, roofline, one job; medians of {args.rounds} rounds (old and new "
        "alternating per cell); s: one call on a fresh trace; ms/round: (call on the same "
        "trace again - call capped at one round) / (rounds - 1)"
    )
    print_ladder(cells, workers, runs, args.cell_timeout)


if __name__ == "__main__":
    if "--ladder" in sys.argv:
        ladder_main()
    else:
        from benchmarks.against import main_or_against

        main_or_against(main, "planners")

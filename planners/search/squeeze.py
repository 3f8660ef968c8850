"""squeeze: memplan's planner for memory pressure.

Anytime search scored by the simulator the app shell injects
(`planners.core.evaluate.Evaluator`); NOTE [ Squeeze ] says how it goes.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from memplan.hwmodels.device import DeviceModel
from memplan.planners.analysis.bounds import joint_peak_lower_bound
from memplan.planners.analysis.optimes import op_durations_us, predict_timelines
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.evaluate import Evaluation, Evaluator, OomPolicy
from memplan.planners.core.options import options_dict
from memplan.planners.core.plan import (
    Plan,
    PlanResult,
    Reason,
    Status,
)
from memplan.planners.heuristics.capuchin.planner import capuchin
from memplan.planners.heuristics.checkpoint import checkpoint
from memplan.planners.heuristics.tensile.planner import tensile
from memplan.planners.heuristics.vanilla import release_only_plan
from memplan.planners.heuristics.vdnn import vdnn
from memplan.planners.search.crossing import cross_candidates, cross_events
from memplan.planners.search.moves import Search
from memplan.planners.search.netplan import plan_from_net
from memplan.planners.search.offload import offload_candidates, offload_events
from memplan.planners.search.rounds import Rounds
from memplan.traces.model import Trace

SEEDS: dict[str, Callable[..., PlanResult]] = {
    "tensile": tensile,
    "capuchin": capuchin,
    "checkpoint": checkpoint,
    "vdnn": vdnn,
}
NETS = (OomPolicy.PASSIVE, OomPolicy.DTR)
BUDGET_FREE = ("vdnn",)  # plans that do not depend on the budget
MAX_STARTS = 10  # NOTE [ Squeeze ]: starts improved in turn while evaluations are left
SPLIT = 4  # NOTE [ Time left over ]: a start may use 1/SPLIT of what is left
FAR = 1.25  # NOTE [ Time left over ]: starts this much slower than the best plan are skipped
POLISH = 0.05  # NOTE [ Polish ]: shares of the time and evaluations kept for the best plan
POLISH_KINDS = ("queue", "stall")  # NOTE [ Polish ]: the moves it gets then
NET_ROUNDS = 3  # NOTE [ Squeeze ]: a net's choices written down, run under the net again


@dataclass(frozen=True, slots=True)
class SqueezeOptions:
    """- `time_limit_s`: wall-clock cap; `max_evaluations`: cap on simulated
      candidates -- the search is deterministic for a seed when this one
      binds first (NOTE [ Squeeze ]).
    - `seeds`: heuristics to start from; `scales`: the budgets they are asked
      for, as shares of the real one (their memory models are not the
      simulator's, so a tighter ask may be what fits).
    - `nets`: OOM policies whose choices are turned into plans.
    - `offload`: shares of the persistent bytes first used after the peak
      taken off the device from each iteration's start as further starts
      (NOTE [ Offload at the iteration start ]); "" for none.
    - `cross`: shares of the bytes of the persistent buffers used before the
      peak taken off the device across the iteration boundary, laid over
      release_only, the first offloaded start and the heuristics' plans that
      fall short, as further starts, and the moves of the rounds that do so
      (NOTE [ State swaps across the boundary ]); "" for neither.
    - `seed`: order of equal-gain moves."""

    time_limit_s: float = 60.0
    max_evaluations: int = 3000
    seeds: str = "tensile,capuchin,checkpoint,vdnn"
    scales: str = "1,0.9,0.8,0.7"
    nets: str = "passive,dtr"
    offload: str = "1,0.75,0.5"
    cross: str = "1"
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.time_limit_s > 0:
            raise ValueError(f"time_limit_s={self.time_limit_s!r} must be > 0")
        if self.max_evaluations < 1:
            raise ValueError(f"max_evaluations={self.max_evaluations!r} must be >= 1")
        for name in _names(self.seeds):
            if name not in SEEDS:
                raise ValueError(f"seeds: {name!r} is not one of {', '.join(SEEDS)}")
        for name in _names(self.nets):
            if name not in NETS:
                raise ValueError(f"nets: {name!r} is not one of {', '.join(NETS)}")
        for s in _scales(self.scales):
            if not 0 < s <= 1:
                raise ValueError(f"scales: {s!r} must be in (0, 1]")
        for what in ("offload", "cross"):
            for s in _scales(getattr(self, what)):
                if not 0 < s <= 1:
                    raise ValueError(f"{what}: {s!r} must be in (0, 1]")


def _names(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _scales(text: str) -> list[float]:
    try:
        return [float(x) for x in _names(text)]
    except ValueError:
        raise ValueError(f"{text!r}: expected numbers separated by commas") from None


# NOTE [ Squeeze ]
# 1. Start: release_only (free after the last access); if it fits, nothing better exists.
# 2. Seeds: each heuristic of `seeds` asked for the budget times each of `scales` (largest
#    first; the first that fits is kept); each net of `nets` run under release_only, its
#    choices written as plan events (NOTE [ From the net to a plan ]) and run under the net
#    again while short, up to `NET_ROUNDS` times; all of this again with persistent buffers
#    offloaded per share of `offload` (NOTE [ Offload at the iteration start ]) and off
#    across the boundary per share of `cross` (NOTE [ State swaps across the boundary ]).
#    Candidates that fit alone, simulated without a net, are the starts.
# 3. Improve: rounds of batched moves (NOTE [ Batched acceptance ]) -- swap <-> recompute,
#    swaps across the boundary, earlier prefetches, dropped deadlines, prunes, then the
#    moves that read the simulated run (NOTE [ Hidden swaps ], `queue_moves`, `stall_moves`,
#    `pair_prune_moves`) -- while one gains. `MAX_STARTS` starts in turn, the nets' first
#    (NOTE [ Time left over ]); the fastest result, after NOTE [ Polish ], is the plan.
# Stops at `max_evaluations` or `time_limit_s`; only the first is machine-independent
# (`stats["stopped_by"]`). Full text and measurements: docs/planners.md, "Squeeze".
# NOTE [ Time left over ]
# Which start ends best shows only once it has been improved a while. So each start gets
# 1/`SPLIT` of the evaluations and time left (the nets' starts, which win most cells, come
# first and still get most of it); a start over `FAR` times slower than the best plan so far
# is skipped; and what is left after the last start goes to the searches their share cut
# short, fastest first, each resumed where it stopped (its refused moves remembered).
# Measurements: docs/planners.md, "Time left over".
# NOTE [ Polish ]
# The starts stop on the time limit, mostly in the middle of a round's prunes and hidden
# swaps, so the moves that read the best plan's simulated run last (`queue`, `stall`: a few
# evaluations each, the largest gain per evaluation of all kinds) would never be tried on
# the plan that is returned. `POLISH` of the time and of the evaluations is held back while
# the starts are improved, and spent on rounds of those two kinds alone on the best plan
# found, the queue first, as in a round. Measurements: docs/planners.md, "Polish".
def squeeze(
    traces: Sequence[Trace],
    device: DeviceModel,
    *,
    budget_bytes: int | None = None,
    options: SqueezeOptions | None = None,
    evaluator: Evaluator | None = None,
) -> PlanResult:
    """Search for the fastest plans that fit `budget_bytes` on their own."""
    opts = options or SqueezeOptions()
    t0 = time.perf_counter()
    base = [release_only_plan(t) for t in traces]

    def result(
        status: Status, plans: Sequence[Plan], reason: Reason, detail: str, **stats
    ) -> PlanResult:
        return PlanResult(
            "squeeze", status, tuple(plans), reason, detail, time.perf_counter() - t0,
            options_dict(opts), stats,
        )  # fmt: skip

    if budget_bytes is None:
        return result(Status.PLANNED, base, Reason.NONE, "no budget: release_only")
    floor = joint_peak_lower_bound(traces).nbytes
    if budget_bytes < floor:
        detail = f"budget {budget_bytes} B is below the proven peak floor {floor} B"
        return result(Status.INFEASIBLE, (), Reason.BELOW_BOUND, detail)
    if evaluator is None:
        detail = "squeeze scores plans by simulation: run it from memplan (compare, plan)"
        return result(Status.STOPPED, (), Reason.NO_MOVE_LEFT, detail)
    run = _Run(traces, device, budget_bytes, opts, evaluator, t0)
    starts = run.seed(base)
    if not starts:
        detail = f"no seed fits on its own; tried {', '.join(run.tried)}"
        return result(Status.STOPPED, (), Reason.NO_MOVE_LEFT, detail, **run.stats())
    ev, plans, run.origin = min(starts, key=lambda c: c[0].iteration_s)  # kept if none beats it
    best = Search(plans, ev, run.evaluate, run.out_of_time)
    starts = starts[:MAX_STARTS]
    run.hold_back(POLISH)
    cut: list[tuple[Search, str]] = []  # searches stopped by their share, still gaining
    for i, (ev, plans, label) in enumerate(starts):  # NOTE [ Squeeze ], step 3
        if i and run.out_of_time():
            break
        if ev.iteration_s > FAR * best.best.iteration_s:  # NOTE [ Time left over ]
            continue
        search = Search(plans, ev, run.evaluate, run.share(len(starts) - i))
        if not run.improve(search, base):
            cut.append((search, label))
        run.improved += 1
        if search.best.iteration_s < best.best.iteration_s:
            best, run.origin = search, label
    for search, label in sorted(cut, key=lambda c: c[0].best.iteration_s):
        if run.out_of_time():  # NOTE [ Time left over ]
            break
        search.out_of_time = run.out_of_time
        run.improve(search, base)
        if search.best.iteration_s < best.best.iteration_s:
            best, run.origin = search, label
    run.hold_back(0.0)  # NOTE [ Polish ]
    polish = Search(best.plans, best.best, run.evaluate, run.out_of_time)
    run.improve(polish, base, only=POLISH_KINDS)
    if polish.best.iteration_s < best.best.iteration_s:
        best = polish
        run.origin += " (polished)"
    return result(Status.PLANNED, best.plans, Reason.NONE, "", **run.stats(best))


def start_order(
    starts: Sequence[tuple[Evaluation, list[Plan], str]],
) -> list[tuple[Evaluation, list[Plan], str]]:
    """The order starts are improved in (NOTE [ Squeeze ], step 3): those
    made from a net's choices (labelled "+<net>x<round>") first, each group
    fastest first, ties in the order given."""

    def from_net(label: str) -> bool:
        return any(f"+{n}x" in label for n in NETS)

    return sorted(starts, key=lambda c: (not from_net(c[2]), c[0].iteration_s))


class _Run:
    """One squeeze run: the candidates it tried and its limits."""

    def __init__(
        self,
        traces: Sequence[Trace],
        device: DeviceModel,
        budget: int,
        opts: SqueezeOptions,
        evaluator: Evaluator,
        t0: float,
    ):
        self.traces, self.device, self.budget, self.opts = traces, device, budget, opts
        self.evaluator = evaluator
        self.t0 = t0
        self.deadline = t0 + opts.time_limit_s
        self.max_evaluations = opts.max_evaluations
        self.evaluations = 0
        self.slowest_s = 0.0  # the longest evaluation so far
        self.timed_out = False
        self.held_timed_out = False  # the starts stopped on their (held back) time
        self.tried: list[str] = []
        self.origin = ""
        self.improved = 0  # starts improved
        self.offload_base: list[tuple[list[Plan], str]] = []  # release_only, first offload share
        rng = random.Random(opts.seed)
        # NOTE [ Squeeze stops at the compute floor ]
        # One job's iteration is never shorter than its ops' durations; a plan
        # that fits and runs in that time cannot be beaten, so the search ends
        # there (a heuristic's plan at 90% of the peak usually does) instead
        # of spending its limit.
        self.durations = [op_durations_us(t, device) for t in traces]
        self.timelines = predict_timelines(traces, device)
        self.floor_s = float(sum(self.durations[0])) * 1e-6 if len(traces) == 1 else 0.0
        self.at_floor = False
        self.rounds = Rounds(
            traces, device, budget, self.timelines, self.durations, rng, bool(_names(opts.cross))
        )

    def out_of_time(self) -> bool:
        """No time for one more evaluation (the slowest so far, with a margin:
        the limit holds for the whole run, not only for when it stops)."""
        if time.perf_counter() + 1.5 * self.slowest_s > self.deadline:
            self.timed_out = True
        return self.timed_out or self.at_floor or self.evaluations >= self.max_evaluations

    def hold_back(self, share: float) -> None:
        """Keep `share` of the time limit and of the evaluations out of reach
        until called again with 0 (NOTE [ Polish ])."""
        self.held_timed_out |= self.timed_out
        self.timed_out = False
        self.deadline = self.t0 + self.opts.time_limit_s * (1 - share)
        self.max_evaluations = max(1, int(self.opts.max_evaluations * (1 - share)))

    def share(self, starts_left: int) -> Callable[[], bool]:
        """`out_of_time` for the next of `starts_left` starts: it may use
        1/`SPLIT` of the evaluations and time left, 1/k of them when k <
        `SPLIT` starts are left, the last one all (NOTE [ Squeeze ])."""
        k = min(starts_left, SPLIT)
        evals = self.evaluations + (self.max_evaluations - self.evaluations) // k
        until = time.perf_counter() + (self.deadline - time.perf_counter()) / k

        def out() -> bool:
            if self.out_of_time():
                return True
            return self.evaluations >= evals or time.perf_counter() + self.slowest_s > until

        return out

    def evaluate(
        self, plans: Sequence[Plan], policy: OomPolicy = OomPolicy.FAIL
    ) -> Evaluation | None:
        """The simulated run of `plans` (checked first: None if they fail)."""
        try:
            for p, t in zip(plans, self.traces, strict=True):
                check(p, t)
        except PlanError:
            return None
        self.evaluations += 1
        t0 = time.perf_counter()
        ev = self.evaluator(plans, policy)
        self.slowest_s = max(self.slowest_s, time.perf_counter() - t0)
        if ev is not None and ev.fits and ev.iteration_s <= self.floor_s * (1 + 1e-9):
            self.at_floor = True
        return ev

    def stats(self, search: Search | None = None) -> dict:
        out = {
            "evaluations": self.evaluations,
            "stopped_by": "time limit"
            if self.timed_out or self.held_timed_out
            else "at the compute floor"
            if self.at_floor
            else "evaluations or no move left",
            "tried": list(self.tried),
            "start": self.origin,
            "starts_improved": self.improved,
            # per kind of move, over all starts: evaluations, and ms it took off
            "moves": {k: [n, round(g * 1e3, 3)] for k, (n, g) in self.rounds.moves.items()},
        }
        if search is not None:
            out["predicted_iteration_s"] = search.best.iteration_s
        return out

    # ---- step 1 and 2 --------------------------------------------------------------
    def seed(self, base: list[Plan]) -> list[tuple[Evaluation, list[Plan], str]]:
        """The starts that fit on their own, fastest first (equal plans once)."""
        fit: list[tuple[Evaluation, list[Plan], str]] = []

        def offer(plans: Sequence[Plan], label: str) -> bool:
            self.tried.append(label)
            ev = self.evaluate(plans)
            if ev is None or not ev.fits:
                return False
            if all(list(plans) != p for _, p, _ in fit):
                fit.append((ev, list(plans), label))
            return True

        if offer(base, "release_only"):
            return fit
        short: list[tuple[list[Plan], str]] = [(base, "release_only")]
        for name in _names(self.opts.seeds):
            scales = [1.0] if name in BUDGET_FREE else _scales(self.opts.scales)
            for s in scales:
                if self.out_of_time():
                    break
                r = SEEDS[name](self.traces, self.device, budget_bytes=int(self.budget * s))
                if not r.plans:
                    continue
                if offer(r.plans, f"{name}@{s:g}"):
                    break
                if s == scales[0]:
                    short.append((list(r.plans), f"{name}@{s:g}"))
        heuristics_short = short[1:]
        short += self.offloaded(base, offer)
        short += self.crossed([short[0], *self.offload_base, *heuristics_short], offer)
        for plans, label in short:
            for net in map(OomPolicy, _names(self.opts.nets)):
                cur = plans
                for k in range(1, NET_ROUNDS + 1):
                    if self.out_of_time():
                        break
                    netted = self.with_net(cur, net)
                    if netted is None:
                        self.tried.append(f"{label}+{net}x{k} (ran out)")
                        break
                    if offer(netted, f"{label}+{net}x{k}"):
                        break
                    cur = netted
        return start_order(fit)

    def offloaded(
        self, base: list[Plan], offer: Callable[[Sequence[Plan], str], bool]
    ) -> list[tuple[list[Plan], str]]:
        """Starts with persistent buffers offloaded at the iteration start
        (NOTE [ Offload at the iteration start ]), for each share of
        `offload`: release_only with them, and each heuristic of `seeds`
        asked for the budget plus the bytes they free, with them; offered to
        `offer`, and returned when short (release_only's only: the nets then
        choose around them)."""
        cands = [offload_candidates(t) for t in self.traces]
        if not any(cands):
            return []
        timelines = self.timelines
        short = []
        for f in _scales(self.opts.offload):
            if self.out_of_time():
                break
            pairs = zip(self.traces, timelines, cands, strict=True)
            made = [offload_events(t, self.device, tl, c, f, self.budget) for t, tl, c in pairs]
            freed = sum(n for _, n in made)

            def plus(plans: Sequence[Plan], made=made) -> list[Plan]:
                return [
                    Plan(p.trace_fingerprint, (*p.events, *evs), p.model)
                    for p, (evs, _n) in zip(plans, made, strict=True)
                ]

            label = f"offload{f:g}"
            if not self.offload_base:
                self.offload_base.append((plus(base), f"release_only+{label}"))
            if not offer(plus(base), f"release_only+{label}"):
                short.append((plus(base), f"release_only+{label}"))
            for name in _names(self.opts.seeds):
                if name in BUDGET_FREE or self.out_of_time():
                    continue
                r = SEEDS[name](self.traces, self.device, budget_bytes=self.budget + freed)
                if r.plans:
                    offer(plus(r.plans), f"{name}+{label}")
        return short

    def crossed(
        self,
        bases: list[tuple[list[Plan], str]],
        offer: Callable[[Sequence[Plan], str], bool],
    ) -> list[tuple[list[Plan], str]]:
        """Starts with persistent buffers off across the iteration boundary
        (NOTE [ State swaps across the boundary ]), for each share of `cross`:
        each of `bases` with them, offered to `offer`; the first base's
        (release_only's) returned when short, for the nets."""
        cands = [cross_candidates(t, self.budget) for t in self.traces]
        if not any(cands):
            return []
        short = []
        for f in _scales(self.opts.cross):
            pairs = zip(self.traces, self.timelines, cands, strict=True)
            made = [cross_events(t, self.device, tl, c, f, self.budget) for t, tl, c in pairs]
            for k, (plans, label) in enumerate(bases):
                if self.out_of_time():
                    return short
                crossed = [
                    Plan(p.trace_fingerprint, (*p.events, *evs), p.model)
                    for p, evs in zip(plans, made, strict=True)
                ]
                if not offer(crossed, f"{label}+cross{f:g}") and k == 0:
                    short.append((crossed, f"{label}+cross{f:g}"))
        return short

    def with_net(self, plans: list[Plan], net: OomPolicy) -> list[Plan] | None:
        """`plans` plus what the `net` policy did to them, as events (NOTE
        [ From the net to a plan ]); None if they ran out even with the net."""
        ev = self.evaluate(plans, net)
        if ev is None or ev.oom_at is not None:
            return None
        it = ev.iterations - 1
        pairs = zip(self.traces, plans, strict=True)
        return [plan_from_net(t, p, ev.moves, j, it)[0] for j, (t, p) in enumerate(pairs)]

    # ---- step 3 ----------------------------------------------------------------------
    def improve(self, search: Search, base: list[Plan], only: tuple[str, ...] = ()) -> bool:
        """Rounds of moves on `search` while one gains (`Rounds.improve`)."""
        return self.rounds.improve(search, base, only)

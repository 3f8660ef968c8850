"""AutoSwap (SmartPool/AutoSwap §IV): swap candidates ranked by priority
scores, chosen in score order until the peak fits, scheduled in access order;
the score a weighted sum of the four, its weights tuned by Bayesian
optimisation against the simulated iteration time.

1. Candidates: big enough, alive across the peak (`scores`,
   NOTE [ AutoSwap candidates ]).
2. Scores DOA, AOA, WDOA, SWDOA (NOTE [ AutoSwap scores ]).
3. Selection and scheduling (`schedule`, NOTE [ AutoSwap
   selection ], NOTE [ AutoSwap scheduling ]).
4. With `score=bo`, Bayesian optimisation of the weights (NOTE [ AutoSwap
   BO ]); optuna is an optional extra (`pip install memplan[bo]`).
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

from memplan.hwmodels.device import DeviceModel
from memplan.planners.analysis import as_traces, check_budget, predict_timelines
from memplan.planners.core.evaluate import Evaluator
from memplan.planners.core.options import options_dict
from memplan.planners.core.plan import Plan, PlanResult, fingerprint_of, fit_result
from memplan.planners.heuristics.autoswap.schedule import Schedule, State, events, select
from memplan.planners.heuristics.autoswap.scores import (
    SCORES,
    AutoSwapJob,
    candidates,
    combine,
    ranking,
    scores,
    standardise,
)
from memplan.traces.model import Trace


class AutoSwapScore(enum.Enum):
    """The priority score candidates are ranked by (NOTE [ AutoSwap scores ])."""

    DOA = "doa"
    AOA = "aoa"
    WDOA = "wdoa"
    SWDOA = "swdoa"
    BO = "bo"  # the four combined, weights by Bayesian optimisation


# NOTE [ AutoSwap without an evaluator ]
# BO needs the simulated iteration time of each trial's plan, which only the
# app shell can give (planners never import sim). Without an evaluator,
# `score=bo` plans with SWDOA alone and says so in the result's detail and
# `stats["score"]`: of the four it is the one that looks at the memory load
# as the selection changes it, which is what the budget is about.
NO_EVALUATOR_SCORE = AutoSwapScore.SWDOA


@dataclass(frozen=True, slots=True)
class AutoSwapOptions:
    """- `score`: the ranking: one of the four priority scores, or `bo`
      (their weighted sum, weights tuned by Bayesian optimisation).
    - `min_bytes`: the candidates' size threshold (NOTE [ AutoSwap candidates ]).
    - `weights`: four comma-separated weights in [-1, 1] for DOA, AOA,
      WDOA, SWDOA; set, they are used as given (no BO).
    - `trials`: BO's simulated trials, the four single scores included;
      `seed`: its sampler's seed; `time_limit_s`: a wall-clock cap on BO
      (deterministic for a seed when `trials` binds first: NOTE [ AutoSwap BO ])."""

    score: AutoSwapScore = AutoSwapScore.BO
    min_bytes: int = 1 << 20
    weights: str = ""
    trials: int = 30
    seed: int = 0
    time_limit_s: float = 60.0

    def __post_init__(self) -> None:
        if not isinstance(self.score, AutoSwapScore):
            try:
                object.__setattr__(self, "score", AutoSwapScore(self.score))
            except ValueError:
                allowed = ", ".join(s.value for s in AutoSwapScore)
                raise ValueError(f"score={self.score!r} must be one of {allowed}") from None
        if self.min_bytes < 0:
            raise ValueError(f"min_bytes={self.min_bytes!r} must be >= 0")
        if not 0 <= self.seed < 2**32:
            raise ValueError(f"seed={self.seed!r} must be in 0..2**32-1")
        if not 1 <= self.trials <= 100_000:
            raise ValueError(f"trials={self.trials!r} must be in 1..100000")
        if not (math.isfinite(self.time_limit_s) and self.time_limit_s > 0):
            raise ValueError(f"time_limit_s={self.time_limit_s!r} must be > 0")
        parse_weights(self.weights)

    @property
    def fixed_weights(self) -> tuple[float, ...] | None:
        return parse_weights(self.weights)


def parse_weights(text: str) -> tuple[float, ...] | None:
    """Four weights in [-1, 1] from "w1,w2,w3,w4"; None for ""."""
    if not text.strip():
        return None
    try:
        w = tuple(float(x) for x in text.split(","))
    except ValueError:
        raise ValueError(f"weights={text!r}: expected four numbers separated by commas") from None
    if len(w) != 4 or not all(math.isfinite(x) and -1 <= x <= 1 for x in w):
        raise ValueError(f"weights={text!r}: expected four numbers in [-1, 1]")
    return w


def one_hot(score: AutoSwapScore) -> tuple[float, ...]:
    """The weights that rank by one score alone."""
    return tuple(1.0 if s == score.value else 0.0 for s in SCORES)


class Planner:
    """One AutoSwap problem: the jobs, candidates, scores and budget. Plans
    for any weights (`plan`)."""

    def __init__(self, traces: Sequence[Trace], device: DeviceModel, budget: int | None, opts):
        self.traces = tuple(traces)
        tls = predict_timelines(self.traces, device)
        jobs = tuple(AutoSwapJob.of(t, tl, device) for t, tl in zip(self.traces, tls, strict=True))
        cands = tuple(candidates(jobs, opts.min_bytes, budget))
        self.state = State(jobs, cands, device.lanes)
        self.table = scores(jobs, cands)
        self.z = standardise(self.table)
        self.budget = budget

    def select(self, weights: Sequence[float]) -> tuple[int, Schedule, list[int]]:
        order = ranking(combine(self.z, weights), self.state.cands)
        k, sched = select(self.state, order, self.budget)
        return k, sched, order

    def plans(self, sched: Schedule) -> list[Plan]:
        return [
            Plan(fingerprint_of(t), tuple(evs), t.meta.model)
            for t, evs in zip(self.traces, events(self.state, sched), strict=True)
        ]


def autoswap(
    traces: Sequence[Trace],
    device: DeviceModel,
    *,
    budget_bytes: int | None = None,
    options: AutoSwapOptions | None = None,
    evaluator: Evaluator | None = None,
) -> PlanResult:
    """Plan `traces` (one per job, together on `device`) with AutoSwap."""
    t0 = time.perf_counter()
    opts = options or AutoSwapOptions()
    jobs = as_traces(traces)
    budget = check_budget(budget_bytes)
    p = Planner(jobs, device, budget, opts)
    stats: dict = {"candidates": len(p.state.cands)}
    detail = ""
    weights = opts.fixed_weights
    if weights is not None:
        stats["score"] = "weights"
    elif opts.score is not AutoSwapScore.BO:
        weights, stats["score"] = one_hot(opts.score), opts.score.value
    elif evaluator is None:  # NOTE [ AutoSwap without an evaluator ]
        weights, stats["score"] = one_hot(NO_EVALUATOR_SCORE), NO_EVALUATOR_SCORE.value
        detail = f"no evaluator for BO: ranked by {NO_EVALUATOR_SCORE.value} alone"
    elif budget is None or not p.state.cands:
        weights, stats["score"] = one_hot(NO_EVALUATOR_SCORE), NO_EVALUATOR_SCORE.value
        detail = f"nothing for BO to tune: ranked by {NO_EVALUATOR_SCORE.value} alone"
    else:
        from memplan.planners.heuristics.autoswap.bo import tune

        weights, bo_stats = tune(
            p.select,
            p.plans,
            evaluator,
            trials=opts.trials,
            seed=opts.seed,
            time_limit_s=opts.time_limit_s,
        )
        stats.update(bo_stats, score="bo")
    k, sched, order = p.select(weights)
    plans = p.plans(sched)
    chosen = {p.state.cands[i].buffer for i in order[:k]}
    stats.update(
        weights=list(weights),
        selected=k,
        swapped=len(sched.swaps),
        swapped_bytes=int(sum(p.state.cands[s.cand].nbytes for s in sched.swaps)),
        peak_bytes=sched.peak_bytes,
        vanilla_peak_bytes=int(sum(int(jb.load.max(initial=0)) for jb in p.state.jobs)),
        chosen_buffers=len(chosen),
    )
    if detail:
        stats["note"] = detail
    return fit_result(
        "autoswap", plans, sched.peak_bytes, budget, t0, options=options_dict(opts), stats=stats
    )


def scores_of(
    traces: Sequence[Trace],
    device: DeviceModel,
    min_bytes: int = 1 << 20,
    budget_bytes: int | None = None,
):
    """(candidates, float64[n, 4] DOA/AOA/WDOA/SWDOA) of `traces` -- for
    reports and tests."""
    jobs = as_traces(traces)
    tls = predict_timelines(jobs, device)
    aj = tuple(AutoSwapJob.of(t, tl, device) for t, tl in zip(jobs, tls, strict=True))
    cands = candidates(aj, min_bytes, budget_bytes)
    return cands, scores(aj, cands)

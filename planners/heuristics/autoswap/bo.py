"""Bayesian optimisation of AutoSwap's score weights (§IV-C) with optuna.

optuna is an optional extra (``pip install memplan[bo]``), imported here
only, when BO runs. NOTE [ AutoSwap BO ] says how.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from memplan.planners.core.errors import PlanError
from memplan.planners.core.evaluate import Evaluator
from memplan.planners.core.plan import Plan
from memplan.planners.heuristics.autoswap.schedule import Schedule
from memplan.planners.heuristics.autoswap.scores import SCORES

# The objective of a trial whose plan does not run on its own under the
# budget (out of memory): worse than any iteration time, and finite (the
# sampler compares values).
UNFIT_S = 1e9


# NOTE [ AutoSwap BO ]
# §IV-C tunes w1..w4 in [-1, 1] of the BO score (NOTE [ AutoSwap scores ]) by Bayesian
# optimisation of the measured overhead. Ours: optuna's TPE sampler (seeded, one trial at a
# time; the paper's Gaussian process would be GPSampler, which needs scipy), `trials`
# trials, the objective the simulated iteration time of the trial's plan under the budget
# (`UNFIT_S` when it runs out of memory alone). The first four trials are the single scores
# (one-hot), so BO is never worse than the best of them; the best trial wins, ties to the
# earlier; trials selecting the same candidates share one simulation. `time_limit_s` stops
# after the trial that passes it; only `trials` makes the result machine-independent
# (`stats["bo_stopped_by"]`). Full text: docs/notes.md, "AutoSwap BO".
def tune(
    select: Callable[[tuple[float, ...]], tuple[int, Schedule, list[int]]],
    plans: Callable[[Schedule], list[Plan]],
    evaluator: Evaluator,
    *,
    trials: int,
    seed: int,
    time_limit_s: float,
) -> tuple[tuple[float, ...], dict[str, Any]]:
    """(the best weights, stats) after `trials` trials (NOTE [ AutoSwap BO ]).
    `select(weights)` is AutoSwap's selection under those weights (how many
    of the ranked candidates it takes, their schedule, the ranking); `plans`
    turns a schedule into the jobs' plans."""
    try:
        import optuna
    except ImportError:
        raise PlanError(
            "autoswap: score=bo needs optuna (pip install memplan[bo]); "
            "or pick one score, e.g. --option autoswap.score=swdoa"
        ) from None
    t0 = time.perf_counter()
    seen: dict[frozenset[int], float] = {}
    history: list[tuple[tuple[float, ...], float]] = []
    best: list[Any] = [math.inf, None]

    def objective(trial) -> float:
        w = tuple(trial.suggest_float(f"w_{s}", -1.0, 1.0) for s in SCORES)
        k, sched, order = select(w)
        key = frozenset(order[:k])
        if key not in seen:
            ev = evaluator(plans(sched))
            seen[key] = ev.iteration_s if ev.fits and math.isfinite(ev.iteration_s) else UNFIT_S
        value = seen[key]
        history.append((w, value))
        if value < best[0]:
            best[0], best[1] = value, w
        return value

    def deadline(study, _trial) -> None:
        if time.perf_counter() - t0 > time_limit_s:
            study.stop()

    old = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        sampler = optuna.samplers.TPESampler(seed=seed)
        study = optuna.create_study(direction="minimize", sampler=sampler)
        for s in SCORES:
            study.enqueue_trial({f"w_{x}": 1.0 if x == s else 0.0 for x in SCORES})
        study.optimize(objective, n_trials=trials, n_jobs=1, callbacks=[deadline])
    finally:
        optuna.logging.set_verbosity(old)
    singles = {s: history[i][1] for i, s in enumerate(SCORES) if i < len(history)}
    weights = best[1] if best[1] is not None else history[0][0]
    stats = {
        "bo_trials": len(history),
        "bo_simulations": len(seen),
        "bo_best_s": best[0] if best[0] < UNFIT_S else None,
        "bo_single_scores_s": {s: (v if v < UNFIT_S else None) for s, v in singles.items()},
        "bo_stopped_by": "trials" if len(history) >= trials else "time_limit_s",
        "bo_time_s": time.perf_counter() - t0,
    }
    return weights, stats

"""AutoSwap's Bayesian optimisation (NOTE [ AutoSwap BO ]): reproducible for
a seed, never worse than the best single score, a clear message without
optuna."""

from __future__ import annotations

import sys

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Measured
from memplan.planners import registry
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.traces import synthetic as syn

from memplan.evaluator import sim_evaluator
from tests.planners.test_analysis import gpu

optuna = pytest.importorskip("optuna")


def problem():
    """residual(4, act_mib=3) at 60% of its peak, copies at 4 MiB/ms."""
    t = syn.residual(4, act_mib=3)
    dev = DeviceModel(gpu(mib_per_ms=4), Measured())
    budget = int(t.peak("framework")[0] * 0.6)
    return t, dev, budget, sim_evaluator([t], dev, budget)


def bo(trials: int = 8, seed: int = 0):
    t, dev, budget, ev = problem()
    opts = [f"trials={trials}", f"seed={seed}", "min_bytes=0"]
    return (
        t,
        ev,
        registry.run("autoswap", [t], dev, budget_bytes=budget, options=opts, evaluator=ev),
    )


def test_bo_is_reproducible_for_a_seed():
    _, _, a = bo()
    _, _, b = bo()
    assert a.stats["weights"] == b.stats["weights"]
    assert a.plans == b.plans
    assert a.stats["bo_stopped_by"] == "trials" and a.stats["bo_trials"] == 8


def test_bo_never_loses_to_the_best_single_score():
    """The four single scores are its first trials; the plan it returns
    simulates in the best time it saw. On this trace it beats them."""
    t, ev, res = bo()
    _, dev, budget, _ = problem()
    assert res.feasible
    check(res.plans[0], t)
    singles = res.stats["bo_single_scores_s"]
    assert set(singles) == {"doa", "aoa", "wdoa", "swdoa"}
    best_single = min(v for v in singles.values() if v is not None)
    got = ev(res.plans)
    assert got.fits and got.iteration_s == res.stats["bo_best_s"]
    assert got.iteration_s <= best_single
    assert got.iteration_s < best_single  # a mix of scores found a faster plan
    # each single score's plan, planned on its own, simulates as BO saw it
    for name, s in singles.items():
        opts = [f"score={name}", "min_bytes=0"]
        alone = registry.run("autoswap", [t], dev, budget_bytes=budget, options=opts)
        assert ev(alone.plans).iteration_s == s


def test_without_optuna_the_message_names_the_extra(monkeypatch):
    t, dev, budget, ev = problem()
    monkeypatch.setitem(sys.modules, "optuna", None)  # import optuna -> ImportError
    with pytest.raises(PlanError, match=r"pip install memplan\[bo\]"):
        registry.run("autoswap", [t], dev, budget_bytes=budget, evaluator=ev)
    # a single score needs no optuna
    res = registry.run(
        "autoswap", [t], dev, budget_bytes=budget, options=["score=aoa"], evaluator=ev
    )
    assert res.stats["score"] == "aoa"

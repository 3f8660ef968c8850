"""NOTE [ Kernels that nothing interleaves ] (sim/clock.py): a kernel the
clock skips leaves the run as SimPy's own stepping does, entry by entry of
the log and figure by figure of the result, whatever else runs beside it."""

from __future__ import annotations

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners.heuristics.capuchin.planner import capuchin
from memplan.planners.heuristics.vanilla import release_only_plan
from memplan.sim import Job, LaneSlowdown, simulate
from memplan.sim.clock import Clock
from memplan.sim.log import LogKind
from memplan.traces import synthetic

GPU = load_hardware("rtx-a6000")
K = LogKind
MOVES = {K.SWAP_OUT_START, K.SWAP_IN_START, K.EVICT_START, K.FETCH_START, K.RECOMPUTE_START}


def step():
    return synthetic.sized(400, seed=3, family=synthetic.Family.RESIDUAL)


def peak(t) -> int:
    return int(t.memory_curve("liveness").max())


def planned(lanes: int, share: float):
    t = step()
    dev = DeviceModel(GPU, Roofline(), lanes=lanes)
    budget = int(peak(t) * share)
    p = capuchin([t], dev, budget_bytes=budget).plans[0]
    return [Job(t, p)], dev, {"budget": budget, "oom": "dtr"}


def alone(oom: str, share: float, **kw):
    t = step()
    dev = DeviceModel(GPU, Roofline())
    return [Job(t, release_only_plan(t))], dev, {"budget": int(peak(t) * share), "oom": oom, **kw}


def two_jobs():
    t = step()
    dev = DeviceModel(GPU, Roofline())
    jobs = [Job(t, release_only_plan(t)), Job(t, release_only_plan(t), arrival_s=0.004)]
    return jobs, dev, {"budget": int(peak(t) * 1.3), "oom": "passive"}


CASES = {
    "swaps and recomputes, one lane": lambda: planned(1, 0.75),
    "swaps and recomputes, two lanes": lambda: planned(2, 0.75),
    "passive evictions": lambda: alone("passive", 0.75),
    "dtr evictions": lambda: alone("dtr", 0.75),
    "caching allocator": lambda: alone("passive", 0.8, allocator="caching"),
    "jitter, usage and a slow lane": lambda: alone(
        "passive",
        0.75,
        jitter=0.3,
        usage=0.2,
        seed=4,
        lane_slowdowns=[LaneSlowdown(3.0, 0.001, 0.003)],
    ),
    "two jobs sharing compute": two_jobs,
}


@pytest.mark.parametrize("case", CASES)
def test_skipping_kernels_changes_nothing(monkeypatch, case):
    jobs, dev, kw = CASES[case]()
    runs = {}
    for skipping in (False, True):
        monkeypatch.setattr(Clock, "skipping", skipping)
        runs[skipping] = simulate(jobs, dev, iterations=2, context_reserve=0, **kw)
    stepped, skipped = runs[False], runs[True]
    assert skipped.log == stepped.log
    assert skipped.to_dict() == stepped.to_dict()  # n_events included
    # the case exercises what it names: copies or recomputations beside the kernels
    assert {e.kind for e in stepped.log} & MOVES
    assert not stepped.oom


def test_a_lone_job_without_copies_skips_every_kernel(monkeypatch):
    """Without copies nothing interleaves a lone job's kernels: every one is
    skipped, and each still counts as an event."""
    t = synthetic.chain(50)
    dev = DeviceModel(GPU, Roofline())
    clock_runs = []
    real = Clock.__init__

    def spy(self):
        real(self)
        clock_runs.append(self)

    monkeypatch.setattr(Clock, "__init__", spy)
    r = simulate([t], dev, iterations=2)
    assert clock_runs[0].skipped == 2 * t.n_ops
    assert r.n_events >= 2 * t.n_ops

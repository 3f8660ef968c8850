"""The checker and the simulator agree: a plan `planners.core.check` accepts never
leaves an op without its data in the simulation (no on-demand fetch, no
`SimError`), whatever the delays and lanes."""

from __future__ import annotations

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Fixed
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Plan, Recompute, Release, SwapIn, SwapOut
from memplan.sim import Job, simulate
from memplan.traces import synthetic
from memplan.traces.io import fingerprint

from tests.sim.handtraces import gpu


def random_plan(trace, rng: np.random.Generator) -> Plan:
    """Swaps, releases and recomputes in random gaps between accesses."""
    events = []
    for b in rng.permutation(trace.n_buffers)[: trace.n_buffers // 8].tolist():
        acc = trace.accesses_of(b).tolist()
        gaps = [(a, c) for a, c in zip(acc, acc[1:]) if c - a >= 2]
        if not gaps:
            continue
        a, c = gaps[int(rng.integers(len(gaps)))]
        delay = float(rng.choice([0.0, 50.0, 400.0]))
        kind = rng.random()
        made_by = int(trace.created_at[b])
        if kind < 0.6 or made_by < 0:
            events += [SwapOut(b, a, delay), SwapIn(b, int(rng.integers(a, c)), c, delay)]
        elif kind < 0.9:
            events += [Release(b, a), Recompute(b, c, (made_by,))]
        else:
            events += [Release(b, a)]  # only valid if nothing reads b again
    return Plan(fingerprint(trace), tuple(events))


@pytest.mark.parametrize("seed", range(10))
def test_checked_plans_never_lose_data(seed):
    trace = synthetic.random_dag(70, seed=seed, dropout=seed % 3 == 0)
    lat = Fixed(np.random.default_rng(seed).uniform(1e-4, 1e-3, trace.n_ops))
    rng = np.random.default_rng(1000 + seed)
    accepted = 0
    for _ in range(30):
        plan = random_plan(trace, rng)
        try:
            check(plan, trace)
        except PlanError:
            continue
        accepted += 1
        r = simulate(
            [Job(trace, plan)], DeviceModel(gpu(1 << 16), lat, lanes=1 + seed % 2), iterations=2
        )
        j = r.jobs[0]
        assert (j.oom, j.passive_swaps) == (False, 0)
        assert j.bytes_h2d <= j.bytes_d2h + 2 * int(trace.nbytes.sum())
    assert accepted > 0

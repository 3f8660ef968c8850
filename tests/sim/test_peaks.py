"""The simulated peak of the vanilla plan is `Trace.peak("framework")` and
that of `release_only` is `Trace.peak("liveness")`, exactly: on hand-built
traces, synthetic steps and every shipped trace."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Fixed
from memplan.planners.heuristics.vanilla import release_only_plan
from memplan.sim import Job, simulate
from memplan.traces import io, synthetic

from tests.sim.handtraces import B, Call, MiB, gpu, make
from tests.traces.test_io import toy

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "traces" / "data").glob("*.json.gz"))
BIG = gpu(memory_mib=1 << 20)  # 1 TiB: nothing runs out of memory


def assert_peaks(trace, iterations=2):
    lat = Fixed(np.full(trace.n_ops, 1e-6))
    vanilla = simulate([trace], DeviceModel(BIG, lat), iterations=iterations)
    released = simulate(
        [Job(trace, release_only_plan(trace))], DeviceModel(BIG, lat), iterations=iterations
    )
    assert vanilla.jobs[0].peak_bytes == vanilla.peak_bytes == trace.peak("framework")[0]
    assert released.jobs[0].peak_bytes == released.peak_bytes == trace.peak("liveness")[0]
    assert released.jobs[0].iteration_time_s == vanilla.jobs[0].iteration_time_s


def test_hand_built_traces():
    assert_peaks(toy())  # framework 10 MiB, liveness 9 MiB
    # an input nobody reads: resident under framework, never loaded under liveness
    t, _ = make(
        [B(4, "param"), B(3, "input", freed_after=1), B(1, "input", freed_after=1), B(2)],
        [Call([0, 1], [3]), Call([3], [])],
    )
    assert (t.peak("framework")[0], t.peak("liveness")[0]) == (10 * MiB, 9 * MiB)
    assert_peaks(t)


@pytest.mark.parametrize("seed", range(8))
def test_random_steps(seed):
    assert_peaks(synthetic.random_dag(60 + 20 * seed, seed=seed, dropout=seed % 2 == 1))


@pytest.mark.parametrize("make_trace", [lambda: synthetic.chain(3), lambda: synthetic.residual(2),
                                        lambda: synthetic.unet(2)])  # fmt: skip
def test_synthetic_families(make_trace):
    assert_peaks(make_trace(), iterations=3)


@pytest.mark.skipif(not SHIPPED, reason="no shipped traces in traces/data yet")
@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_shipped_traces(path):
    assert_peaks(io.load(path), iterations=2)


@pytest.mark.skipif(not SHIPPED, reason="no shipped traces in traces/data yet")
def test_shipped_resnet50_under_pressure():
    path = ROOT / "traces" / "data" / "resnet50_b16_adam.json.gz"
    if not path.exists():
        pytest.skip("resnet50 trace not shipped")
    t = io.load(path)
    lat = Fixed(np.full(t.n_ops, 1e-5))
    plan = release_only_plan(t)
    live = t.peak("liveness")[0]
    budget = int(live * 0.6)
    r = simulate([Job(t, plan)], DeviceModel(BIG, lat), budget=budget, oom="passive")
    j = r.jobs[0]
    assert not j.oom and j.passive_swaps > 0 and r.peak_bytes <= budget
    assert simulate([Job(t, plan)], DeviceModel(BIG, lat), budget=budget, oom="fail").jobs[0].oom
    stall = simulate([Job(t, plan)], DeviceModel(BIG, lat), budget=live, oom="stall")
    assert (stall.jobs[0].oom, stall.peak_bytes) == (False, live)

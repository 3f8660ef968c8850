"""Lower bounds: hand-worked values, validity against the brute force, the
simulator and every planner, and the `memplan bounds` command."""

from __future__ import annotations

import json
import math

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Fixed, Measured
from memplan.planners import registry
from memplan.planners.analysis.bounds import (
    bounds,
    gap_to_bound,
    peak_lower_bound,
    time_lower_bound,
)
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Plan, Recompute, Release, fingerprint_of
from memplan.sim import Job, simulate
from memplan.traces import io
from memplan.traces.model import Op
from memplan.traces.synthetic import Durations, Grain, random_dag

from memplan.cli import main
from tests.planners.bruteforce import (
    MS,
    B,
    MiB,
    Step,
    brute_force,
    durations_s,
    random_tiny,
    tiny_hw,
    tiny_trace,
)


# ---- peak ---------------------------------------------------------------------------------
def test_peak_bound_is_the_largest_working_set():
    # op 3 reads P (1 MiB) and writes Q (4 MiB)
    bufs = [B(2), B(2), B(1), B(4)]
    ops = [
        Step((), (0,), 1),
        Step((), (1,), 1),
        Step((), (2,), 6),
        Step((2,), (3,), 1),
        Step((0, 1), (), 1),
    ]
    pb = peak_lower_bound(tiny_trace(bufs, ops))
    assert (pb.nbytes, pb.op, pb.working_set_bytes, pb.start_bytes) == (5 * MiB, 3, 5 * MiB, 0)


def test_peak_bound_counts_what_an_iteration_starts_with():
    # 5 MiB of parameters and a 2 MiB input are resident before op 0; an
    # input nobody reads is never loaded
    bufs = [B(5, "param"), B(2, "input"), B(3, "input"), B(1)]
    ops = [Step((1,), (3,), 1), Step((0, 3), (), 1)]
    pb = peak_lower_bound(tiny_trace(bufs, ops))
    assert (pb.nbytes, pb.op, pb.start_bytes) == (7 * MiB, -1, 7 * MiB)


def test_workspace_counts_unless_asked_not_to():
    t = tiny_trace([B(1), B(1)], [Step((), (0,), 1), Step((0,), (1,), 1)])
    ops = (
        t.ops[0],
        Op(**{**{f: getattr(t.ops[1], f) for f in Op.__slots__}, "workspace_bytes": 3 * MiB}),
    )
    t = t.__class__(t.meta, t.buffers, t.views, ops)
    assert peak_lower_bound(t).nbytes == 5 * MiB
    assert peak_lower_bound(t, workspace=False).nbytes == 2 * MiB


# ---- time ---------------------------------------------------------------------------------
# A (8 MiB) is made by op 0 (1 ms) and read by op 3; X (6 MiB) lives over ops
# 1-2. At an 8 MiB budget ops 1 and 2 need 6 MiB of A gone. A round trip costs
# 16 ms of lane for 8 MiB (1 MiB/ms); recomputing it costs 1 ms for 8 MiB.
# Buffer 2 is an empty parameter, written by op 0 only with `side_effect`.
TIME_BUFS = [B(8), B(6), B(0, "param")]


def _time_trace(rng: bool = False, side_effect: bool = False):
    made = (0, 2) if side_effect else (0,)
    ops = [Step((), made, 1, rng), Step((), (1,), 1), Step((1,), (), 1), Step((0,), (), 1)]
    return tiny_trace(TIME_BUFS, ops)


def _time_bound(**kind: bool) -> float:
    t = _time_trace(**kind)
    return time_lower_bound(t, DeviceModel(tiny_hw(), Fixed(durations_s(t))), 8 * MiB).seconds


def test_time_bound_mixes_lane_and_recompute_fractionally():
    # T/16 ms * 8 MiB by the lane + (T - 4 ms) * 8 MiB/ms by recompute >= 6 MiB
    # => T/2 + 8 (T - 4) = 6  =>  T = 38 / 8.5 ms
    assert _time_bound() == pytest.approx(38 / 8.5 * 1e-3, rel=1e-9)


def test_time_bound_lets_rng_ops_be_recomputed():
    # a recompute chain may restore the generator (`restore_rng`): op 0 drawing
    # random numbers changes nothing, and the plan that releases A and runs op
    # 0 again before op 3 takes 5 ms (a lane-only bound claimed 12 ms)
    assert _time_bound(rng=True) == pytest.approx(38 / 8.5 * 1e-3, rel=1e-9)
    t = _time_trace(rng=True)
    plan = Plan(fingerprint_of(t), (Release(0, 0), Recompute(0, 3, (0,), True)))
    check(plan, t)
    run = simulate([Job(t, plan)], DeviceModel(tiny_hw(), Fixed(durations_s(t))), budget=8 * MiB)
    assert run.jobs[0].iteration_times_s == pytest.approx((0.005,) * 3)


def test_time_bound_by_the_lane_alone():
    # op 0 also writes a parameter: it may never run twice, so only the lane,
    # 2 ms per MiB: 6 MiB = 12 ms
    assert _time_bound(side_effect=True) == pytest.approx(0.012, rel=1e-9)


def test_time_bound_is_compute_when_nothing_is_hot():
    ops = [Step((), (0,), 1), Step((), (1,), 1), Step((1,), (), 1), Step((0,), (), 1)]
    t = tiny_trace(TIME_BUFS, ops)
    tb = time_lower_bound(t, DeviceModel(tiny_hw(), Fixed(durations_s(t))), 64 * MiB)
    assert (tb.seconds, tb.memory_s, tb.op, tb.feasible) == (pytest.approx(0.004), 0.0, -1, True)


def test_budget_below_the_peak_bound_has_no_plan():
    ops = [Step((), (0,), 1), Step((), (1,), 1), Step((1,), (), 1), Step((0,), (), 1)]
    t = tiny_trace(TIME_BUFS, ops)
    b = bounds(t, DeviceModel(tiny_hw(), Fixed(durations_s(t))), budget_bytes=7 * MiB)
    assert b.peak.nbytes == 8 * MiB
    assert math.isinf(b.time.seconds) and not b.time.feasible
    assert b.to_dict()["time_s"] is None


def test_bad_budget_is_a_plan_error():
    t = tiny_trace([B(1)], [Step((), (0,), 1)])
    with pytest.raises(PlanError, match="budget=0 must be a positive number of bytes"):
        bounds(t, DeviceModel(tiny_hw(), Fixed([0.001])), budget_bytes=0)


def test_gap_to_bound():
    assert gap_to_bound(0.011, 0.010) == pytest.approx(0.1)
    assert math.isnan(gap_to_bound(0.011, math.inf))
    assert math.isnan(gap_to_bound(math.nan, 0.01))


# ---- validity ------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", range(30))
def test_bounds_never_exceed_the_brute_force_optimum(seed):
    t, budget = random_tiny(seed, n_ops=8)
    d = [round(op.duration_us * 1000) for op in t.ops]
    io_t = [int(b.nbytes // MiB) * MS // 4 for b in t.buffers]
    bf = brute_force(t, d, io_t, budget)
    device = DeviceModel(tiny_hw(lanes_bw_mib_per_ms=4), Fixed(durations_s(t)))
    b = bounds(t, device, budget_bytes=budget)
    if not b.time.feasible:
        assert bf.iteration_ticks is None
    elif bf.iteration_ticks is not None:
        assert b.time.seconds <= bf.iteration_ticks * 1e-9 * (1 + 1e-12)


@pytest.mark.parametrize(("n_ops", "seed", "frac"), [(40, 3, 0.85), (60, 4, 0.75)])
def test_bounds_hold_for_every_planners_simulated_plan(n_ops, seed, frac):
    t = random_dag(n_ops, seed=seed, durations=Durations(Grain.US, 20, 400))
    hw, lat = tiny_hw(lanes_bw_mib_per_ms=25, memory_mib=4096), Measured()
    budget = int(frac * t.peak("liveness")[0])
    device = DeviceModel(hw, lat)
    b = bounds(t, device, budget_bytes=budget)
    ran = 0
    for name in registry.names():
        opts = {"hint": None, "num_workers": 2, "time_limit_s": 10} if name == "cpsat" else None
        r = registry.get(name)([t], device, budget_bytes=budget, options=opts)
        if not r.plans:
            continue
        check(r.plans[0], t)
        job = simulate([Job(t, r.plans[0])], device, budget=budget).jobs[0]
        if job.oom:
            continue
        ran += 1
        assert job.peak_bytes >= b.peak.nbytes, name
        assert job.iteration_time_s >= b.time.seconds * (1 - 1e-9), name
    assert ran >= 2


# ---- the command --------------------------------------------------------------------------
@pytest.fixture
def trace_file(tmp_path):
    ops = [Step((), (0,), 1, True), Step((), (1,), 5), Step((1,), (2,), 3), Step((0,), (3,), 1)]
    path = tmp_path / "t.json"
    io.save(tiny_trace([B(4), B(1), B(1), B(1)], ops, "tiny"), path)
    return path


def test_command_prints_every_bound_and_the_solvers(trace_file, capsys):
    rc = main(
        [
            "bounds",
            str(trace_file),
            "--gpu",
            "a100-pcie-40gb",
            "--budget",
            "5MiB",
            "--latency",
            "measured",
            "--time-limit",
            "5",
        ]
    )
    out = capsys.readouterr().out.splitlines()
    assert rc == 0
    assert out[0] == "tiny on a100-pcie-40gb, budget 5.00 MiB, lanes 1"
    assert out[1].startswith("peak  >=     5.00 MiB")
    # op 0's 4 MiB output is 1 MiB too many at op 2, which ends 9 ms in: it is
    # off the device whole (NOTE [ Whole buffers ]) and comes back after op 2
    # and before op 3 (1 ms) starts, 4 x 36 us of lane
    want = "time  >=    10.145 ms   (best: split, end of op 2, back before op 3, whole buffers)"
    assert out[2] == want
    assert [line.split()[0] for line in out[3:7]] == ["compute", "single-op", "split", "multi-op"]
    assert out[7].startswith("cpsat    OPTIMAL, plan 10.")
    assert "within its model" in out[7]


def test_command_json(trace_file, capsys):
    rc = main(
        [
            "bounds",
            str(trace_file),
            "--gpu",
            "a100-pcie-40gb",
            "--budget",
            "4MiB",
            "--latency",
            "measured",
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0
    assert doc["peak_bytes"] == 5 * MiB and doc["budget_bytes"] == 4 * MiB
    assert doc["feasible"] is False and doc["time_s"] is None and doc["cpsat"] is None
    assert doc["time_bounds"] == {
        "best": "peak floor",
        "best_s": None,
        "bounds": [
            {
                "name": "peak floor",
                "seconds": None,
                "where": "the budget is below the peak lower bound (5242880 bytes)",
            }
        ],
    }


def test_command_bad_input_is_one_line_exit_2(trace_file, capsys):
    assert main(["bounds", str(trace_file), "--gpu", "a100-pcie-40gb", "--budget", "lots"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memplan bounds: error: --budget='lots': expected a size such as 8GiB")
    with pytest.raises(SystemExit) as e:  # refused by argparse
        main(["bounds", str(trace_file), "--gpu", "a100-pcie-40gb", "--time-limit", "-1"])
    assert e.value.code == 2


def test_working_sets_of_ops_that_touch_nothing():
    from memplan.planners.analysis.bounds import working_sets
    from memplan.traces.model import Op, Phase, Trace

    from tests.traces.test_io import MiB, toy

    t = toy()
    empty = Op(3, "aten.empty.memory_format", Phase.BACKWARD, (), ())
    t2 = Trace(t.meta, t.buffers, t.views, (*t.ops, empty))
    # mm reads w (4) and x (1), writes a (2); relu a -> r (3); sum reads r; the last op nothing
    assert (working_sets(t2) // MiB).tolist() == [7, 5, 3, 0]

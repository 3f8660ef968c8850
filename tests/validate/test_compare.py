"""Simulated versus measured: every planner's plan computes bit-identical
results on CPU; the figures that do not depend on timing agree exactly; the
measured device model is what the NOTE blocks of `validate/calibrate/measure.py` say."""

from __future__ import annotations

import functools
import math
from types import SimpleNamespace

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Fixed, Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners import registry
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Plan, SwapIn, SwapOut, fingerprint_of
from memplan.sim import Job, simulate
from memplan.traces.io import fingerprint
from memplan.traces.zoo import BUILTIN
from memplan.validate import Direction, TransferRecord, ValidationError, compare_results, replay
from memplan.validate.calibrate.brackets import unsteadiness
from memplan.validate.calibrate.measure import (
    PROBE_SWAPS,
    LaneModel,
    Sample,
    compute_sample,
    lane_fixed_cost,
    op_latencies,
    probe_plan,
    quietest,
)
from memplan.validate.calibrate.simvsreal import validate_plan

from tests.validate.helpers import (
    Order,
    first_backward_use,
    first_op,
    last_forward_use,
    output_of,
    plan_of,
    trace_of,
    vanilla,
)

PLANNERS = ("release_only", "tensile", "capuchin", "vdnn", "checkpoint")


def _budget(model: str) -> int:
    """Capuchin's budget: 80% of the vanilla peak (it saves only what a budget asks)."""
    return int(0.8 * trace_of(model).peak("framework")[0])


@functools.cache
def plan_for(model: str, planner: str) -> Plan:
    """A deterministic plan: roofline latencies on the shipped cpu-local profile."""
    trace = trace_of(model)
    budget = _budget(model) if planner == "capuchin" else None
    result = registry.run(
        planner, [trace], DeviceModel(load_hardware("cpu-local"), Roofline()), budget_bytes=budget
    )
    return result.plans[0]


def _validate(model: str, plan: Plan | str, **kw):
    kw = {"iterations": 2, "runs": 1, "samples": 1, "bandwidth": 2e9, **kw}
    return validate_plan(trace_of(model), plan, **kw)


# NOTE [ Periodic swap-ins of persistent buffers ]
# TENSILE swaps some persistent buffers in before their first use and out
# after their last, every iteration. In the first iteration such a buffer is
# still resident: the simulator, `planners.core.check` and the executor all treat
# a swap-in of a resident buffer (not leaving) as a no-op, so these plans
# replay like any other.
@pytest.mark.parametrize("planner", PLANNERS)
@pytest.mark.parametrize("model", BUILTIN)
def test_every_planners_plan_computes_bit_identical_results(model, planner):
    plan = plan_for(model, planner)
    r = _validate(model, plan)
    assert r.correct, r.mismatch
    assert r.mismatch == "" and r.device == "cpu"
    assert r.time_meas_s > 0 and r.time_pred_s > 0
    if plan.counts()["swap_out"] == 0:
        assert r.bytes_d2h_meas == r.bytes_d2h_pred == r.bytes_h2d_meas == r.bytes_h2d_pred == 0


def test_a_planner_by_name_plans_for_the_measured_device():
    r = _validate("small_cnn", "vdnn")
    assert r.correct and r.planner == "vdnn" and r.events["swap_out"] > 0
    assert r.bytes_d2h_meas > 0 and r.bytes_d2h_pred > 0


def test_a_swap_moves_the_bytes_the_simulation_moves():
    """Block 1's ReLU output of small_cnn, out after its last forward use and
    back before its first backward use: 256 KiB each way, every iteration.
    The compute thread waits for each swap-out to end before it reaches the
    swap-in (`Order`, no timing), as in the simulation where the copy is far
    shorter than the ops between; a swap-in meeting a queued swap-out would
    keep the buffer instead (tests/validate/test_keep.py)."""
    trace = trace_of("small_cnn")
    b = output_of(trace, first_op(trace, "aten.relu.default"))
    out, back = last_forward_use(trace, b), first_backward_use(trace, b)
    assert out + 1 < back - 3
    plan = plan_of(trace, SwapOut(b, out), SwapIn(b, back - 3, back))
    order = Order()
    for it in range(3):
        order.after((it, out + 1), "ended", (Direction.D2H, b, it))
    r = replay(trace, plan=plan, iterations=3, bandwidth_bytes_per_s=2e9, sync=order)
    compare_results(vanilla("small_cnn", 3), r)  # raises on a difference
    hw = load_hardware("cpu-local")
    sim = simulate(
        [Job(trace, plan)], DeviceModel(hw, Fixed(np.full(trace.n_ops, 1e-3))), iterations=3
    )
    assert r.bytes_moved(Direction.D2H) == sim.jobs[0].bytes_d2h == 3 * 2**18
    assert r.bytes_moved(Direction.H2D) == sim.jobs[0].bytes_h2d == 3 * 2**18


def test_tiny_transformer_with_dropout_is_bit_identical_under_recompute():
    r = _validate("tiny_transformer", plan_for("tiny_transformer", "checkpoint"))
    assert r.correct and r.events["recompute"] > 0
    assert r.recompute_meas_s > 0 and r.recompute_pred_s > 0


@pytest.mark.parametrize(
    "planner,policy",
    [("vanilla", "framework"), ("release_only", "liveness")],
)
def test_plans_without_copies_predict_the_peak_exactly(planner, policy):
    """No transfer, no timing: the pool and the simulator follow the trace."""
    trace = trace_of("small_cnn")
    r = _validate("small_cnn", planner)
    assert r.peak_pred_bytes == r.peak_meas_bytes == trace.peak(policy)[0]
    assert r.peak_err == 0.0
    assert r.vanilla_peak_bytes == trace.peak("framework")[0]


def test_recompute_plans_predict_the_peak_exactly():
    r = _validate("tiny_resnet", plan_for("tiny_resnet", "checkpoint"))
    assert r.events["recompute"] > 0
    assert r.peak_pred_bytes == r.peak_meas_bytes < r.vanilla_peak_bytes


def test_a_plan_object_and_the_report_dict():
    trace = trace_of("mlp")
    plan = Plan(fingerprint(trace), (), "mlp")
    r = validate_plan(trace, plan, iterations=2, runs=2, samples=1)
    d = r.to_dict()
    assert {
        "correct",
        "time_pred_s",
        "time_meas_s",
        "time_err",
        "peak_pred_bytes",
        "peak_meas_bytes",
        "peak_err",
    } <= d.keys()
    assert d["correct"] is True and d["planner"] == "file" and len(d["per_run"]) == 2
    assert d["peak_err"] == 0.0
    assert d["bandwidth_throttled"] is False and d["bandwidth_bytes_per_s"] > 0
    assert math.isclose(d["time_err"], (r.time_pred_s - r.time_meas_s) / r.time_meas_s)


def test_a_vanilla_plan_is_predicted_as_its_own_vanilla_replay():
    """The latencies of a pair's vanilla replay add up to its best iteration
    (NOTE [ What the simulator is told ]): for the empty plan each run's
    prediction is that pair's vanilla figure."""
    r = _validate("linear_chain", "vanilla", runs=2)
    for run in r.per_run:
        assert run.time_pred_s == pytest.approx(run.vanilla_time_s, abs=1e-6)
        assert run.stall_pred_s == 0.0 and run.stall_meas_s == 0.0


@pytest.mark.parametrize(
    "kwargs,message",
    [
        ({"iterations": 1}, "iterations=1 must be an integer >= 2"),
        ({"runs": 0}, "runs=0"),
        ({"samples": 0}, "samples=0"),
        ({"lanes": 3}, "lanes=3"),
        ({"bandwidth": 0.0}, "bandwidth=0.0"),
        ({"threads": 0}, "threads=0"),
        ({"device": "tpu"}, "device='tpu'"),
    ],
)
def test_bad_arguments_are_validation_errors(kwargs, message):
    with pytest.raises(ValidationError, match=message.replace("(", r"\(")):
        validate_plan(trace_of("mlp"), "release_only", **kwargs)


def test_a_plan_for_another_trace_and_a_planner_without_a_plan_are_plan_errors():
    other = Plan(fingerprint(trace_of("small_cnn")), (), "small_cnn")
    with pytest.raises(PlanError, match="not for this trace"):
        validate_plan(trace_of("mlp"), other, iterations=2, runs=1, samples=1)
    with pytest.raises(PlanError, match="capuchin.*made no plan"):
        validate_plan(trace_of("mlp"), "capuchin", iterations=2, runs=1, samples=1)


# ---- the device model ------------------------------------------------------------------
def _result(op_seconds, iteration_seconds, transfers=()):
    return SimpleNamespace(
        op_seconds=np.asarray(op_seconds, float),
        iteration_seconds=np.asarray(iteration_seconds, float),
        transfers=tuple(transfers),
    )


def test_op_latencies_are_least_call_times_plus_an_even_harness_share():
    # iteration 0 is warm-up; steady rows: op 0 at best 1 ms, op 1 at best 2 ms;
    # the best steady iteration is 5 ms: 2 ms of harness over 2 ops
    result = _result([[9e-3, 9e-3], [1e-3, 3e-3], [2e-3, 2e-3]], [30e-3, 5e-3, 6e-3])
    ops, overhead, best = op_latencies(result)
    np.testing.assert_allclose(ops, [2e-3, 3e-3])
    assert overhead == pytest.approx(1e-3) and best == pytest.approx(5e-3)
    assert Fixed(ops).durations_s.sum() == pytest.approx(best)


def test_lane_fixed_cost_is_the_median_lateness_after_the_links_schedule():
    # 1 MB at 1 GB/s is 1 ms. The first copy was ready at 0: by the link's
    # schedule it ends at 1 ms, and it ended at 3 ms, 2 ms late. The second,
    # ready at 0.5 ms, queues behind it on one lane: the link starts it at
    # 1 ms (the first's end by the schedule, not its actual end) and ends it
    # at 2 ms; it ended at 4.5 ms, 2.5 ms late. Median: 2.25 ms.
    mb = 10**6
    t = [
        TransferRecord(Direction.D2H, 1, 0, mb, 0.0, 0.0, 1e-3, 3e-3),
        TransferRecord(Direction.H2D, 1, 0, mb, 0.5e-3, 0.5e-3, 3e-3, 4.5e-3),
    ]
    fixed, n = lane_fixed_cost(_result([[0.0]], [0.0], t), 1e9, lanes=1)
    assert n == 2 and fixed == pytest.approx(2.25e-3)
    # on two lanes the swap-in does not queue: ends at 1.5 ms by the schedule, 3 ms late
    assert lane_fixed_cost(_result([[0.0]], [0.0], t), 1e9, lanes=2)[0] == pytest.approx(2.5e-3)
    assert lane_fixed_cost(_result([[0.0]], [0.0]), 1e9) == (0.0, 0)


@pytest.mark.parametrize("model", ["small_cnn", "tiny_transformer"])
def test_the_probe_is_a_valid_plan_of_swaps(model):
    trace = trace_of(model)
    plan = probe_plan(trace)
    assert plan is not None and plan.counts()["swap_out"] == plan.counts()["swap_in"] == PROBE_SWAPS
    check(plan, trace)


def test_a_probe_sample_is_the_extra_busy_time_per_transfer_of_an_iteration():
    def result(ms, wait_ms, transfers):
        return SimpleNamespace(
            iteration_seconds=np.array(ms) * 1e-3,
            wait_seconds=np.array(wait_ms) * 1e-3,
            recompute_seconds=np.zeros(len(ms)),
            transfers=(None,) * transfers,
        )

    plain = result([5.0, 2.0, 3.0], [0, 0, 0], 0)  # busy: the best steady iteration, 2 ms
    probe = result([9.0, 4.0, 5.0], [0, 1.0, 0], 6)  # busy 3 ms (4 - 1 of stall); 2 per iteration
    assert compute_sample(plain, probe) == pytest.approx(0.5e-3)


def test_the_compute_cost_per_transfer_is_the_median_of_every_sample():
    lane = LaneModel(1e9, 1e-5, True, 10, compute_s=3e-5, compute_samples=(3e-5,))
    pooled = lane.pooled([1e-5, 5e-5, 7e-5])
    assert pooled.compute_s == pytest.approx(4e-5)  # median of 1, 3, 5, 7
    assert pooled.compute_samples == (3e-5, 1e-5, 5e-5, 7e-5)
    assert (pooled.bandwidth_bytes_per_s, pooled.fixed_s, pooled.probes) == (1e9, 1e-5, 10)
    assert lane.pooled([-9e-5, -8e-5]).compute_s == 0.0  # a median below 0 counts as 0
    bare = LaneModel(1e9, 0.0, True, 0)
    assert bare.pooled([]) is bare


def test_the_kept_bracket_is_steady_and_its_probe_reads_the_pooled_cost():
    lane = LaneModel(1e9, 0.0, True, 10, compute_s=40e-6)
    assert unsteadiness(0.01, 60e-6, lane) == pytest.approx(0.51)  # 0.01 + 20/40
    assert unsteadiness(0.03, 40e-6, lane) == pytest.approx(0.03)
    # of two brackets, the one whose probe read the pooled cost wins over a steadier one
    assert unsteadiness(0.03, 40e-6, lane) < unsteadiness(0.01, 60e-6, lane)
    assert unsteadiness(0.02, None, lane) == 0.02  # no probe: drift alone
    assert unsteadiness(0.02, 60e-6, LaneModel(1e9, 0.0, True, 0)) == 0.02  # no cost to compare


def test_the_lane_is_sampled_in_every_bracket():
    r = _validate("small_cnn", "vdnn", runs=2, samples=2, lane_samples=3)
    assert len(r.lane.compute_samples) == 3 + 2 * 2
    assert r.lane.compute_s == max(float(np.median(r.lane.compute_samples)), 0.0)


def test_the_quietest_sample_wins_and_unknown_contention_takes_the_first():
    assert quietest([Sample("a", 0.5), Sample("b", 0.1), Sample("c", 0.3)]).value == "b"
    assert quietest([Sample("a", math.nan), Sample("b", math.nan)]).value == "a"


def test_peak_span_finds_a_copy_that_races_an_allocation():
    """NOTE [ Timing-sensitive peaks ], worked by hand (1 MiB per ms, no fixed
    cost). b0 (4 MiB) is swapped out after op 0: its copy ends at 5 ms. Op 1
    holds b2 (1 MiB) for `ms` ms; op 2 allocates b1 (2 MiB). If op 2 starts
    before 5 ms, b0 is still there: 4 + 2 = 6 MiB; if after, the peak is op
    1's 4 + 1 = 5 MiB. Op 4 needs b0 back (4 MiB alone)."""
    from memplan.validate.calibrate.measure import Measurement
    from memplan.validate.calibrate.simvsreal import peak_span

    from tests.sim.handtraces import B, MiB, gpu, make
    from tests.sim.handtraces import Call as SimCall

    def span(op1_ms: float) -> tuple[int, int]:
        trace, lat = make(
            [B(4), B(2), B(1)],
            [SimCall([], [0]), SimCall([], [2], ms=op1_ms), SimCall([], [1]), SimCall([1], []),
             SimCall([0], [])],
        )  # fmt: skip
        plan = Plan(fingerprint_of(trace), (SwapOut(0, 0), SwapIn(0, 3, 4)), "hand")
        check(plan, trace)
        peak = (
            simulate([Job(trace, plan)], DeviceModel(gpu(), lat, lanes=1), iterations=1)
            .jobs[0]
            .peak_bytes
        )
        model = Measurement(gpu(), lat.durations_s, overhead_s=0.0, iteration_s=0.0)
        lo, hi = peak_span(trace, plan, model, peak, iterations=1, lanes=1, spread=0.05)
        return lo // MiB, hi // MiB

    assert span(3.9) == (5, 6)  # op 2 at 4.9 ms; 5% slower: at 5.095 ms, after the copy
    assert span(3.0) == (6, 6)  # op 2 at 4 ms: before the copy ends at any speed
    assert span(5.0) == (5, 5)  # op 2 at 6 ms: after it at any speed


def test_a_measurement_charges_each_transfer_on_the_op_that_triggers_it():
    """The replay's compute-thread cost per transfer is the device's
    `extra_per_transfer_s`: the simulator adds it to the triggering op
    (the iteration's start charges op 0), not to the latencies."""
    from memplan.validate.calibrate.measure import Measurement

    from tests.sim.handtraces import B, MiB, gpu, make
    from tests.sim.handtraces import Call as SimCall

    trace, lat = make([B(1), B(1)], [SimCall([], [0]), SimCall([], [1]), SimCall([0, 1], [])])
    plan = Plan(fingerprint_of(trace), (SwapOut(0, 0), SwapIn(0, 1, 2)), "hand")
    m = Measurement(gpu(), lat.durations_s, overhead_s=0.0, iteration_s=0.0, compute_s=2e-4)
    device = m.device(1)
    assert device.extra_per_transfer_s == 2e-4 and device.latency.durations_s.tolist() == [
        1e-3,
        1e-3,
        1e-3,
    ]
    # ops of 1 ms; op 0 and op 1 each trigger one copy (+0.2 ms): op 0 ends at
    # 1.2, op 1 at 2.4; the swap-in (1 MiB, 1 ms) starts then and ends at 3.4,
    # op 2 stalls 1 ms and ends at 4.4 ms
    r = simulate([Job(trace, plan)], device, iterations=1)
    assert r.jobs[0].iteration_times_s[0] == pytest.approx(4.4e-3)
    assert r.jobs[0].stall_s == pytest.approx(1e-3)
    assert simulate([trace], device, iterations=1).jobs[0].iteration_times_s[0] == pytest.approx(
        3e-3
    )
    assert r.jobs[0].peak_bytes == 2 * MiB

"""Plans: JSON round trip, binding to a trace, one error per malformed case."""

from __future__ import annotations

import json

import pytest
from memplan.planners.core import io as plan_io
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import (
    Plan,
    PlanResult,
    Recompute,
    Release,
    Status,
    SwapIn,
    SwapOut,
    empty_plan,
    validate,
)
from memplan.traces.io import fingerprint

from tests.sim.handtraces import B, Call, make


def trace():
    # p param; x input; a, b activations; op1 has RNG (dropout-like)
    t, _ = make(
        [B(2, "param"), B(1, "input", freed_after=3), B(2), B(1)],
        [Call([0, 1], [2]), Call([2], [3], rng=True), Call([3], []), Call([2, 1], [])],
    )
    return t


EVENTS = (
    SwapOut(2, 0, delay_us=250.0),
    SwapOut(3, 1, before_op=2),
    SwapIn(2, 1, 3, delay_us=0.0),
    Release(3, 2),
    Recompute(3, 3, (1,), restore_rng=True),
    SwapIn(0, 3, 0, next_iteration=True),
)


def result(t):
    return PlanResult(
        planner="hand",
        status=Status.PLANNED,
        plans=(Plan(fingerprint(t), EVENTS, "hand"),),
        solve_time_s=0.5,
        options={"budget_bytes": 123},
        stats={"peak_bytes": 7},
    )


@pytest.mark.parametrize("name", ["plan.json", "plan.json.gz"])
def test_round_trip(tmp_path, name):
    t = trace()
    plan_io.save(result(t), tmp_path / name)
    back = plan_io.load(tmp_path / name, [t])
    assert back == result(t)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]  # atomic: no temp files


def test_json_form():
    d = plan_io.to_dict(result(trace()))
    assert d["schema"] == "memplan.plan/1"
    # a swap-out's deadline is written only when it has one
    assert d["plans"][0]["events"][0] == {
        "type": "swap_out",
        "buffer": 2,
        "after_op": 0,
        "delay_us": 250.0,
    }
    assert d["plans"][0]["events"][1] == {
        "type": "swap_out",
        "buffer": 3,
        "after_op": 1,
        "delay_us": 0.0,
        "before_op": 2,
    }
    assert d["plans"][0]["events"][2] == {
        "type": "swap_in",
        "buffer": 2,
        "after_op": 1,
        "before_op": 3,
        "delay_us": 0.0,
        "next_iteration": False,
    }
    assert d["plans"][0]["events"][4] == {
        "type": "recompute",
        "buffer": 3,
        "before_op": 3,
        "ops": [1],
        "restore_rng": True,
    }


def test_optional_fields_default():
    t = trace()
    d = plan_io.to_dict(result(t))
    d["plans"][0]["events"] = [{"type": "swap_out", "buffer": 2, "after_op": 0}]
    assert plan_io.from_dict(d, [t]).plans[0].events == (SwapOut(2, 0, 0.0, -1),)
    # before_op is optional for a swap-out only
    d["plans"][0]["events"] = [{"type": "swap_in", "buffer": 2, "after_op": 0}]
    with pytest.raises(PlanError, match=r"events\[0\].before_op: missing"):
        plan_io.from_dict(d, [t])


def test_counts():
    assert Plan("x", EVENTS).counts() == {"swap_out": 2, "swap_in": 2, "release": 1, "recompute": 1}


def test_wrong_trace_is_named(tmp_path):
    t = trace()
    other, _ = make([B(1)], [Call([], [0])], "other")
    plan_io.save(result(t), tmp_path / "p.json")
    with pytest.raises(PlanError, match=r"plans\[0\]: made for trace \w{12} \(hand\), not for this trace \w{12} \(other\)"):  # fmt: skip
        plan_io.load(tmp_path / "p.json", [other])


@pytest.mark.parametrize(
    "event, message",
    [
        (SwapOut(9, 0), r"events\[0\] \(swap_out of buffer 9\): unknown buffer 9 \(the trace has 0..3\)"),
        (SwapOut(2, 4), r"events\[0\] \(swap_out of buffer 2\): after_op 4 is not an op of the trace \(-1..3\)"),
        (SwapOut(2, 0, -1.0), r"delay_us=-1.0 must be a finite number >= 0"),
        (SwapOut(2, 1, before_op=1), r"before_op 1 is not after after_op 1 \(a swap-out's deadline is in its own iteration; -1 sets none\)"),
        (SwapOut(2, 1, before_op=4), r"swap_out of buffer 2\): before_op 4 is not an op of the trace \(0..3\)"),
        (SwapIn(2, 1, 7), r"before_op 7 is not an op of the trace \(0..3\)"),
        (SwapIn(2, 3, 1), r"after_op 3 is not before before_op 1 \(set next_iteration"),
        (SwapIn(2, 3, 1, next_iteration=True), r"next_iteration needs a persistent buffer; buffer 2 \(activation\)"),
        (Release(1, -2), r"after_op -2 is not an op"),
        (Recompute(3, 3, ()), r"ops is empty"),
        (Recompute(3, 3, (1, 0)), r"ops \[1, 0\] must be strictly ascending"),
        (Recompute(3, 2, (2,)), r"op 2 does not run before before_op 2"),
        (Recompute(3, 3, (0,)), r"none of ops \[0\] writes buffer 3"),
    ],
)  # fmt: skip
def test_validate_names_the_event(event, message):
    t = trace()
    with pytest.raises(PlanError, match=message):
        validate(Plan(fingerprint(t), (event,)), t)


def _nested(depth: int) -> list:
    x: list = []
    for _ in range(depth - 1):
        x = [x]
    return x


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(schema="memplan.plan/0"), r"schema: expected 'memplan.plan/1'"),
        (lambda d: d["plans"][0]["events"][0].update(type="swap"), r"plans\[0\].events\[0\].type: unknown event \"swap\""),
        (lambda d: d["plans"][0]["events"][0].update(type={}), r"plans\[0\].events\[0\].type: unknown event \{\} \(one of swap_out"),
        (lambda d: d["plans"][0]["events"][0].pop("type"), r"events\[0\].type: missing"),
        (lambda d: d["plans"][0]["events"][0].pop("after_op"), r"plans\[0\].events\[0\].after_op: missing"),
        (lambda d: d["plans"][0]["events"][1].update(before_op="2"), r"events\[1\].before_op: expected an integer, got \"2\""),
        (lambda d: d["plans"][0]["events"][1].update(before_op=-2), r"events\[1\].before_op: expected an integer in \[-1, "),
        (lambda d: d["plans"][0]["events"][2].update(before_op=-1), r"events\[2\].before_op: expected an integer in \[0, "),
        (lambda d: d["plans"][0]["events"][0].update(buffer=2**63), r"events\[0\].buffer: expected an integer in \[0, 9223372036854775807\]"),
        (lambda d: d["plans"][0]["events"][0].update(buffer=True), r"events\[0\].buffer: expected an integer, got true"),
        (lambda d: d["plans"][0]["events"][0].update(delay_us=10**400), r"events\[0\].delay_us: expected a finite number"),
        (lambda d: d["plans"][0]["events"][0].update(delay_us="1"), r"events\[0\].delay_us: expected a number, got \"1\""),
        (lambda d: d["plans"][0]["events"][0].update(delay_us=-0.5), r"events\[0\].delay_us: expected a number in \[0, 8.64e\+10\]"),
        (lambda d: d["plans"][0]["events"][0].update(delay_us=1e308), r"events\[0\].delay_us: expected a number in \[0, 8.64e\+10\], got 1e\+308"),
        (lambda d: d["plans"][0]["events"][2].update(next_iteration=1), r"events\[2\].next_iteration: expected true or false, got 1"),
        (lambda d: d["plans"][0]["events"][4].update(ops=[1.5]), r"events\[4\].ops\[0\]: expected an integer, got 1.5"),
        (lambda d: d["plans"][0]["events"][4].update(ops=3), r"events\[4\].ops: expected a list of op indices, got 3"),
        (lambda d: d["plans"][0]["events"].append(7), r"events\[6\]: expected an object, got 7"),
        (lambda d: d["plans"][0].update(events={}), r"plans\[0\].events: expected a list, got \{\}"),
        (lambda d: d["plans"][0].update(trace=None), r"plans\[0\].trace: expected a string, got null"),
        (lambda d: d["plans"][0].update(model=["x"]), r"plans\[0\].model: expected a string"),
        (lambda d: d.update(plans={}), r"plans: expected a list of plans, got \{\}"),
        (lambda d: d.update(status="maybe"), r'status: unknown Status "maybe" \(one of planned'),
        (lambda d: d.update(status=5), r"status: expected a string, got 5"),
        (lambda d: d.update(reason="time limit"), r"'time limit' does not go with status 'planned'"),
        (lambda d: [d.pop("status"), d.update(feasible="yes")], r"feasible: expected true or false, got \"yes\""),
        (lambda d: d.update(solve_time_s=float("nan")), r"solve_time_s: expected a finite number, got NaN"),
        (lambda d: d.update(options=[]), r"options: expected an object, got \[\]"),
        (lambda d: d.update(planner=None), r"planner: expected a string"),
        (lambda d: d["plans"][0].update(events=_nested(70)), r"plan: nested more than 64 levels deep"),
        (lambda d: d["plans"][0]["events"][0].update(delay_su=5), r"events\[0\].delay_su: unknown field of a swap_out \(one of type, buffer, after_op, delay_us, before_op\)"),
        (lambda d: d["plans"][0]["events"][3].update(delay_us=0), r"events\[3\].delay_us: unknown field of a release"),
        (lambda d: d["plans"][0].update(job=1), r"plans\[0\].job: unknown field of a plan"),
        (lambda d: d.update(budget=1), r"plan.budget: unknown field of a result"),
    ],
)  # fmt: skip
def test_malformed_files(tmp_path, edit, message):
    d = plan_io.to_dict(result(trace()))
    edit(d)
    (tmp_path / "p.json").write_text(json.dumps(d))
    with pytest.raises(PlanError, match=message):
        plan_io.load(tmp_path / "p.json")


def test_unreadable_files(tmp_path):
    with pytest.raises(PlanError, match="no such plan file"):
        plan_io.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(PlanError, match="not valid JSON"):
        plan_io.load(tmp_path / "bad.json")
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(PlanError, match="empty.json: not valid JSON"):
        plan_io.load(tmp_path / "empty.json")
    # 100,000 levels: Python's json gives up with a RecursionError, the loader with one line
    (tmp_path / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(PlanError, match="deep.json: "):
        plan_io.load(tmp_path / "deep.json")


def test_plan_count_must_match_traces(tmp_path):
    t = trace()
    plan_io.save(result(t), tmp_path / "p.json")
    with pytest.raises(PlanError, match="1 plans for 2 traces"):
        plan_io.load(tmp_path / "p.json", [t, t])


def test_empty_plan_is_bound_to_its_trace():
    t = trace()
    p = empty_plan(t)
    assert (p.trace_fingerprint, p.events, p.model) == (fingerprint(t), (), "hand")
    validate(p, t)


def test_events_store_plain_ints():
    # planners index numpy arrays: events must hash, compare and serialise alike
    import numpy as np

    ev = SwapIn(np.int64(2), np.int32(1), np.int64(3), 250)
    assert ev == SwapIn(2, 1, 3, 250.0) and hash(ev) == hash(SwapIn(2, 1, 3, 250.0))
    assert type(ev.buffer) is int and type(ev.delay_us) is float
    assert Recompute(np.int64(3), 3, [np.int64(1)]).ops == (1,)
    json.dumps(plan_io.event_to_dict(ev))
    with pytest.raises(TypeError):
        SwapOut(1.5, 0)


def test_delays_longer_than_the_iteration_are_refused():
    # NOTE [ Delays within the iteration ]: four ops of 1, 2, 3 and 4 ms make
    # a 10 ms iteration on this device; a delay up to it is a plan, past it not
    from memplan.hwmodels.device import DeviceModel
    from memplan.hwmodels.latency import Fixed
    from memplan.planners.core.check import check_delays, iteration_us

    from tests.hwmodels.handmade import device

    t = trace()
    dev = DeviceModel(device(), Fixed([1e-3, 2e-3, 3e-3, 4e-3]))
    assert iteration_us(t, dev) == 10_000.0
    check_delays(Plan(fingerprint(t), (SwapOut(2, 0, 10_000.0), Release(3, 2))), t, dev)
    late = Plan(fingerprint(t), (Release(3, 2), SwapIn(2, 1, 3, delay_us=10_000.5)))
    with pytest.raises(PlanError, match=r"^p.json: plans\[0\].events\[1\].delay_us: 10000.5 us is longer than the iteration it belongs to \(10000 us of ops on hand-gpu\)$"):  # fmt: skip
        check_delays(late, t, dev, "p.json: plans[0]")

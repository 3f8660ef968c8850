"""Runtime plan files: every field checked, one line naming it
(NOTE [ Runtime plan fields ] in validate/runtime/io.py)."""

from __future__ import annotations

import json

import pytest
from memplan.traces.model import BufferKind
from memplan.validate.runtime.errors import RuntimePlanError
from memplan.validate.runtime.io import from_dict, load, save, to_dict
from memplan.validate.runtime.moments import Moment, StateSwap, When
from memplan.validate.runtime.plan import Action, RecomputeOp, RuntimePlan, SavedDecision, Skipped

RP = RuntimePlan(
    trace_fingerprint="f" * 64,
    model="mlp",
    planner="hand",
    saved=(
        SavedDecision(0, "fc1", 3, 1024, False, Action.OFFLOAD, 1),
        SavedDecision(1, "fc2", 4, 512, False, Action.KEEP),
        SavedDecision(2, "block", 5, 256, False, Action.RECOMPUTE),
    ),
    regions=("block",),
    recompute=(RecomputeOp("block", 0, "block.relu", "aten.relu.default", 0),),
    skipped=(Skipped("release of buffer 9", "not a saved tensor"),),
    state=(
        StateSwap(
            "fc1.weight",
            BufferKind.OPTIMIZER_STATE,
            "exp_avg",
            4096,
            When(Moment.STEP_END),
            When(Moment.STEP_START),
            When(Moment.OPTIMIZER_STEP),
        ),
        StateSwap(
            "fc2.weight",
            BufferKind.PARAM,
            "",
            2048,
            When(Moment.STEP_END),
            When(Moment.STEP_END),
            When(Moment.FORWARD, "fc2"),
        ),
    ),
    host_step=("fc2.bias",),
)


def _nested(depth: int) -> list:
    x: list = []
    for _ in range(depth - 1):
        x = [x]
    return x


def test_round_trip(tmp_path):
    save(RP, tmp_path / "rt.json")
    assert load(tmp_path / "rt.json") == RP
    assert from_dict(json.loads(json.dumps(to_dict(RP)))) == RP


def test_a_first_schema_file_reads_without_state_moves():
    d = json.loads(json.dumps(to_dict(RP)))
    for key in ("state", "host_step"):
        del d[key]
    d["schema"] = "memplan.runtime/1"
    rp = from_dict(d)
    assert rp.state == () and rp.host_step == ()
    assert rp.saved == RP.saved and to_dict(rp)["schema"] == "memplan.runtime/2"


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(schema=None), r"^schema: expected 'memplan.runtime/1' or 'memplan.runtime/2', got null$"),
        (lambda d: d.update(schema="memplan.runtime/3"), r"^schema: expected .* got \"memplan.runtime/3\"$"),
        (lambda d: d["state"][0].update(kind="activation"), r"^state\[0\].kind: 'activation' is not param, grad or optimizer_state$"),
        (lambda d: d["state"][0].update(key=""), r"^state\[0\].key: \"\"; a key is named exactly for optimizer state$"),
        (lambda d: d["state"][1]["back"].update(module=""), r"^state\[1\].back.module: \"\"; a module is named exactly for 'forward'$"),
        (lambda d: d["state"][1]["out"].update(moment="noon"), r'^state\[1\].out.moment: unknown Moment "noon" \(one of step_start, forward'),
        (lambda d: d["state"][0].pop("fetch"), r"^state\[0\].fetch: expected an object, got null$"),
        (lambda d: d["state"][0].update(back={"moment": "step_end", "module": ""}), r"^state\[0\]: leaves and comes back at the same moment \(step_end\)$"),
        (lambda d: d["state"][0].update(nbytes=-4), r"^state\[0\].nbytes: expected an integer in \[0, "),
        (lambda d: d.update(host_step=["a", "a"]), r"^host_step: 'a' listed twice$"),
        (lambda d: d.update(host_step=[3]), r"^host_step\[0\]: expected a string, got 3$"),
        (lambda d: d.pop("saved"), r"^saved: missing$"),
        (lambda d: d.update(saved={}), r"^saved: expected a list, got \{\}$"),
        (lambda d: d["saved"].append(3), r"^saved\[3\]: expected an object, got 3$"),
        (lambda d: d["saved"][0].update(action={}), r"^saved\[0\].action: expected a string, got \{\}$"),
        (lambda d: d["saved"][0].update(action="drop"), r'^saved\[0\].action: unknown Action "drop" \(one of keep, offload'),
        (lambda d: d["saved"][0].update(index=1), r"^saved\[0\].index: 1, expected 0 \(pack order\)$"),
        (lambda d: d["saved"][0].update(nbytes=2**63), r"^saved\[0\].nbytes: expected an integer in \[0, 9223372036854775807\], got 9223372036854775808$"),
        (lambda d: d["saved"][0].update(nbytes=-1), r"^saved\[0\].nbytes: expected an integer in \[0, "),
        (lambda d: d["saved"][0].update(buffer=1.0), r"^saved\[0\].buffer: expected an integer, got 1.0$"),
        (lambda d: d["saved"][0].update(persistent="false"), r"^saved\[0\].persistent: expected true or false, got \"false\"$"),
        (lambda d: d["saved"][0].update(prefetch_after=3), r"^saved\[0\].prefetch_after: expected an integer in \[0, 2\], got 3$"),
        (lambda d: d["saved"][0].update(prefetch_after=True), r"^saved\[0\].prefetch_after: expected an integer, got true$"),
        (lambda d: d["saved"][1].update(module=None), r"^saved\[1\].module: expected a string, got null$"),
        (lambda d: d["recompute"][0].update(occurrence=10**400), r"^recompute\[0\].occurrence: expected an integer in"),
        (lambda d: d.update(recompute=[7]), r"^recompute\[0\]: expected an object, got 7$"),
        (lambda d: d.update(regions=["a", 1]), r"^regions\[1\]: expected a string, got 1$"),
        (lambda d: d.update(skipped=[{"event": "x"}]), r"^skipped\[0\].reason: missing$"),
        (lambda d: d.update(model=5), r"^runtime.model: expected a string, got 5$"),
        (lambda d: d.update(trace=["x"]), r"^runtime.trace: expected a string"),
        (lambda d: d.update(skipped=_nested(70)), r"^runtime: nested more than 64 levels deep$"),
    ],
)  # fmt: skip
def test_malformed_fields_are_named(edit, message):
    d = json.loads(json.dumps(to_dict(RP)))
    edit(d)
    with pytest.raises(RuntimePlanError, match=message):
        from_dict(d)


def test_file_errors_name_the_file(tmp_path):
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(RuntimePlanError, match=r"empty.json: not valid JSON"):
        load(tmp_path / "empty.json")
    d = to_dict(RP)
    d["saved"][2]["nbytes"] = "256"
    (tmp_path / "bad.json").write_text(json.dumps(d))
    with pytest.raises(RuntimePlanError, match=r"bad.json: saved\[2\].nbytes: expected an integer, got \"256\""):  # fmt: skip
        load(tmp_path / "bad.json")

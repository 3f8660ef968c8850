"""Every JSON result memplan writes says what made it (NOTE [ Provenance ]):
memplan's version, the command, the traces by fingerprint, the profile, the
options and the seed -- and stays deterministic."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memplan.hwmodels.profile import load_hardware
from memplan.planners.core import io as plan_io
from memplan.planners.core.errors import PlanError
from memplan.traces import io
from memplan.traces.capture import capture
from memplan.traces.zoo import ZOO

import memplan
from memplan.cli import main
from memplan.provenance import provenance


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> tuple[Path, str]:
    """mlp's trace as a file, and its fingerprint."""
    path = tmp_path_factory.mktemp("prov") / "mlp.json.gz"
    trace = capture(ZOO["mlp"], 4, model_name="mlp")
    io.save(trace, path)
    return path, io.fingerprint(trace)


def test_provenance_by_hand(mlp):
    trace = io.load(mlp[0])
    hw = load_hardware("rtx-a6000")
    p = provenance([trace, trace], hw, options={"k": (1, 2)}, seed=7, command="memplan x")
    assert p == {
        "memplan_version": memplan.__version__,
        "command": "memplan x",
        "traces": [{"name": "mlp", "fingerprint": mlp[1]}] * 2,  # one entry per job
        "profile": {**p["profile"]},
        "options": {"k": [1, 2]},
        "seed": 7,
    }
    prof = p["profile"]
    assert (prof["name"], prof["memory_bytes"], prof["source"]) == (
        "rtx-a6000", hw.memory_bytes, hw.source)  # fmt: skip
    assert prof["peak_flops"] == hw.peak_flops and prof["h2d_bytes_per_s"] == hw.h2d_bytes_per_s
    json.dumps(p, allow_nan=False)  # strict JSON


def run_json(capsys, *argv: str) -> dict:
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


def check(prov: dict, command: str, fingerprints: list[str]) -> None:
    assert prov["memplan_version"] == memplan.__version__
    assert prov["command"] == f"memplan {command}"
    assert [t["fingerprint"] for t in prov["traces"]] == fingerprints
    assert "out" not in prov["options"] and "json" not in prov["options"]


def test_compare_json_report_and_plans_carry_it(mlp, capsys, tmp_path):
    path, fp = mlp
    argv = ["compare", f"{path}:2", "--gpu", "rtx-a6000", "--planners", "vdnn,dtr",
            "--budget", "80%", "--fallback", "dtr", "--json"]  # fmt: skip
    doc = run_json(capsys, *argv, "--out", str(tmp_path / "r"))
    prov = doc["provenance"]
    check(prov, "compare", [fp, fp])
    assert prov["profile"]["name"] == "rtx-a6000" and prov["seed"] == 0
    assert prov["options"]["budget"] == "80%" and prov["options"]["planners"] == "vdnn,dtr"
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    assert report == doc
    plan = json.loads((tmp_path / "r" / "plans" / "vdnn.json").read_text())
    assert plan["provenance"] == prov
    plan_io.load(tmp_path / "r" / "plans" / "vdnn.json", [io.load(path)] * 2)  # still a plan file
    # the same command gives the same provenance, wherever it writes (the
    # rest of compare's JSON holds planning wall times)
    again = run_json(capsys, *argv, "--out", str(tmp_path / "elsewhere"))
    assert json.dumps(again["provenance"]) == json.dumps(prov)


def test_plan_files_accept_provenance_and_still_refuse_junk(mlp, capsys, tmp_path):
    path, fp = mlp
    out = tmp_path / "p.json"
    summary = run_json(capsys, "plan", str(path), "--planner", "vdnn", "--gpu", "rtx-a6000",
                       "--out", str(out), "--json")  # fmt: skip
    doc = json.loads(out.read_text())
    check(doc["provenance"], "plan", [fp])
    assert summary["provenance"] == doc["provenance"]
    assert doc["provenance"]["options"]["planner"] == "vdnn"
    plan_io.from_dict(doc)
    for bad, message in [({"junk": 1}, "plan.junk: unknown field of a result"),
                         ({"provenance": [1]}, "provenance: expected an object")]:  # fmt: skip
        with pytest.raises(PlanError, match=message):
            plan_io.from_dict({**doc, **bad})


def test_bounds_simulate_export_and_dynamic_json(mlp, capsys, tmp_path):
    path, fp = mlp
    doc = run_json(capsys, "bounds", str(path), "--gpu", "rtx-a6000", "--time-limit", "0",
                   "--json")  # fmt: skip
    check(doc["provenance"], "bounds", [fp])
    doc = run_json(capsys, "simulate", str(path), "--gpu", "rtx-a6000", "--json",
                   "--out", str(tmp_path / "sim"))  # fmt: skip
    check(doc["provenance"], "simulate", [fp])
    assert json.loads((tmp_path / "sim" / "result.json").read_text()) == doc
    assert main(["plan", str(path), "--planner", "vdnn", "--gpu", "rtx-a6000",
                 "--out", str(tmp_path / "p.json")]) == 0  # fmt: skip
    capsys.readouterr()
    doc = run_json(capsys, "export", str(tmp_path / "p.json"), "--trace", str(path),
                   "--out", str(tmp_path / "rt.json"), "--json")  # fmt: skip
    check(doc["provenance"], "export", [fp])
    assert doc["provenance"]["profile"] is None  # export costs nothing on a device
    doc = run_json(capsys, "compare", str(path), "--gpu", "rtx-a6000", "--dynamic", "vdnn",
                   "--json", "--out", str(tmp_path / "dyn"))  # fmt: skip
    check(doc["provenance"], "compare", [fp])
    assert json.loads((tmp_path / "dyn" / "report.json").read_text()) == doc


def test_capacity_json(mlp, capsys, tmp_path):
    path, fp = mlp
    doc = run_json(capsys, "capacity", "--trace", str(path), "--gpu", "rtx-a6000", "--jobs", "2",
                   "--planners", "vdnn", "--json", "--no-progress", "--out", str(tmp_path / "c"))  # fmt: skip
    check(doc["provenance"], "capacity", [fp])
    assert json.loads((tmp_path / "c" / "report.json").read_text()) == doc

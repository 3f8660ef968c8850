"""`memplan validate` and `memplan export` as a user runs them."""

from __future__ import annotations

import json

import pytest
from memplan.planners.core import io as plan_io
from memplan.planners.core.plan import PlanResult, Status
from memplan.traces import io
from memplan.validate.runtime.io import load
from memplan.validate.runtime.plan import Action

from memplan.cli import main
from tests.validate.helpers import trace_of
from tests.validate.test_compare import plan_for

QUICK = ["--iterations", "2", "--runs", "1", "--samples", "1"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """small_cnn's trace, its vdnn plan and mlp's trace, as files."""
    d = tmp_path_factory.mktemp("validate")
    io.save(trace_of("small_cnn"), d / "cnn.json.gz")
    io.save(trace_of("mlp"), d / "mlp.json.gz")
    result = PlanResult("vdnn", Status.PLANNED, (plan_for("small_cnn", "vdnn"),))
    plan_io.save(result, d / "vdnn.json")
    return d


def test_validate_json_has_the_promised_keys(files, capsys):
    argv = ["validate", str(files / "cnn.json.gz"), "--plan", str(files / "vdnn.json")]
    assert main([*argv, "--bandwidth", "2GB/s", *QUICK, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    keys = {"correct", "time_pred_s", "time_meas_s", "time_err"}
    assert keys | {"peak_pred_bytes", "peak_meas_bytes", "peak_err"} <= out.keys()
    assert out["correct"] is True and out["mismatch"] == ""
    assert out["bandwidth_bytes_per_s"] == 2e9 and out["bandwidth_throttled"] is True
    assert out["events"]["swap_out"] > 0 and out["bytes_d2h_meas"] > 0
    assert out["time_err"] == pytest.approx(
        (out["time_pred_s"] - out["time_meas_s"]) / out["time_meas_s"]
    )


def test_validate_table_with_a_planner(files, capsys):
    assert main(["validate", str(files / "mlp.json.gz"), "--planner", "release_only", *QUICK]) == 0
    out = capsys.readouterr().out
    assert "plan release_only" in out and "iteration (steady)" in out and "peak" in out
    assert "results: bit-identical to the vanilla replay" in out
    assert "+0.0%" in out  # release_only's peak needs no timing: predicted exactly


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--planner", "nope"], "unknown planner 'nope'"),
        (["--planner", "capuchin"], "capuchin' made no plan"),
        (["--planner", "vdnn", "--bandwidth", "fast"], "--bandwidth='fast'"),
        (["--planner", "vdnn", "--iterations", "1"], "argument --iterations"),
        (["--planner", "vdnn", "--device", "tpu"], "device='tpu'"),
        (["--planner", "vdnn", "--budget", "lots"], "--budget='lots'"),
        (["--planner", "vdnn", "--option", "vdnn.nope=1"], "unknown option 'nope'"),
        (["--planner", "vdnn", "--option", "tensile.recompute=0"], "an option of 'tensile'"),
        (["--plan", "VDNN"], "vdnn.json"),  # the plan of small_cnn, for mlp's trace
        (["--plan", "/nonexistent.json"], "no such plan file"),
    ],
)
def test_validate_bad_input_is_one_line_and_exit_2(files, capsys, argv, message):
    argv = [str(files / "vdnn.json") if a == "VDNN" else a for a in argv]
    try:
        code = main(["validate", str(files / "mlp.json.gz"), *QUICK, *argv])
    except SystemExit as e:  # a bad argument value, refused by argparse
        code = e.code
    assert code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memplan validate: error:") and "\n" not in err
    assert message in err


def test_validate_needs_a_plan_or_a_planner(files, capsys):
    with pytest.raises(SystemExit) as e:
        main(["validate", str(files / "mlp.json.gz")])
    assert e.value.code == 2
    assert "--plan" in capsys.readouterr().err


def test_export_writes_a_runtime_plan(files, tmp_path, capsys):
    out = tmp_path / "runtime_plan.json"
    argv = ["export", str(files / "vdnn.json"), "--trace", str(files / "cnn.json.gz")]
    assert main([*argv, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    # 13 saved tensors hold a buffer vDNN offloads; the loss's target, the
    # one input of the last layer that backward reads, stays (its copy would
    # overlap no op: planners/heuristics/vdnn.py NOTE [ vDNN layers and feature maps ])
    assert "13 offloaded" in text and f"wrote {out}" in text
    rp = load(out)
    assert rp.planner == "vdnn" and rp.counts()["offload"] == 13
    assert main([*argv, "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["saved_tensors"]["offload"] == 13
    assert summary["offloaded_bytes"] == rp.held_bytes(frozenset({Action.OFFLOAD})) > 0


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--trace", "MLP"], "not for this trace"),
        (["--trace", "CNN", "--job", "3"], "--job=3"),
    ],
)
def test_export_bad_input_is_one_line_and_exit_2(files, tmp_path, capsys, argv, message):
    paths = {"MLP": str(files / "mlp.json.gz"), "CNN": str(files / "cnn.json.gz")}
    argv = [paths.get(a, a) for a in argv]
    out = tmp_path / "x.json"
    assert main(["export", str(files / "vdnn.json"), *argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("memplan export: error:") and message in err and "\n" not in err
    assert not out.exists()

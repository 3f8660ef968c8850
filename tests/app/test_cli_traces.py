"""`memplan capture` and `memplan inspect` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from memplan.cli import main
from tests.fuzz.harness import assert_rejected, run_cli

ROOT = Path(__file__).resolve().parents[2]
RESNET = ROOT / "traces" / "data" / "resnet50_b16_adam.json.gz"


def test_inspect_json_has_the_promised_keys(capsys):
    assert main(["inspect", str(RESNET), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"ops", "buffers", "bytes_by_kind", "peak_bytes", "peak_op"} <= out.keys()
    assert set(out["bytes_by_kind"]) == {
        "input",
        "param",
        "grad",
        "activation",
        "optimizer_state",
        "other",
    }
    assert out["bytes_by_kind"]["param"] == 4 * 25_557_032
    assert out["bytes_by_kind"]["optimizer_state"] == 2 * out["bytes_by_kind"]["param"]


def test_inspect_table(capsys):
    assert main(["inspect", str(RESNET)]) == 0
    out = capsys.readouterr().out
    assert "vanilla peak" in out and "largest 10 buffers" in out


def test_capture_then_inspect(tmp_path, capsys):
    out = tmp_path / "cnn.json.gz"
    assert main(["capture", "--model", "small_cnn", "--batch", "4", "--out", str(out)]) == 0
    assert "captured small_cnn batch 4" in capsys.readouterr().out
    assert main(["inspect", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ops"] > 10


@pytest.mark.parametrize(
    "argv,message",
    [
        (["inspect", "/nonexistent.json"], "no such trace file"),
        (["capture", "--model", "nope", "--batch", "2", "--out", "x.json"], "nope"),
        (["capture", "--model", "mlp", "--batch", "0", "--out", "x.json"], "argument --batch"),
        (
            ["capture", "--model", "mlp", "--batch", "2", "--device", "tpu", "--out", "x.json"],
            "device='tpu'",
        ),
        (
            ["capture", "--model", "os:nothing_here", "--batch", "2", "--out", "x.json"],
            "nothing_here",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, argv, message):
    proc = subprocess.run(
        [sys.executable, "-m", "memplan", *argv], cwd=tmp_path, capture_output=True, text=True
    )
    assert proc.returncode == 2, proc.stderr
    lines = [
        ln
        for ln in proc.stderr.splitlines()
        if ln.strip() and "Warning" not in ln and "cpu = _conversion" not in ln
    ]
    assert len(lines) == 1 and message in lines[0], proc.stderr
    assert not (tmp_path / "x.json").exists()


def test_broken_trace_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(
        '{"schema": "memplan.trace/1", "meta": {"model": "m", "batch_size": 1},'
        ' "buffers": [{"id": 0, "nbytes": -1, "kind": "param"}], "views": [], "ops": []}'
    )
    proc = subprocess.run(
        [sys.executable, "-m", "memplan", "inspect", str(bad)], capture_output=True, text=True
    )
    assert proc.returncode == 2
    assert (
        "buffers[0].nbytes: expected an integer in [0, 4611686018427387904], got -1" in proc.stderr
    )


def test_inspect_names_the_largest_update_group(capsys):
    # vgg16's fc6 (25088 x 4096 fp32 weights) and its two Adam moments
    vgg = ROOT / "traces" / "data" / "vgg16_b16_adam.json.gz"
    assert main(["inspect", str(vgg), "--json"]) == 0
    groups = json.loads(capsys.readouterr().out)["update_groups"]
    fc6 = 25088 * 4096 * 4
    assert groups == {
        "groups": 32,
        "largest": {
            "params": ["classifier.0.weight"],
            "param_bytes": fc6,
            "state_bytes": 2 * fc6,
            "grad_bytes": fc6,
            "ops": 7,
        },
    }
    assert main(["inspect", str(vgg)]) == 0
    assert "32 update group(s); the largest updates classifier.0.weight" in capsys.readouterr().out


def test_inspect_times_the_update_groups_on_a_host(capsys):
    # the groups split the optimizer's ops, so all of them on the host take the
    # optimizer phase's roofline time there; fc6's group is most of it
    from memplan.hwmodels.device import DeviceModel, TimeUnit
    from memplan.hwmodels.latency import Roofline
    from memplan.hwmodels.profile import load_hardware
    from memplan.traces import io

    vgg = ROOT / "traces" / "data" / "vgg16_b16_adam.json.gz"
    assert main(["inspect", str(vgg), "--json", "--host", "cpu-local"]) == 0
    host = json.loads(capsys.readouterr().out)["update_groups"]["host"]
    t = io.load(vgg)
    d = DeviceModel(load_hardware("cpu-local"), Roofline()).op_durations(t, TimeUnit.S)
    optimizer = [op.id for op in t.ops if op.phase.value == "optimizer"]
    assert host["profile"] == "cpu-local" and host["latency"] == "roofline"
    assert host["all_s"] == pytest.approx(float(d[optimizer].sum()), rel=1e-12)
    assert 0.5 * host["all_s"] < host["largest_s"] < host["all_s"]


def test_inspect_host_is_refused_where_it_means_nothing(tmp_path):
    snap = tmp_path / "s.pickle"
    snap.write_bytes(b"\x80\x04N.")  # any pickle: refused before it is read
    for argv, names in (
        ([str(RESNET), "--host", "nope"], ["unknown hardware 'nope'"]),
        ([str(snap), "--host", "cpu-local"], ["--host", "snapshot"]),
    ):
        assert_rejected(run_cli(["inspect", *argv], 60), *names)

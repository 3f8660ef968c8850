"""Latency model and microbenchmark dataset files: a missing, empty, corrupt
or absurd file is one `LatencyError` line naming the file and the field
(NOTE [ Latency model files ] in hwmodels/mlp.py, NOTE [ Dataset fields ]
in hwmodels/dataset.py)."""

from __future__ import annotations

import gzip
import io
import json
import math

import numpy as np
import pytest
import torch
from memplan.hwmodels.dataset import Dataset, DatasetMeta, load_dataset, save_dataset
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.mlp import DEFAULT_MODEL, MLPLatency

from memplan.cli import main
from tests.hwmodels.handmade import add, make, mm


def _shipped_doc() -> dict:
    return torch.load(io.BytesIO(DEFAULT_MODEL.read_bytes()), weights_only=True)


def _first(doc: dict) -> dict:
    return next(iter(doc["classes"].values()))


def _save(doc: dict, path):
    buf = io.BytesIO()
    torch.save(doc, buf)
    path.write_bytes(buf.getvalue())
    return path


def test_empty_and_odd_files_are_one_line(tmp_path):
    # an empty file made torch raise an exception with no text: an IndexError once
    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(LatencyError, match=r"empty.pt: not a saved latency model: \w+"):
        MLPLatency.load(tmp_path / "empty.pt")
    with pytest.raises(LatencyError, match="is a directory, not a latency model"):
        MLPLatency.load(tmp_path)
    with pytest.raises(LatencyError, match=r"x.pt: schema: expected"):
        MLPLatency.load(_save({"schema": 1}, tmp_path / "x.pt"))


def test_the_cli_reports_an_empty_latency_file_in_one_line(tmp_path, capsys):
    (tmp_path / "empty.pt").write_bytes(b"")
    argv = ["simulate", "zoo:resnet50", "--gpu", "a100-pcie-40gb", "--latency"]
    assert main([*argv, str(tmp_path / "empty.pt")]) == 2
    err = capsys.readouterr().err.strip()
    assert "empty.pt" in err and "\n" not in err


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d.update(classes=[1, 2]), r"malformed latency model \(classes: expected a table\)"),
        (lambda d: d["meta"].pop("baseline"), r"malformed latency model \('baseline'\)"),
        (lambda d: d["meta"]["baseline"].update(flops_per_s=-1.0), r"meta.baseline.flops_per_s: expected a number in \[0, inf\], got -1.0"),
        (lambda d: d["meta"]["baseline"].update(flops_per_s=0.0), r"meta.baseline.flops_per_s: expected a number > 0, got 0.0"),
        (lambda d: d["meta"]["baseline"].update(bytes_per_s=math.inf), r"meta.baseline.bytes_per_s: expected a finite number"),
        (lambda d: d["meta"]["baseline"].update(overhead_s=-1e-6), r"meta.baseline.overhead_s: expected a number in \[0, inf\]"),
        (lambda d: d["meta"].update(hardware=3), r"meta.hardware: expected a string, got 3"),
        (lambda d: _first(d)["params"].__setitem__(0, math.nan), r"classes.\w+.params: expected finite numbers"),
        (lambda d: _first(d).update(params=[1.0]), r"malformed latency model"),
        (lambda d: _first(d).update(members=0), r"classes.\w+.members: expected an integer in \[1, 64\], got 0"),
        (lambda d: _first(d).update(sizes=[3, 1]), r"classes.\w+.sizes: expected \d+ inputs .. 1 output, got \[3, 1\]"),
        (lambda d: _first(d).update(sizes=[*_first(d)["sizes"][:-1], 2]), r"classes.\w+.sizes: expected \d+ inputs .. 1 output"),
        (lambda d: _first(d)["spec"].update(std=[0.0] * len(_first(d)["spec"]["std"])), r"classes.\w+.spec.std\[0\]: expected a number in \[1e-300, inf\], got 0.0"),
        (lambda d: _first(d)["spec"].update(mean=[1.0]), r"classes.\w+.spec.mean: expected \d+ numbers"),
        (lambda d: _first(d)["spec"].update(usage_max=2.0), r"classes.\w+.spec.usage_max: expected a number in \[0, 1\], got 2.0"),
        (lambda d: _first(d)["spec"].update(op_class="gpu"), r"malformed latency model \('gpu' is not a valid OpClass\)"),
    ],
)  # fmt: skip
def test_a_malformed_model_names_the_field(tmp_path, edit, message):
    doc = _shipped_doc()
    edit(doc)
    path = _save(doc, tmp_path / "m.pt")
    with pytest.raises(LatencyError, match=message) as e:
        MLPLatency.load(path)
    assert str(e.value).startswith(str(path)) and "\n" not in str(e.value)


def test_the_shipped_model_still_loads():
    assert MLPLatency.load().nets


# ---- datasets -----------------------------------------------------------------
def _dataset_doc(tmp_path) -> dict:
    trace = make([add(8), mm(4, 4, 4)])
    ds = Dataset(
        DatasetMeta(device="cpu", hardware="hand-cpu", usage_levels=(0.0, 0.5)),
        trace,
        np.array([0, 1, 1]),
        np.array([0.0, 0.0, 0.5]),
        np.array([1e-6, 2e-6, 4e-6]),
    )
    save_dataset(ds, tmp_path / "ds.json.gz")
    back = load_dataset(tmp_path / "ds.json.gz")
    assert back.op.tolist() == [0, 1, 1] and back.latency_s.tolist() == [1e-6, 2e-6, 4e-6]
    return json.loads(gzip.decompress((tmp_path / "ds.json.gz").read_bytes()))


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda d: d["measurements"]["latency_s"].__setitem__(1, math.nan), r"measurements.latency_s\[1\]: expected a finite number, got NaN"),
        (lambda d: d["measurements"]["latency_s"].__setitem__(1, 0), r"measurements.latency_s\[1\]: expected a number in \[1e-12, 1e\+06\], got 0"),
        (lambda d: d["measurements"]["usage"].__setitem__(2, math.nan), r"measurements.usage\[2\]: expected a finite number"),
        (lambda d: d["measurements"]["op"].__setitem__(0, 2**70), r"measurements.op\[0\]: expected an integer in \[0, 1\]"),
        (lambda d: d["measurements"]["op"].__setitem__(0, 0.0), r"measurements.op\[0\]: expected an integer, got 0.0"),
        (lambda d: d["measurements"].update(op=[0]), r"measurements: op, usage and latency_s must have equal lengths"),
        (lambda d: d["measurements"].update(usage="x"), r"measurements.usage: expected a list, got \"x\""),
        (lambda d: d.update(measurements=None), r"measurements: expected an object, got null"),
        (lambda d: d["meta"].update(threads="1"), r"meta.threads: expected an integer, got \"1\""),
        (lambda d: d["meta"].update(usage_levels=[2.0]), r"meta.usage_levels\[0\]: expected a number in \[0, 1\]"),
        (lambda d: d["meta"].update(colour="red"), r"meta.colour: unknown or malformed field"),
        (lambda d: d["meta"].pop("hardware"), r"meta.hardware: missing"),
        (lambda d: d.update(schema=None), r"schema: expected 'memplan.microbench/1', got null"),
    ],
)  # fmt: skip
def test_a_malformed_dataset_names_the_field(tmp_path, edit, message):
    doc = _dataset_doc(tmp_path)
    edit(doc)
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    with pytest.raises(LatencyError, match=message) as e:
        load_dataset(tmp_path / "bad.json")
    assert str(e.value).startswith(str(tmp_path / "bad.json")) and "\n" not in str(e.value)


@pytest.mark.parametrize("raw", [b"", b"\x1f\x8b not gzip", b"[" * 100_000, b"{"])
def test_an_unreadable_dataset_is_one_line(tmp_path, raw):
    (tmp_path / "ds.json").write_bytes(raw)
    with pytest.raises(LatencyError, match=r"ds.json: ") as e:
        load_dataset(tmp_path / "ds.json")
    assert "\n" not in str(e.value)

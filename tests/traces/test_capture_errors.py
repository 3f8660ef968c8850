"""Capture of a user's workload that goes wrong (NOTE [ Errors in the
workload ]), and measured capture on cpu: `--threads`, what the trace says it
was measured on, and `--latency measured` against another kind of profile
(NOTE [ Measured on ]). Tiny user modules are written to tmp_path and
imported from there, as `--model module:callable` does."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
from memplan.traces import io
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.errors import TraceError

from tests.fuzz.harness import assert_clean, assert_rejected, run_cli

USER_MODULE = """
import torch
from torch import nn
from memplan.traces.zoo import Workload


class ItemNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, x):
        if x.sum().item() > 0:  # line 13: needs real values
            return self.fc(x)
        return self.fc(-x)


def item(batch):
    return Workload(ItemNet(), (torch.randn(batch, 4),), (torch.randint(0, 2, (batch,)),),
                    nn.functional.cross_entropy)


def broken(batch):
    raise ValueError("my factory is broken")  # line 24


def no_params(batch):
    return Workload(nn.ReLU(), (torch.randn(batch, 4),), (torch.randn(batch, 4),),
                    nn.functional.mse_loss)


def not_a_workload(batch):
    return [batch]


def non_scalar_loss(batch):
    return Workload(nn.Linear(4, 2), (torch.randn(batch, 4),), (), lambda out: out)


def small(batch):
    return Workload(nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 2)),
                    (torch.randn(batch, 16),), (torch.randint(0, 2, (batch,)),),
                    nn.functional.cross_entropy)
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    name = f"memplan_user_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def _capture(module: str, fn: str, tmp_path, *extra: str):
    out = tmp_path / "t.json"
    argv = ["capture", "--model", f"{module}:{fn}", "--batch", "2", "--out", str(out), *extra]
    return run_cli(argv, 60.0), out


@pytest.mark.parametrize(
    ("fn", "device", "names"),
    [
        # .item() on meta: their line, the cause, and the hint to capture on cpu
        ("item", "meta", [":item': the training step failed (at ", ".py:13)",
                          "Tensor.item() cannot be called on meta tensors", "--device cpu"]),
        ("broken", "meta", [":broken': building the workload failed (at ", ".py:24)",
                            "ValueError: my factory is broken"]),
        ("no_params", "cpu", [":no_params': the model has no trainable parameters"]),
        ("not_a_workload", "meta", [":not_a_workload': returned list, expected a traces.zoo.Workload"]),
        ("non_scalar_loss", "meta", [":non_scalar_loss': the training step failed",
                                     "only for scalar outputs"]),
    ],
)  # fmt: skip
def test_errors_of_the_workload_are_one_line_naming_it(user_module, tmp_path, fn, device, names):
    o, out = _capture(user_module, fn, tmp_path, "--device", device)
    assert_rejected(o, *names)
    assert not out.exists()
    if device == "meta" and fn != "item":
        assert "--device cpu" not in o.stderr  # the hint only where meta is the cause


def test_a_callable_that_is_not_a_factory(tmp_path):
    o, out = _capture("os", "getcwd", tmp_path)
    assert_rejected(o, "workload 'os:getcwd': building the workload failed", "TypeError")
    assert not out.exists()


def test_the_meta_failure_captures_on_cpu(user_module, tmp_path):
    o, out = _capture(user_module, "item", tmp_path, "--device", "cpu")
    assert_clean(o)
    assert o.code == 0 and out.exists(), o.describe()


def test_the_api_raises_trace_error_naming_the_callable(user_module):
    mod = __import__(user_module)
    with pytest.raises(TraceError, match=rf"workload {user_module}:broken: building"):
        capture(mod.broken, 2, CaptureOptions(device="meta"))


def test_a_bug_of_the_recorder_keeps_its_traceback(user_module, monkeypatch):
    """An error raised in the recorder's own bookkeeping is ours: not turned
    into a one-line error about the workload."""
    from memplan.traces import recorder

    monkeypatch.setattr(recorder, "RNG_OPS", None)  # `name in RNG_OPS` fails in the recorder
    mod = __import__(user_module)
    with pytest.raises(TypeError, match="not iterable"):
        capture(mod.small, 2, CaptureOptions(device="meta"))


def test_measured_capture_records_where_and_refuses_a_gpu_profile(user_module, tmp_path):
    o, out = _capture(user_module, "small", tmp_path, "--device", "cpu", "--measure",
                      "--threads", "1")  # fmt: skip
    assert_clean(o)
    assert o.code == 0, o.describe()
    # a busy machine may add the warning line; nothing else goes to stderr
    assert all(line.startswith("warning: other processes kept") for line in
               o.stderr.splitlines() if line.strip()), o.stderr  # fmt: skip
    meta = json.loads(out.read_text())["meta"]
    assert meta["device"] == "cpu"
    measured = meta["extra"]["measured_on"]
    assert measured["device"] == "cpu" and measured["threads"] == 1
    assert "1 thread(s)" in measured["description"]
    assert isinstance(measured["other_busy_cores"], float)
    assert all(op.duration_us is not None and op.duration_us > 0 for op in io.load(out).ops)

    sim = ["simulate", str(out), "--latency", "measured", "--iterations", "1"]
    o = run_cli([*sim, "--gpu", "rtx-a6000"], 30.0)
    assert_rejected(o, "--latency measured", "measured on cpu", "rtx-a6000 is a GPU profile",
                    "--allow-foreign-measurements")  # fmt: skip
    o = run_cli([*sim, "--gpu", "rtx-a6000", "--allow-foreign-measurements"], 30.0)
    assert o.code == 0, o.describe()
    o = run_cli([*sim, "--gpu", "cpu-local"], 30.0)
    assert o.code == 0, o.describe()
    o = run_cli(["plan", str(out), "--gpu", "a100-pcie-40gb", "--latency", "measured",
                 "--planner", "vdnn"], 30.0)  # fmt: skip
    assert_rejected(o, "measured on cpu")

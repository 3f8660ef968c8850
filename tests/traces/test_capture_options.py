"""Capture's options of issue 18 (item 4): optimizers by name with their
keywords, foreach/fused, amp and accumulation checked in one line each; the
trace's new meta fields in files old and new; the CLI; recurrent layers."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import json

import pytest
import torch
from memplan.traces import io
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.errors import TraceError
from memplan.traces.model import Amp, BufferKind, Phase
from memplan.traces.optim import parse_kwargs
from memplan.traces.target import Target, TargetDevice
from memplan.traces.zoo import ZOO, LSTMClassifier, Workload
from torch import nn

from tests.fuzz.harness import assert_clean, assert_rejected, run_cli

A100 = Target("a100-sxm-80gb", TargetDevice.CUDA, (8, 0))

MLP_PARAMS = 401_920 + 131_328 + 2_570  # by hand: see tests/traces/test_capture_train.py


# ---- the command line's keywords ----------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("lr=1e-3,weight_decay=0.01", {"lr": 1e-3, "weight_decay": 0.01}),
        ("betas=(0.9,0.99),amsgrad=true,foreach=False", {"betas": (0.9, 0.99), "amsgrad": True,
                                                        "foreach": False}),
        ("momentum=0", {"momentum": 0}),
        (" nesterov = TRUE , dampening=0.5 ", {"nesterov": True, "dampening": 0.5}),
        ("etas=[0.5, 1.2],x=none,y=abc,z=()", {"etas": (0.5, 1.2), "x": None, "y": "abc", "z": ()}),
        ("betas=(0.9,)", {"betas": (0.9,)}),
        ("lr=-2", {"lr": -2}),
    ],
)  # fmt: skip
def test_keywords_are_read_as_numbers_bools_and_tuples(text, expected):
    got = parse_kwargs(text)
    assert got == expected
    assert [type(v) for v in got.values()] == [type(v) for v in expected.values()]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("lr", "'lr' is not name=value"),
        ("=1", "'=1' is not name=value"),
        ("1x=2", "'1x=2' is not name=value"),
        ("lr=1,lr=2", "'lr' is given twice"),
        ("betas=(0.9,0.99", "unbalanced brackets"),
        ("betas=0.9)", "unbalanced ')'"),
        ("lr=" + "9" * 40, "more than 30 digits"),
    ],
)
def test_malformed_keywords_are_one_line(text, message):
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_kwargs(text)


# ---- the options ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("options", "names"),
    [
        ({"optimizer": "nope"}, ["optimizer='nope' is not a torch.optim optimizer", "adamw",
                                 "rmsprop", "adagrad"]),
        ({"optimizer": 3}, ["optimizer=3 must be the name"]),
        ({"optimizer": "LBFGS"}, ["cannot be captured", "closure"]),
        ({"optimizer": "sparseadam"}, ["cannot be captured", "sparse"]),
        ({"optimizer_kwargs": {"momentum": 0.9}}, ["adam has no keyword 'momentum'",
                                                   "lr, betas, eps"]),
        ({"optimizer_kwargs": {"lr": -1}}, ["adam(lr=-1, foreach=False)",
                                            "Invalid learning rate: -1"]),
        ({"optimizer_kwargs": {"lr": float("nan")}}, ["lr=nan is not a finite number"]),
        ({"optimizer_kwargs": {"betas": (0.9, [1])}}, ["betas=[1] is not a number"]),
        ({"optimizer_kwargs": {"foreach": "yes"}}, ["adam: foreach='yes' must be bool | None"]),
        ({"optimizer_kwargs": {"amsgrad": 1}}, ["amsgrad=1 must be bool"]),
        ({"optimizer_kwargs": {"betas": (0.9,)}}, ["betas=(0.9,) must be tuple[float | Tensor"]),
        ({"optimizer_kwargs": [("lr", 1.0)]}, ["must be a mapping"]),
        ({"optimizer_kwargs": {"fused": True}}, ["fused kernel runs on cpu and cuda, not on meta",
                                                 "--target", "--device cpu"]),
        ({"device": "cpu", "optimizer_kwargs": {"fused": True, "foreach": True}},
         ["cannot be `True` together"]),
        ({"device": "cpu", "optimizer": "sgd", "optimizer_kwargs": {"nesterov": True,
                                                                     "momentum": 0}},
         ["Nesterov momentum requires a momentum"]),
        ({"amp": "fp8"}, ["amp='fp8' must be one of none, bf16, fp16"]),
        ({"amp": "bf16"}, ["torch.autocast does not exist on the meta device", "--device cpu"]),
        ({"accumulate": 0}, ["accumulate=0 must be an integer in [1, 1024]"]),
        ({"accumulate": 1025}, ["accumulate=1025"]),
        ({"accumulate": True}, ["accumulate=True"]),
        ({"accumulate": 2.0}, ["accumulate=2.0"]),
        ({"lr": float("inf")}, ["lr=inf must be a finite number"]),
        ({"target": A100, "optimizer": "sgd", "optimizer_kwargs": {"fused": True}},
         ["optimizer sgd with fused=True on meta", "no meta kernel for aten._fused_sgd_"]),
        ({"target": A100, "optimizer": "adagrad", "optimizer_kwargs": {"fused": True}},
         ["no meta kernel for aten._fused_adagrad_"]),
    ],
)  # fmt: skip
def test_bad_options_are_one_line_trace_errors(options, names):
    with pytest.raises(TraceError) as e:
        CaptureOptions(**options)
    message = str(e.value)
    assert "\n" not in message
    for name in names:
        assert name in message, message


def test_optimizer_names_and_defaults():
    opts = CaptureOptions(device="cpu", optimizer="RMSprop", optimizer_kwargs={"alpha": 0.9})
    assert opts.optimizer_name == "rmsprop"
    assert dict(opts.resolved_kwargs) == {"lr": 1e-3, "foreach": False, "alpha": 0.9}
    assert dict(opts.optimizer_kwargs) == {"alpha": 0.9}
    assert CaptureOptions(optimizer="sgd").resolved_kwargs["momentum"] == 0.9
    fused = CaptureOptions(device="cpu", optimizer="adam", optimizer_kwargs={"fused": True})
    assert "foreach" not in fused.resolved_kwargs  # fused is not combined with foreach
    assert CaptureOptions(amp="bf16", device="cpu").amp is Amp.BF16
    assert hash(CaptureOptions()) == hash(CaptureOptions())  # still usable as a key
    assert CaptureOptions(optimizer_kwargs={"lr": 0.5}).resolved_kwargs["lr"] == 0.5
    # replace() derives the keywords again from what was given
    sgd = CaptureOptions(optimizer="sgd", lr=0.1)
    adam = dataclasses.replace(sgd, optimizer="adam", lr=0.2)
    assert dict(adam.resolved_kwargs) == {"lr": 0.2, "foreach": False}


def test_foreach_on_meta_and_fused_on_cpu_record_multi_tensor_updates():
    """foreach: Adam's moments and update as `_foreach_*` ops over all six
    tensors of mlp, no per-parameter addcdiv_; fused (cpu): one `_fused_adam_`.
    Optimizer state is the same 2 x 4 bytes per parameter either way."""
    foreach = capture(ZOO["mlp"], 2, CaptureOptions(optimizer_kwargs={"foreach": True}))
    steps = [op.target for op in foreach.ops if op.phase is Phase.OPTIMIZER]
    assert steps and all(t.startswith("aten._foreach_") for t in steps), steps
    assert foreach.meta.optimizer_kwargs == {"lr": 1e-3, "foreach": True}
    fused = capture(ZOO["mlp"], 2, CaptureOptions("cpu", optimizer_kwargs={"fused": True}))
    steps = [op.target for op in fused.ops if op.phase is Phase.OPTIMIZER]
    assert steps == ["aten._fused_adam_.default"]
    for trace in (foreach, fused):
        assert trace.bytes_by_kind()[BufferKind.OPTIMIZER_STATE] == 8 * MLP_PARAMS


def test_what_an_optimizer_refuses_at_capture_is_one_line():
    # Muon takes 2-D parameters only; mlp has biases
    with pytest.raises(TraceError, match=r"workload 'mlp': optimizer muon\(.*refuses its param"):
        capture(ZOO["mlp"], 2, CaptureOptions(optimizer="muon"), model_name="mlp")
    # ASGD reads a tensor's value in step(): on meta, the hint names cpu
    with pytest.raises(TraceError, match="cannot be called on meta tensors.*--device cpu"):
        capture(ZOO["mlp"], 2, CaptureOptions(optimizer="asgd"), model_name="mlp")


# ---- the trace's meta fields ------------------------------------------------------------
def test_new_meta_fields_round_trip_and_enter_the_fingerprint(tmp_path):
    opts = CaptureOptions(
        "cpu", optimizer="adamw", optimizer_kwargs={"betas": (0.8, 0.9)}, amp="bf16", accumulate=2
    )
    trace = capture(ZOO["mlp"], 2, opts, model_name="mlp")
    io.save(trace, tmp_path / "t.json.gz")
    loaded = io.load(tmp_path / "t.json.gz")
    assert loaded.meta == trace.meta
    assert loaded.meta.optimizer_kwargs == {"lr": 1e-3, "foreach": False, "betas": [0.8, 0.9]}
    assert (loaded.meta.amp, loaded.meta.accumulate) == (Amp.BF16, 2)
    doc = io.to_dict(trace)
    for key, value in (("amp", "none"), ("accumulate", 1), ("optimizer_kwargs", {})):
        other = json.loads(json.dumps(doc))
        other["meta"][key] = value
        assert io.fingerprint(io.from_dict(other)) != io.fingerprint(trace), key


def test_a_file_without_the_new_fields_loads_with_defaults_and_keeps_its_fingerprint(tmp_path):
    """NOTE [ Meta fields added later ]: the fingerprint of an older file is
    the sha256 of its canonical JSON as it always was."""
    doc = io.to_dict(capture(ZOO["mlp"], 2, model_name="mlp"))
    for key in ("optimizer_kwargs", "amp", "accumulate", "target"):
        del doc["meta"][key]
    (tmp_path / "old.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))
    old = io.load(tmp_path / "old.json.gz")
    assert (old.meta.optimizer_kwargs, old.meta.amp, old.meta.accumulate) == ({}, Amp.NONE, 1)
    assert old.meta.target is None
    canonical = json.loads(json.dumps(doc))
    for op in canonical["ops"]:
        del op["duration_us"]
    del canonical["meta"]["torch_version"]
    blob = json.dumps(canonical, sort_keys=True, separators=(",", ":")).encode()
    assert io.fingerprint(old) == hashlib.sha256(blob).hexdigest()


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("amp", "fp8", 'meta.amp: unknown Amp "fp8" (one of none, bf16, fp16)'),
        ("amp", 16, "meta.amp: expected a string (one of none, bf16, fp16), got 16"),
        ("accumulate", 0, "meta.accumulate: expected an integer in [1, 1024], got 0"),
        ("accumulate", 2.5, "meta.accumulate: expected an integer, got 2.5"),
        ("optimizer_kwargs", [], "meta.optimizer_kwargs: expected an object, got []"),
    ],
)
def test_bad_meta_fields_name_the_field(key, value, message):
    doc = io.to_dict(capture(ZOO["mlp"], 2, model_name="mlp"))
    doc["meta"][key] = value
    with pytest.raises(TraceError) as e:
        io.from_dict(doc)
    assert str(e.value) == message


# ---- the CLI ----------------------------------------------------------------------------
def test_capture_and_inspect_on_the_command_line(tmp_path):
    out = str(tmp_path / "t.json")
    argv = ["capture", "--model", "mlp", "--batch", "2", "--device", "cpu", "--out", out,
            "--optimizer", "AdamW", "--opt", "weight_decay=0.01", "--opt", "betas=(0.8,0.9)",
            "--amp", "fp16", "--accumulate", "2"]  # fmt: skip
    o = run_cli(argv, 60.0)
    assert_clean(o)
    shown = "adamw(lr=0.001, foreach=False, weight_decay=0.01, betas=(0.8,0.9))"
    assert o.code == 0 and f"({shown}, amp fp16, 2 passes accumulated)" in o.stdout, o.describe()
    o = run_cli(["inspect", out], 30.0)
    assert o.code == 0 and f"optimizer {shown}  amp fp16  accumulate 2  captured on cpu" in o.stdout
    o = run_cli(["inspect", out, "--json"], 30.0)
    s = json.loads(o.stdout)
    assert (s["optimizer"], s["amp"], s["accumulate"]) == ("adamw", "fp16", 2)
    assert s["optimizer_kwargs"]["betas"] == [0.8, 0.9]


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        (["--optimizer", "nope"], ["optimizer='nope'", "adamw"]),
        (["--opt", "lr"], ["argument --opt", "'lr' is not name=value"]),
        (["--opt", "lr=1", "--opt", "lr=2"], ["--opt", "'lr' is given twice"]),
        (["--opt", "momentum=0.9"], ["adam has no keyword 'momentum'"]),
        (["--opt", "lr=nan"], ["lr=nan is not a finite number"]),
        (["--opt", "fused=true"], ["fused", "--device cpu"]),
        (["--amp", "bf16"], ["autocast", "--device cpu"]),
        (["--amp", "fp8"], ["argument --amp"]),
        (["--accumulate", "0"], ["argument --accumulate"]),
        (["--accumulate", "99999"], ["argument --accumulate", "1024"]),
        (["--optimizer", "lbfgs"], ["lbfgs", "closure"]),
    ],
)
def test_bad_capture_arguments_exit_2_in_one_line(tmp_path, extra, names):
    out = tmp_path / "t.json"
    o = run_cli(["capture", "--model", "mlp", "--batch", "2", "--out", str(out), *extra], 30.0)
    assert_rejected(o, *names)
    assert not out.exists()


# ---- recurrent layers ---------------------------------------------------------------------
def test_recurrent_layers_are_refused_on_meta_naming_cpu():
    """NOTE [ Recurrent layers on meta ]."""
    with pytest.raises(TraceError) as e:
        capture(ZOO["lstm"], 4, model_name="lstm")
    assert str(e.value) == (
        "workload 'lstm': LSTM at 'lstm' runs per time step on meta, not as the fused kernel "
        "cpu and cuda run (NOTE [ Recurrent layers on meta ]): capture with --device cpu"
    )

    def gru(batch: int) -> Workload:
        model = nn.Sequential(nn.GRU(8, 8, batch_first=True))
        return Workload(model, (torch.randn(batch, 3, 8),), (), lambda out: out[0].sum())

    with pytest.raises(TraceError, match="GRU at '0' runs per time step on meta"):
        capture(gru, 2)


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN in this torch")
def test_an_lstm_captured_on_cpu_is_one_fused_op_per_layer():
    """2 layers: two `mkldnn_rnn_layer` forward, two backward, 89 ops in all at
    batch 8 (meta would give 923); parameters 4 gates x 64 x (in + 64) + 512
    per layer, and the head 64 x 10 + 10."""
    trace = capture(ZOO["lstm"], 8, CaptureOptions(device="cpu"), model_name="lstm")
    targets = [op.target for op in trace.ops]
    assert targets.count("aten.mkldnn_rnn_layer.default") == 2
    assert targets.count("aten.mkldnn_rnn_layer_backward.default") == 2
    assert trace.n_ops == 89
    n = (4 * 64 * (32 + 64) + 512) + (4 * 64 * (64 + 64) + 512) + 650
    assert sum(p.numel() for p in LSTMClassifier().parameters()) == n
    assert trace.bytes_by_kind()[BufferKind.PARAM] == 4 * n

"""`memplan capture` and `memplan capacity` with the options that say how
--model is built (--dtype, --config, --seq, --image, --freeze, --lora,
--gradient-checkpointing): what they record, and bad input refused in one
line with exit code 2."""

from __future__ import annotations

import json

import pytest
from memplan.traces import io
from memplan.traces.model import BufferKind

from tests.extras import needs_transformers
from tests.fuzz.harness import assert_clean, assert_rejected, run_cli

TINY = (
    "hidden_size=64,intermediate_size=128,num_hidden_layers=2,num_attention_heads=4,vocab_size=128"
)
LLAMA = ["--model", "hf:llama", "--config", TINY, "--seq", "16"]
# tests/traces/test_models.py counts the tiny llama's 98,624 parameters by hand
TINY_PARAMS = 98_624


@needs_transformers
def test_capture_records_how_the_model_was_built(tmp_path):
    out = tmp_path / "llama.json.gz"
    argv = ["capture", *LLAMA, "--batch", "2", "--dtype", "bf16", "--freeze",
            "model.embed_tokens.*", "--gradient-checkpointing", "--out", str(out)]  # fmt: skip
    o = run_cli(argv, 120)
    assert_clean(o)
    assert o.code == 0, o.describe()
    assert "captured hf:llama batch 2 on meta" in o.stdout
    assert "bf16, frozen model.embed_tokens.*, gradient checkpointing" in o.stdout
    trace = io.load(out)
    assert trace.meta.dtype == "bfloat16"
    assert trace.meta.extra["model_options"] == {
        "dtype": "bf16",
        "config": {k: v for k, v in (kv.split("=") for kv in TINY.split(","))},
        "seq": 16,
        "freeze": ["model.embed_tokens.*"],
        "gradient_checkpointing": True,
    }
    params = sum(b.nbytes for b in trace.buffers if b.kind is BufferKind.PARAM)
    grads = sum(b.nbytes for b in trace.buffers if b.kind is BufferKind.GRAD)
    assert (params, grads) == (2 * TINY_PARAMS, 2 * (TINY_PARAMS - 128 * 64))


def test_capture_of_a_zoo_model_in_bf16(tmp_path):
    out = tmp_path / "mlp.json"
    o = run_cli(["capture", "--model", "mlp", "--batch", "4", "--dtype", "bf16",
                 "--out", str(out)], 60)  # fmt: skip
    assert o.code == 0, o.describe()
    trace = io.load(out)
    # 535,818 parameters in 2 bytes each (tests/traces/test_zoo.py counts them)
    assert sum(b.nbytes for b in trace.buffers if b.kind is BufferKind.PARAM) == 2 * 535_818
    assert trace.meta.extra["model_options"] == {"dtype": "bf16"}


BAD_CAPTURE = [
    (["--model", "mlp", "--seq", "8"], ["--seq", "hf:", "mlp"]),
    (["--model", "mlp", "--gradient-checkpointing"], ["--gradient-checkpointing", "hf:"]),
    (["--model", "tv:resnet50", "--config", "a=1"], ["--config", "tv:resnet50"]),
    (["--model", "hf:llama", "--image", "64"], ["--image", "tv:"]),
    (["--model", "mlp", "--dtype", "fp8"], ["--dtype", "fp8"]),
    (["--model", "mlp", "--image", "8"], ["--image"]),
    (["--model", "mlp", "--lora", "rank=4"], ["--lora", "rank"]),
    (["--model", "mlp", "--lora", "q_proj"], ["--lora", "q_proj"]),
    (["--model", "mlp", "--freeze", "decoder.*"], ["--freeze", "decoder.*", "fc1.weight"]),
    (["--model", "mlp", "--amp", "bf16", "--dtype", "bf16"], ["--amp", "--dtype"]),
    (["--model", "hf:llama", "--config", "a.json", "--config", "b.json"], ["--config", "one"]),
    (["--model", "hf:llama", "--config", "x=1", "--config", "x=2"], ["--config", "twice"]),
]
BAD_HF = [  # the config file is read once transformers has the config class
    (["--model", "hf:llama", "--config", "DIR/missing.json"], ["--config", "cannot read"]),
    (["--model", "hf:lama"], ["hf:lama", "hf:llama"]),
    (["--model", "hf:llama", "--config", "num_hidden_layers=two"], ["num_hidden_layers", "whole"]),
    (["--model", "hf:llama", "--config", "hidden_sise=64"], ["hidden_sise", "hidden_size"]),
    (["--model", "hf:llama", "--seq", "4096"], ["--seq", "max_position_embeddings=2048"]),
]


@pytest.mark.parametrize(
    ("argv", "names"),
    [*BAD_CAPTURE, *(pytest.param(*c, marks=needs_transformers) for c in BAD_HF)],
    ids=lambda x: " ".join(x)[:60],
)
def test_bad_capture_options_are_one_line(tmp_path, argv, names):
    argv = [a.replace("DIR", str(tmp_path)) for a in argv]
    o = run_cli(["capture", *argv, "--batch", "2", "--out", str(tmp_path / "x.json")], 60)
    assert_rejected(o, *names)
    assert not (tmp_path / "x.json").exists()


@pytest.mark.parametrize(
    ("argv", "names"),
    [
        (["--trace", "T", "--dtype", "bf16"], ["--dtype", "--trace"]),
        (["--trace", "T", "--gradient-checkpointing"], ["--gradient-checkpointing", "--trace"]),
        (["--model", "mlp", "--seq", "8"], ["--seq", "hf:"]),
        (["--jobs", "mlp:1,small_cnn:1", "--image", "64"], ["--jobs", "--image", "tv:"]),
    ],
)
def test_bad_capacity_options_are_one_line(tmp_path, argv, names):
    from memplan.traces import synthetic

    io.save(synthetic.chain(3), tmp_path / "chain.json")
    argv = [str(tmp_path / "chain.json") if a == "T" else a for a in argv]
    o = run_cli(["capacity", *argv, "--gpu", "p100-pcie-16gb", "--no-progress"], 60)
    assert_rejected(o, *names)


@needs_transformers
def test_capacity_captures_the_model_as_built():
    # one batch, vanilla only: the answer's peak is the captured trace's, in bf16
    argv = ["capacity", *LLAMA, "--dtype", "bf16", "--batch", "2", "--planners", "vanilla",
            "--gpu", "p100-pcie-16gb", "--no-progress", "--json"]  # fmt: skip
    o = run_cli(argv, 120)
    assert_clean(o)
    assert o.code == 0, o.describe()
    doc = json.loads(o.stdout)
    assert [a["planner"] for a in doc["answers"]] == ["vanilla"]
    options = doc["provenance"]["options"]
    assert (options["dtype"], options["seq"], options["config"]) == ("bf16", 16, [TINY])


def test_a_trace_captured_for_a_gpu_is_not_replayed_on_cpu(tmp_path):
    """Its kernels (flash attention, cuDNN's RNN) do not run on cpu: validate
    refuses it in one line naming the target, before any replay."""
    trace = tmp_path / "mlp.json"
    o = run_cli(["capture", "--model", "mlp", "--batch", "2", "--target", "a100-sxm-80gb",
                 "--out", str(trace)], 60)  # fmt: skip
    assert o.code == 0, o.describe()
    o = run_cli(["validate", str(trace), "--planner", "tensile"], 60)
    assert_rejected(o, "a100-sxm-80gb", "--device cpu")

"""Workloads built by name (``tv:``, ``hf:``) and `ModelOptions`: names and
options resolve or fail in one line, config values are typed by the config's
defaults, and what the options change in a captured step -- grads and
optimizer state of frozen parameters, bytes in bf16, the recompute of
gradient checkpointing, LoRA's few trainable parameters -- is the count
worked out by hand."""

from __future__ import annotations

import json

import pytest
import torch
from memplan.traces import io
from memplan.traces.builders import (
    Dtype,
    Head,
    Lora,
    ModelOptions,
    parse_assignments,
    parse_freeze,
    parse_lora,
    recorded,
    transformers_model,
)
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.errors import TraceError
from memplan.traces.model import BufferKind, Phase, Trace
from memplan.traces.zoo import ZOO, build, resolve

from tests.extras import has, needs_torchvision, needs_transformers

needs_peft = pytest.mark.skipif(not has("peft"), reason="needs peft")

# A llama of 2 layers, 4 heads, hidden 64, MLP 128, vocabulary 128, on 16 tokens.
TINY = {
    "hidden_size": "64",
    "intermediate_size": "128",
    "num_hidden_layers": "2",
    "num_attention_heads": "4",
    "vocab_size": "128",
}
# Its parameters by hand: embed_tokens 128*64 = 8192; per layer q, k, v, o
# 4*64*64 = 16384, gate, up, down 3*64*128 = 24576 and two RMSNorms 2*64;
# the final norm 64; lm_head (not tied in LlamaConfig) 64*128 = 8192.
# 21 tensors: embed_tokens, 9 per layer, norm, lm_head.
EMBED = 128 * 64
LAYER = 4 * 64 * 64 + 3 * 64 * 128 + 2 * 64
TINY_PARAMS = EMBED + 2 * LAYER + 64 + 64 * 128
TINY_TENSORS = 1 + 2 * 9 + 1 + 1


def _llama(batch: int = 2, device: str = "meta", **options) -> Trace:
    built = ModelOptions(config=TINY, seq=16, **options)
    trace = capture(resolve("hf:llama", built), batch, CaptureOptions(device=device),
                    model_name="hf:llama")  # fmt: skip
    return recorded(trace, built)


def _of_kind(trace: Trace, kind: BufferKind) -> list:
    return [b for b in trace.buffers if b.kind is kind]


# ---- parsing the command line's text ----------------------------------------------------
def test_assignments_continue_a_value_as_a_list_and_keep_brackets_whole():
    got = parse_assignments('r=8,target_modules=q_proj,v_proj,x={"a":1,"b":2},y=(1,2)', "t")
    assert got == {"r": "8", "target_modules": ("q_proj", "v_proj"),
                   "x": '{"a":1,"b":2}', "y": "(1,2)"}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("q_proj,r=8", "--lora 'q_proj,r=8': 'q_proj' is not name=value"),
        ("r=8,r=4", "--lora 'r=8,r=4': 'r' is given twice"),
        ("2r=8", "--lora '2r=8': '2r' is not a name"),
        ("r=(8", "--lora 'r=(8': unbalanced brackets"),
        ("r=8)", "--lora 'r=8)': unbalanced ')'"),
        (",", "--lora ',': expected name=value[,name=value...]"),
    ],
)
def test_bad_assignments_are_one_line(text, message):
    with pytest.raises(TraceError) as e:
        parse_assignments(text, "--lora")
    assert str(e.value) == message


def test_lora_and_freeze_parse():
    assert parse_lora("r=8,alpha=16,dropout=0.05,target_modules=q_proj,v_proj") == Lora(
        8, 16, 0.05, ("q_proj", "v_proj")
    )
    assert parse_lora("lora_alpha=32,target_modules=[fc1,fc2]") == Lora(8, 32, 0.0, ("fc1", "fc2"))
    assert parse_freeze(" model.embed_tokens.*, lm_head.weight ,") == (
        "model.embed_tokens.*",
        "lm_head.weight",
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rank=8", "--lora rank: unknown; known are r, alpha, dropout, target_modules"),
        ("r=2.5", "--lora r=2.5: expected a whole number"),
        ("r=0", "lora r=0 must be an integer >= 1"),
        ("alpha=big", "--lora alpha=big: expected a number"),
        ("dropout=1", "lora dropout=1 must be a number in [0, 1)"),
    ],
)
def test_bad_lora_is_one_line(text, message):
    with pytest.raises(TraceError) as e:
        parse_lora(text)
    assert str(e.value) == message


def test_options_check_their_values():
    assert ModelOptions(dtype="bf16").dtype is Dtype.BF16
    assert ModelOptions().given() == ()
    assert ModelOptions(seq=8, freeze=("a",)).given() == ("seq", "freeze")
    for kwargs, message in [
        ({"dtype": "fp8"}, "dtype='fp8' must be one of fp32, bf16, fp16"),
        ({"seq": 0}, "seq=0 must be an integer >= 1"),
        ({"image": 16}, "image=16 must be an integer >= 32"),
        ({"freeze": "a"}, "freeze='a' must be a tuple of parameter-name patterns"),
        ({"config": {"2x": 1}}, "config={'2x': 1} must map field names to values"),
    ]:
        with pytest.raises(TraceError) as e:
            ModelOptions(**kwargs)
        assert str(e.value) == message


# ---- resolving names -------------------------------------------------------------------
def test_default_options_keep_the_zoo_factories():
    for name, factory in ZOO.items():
        assert resolve(name, ModelOptions()) is factory


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("mlp", {"seq": 8}, "--seq applies to hf: models (transformers), not to 'mlp'"),
        ("mlp", {"gradient_checkpointing": True}, "--gradient-checkpointing applies to hf:"),
        ("os:getcwd", {"config": {"a": 1}}, "--config applies to hf: models (transformers), "
         "not to 'os:getcwd'"),
        ("tv:resnet50", {"config_file": "c.json"}, "--config applies to hf: models"),
        ("hf:llama", {"image": 64}, "--image applies to tv: models (torchvision), not to "
         "'hf:llama'"),
        ("tv:", {}, "workload 'tv:': expected tv:NAME"),
        ("resnet152", {}, "or tv:NAME for a torchvision model, hf:ARCH for a transformers one"),
    ],
)  # fmt: skip
def test_options_a_kind_does_not_take_fail_before_anything_is_built(name, options, message):
    with pytest.raises(TraceError) as e:
        resolve(name, ModelOptions(**options))
    assert message in str(e.value) and "\n" not in str(e.value)


# ---- hf: -----------------------------------------------------------------------------
@needs_transformers
@pytest.mark.parametrize(
    ("name", "model_class", "head"),
    [
        ("llama", "LlamaForCausalLM", Head.CAUSAL_LM),  # a decoder
        ("LLaMA", "LlamaForCausalLM", Head.CAUSAL_LM),  # any case
        ("gpt2", "GPT2LMHeadModel", Head.CAUSAL_LM),
        ("bert", "BertForMaskedLM", Head.MASKED_LM),  # not BertLMHeadModel, its decoder variant
        ("t5", "T5ForConditionalGeneration", Head.SEQ2SEQ_LM),
        ("LlamaForSequenceClassification", "LlamaForSequenceClassification",
         Head.SEQUENCE_CLASSIFICATION),
        ("BertForTokenClassification", "BertForTokenClassification", Head.TOKEN_CLASSIFICATION),
    ],
)  # fmt: skip
def test_the_head_rule(name, model_class, head):
    spec = transformers_model(name, ModelOptions())
    assert (spec.model_class, spec.head) == (model_class, head)


@needs_transformers
def test_config_values_are_typed_by_the_defaults():
    config = {
        **TINY,
        "rms_norm_eps": "1e-5",  # float
        "tie_word_embeddings": "TRUE",  # bool
        "hidden_act": "gelu",  # str
        "pad_token_id": "0",  # default None: read as a literal
        "attn_implementation": "eager",  # not a field: the constructor's
    }
    spec = transformers_model("llama", ModelOptions(config=config, seq=16))
    c = spec.config
    assert (c.hidden_size, c.num_hidden_layers, c.vocab_size) == (64, 2, 128)
    assert c.rms_norm_eps == 1e-5 and c.tie_word_embeddings is True
    assert c.hidden_act == "gelu" and c.pad_token_id == 0
    assert spec.attn_implementation == "eager" and spec.seq == 16
    assert type(c.num_attention_heads) is int and type(c.rms_norm_eps) is float


@needs_transformers
@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"num_hidden_layers": "two"}, "hf:llama --config num_hidden_layers='two': expected a "
         "whole number"),
        ({"tie_word_embeddings": "yes"}, "hf:llama --config tie_word_embeddings='yes': expected "
         "true or false"),
        ({"rms_norm_eps": "small"}, "hf:llama --config rms_norm_eps='small': expected a number"),
        ({"hidden_sise": "64"}, "hf:llama --config hidden_sise: LlamaConfig has no such field "
         "(did you mean hidden_size"),
        ({"rope_parameters": "[1]"}, "rope_parameters='[1]': expected a JSON object {...}"),
        ({"hidden_size": ("1", "2")}, "hf:llama --config hidden_size=1,2: one value expected"),
    ],
)  # fmt: skip
def test_bad_config_values_are_one_line(config, message):
    with pytest.raises(TraceError) as e:
        transformers_model("llama", ModelOptions(config=config))
    assert message in str(e.value) and "\n" not in str(e.value)


@needs_transformers
def test_the_sequence_rule():
    # min(512, max_position_embeddings): llama's 2048 gives 512; gpt2's n_positions
    # is its max_position_embeddings (attribute_map), 128 here
    assert transformers_model("llama", ModelOptions()).seq == 512
    assert transformers_model("gpt2", ModelOptions(config={"n_positions": "128"})).seq == 128
    with pytest.raises(TraceError, match=r"hf:llama --seq 4096: more than its "
                       r"max_position_embeddings=2048 \(raise it"):  # fmt: skip
        transformers_model("llama", ModelOptions(seq=4096))


@needs_transformers
@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("lama", "hf:lama: not a transformers model_type nor a model class with a text head; "
         "did you mean hf:llama"),
        ("vit", "hf:vit: transformers lists no text head"),
        ("ViTForImageClassification", "hf:ViTForImageClassification: not a transformers "
         "model_type nor a model class with a text head"),
    ],
)  # fmt: skip
def test_unknown_architectures_are_one_line(name, message):
    with pytest.raises(TraceError) as e:
        transformers_model(name, ModelOptions())
    assert message in str(e.value) and "\n" not in str(e.value)


@needs_transformers
def test_a_config_file_then_fields_over_it(tmp_path):
    path = tmp_path / "config.json"
    fields = {**{k: int(v) for k, v in TINY.items()}, "num_hidden_layers": 3}
    path.write_text(json.dumps({"model_type": "llama", "torch_dtype": "bfloat16", **fields}))
    built = ModelOptions(config_file=str(path), config={"num_hidden_layers": "2"}, seq=16)
    torch.manual_seed(0)
    with torch.device("meta"):
        w = build("hf:llama", 2, built)
    # the file's dtype is dropped (fp32 by default), its layers overridden to 2
    params = list(w.model.parameters())
    assert {p.dtype for p in params} == {torch.float32}
    assert sum(p.numel() for p in params) == TINY_PARAMS
    assert w.inputs[0].shape == (2, 16) and w.inputs[1] is w.inputs[0]  # labels = ids
    path.write_text(json.dumps({"model_type": "gpt2"}))
    with pytest.raises(TraceError, match="model_type 'gpt2', but hf:llama is 'llama'"):
        transformers_model("llama", ModelOptions(config_file=str(path)))


@needs_transformers
def test_a_tiny_llama_captures_with_its_parameters_counted_by_hand():
    trace = _llama()
    params = _of_kind(trace, BufferKind.PARAM)
    assert len(params) == TINY_TENSORS and sum(b.nbytes for b in params) == 4 * TINY_PARAMS
    assert trace.meta.dtype == "float32" and "model_options" in trace.meta.extra


@needs_transformers
def test_a_frozen_embedding_has_no_grad_and_no_optimizer_state():
    trace = _llama(freeze=("model.embed_tokens.*",))
    params = _of_kind(trace, BufferKind.PARAM)
    grads = _of_kind(trace, BufferKind.GRAD)
    state = _of_kind(trace, BufferKind.OPTIMIZER_STATE)
    # still a parameter; 20 trainable tensors: a grad each, Adam's exp_avg and exp_avg_sq each
    assert sum(b.nbytes for b in params) == 4 * TINY_PARAMS
    assert len(grads) == TINY_TENSORS - 1
    assert sum(b.nbytes for b in grads) == 4 * (TINY_PARAMS - EMBED)
    assert len(state) == 2 * (TINY_TENSORS - 1)
    assert sum(b.nbytes for b in state) == 2 * 4 * (TINY_PARAMS - EMBED)
    assert not [b.name for b in state if b.name.startswith("model.embed_tokens.")]
    assert trace.meta.extra["model_options"]["freeze"] == ["model.embed_tokens.*"]


@needs_transformers
def test_bf16_builds_bf16_parameters_in_half_the_bytes():
    trace = _llama(dtype="bf16")
    params = _of_kind(trace, BufferKind.PARAM)
    assert trace.meta.dtype == "bfloat16"
    assert sum(b.nbytes for b in params) == 2 * TINY_PARAMS  # fp32: 4 * TINY_PARAMS
    assert sum(b.nbytes for b in _of_kind(trace, BufferKind.GRAD)) == 2 * TINY_PARAMS
    ids = {b.id for b in params}
    assert {v.dtype for v in trace.views if v.buffer in ids} == {"bfloat16"}


def test_bf16_converts_a_zoo_model_and_its_floating_inputs_and_targets():
    built = ModelOptions(dtype="bf16")
    with torch.device("meta"):
        mlp = build("mlp", 4, built)
        chain = build("linear_chain_2", 4, built)
    assert {p.dtype for p in mlp.model.parameters()} == {torch.bfloat16}
    assert mlp.inputs[0].dtype is torch.bfloat16
    assert mlp.targets[0].dtype is torch.int64  # class labels stay integers
    assert chain.targets[0].dtype is torch.bfloat16  # MSE's target is floating
    # 535,818 parameters (tests/traces/test_zoo.py) in 2 bytes each; a 4 x 784 input
    trace = capture(resolve("mlp", built), 4, CaptureOptions())
    assert sum(b.nbytes for b in _of_kind(trace, BufferKind.PARAM)) == 2 * 535_818
    assert [b.nbytes for b in trace.buffers if b.name == "input0"] == [4 * 784 * 2]


@needs_transformers
def test_gradient_checkpointing_recomputes_each_layer_in_backward(tmp_path):
    plain, checkpointed = _llama(), _llama(gradient_checkpointing=True)

    def silu(trace: Trace, phase: Phase) -> int:
        return sum(op.target == "aten.silu.default" and op.phase is phase for op in trace.ops)

    # one SiLU per layer's MLP in forward; with checkpointing each layer's
    # forward runs again in backward (silu's own backward is silu_backward)
    assert (silu(plain, Phase.FORWARD), silu(plain, Phase.BACKWARD)) == (2, 0)
    assert (silu(checkpointed, Phase.FORWARD), silu(checkpointed, Phase.BACKWARD)) == (2, 2)
    assert plain.ops_by_phase()[Phase.FORWARD] == checkpointed.ops_by_phase()[Phase.FORWARD]

    def forward_activations(trace: Trace) -> int:
        curve = trace.memory_curve(kind=BufferKind.ACTIVATION)
        return int(max(c for c, op in zip(curve, trace.ops, strict=True)
                       if op.phase is Phase.FORWARD))  # fmt: skip

    assert forward_activations(checkpointed) < forward_activations(plain) / 2
    io.save(checkpointed, tmp_path / "gc.json.gz")
    loaded = io.load(tmp_path / "gc.json.gz")
    assert loaded.n_ops == checkpointed.n_ops
    assert loaded.meta.extra["model_options"]["gradient_checkpointing"] is True


@needs_transformers
def test_gradient_checkpointing_captures_the_same_on_cpu_and_meta():
    # NOTE [ Checkpointed transformers on meta ]: a real run on cpu records the
    # op for op what meta does (eager attention: sdpa picks its kernel by device)
    def ops(device: str) -> tuple[list, tuple[int, int]]:
        built = ModelOptions(config={**TINY, "attn_implementation": "eager"}, seq=16,
                             gradient_checkpointing=True)  # fmt: skip
        trace = capture(resolve("hf:llama", built), 2, CaptureOptions(device=device))
        return [(op.target, op.phase) for op in trace.ops], trace.peak()

    assert ops("cpu") == ops("meta")


@needs_transformers
@pytest.mark.parametrize("amp", ["none", "bf16"])
def test_the_recompute_runs_the_targets_attention_kernel(amp):
    # NOTE [ Recompute under emulation ]: the recompute in backward takes the
    # kernel the forward took on the target (not meta's math attention),
    # under the emulated autocast too
    from memplan.hwmodels.profile import load_hardware
    from memplan.traces.target import AttentionBackend

    target = load_hardware("a100-sxm-80gb").target(AttentionBackend.AUTO)
    built = ModelOptions(config=TINY, seq=16, gradient_checkpointing=True)
    trace = capture(resolve("hf:llama", built), 2, CaptureOptions(target=target, amp=amp))
    kernels = {
        phase: [op.target for op in trace.ops if op.phase is phase and "dot_product" in op.target]
        for phase in (Phase.FORWARD, Phase.BACKWARD)
    }
    forward = kernels[Phase.FORWARD]
    assert len(forward) == 2 and len(set(forward)) == 1  # one fused kernel per layer
    assert "math" not in forward[0] and "_safe_softmax" not in {op.target for op in trace.ops}
    assert sorted(kernels[Phase.BACKWARD]) == sorted(
        [*forward, *(f.replace(".default", "_backward.default") for f in forward)]
    )


@needs_transformers
@needs_peft
def test_lora_trains_only_its_adapters():
    trace = _llama(lora=Lora(r=4))
    # peft's default modules for llama are q_proj and v_proj: per layer and
    # module A (4 x 64) and B (64 x 4) -> 2 layers * 2 modules * 512
    adapters = 2 * 2 * (4 * 64 + 64 * 4)
    assert sum(b.nbytes for b in _of_kind(trace, BufferKind.PARAM)) == 4 * (TINY_PARAMS + adapters)
    assert len(_of_kind(trace, BufferKind.GRAD)) == 2 * 2 * 2
    assert sum(b.nbytes for b in _of_kind(trace, BufferKind.GRAD)) == 4 * adapters
    assert sum(b.nbytes for b in _of_kind(trace, BufferKind.OPTIMIZER_STATE)) == 2 * 4 * adapters


@needs_peft
def test_lora_on_a_zoo_model_names_its_modules():
    with (
        pytest.raises(TraceError, match=r"mlp --lora: give target_modules=NAME"),
        torch.device("meta"),
    ):
        build("mlp", 2, ModelOptions(lora=Lora(r=2)))
    with torch.device("meta"):
        w = build("mlp", 2, ModelOptions(lora=Lora(r=2, target_modules=("fc1",))))
    trainable = sum(p.numel() for p in w.model.parameters() if p.requires_grad)
    assert trainable == 2 * 784 + 512 * 2  # fc1's A (2 x 784) and B (512 x 2)


def test_freeze_patterns_must_match():
    with pytest.raises(TraceError) as e, torch.device("meta"):
        build("mlp", 2, ModelOptions(freeze=("fc1.*", "encoder.*")))
    assert str(e.value) == (
        "mlp --freeze 'encoder.*': matches no parameter (names are like fc1.weight, fc1.bias, "
        "fc2.weight, fc2.bias, ...)"
    )
    with torch.device("meta"):
        w = build("mlp", 2, ModelOptions(freeze=("fc1.*", "fc3.bias")))
    frozen = [n for n, p in w.model.named_parameters() if not p.requires_grad]
    assert frozen == ["fc1.weight", "fc1.bias", "fc3.bias"]


# ---- tv: ------------------------------------------------------------------------------
@needs_torchvision
@pytest.mark.parametrize(
    ("name", "params", "image"),
    [
        ("resnet50", 25_557_032, 224),  # published counts
        ("resnet152", 60_192_808, 224),
        ("inception_v3", 23_834_568, 299),  # without the auxiliary head, as the zoo's
        ("vit_b_16", 86_567_656, 224),
        ("maxvit_t", 30_919_624, 224),  # its input size fixed at construction, as ViT's
        ("regnet_x_400mf", 5_495_976, 224),  # built on cpu, moved to meta
    ],
)
def test_torchvision_classifiers(name, params, image):
    with torch.device("meta"):
        w = build(f"tv:{name}", 2)
        loss = w.loss()
    assert sum(p.numel() for p in w.model.parameters()) == params
    assert w.inputs[0].shape == (2, 3, image, image) and w.targets[0].shape == (2,)
    assert loss.shape == () and w.model.training


@needs_torchvision
def test_torchvision_segmentation_is_per_pixel_over_21_classes():
    with torch.device("meta"):
        w = build("tv:fcn_resnet50", 2, ModelOptions(image=64, dtype="bf16"))
        out = w.model(*w.inputs)
        loss = w.loss()
    assert out["out"].shape == (2, 21, 64, 64) and "aux" not in out
    assert w.targets[0].shape == (2, 64, 64) and loss.shape == ()
    assert w.inputs[0].dtype is torch.bfloat16


@needs_torchvision
@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("resnt50", "tv:resnt50: no such torchvision model; did you mean tv:resnet50"),
        ("fasterrcnn_resnet50_fpn", "tv:fasterrcnn_resnet50_fpn: not a classification or "
         "segmentation model"),
    ],
)  # fmt: skip
def test_unknown_torchvision_names_are_one_line(name, message):
    with pytest.raises(TraceError) as e:
        resolve(f"tv:{name}")
    assert message in str(e.value) and "\n" not in str(e.value)

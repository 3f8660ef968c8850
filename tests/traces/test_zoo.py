"""The workload zoo: every model trains one step on cpu and meta, sizes are
the ones worked out by hand (or published), and `resolve` fails in one line."""

from __future__ import annotations

import functools
import sys
import textwrap

import pytest
import torch
from memplan.traces.errors import TraceError
from memplan.traces.zoo import (
    BUILTIN,
    NEEDS_EXTRA,
    RECURRENT,
    ZOO,
    Workload,
    build,
    linear_chain,
    resolve,
)
from torch import nn

from tests.extras import has

# Parameter counts by hand. mlp: 784*512+512 + 512*256+256 + 256*10+10.
# small_cnn: convs 3*16*9, 16*32*9, 32*64*9; BatchNorms 2*(16+32+64);
# head 1024*10+10. linear_chain: 8 * (512*512+512). tiny_resnet: stem
# 3*16*9 + 32; layer1 2*(16*16*9 + 32); layer2 16*32*9 + 32*32*9 + 16*32
# + 3*64; layer3 32*64*9 + 64*64*9 + 32*64 + 3*128; fc 64*10+10.
# tiny_transformer: embeddings 100*64 + 16*64; per block ln 2*128, qkv
# 64*192+192, proj 64*64+64, mlp 64*256+256 + 256*64+64; ln_f 128; head
# 64*100+100.
PARAMS = {
    "mlp": 401_408 + 512 + 131_072 + 256 + 2_560 + 10,
    "small_cnn": 432 + 4_608 + 18_432 + 224 + 10_250,
    "linear_chain": 8 * 262_656,
    "tiny_resnet": 464
    + 4_672
    + (4_608 + 9_216 + 512 + 192)
    + (18_432 + 36_864 + 2_048 + 384)
    + 650,
    "tiny_transformer": 6_400 + 1_024 + 2 * (256 + 12_480 + 4_160 + 16_640 + 16_448) + 128 + 6_500,
    # lstm: per layer 4 gates x hidden 64 x (inputs + 64) weights, 2 x 4 x 64 biases
    "lstm": (4 * 64 * (32 + 64) + 512) + (4 * 64 * (64 + 64) + 512) + 64 * 10 + 10,
    # published counts of the reference models
    "vgg16": 138_357_544,
    "resnet50": 25_557_032,
    "inception_v3": 23_834_568,  # without the auxiliary head
    "densenet121": 7_978_856,
    "bert_base": 109_514_298,  # BertForMaskedLM, decoder tied to the embeddings
    "gpt2": 124_439_808,  # GPT2LMHeadModel, head tied to the embeddings
}
PACKAGE = {n: "torchvision" for n in ("vgg16", "resnet50", "inception_v3", "densenet121")}
PACKAGE |= {"bert_base": "transformers", "gpt2": "transformers"}


def _train_step(name: str, device: str) -> Workload:
    torch.manual_seed(0)
    with torch.device(device):
        w = build(name, 2)
        loss = w.loss()
        assert loss.shape == () and loss.device.type == device
        loss.backward()
    assert w.model.training
    assert all(p.device.type == device for p in w.model.parameters())
    assert all(t.device.type == device for t in (*w.inputs, *w.targets))
    assert all(p.grad is not None for p in w.model.parameters())
    assert sum(p.numel() for p in w.model.parameters()) == PARAMS[name]
    return w


def test_the_registry():
    assert set(ZOO) == set(PARAMS) == set(BUILTIN) | set(RECURRENT) | set(NEEDS_EXTRA)
    assert set(PACKAGE) == set(NEEDS_EXTRA)


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("name", BUILTIN + RECURRENT)
def test_builtin_workloads_train_one_step(name, device):
    _train_step(name, device)


@pytest.mark.parametrize("name", NEEDS_EXTRA)
def test_zoo_extra_workloads_train_one_step_on_meta(name):
    if not has(PACKAGE[name]):
        pytest.skip(f"{PACKAGE[name]} is not importable here")
    _train_step(name, "meta")


def test_builtin_batches():
    with torch.device("meta"):
        cnn, tf, chain = ZOO["small_cnn"](3), ZOO["tiny_transformer"](3), ZOO["linear_chain"](3)
    assert cnn.inputs[0].shape == (3, 3, 32, 32) and cnn.targets[0].shape == (3,)
    assert tf.inputs[0].shape == (3, 16) and tf.inputs[0].dtype == torch.int64
    assert tf.targets[0].shape == (3, 16)
    assert chain.inputs[0].shape == chain.targets[0].shape == (3, 512)
    n_linear = sum(isinstance(m, nn.Linear) for m in chain.model.modules())
    assert n_linear == 8
    assert [n for n, _ in chain.model.named_children()] == [f"layer{i}" for i in range(1, 9)]
    # inputs and targets are separate storages: capture tells them apart
    assert tf.inputs[0].untyped_storage()._cdata != tf.targets[0].untyped_storage()._cdata


def test_tiny_transformer_trains_with_dropout():
    torch.manual_seed(0)
    w = ZOO["tiny_transformer"](2)
    drops = [m.p for m in w.model.modules() if isinstance(m, nn.Dropout)]
    assert drops and all(p > 0 for p in drops)
    (ids,) = w.inputs
    assert int(ids.min()) >= 0 and int(ids.max()) < 100 and int(w.targets[0].max()) < 100
    assert not torch.equal(w.model(ids), w.model(ids)), "train mode: dropout is active"
    w.model.eval()
    assert torch.equal(w.model(ids), w.model(ids))


def test_hugging_face_models_keep_their_own_parameter_paths():
    if not has("transformers"):
        pytest.skip("transformers is not importable here")
    with torch.device("meta"):
        bert, gpt = ZOO["bert_base"](2), ZOO["gpt2"](2)
    assert (
        next(n for n, _ in bert.model.named_parameters())
        == "bert.embeddings.word_embeddings.weight"
    )
    assert next(n for n, _ in gpt.model.named_parameters()) == "transformer.wte.weight"
    assert bert.inputs[0].shape == (2, 128) and gpt.inputs[0].shape == (2, 512)
    assert bert.targets == gpt.targets == ()
    assert gpt.model.config._attn_implementation == "eager"


# ---- the zoo extra missing -----------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "module"),
    [("vgg16", "torchvision.models"), ("densenet121", "torchvision.models"),
     ("bert_base", "transformers"), ("gpt2", "transformers")],
)  # fmt: skip
def test_a_missing_zoo_extra_says_how_to_install_it(monkeypatch, name, module):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail
    with pytest.raises(TraceError) as e:
        ZOO[name](2)
    assert str(e.value) == f"{name} needs the zoo extra: pip install 'memplan[zoo]'"


# ---- resolve ---------------------------------------------------------------------------
def test_resolve_names():
    for name, factory in ZOO.items():
        assert resolve(name) is factory
    chain5 = resolve("linear_chain_5")
    assert isinstance(chain5, functools.partial) and chain5.func is linear_chain
    with torch.device("meta"):
        w = chain5(2)
    assert sum(isinstance(m, nn.Linear) for m in w.model.modules()) == 5


@pytest.fixture
def workloads_module(tmp_path, monkeypatch):
    """A package on sys.path with a good factory, a bad one and a constant."""
    (tmp_path / "my_workloads.py").write_text(
        textwrap.dedent(
            """
            import torch
            from memplan.traces.zoo import Workload, mlp

            N_CLASSES = 10

            class Factories:
                @staticmethod
                def wide(batch_size):
                    model = torch.nn.Linear(4, 2)
                    x, y = torch.randn(batch_size, 4), torch.randn(batch_size, 2)
                    return Workload(model, (x,), (y,), torch.nn.functional.mse_loss)

            def not_a_workload(batch_size):
                return batch_size
            """
        )
    )
    (tmp_path / "broken_workloads.py").write_text("raise RuntimeError('no GPU driver')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "my_workloads"
    for mod in ("my_workloads", "broken_workloads"):
        sys.modules.pop(mod, None)


def test_resolve_imports_package_module_callable(workloads_module):
    from memplan.traces.zoo import mlp

    assert resolve("memplan.traces.zoo:mlp") is mlp
    w = build("my_workloads:Factories.wide", 3)  # dotted attributes work
    assert w.inputs[0].shape == (3, 4)
    assert w.loss().shape == ()
    assert resolve("my_workloads:mlp") is mlp


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("resnet", "unknown workload 'resnet': known are mlp, small_cnn, linear_chain, "
         "tiny_resnet, tiny_transformer, lstm, vgg16, resnet50, inception_v3, densenet121, "
         "bert_base, gpt2, linear_chain_N, or package.module:callable"),
        ("linear_chain_0", "unknown workload 'linear_chain_0': known are"),
        ("no_such_package_x.models:make", "workload 'no_such_package_x.models:make': cannot "
         "import 'no_such_package_x.models': No module named 'no_such_package_x'"),
        ("broken_workloads:make", "workload 'broken_workloads:make': importing "
         "'broken_workloads' failed: RuntimeError: no GPU driver"),
        ("my_workloads:nope", "workload 'my_workloads:nope': module 'my_workloads' has no "
         "attribute 'nope'"),
        ("my_workloads:Factories.narrow", "module 'my_workloads' has no attribute "
         "'Factories.narrow'"),
        ("my_workloads:N_CLASSES", "workload 'my_workloads:N_CLASSES': N_CLASSES is not "
         "callable (type int)"),
        ("my_workloads:", "workload 'my_workloads:': expected package.module:callable"),
        (":mlp", "workload ':mlp': expected package.module:callable"),
    ],
)  # fmt: skip
def test_resolve_errors_are_one_line(workloads_module, spec, message):
    with pytest.raises(TraceError) as e:
        resolve(spec)
    assert message in str(e.value)
    assert "\n" not in str(e.value)


def test_build_checks_the_batch_and_what_the_factory_returns(workloads_module):
    with pytest.raises(TraceError, match="batch_size=0 must be an integer >= 1"):
        build("mlp", 0)
    with pytest.raises(TraceError, match=r"'my_workloads:not_a_workload' returned int, expected"):
        build("my_workloads:not_a_workload", 2)

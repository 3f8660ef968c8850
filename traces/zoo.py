"""Workloads: a model, a batch and a loss, built for a given batch size.

`ZOO` maps a name to a factory ``batch_size -> Workload``; `resolve` also
accepts ``linear_chain_N``, ``package.module:callable`` for workloads
defined elsewhere, and ``tv:NAME`` / ``hf:ARCH`` for any torchvision or
transformers model (traces/builders/), each built with `ModelOptions`.

Factories create everything on the *current default device*: capture calls
them inside ``with torch.device("meta"):`` (or cpu, cuda), so they use
``torch.randn`` / ``torch.randint`` without a device and construct models
normally. Weights and data come from torch's global RNG: seed it first
(`torch.manual_seed`) for reproducible values. Every model is returned in
``train()`` mode, and nothing is downloaded (``weights=None``, models built
from their default configs with random weights).

The built-in workloads need only torch. ``vgg16``, ``resnet50``,
``inception_v3``, ``densenet121`` (torchvision) and ``bert_base``, ``gpt2``
(transformers) need the ``zoo`` extra, imported when the factory runs.
"""

from __future__ import annotations

import functools
import importlib
import math
import re
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from memplan.traces.builders.packages import _ZOO_EXTRA, _package
from memplan.traces.errors import TraceError
from memplan.traces.workload import IMAGENET_CLASSES, Workload, output_loss, with_labels
from torch import Tensor, nn

if TYPE_CHECKING:
    from memplan.traces.builders import ModelOptions


# ---- built-in models (torch only) -----------------------------------------------------
class MLP(nn.Module):
    """784 -> 512 -> 256 -> 10 with ReLUs: an MNIST-sized classifier."""

    def __init__(self, sizes: tuple[int, ...] = (784, 512, 256, 10)) -> None:
        super().__init__()
        self.fc1 = nn.Linear(sizes[0], sizes[1])
        self.fc2 = nn.Linear(sizes[1], sizes[2])
        self.fc3 = nn.Linear(sizes[2], sizes[3])
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.fc3(self.relu(self.fc2(self.relu(self.fc1(x)))))


class ConvBlock(nn.Module):
    """3x3 conv, BatchNorm, ReLU, then a 2x2 max-pool that halves the image."""

    def __init__(self, c_in: int, c_out: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2)

    def forward(self, x: Tensor) -> Tensor:
        return self.pool(self.relu(self.bn(self.conv(x))))


class SmallCNN(nn.Module):
    """Three conv blocks (16, 32, 64 channels) on 3x32x32 images, 32 -> 4
    pixels across, then a linear head over 64 * 4 * 4 features."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.block1 = ConvBlock(3, 16)
        self.block2 = ConvBlock(16, 32)
        self.block3 = ConvBlock(32, 64)
        self.head = nn.Linear(64 * 4 * 4, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.block3(self.block2(self.block1(x)))
        return self.head(x.flatten(1))


class LinearReLU(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        return self.relu(self.linear(x))


class LinearChain(nn.Module):
    """`n_layers` blocks ``layer1`` .. ``layerN`` of Linear(width, width) + ReLU."""

    def __init__(self, n_layers: int, width: int) -> None:
        super().__init__()
        for i in range(1, n_layers + 1):
            self.add_module(f"layer{i}", LinearReLU(width))

    def forward(self, x: Tensor) -> Tensor:
        for layer in self.children():
            x = layer(x)
        return x


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 conv + BatchNorm, a skip connection
    (a 1x1 conv + BatchNorm when the shape changes), ReLU after the sum."""

    def __init__(self, c_in: int, c_out: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.relu = nn.ReLU()
        self.downsample: nn.Module = nn.Identity()
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(
                nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out)
            )

    def forward(self, x: Tensor) -> Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.downsample(x))


class TinyResNet(nn.Module):
    """A stem (3x3 conv, BatchNorm, ReLU; 16 channels) and three basic blocks
    (16, 32, 64 channels; the last two stride 2) on 3x32x32 images, global
    average pooling and a linear head."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()
        )
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 32, stride=2)
        self.layer3 = BasicBlock(32, 64, stride=2)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x: Tensor) -> Tensor:
        x = self.layer3(self.layer2(self.layer1(self.stem(x))))
        return self.fc(self.pool(x).flatten(1))


class SelfAttention(nn.Module):
    """Causal multi-head self-attention from plain Linear, matmul and
    softmax, with dropout on the attention weights."""

    def __init__(self, d_model: int, n_heads: int, seq_len: int, dropout: float) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.attn_drop = nn.Dropout(dropout)
        causal = torch.full((seq_len, seq_len), float("-inf")).triu(1)
        self.register_buffer("causal_mask", causal, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        b, t, d = x.shape
        q, k, v = (
            y.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2)
            for y in self.qkv(x).split(d, dim=2)
        )
        scores = q @ k.transpose(-2, -1) / math.sqrt(d // self.n_heads)
        weights = self.attn_drop((scores + self.causal_mask[:t, :t]).softmax(dim=-1))
        return self.proj((weights @ v).transpose(1, 2).reshape(b, t, d))


class FeedForward(nn.Module):
    def __init__(self, d_model: int, hidden: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_model, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, d_model)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class TransformerBlock(nn.Module):
    """Pre-LayerNorm block: x + drop(attn(ln1(x))), then x + drop(mlp(ln2(x)))."""

    def __init__(self, d_model: int, n_heads: int, seq_len: int, dropout: float) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, n_heads, seq_len, dropout)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = FeedForward(d_model, 4 * d_model)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.drop(self.attn(self.ln1(x)))
        return x + self.drop(self.mlp(self.ln2(x)))


class TinyTransformer(nn.Module):
    """A GPT-style language model: token and position embeddings, `n_layers`
    transformer blocks, a final LayerNorm and a head over the vocabulary."""

    def __init__(
        self,
        vocab: int = 100,
        seq_len: int = 16,
        d_model: int = 64,
        n_heads: int = 4,
        n_layers: int = 2,
        dropout: float = 0.1,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            TransformerBlock(d_model, n_heads, seq_len, dropout) for _ in range(n_layers)
        )
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, ids: Tensor) -> Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.drop(self.tok(ids) + self.pos(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


class LSTMClassifier(nn.Module):
    """A 2-layer LSTM (32 features in, 64 hidden) over a sequence, its last
    step's hidden state classified into 10 classes."""

    def __init__(self, features: int = 32, hidden: int = 64, n_classes: int = 10) -> None:
        super().__init__()
        self.lstm = nn.LSTM(features, hidden, num_layers=2, batch_first=True)
        self.head = nn.Linear(hidden, n_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.lstm(x)[0][:, -1])


# ---- loss functions (module level, so workloads stay picklable) ---------------------
def token_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Cross-entropy of (batch, seq, vocab) logits against (batch, seq) ids."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


# ---- built-in factories ------------------------------------------------------------
def _classification(model: nn.Module, x: Tensor, n_classes: int) -> Workload:
    y = torch.randint(0, n_classes, (x.shape[0],))
    return Workload(model.train(), (x,), (y,), F.cross_entropy)


def mlp(batch_size: int) -> Workload:
    """`MLP` on flattened 28x28 images, 10 classes, cross-entropy."""
    return _classification(MLP(), torch.randn(batch_size, 784), 10)


def small_cnn(batch_size: int) -> Workload:
    """`SmallCNN` on 3x32x32 images, 10 classes, cross-entropy."""
    return _classification(SmallCNN(), torch.randn(batch_size, 3, 32, 32), 10)


def linear_chain(batch_size: int, n_layers: int = 8, width: int = 512) -> Workload:
    """`LinearChain` of `n_layers` Linear + ReLU layers, MSE against a random
    target: the real-model twin of `traces.synthetic.chain`."""
    x, y = torch.randn(batch_size, width), torch.randn(batch_size, width)
    return Workload(LinearChain(n_layers, width).train(), (x,), (y,), F.mse_loss)


def tiny_resnet(batch_size: int) -> Workload:
    """`TinyResNet` on 3x32x32 images, 10 classes, cross-entropy."""
    return _classification(TinyResNet(), torch.randn(batch_size, 3, 32, 32), 10)


def tiny_transformer(batch_size: int) -> Workload:
    """`TinyTransformer`: 16 token ids in, cross-entropy over a vocabulary of
    100 at every position (with dropout: the step consumes RNG)."""
    model = TinyTransformer()
    vocab, seq = model.head.out_features, model.pos.num_embeddings
    ids = torch.randint(0, vocab, (batch_size, seq))
    targets = torch.randint(0, vocab, (batch_size, seq))
    return Workload(model.train(), (ids,), (targets,), token_cross_entropy)


def lstm(batch_size: int) -> Workload:
    """`LSTMClassifier` on sequences of 12 steps of 32 features, 10 classes.
    Captured on cpu or cuda, or on meta for a CUDA target (cuDNN's kernel,
    emulated): NOTE [ Recurrent layers on meta ] in traces/capture.py."""
    return _classification(LSTMClassifier(), torch.randn(batch_size, 12, 32), 10)


# ---- the zoo extra: torchvision and transformers -----------------------------------
def _extra(module: str, model: str) -> ModuleType:
    """Import a module of the zoo extra, or say how to get it."""
    return _package(module, model, _ZOO_EXTRA, need="the zoo extra")


def _torchvision(name: str, batch_size: int, image: int, **kwargs: Any) -> Workload:
    models = _extra("torchvision.models", name)
    model = getattr(models, name)(weights=None, num_classes=IMAGENET_CLASSES, **kwargs)
    return _classification(model, torch.randn(batch_size, 3, image, image), IMAGENET_CLASSES)


def vgg16(batch_size: int) -> Workload:
    """torchvision VGG-16, 3x224x224 images, 1000 classes."""
    return _torchvision("vgg16", batch_size, 224)


def resnet50(batch_size: int) -> Workload:
    """torchvision ResNet-50, 3x224x224 images, 1000 classes."""
    return _torchvision("resnet50", batch_size, 224)


def inception_v3(batch_size: int) -> Workload:
    """torchvision Inception-v3 without the auxiliary head, 3x299x299 images.
    ``init_weights=False``: the default init needs scipy and is slow."""
    return _torchvision("inception_v3", batch_size, 299, aux_logits=False, init_weights=False)


def densenet121(batch_size: int) -> Workload:
    """torchvision DenseNet-121, 3x224x224 images, 1000 classes."""
    return _torchvision("densenet121", batch_size, 224)


def _language_model(model: nn.Module, vocab: int, batch_size: int, seq_len: int) -> Workload:
    ids = torch.randint(0, vocab, (batch_size, seq_len))
    return Workload(model.train(), (ids, ids), (), output_loss)


def bert_base(batch_size: int) -> Workload:
    """BERT-base (``BertConfig()`` defaults) with the masked-LM head, on
    sequences of 128 random token ids that are also the labels. Eager
    attention, so it runs on meta and cpu."""
    tf = _extra("transformers", "bert_base")
    config = tf.BertConfig(attn_implementation="eager")
    model = with_labels(tf.BertForMaskedLM)(config)
    return _language_model(model, config.vocab_size, batch_size, 128)


def gpt2(batch_size: int) -> Workload:
    """GPT-2 small (``GPT2Config()`` defaults) with the LM head, on sequences
    of 512 random token ids that are also the labels. Eager attention."""
    tf = _extra("transformers", "gpt2")
    config = tf.GPT2Config(attn_implementation="eager")
    model = with_labels(tf.GPT2LMHeadModel)(config)
    model.loss_type = "ForCausalLM"  # transformers guesses it from the class name, and warns
    return _language_model(model, config.vocab_size, batch_size, 512)


# ---- the registry ------------------------------------------------------------------
ZOO: dict[str, Callable[[int], Workload]] = {
    "mlp": mlp,
    "small_cnn": small_cnn,
    "linear_chain": linear_chain,
    "tiny_resnet": tiny_resnet,
    "tiny_transformer": tiny_transformer,
    "lstm": lstm,
    "vgg16": vgg16,
    "resnet50": resnet50,
    "inception_v3": inception_v3,
    "densenet121": densenet121,
    "bert_base": bert_base,
    "gpt2": gpt2,
}
BUILTIN: tuple[str, ...] = ("mlp", "small_cnn", "linear_chain", "tiny_resnet", "tiny_transformer")
# Built in too (torch only), but captured on cpu or cuda, or on meta for a CUDA target.
RECURRENT: tuple[str, ...] = ("lstm",)
NEEDS_EXTRA: tuple[str, ...] = tuple(n for n in ZOO if n not in BUILTIN + RECURRENT)
_LINEAR_CHAIN_N = re.compile(r"linear_chain_(\d+)")


def resolve(name_or_spec: str, options: ModelOptions | None = None) -> Callable[[int], Workload]:
    """The factory for a zoo name, ``linear_chain_N`` (N >= 1 layers),
    ``package.module:callable`` (imported; dotted attributes allowed),
    ``tv:NAME`` (torchvision) or ``hf:ARCH`` (transformers), building its
    model with `options` (NOTE [ Model options ] in traces/builders/options.py; the
    ``tv:`` and ``hf:`` prefixes are never modules). With default options a
    zoo name's or a callable's factory is returned as it is. Anything wrong,
    an option that does not apply to the kind of name included, is a
    one-line `TraceError` saying what."""
    from memplan.traces import builders

    opts = options or builders.ModelOptions()
    prefix, _, rest = name_or_spec.partition(":")
    if prefix in ("tv", "hf"):
        if not rest:
            raise TraceError(f"workload {name_or_spec!r}: expected {prefix}:NAME")
        kind = builders.Kind(prefix)
        builders.check_applies(kind, opts, name_or_spec)
        if kind is builders.Kind.TORCHVISION:
            tv = builders.torchvision_model(rest, opts)
            return functools.partial(builders.build_torchvision, tv)
        hf = builders.transformers_model(rest, opts)
        return functools.partial(builders.build_transformers, hf)
    kind = builders.Kind.MODULE if ":" in name_or_spec else builders.Kind.ZOO
    factory = _import_factory(name_or_spec) if ":" in name_or_spec else _zoo_factory(name_or_spec)
    builders.check_applies(kind, opts, name_or_spec)
    if not opts.given():
        return factory
    return builders.with_options(factory, opts, name_or_spec)


def _zoo_factory(name: str) -> Callable[[int], Workload]:
    if name in ZOO:
        return ZOO[name]
    m = _LINEAR_CHAIN_N.fullmatch(name)
    if m and int(m[1]) >= 1:
        return functools.partial(linear_chain, n_layers=int(m[1]))
    known = ", ".join(ZOO)
    raise TraceError(
        f"unknown workload {name!r}: known are {known}, linear_chain_N, "
        "or package.module:callable; or tv:NAME for a torchvision model, hf:ARCH for a "
        "transformers one (tv:resnet152, hf:llama)"
    )


def _import_factory(spec: str) -> Callable[[int], Workload]:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr or ":" in attr:
        raise TraceError(f"workload {spec!r}: expected package.module:callable")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise TraceError(f"workload {spec!r}: cannot import {module_name!r}: {e}") from None
    except Exception as e:  # the module itself is broken: say how, in one line
        reason = (str(e).splitlines() or [""])[0]
        raise TraceError(
            f"workload {spec!r}: importing {module_name!r} failed: {type(e).__name__}: {reason}"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise TraceError(f"workload {spec!r}: module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise TraceError(f"workload {spec!r}: {attr} is not callable (type {type(obj).__name__})")
    return obj


def build(name_or_spec: str, batch_size: int, options: ModelOptions | None = None) -> Workload:
    """`resolve` and call the factory, checking what it returns."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise TraceError(f"batch_size={batch_size!r} must be an integer >= 1")
    workload = resolve(name_or_spec, options)(batch_size)
    if not isinstance(workload, Workload):
        raise TraceError(
            f"workload {name_or_spec!r} returned {type(workload).__name__}, "
            "expected a traces.zoo.Workload"
        )
    return workload

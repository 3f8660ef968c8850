"""The options a workload's model is built with (NOTE [ Model options ]),
and the command line's text they are read from: ``--config`` values typed
by a config's defaults (NOTE [ Config values ]), ``--lora``, ``--freeze``.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import torch
from memplan.traces import optim
from memplan.traces.errors import TraceError

if TYPE_CHECKING:
    from memplan.traces.model import Trace


# ---- options ---------------------------------------------------------------------------
class Dtype(enum.Enum):
    """The dtype a model's parameters (and floating inputs) are built in."""

    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"

    @property
    def torch(self) -> torch.dtype:
        return {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[self.value]


class Kind(enum.Enum):
    """Where a workload name comes from."""

    ZOO = "zoo"  # a name of traces.zoo.ZOO, or linear_chain_N
    MODULE = "module"  # package.module:callable
    TORCHVISION = "tv"
    TRANSFORMERS = "hf"


@dataclass(frozen=True, slots=True)
class Lora:
    """LoRA adapters added by peft (`peft.LoraConfig`): rank `r`, scale
    `alpha` (None: peft's default, 8), `dropout`, and the modules adapted
    (None: peft's default for the transformers architecture)."""

    r: int = 8
    alpha: float | None = None
    dropout: float = 0.0
    target_modules: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.r, int) or isinstance(self.r, bool) or self.r < 1:
            raise TraceError(f"lora r={self.r!r} must be an integer >= 1")
        if self.alpha is not None and not (_is_number(self.alpha) and self.alpha > 0):
            raise TraceError(f"lora alpha={self.alpha!r} must be a number > 0")
        if not (_is_number(self.dropout) and 0 <= self.dropout < 1):
            raise TraceError(f"lora dropout={self.dropout!r} must be a number in [0, 1)")
        targets = self.target_modules
        if targets is not None and (
            not isinstance(targets, tuple) or not targets or not all(_named(t) for t in targets)
        ):
            raise TraceError(
                f"lora target_modules={targets!r} must be a non-empty tuple of module names"
            )


# NOTE [ Model options ]
# `ModelOptions` is how a workload's model is built; the defaults build it as
# its factory does. Which options apply to which kind of name:
# - dtype, freeze, lora: every workload (zoo names, package.module:callable,
#   tv:, hf:);
# - image: tv: only (the side of the square random images);
# - config, config_file, seq, gradient_checkpointing: hf: only (a config of
#   transformers, its token sequence, its own `gradient_checkpointing_enable`).
# An option given for a kind it does not apply to is a one-line error when
# the name is resolved, before anything is built. Applied in this order,
# each to what the one before made: the dtype (the model is built in it:
# NOTE [ Low-precision training ]), gradient checkpointing, freezing (fnmatch
# patterns on `named_parameters()` names, each of which must match one),
# then LoRA, which freezes every parameter but its adapters (as peft does;
# HF and peft put checkpointing before adapters in their recipes). A frozen
# parameter gets no grad and no optimizer state: capture's optimizer takes
# only the parameters with `requires_grad`.
@dataclass(frozen=True, slots=True)
class ModelOptions:
    """How a workload's model is built (NOTE [ Model options ]).

    `config` maps config field names to values, strings typed by the
    config's defaults (NOTE [ Config values ]); `config_file` is a
    config.json read first. `seq` is the tokens per sequence and `image` the
    image side in pixels (None: the rules of NOTE [ Hugging Face workloads ]
    and NOTE [ torchvision workloads ]). `freeze` holds fnmatch patterns of
    parameter names."""

    dtype: Dtype | str = Dtype.FP32
    config: Mapping[str, Any] = field(default_factory=dict, hash=False)
    config_file: str | None = None
    seq: int | None = None
    image: int | None = None
    freeze: tuple[str, ...] = ()
    lora: Lora | None = None
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.dtype, Dtype):
            if self.dtype not in {d.value for d in Dtype}:
                allowed = ", ".join(d.value for d in Dtype)
                raise TraceError(f"dtype={self.dtype!r} must be one of {allowed}")
            object.__setattr__(self, "dtype", Dtype(self.dtype))
        if not isinstance(self.config, Mapping) or not all(
            isinstance(k, str) and k.isidentifier() for k in self.config
        ):
            raise TraceError(f"config={self.config!r} must map field names to values")
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))
        for name, lo in (("seq", 1), ("image", 32)):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < lo):
                raise TraceError(f"{name}={v!r} must be an integer >= {lo}")
        if not isinstance(self.freeze, tuple) or not all(
            isinstance(p, str) and p.strip() for p in self.freeze
        ):
            raise TraceError(f"freeze={self.freeze!r} must be a tuple of parameter-name patterns")
        if self.lora is not None and not isinstance(self.lora, Lora):
            raise TraceError(f"lora={self.lora!r} must be a traces.builders.Lora")

    def given(self) -> tuple[str, ...]:
        """The options that differ from the defaults, by field name."""
        default = ModelOptions()
        return tuple(
            f.name
            for f in dataclasses.fields(self)
            if getattr(self, f.name) != getattr(default, f.name)
        )

    def as_json(self) -> dict[str, Any]:
        """The options that differ from the defaults, as JSON values (what a
        trace records of how its model was built)."""
        out: dict[str, Any] = {}
        for name in self.given():
            value = getattr(self, name)
            if isinstance(value, Dtype):
                value = value.value
            elif isinstance(value, Lora):
                value = {k: v for k, v in dataclasses.asdict(value).items() if v is not None}
                if "target_modules" in value:
                    value["target_modules"] = list(value["target_modules"])
            elif isinstance(value, Mapping):
                value = {k: list(v) if isinstance(v, tuple) else v for k, v in value.items()}
            elif isinstance(value, tuple):
                value = list(value)
            out[name] = value
        return out

    def describe(self) -> str:
        """The options given, in a few words ("" for the defaults)."""
        words = []
        if self.dtype is not Dtype.FP32:
            words.append(self.dtype.value)
        if self.freeze:
            words.append(f"frozen {','.join(self.freeze)}")
        if self.lora is not None:
            words.append(f"lora r={self.lora.r}")
        if self.gradient_checkpointing:
            words.append("gradient checkpointing")
        return ", ".join(words)


def recorded(trace: Trace, options: ModelOptions) -> Trace:
    """`trace` with the options its model was built with in
    ``meta.extra["model_options"]`` (nothing added for the defaults)."""
    if not options.given():
        return trace
    extra = {**trace.meta.extra, "model_options": options.as_json()}
    return dataclasses.replace(trace, meta=dataclasses.replace(trace.meta, extra=extra))


_HF_ONLY = ("config", "config_file", "seq", "gradient_checkpointing")
_TV_ONLY = ("image",)
_FLAG = {"config_file": "config", "gradient_checkpointing": "gradient-checkpointing"}


def check_applies(kind: Kind, options: ModelOptions, name: str) -> None:
    """A one-line error for an option given to a kind of workload it does
    not apply to (NOTE [ Model options ])."""
    for option in options.given():
        flag = "--" + _FLAG.get(option, option)
        if option in _HF_ONLY and kind is not Kind.TRANSFORMERS:
            raise TraceError(f"{flag} applies to hf: models (transformers), not to {name!r}")
        if option in _TV_ONLY and kind is not Kind.TORCHVISION:
            raise TraceError(f"{flag} applies to tv: models (torchvision), not to {name!r}")


# ---- parsing the command line's text ----------------------------------------------------
def parse_assignments(text: str, what: str) -> dict[str, str | tuple[str, ...]]:
    """``k=v,k2=a,b`` as ``{"k": "v", "k2": ("a", "b")}``: an item without
    ``=`` continues the value before it as a list; commas inside (), [] or {}
    do not split. Values stay strings: the caller types them."""
    out: dict[str, str | tuple[str, ...]] = {}
    key = None
    for item in optim.split_top(text, what):
        k, eq, v = item.partition("=")
        if not eq:
            if key is None:
                raise TraceError(f"{what} {text!r}: {item.strip()!r} is not name=value")
            before = out[key]
            out[key] = (*((before,) if isinstance(before, str) else before), item.strip())
            continue
        key = k.strip()
        if not key.isidentifier():
            raise TraceError(f"{what} {text!r}: {key!r} is not a name")
        if key in out:
            raise TraceError(f"{what} {text!r}: {key!r} is given twice")
        out[key] = v.strip()
    if not out:
        raise TraceError(f"{what} {text!r}: expected name=value[,name=value...]")
    return out


def _bracketed(raw: str) -> list[str] | None:
    """``(a,b)`` or ``[a,b]`` as its items; None for anything else."""
    if len(raw) >= 2 and raw[0] in "([" and raw[-1] in ")]":
        return [x.strip() for x in raw[1:-1].split(",") if x.strip()]
    return None


# `--lora` names, peft's LoraConfig names too, to `Lora` fields
_LORA_KEYS = {
    **{k: k for k in ("r", "alpha", "dropout", "target_modules")},
    "lora_alpha": "alpha",
    "lora_dropout": "dropout",
}


def parse_lora(text: str) -> Lora:
    """``r=8,alpha=16,dropout=0.05,target_modules=q_proj,v_proj`` as a `Lora`."""
    values: dict[str, Any] = {}
    for key, raw in parse_assignments(text, "--lora").items():
        if key not in _LORA_KEYS:
            raise TraceError(f"--lora {key}: unknown; known are r, alpha, dropout, target_modules")
        name = _LORA_KEYS[key]
        if name == "target_modules":
            items = (raw,) if isinstance(raw, str) else raw
            listed = _bracketed(items[0]) if len(items) == 1 else None
            values[name] = tuple(listed if listed is not None else items)
            continue
        if not isinstance(raw, str):
            raise TraceError(f"--lora {key}={','.join(raw)}: expected one number")
        values[name] = _literal(raw)
        if name == "r" and not isinstance(values[name], int):
            raise TraceError(f"--lora r={raw}: expected a whole number")
        if not _is_number(values[name]):
            raise TraceError(f"--lora {key}={raw}: expected a number")
    return Lora(**values)


def parse_freeze(text: str) -> tuple[str, ...]:
    """``embed_tokens.*,*.norm.weight`` as fnmatch patterns."""
    patterns = tuple(p.strip() for p in text.split(",") if p.strip())
    if not patterns:
        raise TraceError(f"--freeze {text!r}: expected PATTERN[,PATTERN...]")
    return patterns


# ---- values ----------------------------------------------------------------------------
def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _named(v: Any) -> bool:
    return isinstance(v, str) and bool(v.strip())


def _literal(raw: str) -> Any:
    """A value with no default to type it by: true/false, none, an int, a
    float, a JSON list or object, else the string."""
    low = raw.lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "null"):
        return None
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    if raw[:1] in "[{":
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            pass
    return raw


# NOTE [ Config values ]
# `--config k=v` values are strings typed by the field's value in the config
# class's defaults (`LlamaConfig()`): a bool reads true/false; an int a whole
# number; a float any number; a str as given; a list or tuple comma-separated
# items (`k=a,b` or `k=[a,b]`) each typed by the default's first item; a
# dict a JSON object (`rope_parameters={"rope_type":"default"}`); a default
# of None reads true/false, none, a number, JSON, else the string (a list of
# them after commas). A name the
# defaults do not have (nor `attribute_map`, e.g. gpt2's n_embd) is an error
# naming close matches: a misspelt field would otherwise be kept silently by
# transformers and change nothing. `attn_implementation` is the one extra
# name (eager, sdpa, ...: passed to the model's constructor, not stored as a
# field). Values that are not strings (a library caller's) are taken as they
# are, and a config.json (`config_file`) is read as transformers reads it.
def _typed(raw: Any, default: Any, where: str) -> Any:
    if not isinstance(raw, str | tuple):
        return raw
    if isinstance(default, list | tuple):
        listed = None if isinstance(raw, tuple) else _bracketed(raw)
        items = raw if isinstance(raw, tuple) else listed if listed is not None else [raw]
        first = default[0] if default else None
        out = [_typed(x, first, where) for x in items]
        return type(default)(out)
    if default is None:
        return [_literal(x) for x in raw] if isinstance(raw, tuple) else _literal(raw)
    if isinstance(raw, tuple):
        raise TraceError(f"{where}={','.join(raw)}: one value expected, not a list")
    if isinstance(default, bool):
        if raw.lower() not in ("true", "false"):
            raise TraceError(f"{where}={raw!r}: expected true or false")
        return raw.lower() == "true"
    if isinstance(default, int):
        try:
            return int(raw)
        except ValueError:
            raise TraceError(f"{where}={raw!r}: expected a whole number") from None
    if isinstance(default, float):
        try:
            return float(raw)
        except ValueError:
            raise TraceError(f"{where}={raw!r}: expected a number") from None
    if isinstance(default, dict):
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = None
        if not isinstance(value, dict):
            raise TraceError(f"{where}={raw!r}: expected a JSON object {{...}}")
        return value
    return raw

"""``hf:ARCH`` workloads: transformers text models built from their config
class, with random weights and ids (NOTE [ Hugging Face workloads ])."""

from __future__ import annotations

import contextlib
import copy
import difflib
import enum
import functools
import inspect
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import torch
from memplan.traces.builders.options import ModelOptions, _typed
from memplan.traces.builders.packages import _ZOO_EXTRA, _first_line, _package
from memplan.traces.builders.training import finish
from memplan.traces.errors import TraceError
from torch import Tensor

if TYPE_CHECKING:
    from memplan.traces.workload import Workload

DEFAULT_SEQ = 512


# ---- transformers ----------------------------------------------------------------------
class Head(enum.Enum):
    """The task head an ``hf:`` model is built with, in the order of the rule
    of NOTE [ Hugging Face workloads ], and the auto mapping naming it."""

    MASKED_LM = "MODEL_FOR_MASKED_LM_MAPPING_NAMES"
    CAUSAL_LM = "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"
    SEQ2SEQ_LM = "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"
    SEQUENCE_CLASSIFICATION = "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"
    TOKEN_CLASSIFICATION = "MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES"

    @property
    def loss_type(self) -> str | None:
        """transformers' `LOSS_MAPPING` key of the head, when it has one."""
        return {
            Head.MASKED_LM: "ForMaskedLM",
            Head.CAUSAL_LM: "ForCausalLM",
            Head.SEQUENCE_CLASSIFICATION: "ForSequenceClassification",
            Head.TOKEN_CLASSIFICATION: "ForTokenClassification",
        }.get(self)


# NOTE [ Hugging Face workloads ]
# `hf:ARCH` is a transformers `model_type` (any case) or a model class. Its config: the
# class's defaults, then `config_file`, then `config` (NOTE [ Config values ]); nothing from
# the hub. A model_type gets the first head it has of `Head` (masked LM, causal LM, seq2seq
# LM, sequence, token classification). Inputs: `seq` random ids, else min(512,
# max_position_embeddings); labels are the ids (random classes for classification heads;
# shifted right for seq2seq). Built by `_from_config(config, dtype=...)`: the dtype option
# decides. Kept as the model has them: its attention implementation and `use_cache`.
# Full text: docs/notes.md, "Hugging Face workloads".
@dataclass(frozen=True, slots=True)
class TransformersModel:
    """A resolved ``hf:`` name: what `build_transformers` builds."""

    name: str
    model_class: str  # the transformers class, by name: imported when built
    head: Head
    config: Any  # a transformers PretrainedConfig, copied at every build
    attn_implementation: str | None
    seq: int
    options: ModelOptions


def transformers_model(name: str, options: ModelOptions) -> TransformersModel:
    """The ``hf:ARCH`` workload with its config built and checked
    (NOTE [ Hugging Face workloads ]); every problem a one-line error."""
    tf = _package("transformers", f"hf:{name}", _ZOO_EXTRA)
    model_class, head = _hf_class(name)
    cls = _hf_attr(tf, model_class, name)
    if getattr(cls, "main_input_name", None) != "input_ids":
        raise TraceError(
            f"hf:{name}: {model_class} takes {getattr(cls, 'main_input_name', '?')}, not "
            "input_ids; memplan builds hf: text models (tv: for torchvision's image models)"
        )
    config_class = cls.config_class
    values = dict(_config_file(options.config_file, config_class, name))
    attn = values.pop("attn_implementation", None)
    given = dict(options.config)
    if "attn_implementation" in given:
        attn = str(given.pop("attn_implementation"))
    try:
        defaults = config_class()
    except Exception as e:
        raise TraceError(f"hf:{name}: {config_class.__name__}() failed: {_first_line(e)}") from None
    for key, raw in given.items():
        values[key] = _typed(raw, _field_default(defaults, key, name), f"hf:{name} --config {key}")
    try:
        config = config_class(**values)
    except Exception as e:
        raise TraceError(
            f"hf:{name}: {config_class.__name__}(...) failed: {_first_line(e)}"
        ) from None
    if not isinstance(getattr(config, "vocab_size", None), int):
        raise TraceError(f"hf:{name}: {config_class.__name__} has no vocab_size: not a text model")
    if head is Head.SEQ2SEQ_LM and getattr(config, "decoder_start_token_id", None) is None:
        config.decoder_start_token_id = config.pad_token_id  # T5's rule, as its hub configs say
    seq = _seq(config, options, name)
    return TransformersModel(name, model_class, head, config, attn, seq, options)


def _hf_class(name: str) -> tuple[str, Head]:
    """(model class name, head) for a model_type or a class name."""
    from transformers.models.auto import modeling_auto
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES as types

    mappings = {head: getattr(modeling_auto, head.value) for head in Head}
    model_type = name if name in types else name.lower() if name.lower() in types else None
    if model_type is not None:
        for head, mapping in mappings.items():
            if model_type in mapping:
                found = mapping[model_type]
                return (found[0] if isinstance(found, list | tuple) else found), head
        raise TraceError(
            f"hf:{name}: transformers lists no text head (masked LM, causal LM, seq2seq LM, "
            f"sequence or token classification) for {model_type!r}; memplan builds hf: text models"
        )
    for head, mapping in mappings.items():
        for found in mapping.values():
            if name in ((found,) if isinstance(found, str) else found):
                return name, head
    classes = sorted({c for m in mappings.values() for v in m.values() for c in _names(v)})
    close = difflib.get_close_matches(name, list(types) + classes, n=5, cutoff=0.6)
    hint = f"; did you mean {', '.join('hf:' + c for c in close)}?" if close else ""
    raise TraceError(
        f"hf:{name}: not a transformers model_type nor a model class with a text head{hint}"
    )


def _names(found: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    return (found,) if isinstance(found, str) else tuple(found)


def _hf_attr(tf: ModuleType, attr: str, name: str) -> type:
    try:
        return getattr(tf, attr)
    except Exception as e:  # a model needing another package (timm, ...) fails here
        raise TraceError(
            f"hf:{name}: importing transformers.{attr} failed: {_first_line(e)}"
        ) from None


def _field_default(defaults: Any, key: str, name: str) -> Any:
    fields = defaults.to_dict()
    aliases = getattr(defaults, "attribute_map", {}) or {}
    if key in fields or key in aliases:
        return getattr(defaults, key, None)
    close = difflib.get_close_matches(key, [*fields, *aliases, "attn_implementation"], n=3)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    raise TraceError(f"hf:{name} --config {key}: {type(defaults).__name__} has no such field{hint}")


def _config_file(path: str | None, config_class: type, name: str) -> dict[str, Any]:
    """A config.json's fields (NOTE [ Hugging Face workloads ]): the dtype it
    names is dropped (the dtype option decides), its model_type must match."""
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise TraceError(f"--config {path}: cannot read it: {e.strerror or e}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TraceError(f"--config {path}: not JSON: {_first_line(e)}") from None
    if not isinstance(data, dict):
        raise TraceError(f"--config {path}: expected a JSON object of config fields")
    want = getattr(config_class, "model_type", None)
    if data.get("model_type", want) != want:
        raise TraceError(
            f"--config {path}: model_type {data['model_type']!r}, but hf:{name} is {want!r}"
        )
    for key in ("dtype", "torch_dtype", "architectures", "transformers_version", "model_type"):
        data.pop(key, None)
    return data


def _seq(config: Any, options: ModelOptions, name: str) -> int:
    limit = getattr(config, "max_position_embeddings", None)
    limit = limit if isinstance(limit, int) and limit > 0 else None
    if options.seq is None:
        return min(DEFAULT_SEQ, limit) if limit else DEFAULT_SEQ
    if limit is not None and options.seq > limit:
        raise TraceError(
            f"hf:{name} --seq {options.seq}: more than its max_position_embeddings={limit} "
            "(raise it with --config max_position_embeddings=N)"
        )
    return options.seq


def build_transformers(spec: TransformersModel, batch_size: int) -> Workload:
    """A factory (with `functools.partial`): the model in train mode, random
    ids and labels (NOTE [ Hugging Face workloads ]), `spec.options` applied."""
    from memplan.traces.workload import Workload, output_loss, with_labels

    tf = _package("transformers", f"hf:{spec.name}", _ZOO_EXTRA)
    base = _hf_attr(tf, spec.model_class, spec.name)
    cache = _cache_keyword(base) if spec.options.gradient_checkpointing else None
    cls = _checkpointed(base, cache) if cache else with_labels(base)
    config = copy.deepcopy(spec.config)
    if spec.options.gradient_checkpointing and hasattr(config, "use_cache"):
        config.use_cache = False  # what transformers does under checkpointing, without its warning
    kwargs: dict[str, Any] = {"dtype": spec.options.dtype.torch}
    if spec.attn_implementation is not None:
        kwargs["attn_implementation"] = spec.attn_implementation
    model = cls._from_config(config, **kwargs)
    if spec.head.loss_type and getattr(model, "loss_type", None) is None:
        model.loss_type = spec.head.loss_type  # transformers guesses it from the class name
    ids = torch.randint(0, config.vocab_size, (batch_size, spec.seq))
    labels = ids
    if spec.head in (Head.SEQUENCE_CLASSIFICATION, Head.TOKEN_CLASSIFICATION):
        shape = (batch_size,) if spec.head is Head.SEQUENCE_CLASSIFICATION else ids.shape
        labels = torch.randint(0, config.num_labels, shape)
    w = Workload(model.train(), (ids, labels), (), output_loss)
    return finish(w, spec.options, f"hf:{spec.name}")


# NOTE [ Checkpointed transformers on meta ]
# Without a cache, transformers' masking decides whether a batch holds packed
# sequences by reading the position ids' values (masking_utils.py,
# `_preprocess_mask_arguments` -> `find_packed_sequence_indices`: `.all()`
# of a tensor), which the meta device cannot. A model's default `use_cache`
# gives it a cache, but gradient checkpointing turns the cache off (utils/
# generic.py, `merge_with_config_defaults`), so a checkpointed llama would
# capture only on cpu. With gradient checkpointing the builder therefore
# passes an empty `DynamicCache` as the model's cache argument (`cache`, or
# `past_key_values` in older models); checkpointed layers never write it
# (modeling_layers.py, `GradientCheckpointingLayer` drops it), so it stays
# empty and costs nothing, and the mask is what an unpacked batch gets
# (none: sdpa's `is_causal`). Lost from the trace: the check's few int64
# ops over (batch, seq). The same is done on cpu, so cpu and meta agree.
def _cache_keyword(cls: type) -> str | None:
    """The name of `cls.forward`'s cache argument, if it has one."""
    params = inspect.signature(cls.forward).parameters
    return next((k for k in ("cache", "past_key_values") if k in params), None)


@functools.cache
def _checkpointed(cls: type, cache_keyword: str) -> type:
    """`cls` with ``forward(input_ids, labels)`` passing an empty cache
    (NOTE [ Checkpointed transformers on meta ]); named as `_with_labels`
    names its classes, so transformers picks the same loss."""
    from transformers import DynamicCache

    class Checkpointed(cls):  # type: ignore[misc, valid-type]
        def forward(self, input_ids: Tensor, labels: Tensor) -> Any:
            cache = {cache_keyword: DynamicCache(config=self.config)}
            with _quiet("transformers.modeling_layers"):  # "Setting `cache=None`": as meant
                return super().forward(input_ids=input_ids, labels=labels, **cache)

    Checkpointed.__name__ = Checkpointed.__qualname__ = f"{cls.__name__}WithLabels"
    return Checkpointed


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    """`logger`'s warnings off, and its level restored after."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        log.setLevel(level)

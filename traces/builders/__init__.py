"""Workloads built by name, and the options every workload is built with.

``tv:NAME`` is a torchvision classification or segmentation model and
``hf:ARCH`` a transformers architecture built from its config class, both
with random weights and nothing downloaded. `ModelOptions` says how any
workload's model is built: its dtype, frozen parameters, LoRA adapters,
gradient checkpointing, and for ``hf:`` its config and sequence length.
`traces.zoo.resolve(name, options)` is the entry point; this package builds:

- `options.py`: `ModelOptions` and the command line's text it is read from;
- `vision.py`: ``tv:`` workloads (torchvision);
- `hf.py`: ``hf:`` workloads (transformers);
- `training.py`: the options applied to any workload's model once built;
- `packages.py`: the optional packages, imported when needed.

torchvision, transformers and peft are imported when a factory runs (or a
name is resolved), each with a one-line message when missing.
"""

from __future__ import annotations

from memplan.traces.builders.hf import (
    DEFAULT_SEQ,
    Head,
    TransformersModel,
    build_transformers,
    transformers_model,
)
from memplan.traces.builders.options import (
    Dtype,
    Kind,
    Lora,
    ModelOptions,
    check_applies,
    parse_assignments,
    parse_freeze,
    parse_lora,
    recorded,
)
from memplan.traces.builders.training import finish, freeze, with_options
from memplan.traces.builders.vision import (
    IMAGE_SIZE,
    SEGMENTATION_CLASSES,
    Task,
    TorchvisionModel,
    build_torchvision,
    segmentation_loss,
    torchvision_model,
)

__all__ = [
    "DEFAULT_SEQ", "IMAGE_SIZE", "SEGMENTATION_CLASSES", "Dtype", "Head", "Kind", "Lora",
    "ModelOptions", "Task", "TorchvisionModel", "TransformersModel", "build_torchvision",
    "build_transformers", "check_applies", "finish", "freeze", "parse_assignments",
    "parse_freeze", "parse_lora", "recorded", "segmentation_loss", "torchvision_model",
    "transformers_model", "with_options",
]  # fmt: skip

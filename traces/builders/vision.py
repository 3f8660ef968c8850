"""``tv:NAME`` workloads: torchvision classification and segmentation
models with random weights and images (NOTE [ torchvision workloads ])."""

from __future__ import annotations

import contextlib
import difflib
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from memplan.traces.builders.options import ModelOptions
from memplan.traces.builders.packages import _ZOO_EXTRA, _package
from memplan.traces.builders.training import finish
from memplan.traces.errors import TraceError
from torch import Tensor

if TYPE_CHECKING:
    from memplan.traces.workload import Workload

IMAGE_SIZE = 224
SEGMENTATION_CLASSES = 21  # PASCAL VOC's 20 classes and background, as torchvision's references


# ---- torchvision ---------------------------------------------------------------------------
class Task(enum.Enum):
    CLASSIFICATION = "classification"
    SEGMENTATION = "segmentation"


# NOTE [ torchvision workloads ]
# `tv:NAME` is any model of `torchvision.models.list_models(module=
# torchvision.models)` (classification, 1000 classes, cross-entropy) or of
# `torchvision.models.segmentation` (21 classes, cross-entropy per pixel on
# the `out` output; `aux_loss=False`, no backbone weights). Detection, video,
# optical-flow and quantized models are refused: their inputs and losses are
# of other shapes. Always `weights=None`. Images are random 3 x S x S with S
# = `image`, else 299 for inception_v3 (its published input) and 224 for
# every other model (segmentation references train on 480 crops: give
# image=480). ViT and MaxViT fix their input size at construction (built
# with `image_size=S`, `input_size=(S, S)`). inception_v3 and googlenet lose
# their auxiliary heads (`aux_logits=False`, as the zoo's inception_v3: the
# step is the main classifier's) and their own init (`init_weights=False`:
# it only changes values, slowly). RegNet computes its widths with torch ops
# and `.tolist()`, which meta cannot: it is built on cpu and moved to meta.
_TV_KWARGS: dict[str, dict[str, Any]] = {
    "inception_v3": {"aux_logits": False, "init_weights": False},
    "googlenet": {"aux_logits": False, "init_weights": False},
}
_TV_IMAGE = {"inception_v3": 299}
_TV_SIZE_KWARG = {"vit_": "image_size", "maxvit_": "input_size"}
_TV_BUILT_ON_CPU = ("regnet_",)


@dataclass(frozen=True, slots=True)
class TorchvisionModel:
    """A resolved ``tv:`` name: what `build_torchvision` builds."""

    name: str
    task: Task
    image: int
    options: ModelOptions


def torchvision_model(name: str, options: ModelOptions) -> TorchvisionModel:
    """The ``tv:NAME`` workload, checked: an unknown name is a one-line
    error naming close matches (NOTE [ torchvision workloads ])."""
    models = _package("torchvision.models", f"tv:{name}", _ZOO_EXTRA)
    classification = models.list_models(module=models)
    segmentation = models.list_models(module=models.segmentation)
    if name in classification:
        task = Task.CLASSIFICATION
    elif name in segmentation:
        task = Task.SEGMENTATION
    else:
        if name in models.list_models():
            raise TraceError(
                f"tv:{name}: not a classification or segmentation model; memplan builds those "
                "of torchvision.models and torchvision.models.segmentation"
            )
        close = difflib.get_close_matches(name, classification + segmentation, n=5, cutoff=0.6)
        hint = f"; did you mean {', '.join('tv:' + c for c in close)}?" if close else ""
        raise TraceError(
            f"tv:{name}: no such torchvision model{hint} (names: "
            "torchvision.models.list_models(module=torchvision.models))"
        )
    image = options.image or _TV_IMAGE.get(name, IMAGE_SIZE)
    if name == "inception_v3" and image < 75:
        raise TraceError(f"tv:inception_v3 --image {image}: inception_v3 needs images of >= 75")
    return TorchvisionModel(name, task, image, options)


def segmentation_loss(output: Mapping[str, Tensor], target: Tensor) -> Tensor:
    """Cross-entropy per pixel of a torchvision segmentation model's ``out``."""
    return F.cross_entropy(output["out"], target)


def build_torchvision(spec: TorchvisionModel, batch_size: int) -> Workload:
    """A factory (with `functools.partial`): the model in train mode, random
    images and labels, the loss, with `spec.options` applied."""
    from memplan.traces.workload import IMAGENET_CLASSES, Workload

    models = _package("torchvision.models", f"tv:{spec.name}", _ZOO_EXTRA)
    builder = models.get_model_builder(spec.name)
    dtype = spec.options.dtype.torch
    s = spec.image
    x = torch.randn(batch_size, 3, s, s, dtype=dtype)
    if spec.task is Task.SEGMENTATION:
        model = builder(
            weights=None, weights_backbone=None, num_classes=SEGMENTATION_CLASSES, aux_loss=False
        )
        y = torch.randint(0, SEGMENTATION_CLASSES, (batch_size, s, s))
        loss: Callable[..., Tensor] = segmentation_loss
    else:
        kwargs = dict(_TV_KWARGS.get(spec.name, {}))
        for prefix, kwarg in _TV_SIZE_KWARG.items():
            if spec.name.startswith(prefix):
                kwargs[kwarg] = s if kwarg == "image_size" else (s, s)
        device = torch.get_default_device()
        on_cpu = device.type == "meta" and spec.name.startswith(_TV_BUILT_ON_CPU)
        with torch.device("cpu") if on_cpu else contextlib.nullcontext():
            model = builder(weights=None, num_classes=IMAGENET_CLASSES, **kwargs)
        model = model.to(device) if on_cpu else model
        y = torch.randint(0, IMAGENET_CLASSES, (batch_size,))
        loss = F.cross_entropy
    model = model.to(dtype)
    return finish(Workload(model.train(), (x,), (y,), loss), spec.options, f"tv:{spec.name}")

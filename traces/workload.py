"""What a training step is made of: `Workload`, and the pieces the model
builders share (`traces/zoo.py`, `traces/builders/`)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn

IMAGENET_CLASSES = 1000


@dataclass(frozen=True, slots=True)
class Workload:
    """One training step's ingredients: ``loss_fn(model(*inputs), *targets)``
    is the scalar loss to call ``backward()`` on."""

    model: nn.Module
    inputs: tuple[Tensor, ...]
    targets: tuple[Tensor, ...]
    loss_fn: Callable[..., Tensor]

    def loss(self) -> Tensor:
        """Run the forward pass and the loss."""
        return self.loss_fn(self.model(*self.inputs), *self.targets)


def output_loss(output: Any) -> Tensor:
    """The ``.loss`` a Hugging Face model computed from the labels it was given."""
    return output.loss


@functools.cache
def with_labels(cls: type) -> type:
    """`cls` (a Hugging Face model class) with ``forward(input_ids, labels)``,
    so capture's ``model(*inputs)`` passes the labels. A subclass, not a
    wrapper module: parameter and module paths stay Hugging Face's own."""

    class WithLabels(cls):  # type: ignore[misc, valid-type]
        def forward(self, input_ids: Tensor, labels: Tensor) -> Any:
            return super().forward(input_ids=input_ids, labels=labels)

    # transformers picks the loss from the class name ("...ForMaskedLM"): keep it in
    WithLabels.__name__ = WithLabels.__qualname__ = f"{cls.__name__}WithLabels"
    return WithLabels

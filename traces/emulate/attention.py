"""`F.scaled_dot_product_attention` as the target runs it (placeholder: math)."""

from __future__ import annotations

from collections.abc import Mapping

from memplan.traces.target import Target


def host_outputs(target: Target) -> Mapping[str, tuple[int, ...]]:
    return {}

"""The shipped traces: present, loadable, and sized like the real models."""

from __future__ import annotations

from pathlib import Path

import pytest
from memplan.traces import io
from memplan.traces.model import BufferKind, Phase

DATA = Path(__file__).resolve().parents[2] / "traces" / "data"
# Published parameter counts (torchvision / Hugging Face model cards).
PARAMS = {
    "resnet50": 25_557_032,
    "vgg16": 138_357_544,
    "densenet121": 7_978_856,
    "gpt2": 124_439_808,
}
SHIPPED = ["resnet50", "vgg16", "inception_v3", "densenet121", "bert_base", "gpt2"]


@pytest.mark.parametrize("model", SHIPPED)
def test_shipped_trace_loads_and_is_consistent(model):
    trace = io.load(DATA / f"{model}_b16_adam.json.gz")
    assert trace.meta.model == model and trace.meta.batch_size == 16
    assert trace.meta.optimizer == "adam"
    by_kind = trace.bytes_by_kind()
    assert by_kind[BufferKind.OPTIMIZER_STATE] == 2 * by_kind[BufferKind.PARAM]
    assert by_kind[BufferKind.GRAD] <= by_kind[BufferKind.PARAM]
    assert set(trace.ops_by_phase().values()) and all(trace.ops_by_phase()[p] for p in Phase)
    peak, _ = trace.peak("framework")
    assert trace.peak("liveness")[0] <= peak


@pytest.mark.parametrize("model", sorted(PARAMS))
def test_parameter_bytes_are_four_per_parameter(model):
    trace = io.load(DATA / f"{model}_b16_adam.json.gz")
    assert trace.bytes_by_kind()[BufferKind.PARAM] == 4 * PARAMS[model]


def test_shipped_folder_stays_small():
    assert sum(p.stat().st_size for p in DATA.glob("*")) < 40 * 2**20

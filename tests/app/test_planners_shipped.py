"""Every heuristic planner on all six shipped traces: its plans pass `check`,
simulate without OOM and never raise the peak above vanilla; under a budget
the simulated peak fits or the row says infeasible."""

from __future__ import annotations

from pathlib import Path

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.traces import io

from memplan.comparison import compare_planners

DATA = Path(__file__).resolve().parents[2] / "traces" / "data"
MODELS = ["resnet50", "vgg16", "inception_v3", "densenet121", "bert_base", "gpt2"]
PLANNERS = ["release_only", "tensile", "capuchin", "vdnn", "checkpoint"]


@pytest.mark.slow
@pytest.mark.parametrize("model", MODELS)
def test_planners_on_shipped_traces(model):
    trace = io.load(DATA / f"{model}_b16_adam.json.gz")
    hw, latency = load_hardware("a100-sxm-80gb"), Roofline()
    vanilla_peak = trace.peak("framework")[0]
    free = compare_planners([trace], DeviceModel(hw, latency), PLANNERS)
    for row in free.rows:
        assert row.feasible, (row.planner, row.reason)  # checked, simulated, no OOM
        assert row.peak_bytes <= vanilla_peak, row.planner
    budget = int(0.8 * vanilla_peak)
    tight = compare_planners([trace], DeviceModel(hw, latency), PLANNERS, budget=budget)
    for row in tight.rows:
        assert "check:" not in row.reason and "planner error" not in row.reason, row.reason
        if row.feasible:
            assert row.peak_bytes <= budget, row.planner
        else:
            assert row.reason, row.planner

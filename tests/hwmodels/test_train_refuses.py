"""`latency train` on data that trains nothing: every op class has fewer
than MIN_CLASS_ROWS training rows. One line, exit 2, no model file."""

from __future__ import annotations

import numpy as np
import pytest
from memplan.hwmodels.dataset import Dataset, DatasetMeta, save_dataset
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.mlptrain import MIN_CLASS_ROWS, TrainOptions, train_mlp

from tests.fuzz.harness import assert_clean, assert_rejected, run_cli
from tests.hwmodels.handmade import make, mm

FAST = TrainOptions(hidden=(8,), ensemble=1, epochs=5)


def dataset(n_shapes: int) -> Dataset:
    """`n_shapes` matmuls, each measured once at usage 0 (1 us per MFLOP)."""
    trace = make([mm(16 + k, 32, 64) for k in range(n_shapes)])
    op = np.arange(trace.n_ops)
    flops = np.array([o.flops for o in trace.ops], dtype=np.float64)
    return Dataset(
        DatasetMeta(device="cpu", hardware="hand-cpu"), trace, op, np.zeros(trace.n_ops),
        1e-6 + flops * 1e-12,
    )  # fmt: skip


def test_too_few_rows_train_nothing_and_say_so():
    # 6 shapes, of which the held-out split takes some: under 8 training rows
    assert MIN_CLASS_ROWS == 8
    with pytest.raises(LatencyError, match="no op class has 8 training measurements"):
        train_mlp(dataset(6), FAST)


def test_enough_rows_train_the_class():
    model = train_mlp(dataset(40), FAST)
    assert len(model.nets) == 1


def test_cli_writes_no_model(tmp_path):
    data, out = tmp_path / "d.json.gz", tmp_path / "m.pt"
    save_dataset(dataset(6), data)
    o = run_cli(["latency", "train", str(data), "--out", str(out), "--epochs", "5"], 60.0)
    assert_rejected(o, "no op class has 8 training measurements", "--samples")
    assert not out.exists()
    save_dataset(dataset(40), data)
    o = run_cli(["latency", "train", str(data), "--out", str(out), "--epochs", "5"], 60.0)
    assert_clean(o)
    assert o.code == 0 and out.exists(), o.describe()

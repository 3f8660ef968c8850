"""Scoring latency models against measured microbenchmarks, and fitting the
roofline's per-class efficiencies to them.

Errors are absolute percentage errors |pred - true| / true per measurement
row; a summary gives their median (MdAPE) and the shares within ±10% and
±20%, overall and per op class.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from memplan.hwmodels.dataset import Dataset
from memplan.hwmodels.features import DTYPE_NAMES, op_costs
from memplan.hwmodels.latency import DEFAULT_EFFICIENCY, LatencyModel, Roofline, usage_stretch
from memplan.hwmodels.opclass import OP_CLASSES, OpClass
from memplan.hwmodels.profile import Hardware


@dataclass(frozen=True, slots=True)
class ErrorSummary:
    """`mdape` and the `within_*` shares are fractions (0.1 = 10%)."""

    n: int
    mdape: float
    within_10: float
    within_20: float


def summarize(pred: np.ndarray, true: np.ndarray) -> ErrorSummary:
    ape = np.abs(np.asarray(pred) - np.asarray(true)) / np.asarray(true)
    if len(ape) == 0:
        return ErrorSummary(0, float("nan"), float("nan"), float("nan"))
    return ErrorSummary(
        int(len(ape)), float(np.median(ape)), float((ape <= 0.1).mean()), float((ape <= 0.2).mean())
    )


def row_classes(ds: Dataset) -> np.ndarray:
    """The op class index (into `OP_CLASSES`) of every measurement row."""
    return op_costs(ds.trace).cls[ds.op]


def evaluate(
    model: LatencyModel, ds: Dataset, hw: Hardware, rows: np.ndarray | None = None
) -> dict[str, ErrorSummary]:
    """Error summaries over `rows` (default: the held-out split), keyed by
    op class value, plus "all"."""
    rows = ds.heldout() if rows is None else rows
    pred = model.predict_ops(ds.trace, hw, ds.op[rows], ds.usage[rows])
    true = ds.latency_s[rows]
    cls = row_classes(ds)[rows]
    out = {"all": summarize(pred, true)}
    for i, c in enumerate(OP_CLASSES):
        sel = cls == i
        if sel.any():
            out[c.value] = summarize(pred[sel], true[sel])
    return out


def fit_efficiency(ds: Dataset, hw: Hardware, rows: np.ndarray | None = None) -> dict[str, float]:
    """Per op class, the roofline efficiency that minimises the median absolute
    log error over `rows` (default: the training split), by a grid search
    over 10^-3 .. 10^1. Classes without rows keep the default."""
    rows = ~ds.heldout() if rows is None else rows
    c = op_costs(ds.trace)
    model = Roofline()
    ops = ds.op[rows]
    usage, true = ds.usage[rows], ds.latency_s[rows]
    peak = np.array(
        [model._peak(hw, DTYPE_NAMES[d], OP_CLASSES[k]) for k, d in zip(c.cls[ops], c.dtype[ops])]
    )
    ideal = np.maximum(
        c.flops[ops] / peak, (c.bytes_read[ops] + c.bytes_written[ops]) / hw.mem_bw_bytes_per_s
    )
    grid = np.logspace(-3, 1, 401)
    out: dict[str, float] = {}
    for i, k in enumerate(OP_CLASSES):
        sel = c.cls[ops] == i
        if k is OpClass.VIEW or not sel.any():
            continue
        pred = (hw.launch_overhead_s + ideal[sel][None, :] / grid[:, None]) * usage_stretch(
            usage[sel]
        )
        err = np.median(np.abs(np.log(pred / true[sel])), axis=1)
        out[k.value] = float(grid[int(np.argmin(err))])
    for k, v in DEFAULT_EFFICIENCY.items():
        if k is not OpClass.VIEW:
            out.setdefault(k.value, v)
    return out

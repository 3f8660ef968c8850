"""Training `MLPLatency` on a microbenchmark dataset (see NOTE [ MLP target ])."""

from __future__ import annotations

import contextlib
import datetime
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
from memplan.hwmodels.dataset import Dataset
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.features import class_features, feature_names, op_costs
from memplan.hwmodels.latency import MAX_USAGE
from memplan.hwmodels.mlp import Baseline, ClassNet, FeatureSpec, Layers, MLPLatency, MLPMeta
from memplan.hwmodels.opclass import OpClass

MIN_CLASS_ROWS = 8  # training rows an op class needs to get its networks


@dataclass(frozen=True, slots=True)
class TrainOptions:
    """TENSILE uses a four-layer MLP: here three hidden ReLU layers and a linear
    output, `ensemble` of them per class (seeds seed, seed+1, ...)."""

    hidden: tuple[int, ...] = (32, 32, 16)
    ensemble: int = 5
    epochs: int = 1000  # on the shipped CPU data: held-out MdAPE 5.0% at 400, 4.7% at 1000
    lr: float = 3e-3
    weight_decay: float = 1e-4
    seed: int = 0
    heldout_fraction: float = 0.2
    loss: str = "l1"  # of log latency: l1 fits the typical op, mse the mean

    def __post_init__(self) -> None:
        if not self.hidden or any(h < 1 for h in self.hidden):
            raise LatencyError(f"hidden={list(self.hidden)}: need at least one layer, sizes >= 1")
        if self.ensemble < 1 or self.epochs < 1 or self.lr <= 0:
            raise LatencyError("ensemble and epochs must be >= 1, lr > 0")
        if self.loss not in ("l1", "mse"):
            raise LatencyError(f"loss={self.loss!r} must be 'l1' or 'mse'")


def fit_baseline(ds: Dataset, rows: np.ndarray) -> Baseline:
    """The roofline constants from the data: the 95th percentile of achieved
    FLOP/s and bytes/s and the 1st percentile of latency, each from the
    latency the op would take alone (latency x (1 - usage))."""
    c = op_costs(ds.trace)
    ops = ds.op[rows]
    alone = ds.latency_s[rows] * (1.0 - np.minimum(ds.usage[rows], MAX_USAGE))
    flops, nbytes = c.flops[ops], c.bytes_read[ops] + c.bytes_written[ops]
    has_flops = flops > 0
    if not has_flops.any() or not len(alone):
        raise LatencyError("dataset: no conv or matmul measurements to fit a baseline on")
    return Baseline(
        flops_per_s=float(np.quantile(flops[has_flops] / alone[has_flops], 0.95)),
        bytes_per_s=float(np.quantile(nbytes / alone, 0.95)),
        overhead_s=float(np.quantile(alone, 0.01)),
    )


@contextlib.contextmanager
def _one_thread(torch: Any) -> Iterator[None]:
    """Small full-batch training is fastest on one thread (and does not fight
    whatever else runs on the machine)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def train_mlp(
    ds: Dataset,
    options: TrainOptions | None = None,
    progress: Callable[[OpClass, int], None] | None = None,
) -> MLPLatency:
    """Train the networks of every op class on the dataset's training split
    (every shape outside the held-out split), minimising the squared error of
    log latency. `progress(class, n_rows)` after each class."""
    import torch

    opts = options or TrainOptions()
    train = ~ds.heldout(opts.heldout_fraction)
    if not train.any():
        raise LatencyError("dataset: no measurements outside the held-out split")
    baseline = fit_baseline(ds, train)
    costs = op_costs(ds.trace)
    base_s = baseline.seconds(costs.flops, costs.bytes_read + costs.bytes_written)
    nets: dict[OpClass, ClassNet] = {}
    n_train = 0
    with _one_thread(torch):
        for c, cf in class_features(ds.trace).items():
            row_of = np.full(ds.trace.n_ops, -1, np.int64)
            row_of[cf.ops] = np.arange(len(cf.ops))
            rows = np.flatnonzero(train & (row_of[ds.op] >= 0))
            if len(rows) < MIN_CLASS_ROWS:
                continue
            idx = row_of[ds.op[rows]]
            X = cf.X[idx]
            names = tuple(cf.op_names[i] for i in idx)
            usage = np.minimum(ds.usage[rows], MAX_USAGE)
            std = X.std(axis=0)
            spec = FeatureSpec(
                c, feature_names(c), tuple(sorted({p for t in names for p in t.split("/")})),
                tuple(X.mean(axis=0)),
                tuple(np.where(std > 1e-9, std, 1.0)), tuple(X.min(axis=0)),
                tuple(X.max(axis=0)), float(usage.max()),
            )  # fmt: skip
            Z, ok, _ = spec.design(X, names)
            assert ok.all(), "training rows lie inside their own range"
            Zu = np.hstack([Z, usage[:, None]])
            # NOTE [ MLP target ]: log latency over baseline x stretch
            y = np.log(ds.latency_s[rows] * (1.0 - usage) / base_s[ds.op[rows]])
            members = [_fit(Zu, y, opts, opts.seed + k, torch) for k in range(opts.ensemble)]
            nets[c] = ClassNet(spec, members)
            n_train += len(rows)
            if progress is not None:
                progress(c, len(rows))
    if not nets:
        raise LatencyError(
            f"dataset: no op class has {MIN_CLASS_ROWS} training measurements, so nothing would "
            f"be trained ({int(train.sum())} training rows in all); measure more shapes "
            "(`memplan microbench --samples`)"
        )
    meta = MLPMeta(
        hardware=ds.meta.hardware,
        baseline=baseline,
        description=ds.meta.description,
        device=ds.meta.device,
        torch_version=ds.meta.torch_version,
        dataset_created=ds.meta.created,
        n_train=n_train,
        hidden=tuple(opts.hidden),
        ensemble=opts.ensemble,
        epochs=opts.epochs,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    return MLPLatency(nets, meta)


def _fit(Z: np.ndarray, y: np.ndarray, opts: TrainOptions, seed: int, torch: Any) -> Layers:
    """Full-batch Adam with cosine decay, float32; returns float64 numpy layers."""
    gen = torch.Generator().manual_seed(seed)
    sizes = [Z.shape[1], *opts.hidden, 1]
    linears = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        lin = torch.nn.Linear(a, b)
        bound = math.sqrt(6.0 / a)  # He-uniform, for ReLU
        with torch.no_grad():
            lin.weight.uniform_(-bound, bound, generator=gen)
            lin.bias.zero_()
        linears.append(lin)
    with torch.no_grad():  # start at the mean target and near-zero slope
        linears[-1].weight.mul_(0.1)
        linears[-1].bias.fill_(float(y.mean()))
    layers: list[Any] = []
    for lin in linears[:-1]:
        layers += [lin, torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, linears[-1])
    Zt = torch.from_numpy(Z.astype(np.float32))
    yt = torch.from_numpy(y.astype(np.float32))[:, None]
    optim = torch.optim.AdamW(model.parameters(), lr=opts.lr, weight_decay=opts.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=opts.epochs)
    for _ in range(opts.epochs):
        optim.zero_grad(set_to_none=True)
        diff = model(Zt) - yt
        loss = diff.abs().mean() if opts.loss == "l1" else (diff**2).mean()
        loss.backward()
        optim.step()
        sched.step()
    return [
        (lin.weight.detach().double().numpy().T.copy(), lin.bias.detach().double().numpy().copy())
        for lin in linears
    ]

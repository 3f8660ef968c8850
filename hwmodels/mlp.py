"""TENSILE's latency predictor (§IV-A): one small MLP per op class.

Inputs: the op's log-scaled dims and parameters (`hwmodels.features`), a
one-hot of its name within the class, and `usage` (the fraction of the
device busy with other work). Output: log latency in seconds. Trained with
torch on microbenchmarks (`hwmodels.microbench`); inference runs in numpy on
weights extracted once, over feature matrices cached per trace.

# NOTE [ MLP fallback ]
An MLP interpolates; outside the shapes it saw it can be wildly wrong. Per
class the model keeps the training range of every input feature; an op with
any feature beyond that range (by more than `RANGE_MARGIN` of the range's
width), a name the class never saw, or a class with no network, is timed by
the fallback model (the roofline on the same hardware) instead.
`MLPLatency.last_stats` says how many ops took each path and why.
"""

from __future__ import annotations

import datetime
import io
import math
import os
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hwmodels.dataset import Dataset
from hwmodels.errors import LatencyError
from hwmodels.features import class_features, feature_names, op_costs, single_op_features
from hwmodels.latency import LatencyModel, Roofline, check_usage, usage_stretch
from hwmodels.opclass import OP_CLASSES, OpClass
from hwmodels.profile import Hardware
from traces.io import atomic_write_bytes
from traces.model import Op, Trace

SCHEMA = "memplan.mlp/1"
RANGE_MARGIN = 0.1
DATA_DIR = Path(__file__).parent / "data"
DEFAULT_MODEL = DATA_DIR / "cpu-local.mlp.pt"
DEFAULT_DATASET = DATA_DIR / "cpu-local.microbench.json.gz"


@dataclass(frozen=True, slots=True)
class FeatureSpec:
    """What a class's network reads: feature `names`, the one-hot `vocab` of
    op names, normalisation (`mean`, `std`) and the training range (`lo`, `hi`)."""

    op_class: OpClass
    names: tuple[str, ...]
    vocab: tuple[str, ...]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    lo: tuple[float, ...]
    hi: tuple[float, ...]
    usage_max: float = 1.0

    def design(
        self, feats: np.ndarray, op_names: tuple[str, ...]
    ) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """(inputs without the usage column, ok mask, reason per rejected row)."""
        lo, hi = np.asarray(self.lo), np.asarray(self.hi)
        margin = RANGE_MARGIN * (hi - lo)
        below, above = feats < lo - margin - 1e-9, feats > hi + margin + 1e-9
        out_of_range = (below | above).any(axis=1)
        index = {n: i for i, n in enumerate(self.vocab)}
        col = np.array([index.get(n, -1) for n in op_names], np.int64)
        unknown = col < 0
        ok = ~out_of_range & ~unknown
        onehot = np.zeros((len(feats), len(self.vocab)))
        onehot[np.flatnonzero(~unknown), col[~unknown]] = 1.0
        Z = np.hstack([(feats - np.asarray(self.mean)) / np.asarray(self.std), onehot])
        reasons = []
        for i in np.flatnonzero(~ok):
            if unknown[i]:
                reasons.append(f"op {op_names[i]} not in training set")
            else:
                j = int(np.flatnonzero(below[i] | above[i])[0])
                reasons.append(f"outside training range: {self.names[j]}")
        return Z, ok, reasons


@dataclass(frozen=True, slots=True)
class MLPMeta:
    """Where the training data was measured, and how the model was trained."""

    hardware: str
    description: str = ""
    device: str = "cpu"
    torch_version: str = ""
    dataset_created: str = ""
    n_train: int = 0
    hidden: tuple[int, ...] = (64, 64, 32)
    epochs: int = 0
    created: str = ""


@dataclass(frozen=True, slots=True)
class MLPStats:
    """How the last `predict_all` timed the trace's ops."""

    n_ops: int
    n_mlp: int
    n_view: int
    n_fallback: int
    fallback_by_class: dict[str, int] = field(default_factory=dict)
    fallback_by_reason: dict[str, int] = field(default_factory=dict)
    n_usage_extrapolated: int = 0


@dataclass(frozen=True, eq=False)
class _Designs:
    """Per trace: class index and row of each op in its class's accepted
    design matrix (-1: fallback), the fallback reason, the matrices."""

    cls: np.ndarray
    pos: np.ndarray
    reason: np.ndarray
    Z: dict[OpClass, np.ndarray]


class _Net:
    """A feed-forward ReLU network in numpy: [(W, b), ...], last layer linear."""

    def __init__(self, spec: FeatureSpec, layers: list[tuple[np.ndarray, np.ndarray]]):
        self.spec = spec
        self.layers = layers

    def forward(self, Z: np.ndarray) -> np.ndarray:
        h = Z
        for i, (W, b) in enumerate(self.layers):
            h = h @ W + b
            if i < len(self.layers) - 1:
                np.maximum(h, 0.0, out=h)
        return h[:, 0]


class MLPLatency(LatencyModel):
    """Per-class MLPs with a roofline fallback (see NOTE [ MLP fallback ])."""

    name = "mlp"

    def __init__(
        self,
        nets: dict[OpClass, _Net],
        meta: MLPMeta,
        fallback: LatencyModel | None = None,
    ):
        self.nets = nets
        self.meta = meta
        self.fallback = fallback or Roofline()
        self.last_stats: MLPStats | None = None
        self._design: weakref.WeakKeyDictionary[Trace, _Designs] = weakref.WeakKeyDictionary()

    # ---- prediction -----------------------------------------------------------
    def _check_hw(self, hw: Hardware) -> None:
        if hw.name != self.meta.hardware:
            raise LatencyError(
                f"MLP latency model was measured on {self.meta.hardware!r}, not {hw.name!r}; "
                f"use the roofline for {hw.name!r} or measure it with `memplan microbench`"
            )

    def _designs(self, trace: Trace) -> _Designs:
        got = self._design.get(trace)
        if got is None:
            pos = np.full(trace.n_ops, -1, np.int64)
            reason = np.full(trace.n_ops, None, object)
            Z: dict[OpClass, np.ndarray] = {}
            for c, cf in class_features(trace).items():
                net = self.nets.get(c)
                if net is None:
                    reason[cf.ops] = f"no model for class {c.value}"
                    continue
                Zc, ok, reasons = net.spec.design(cf.X, cf.op_names)
                Z[c] = Zc[ok]
                pos[cf.ops[ok]] = np.arange(int(ok.sum()))
                for i, r in zip(cf.ops[~ok], reasons, strict=True):
                    reason[i] = r
            got = self._design[trace] = _Designs(op_costs(trace).cls, pos, reason, Z)
        return got

    def predict_all(self, trace: Trace, hw: Hardware, usage: float = 0.0) -> np.ndarray:
        usage = check_usage(usage)
        return self.predict_ops(trace, hw, np.arange(trace.n_ops), np.full(trace.n_ops, usage))

    def predict_ops(
        self, trace: Trace, hw: Hardware, ops: np.ndarray, usage: np.ndarray
    ) -> np.ndarray:
        """Seconds for `ops[i]` under `usage[i]`; sets `last_stats`."""
        self._check_hw(hw)
        ops = np.asarray(ops, np.int64)
        usage = np.broadcast_to(np.asarray(usage, np.float64), ops.shape)
        if len(usage) and (usage.min() < 0 or usage.max() > 1):
            raise LatencyError("usage values must be fractions of the device in [0, 1]")
        out = np.array(self.fallback.predict_ops(trace, hw, ops, usage), np.float64, copy=True)
        d = self._designs(trace)
        n_mlp = n_extra = 0
        for c, Zc in d.Z.items():
            sel = (d.cls[ops] == OP_CLASSES.index(c)) & (d.pos[ops] >= 0)
            if not sel.any():
                continue
            u = usage[sel]
            # NOTE [ Usage ]: beyond the usage it saw, the model scales by the
            # time-sharing stretch from the highest usage it saw
            u_in = np.minimum(u, self.nets[c].spec.usage_max)
            Z = np.hstack([Zc[d.pos[ops[sel]]], u_in[:, None]])
            out[sel] = np.exp(self.nets[c].forward(Z)) * usage_stretch(u) / usage_stretch(u_in)
            n_mlp += int(sel.sum())
            n_extra += int((u > u_in).sum())
        why = d.reason[ops]
        fb = np.flatnonzero(why != None)  # noqa: E711 -- elementwise over an object array
        by_class: dict[str, int] = {}
        by_reason: dict[str, int] = {}
        for i in fb:
            k = OP_CLASSES[d.cls[ops[i]]].value
            by_class[k] = by_class.get(k, 0) + 1
            by_reason[why[i]] = by_reason.get(why[i], 0) + 1
        n_view = int((d.cls[ops] == OP_CLASSES.index(OpClass.VIEW)).sum())
        self.last_stats = MLPStats(len(ops), n_mlp, n_view, len(fb), by_class, by_reason, n_extra)
        return out

    def predict(self, op: Op, trace: Trace, hw: Hardware, usage: float = 0.0) -> float:
        self._check_hw(hw)
        usage = check_usage(usage)
        c, row, name = single_op_features(op, trace)
        net = self.nets.get(c)
        if row is None or net is None:
            return self.fallback.predict(op, trace, hw, usage)
        Z, ok, _ = net.spec.design(row[None, :], (name,))
        if not ok[0]:
            return self.fallback.predict(op, trace, hw, usage)
        u_in = min(usage, net.spec.usage_max)
        y = float(np.exp(net.forward(np.hstack([Z, [[u_in]]]))[0]))
        return y * float(usage_stretch(usage) / usage_stretch(u_in))

    # ---- files -------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """torch.save of plain tensors, lists and strings (loadable with
        `weights_only=True`), written atomically."""
        import torch

        doc: dict[str, Any] = {"schema": SCHEMA, "meta": asdict(self.meta), "classes": {}}
        doc["meta"]["hidden"] = list(self.meta.hidden)
        for c, net in self.nets.items():
            spec = asdict(net.spec)
            spec["op_class"] = c.value
            spec = {k: list(v) if isinstance(v, tuple) else v for k, v in spec.items()}
            doc["classes"][c.value] = {
                "spec": spec,
                "weights": [torch.from_numpy(W.copy()) for W, _ in net.layers],
                "biases": [torch.from_numpy(b.copy()) for _, b in net.layers],
            }
        buf = io.BytesIO()
        torch.save(doc, buf)
        atomic_write_bytes(path, buf.getvalue())

    @classmethod
    def load(
        cls, path: str | os.PathLike[str] | None = None, fallback: LatencyModel | None = None
    ) -> MLPLatency:
        """Load a saved model (the shipped CPU model by default)."""
        import torch

        p = Path(path) if path is not None else DEFAULT_MODEL
        try:
            doc = torch.load(io.BytesIO(p.read_bytes()), weights_only=True)
        except FileNotFoundError:
            raise LatencyError(f"{p}: no such latency model") from None
        except Exception as e:  # torch raises many types for a bad archive
            raise LatencyError(
                f"{p}: not a saved latency model: {str(e).splitlines()[0]}"
            ) from None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise LatencyError(f"{p}: schema: expected {SCHEMA!r}")
        try:
            md = dict(doc["meta"])
            md["hidden"] = tuple(md.get("hidden", ()))
            meta = MLPMeta(**md)
            nets = {}
            for key, entry in doc["classes"].items():
                s = dict(entry["spec"])
                c = OpClass(s.pop("op_class"))
                spec = FeatureSpec(
                    op_class=c, **{k: tuple(v) if isinstance(v, list) else v for k, v in s.items()}
                )
                if spec.names != feature_names(c):
                    raise LatencyError(
                        f"{p}: classes.{key}: features {list(spec.names)} do not match this "
                        f"version's {list(feature_names(c))}; retrain with `memplan latency train`"
                    )
                layers = [
                    (W.double().numpy(), b.double().numpy())
                    for W, b in zip(entry["weights"], entry["biases"], strict=True)
                ]
                nets[c] = _Net(spec, layers)
        except (KeyError, TypeError, ValueError) as e:
            raise LatencyError(f"{p}: malformed latency model ({e})") from None
        return cls(nets, meta, fallback)


# ---- training -----------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class TrainOptions:
    """TENSILE uses a four-layer MLP: three hidden ReLU layers and a linear output."""

    hidden: tuple[int, ...] = (64, 64, 32)
    epochs: int = 3000
    lr: float = 3e-3
    weight_decay: float = 1e-5
    seed: int = 0
    heldout_fraction: float = 0.2


def train_mlp(ds: Dataset, options: TrainOptions | None = None) -> MLPLatency:
    """Train one network per op class on the dataset's training split (every
    shape outside the held-out split), minimising squared error of log latency."""
    import torch

    opts = options or TrainOptions()
    train_rows = ~ds.heldout(opts.heldout_fraction)
    feats = class_features(ds.trace)
    nets: dict[OpClass, _Net] = {}
    n_train = 0
    for c, cf in feats.items():
        row_of = {int(o): i for i, o in enumerate(cf.ops)}
        rows = [r for r in np.flatnonzero(train_rows) if int(ds.op[r]) in row_of]
        if len(rows) < 8:
            continue
        idx = np.array([row_of[int(ds.op[r])] for r in rows])
        X = cf.X[idx]
        names = tuple(cf.op_names[i] for i in idx)
        lo, hi = X.min(axis=0), X.max(axis=0)
        mean, std = X.mean(axis=0), X.std(axis=0)
        std = np.where(std > 1e-9, std, 1.0)
        vocab = tuple(sorted(set(names)))
        usage = ds.usage[rows]
        spec = FeatureSpec(c, feature_names(c), vocab, tuple(mean), tuple(std), tuple(lo),
                           tuple(hi), float(usage.max()))  # fmt: skip
        Z, ok, _ = spec.design(X, names)
        assert ok.all(), "training rows are inside their own range"
        Zu = np.hstack([Z, usage[:, None]])
        y = np.log(ds.latency_s[rows])
        layers = _fit(Zu, y, opts, torch)
        nets[c] = _Net(spec, layers)
        n_train += len(rows)
    meta = MLPMeta(
        hardware=ds.meta.hardware,
        description=ds.meta.description,
        device=ds.meta.device,
        torch_version=ds.meta.torch_version,
        dataset_created=ds.meta.created,
        n_train=n_train,
        hidden=tuple(opts.hidden),
        epochs=opts.epochs,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
    )
    return MLPLatency(nets, meta)


def _fit(
    Z: np.ndarray, y: np.ndarray, opts: TrainOptions, torch: Any
) -> list[tuple[np.ndarray, np.ndarray]]:
    gen = torch.Generator().manual_seed(opts.seed)
    sizes = [Z.shape[1], *opts.hidden, 1]
    linears = []
    for a, b in zip(sizes[:-1], sizes[1:], strict=True):
        lin = torch.nn.Linear(a, b, dtype=torch.float64)
        bound = math.sqrt(6.0 / a)  # He-uniform for ReLU
        with torch.no_grad():
            lin.weight.uniform_(-bound, bound, generator=gen)
            lin.bias.zero_()
        linears.append(lin)
    model = torch.nn.Sequential(
        *(m for lin in linears[:-1] for m in (lin, torch.nn.ReLU())), linears[-1]
    )
    with torch.no_grad():  # start the output at the mean log latency
        linears[-1].bias.fill_(float(y.mean()))
    Zt, yt = torch.from_numpy(Z), torch.from_numpy(y)[:, None]
    optim = torch.optim.Adam(model.parameters(), lr=opts.lr, weight_decay=opts.weight_decay)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=opts.epochs)
    for _ in range(opts.epochs):
        optim.zero_grad(set_to_none=True)
        loss = torch.mean((model(Zt) - yt) ** 2)
        loss.backward()
        optim.step()
        sched.step()
    return [
        (lin.weight.detach().numpy().T.copy(), lin.bias.detach().numpy().copy()) for lin in linears
    ]

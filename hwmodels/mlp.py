"""TENSILE's latency predictor (§IV-A): one small MLP per op class.

Inputs: the op's log-scaled dims and parameters (`hwmodels.features`), a
one-hot of its name (and cost family, for pointwise ops), and `usage` (the
share of the device other work takes). Trained with torch on microbenchmarks
(`hwmodels.microbench`, `hwmodels.mlptrain`); inference runs in numpy on
weights extracted once, over feature matrices cached per trace.

See NOTE [ MLP target ] and NOTE [ MLP fallback ].
"""

from __future__ import annotations

import enum
import io
import math
import os
import weakref
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.features import (
    class_features,
    feature_names,
    op_costs,
    single_op_cost,
    single_op_features,
)
from memplan.hwmodels.latency import LatencyModel, Roofline, check_usage, usage_stretch
from memplan.hwmodels.opclass import OP_CLASSES, OpClass
from memplan.hwmodels.profile import Hardware
from memplan.traces import fields
from memplan.traces.io import atomic_write_bytes
from memplan.traces.model import Op, Trace

SCHEMA = "memplan.mlp/1"
RANGE_MARGIN = 0.1
DATA_DIR = Path(__file__).parent / "data"
# The shipped CPU data and model, measured and trained on the development machine:
#   memplan microbench --device cpu --samples 1000 --usage 0,0.5,1 --seed 0 \
#       --out hwmodels/data/cpu-local.microbench.json.gz \
#       --profile-out hwmodels/profiles/cpu-local.toml
#   memplan latency train hwmodels/data/cpu-local.microbench.json.gz \
#       --out hwmodels/data/cpu-local.mlp.pt
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
        # a token is "name" or "family/name" (NOTE [ Elementwise families ]):
        # its first part must be known; every known part gets its column
        index = {n: i for i, n in enumerate(self.vocab)}
        onehot = np.zeros((len(feats), len(self.vocab)))
        unknown = np.zeros(len(feats), bool)
        for i, token in enumerate(op_names):
            parts = token.split("/")
            if parts[0] not in index:
                unknown[i] = True
                continue
            for part in parts:
                if part in index:
                    onehot[i, index[part]] = 1.0
        ok = ~out_of_range & ~unknown
        Z = np.hstack([(feats - np.asarray(self.mean)) / np.asarray(self.std), onehot])
        reasons = []
        for i in np.flatnonzero(~ok):
            if unknown[i]:
                reasons.append(f"op {op_names[i].split('/')[-1]} not in training set")
            else:
                j = int(np.flatnonzero(below[i] | above[i])[0])
                reasons.append(f"outside training range: {self.names[j]}")
        return Z, ok, reasons


# NOTE [ MLP target ]
# A network does not predict seconds directly but the log of an op's latency
# relative to two known effects, which it then only has to correct:
#     t = base(op) * stretch(usage) * exp(mean_k net_k(features, usage))
# - base(op) = overhead + max(flops / F, bytes / B): a roofline whose three
#   constants are fitted on the training data (`Baseline`), so a conv twice
#   the FLOPs starts out twice as slow and the net learns efficiency, not scale;
# - stretch(usage) = 1 / (1 - usage): time-sharing (NOTE [ Usage ] in
#   `hwmodels.latency`); the net still sees `usage` and learns how far each
#   op class departs from it;
# - k networks (an ensemble over seeds) are averaged in log space.
@dataclass(frozen=True, slots=True)
class Baseline:
    """The roofline the networks correct: seconds = overhead_s +
    max(flops / flops_per_s, bytes / bytes_per_s) (see NOTE [ MLP target ])."""

    flops_per_s: float
    bytes_per_s: float
    overhead_s: float

    def seconds(self, flops: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        return self.overhead_s + np.maximum(flops / self.flops_per_s, nbytes / self.bytes_per_s)


@dataclass(frozen=True, slots=True)
class MLPMeta:
    """Where the training data was measured, and how the model was trained."""

    hardware: str
    baseline: Baseline
    description: str = ""
    device: str = "cpu"
    torch_version: str = ""
    dataset_created: str = ""
    n_train: int = 0
    hidden: tuple[int, ...] = (32, 32, 16)
    ensemble: int = 1
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
    design matrix (-1: fallback), the fallback reason, the matrices, and
    each op's baseline seconds."""

    cls: np.ndarray
    pos: np.ndarray
    reason: np.ndarray
    Z: dict[OpClass, np.ndarray]
    base_s: np.ndarray
    memo: dict[tuple[int, float], tuple[Hardware, np.ndarray, MLPStats | None]] = field(
        default_factory=dict
    )


Layers = list[tuple[np.ndarray, np.ndarray]]


class ClassNet:
    """The networks of one op class (an ensemble): feed-forward ReLU nets in
    numpy, [(W, b), ...] each, the last layer linear; outputs averaged."""

    def __init__(self, spec: FeatureSpec, members: list[Layers]):
        self.spec = spec
        self.members = members

    def forward(self, Z: np.ndarray) -> np.ndarray:
        total = np.zeros(len(Z))
        for layers in self.members:
            h = Z
            for i, (W, b) in enumerate(layers):
                h = h @ W + b
                if i < len(layers) - 1:
                    np.maximum(h, 0.0, out=h)
            total += h[:, 0]
        return total / len(self.members)


# NOTE [ MLP fallback ]
# An MLP interpolates; outside the shapes it saw it can be wildly wrong. Per
# class the model keeps the training range of every input feature; an op with
# any feature beyond that range (by more than `RANGE_MARGIN` of the range's
# width), a name the class never saw, or a class with no network, is timed by
# the fallback model (the roofline on the same hardware) instead. A usage above
# the highest it saw is fed in clipped, and the stretch covers the rest.
# `MLPLatency.last_stats` says how many ops took each path and why.
class MLPLatency(LatencyModel):
    """Per-class MLPs with a roofline fallback (see NOTE [ MLP fallback ])."""

    name = "mlp"

    def __init__(
        self,
        nets: dict[OpClass, ClassNet],
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
            costs = op_costs(trace)
            base = self.meta.baseline.seconds(costs.flops, costs.bytes_read + costs.bytes_written)
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
            got = self._design[trace] = _Designs(costs.cls, pos, reason, Z, base)
        return got

    def predict_all(self, trace: Trace, hw: Hardware, usage: float = 0.0) -> np.ndarray:
        """Every op at one usage; memoised per (trace, hardware, usage), since
        planners ask the same question many times."""
        usage = check_usage(usage)
        d = self._designs(trace)
        hit = d.memo.get((id(hw), usage))
        if hit is None or hit[0] is not hw:  # Hardware holds dicts: keyed by identity
            out = self.predict_ops(trace, hw, np.arange(trace.n_ops), np.full(trace.n_ops, usage))
            hit = d.memo[(id(hw), usage)] = (hw, out, self.last_stats)
        self.last_stats = hit[2]
        return hit[1].copy()

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
            y = self.nets[c].forward(Z)
            out[sel] = d.base_s[ops[sel]] * usage_stretch(u) * np.exp(y)
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
        _, flops, rd, wr, _ = single_op_cost(op, trace)
        base = float(self.meta.baseline.seconds(np.array([flops]), np.array([rd + wr]))[0])
        y = float(net.forward(np.hstack([Z, [[min(usage, net.spec.usage_max)]]]))[0])
        return base * float(usage_stretch(usage)) * math.exp(y)

    # ---- files -------------------------------------------------------------------
    def save(self, path: str | os.PathLike[str]) -> None:
        """torch.save of plain tensors, lists and strings (loadable with
        `weights_only=True`), written atomically."""
        import torch

        doc: dict[str, Any] = {"schema": SCHEMA, "meta": _plain(asdict(self.meta)), "classes": {}}
        for c, net in self.nets.items():
            spec = _plain(asdict(net.spec))
            spec["op_class"] = c.value
            # one flat float32 tensor per class (trained in float32: nothing
            # is lost): W1, b1, W2, b2, ... of each member in turn
            flat = [a.astype(np.float32).ravel() for m in net.members for W, b in m for a in (W, b)]
            doc["classes"][c.value] = {
                "spec": spec,
                "sizes": [net.members[0][0][0].shape[0]] + [b.shape[0] for _, b in net.members[0]],
                "members": len(net.members),
                "params": torch.from_numpy(np.concatenate(flat)),
            }
        buf = io.BytesIO()
        torch.save(doc, buf)
        atomic_write_bytes(path, buf.getvalue())

    @classmethod
    def load(
        cls, path: str | os.PathLike[str] | None = None, fallback: LatencyModel | None = None
    ) -> MLPLatency:
        """Load a saved model (the shipped CPU model by default); any problem
        is a one-line `LatencyError` naming the file (NOTE [ Latency model files ])."""
        import torch

        p = Path(path) if path is not None else DEFAULT_MODEL
        try:
            doc = torch.load(io.BytesIO(p.read_bytes()), weights_only=True)
        except FileNotFoundError:
            raise LatencyError(f"{p}: no such latency model") from None
        except IsADirectoryError:
            raise LatencyError(f"{p}: is a directory, not a latency model") from None
        except Exception as e:  # torch raises many types for a bad archive, some without text
            why = (str(e).splitlines() or [""])[0] or type(e).__name__
            why = why.split(". ")[0][:120]  # torch's first sentence; its advice is not ours
            raise LatencyError(f"{p}: not a saved latency model: {why}") from None
        if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
            raise LatencyError(f"{p}: schema: expected {SCHEMA!r}")
        try:
            meta, nets = _from_doc(doc, p)
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise LatencyError(
                f"{p}: malformed latency model ({fields.printable(str(e))})"
            ) from None
        return cls(nets, meta, fallback)


# NOTE [ Latency model files ]
# A saved model is read with `weights_only=True` (no code runs), then checked
# before anything predicts with it: the baseline's rates finite and > 0 and
# its overhead finite and >= 0; per class a known op class, the feature names
# of this version, `mean`/`std`/`lo`/`hi` one finite number per feature (std
# > 0), `usage_max` in [0, 1], 1..64 ensemble members of layer sizes from
# the input width (features + vocabulary + usage) to one output, and finite
# parameters, exactly as many as those sizes need. A prediction that still
# comes out non-finite is refused by `DeviceModel.op_durations`.
def _from_doc(doc: dict[str, Any], p: Path) -> tuple[MLPMeta, dict[OpClass, ClassNet]]:
    md = dict(doc["meta"])
    md["hidden"] = tuple(md.get("hidden", ()))
    base = md["baseline"] = Baseline(**md["baseline"])
    for key in ("flops_per_s", "bytes_per_s", "overhead_s"):
        v = fields.number(getattr(base, key), f"{p}: meta.baseline.{key}", LatencyError)
        if v <= 0 and key != "overhead_s":
            raise LatencyError(f"{p}: meta.baseline.{key}: expected a number > 0, got {v}")
    meta = MLPMeta(**md)
    fields.string(meta.hardware, f"{p}: meta.hardware", LatencyError)
    if not isinstance(doc["classes"], dict):
        raise TypeError("classes: expected a table")
    nets = {}
    for key, entry in doc["classes"].items():
        s = dict(entry["spec"])
        c = OpClass(s.pop("op_class"))
        spec = FeatureSpec(
            op_class=c, **{k: tuple(v) if isinstance(v, list) else v for k, v in s.items()}
        )
        w = f"{p}: classes.{fields.printable(str(key))}"
        if spec.names != feature_names(c):
            raise LatencyError(
                f"{w}: features {list(spec.names)} do not match this "
                f"version's {list(feature_names(c))}; retrain with `memplan latency train`"
            )
        _check_spec(spec, w)
        sizes = [fields.integer(n, f"{w}.sizes", LatencyError, 1, 1 << 16) for n in entry["sizes"]]
        width = len(spec.names) + len(spec.vocab) + 1
        if len(sizes) < 2 or sizes[0] != width or sizes[-1] != 1:
            raise LatencyError(f"{w}.sizes: expected {width} inputs .. 1 output, got {sizes}")
        members = fields.integer(entry["members"], f"{w}.members", LatencyError, 1, 64)
        flat = entry["params"].double().numpy()
        if flat.ndim != 1 or not np.isfinite(flat).all():
            raise LatencyError(f"{w}.params: expected finite numbers")
        nets[c] = ClassNet(spec, _unflatten(flat, sizes, members))
    return meta, nets


def _check_spec(spec: FeatureSpec, where: str) -> None:
    n = len(spec.names)
    for key in ("mean", "std", "lo", "hi"):
        values = getattr(spec, key)
        if not isinstance(values, tuple) or len(values) != n:
            raise LatencyError(f"{where}.spec.{key}: expected {n} numbers")
        lo = 1e-300 if key == "std" else -math.inf
        for j, v in enumerate(values):
            fields.number(v, f"{where}.spec.{key}[{j}]", LatencyError, lo)
    for j, v in enumerate(spec.vocab):
        fields.string(v, f"{where}.spec.vocab[{j}]", LatencyError)
    fields.number(spec.usage_max, f"{where}.spec.usage_max", LatencyError, 0.0, 1.0)


def _unflatten(flat: np.ndarray, sizes: list[int], members: int) -> list[Layers]:
    """The inverse of `save`'s packing: `members` nets of layer `sizes`."""
    out: list[Layers] = []
    at = 0
    for _ in range(members):
        layers: Layers = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            W = flat[at : at + a * b].reshape(a, b)
            at += a * b
            layers.append((W, flat[at : at + b].copy()))
            at += b
        out.append(layers)
    if at != len(flat):
        raise ValueError(f"{len(flat)} parameters for {members} nets of sizes {sizes}")
    return out


def _plain(x: Any) -> Any:
    """Python lists, floats, ints and strings only: what `weights_only` loads."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_plain(v) for v in x]
    if isinstance(x, np.floating):
        return float(x)
    if isinstance(x, np.integer):
        return int(x)
    if isinstance(x, enum.Enum):
        return x.value
    return x

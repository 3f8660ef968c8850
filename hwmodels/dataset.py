"""Microbenchmark datasets: measured op latencies, stored as a trace plus measurements.

Every sampled shape is one op of a synthetic `Trace` (its own input and
output buffers), so the featurizer that reads captured traces reads the
samples too. Measurements are (op, usage, latency) rows: one per usage level
per shape. File format: gzip JSON with ``"schema": "memplan.microbench/1"``.

The held-out split is a function of each sample's content (target, args,
shapes), not of its position: the same shape measured twice lands on the
same side, and the split needs no stored list of ids.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from memplan.hwmodels.errors import LatencyError
from memplan.traces import fields
from memplan.traces import io as trace_io
from memplan.traces.errors import TraceError
from memplan.traces.model import Op, Trace

SCHEMA = "memplan.microbench/1"
HELDOUT_FRACTION = 0.2


@dataclass(frozen=True, slots=True)
class DatasetMeta:
    """How and where a dataset was measured; rates in bytes/s."""

    device: str
    hardware: str
    description: str = ""
    torch_version: str = ""
    threads: int = 1
    seed: int = 0
    usage_levels: tuple[float, ...] = (0.0,)
    samples_per_class: int = 0
    repeats: int = 5
    min_block_s: float = 0.0
    created: str = ""
    elapsed_s: float = 0.0
    skipped: int = 0
    copy: dict[str, float] = field(default_factory=dict)
    classes: tuple[str, ...] = ()  # measured op classes, in order; () = all
    skipped_specs: tuple[int, ...] = ()  # sample indices the kernels rejected
    # CPU: cores kept busy by other processes on the cores not measured on,
    # averaged over the run (-1: not known); see NOTE [ Block length ]
    other_busy_cores: float = -1.0
    # CPU: whether glibc kept freed memory while measuring, as a device's
    # caching allocator does (NOTE [ Host allocations ] in hwmodels/hostmem.py)
    host_allocations_cached: bool = False


@dataclass(frozen=True, eq=False)
class Dataset:
    """`trace` holds one op per sampled shape; `op`, `usage`, `latency_s` are
    the measurement rows (int64 / float64 arrays of equal length)."""

    meta: DatasetMeta
    trace: Trace
    op: np.ndarray
    usage: np.ndarray
    latency_s: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.op)
        if len(self.usage) != n or len(self.latency_s) != n:
            raise LatencyError("dataset: op, usage and latency_s must have equal lengths")

    def heldout(self, fraction: float = HELDOUT_FRACTION) -> np.ndarray:
        """bool per measurement row: its shape is in the held-out split."""
        return heldout_ops(self.trace, fraction)[self.op]


def op_key(op: Op, trace: Trace) -> str:
    """Content of a call: target and args with every view replaced by its
    shape, stride and dtype."""

    def sub(x: Any) -> Any:
        if isinstance(x, dict):
            if "view" in x and len(x) == 1:
                v = trace.views[x["view"]]
                return [list(v.shape), list(v.stride), v.dtype]
            return {k: sub(y) for k, y in x.items()}
        if isinstance(x, list):
            return [sub(y) for y in x]
        return x

    return json.dumps([op.target, sub(op.args)], sort_keys=True, separators=(",", ":"))


def heldout_ops(trace: Trace, fraction: float = HELDOUT_FRACTION) -> np.ndarray:
    """bool[n_ops]: ops whose content hash falls in the held-out `fraction`."""
    cut = int(round(fraction * 10_000))
    return np.fromiter(
        (int(hashlib.sha256(op_key(op, trace).encode()).hexdigest()[:8], 16) % 10_000 < cut
         for op in trace.ops),
        bool,
        trace.n_ops,
    )  # fmt: skip


def save_dataset(ds: Dataset, path: str | os.PathLike[str]) -> None:
    """Write gzip JSON atomically."""
    doc = {
        "schema": SCHEMA,
        "meta": asdict(ds.meta),
        "trace": trace_io.to_dict(ds.trace),
        "measurements": {
            "op": ds.op.tolist(),
            "usage": ds.usage.tolist(),
            "latency_s": ds.latency_s.tolist(),
        },
    }
    blob = gzip.compress(json.dumps(doc, separators=(",", ":")).encode(), 9, mtime=0)
    trace_io.atomic_write_bytes(path, blob)


# NOTE [ Dataset fields ]
# A dataset file is checked as every file is (traces/fields.py NOTE [ Fields
# from files ]): its trace by the trace loader; `meta`'s strings strings, its
# counts integers >= 0, `usage_levels` numbers in [0, 1], `copy` finite rates
# >= 0; each measurement row an op id of the trace, a usage in [0, 1] and a
# finite latency > 0 (NaN is not a latency). Unknown meta keys are refused.
_META_KINDS: dict[str, str] = {
    "device": "str",
    "hardware": "str",
    "description": "str",
    "torch_version": "str",
    "created": "str",
    "threads": "int",
    "seed": "int",
    "samples_per_class": "int",
    "repeats": "int",
    "skipped": "int",
    "min_block_s": "num",
    "elapsed_s": "num",
    "other_busy_cores": "num",
    "host_allocations_cached": "bool",
}


def _meta(md: Any, where: str) -> DatasetMeta:
    if not isinstance(md, dict):
        raise LatencyError(f"{where}: expected an object, got {fields.shown(md)}")
    out: dict[str, Any] = {}
    for key, v in md.items():
        at = f"{where}.{fields.printable(key)}"
        kind = _META_KINDS.get(key)
        if kind == "str":
            out[key] = fields.string(v, at, LatencyError)
        elif kind == "int":
            out[key] = fields.integer(v, at, LatencyError)
        elif kind == "num":
            out[key] = fields.number(v, at, LatencyError, lo=-1.0)
        elif kind == "bool":
            out[key] = fields.boolean(v, at, LatencyError)
        elif key in ("usage_levels", "classes", "skipped_specs") and isinstance(v, list):
            item = {
                "usage_levels": lambda x, w: fields.number(x, w, LatencyError, 0.0, 1.0),
                "classes": lambda x, w: fields.string(x, w, LatencyError),
                "skipped_specs": lambda x, w: fields.integer(x, w, LatencyError),
            }[key]
            out[key] = tuple(item(x, f"{at}[{j}]") for j, x in enumerate(v))
        elif key == "copy" and isinstance(v, dict):
            out[key] = {k: fields.number(x, f"{at}.{k}", LatencyError) for k, x in v.items()}
        else:
            raise LatencyError(f"{at}: unknown or malformed field, got {fields.shown(v)}")
    for key in ("device", "hardware"):
        if key not in out:
            raise LatencyError(f"{where}.{key}: missing")
    return DatasetMeta(**out)


def _column(m: dict[str, Any], key: str, where: str, check: Any) -> list[Any]:
    col = m.get(key)
    if not isinstance(col, list):
        raise LatencyError(f"{where}.{key}: expected a list, got {fields.shown(col)}")
    return [check(x, f"{where}.{key}[{j}]") for j, x in enumerate(col)]


def load_dataset(path: str | os.PathLike[str]) -> Dataset:
    """Load and validate (NOTE [ Dataset fields ]); any problem is a one-line
    `LatencyError` naming the file and the field."""
    p = Path(path)
    try:
        raw = p.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    except FileNotFoundError:
        raise LatencyError(f"{p}: no such microbenchmark dataset") from None
    except (OSError, EOFError, zlib.error) as e:
        raise LatencyError(f"{p}: not a microbenchmark dataset: {e}") from None
    doc = fields.parse(raw, str(p), LatencyError)
    fields.depth_at_most(doc, str(p), LatencyError)
    if not isinstance(doc, dict) or doc.get("schema") != SCHEMA:
        got = doc.get("schema") if isinstance(doc, dict) else doc
        raise LatencyError(f"{p}: schema: expected {SCHEMA!r}, got {fields.shown(got)}")
    try:
        trace = trace_io.from_dict(doc.get("trace"))
    except TraceError as e:
        raise LatencyError(f"{p}: trace.{e}") from None
    meta = _meta(doc.get("meta"), f"{p}: meta")
    m = doc.get("measurements")
    w = f"{p}: measurements"
    if not isinstance(m, dict):
        raise LatencyError(f"{w}: expected an object, got {fields.shown(m)}")
    hi = max(trace.n_ops - 1, 0)
    op = _column(m, "op", w, lambda x, at: fields.integer(x, at, LatencyError, 0, hi))
    usage = _column(m, "usage", w, lambda x, at: fields.number(x, at, LatencyError, 0.0, 1.0))
    lat = _column(m, "latency_s", w, lambda x, at: fields.number(x, at, LatencyError, 1e-12, 1e6))
    if not len(op) == len(usage) == len(lat):
        raise LatencyError(f"{w}: op, usage and latency_s must have equal lengths")
    if op and trace.n_ops == 0:
        raise LatencyError(f"{w}.op: the trace has no ops")
    return Dataset(
        meta, trace, np.asarray(op, np.int64), np.asarray(usage), np.asarray(lat, np.float64)
    )

"""Trace files: JSON or .json.gz with ``"schema": "memplan.trace/1"``.

The only place where a trace is a dict. Loading validates everything and
raises `TraceError` naming the exact location (``ops[12].reads[1]: unknown
view 999``); saving is atomic (temp file, then rename).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from memplan.traces.errors import MemplanError, TraceError
from memplan.traces.model import Buffer, BufferKind, Op, Phase, SavedTensor, Trace, TraceMeta, View

SCHEMA = "memplan.trace/1"

DTYPE_BYTES: dict[str, int] = {
    "float64": 8,
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "complex128": 16,
    "complex64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}


# ---- writing ---------------------------------------------------------------
def to_dict(trace: Trace) -> dict[str, Any]:
    m = trace.meta
    return {
        "schema": SCHEMA,
        "meta": {
            "model": m.model,
            "batch_size": m.batch_size,
            "dtype": m.dtype,
            "optimizer": m.optimizer,
            "device": m.device,
            "torch_version": m.torch_version,
            "extra": m.extra,
        },
        "buffers": [
            {
                "id": b.id,
                "nbytes": b.nbytes,
                "kind": b.kind.value,
                "persistent": b.persistent,
                "name": b.name,
                "freed_after": b.freed_after,
            }
            for b in trace.buffers
        ],
        "views": [
            {
                "id": v.id,
                "buffer": v.buffer,
                "shape": list(v.shape),
                "stride": list(v.stride),
                "offset": v.offset,
                "dtype": v.dtype,
            }
            for v in trace.views
        ],
        "ops": [
            {
                "id": o.id,
                "target": o.target,
                "phase": o.phase.value,
                "reads": list(o.reads),
                "writes": list(o.writes),
                "args": o.args,
                "flops": o.flops,
                "duration_us": o.duration_us,
                "workspace_bytes": o.workspace_bytes,
                "module": o.module,
                "rng": o.rng,
            }
            for o in trace.ops
        ],
        "saved": [{"index": s.index, "view": s.view, "module": s.module} for s in trace.saved],
    }


def fingerprint(trace: Trace) -> str:
    """sha256 over the canonical JSON (sorted keys, no whitespace). Measured
    durations are excluded: re-measuring a trace does not orphan its plans."""
    d = to_dict(trace)
    for op in d["ops"]:
        op.pop("duration_us")
    d["meta"].pop("torch_version")
    blob = json.dumps(d, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    """Write `data` to `path` via a temp file in the same folder and a rename,
    so a reader never sees a half-written file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; a saved file is an ordinary file
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save_json(doc: Any, path: str | os.PathLike[str], *, indent: int | None = None) -> None:
    """Write a JSON document atomically, gzip-compressed when the name ends in `.gz`."""
    seps = (",", ":") if indent is None else None
    blob = (json.dumps(doc, indent=indent, separators=seps) + ("\n" if indent else "")).encode()
    if str(path).endswith(".gz"):
        blob = gzip.compress(blob, compresslevel=9, mtime=0)
    atomic_write_bytes(path, blob)


def save(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Save as JSON, gzip-compressed when the name ends in `.gz`."""
    save_json(to_dict(trace), path)


# ---- reading ---------------------------------------------------------------
def read_json(
    path: str | os.PathLike[str], error: type[MemplanError], what: str = "file"
) -> tuple[Path, Any]:
    """(path, document) of a JSON or gzip-compressed JSON file; any problem
    reading it is a one-line `error` naming the file."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except FileNotFoundError:
        raise error(f"{p}: no such {what}") from None
    except OSError as e:
        raise error(f"{p}: cannot read: {e.strerror}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise error(f"{p}: corrupt gzip data: {e}") from None
    try:
        return p, json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise error(f"{p}: not valid JSON: {e}") from None


# NOTE [ Shipped traces by name ]
# The traces memplan ships are package data (memplan/traces/data/*.json.gz
# once installed), so a path into the repository is not a name a user can
# rely on. `zoo:NAME` names one wherever memplan is installed: NAME is the
# file's stem (`zoo:resnet50_b16_adam`) or, when only one shipped trace
# starts with it followed by `_`, the model alone (`zoo:resnet50`).
SHIPPED_PREFIX = "zoo:"
DATA_DIR = Path(__file__).parent / "data"


def shipped() -> list[str]:
    """The names of the shipped traces (file stems), sorted."""
    return sorted(p.name.removesuffix(".json.gz") for p in DATA_DIR.glob("*.json.gz"))


def shipped_path(name: str) -> Path:
    """The file of shipped trace `name` (NOTE [ Shipped traces by name ])."""
    names = shipped()
    if name in names:
        return DATA_DIR / f"{name}.json.gz"
    matches = [n for n in names if n.startswith(f"{name}_")]
    if len(matches) == 1:
        return DATA_DIR / f"{matches[0]}.json.gz"
    known = ", ".join(names) or "none"
    why = "names several" if matches else "is not"
    raise TraceError(f"{SHIPPED_PREFIX}{name}: {why} a shipped trace (shipped: {known})")


def resolve(spec: str | os.PathLike[str]) -> Path:
    """A trace argument as a file: `zoo:NAME` or a path."""
    if isinstance(spec, str) and spec.startswith(SHIPPED_PREFIX):
        return shipped_path(spec[len(SHIPPED_PREFIX) :])
    return Path(spec)


def load(path: str | os.PathLike[str]) -> Trace:
    """Load and validate a trace file, or a shipped trace named `zoo:NAME`;
    any problem is a one-line `TraceError`."""
    p, doc = read_json(resolve(path), TraceError, "trace file")
    try:
        return from_dict(doc)
    except TraceError as e:
        raise TraceError(f"{p}: {e}") from None


def _need(d: Any, key: str, typ: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(d, dict):
        raise TraceError(f"{where}: expected an object, got {type(d).__name__}")
    if key not in d:
        raise TraceError(f"{where}.{key}: missing")
    v = d[key]
    ok = isinstance(v, typ) and not (isinstance(v, bool) and bool not in _as_tuple(typ))
    if not ok:
        names = "/".join(t.__name__ for t in _as_tuple(typ))
        raise TraceError(f"{where}.{key}: expected {names}, got {json.dumps(v)[:40]}")
    return v


def _as_tuple(typ: type | tuple[type, ...]) -> tuple[type, ...]:
    return typ if isinstance(typ, tuple) else (typ,)


def enum_value(cls: type, value: str, where: str, error: type[Exception] = TraceError) -> Any:
    """`cls(value)` for an enum read from a file; else `error` naming `where`
    and the allowed values (file formats of other layers pass their own)."""
    try:
        return cls(value)
    except ValueError:
        allowed = ", ".join(m.value for m in cls)
        raise error(f"{where}: unknown {cls.__name__} {value!r} (one of {allowed})") from None


def _check_ids(items: list[Any], section: str) -> None:
    seen: dict[int, int] = {}
    for i, item in enumerate(items):
        ident = _need(item, "id", int, f"{section}[{i}]")
        if ident in seen:
            raise TraceError(
                f"{section}[{i}].id: duplicate id {ident} (also {section}[{seen[ident]}])"
            )
        seen[ident] = i
        if ident != i:
            raise TraceError(f"{section}[{i}].id: expected {i} (ids are positions), got {ident}")


def from_dict(doc: Any) -> Trace:
    """Build a `Trace` from its JSON form, validating every field."""
    if not isinstance(doc, dict):
        raise TraceError(f"top level: expected an object, got {type(doc).__name__}")
    if "schema" not in doc:
        raise TraceError(f"schema: missing (expected {SCHEMA!r})")
    if doc["schema"] != SCHEMA:
        raise TraceError(f"schema: expected {SCHEMA!r}, got {doc['schema']!r}")
    meta = _meta(doc)
    raw_buffers = _need(doc, "buffers", list, "trace")
    raw_views = _need(doc, "views", list, "trace")
    raw_ops = _need(doc, "ops", list, "trace")
    raw_saved = doc.get("saved", [])
    _check_ids(raw_buffers, "buffers")
    _check_ids(raw_views, "views")
    _check_ids(raw_ops, "ops")
    buffers = _buffers(raw_buffers, len(raw_ops))
    views = _views(raw_views, buffers)
    ops = _ops(raw_ops, len(views))
    saved = _saved(raw_saved, len(views))
    trace = Trace(meta, tuple(buffers), tuple(views), tuple(ops), tuple(saved))
    _check_dataflow(trace)
    return trace


def _meta(doc: dict[str, Any]) -> TraceMeta:
    md = _need(doc, "meta", dict, "trace")
    meta = TraceMeta(
        model=_need(md, "model", str, "meta"),
        batch_size=_need(md, "batch_size", int, "meta"),
        dtype=md.get("dtype", "float32"),
        optimizer=md.get("optimizer", ""),
        device=md.get("device", "meta"),
        torch_version=md.get("torch_version", ""),
        extra=md.get("extra", {}) or {},
    )
    return meta


def _buffers(raw_buffers: list[Any], n_ops: int) -> list[Buffer]:
    buffers = []
    for i, b in enumerate(raw_buffers):
        w = f"buffers[{i}]"
        nbytes = _need(b, "nbytes", int, w)
        if nbytes < 0:
            raise TraceError(f"{w}.nbytes: negative size {nbytes}")
        freed = b.get("freed_after")
        persistent = bool(b.get("persistent", False))
        if freed is not None and (not isinstance(freed, int) or not 0 <= freed < n_ops):
            raise TraceError(f"{w}.freed_after: {freed!r} is not an op index (0..{n_ops - 1})")
        if persistent and freed is not None:
            raise TraceError(f"{w}.freed_after: persistent buffers are never freed, got {freed}")
        buffers.append(
            Buffer(
                id=i,
                nbytes=nbytes,
                kind=enum_value(BufferKind, _need(b, "kind", str, w), f"{w}.kind"),
                persistent=persistent,
                name=str(b.get("name", "")),
                freed_after=freed,
            )
        )
    return buffers


def _views(raw_views: list[Any], buffers: list[Buffer]) -> list[View]:
    views = []
    for i, v in enumerate(raw_views):
        w = f"views[{i}]"
        buf = _need(v, "buffer", int, w)
        if not 0 <= buf < len(buffers):
            raise TraceError(f"{w}.buffer: unknown buffer {buf}")
        shape = tuple(_need(v, "shape", list, w))
        stride = tuple(_need(v, "stride", list, w))
        offset = _need(v, "offset", int, w)
        dtype = _need(v, "dtype", str, w)
        if dtype not in DTYPE_BYTES:
            raise TraceError(f"{w}.dtype: unknown dtype {dtype!r}")
        if len(shape) != len(stride) or any(not isinstance(x, int) or x < 0 for x in shape):
            raise TraceError(f"{w}.shape: {list(shape)} does not match stride {list(stride)}")
        if offset < 0:
            raise TraceError(f"{w}.offset: negative offset {offset}")
        span = _span_bytes(shape, stride, offset, DTYPE_BYTES[dtype])
        if span > buffers[buf].nbytes:
            raise TraceError(
                f"{w}: spans {span} bytes but buffer {buf} has {buffers[buf].nbytes} bytes"
            )
        views.append(View(i, buf, shape, stride, offset, dtype))
    return views


def _ops(raw_ops: list[Any], n_views: int) -> list[Op]:
    ops = []
    for i, o in enumerate(raw_ops):
        w = f"ops[{i}]"
        reads = _view_list(o, "reads", w, n_views)
        writes = _view_list(o, "writes", w, n_views)
        args = o.get("args", {})
        if not isinstance(args, dict):
            raise TraceError(f"{w}.args: expected an object")
        _check_arg_views(args, f"{w}.args", n_views)
        duration = o.get("duration_us")
        if duration is not None and (not isinstance(duration, int | float) or duration < 0):
            raise TraceError(f"{w}.duration_us: expected a non-negative number, got {duration!r}")
        ops.append(
            Op(
                id=i,
                target=_need(o, "target", str, w),
                phase=enum_value(Phase, _need(o, "phase", str, w), f"{w}.phase"),
                reads=reads,
                writes=writes,
                args=args,
                flops=int(o.get("flops", 0) or 0),
                duration_us=None if duration is None else float(duration),
                workspace_bytes=int(o.get("workspace_bytes", 0) or 0),
                module=str(o.get("module", "")),
                rng=bool(o.get("rng", False)),
            )
        )
    return ops


def _saved(raw_saved: Any, n_views: int) -> list[SavedTensor]:
    saved = []
    for i, s in enumerate(raw_saved):
        w = f"saved[{i}]"
        view = _need(s, "view", int, w)
        if not 0 <= view < n_views:
            raise TraceError(f"{w}.view: unknown view {view}")
        saved.append(SavedTensor(_need(s, "index", int, w), view, str(s.get("module", ""))))
    return saved


def _span_bytes(shape: tuple[int, ...], stride: tuple[int, ...], offset: int, item: int) -> int:
    if any(s == 0 for s in shape):
        return 0
    last = offset + sum((n - 1) * abs(st) for n, st in zip(shape, stride, strict=True))
    return (last + 1) * item


def _view_list(o: Any, key: str, where: str, n_views: int) -> tuple[int, ...]:
    ids = _need(o, key, list, where)
    for j, v in enumerate(ids):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n_views:
            raise TraceError(f"{where}.{key}[{j}]: unknown view {v!r}")
    return tuple(ids)


def _check_arg_views(x: Any, where: str, n_views: int) -> None:
    if isinstance(x, dict):
        if "view" in x and len(x) == 1:
            v = x["view"]
            if not isinstance(v, int) or not 0 <= v < n_views:
                raise TraceError(f"{where}: unknown view {v!r}")
            return
        for k, y in x.items():
            _check_arg_views(y, f"{where}.{k}", n_views)
    elif isinstance(x, list):
        for j, y in enumerate(x):
            _check_arg_views(y, f"{where}[{j}]", n_views)


def _check_dataflow(trace: Trace) -> None:
    """Reads need an earlier writer (or a buffer resident from the start), and
    nothing is accessed after the framework freed it."""
    written = trace.exists_at_start.copy()
    vb = trace.view_buffer
    for op in trace.ops:
        for j, v in enumerate(op.reads):
            b = int(vb[v])
            if not written[b]:
                raise TraceError(
                    f"ops[{op.id}].reads[{j}]: view {v} of buffer {b} is read before any op "
                    f"writes it, and buffer {b} is neither persistent nor an input"
                )
        for v in op.writes:
            written[vb[v]] = True
    freed = trace.freed_after
    late = trace.last_access > freed
    if late.any():
        b = int(late.nonzero()[0][0])
        raise TraceError(
            f"buffers[{b}].freed_after: freed after op {int(freed[b])} "
            f"but ops[{int(trace.last_access[b])}] accesses it"
        )

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
import tomllib
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memplan.traces import fields
from memplan.traces.errors import MemplanError, TraceError
from memplan.traces.model import DTYPE_BYTES, Trace
from memplan.traces.schema import SCHEMA, from_dict

__all__ = ["DTYPE_BYTES", "SCHEMA", "from_dict", "load", "read_json", "save", "to_dict"]


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
            "optimizer_kwargs": m.optimizer_kwargs,
            "amp": m.amp.value,
            "accumulate": m.accumulate,
            "target": None if m.target is None else m.target.to_json(),
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


# NOTE [ Meta fields added later ]
# `optimizer_kwargs`, `amp` and `accumulate` (issue 18) and `target` (issue
# 32) are written always and read with defaults ({}, "none", 1, null) when
# absent, so older trace files load.
# The fingerprint leaves them out while they hold those defaults: a file
# written before them keeps the fingerprint its plans were made for.
_LATER_DEFAULTS = {"optimizer_kwargs": {}, "amp": "none", "accumulate": 1, "target": None}


def fingerprint(trace: Trace) -> str:
    """sha256 over the canonical JSON (sorted keys, no whitespace). Measured
    durations are excluded: re-measuring a trace does not orphan its plans;
    so are meta fields added later while at their defaults (NOTE [ Meta
    fields added later ])."""
    d = to_dict(trace)
    for op in d["ops"]:
        op.pop("duration_us")
    d["meta"].pop("torch_version")
    for key, default in _LATER_DEFAULTS.items():
        if d["meta"][key] == default:
            del d["meta"][key]
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
# NOTE [ File sizes ]
# A memplan JSON file (trace, plan, dataset) is read whole, so its size is
# bounded: at most MAX_JSON_BYTES on disk and, when gzip-compressed, at most
# that much once decompressed (read with a limit, so a small file that
# inflates without end is refused after MAX_JSON_BYTES, not after memory runs
# out). The shipped traces are about 1 MiB of JSON; 1 GiB leaves room for
# models a thousand times their size.
MAX_JSON_BYTES = 1 << 30


def read_capped(
    p: Path, error: type[MemplanError], what: str, max_bytes: int, too_big: Callable[[int], str]
) -> bytes:
    """The bytes of file `p`, at most `max_bytes` of them (else the message
    `too_big` makes of its size); any problem reading it is a one-line
    `error` naming the file and `what` it should have been. JSON, TOML and
    snapshot files are read through it."""
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise error(too_big(size))
        return p.read_bytes()
    except FileNotFoundError:
        raise error(f"{p}: no such {what}") from None
    except IsADirectoryError:
        raise error(f"{p}: is a directory, not a {what}") from None
    except OSError as e:
        raise error(f"{p}: cannot read: {e.strerror or e}") from None


def read_json(
    path: str | os.PathLike[str], error: type[MemplanError], what: str = "file"
) -> tuple[Path, Any]:
    """(path, document) of a JSON or gzip-compressed JSON file; any problem
    reading it is a one-line `error` naming the file."""
    p = Path(path)
    too_big = f"{p}: larger than {MAX_JSON_BYTES >> 20} MiB of JSON (NOTE [ File sizes ])"
    raw = read_capped(p, error, what, MAX_JSON_BYTES, lambda _n: too_big)
    if raw[:2] == b"\x1f\x8b":
        try:
            unzip = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            raw = unzip.decompress(raw, MAX_JSON_BYTES + 1)
            if len(raw) > MAX_JSON_BYTES:
                raise error(too_big)
            if not unzip.eof:
                raise EOFError("compressed file ended before the end-of-stream marker was reached")
        except (OSError, EOFError, zlib.error) as e:
            raise error(f"{p}: corrupt gzip data: {e}") from None
    return p, fields.parse(raw, str(p), error)


MAX_TOML_BYTES = 1 << 24


def read_toml(
    path: str | os.PathLike[str],
    error: type[MemplanError],
    what: str,
    max_bytes: int = MAX_TOML_BYTES,
) -> tuple[Path, dict[str, Any]]:
    """(path, document) of a TOML file (a profile, a grid, a suite, a
    scenario: `what` names it in messages); any problem reading it is a
    one-line `error` naming the file."""
    p = Path(path)
    raw = read_capped(
        p, error, what, max_bytes, lambda _n: f"{p}: larger than {max_bytes} bytes: not a {what}"
    )
    try:  # newlines as a file read as text has them
        text = raw.decode("utf-8").replace("\r\n", "\n").replace("\r", "\n")
        return p, tomllib.loads(text)
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise error(f"{p}: not valid TOML: {e}") from None
    except RecursionError:
        raise error(f"{p}: nested too deeply to be a {what}") from None


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

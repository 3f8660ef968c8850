"""The fields of a trace file (``"schema": "memplan.trace/1"``), checked.

`from_dict` builds a `Trace` from the JSON document or raises `TraceError`
naming the field (``ops[12].flops: expected a number in [0, 1e+20], got
"abc"``). Every value goes through `memplan.traces.fields` (NOTE [ Fields
from files ]) and the ranges of NOTE [ Trace sanity ranges ].
"""

from __future__ import annotations

from typing import Any

from memplan.traces import fields
from memplan.traces.errors import TraceError
from memplan.traces.fields import shown
from memplan.traces.model import (
    DTYPE_BYTES,
    MAX_ACCUMULATE,
    MAX_OP_FLOPS,
    MAX_OP_US,
    MAX_TRACE_BYTES,
    Amp,
    Buffer,
    BufferKind,
    Op,
    Phase,
    SavedTensor,
    Trace,
    TraceMeta,
    View,
)
from memplan.traces.target import AttentionBackend, Target, TargetDevice

SCHEMA = "memplan.trace/1"
_MISSING = object()
_E = TraceError


def _get(d: dict[str, Any], key: str, where: str, default: Any = _MISSING) -> Any:
    """`d[key]`, or `default` when absent; absent without a default is an error."""
    if key in d:
        return d[key]
    if default is _MISSING:
        raise TraceError(f"{_at(where, key)}: missing")
    return default


def _at(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _int(
    d: dict[str, Any],
    key: str,
    where: str,
    lo: int = 0,
    hi: int = fields.INT64_MAX,
    default: Any = _MISSING,
) -> Any:
    if key not in d and default is not _MISSING:
        return default
    return fields.integer(_get(d, key, where), _at(where, key), _E, lo, hi)


def _str(d: dict[str, Any], key: str, where: str, default: Any = _MISSING) -> str:
    return fields.string(_get(d, key, where, default), _at(where, key), _E)


def _list(d: dict[str, Any], key: str, where: str, default: Any = _MISSING) -> list[Any]:
    return fields.array(_get(d, key, where, default), _at(where, key), _E)


def _json(d: dict[str, Any], key: str, where: str, default: Any) -> Any:
    """Free-form JSON (`args`, `meta.extra`): any value, nested at most
    `fields.MAX_DEPTH` deep so walking it can never recurse too far."""
    return fields.depth_at_most(_get(d, key, where, default), _at(where, key), _E)


def from_dict(doc: Any) -> Trace:
    """Build a `Trace` from its JSON form, validating every field."""
    top = fields.obj(doc, "top level", _E)
    schema = _get(top, "schema", "")
    if schema != SCHEMA:
        raise TraceError(f"schema: expected {SCHEMA!r}, got {shown(schema)}")
    meta = _meta(fields.obj(_get(top, "meta", ""), "meta", _E))
    raw_buffers = _list(top, "buffers", "")
    raw_views = _list(top, "views", "")
    raw_ops = _list(top, "ops", "")
    raw_saved = _list(top, "saved", "", [])
    for section, items in (("buffers", raw_buffers), ("views", raw_views), ("ops", raw_ops)):
        _check_ids(items, section)
    buffers = _buffers(raw_buffers, len(raw_ops))
    views = _views(raw_views, buffers)
    ops = _ops(raw_ops, len(views))
    saved = _saved(raw_saved, len(views))
    trace = Trace(meta, tuple(buffers), tuple(views), tuple(ops), tuple(saved))
    _check_dataflow(trace)
    return trace


def _meta(md: dict[str, Any]) -> TraceMeta:
    extra = _json(md, "extra", "meta", {})
    if extra is None:
        extra = {}
    return TraceMeta(
        model=_str(md, "model", "meta"),
        batch_size=_int(md, "batch_size", "meta"),
        dtype=_str(md, "dtype", "meta", "float32"),
        optimizer=_str(md, "optimizer", "meta", ""),
        device=_str(md, "device", "meta", "meta"),
        torch_version=_str(md, "torch_version", "meta", ""),
        extra=fields.obj(extra, "meta.extra", _E),
        optimizer_kwargs=fields.obj(
            _json(md, "optimizer_kwargs", "meta", {}), "meta.optimizer_kwargs", _E
        ),
        amp=fields.enum_value(Amp, _get(md, "amp", "meta", Amp.NONE.value), "meta.amp", _E),
        accumulate=_int(md, "accumulate", "meta", 1, MAX_ACCUMULATE, 1),
        target=_target(_get(md, "target", "meta", None)),
    )


def _target(raw: Any) -> Target | None:
    if raw is None:
        return None
    w = "meta.target"
    t = fields.obj(raw, w, _E)
    device = fields.enum_value(TargetDevice, _get(t, "device", w), f"{w}.device", _E)
    cc = None
    if "compute_capability" in t:
        items = _list(t, "compute_capability", w)
        if len(items) != 2:
            raise TraceError(f"{w}.compute_capability: expected [major, minor], got {shown(items)}")
        at = f"{w}.compute_capability"
        cc = (fields.integer(items[0], at, _E, 0, 99), fields.integer(items[1], at, _E, 0, 99))
    attention = fields.enum_value(
        AttentionBackend, _get(t, "attention", w, "auto"), f"{w}.attention", _E
    )
    try:
        return Target(_str(t, "name", w), device, cc, attention)
    except TraceError as e:
        raise TraceError(f"{w}: {e}") from None


def _check_ids(items: list[Any], section: str) -> None:
    for i, item in enumerate(items):
        w = f"{section}[{i}]"
        ident = _int(fields.obj(item, w, _E), "id", w)
        if ident != i:
            if ident < i:  # ids are checked in order: a smaller one was seen
                raise TraceError(f"{w}.id: duplicate id {ident} (also {section}[{ident}])")
            raise TraceError(f"{w}.id: expected {i} (ids are positions), got {ident}")


def _buffers(raw_buffers: list[Any], n_ops: int) -> list[Buffer]:
    buffers = []
    total = 0
    for i, b in enumerate(raw_buffers):
        w = f"buffers[{i}]"
        nbytes = _int(b, "nbytes", w, 0, MAX_TRACE_BYTES)
        total += nbytes
        if total > MAX_TRACE_BYTES:
            raise TraceError(
                f"{w}.nbytes: the buffers up to here hold {total} bytes, more than "
                f"{MAX_TRACE_BYTES} (2**62) in all"
            )
        persistent = fields.boolean(_get(b, "persistent", w, False), f"{w}.persistent", _E)
        freed = _get(b, "freed_after", w, None)
        if freed is not None:
            if n_ops == 0:
                raise TraceError(f"{w}.freed_after: {shown(freed)} is not an op index (no ops)")
            if not isinstance(freed, int) or isinstance(freed, bool) or not 0 <= freed < n_ops:
                raise TraceError(
                    f"{w}.freed_after: {shown(freed)} is not an op index (0..{n_ops - 1})"
                )
            if persistent:
                raise TraceError(
                    f"{w}.freed_after: persistent buffers are never freed, got {freed}"
                )
        kind = fields.enum_value(BufferKind, _get(b, "kind", w), f"{w}.kind", _E)
        name = _str(b, "name", w, "")
        buffers.append(Buffer(i, nbytes, kind, persistent, name, freed))
    return buffers


def _views(raw_views: list[Any], buffers: list[Buffer]) -> list[View]:
    views = []
    for i, v in enumerate(raw_views):
        w = f"views[{i}]"
        buf = _int(v, "buffer", w, hi=fields.INT64_MAX)
        if buf >= len(buffers):
            raise TraceError(f"{w}.buffer: unknown buffer {buf}")
        shape = _int_list(v, "shape", w, 0)
        stride = _int_list(v, "stride", w, -fields.INT64_MAX)
        offset = _int(v, "offset", w)
        dtype = _str(v, "dtype", w)
        if dtype not in DTYPE_BYTES:
            raise TraceError(
                f"{w}.dtype: unknown dtype {shown(dtype)} (a torch dtype name such as "
                "float32 or uint64; NOTE [ Trace dtypes ] in traces/model.py)"
            )
        if len(shape) != len(stride):
            raise TraceError(f"{w}.shape: {list(shape)} does not match stride {list(stride)}")
        span = _span_bytes(shape, stride, offset, DTYPE_BYTES[dtype])
        if span > buffers[buf].nbytes:
            raise TraceError(
                f"{w}: spans {span} bytes but buffer {buf} has {buffers[buf].nbytes} bytes"
            )
        views.append(View(i, buf, shape, stride, offset, dtype))
    return views


def _int_list(d: dict[str, Any], key: str, where: str, lo: int) -> tuple[int, ...]:
    w = _at(where, key)
    return tuple(fields.integer(x, f"{w}[{j}]", _E, lo) for j, x in enumerate(_list(d, key, where)))


def _ops(raw_ops: list[Any], n_views: int) -> list[Op]:
    ops = []
    for i, o in enumerate(raw_ops):
        w = f"ops[{i}]"
        target = fields.text(_get(o, "target", w), f"{w}.target", _E)  # NOTE [ Op targets ]
        phase = fields.enum_value(Phase, _get(o, "phase", w), f"{w}.phase", _E)
        reads = _view_list(o, "reads", w, n_views)
        writes = _view_list(o, "writes", w, n_views)
        args = fields.obj(_json(o, "args", w, {}), f"{w}.args", _E)
        _check_arg_views(args, f"{w}.args", n_views)
        duration = _get(o, "duration_us", w, None)
        if duration is not None:
            duration = fields.number(duration, f"{w}.duration_us", _E, 0.0, MAX_OP_US)
        ops.append(
            Op(
                id=i,
                target=target,
                phase=phase,
                reads=reads,
                writes=writes,
                args=args,
                flops=_int(o, "flops", w, 0, MAX_OP_FLOPS, 0),
                duration_us=duration,
                workspace_bytes=_int(o, "workspace_bytes", w, 0, MAX_TRACE_BYTES, 0),
                module=_str(o, "module", w, ""),
                rng=fields.boolean(_get(o, "rng", w, False), f"{w}.rng", _E),
            )
        )
    return ops


# NOTE [ Op targets ]
# Names a trace only carries (buffer names, modules, the model) may hold any
# code point, lone surrogates included: they are printed through
# `fields.printable`. An op's `target` is looked up as an operator
# (`torch.ops.aten.mm.default`) by the latency models and the replay, and
# torch takes only valid Unicode there, so a target with a lone surrogate
# cannot name an operator and is refused at load (`fields.text`).


def _saved(raw_saved: list[Any], n_views: int) -> list[SavedTensor]:
    saved = []
    for i, s in enumerate(raw_saved):
        w = f"saved[{i}]"
        s = fields.obj(s, w, _E)
        view = _int(s, "view", w)
        if view >= n_views:
            raise TraceError(f"{w}.view: unknown view {view}")
        saved.append(SavedTensor(_int(s, "index", w), view, _str(s, "module", w, "")))
    return saved


def _span_bytes(shape: tuple[int, ...], stride: tuple[int, ...], offset: int, item: int) -> int:
    if any(s == 0 for s in shape):
        return 0
    last = offset + sum((n - 1) * abs(st) for n, st in zip(shape, stride, strict=True))
    return (last + 1) * item


def _view_list(o: dict[str, Any], key: str, where: str, n_views: int) -> tuple[int, ...]:
    ids = _list(o, key, where)
    for j, v in enumerate(ids):
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n_views:
            raise TraceError(f"{where}.{key}[{j}]: unknown view {shown(v)}")
    return tuple(ids)


def _check_arg_views(x: Any, where: str, n_views: int) -> None:
    """Every ``{"view": id}`` in `args` names a view (`args` is depth-bounded)."""
    if isinstance(x, dict):
        if "view" in x and len(x) == 1:
            v = x["view"]
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < n_views:
                raise TraceError(f"{where}: unknown view {shown(v)}")
            return
        for k, y in x.items():
            _check_arg_views(y, f"{where}.{fields.printable(k)}", n_views)
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

"""Batch scaling: the trace of a model at any batch size from captures at two.

Buffer bytes, view shapes and strides, FLOPs and workspaces of a training
step are affine in the batch size for almost every op. `fit` takes two
captures that agree in structure and `BatchFit.at(batch)` builds the trace
at another batch, checked by the trace loader's own validation;
`BatchTraces` adds the check against a third capture and captures instead
wherever scaling does not hold (NOTE [ Batch scaling ]).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NamedTuple

from memplan.traces import io
from memplan.traces.errors import TraceError
from memplan.traces.model import (
    DTYPE_BYTES,
    MAX_OP_FLOPS,
    MAX_TRACE_BYTES,
    Trace,
    View,
)
from memplan.traces.schema import _span_bytes

if TYPE_CHECKING:
    from memplan.traces.builders import ModelOptions
    from memplan.traces.capture import CaptureOptions

# NOTE [ Batch scaling ]
# Two captures of one model at batches b1 < b2 *agree in structure* when their buffers,
# views, ops and saved tensors match in order and in every field but the sizes (meta fields
# but name, batch, torch version and `extra`; per op the form of its args, every leaf equal
# except integers); `fit` names the first disagreement.
# What scales: buffers' nbytes; views' shape, stride and offset; ops' flops,
# workspace_bytes and integer args; each as q(B) = q1 + (q2 - q1) * (B - b1) / (b2 - b1) in
# exact integers. Bytes round up (memory never under-counted), flops to nearest; shapes,
# strides, offsets and args must come out whole and nothing negative, else the fit does not
# hold at that batch. Measured durations are dropped. Scaled traces pass the loader's checks.
# Where it holds (`BatchTraces`): batch 1 and the two bases are captured, every other batch
# scaled while the fit holds; `check(batch)` compares a third capture within `tolerance`
# (0.5%). Failing bases or check: every batch captured; a fit failing at one batch: that
# batch captured. Each is said in `notes` and on the trace (`BatchTrace.scaled`, `.note`).
# Full text: docs/notes.md, "Batch scaling".
DEFAULT_BASES = (8, 12)
DEFAULT_TOLERANCE = 0.005


class ScalingError(TraceError):
    """Two captures disagree in structure, or a fit does not hold at a batch."""


class _Diffs(NamedTuple):
    """The integer quantities that differ between two captures that agree in
    structure: (index, value in the first, value in the second)."""

    nbytes: list[tuple[int, int, int]]
    views: list[int]
    flops: list[tuple[int, int, int]]
    workspace: list[tuple[int, int, int]]
    args: list[tuple[int, tuple[Any, ...], int, int]]  # (op, path, q1, q2)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _args_diffs(x: Any, y: Any, path: tuple[Any, ...], where: str) -> Iterator[tuple]:
    """(path, x, y) of every integer leaf that differs; ScalingError on any
    other difference of form or value."""
    if _is_int(x) and _is_int(y):
        if x != y:
            yield path, x, y
        return
    if type(x) is not type(y):
        raise ScalingError(f"{where}: {type(x).__name__} vs {type(y).__name__}")
    if isinstance(x, dict):
        if list(x) != list(y):
            raise ScalingError(f"{where}: keys {sorted(x)} vs {sorted(y)}")
        for k in x:
            yield from _args_diffs(x[k], y[k], (*path, k), f"{where}.{k}")
    elif isinstance(x, list):
        if len(x) != len(y):
            raise ScalingError(f"{where}: {len(x)} items vs {len(y)}")
        for j, (a, b) in enumerate(zip(x, y, strict=True)):
            yield from _args_diffs(a, b, (*path, j), f"{where}[{j}]")
    elif x != y:
        raise ScalingError(f"{where}: {x!r} vs {y!r}")


def _same(where: str, a: Any, b: Any) -> None:
    if a != b:
        raise ScalingError(f"{where}: {a!r} vs {b!r}")


# Meta fields that may differ between two captures of one run.
_META_FREE = frozenset({"model", "batch_size", "torch_version", "extra"})


def _agree(t1: Trace, t2: Trace) -> _Diffs:
    """The quantities that differ between `t1` and `t2`, or ScalingError
    naming the first disagreement in structure (NOTE [ Batch scaling ])."""
    for f in dataclasses.fields(t1.meta):  # what was run: dtype, optimizer, amp, ...
        if f.name not in _META_FREE:
            _same(f"meta.{f.name}", getattr(t1.meta, f.name), getattr(t2.meta, f.name))
    for what in ("buffers", "views", "ops", "saved"):
        _same(f"number of {what}", len(getattr(t1, what)), len(getattr(t2, what)))
    d = _Diffs([], [], [], [], [])
    for a, b in zip(t1.buffers, t2.buffers, strict=True):
        w = f"buffers[{a.id}]"
        _same(f"{w}.kind", a.kind.value, b.kind.value)
        _same(f"{w}.persistent", a.persistent, b.persistent)
        _same(f"{w}.name", a.name, b.name)
        _same(f"{w}.freed_after", a.freed_after, b.freed_after)
        if a.nbytes != b.nbytes:
            d.nbytes.append((a.id, a.nbytes, b.nbytes))
    for a, b in zip(t1.views, t2.views, strict=True):
        w = f"views[{a.id}]"
        _same(f"{w}.buffer", a.buffer, b.buffer)
        _same(f"{w}.dtype", a.dtype, b.dtype)
        _same(f"{w} rank", len(a.shape), len(b.shape))
        if (a.shape, a.stride, a.offset) != (b.shape, b.stride, b.offset):
            d.views.append(a.id)
    for a, b in zip(t1.ops, t2.ops, strict=True):
        w = f"ops[{a.id}]"
        for key in ("target", "reads", "writes", "module", "rng"):
            _same(f"{w}.{key}", getattr(a, key), getattr(b, key))
        _same(f"{w}.phase", a.phase.value, b.phase.value)
        if a.flops != b.flops:
            d.flops.append((a.id, a.flops, b.flops))
        if a.workspace_bytes != b.workspace_bytes:
            d.workspace.append((a.id, a.workspace_bytes, b.workspace_bytes))
        for path, x, y in _args_diffs(a.args, b.args, (), f"{w}.args"):
            d.args.append((a.id, path, x, y))
    for a, b in zip(t1.saved, t2.saved, strict=True):
        _same(f"saved[{a.index}]", a, b)
    return d


# ---- affine values --------------------------------------------------------------------
class _Line(NamedTuple):
    """q(B) = q1 + (q2 - q1) * (B - b1) / (b2 - b1), as a fraction num / den."""

    b1: int
    b2: int
    batch: int

    def frac(self, q1: int, q2: int) -> tuple[int, int]:
        den = self.b2 - self.b1
        return q1 * den + (q2 - q1) * (self.batch - self.b1), den

    def up(self, q1: int, q2: int, what: str) -> int:
        num, den = self.frac(q1, q2)  # den > 0: b2 > b1
        if num < 0:  # negative before rounding: -1/3 must not round up to 0
            raise ScalingError(f"{what} would be {num / den:.4g} at batch {self.batch}")
        return -(-num // den)

    def nearest(self, q1: int, q2: int, what: str) -> int:
        num, den = self.frac(q1, q2)
        if num < 0:
            raise ScalingError(f"{what} would be {num / den:.4g} at batch {self.batch}")
        return (2 * num + den) // (2 * den)

    def whole(self, q1: int, q2: int, what: str) -> int:
        num, den = self.frac(q1, q2)
        if num % den:
            raise ScalingError(
                f"{what} is {q1} at batch {self.b1} and {q2} at batch {self.b2}: "
                f"not a whole number at batch {self.batch}"
            )
        return num // den


def _set_path(args: Any, path: tuple[Any, ...], value: int) -> None:
    for key in path[:-1]:
        args = args[key]
    args[path[-1]] = value


@dataclasses.dataclass(frozen=True, eq=False)
class BatchFit:
    """Two captures that agree in structure, and what differs between them:
    the trace as an affine function of the batch (NOTE [ Batch scaling ])."""

    base: Trace
    other: Trace
    diffs: _Diffs

    @property
    def batches(self) -> tuple[int, int]:
        return self.base.meta.batch_size, self.other.meta.batch_size

    def at(self, batch: int) -> Trace:
        """The trace at `batch`, validated as a trace file is; ScalingError
        where the fit does not hold there (NOTE [ Batch scaling ])."""
        if not _is_int(batch) or batch < 1:
            raise ScalingError(f"batch={batch!r} must be an integer >= 1")
        b1, b2 = self.batches
        line = _Line(b1, b2, batch)
        t1, t2, d = self.base, self.other, self.diffs
        buffers = list(t1.buffers)
        for i, q1, q2 in d.nbytes:
            buffers[i] = dataclasses.replace(
                buffers[i], nbytes=line.up(q1, q2, f"buffers[{i}].nbytes")
            )
        views = list(t1.views)
        for i in d.views:
            views[i] = _view_at(t1.views[i], t2.views[i], line)
        ops = [
            op if op.duration_us is None else dataclasses.replace(op, duration_us=None)
            for op in t1.ops
        ]
        changes: dict[int, dict[str, Any]] = {}
        for i, q1, q2 in d.flops:
            changes.setdefault(i, {})["flops"] = line.nearest(q1, q2, f"ops[{i}].flops")
        for i, q1, q2 in d.workspace:
            changes.setdefault(i, {})["workspace_bytes"] = line.up(
                q1, q2, f"ops[{i}].workspace_bytes"
            )
        for i, path, q1, q2 in d.args:
            args = changes.setdefault(i, {}).setdefault("args", copy.deepcopy(t1.ops[i].args))
            _set_path(args, path, line.whole(q1, q2, f"ops[{i}].args"))
        for i, change in changes.items():
            ops[i] = dataclasses.replace(ops[i], **change)
        extra = {**t1.meta.extra, "scaled_from": [b1, b2]}
        meta = dataclasses.replace(t1.meta, batch_size=batch, extra=extra)
        trace = Trace(meta, tuple(buffers), tuple(views), tuple(ops), t1.saved)
        try:
            _check_scaled(trace, d)
        except TraceError as e:
            raise ScalingError(f"the trace scaled to batch {batch} is not valid: {e}") from None
        return trace


def _check_scaled(t: Trace, d: _Diffs) -> None:
    """The loader's checks of what scaled (NOTE [ Trace sanity ranges ], view
    spans); the rest is the base capture's, which `fit` ran through the
    loader whole (NOTE [ Batch scaling ])."""
    total = 0
    for b in t.buffers:
        total += b.nbytes
        if b.nbytes > MAX_TRACE_BYTES or total > MAX_TRACE_BYTES:
            raise TraceError(f"buffers[{b.id}].nbytes: more than {MAX_TRACE_BYTES} bytes (2**62)")
    for i in d.views:
        v = t.views[i]
        span = _span_bytes(v.shape, v.stride, v.offset, DTYPE_BYTES[v.dtype])
        if span > t.buffers[v.buffer].nbytes:
            raise TraceError(
                f"views[{i}]: spans {span} bytes but buffer {v.buffer} has "
                f"{t.buffers[v.buffer].nbytes} bytes"
            )
    for i, _, _ in d.flops:
        if t.ops[i].flops > MAX_OP_FLOPS:
            raise TraceError(f"ops[{i}].flops: {t.ops[i].flops} is more than {MAX_OP_FLOPS}")
    for i, _, _ in d.workspace:
        if t.ops[i].workspace_bytes > MAX_TRACE_BYTES:
            raise TraceError(f"ops[{i}].workspace_bytes: more than {MAX_TRACE_BYTES} bytes")


def _view_at(v1: View, v2: View, line: _Line) -> View:
    w = f"views[{v1.id}]"
    shape = tuple(
        line.whole(a, b, f"{w}.shape[{j}]") for j, (a, b) in enumerate(zip(v1.shape, v2.shape))
    )
    if any(n < 0 for n in shape):
        raise ScalingError(f"{w}.shape would be {list(shape)} at batch {line.batch}")
    stride = tuple(
        line.whole(a, b, f"{w}.stride[{j}]") for j, (a, b) in enumerate(zip(v1.stride, v2.stride))
    )
    offset = line.whole(v1.offset, v2.offset, f"{w}.offset")
    return dataclasses.replace(v1, shape=shape, stride=stride, offset=offset)


def fit(t1: Trace, t2: Trace) -> BatchFit:
    """The affine fit of two captures of one model at different batches;
    ScalingError naming the first disagreement (NOTE [ Batch scaling ])."""
    if t1.meta.batch_size > t2.meta.batch_size:
        t1, t2 = t2, t1
    b1, b2 = t1.meta.batch_size, t2.meta.batch_size
    if b1 == b2:
        raise ScalingError(f"both captures are at batch {b1}: a fit needs two batch sizes")
    try:
        diffs = _agree(t1, t2)
    except ScalingError as e:
        raise ScalingError(f"the captures at batch {b1} and {b2} disagree: {e}") from None
    try:
        io.from_dict(io.to_dict(t1))  # the structure every scaled trace copies
    except TraceError as e:
        raise ScalingError(f"the capture at batch {b1} is not a valid trace: {e}") from None
    return BatchFit(t1, t2, diffs)


# ---- checking a scaled trace against a capture -----------------------------------------
def _rel(a: int, b: int) -> float:
    return abs(a - b) / max(abs(a), abs(b)) if a != b else 0.0


def mismatch(scaled: Trace, captured: Trace, tolerance: float) -> tuple[float, str]:
    """(largest relative error of bytes, flops and the vanilla peak, reason
    the two do not match or "") by NOTE [ Batch scaling ]'s check."""
    try:
        d = _agree(scaled, captured)
    except ScalingError as e:
        return float("inf"), f"structure: {e}"
    if d.views:
        v = d.views[0]
        a, b = scaled.views[v], captured.views[v]
        return float(
            "inf"
        ), f"views[{v}]: {a.shape}/{a.stride} scaled, {b.shape}/{b.stride} captured"
    if d.args:
        i, path, x, y = d.args[0]
        return float("inf"), f"ops[{i}].args{list(path)}: {x} scaled, {y} captured"
    worst, reason = 0.0, ""
    named = [(f"buffers[{i}].nbytes", a, b) for i, a, b in d.nbytes]
    named += [(f"ops[{i}].flops", a, b) for i, a, b in d.flops]
    named += [(f"ops[{i}].workspace_bytes", a, b) for i, a, b in d.workspace]
    named.append(("the vanilla peak", scaled.peak()[0], captured.peak()[0]))
    for what, a, b in named:
        err = _rel(a, b)
        if err > worst:
            worst = err
            if err > tolerance:
                reason = f"{what}: {a} scaled, {b} captured ({err:.2%} > {tolerance:.2%})"
    return worst, reason


# ---- traces at any batch --------------------------------------------------------------
class BatchTrace(NamedTuple):
    """A trace at one batch: scaled, or captured (`note` says why)."""

    trace: Trace
    scaled: bool
    note: str = ""


class Check(NamedTuple):
    """A scaled trace against a capture at the same batch."""

    batch: int
    ok: bool
    max_rel_error: float
    scaled_peak_bytes: int
    captured_peak_bytes: int
    reason: str = ""


class BatchTraces:
    """The traces of one model at any batch (NOTE [ Batch scaling ]):
    `capture_at(batch)` records one; the rest are scaled from the captures
    at `bases` while the fit holds. Every trace made is kept."""

    def __init__(
        self,
        capture_at: Callable[[int], Trace],
        *,
        bases: tuple[int, int] = DEFAULT_BASES,
        tolerance: float = DEFAULT_TOLERANCE,
    ) -> None:
        b1, b2 = bases
        if not (_is_int(b1) and _is_int(b2) and 2 <= b1 < b2):
            raise ScalingError(f"bases={bases!r}: two batch sizes 2 <= b1 < b2")
        if not 0 <= tolerance < 1:
            raise ScalingError(f"tolerance={tolerance!r} must be in [0, 1)")
        self.capture_at = capture_at
        self.bases = (b1, b2)
        self.tolerance = tolerance
        self.notes: list[str] = []
        self.captures = 0
        self.checks: list[Check] = []
        self._fit: BatchFit | None = None
        self._off = ""  # why scaling is off for the model ("" while it holds)
        self._made: dict[int, BatchTrace] = {}

    @property
    def scaling(self) -> bool:
        """Scaling holds so far (it is off after a disagreement or a failed check)."""
        self._ensure_fit()
        return not self._off

    def trace(self, batch: int) -> BatchTrace:
        """The trace at `batch`, scaled where the fit holds, else captured."""
        if not _is_int(batch) or batch < 1:
            raise ScalingError(f"batch={batch!r} must be an integer >= 1")
        made = self._made.get(batch)
        if made is not None:
            return made
        if batch == 1:
            return self._captured(1, "batch 1 is always captured (NOTE [ Batch scaling ])")
        self._ensure_fit()
        if self._off or self._fit is None:
            return self._captured(batch, self._off)
        try:
            made = BatchTrace(self._fit.at(batch), True)
        except ScalingError as e:
            self._say(f"batch {batch} captured, not scaled: {e}")
            return self._captured(batch, str(e))
        self._made[batch] = made
        return made

    def check(self, batch: int) -> Check:
        """Capture at `batch` and compare with the scaled trace; a mismatch
        turns scaling off (NOTE [ Batch scaling ])."""
        self._ensure_fit()
        if self._off or self._fit is None or batch in self.bases:
            raise ScalingError(f"check at batch {batch}: {self._off or 'a base batch'}")
        captured = self._capture(batch)
        try:
            scaled = self._fit.at(batch)
        except ScalingError as e:
            worst, reason, scaled_peak = float("inf"), str(e), 0
        else:
            worst, reason = mismatch(scaled, captured, self.tolerance)
            scaled_peak = scaled.peak()[0]
        check = Check(batch, not reason, worst, scaled_peak, captured.peak()[0], reason)
        self.checks.append(check)
        if reason:
            self._turn_off(
                f"the scaled trace at batch {batch} does not match its capture: {reason}"
            )
        self._made[batch] = BatchTrace(captured, False, "the check capture")
        return check

    # ---- internals -------------------------------------------------------------------
    def _capture(self, batch: int) -> Trace:
        self.captures += 1
        return self.capture_at(batch)

    def _captured(self, batch: int, note: str) -> BatchTrace:
        made = BatchTrace(self._capture(batch), False, note)
        self._made[batch] = made
        return made

    def _say(self, line: str) -> None:
        if line not in self.notes:
            self.notes.append(line)

    def _turn_off(self, reason: str) -> None:
        self._off = reason
        self._say(f"scaling off, every batch is captured: {reason}")
        self._made = {b: m for b, m in self._made.items() if not m.scaled}

    def _ensure_fit(self) -> None:
        if self._fit is not None or self._off:
            return
        b1, b2 = self.bases
        t1, t2 = self._capture(b1), self._capture(b2)
        self._made[b1] = BatchTrace(t1, False, "a base capture")
        self._made[b2] = BatchTrace(t2, False, "a base capture")
        try:
            self._fit = fit(t1, t2)
        except ScalingError as e:
            self._turn_off(str(e))


def model_captures(
    model: str, options: CaptureOptions | None = None, built: ModelOptions | None = None
) -> Callable[[int], Trace]:
    """`batch -> Trace`: captures of the workload `model` (a name
    `traces.zoo.resolve` takes) with `options`, its model built with `built`
    (recorded in each trace's ``meta.extra``)."""
    from memplan.traces.builders import ModelOptions, recorded
    from memplan.traces.capture import capture
    from memplan.traces.zoo import resolve

    built = built or ModelOptions()
    factory = resolve(model, built)

    def capture_at(batch: int) -> Trace:
        return recorded(capture(factory, batch, options, model_name=model), built)

    return capture_at

"""Tiny traces and a device whose op latencies work out by hand.

`device()` has round figures (1 TFLOP/s float32, 100 GB/s, 5 us per kernel);
`make(calls)` builds a valid trace from `Call`s: each call reads fresh input
views of the given shapes and writes one output of the given shape, args in
the JSON form capture writes (tensors as {"view": id}).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from memplan.hwmodels.profile import Hardware
from memplan.traces.io import DTYPE_BYTES
from memplan.traces.model import Buffer, BufferKind, Op, Phase, Trace, TraceMeta, View


def device(name: str = "hand-gpu", **overrides: Any) -> Hardware:
    fields: dict[str, Any] = dict(
        name=name,
        memory_bytes=16 << 30,
        h2d_bytes_per_s=25e9,
        d2h_bytes_per_s=25e9,
        transfer_fixed_s=2.5e-6,
        copy_engines=2,
        h2d_duplex_factor=0.5,
        peak_flops={"float32": 1e12, "float16": 4e12},
        mem_bw_bytes_per_s=1e11,
        launch_overhead_s=5e-6,
        source={},
    )
    fields.update(overrides)
    return Hardware(**fields)


@dataclass(frozen=True)
class Call:
    """One op: `inputs` are shapes (or (shape, stride) pairs for strided
    views); `args` holds the call with "$0", "$1", ... standing for input views
    and "$out" for the output view."""

    target: str
    inputs: tuple[Any, ...]
    out: tuple[int, ...] | None
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)
    flops: int = 0
    dtype: str = "float32"
    phase: Phase = Phase.FORWARD
    inplace: bool = False  # writes its first input instead of a new output
    input_dtypes: tuple[str, ...] = ()  # per input, where not `dtype` (indices: int64)


def _contig(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= n
    return tuple(reversed(stride))


def _sub(a: Any, refs: dict[str, int | None]) -> Any:
    """Replace "$0", "$out", ... by view references."""
    if isinstance(a, str) and a in refs:
        return {"view": refs[a]}
    if isinstance(a, list):
        return [_sub(y, refs) for y in a]
    if isinstance(a, dict):
        return {k: _sub(y, refs) for k, y in a.items()}
    return a


def make(calls: list[Call]) -> Trace:
    buffers: list[Buffer] = []
    views: list[View] = []
    ops: list[Op] = []

    def view(shape, stride, dtype: str, kind: BufferKind, op_id: int) -> int:  # noqa: ANN001
        b = len(buffers)
        span = 0 if 0 in shape else 1 + sum((n - 1) * s for n, s in zip(shape, stride))
        buffers.append(Buffer(b, max(span, math.prod(shape)) * DTYPE_BYTES[dtype], kind,
                              freed_after=op_id))  # fmt: skip
        views.append(View(len(views), b, tuple(shape), tuple(stride), 0, dtype))
        return len(views) - 1

    for i, c in enumerate(calls):
        ins = []
        for j, x in enumerate(c.inputs):
            shape, stride = x if x and isinstance(x[0], tuple) else (tuple(x), _contig(tuple(x)))
            dtype = c.input_dtypes[j] if j < len(c.input_dtypes) else c.dtype
            ins.append(view(shape, stride, dtype, BufferKind.INPUT, i))
        writes = [ins[0]] if c.inplace else []
        out = None
        if c.out is not None and not c.inplace:
            out = view(c.out, _contig(c.out), c.dtype, BufferKind.ACTIVATION, i)
            writes.append(out)

        refs = {"$out": out, **{f"${j}": v for j, v in enumerate(ins)}}
        args = {"args": _sub(list(c.args), refs), "kwargs": _sub(dict(c.kwargs), refs)}
        ops.append(Op(i, c.target, c.phase, tuple(ins), tuple(writes), args, c.flops))
    return Trace(TraceMeta("hand", 1), tuple(buffers), tuple(views), tuple(ops))


def mm(m: int, k: int, n: int, flops: int | None = None) -> Call:
    """mm of (m, k) @ (k, n), float32; flops default to the torch count 2mkn."""
    return Call("aten.mm.default", ((m, k), (k, n)), (m, n), ["$0", "$1"],
                flops=2 * m * k * n if flops is None else flops)  # fmt: skip


def add(numel: int) -> Call:
    return Call("aten.add.Tensor", ((numel,), (numel,)), (numel,), ["$0", "$1"])

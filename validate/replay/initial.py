"""The iteration's starting state: seeded bytes for every buffer that exists
before op 0 (persistent buffers and inputs).

Values are made on the host from a generator seeded by (seed, buffer id), so
a buffer's bytes depend on nothing else: the same on CPU and CUDA, whatever
the other buffers are, in every iteration."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from memplan.traces.io import DTYPE_BYTES
from memplan.traces.model import Buffer, BufferKind, Trace

# NOTE [ Initial values ]
# The replay checks that a plan never changes what is computed, so values
# must exercise the arithmetic (random, not zeros) and keep every op finite:
# - floating params: randn / sqrt(fan_in) for weights (a view of two or more
#   dims: fan_in is the product of all dims but the first, as in Kaiming
#   init), which keeps activations O(1) through deep stacks; 0.1 * randn for
#   vectors (biases, norm scales) and module buffers; inputs: randn.
# - optimizer state: 0.01 * randn, except second moments, which a real
#   optimizer keeps non-negative and takes the square root of
#   (`exp_avg_sq`, `max_exp_avg_sq`, `square_avg`, Adagrad's `sum`): their
#   absolute value. A BatchNorm `running_var` is a variance: 1 + |0.1 randn|.
# - integer inputs are labels or indices: see NOTE [ Index ranges ].
# - other integer buffers (`num_batches_tracked`) start at 0, bool inputs
#   are random bits, other bool buffers False.

# NOTE [ Index ranges ]
# An integer input is only valid in the range the ops consuming it accept:
# class labels must be < the number of classes, token ids < the embedding's
# rows. We read that bound from how the trace uses the buffer: for every op in
# `INDEX_BOUNDS` whose index argument is a view of the buffer, the bound is
# the size of the dimension it indexes (the logits' class dimension for
# `nll_loss`, the weight's rows for `embedding`, `num_weights` for its
# backward, `self.size(dim)` for `gather` / `index_select` / `scatter`, the
# indexed dimension for `index.Tensor`). A buffer copied into another
# (`clone`, `_to_copy`, `copy_`) inherits the bound of its copy. The smallest
# bound over all uses wins, and values are uniform in [0, bound). An integer
# input no recognised op consumes gets zeros: 0 is a valid index into any
# non-empty dimension, so the replay cannot fail on it (a new index op
# should be added to the table rather than relying on that).


NON_NEGATIVE = frozenset({"exp_avg_sq", "max_exp_avg_sq", "square_avg", "sum"})

# target -> function(args, shape of a view) -> [(index view id, bound)]
Shape = Callable[[int], tuple[int, ...]]
BoundRule = Callable[[list[Any], Shape], list[tuple[int, int]]]


def _view(x: Any) -> int | None:
    return x["view"] if isinstance(x, dict) and "view" in x else None


def _classes(shape: tuple[int, ...]) -> int:
    return shape[0] if len(shape) == 1 else shape[1]


def _nll(target_pos: int, self_pos: int) -> BoundRule:
    def rule(a: list[Any], shape: Shape) -> list[tuple[int, int]]:
        t, s = _view(a[target_pos]), _view(a[self_pos])
        return [] if t is None or s is None else [(t, _classes(shape(s)))]

    return rule


def _dim_rule(index_pos: int) -> BoundRule:
    """`op(self, dim, index, ...)`: the index addresses `self.size(dim)`."""

    def rule(a: list[Any], shape: Shape) -> list[tuple[int, int]]:
        i, s = _view(a[index_pos]), _view(a[0])
        if i is None or s is None:
            return []
        sh = shape(s)
        return [(i, sh[a[1] % len(sh)] if sh else 1)]

    return rule


def _embedding(a: list[Any], shape: Shape) -> list[tuple[int, int]]:
    i, w = _view(a[1]), _view(a[0])
    return [] if i is None or w is None else [(i, shape(w)[0])]


def _embedding_backward(a: list[Any], shape: Shape) -> list[tuple[int, int]]:
    i = _view(a[1])
    return [] if i is None else [(i, int(a[2]))]


def _index(a: list[Any], shape: Shape) -> list[tuple[int, int]]:
    s = _view(a[0])
    if s is None:
        return []
    sh = shape(s)
    return [(v, sh[d]) for d, x in enumerate(a[1]) if (v := _view(x)) is not None and d < len(sh)]


INDEX_BOUNDS: dict[str, BoundRule] = {
    "aten.nll_loss_forward.default": _nll(1, 0),
    "aten.nll_loss2d_forward.default": _nll(1, 0),
    "aten.nll_loss_backward.default": _nll(2, 1),
    "aten.nll_loss2d_backward.default": _nll(2, 1),
    "aten.embedding.default": _embedding,
    "aten.embedding_dense_backward.default": _embedding_backward,
    "aten.index_select.default": _dim_rule(2),
    "aten.gather.default": _dim_rule(2),
    "aten.scatter.src": _dim_rule(2),
    "aten.scatter_add.default": _dim_rule(2),
    "aten.index.Tensor": _index,
}
# target -> (source position, destination position or None for the output)
COPIES: dict[str, tuple[int, int | None]] = {
    "aten.clone.default": (0, None),
    "aten._to_copy.default": (0, None),
    "aten.copy_.default": (1, 0),
}


def index_bounds(trace: Trace) -> dict[int, int]:
    """Upper bound (exclusive) on the values of each integer buffer used as
    labels or indices, by buffer id. See NOTE [ Index ranges ]."""
    vb = trace.view_buffer
    bound: dict[int, int] = {}

    def shape(v: int) -> tuple[int, ...]:
        return trace.views[v].shape

    def tighten(b: int, n: int) -> None:
        bound[b] = min(bound.get(b, n), n)

    for op in trace.ops:
        rule = INDEX_BOUNDS.get(op.target)
        if rule is not None:
            for v, n in rule(op.args.get("args", []), shape):
                tighten(int(vb[v]), n)
    for op in reversed(trace.ops):  # later copies first: chains propagate back in one pass
        copy = COPIES.get(op.target)
        args = op.args.get("args", [])
        if copy is None or len(args) <= copy[0] or (src := _view(args[copy[0]])) is None:
            continue
        dst_views = op.writes if copy[1] is None else [_view(args[copy[1]])]
        for dv in dst_views:
            if dv is not None and int(vb[dv]) in bound:
                tighten(int(vb[src]), bound[int(vb[dv])])
    return bound


def _generator(seed: int, buffer: int) -> torch.Generator:
    state = np.random.SeedSequence([seed, buffer]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state) & ((1 << 63) - 1))


_RANDN_DTYPES = frozenset(
    {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64, torch.complex128}
)


def _values(
    buf: Buffer,
    dtype: torch.dtype,
    shape: tuple[int, ...],
    n: int,
    bound: int | None,
    g: torch.Generator,
) -> torch.Tensor:
    """`n` values of `dtype` for `buf` (first seen as `shape`), by NOTE [ Initial values ]."""
    if dtype.is_floating_point or dtype.is_complex:
        x = torch.randn(n, generator=g, dtype=dtype if dtype in _RANDN_DTYPES else torch.float32)
        leaf = buf.name.rsplit(".", 1)[-1]
        if buf.kind is BufferKind.OPTIMIZER_STATE:
            x = 0.01 * x
            x = x.abs().to(x.dtype) if leaf in NON_NEGATIVE else x
        elif leaf == "running_var":
            x = 1 + (0.1 * x).abs().to(x.dtype)
        elif buf.kind is BufferKind.PARAM and len(shape) >= 2:
            x = x / math.sqrt(max(math.prod(shape[1:]), 1))
        elif buf.kind is not BufferKind.INPUT:
            x = 0.1 * x
        return x.to(dtype)
    if dtype is torch.bool:
        if buf.kind is BufferKind.INPUT:
            return torch.randint(0, 2, (n,), generator=g).to(torch.bool)
        return torch.zeros(n, dtype=torch.bool)
    if buf.kind is BufferKind.INPUT and bound is not None and bound > 1:
        return torch.randint(0, bound, (n,), generator=g, dtype=torch.int64).to(dtype)
    return torch.zeros(n, dtype=dtype)


def _natural_shapes(trace: Trace) -> dict[int, tuple[int, ...]]:
    """Per buffer, the shape of its first contiguous view over all of it (a
    weight as its module holds it, not the transpose a matmul reads), else
    of its first view."""
    first: dict[int, tuple[int, ...]] = {}
    whole: dict[int, tuple[int, ...]] = {}
    for v in trace.views:
        first.setdefault(v.buffer, v.shape)
        if v.buffer in whole or v.offset != 0:
            continue
        expected, n = [], 1
        for size in reversed(v.shape):
            expected.append(n)
            n *= size
        item = DTYPE_BYTES[v.dtype]
        if tuple(reversed(expected)) == v.stride and n * item == trace.buffers[v.buffer].nbytes:
            whole[v.buffer] = v.shape
    return first | whole


def initial_bytes(
    trace: Trace, buffer_dtype: tuple[torch.dtype, ...], seed: int
) -> dict[int, torch.Tensor]:
    """Host uint8 tensors (exactly `nbytes` long) for every buffer that
    exists at iteration start, by buffer id. See NOTE [ Initial values ]."""
    bounds = index_bounds(trace)
    shapes = _natural_shapes(trace)
    out = {}
    for b in np.flatnonzero(trace.exists_at_start):
        buf = trace.buffers[int(b)]
        dtype = buffer_dtype[buf.id]
        n = buf.nbytes // dtype.itemsize
        raw = torch.zeros(buf.nbytes, dtype=torch.uint8)
        if n:
            shape = shapes.get(buf.id, (n,))
            vals = _values(buf, dtype, shape, n, bounds.get(buf.id), _generator(seed, buf.id))
            raw[: n * dtype.itemsize] = vals.contiguous().view(torch.uint8)
        out[buf.id] = raw
    return out

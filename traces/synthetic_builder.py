"""The op-by-op builder behind `traces.synthetic`: forward layers, the
backward pass in autograd-engine order, SGD updates, and the finished `Trace`.

See NOTE [ What a synthetic step looks like ] in `traces/synthetic.py`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from memplan.traces.model import Buffer, BufferKind, Op, Phase, SavedTensor, Trace, TraceMeta, View

MiB = 1 << 20
SCALAR_NBYTES = 4  # the loss and its seed grad: float32 scalars
SGD_KWARGS: dict[str, Any] = {
    "weight_decay": 0.0,
    "momentum": 0.9,
    "lr": 0.01,
    "dampening": 0.0,
    "nesterov": False,
    "maximize": False,
    "is_first_step": False,
}
_ITEMSIZE = {"float32": 4, "bool": 1}


class Grain(enum.Enum):
    """The grain of synthetic op durations; the value is microseconds."""

    US = 1
    MS = 1000


@dataclass(frozen=True, slots=True)
class Durations:
    """Op durations: whole `unit`s drawn from the seed, uniformly in lo..hi
    (inclusive). ``Durations(Grain.MS, 1, 1)`` makes every op 1 ms."""

    unit: Grain = Grain.US
    lo: int = 1
    hi: int = 9

    def __post_init__(self) -> None:
        if not 1 <= self.lo <= self.hi:
            raise ValueError(f"Durations lo={self.lo}, hi={self.hi}: need 1 <= lo <= hi")


class Family(enum.Enum):
    CHAIN = "chain"
    RESIDUAL = "residual"
    UNET = "unet"
    RANDOM_DAG = "random_dag"


class _Kind(enum.Enum):
    CONV = enum.auto()
    MM = enum.auto()
    RELU = enum.auto()
    ADD = enum.auto()
    CAT = enum.auto()
    DROPOUT = enum.auto()


@dataclass(frozen=True, slots=True)
class _Node:
    """A differentiable forward op, with what its backward needs (view ids)."""

    kind: _Kind
    module: str
    inputs: tuple[int, ...]
    output: int
    weight: int | None = None
    stride: int = 1
    transposed: bool = False
    mask: int | None = None


@dataclass(slots=True)
class _BufferSpec:
    nbytes: int
    kind: BufferKind
    name: str
    persistent: bool = False
    to_end: bool = False  # resident until the step ends (inputs, grads without optimizer)


class _Builder:
    """Emits ops in execution order: forward nodes onto a tape, then the loss,
    backward by walking the tape in reverse, then the optimizer."""

    def __init__(self, *, optimizer: bool) -> None:
        self.optimizer = optimizer
        self.phase = Phase.FORWARD
        self.buffers: list[_BufferSpec] = []
        self.views: list[View] = []
        self.ops: list[Op] = []
        self.saved: list[SavedTensor] = []
        self.tape: list[_Node] = []
        self.params: list[tuple[int, str]] = []  # (weight view, module) in creation order
        self.param_grads: dict[int, int] = {}  # weight view -> grad view
        self.needs_grad: set[int] = set()  # views whose grad backward computes

    # ---- buffers, views, ops -----------------------------------------------------
    def tensor(
        self,
        nbytes: int,
        kind: BufferKind,
        name: str,
        *,
        dtype: str = "float32",
        scalar: bool = False,
        persistent: bool = False,
        to_end: bool = False,
    ) -> int:
        """A new buffer and its full view: 1-D, or 0-d for a scalar."""
        bid = len(self.buffers)
        self.buffers.append(_BufferSpec(nbytes, kind, name, persistent, to_end))
        shape = () if scalar else (nbytes // _ITEMSIZE[dtype],)
        return self._view(bid, shape, 0, dtype)

    def _view(self, buffer: int, shape: tuple[int, ...], offset: int, dtype: str) -> int:
        vid = len(self.views)
        self.views.append(View(vid, buffer, shape, (1,) * len(shape), offset, dtype))
        return vid

    def numel(self, view: int) -> int:
        return math.prod(self.views[view].shape)

    def nbytes(self, view: int) -> int:
        return self.buffers[self.views[view].buffer].nbytes

    def name(self, view: int) -> str:
        return self.buffers[self.views[view].buffer].name

    def emit(
        self,
        target: str,
        module: str,
        args: list[Any],
        writes: tuple[int, ...],
        flops: int,
        *,
        kwargs: dict[str, Any] | None = None,
        rng: bool = False,
    ) -> None:
        """Append an op of the current phase; it reads the views its args name."""
        reads = tuple(dict.fromkeys(_views_in(args)))
        call = {"args": args, "kwargs": kwargs or {}}
        op = Op(
            len(self.ops), target, self.phase, reads, writes, call, flops, module=module, rng=rng
        )
        self.ops.append(op)

    def save(self, module: str, *views: int) -> None:
        for v in views:
            self.saved.append(SavedTensor(len(self.saved), v, module))

    def activation(self, nbytes: int, module: str) -> int:
        return self.tensor(nbytes, BufferKind.ACTIVATION, f"{module}:out")

    def grad_of(self, x: int) -> int:
        """A new buffer for the grad of activation `x`, named after it."""
        return self.tensor(self.nbytes(x), BufferKind.ACTIVATION, f"{self.name(x)}.grad")

    def layer_flops(self, out: int, weight: int) -> int:
        return 2 * self.numel(out) * math.isqrt(self.numel(weight))

    # ---- forward ---------------------------------------------------------------
    def batch(self, input_nbytes: int, target_nbytes: int) -> tuple[int, int]:
        x = self.tensor(input_nbytes, BufferKind.INPUT, "input", to_end=True)
        y = self.tensor(target_nbytes, BufferKind.INPUT, "target", to_end=True)
        return x, y

    def param(self, module: str, nbytes: int) -> int:
        w = self.tensor(nbytes, BufferKind.PARAM, f"{module}.weight", persistent=True)
        self.params.append((w, module))
        return w

    def _node(self, node: _Node) -> int:
        self.tape.append(node)
        if node.weight is not None or any(x in self.needs_grad for x in node.inputs):
            self.needs_grad.add(node.output)
        return node.output

    def conv(
        self,
        x: int,
        w: int,
        module: str,
        *,
        out_nbytes: int = 0,
        stride: int = 1,
        transposed: bool = False,
    ) -> int:
        """A 1x1 convolution (transposed: the decoder's up-convolution)."""
        y = self.activation(out_nbytes or self.nbytes(x), module)
        args = [_ref(x), _ref(w), *_conv_tail(stride, transposed)]
        self.emit("aten.convolution.default", module, args, (y,), self.layer_flops(y, w))
        self.save(module, x, w)
        return self._node(_Node(_Kind.CONV, module, (x,), y, w, stride, transposed))

    def mm(self, x: int, w: int, module: str, *, out_nbytes: int) -> int:
        y = self.activation(out_nbytes, module)
        self.emit("aten.mm.default", module, [_ref(x), _ref(w)], (y,), self.layer_flops(y, w))
        self.save(module, x, w)
        return self._node(_Node(_Kind.MM, module, (x,), y, w))

    def relu(self, x: int, module: str) -> int:
        y = self.activation(self.nbytes(x), module)
        self.emit("aten.relu.default", module, [_ref(x)], (y,), self.numel(y))
        self.save(module, y)  # relu backward needs its result, not its input
        return self._node(_Node(_Kind.RELU, module, (x,), y))

    def add(self, a: int, b: int, module: str) -> int:
        y = self.activation(self.nbytes(a), module)
        self.emit("aten.add.Tensor", module, [_ref(a), _ref(b)], (y,), self.numel(y))
        return self._node(_Node(_Kind.ADD, module, (a, b), y))

    def cat(self, xs: tuple[int, ...], module: str) -> int:
        y = self.activation(sum(self.nbytes(x) for x in xs), module)
        self.emit("aten.cat.default", module, [[_ref(x) for x in xs], 1], (y,), 0)
        return self._node(_Node(_Kind.CAT, module, xs, y))

    def dropout(self, x: int, module: str, p: float = 0.5) -> int:
        y = self.activation(self.nbytes(x), module)
        mask = self.tensor(self.numel(x), BufferKind.ACTIVATION, f"{module}:mask", dtype="bool")
        args = [_ref(x), p, True]
        self.emit(
            "aten.native_dropout.default", module, args, (y, mask), 2 * self.numel(y), rng=True
        )
        self.save(module, mask)
        return self._node(_Node(_Kind.DROPOUT, module, (x,), y, mask=mask))

    def mse(self, out: int, target: int) -> int:
        loss = self.tensor(SCALAR_NBYTES, BufferKind.ACTIVATION, "loss", scalar=True)
        args = [_ref(out), _ref(target), 1]  # reduction=mean
        self.emit("aten.mse_loss.default", "loss", args, (loss,), 3 * self.numel(out))
        self.save("loss", out, target)
        return loss

    def clone(self, x: int) -> None:
        """A no-grad copy of `x` that nothing reads (logging the output): padding."""
        y = self.activation(self.nbytes(x), "metric")
        self.emit("aten.clone.default", "metric", [_ref(x)], (y,), 0)

    # ---- backward ---------------------------------------------------------------
    def backward(self, loss: int, out: int, target: int) -> None:
        self.phase = Phase.BACKWARD
        seed = self.tensor(SCALAR_NBYTES, BufferKind.ACTIVATION, "loss.grad", scalar=True)
        self.emit("aten.ones_like.default", "loss", [_ref(loss)], (seed,), 0)
        g = self.grad_of(out)
        args = [_ref(seed), _ref(out), _ref(target), 1]
        self.emit("aten.mse_loss_backward.default", "loss", args, (g,), 2 * self.numel(out))
        grads = {out: g}
        for node in reversed(self.tape):
            gy = grads.pop(node.output, None)
            if gy is None:  # not on a path to the loss
                continue
            for x, gx in self._node_backward(node, gy):
                if x in grads:  # a second use of x: the engine sums the grads
                    total = self.grad_of(x)
                    args = [_ref(grads[x]), _ref(gx)]
                    self.emit("aten.add.Tensor", "", args, (total,), self.numel(total))
                    gx = total
                grads[x] = gx

    def _node_backward(self, n: _Node, gy: int) -> list[tuple[int, int]]:
        """Emit the backward ops of `n`; return (input, its grad) pairs."""
        m, x, w = n.module, n.inputs[0], n.weight
        need_x = x in self.needs_grad
        if n.kind is _Kind.CONV:
            assert w is not None
            gx = self.grad_of(x) if need_x else None
            gw = self._param_grad(w)
            args = [_ref(gy), _ref(x), _ref(w), *_conv_tail(n.stride, n.transposed)]
            args.append([need_x, True, False])  # output_mask: input, weight, bias
            flops = self.layer_flops(gy, w) * (2 if need_x else 1)
            writes = (gw,) if gx is None else (gx, gw)
            self.emit("aten.convolution_backward.default", m, args, writes, flops)
            return [] if gx is None else [(x, gx)]
        if n.kind is _Kind.MM:
            assert w is not None
            pairs = []
            if need_x:
                gx = self.grad_of(x)
                self.emit("aten.mm.default", m, [_ref(gy), _ref(w)], (gx,), self.layer_flops(gy, w))
                pairs.append((x, gx))
            gw = self._param_grad(w)
            self.emit("aten.mm.default", m, [_ref(x), _ref(gy)], (gw,), self.layer_flops(gy, w))
            return pairs
        if n.kind is _Kind.RELU:
            gx = self.grad_of(x)
            args = [_ref(gy), _ref(n.output), 0]
            self.emit("aten.threshold_backward.default", m, args, (gx,), self.numel(gx))
            return [(x, gx)]
        if n.kind is _Kind.DROPOUT:
            assert n.mask is not None
            gx = self.grad_of(x)
            args = [_ref(gy), _ref(n.mask), 2.0]  # scale = 1 / (1 - p)
            self.emit("aten.native_dropout_backward.default", m, args, (gx,), self.numel(gx))
            return [(x, gx)]
        if n.kind is _Kind.ADD:  # the grad passes to both operands as it is
            return [(a, gy) for a in n.inputs if a in self.needs_grad]
        # CAT: each input's grad is a slice view of the output's grad
        pairs, start = [], self.views[gy].offset
        for a in n.inputs:
            k = self.numel(a)
            if a in self.needs_grad:
                pairs.append((a, self._view(self.views[gy].buffer, (k,), start, "float32")))
            start += k
        return pairs

    def _param_grad(self, w: int) -> int:
        g = self.tensor(
            self.nbytes(w), BufferKind.GRAD, f"{self.name(w)}.grad", to_end=not self.optimizer
        )
        self.param_grads[w] = g
        return g

    # ---- optimizer and the finished trace ----------------------------------------
    def sgd_step(self) -> None:
        self.phase = Phase.OPTIMIZER
        for w, module in self.params:
            g = self.param_grads.get(w)
            if g is None:
                continue
            kind, name = BufferKind.OPTIMIZER_STATE, f"{self.name(w)}.momentum_buffer"
            mom = self.tensor(self.nbytes(w), kind, name, persistent=True)
            args = [[_ref(w)], [_ref(g)], [_ref(mom)]]
            flops = 4 * self.numel(w)
            self.emit(
                "aten._fused_sgd_.default", module, args, (w, mom), flops, kwargs=dict(SGD_KWARGS)
            )

    def step(self, out: int, target: int, *, pad_ops: int) -> None:
        """Loss, `pad_ops` clones of the output, backward, optimizer."""
        if pad_ops < 0:
            raise ValueError(f"pad_ops={pad_ops} must be >= 0")
        loss = self.mse(out, target)
        for _ in range(pad_ops):
            self.clone(out)
        self.backward(loss, out, target)
        if self.optimizer:
            self.sgd_step()

    def finish(self, model: str, extra: dict[str, Any], durations_us: np.ndarray) -> Trace:
        last = len(self.ops) - 1
        last_access = [-1] * len(self.buffers)
        for op in self.ops:
            for v in op.reads + op.writes:
                last_access[self.views[v].buffer] = op.id
        buffers = []
        for i, s in enumerate(self.buffers):
            freed = None if s.persistent else last if s.to_end else last_access[i]
            assert freed != -1, f"buffer {i} ({s.name}) is never accessed"
            buffers.append(Buffer(i, s.nbytes, s.kind, s.persistent, s.name, freed))
        ops = tuple(replace(op, duration_us=float(d)) for op, d in zip(self.ops, durations_us))
        optimizer = "sgd" if self.optimizer else ""
        meta = TraceMeta(f"synthetic.{model}", 1, optimizer=optimizer, device="meta", extra=extra)
        return Trace(meta, tuple(buffers), tuple(self.views), ops, tuple(self.saved))


def _ref(view: int) -> dict[str, int]:
    return {"view": view}


def _views_in(x: Any) -> list[int]:
    if isinstance(x, dict):
        return [x["view"]] if "view" in x else []
    if isinstance(x, list):
        return [v for y in x for v in _views_in(y)]
    return []


def _conv_tail(stride: int, transposed: bool) -> list[Any]:
    """convolution's args after input and weight: bias, stride, padding,
    dilation, transposed, output_padding, groups."""
    return [None, [stride, stride], [0, 0], [1, 1], transposed, [0, 0], 1]

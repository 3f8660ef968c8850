"""Seeded synthetic training iterations for tests of planners and the simulator.

Every generator returns a full, valid `Trace` of one training step: forward
layers, an MSE loss against a target, the backward pass in the order
PyTorch's autograd engine runs it, and (unless ``optimizer=False``) one
SGD-with-momentum update per parameter. Sizes are whole MiB, so expected
memory works out by hand; each docstring states the peaks of a small case
and the tests check exactly those numbers.

# NOTE [ What a synthetic step looks like ]
- Buffers: the batch and the target are `input` buffers resident from the
  start and freed after the last op. Weights (`param`) and momentum buffers
  (`optimizer_state`) are persistent. Each weight's `grad` is freed after the
  optimizer op that consumes it (without an optimizer it stays to the end of
  the step, the step's result). Every other buffer is an `activation`, freed
  after its last access -- what PyTorch does for a temporary once its last
  reference (an autograd node holding a saved tensor, or a pending grad)
  goes away. So `framework` and `liveness` peaks differ only by the inputs
  (and, without an optimizer, the grads).
- The loss (`aten.mse_loss.default`) and the backward seed
  (`aten.ones_like.default`) are 4-byte scalars: the only sizes that are
  not whole MiB.
- Backward follows the engine: nodes run in reverse creation order; a tensor
  used twice gets its grad summed by an `aten.add.Tensor` emitted when the
  second contribution arrives; `add` and `cat` backward are free (the grad,
  or slices of it, pass through as views).
- Every buffer has one contiguous 1-D view of all its elements (plus slice
  views of concatenation grads). Targets and argument layouts are those of
  the real aten ops, but shapes are flat: the traces are for planners and the
  simulator, not for replay with real tensors.
- Layer FLOPs are those of a 1x1 convolution (a matmul) whose weight is a
  square matrix: ``2 * out_elements * isqrt(weight_elements)``; elementwise
  ops count one FLOP per element. Durations are whole `TimeUnit`s drawn from
  the seed (`Durations`).
"""

from __future__ import annotations

import enum
import functools
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from traces.model import Buffer, BufferKind, Op, Phase, SavedTensor, Trace, TraceMeta, View

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


class TimeUnit(enum.Enum):
    """The grain of synthetic op durations; the value is microseconds."""

    US = 1
    MS = 1000


@dataclass(frozen=True, slots=True)
class Durations:
    """Op durations: whole `unit`s drawn from the seed, uniformly in lo..hi
    (inclusive). ``Durations(TimeUnit.MS, 1, 1)`` makes every op 1 ms."""

    unit: TimeUnit = TimeUnit.US
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


# ---- the generators ----------------------------------------------------------------
def _positive(**values: int) -> None:
    for name, v in values.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{name}={v!r} must be an integer >= 1")


def _finish(
    b: _Builder,
    family: Family,
    params: dict[str, Any],
    seed: int,
    durations: Durations,
) -> Trace:
    rng = np.random.default_rng(np.random.SeedSequence(seed).spawn(1)[0])
    units = rng.integers(durations.lo, durations.hi + 1, size=len(b.ops))
    extra = {
        "generator": family.value,
        **params,
        "optimizer": b.optimizer,
        "seed": seed,
        "durations": [durations.unit.name.lower(), durations.lo, durations.hi],
    }
    return b.finish(family.value, extra, units * durations.unit.value)


def chain(
    n_layers: int,
    *,
    act_mib: int = 1,
    param_mib: int = 1,
    optimizer: bool = True,
    seed: int = 0,
    durations: Durations = Durations(),
    pad_ops: int = 0,
) -> Trace:
    """A stack of `n_layers` 1x1 convolutions, ``layer1`` .. ``layerN``.

    L = n_layers, A = act_mib, P = param_mib (in MiB). Ops: L convolutions,
    the loss, ``ones_like``, ``mse_loss_backward``, L ``convolution_backward``
    (``layer1``'s computes no input grad), then L SGD updates: 3L + 3 ops
    (2L + 3 without optimizer), plus `pad_ops` clones of the output after the
    loss. Buffers: input and target (A each), L weights and L momentum
    buffers (P each), L outputs, L activation grads (A each), L weight grads.

    Peaks, with an optimizer, L >= 2 and A >= P: under `framework` the
    first backward layer op (op L + 3) holds the outputs of layers 1..L-1,
    the grads in and out and ``layerL``'s weight grad; under `liveness` the
    target is dead by then, and ``mse_loss_backward`` (op L + 2), holding
    all L outputs, the target, the 4-byte seed and the new grad, is higher:

        framework = 2LP (weights, momentum) + 2A (batch, target) + (L + 1)A + P
        liveness  = 2LP + (L + 3)A + 4 B

    chain(3): framework 13 MiB at op 6, liveness 12 MiB + 4 B at op 5.
    """
    _positive(n_layers=n_layers, act_mib=act_mib, param_mib=param_mib)
    b = _Builder(optimizer=optimizer)
    x, y = b.batch(act_mib * MiB, act_mib * MiB)
    for i in range(1, n_layers + 1):
        m = f"layer{i}"
        x = b.conv(x, b.param(m, param_mib * MiB), m)
    b.step(x, y, pad_ops=pad_ops)
    params = {"n_layers": n_layers, "act_mib": act_mib, "param_mib": param_mib, "pad_ops": pad_ops}
    return _finish(b, Family.CHAIN, params, seed, durations)


def residual(
    n_blocks: int,
    *,
    act_mib: int = 1,
    param_mib: int = 1,
    optimizer: bool = True,
    seed: int = 0,
    durations: Durations = Durations(),
    pad_ops: int = 0,
) -> Trace:
    """A ``stem`` convolution, then `n_blocks` residual blocks
    ``blockI: h + conv2(relu(conv1(h)))``, then the loss.

    All activations are act_mib, all weights param_mib. Each block's input
    is read by ``conv1`` and by the skip ``add``, so in backward its grad
    is the sum (an ``aten.add.Tensor``) of the skip's and ``conv1``'s. Ops:
    1 + 4B forward, loss, 3 loss-backward, 1 + 4B backward, 1 + 2B SGD
    (B = n_blocks): 10B + 6 ops with an optimizer.

    residual(1) with A = P = 1 MiB (6 MiB of weights and momentum): the peak
    is at ``threshold_backward`` (op 9), holding the stem output, relu
    output, the block's output grad, the grads of relu and conv1 outputs and
    ``conv2``'s weight grad: framework 14 MiB, liveness 13 MiB (target dead).
    """
    _positive(n_blocks=n_blocks, act_mib=act_mib, param_mib=param_mib)
    A, P = act_mib * MiB, param_mib * MiB
    b = _Builder(optimizer=optimizer)
    x, y = b.batch(A, A)
    h = b.conv(x, b.param("stem", P), "stem")
    for i in range(n_blocks):
        m = f"block{i}"
        a = b.conv(h, b.param(f"{m}.conv1", P), f"{m}.conv1")
        r = b.relu(a, f"{m}.relu")
        c = b.conv(r, b.param(f"{m}.conv2", P), f"{m}.conv2")
        h = b.add(c, h, m)
    b.step(h, y, pad_ops=pad_ops)
    params = {"n_blocks": n_blocks, "act_mib": act_mib, "param_mib": param_mib, "pad_ops": pad_ops}
    return _finish(b, Family.RESIDUAL, params, seed, durations)


def unet(
    depth: int,
    *,
    act_mib: int = 1,
    param_mib: int = 1,
    optimizer: bool = True,
    seed: int = 0,
    durations: Durations = Durations(),
    pad_ops: int = 0,
) -> Trace:
    """A U-Net: `depth` encoder levels ``downD`` (conv, relu; stride 2 below
    the top), a bottleneck ``mid`` (conv, relu), and `depth` decoder levels
    ``upD`` (transposed conv, ``cat`` with the encoder's output at that level
    -- the long skip --, conv, relu), then the loss.

    Every activation is act_mib (real U-Nets shrink them with depth; equal
    sizes keep the arithmetic by hand), a concatenation 2 x act_mib, every
    weight param_mib. The encoder outputs live from their level's forward
    to its backward, and so does the grad of each concatenation: its second
    half is the skip's grad, added to the grad from the level below when the
    encoder's backward reaches it. Ops: 15 * depth + 8 with an optimizer.

    unet(1) with A = P = 1 MiB (8 MiB of weights and momentum): the peak is
    first reached at ``up0.conv``'s backward (op 12), which holds the skip,
    the bottleneck output, the concatenation and its grad (2 MiB each),
    ``up0.relu``'s input grad and a weight grad: framework 18 MiB, liveness
    17 MiB.
    """
    _positive(depth=depth, act_mib=act_mib, param_mib=param_mib)
    A, P = act_mib * MiB, param_mib * MiB
    b = _Builder(optimizer=optimizer)
    x, y = b.batch(A, A)
    skips, h = [], x
    for d in range(depth):
        m = f"down{d}"
        h = b.conv(h, b.param(f"{m}.conv", P), f"{m}.conv", stride=1 if d == 0 else 2)
        h = b.relu(h, f"{m}.relu")
        skips.append(h)
    h = b.relu(b.conv(h, b.param("mid.conv", P), "mid.conv", stride=2), "mid.relu")
    for d in reversed(range(depth)):
        m = f"up{d}"
        u = b.conv(h, b.param(f"{m}.upconv", P), f"{m}.upconv", stride=2, transposed=True)
        c = b.cat((u, skips[d]), m)
        h = b.relu(b.conv(c, b.param(f"{m}.conv", P), f"{m}.conv", out_nbytes=A), f"{m}.relu")
    b.step(h, y, pad_ops=pad_ops)
    params = {"depth": depth, "act_mib": act_mib, "param_mib": param_mib, "pad_ops": pad_ops}
    return _finish(b, Family.UNET, params, seed, durations)


# ---- random DAGs of an exact size ----------------------------------------------------
@dataclass(frozen=True, slots=True)
class _DagNode:
    kind: _Kind
    out_mib: int
    param_mib: int = 0
    skip: int = -1  # the other operand of an add: an earlier node


# (kind, cumulative probability) of the nodes after the first
_DAG_KINDS = ((_Kind.CONV, 0.3), (_Kind.MM, 0.5), (_Kind.RELU, 0.75), (_Kind.ADD, 1.0))


def _dag_specs(
    rng: np.random.Generator, n: int, *, act_mib: int, param_mib: int, window: int
) -> list[_DagNode]:
    """`n` node specs; the first k are the DAG of k nodes (node i uses only
    the i-th of each drawn array, so a longer DAG extends a shorter one)."""
    u_kind, u_skip = rng.random(n), rng.random(n)
    out_mib = rng.integers(1, act_mib + 1, n)
    w_mib = rng.integers(1, param_mib + 1, n)
    specs: list[_DagNode] = []
    for i in range(n):
        if i == 0:  # the batch needs no grad: start with a layer that has a weight
            kind = _Kind.CONV if u_kind[i] < 0.5 else _Kind.MM
        else:
            kind = next(k for k, p in _DAG_KINDS if u_kind[i] < p)
        if kind in (_Kind.CONV, _Kind.MM):
            specs.append(_DagNode(kind, int(out_mib[i]), int(w_mib[i])))
            continue
        size = specs[i - 1].out_mib
        same = [j for j in range(max(0, i - 1 - window), i - 1) if specs[j].out_mib == size]
        if kind is _Kind.ADD and same:
            specs.append(_DagNode(kind, size, skip=same[int(u_skip[i] * len(same))]))
        else:
            specs.append(_DagNode(_Kind.RELU, size))
    return specs


def _dag_op_counts(specs: list[_DagNode], *, optimizer: bool, dropout: bool) -> np.ndarray:
    """int64[len(specs)]: ops of the step built from the first k + 1 specs.

    Loss, ones_like and mse_loss_backward: 3. A node adds its forward op and:
    conv its backward and an SGD update; mm two backward ops (one for
    ``node0``, whose input needs no grad) and an update; relu its backward;
    add no backward but one grad accumulation (its skip operand now has two
    uses). Dropout: 2."""
    sgd = int(optimizer)
    per_node = {_Kind.CONV: 2 + sgd, _Kind.MM: 3 + sgd, _Kind.RELU: 2, _Kind.ADD: 2}
    inc = np.fromiter((per_node[s.kind] for s in specs), np.int64, len(specs))
    inc[0] = 2 + sgd
    return 3 + 2 * int(dropout) + np.cumsum(inc)


def _build_dag(
    specs: list[_DagNode],
    *,
    act_mib: int,
    optimizer: bool,
    dropout_after: int | None,
    pad_ops: int,
) -> _Builder:
    b = _Builder(optimizer=optimizer)
    x, y = b.batch(act_mib * MiB, specs[-1].out_mib * MiB)
    outs: list[int] = []
    h = x
    for i, s in enumerate(specs):
        m = f"node{i}"
        if s.kind is _Kind.CONV:
            h = b.conv(h, b.param(m, s.param_mib * MiB), m, out_nbytes=s.out_mib * MiB)
        elif s.kind is _Kind.MM:
            h = b.mm(h, b.param(m, s.param_mib * MiB), m, out_nbytes=s.out_mib * MiB)
        elif s.kind is _Kind.RELU:
            h = b.relu(h, m)
        else:
            h = b.add(h, outs[s.skip], m)
        outs.append(h)
        if i == dropout_after:
            h = b.dropout(h, "dropout")
    b.step(h, y, pad_ops=pad_ops)
    return b


def random_dag(
    n_ops: int,
    *,
    seed: int = 0,
    act_mib: int = 4,
    param_mib: int = 2,
    window: int = 4,
    dropout: bool = False,
    optimizer: bool = True,
    durations: Durations = Durations(),
) -> Trace:
    """A random training step of exactly `n_ops` ops: the size to draw in
    property tests (a 200-op step builds in a few milliseconds).

    Nodes ``node0`` .. ``nodeK`` form a spine (each reads the previous
    node's output; ``node0`` is a conv or mm reading the batch): 1x1 convs
    and mms with an output of 1..act_mib MiB and a weight of 1..param_mib
    MiB, relus, and adds whose second operand is an earlier node of the same
    size at most `window` nodes back (a skip connection: its grad is summed
    in backward). ``mm`` backward is two ops. `dropout` inserts one
    ``native_dropout`` (the only op with ``rng=True``; its mask is a bool
    buffer of a quarter of the output's bytes) after a random node. K is the
    largest size whose step fits in `n_ops`; the 0-3 ops left over are
    clones of the output after the loss. Smallest: 6 ops (5 without the
    optimizer), 2 more with dropout.
    """
    _positive(n_ops=n_ops, act_mib=act_mib, param_mib=param_mib, window=window)
    ss_structure, ss_dropout = np.random.SeedSequence(seed).spawn(3)[1:]
    rng = np.random.default_rng(ss_structure)
    specs = _dag_specs(rng, n_ops // 2 + 1, act_mib=act_mib, param_mib=param_mib, window=window)
    counts = _dag_op_counts(specs, optimizer=optimizer, dropout=dropout)
    k = int(np.searchsorted(counts, n_ops, side="right"))  # nodes whose step fits
    if k == 0:
        raise ValueError(f"n_ops={n_ops} is below the smallest random_dag ({counts[0]} ops)")
    after = int(np.random.default_rng(ss_dropout).random() * k) if dropout else None
    b = _build_dag(
        specs[:k],
        act_mib=act_mib,
        optimizer=optimizer,
        dropout_after=after,
        pad_ops=n_ops - int(counts[k - 1]),
    )
    assert len(b.ops) == n_ops, (len(b.ops), n_ops)
    params = {
        "n_ops": n_ops,
        "n_nodes": k,
        "act_mib": act_mib,
        "param_mib": param_mib,
        "window": window,
        "dropout": dropout,
    }
    return _finish(b, Family.RANDOM_DAG, params, seed, durations)


_GENERATORS = {Family.CHAIN: chain, Family.RESIDUAL: residual, Family.UNET: unet}


@functools.cache
def _op_count_line(family: Family, optimizer: bool) -> tuple[int, int]:
    """(ops at size 1, ops each further size unit): every regular family
    repeats the same block of ops per layer / block / level."""
    one = _GENERATORS[family](1, optimizer=optimizer).n_ops
    return one, _GENERATORS[family](2, optimizer=optimizer).n_ops - one


def sized(
    n_ops: int,
    *,
    seed: int = 0,
    family: Family | None = None,
    optimizer: bool = True,
    durations: Durations = Durations(),
) -> Trace:
    """A step of exactly `n_ops` ops from one family (drawn from the seed
    when None, among those whose smallest step fits): the largest chain /
    residual / unet (1 MiB sizes) that fits, padded with clones of the output
    after the loss, or a `random_dag`."""
    _positive(n_ops=n_ops)
    common: dict[str, Any] = {
        "optimizer": optimizer,
        "seed": seed,
        "durations": durations,
    }
    if family is None:
        fits = [f for f in _GENERATORS if _op_count_line(f, optimizer)[0] <= n_ops]
        fits.append(Family.RANDOM_DAG)
        family = fits[int(np.random.default_rng(seed).integers(len(fits)))]
    if family is Family.RANDOM_DAG:
        return random_dag(n_ops, **common)
    first, per_unit = _op_count_line(family, optimizer)
    if first > n_ops:
        raise ValueError(f"n_ops={n_ops} is below the smallest {family.value} ({first} ops)")
    k = 1 + (n_ops - first) // per_unit
    return _GENERATORS[family](k, pad_ops=n_ops - first - (k - 1) * per_unit, **common)

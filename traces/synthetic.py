"""Seeded synthetic training iterations for tests of planners and the simulator.

Every generator returns a full, valid `Trace` of one training step: forward
layers, an MSE loss against a target, the backward pass in the order
PyTorch's autograd engine runs it, and (unless ``optimizer=False``) one
SGD-with-momentum update per parameter. Sizes are whole MiB, so expected
memory works out by hand; each docstring states the peaks of a small case
and the tests check exactly those numbers.

See NOTE [ What a synthetic step looks like ] below the imports.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
from memplan.traces.model import Buffer, BufferKind, Op, Phase, Trace, TraceMeta, View
from memplan.traces.synthetic_builder import (  # noqa: F401  (re-exported)
    SCALAR_NBYTES,
    SGD_KWARGS,
    Durations,
    Family,
    Grain,
    MiB,
    _Builder,
    _Kind,
    _Node,
)

# NOTE [ What a synthetic step looks like ]
# - Buffers: batch and target are `input`s resident from the start, freed after the last
#   op; weights (`param`) and momentum (`optimizer_state`) persistent; each `grad` freed
#   after the optimizer op using it (else kept to the end); every other buffer an
#   `activation` freed after its last access, as PyTorch frees a temporary.
# - The loss and the backward seed are 4-byte scalars, the only sizes not whole MiB.
# - Backward follows the engine: reverse creation order; a tensor used twice gets its grads
#   summed by an `aten.add.Tensor`; `add` and `cat` backward are free (views).
# - Every buffer has one contiguous 1-D view (plus slices of concatenation grads): real
#   aten targets and argument layouts, flat shapes -- for planners and the simulator, not
#   for replay.
# - FLOPs: a layer is a 1x1 convolution with a square weight
#   (``2 * out_elements * isqrt(weight_elements)``), elementwise ops one per element.
#   Durations are whole `Grain`s drawn from the seed. Full text: docs/notes.md.


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


def checkmate_chain(n: int, *, unit_bytes: int = 64 * MiB, unit_us: float = 1.0) -> Trace:
    """Checkmate's linear training chain (Jain et al., MLSys 2020): 2n + 1 ops
    of `unit_us` each, op j writing buffer j of `unit_bytes`. Op j >= 1 reads
    op j - 1, and backward op 2n - i also reads forward op i (0 <= i < n); no
    parameters, inputs or optimizer; every buffer is freed after its last
    read (the last op's output at the end). The defaults make a copy of one
    buffer (~5 ms on any shipped GPU) thousands of op times long: no swap
    pays, and the problem is pure rematerialisation.

    Vanilla peak n + 2 units, at op n + 1 (every forward output, the loss
    and the first backward output); floor 3 units (a backward op's two
    inputs and its output). At B = (n + 2) // 2 units and even n >= 8 the
    fewest ops are 2n + 1 + B (Checkmate's figure; tests check it against a
    brute force of our own semantics, whose optimum it is for those n).
    """
    _positive(n=n, unit_bytes=unit_bytes)
    if not unit_us > 0:
        raise ValueError(f"unit_us={unit_us!r} must be > 0")
    n_ops = 2 * n + 1
    shape = (unit_bytes // 4,)
    views = tuple(View(j, j, shape, (1,), 0, "float32") for j in range(n_ops))
    reads: list[tuple[int, ...]] = [() if j == 0 else (j - 1,) for j in range(n_ops)]
    for i in range(n):
        reads[2 * n - i] = (2 * n - i - 1, i)
    last_read = {b: j for j in range(n_ops) for b in reads[j]}
    buffers = tuple(
        Buffer(j, unit_bytes, BufferKind.ACTIVATION, False, f"node{j}", last_read.get(j, n_ops - 1))
        for j in range(n_ops)
    )
    ops = []
    for j, r in enumerate(reads):
        phase = Phase.FORWARD if j <= n else Phase.BACKWARD
        target = ("aten.ones.default", "aten.relu.default", "aten.mul.Tensor")[len(r)]
        args = {"args": [{"view": v} for v in r] or [list(shape)], "kwargs": {}}
        ops.append(
            Op(j, target, phase, r, (j,), args, flops=0, duration_us=unit_us, module=f"node{j}")
        )
    extra = {"generator": "checkmate_chain", "n": n, "unit_bytes": unit_bytes, "unit_us": unit_us}
    meta = TraceMeta("synthetic.checkmate_chain", 1, device="meta", extra=extra)
    return Trace(meta, buffers, views, tuple(ops))


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

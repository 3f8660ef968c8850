"""Synthetic training steps: valid traces, hand-worked peaks, exact sizes."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from memplan.traces import io
from memplan.traces.io import fingerprint
from memplan.traces.model import BufferKind, Phase, Trace
from memplan.traces.synthetic import (
    Durations,
    Family,
    Grain,
    MiB,
    chain,
    random_dag,
    residual,
    sized,
    unet,
)

B = 4  # the loss and its seed grad are 4-byte scalars


def _valid(trace: Trace) -> Trace:
    """The loader accepts the trace and gives back exactly the same content."""
    d = io.to_dict(trace)
    assert io.to_dict(io.from_dict(d)) == d
    return trace


def _mib_or_scalar(trace: Trace) -> None:
    for b in trace.buffers:
        assert b.nbytes % MiB == 0 or b.nbytes == B or b.name.endswith(":mask"), b


ALL = [
    chain(1),
    chain(3),
    chain(4, act_mib=2, param_mib=3, optimizer=False),
    residual(1),
    residual(3, act_mib=2),
    unet(1),
    unet(3, param_mib=2, optimizer=False),
    random_dag(60, seed=1),
    random_dag(60, seed=2, dropout=True, optimizer=False),
    sized(77, seed=5, family=Family.UNET),
]


@pytest.mark.parametrize("trace", ALL, ids=lambda t: t.meta.model)
def test_generated_traces_are_valid_and_follow_the_buffer_rules(trace):
    _valid(trace)
    _mib_or_scalar(trace)
    last = trace.n_ops - 1
    phases = [o.phase for o in trace.ops]
    order = [Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER]
    assert phases == sorted(phases, key=order.index)
    with_optimizer = trace.meta.optimizer == "sgd"
    for b in trace.buffers:
        if b.kind in (BufferKind.PARAM, BufferKind.OPTIMIZER_STATE):
            assert b.persistent and b.freed_after is None
        elif b.kind is BufferKind.INPUT:
            assert not b.persistent and b.freed_after == last
        elif b.kind is BufferKind.GRAD and with_optimizer:
            # freed after the SGD update that reads it
            update = trace.ops[b.freed_after]
            assert update.phase is Phase.OPTIMIZER and b.id in trace.op_reads(update.id)
        elif b.kind is BufferKind.GRAD:
            assert b.freed_after == last
        else:
            assert b.kind is BufferKind.ACTIVATION
            assert b.freed_after == trace.last_access[b.id]
    assert [s.index for s in trace.saved] == list(range(len(trace.saved)))
    assert all(o.duration_us is not None and o.duration_us >= 1 for o in trace.ops)
    assert all(o.module for o in trace.ops if o.target == "aten.convolution.default")


# ---- hand-worked peaks -------------------------------------------------------------
def test_chain3_peaks():
    # weights + momentum 6 MiB, batch + target 2 MiB. Op 6 is layer3's
    # backward: layer1 and layer2 outputs, the grads of layer3's and layer2's
    # outputs, layer3's weight grad: 5 MiB.
    t = chain(3, act_mib=1, param_mib=1)
    assert t.n_ops == 12
    assert t.peak("framework") == (13 * MiB, 6)
    # liveness: the target dies after mse_loss_backward (op 5), which holds
    # the three outputs, the seed grad and the new grad: 6 + 2 + 4 MiB + 4 B
    assert t.peak("liveness") == (12 * MiB + B, 5)
    assert t.memory_curve("framework").tolist() == [
        9 * MiB, 10 * MiB, 11 * MiB, 11 * MiB + B, 11 * MiB + 2 * B, 12 * MiB + B,
        13 * MiB, 13 * MiB, 12 * MiB, 11 * MiB, 10 * MiB, 9 * MiB,
    ]  # fmt: skip


def test_chain3_without_optimizer_keeps_grads_to_the_end():
    # 3 MiB of weights, no momentum; grads stay until the step ends
    t = chain(3, optimizer=False)
    assert t.n_ops == 9
    assert t.peak("framework") == (10 * MiB, 6)
    # the last op (layer1's backward) still reads its input grad: weights,
    # batch + target, that grad and the three weight grads
    assert t.memory_curve("framework")[-1] == 3 * MiB + 2 * MiB + MiB + 3 * MiB
    # under liveness a grad nothing reads dies right after it is written
    assert t.peak("liveness") == (9 * MiB + B, 5)


@pytest.mark.parametrize("n_layers", [2, 3, 5])
@pytest.mark.parametrize(("a", "p"), [(1, 1), (2, 1), (3, 2), (3, 3)])
def test_chain_peak_formula(n_layers, a, p):
    t = chain(n_layers, act_mib=a, param_mib=p)
    L, A, P = n_layers, a * MiB, p * MiB
    assert t.n_ops == 3 * L + 3
    assert chain(n_layers, optimizer=False).n_ops == 2 * L + 3
    assert t.peak("framework") == (2 * L * P + 2 * A + (L + 1) * A + P, L + 3)
    assert t.peak("liveness") == (2 * L * P + (L + 3) * A + B, L + 2)


def test_residual1_peaks():
    # stem + 2 convs: 6 MiB of weights and momentum, 2 MiB batch + target.
    # Op 9 (threshold_backward) holds the stem output, relu output, the
    # block's output grad, grads of relu output and of conv1 output, and
    # conv2's weight grad: 6 MiB.
    t = residual(1)
    assert t.n_ops == 16
    assert t.peak("framework") == (14 * MiB, 9)
    assert t.peak("liveness") == (13 * MiB, 9)


def test_unet1_peaks():
    # 4 convs: 8 MiB of weights and momentum, 2 MiB batch + target. Op 12
    # (up0.conv backward) holds the skip, the bottleneck output, the 2 MiB
    # concatenation and its 2 MiB grad, up0.relu's input grad, a weight grad.
    t = unet(1)
    assert t.n_ops == 23 and unet(2).n_ops == 15 * 2 + 8
    assert t.peak("framework") == (18 * MiB, 12)
    assert t.peak("liveness") == (17 * MiB, 12)


def test_bytes_by_kind_of_chain3():
    kinds = chain(3).bytes_by_kind()
    assert kinds[BufferKind.INPUT] == 2 * MiB
    assert kinds[BufferKind.PARAM] == 3 * MiB
    assert kinds[BufferKind.OPTIMIZER_STATE] == 3 * MiB
    assert kinds[BufferKind.GRAD] == 3 * MiB
    # 3 outputs, 3 output grads, loss and seed
    assert kinds[BufferKind.ACTIVATION] == 6 * MiB + 2 * B


# ---- structure -----------------------------------------------------------------------
def test_chain3_ops_in_order():
    t = chain(3)
    assert [(o.target, o.module) for o in t.ops] == [
        ("aten.convolution.default", "layer1"),
        ("aten.convolution.default", "layer2"),
        ("aten.convolution.default", "layer3"),
        ("aten.mse_loss.default", "loss"),
        ("aten.ones_like.default", "loss"),
        ("aten.mse_loss_backward.default", "loss"),
        ("aten.convolution_backward.default", "layer3"),
        ("aten.convolution_backward.default", "layer2"),
        ("aten.convolution_backward.default", "layer1"),
        ("aten._fused_sgd_.default", "layer1"),
        ("aten._fused_sgd_.default", "layer2"),
        ("aten._fused_sgd_.default", "layer3"),
    ]
    names = [b.name for b in t.buffers]
    conv3 = t.ops[2]
    assert conv3.args == {
        "args": [{"view": conv3.reads[0]}, {"view": conv3.reads[1]}, None, [1, 1], [0, 0],
                 [1, 1], False, [0, 0], 1],
        "kwargs": {},
    }  # fmt: skip
    assert [names[t.views[v].buffer] for v in conv3.reads] == ["layer2:out", "layer3.weight"]
    # layer1's input is the batch: no grad for it, only the weight's
    bwd1 = t.ops[8]
    assert bwd1.args["args"][-1] == [False, True, False]
    assert [names[b] for b in t.op_writes(8)] == ["layer1.weight.grad"]
    sgd1 = t.ops[9]
    assert [names[b] for b in t.op_reads(9)] == [
        "layer1.weight", "layer1.weight.grad", "layer1.weight.momentum_buffer",
    ]  # fmt: skip
    assert [names[b] for b in t.op_writes(9)] == [
        "layer1.weight", "layer1.weight.momentum_buffer",
    ]  # fmt: skip
    assert sgd1.args["kwargs"]["momentum"] == 0.9
    # conv on 2^18 elements with a 512 x 512 weight; backward twice that
    assert conv3.flops == 2 * 2**18 * 512
    assert t.ops[6].flops == 2 * conv3.flops
    # saved: each layer's input and weight, then the loss's output and target
    saved = [(names[t.views[s.view].buffer], s.module) for s in t.saved]
    assert saved == [
        ("input", "layer1"), ("layer1.weight", "layer1"),
        ("layer1:out", "layer2"), ("layer2.weight", "layer2"),
        ("layer2:out", "layer3"), ("layer3.weight", "layer3"),
        ("layer3:out", "loss"), ("target", "loss"),
    ]  # fmt: skip


def test_residual_skip_grads_are_summed_in_backward():
    t = residual(2)
    assert t.n_ops == 10 * 2 + 6
    sums = [o for o in t.ops if o.phase is Phase.BACKWARD and o.target == "aten.add.Tensor"]
    assert len(sums) == 2  # one per block input
    names = [b.name for b in t.buffers]

    def named(views):
        return [names[t.views[v].buffer] for v in views]

    # block1's input (block0's output) gets the grad of block1's output
    # straight through the skip, and conv1's backward gives the other term;
    # that sum passes on through block0's skip to the stem's output
    assert [(named(o.reads), named(o.writes)) for o in sums] == [
        (["block1:out.grad", "block0:out.grad"], ["block0:out.grad"]),
        (["block0:out.grad", "stem:out.grad"], ["stem:out.grad"]),
    ]
    assert all(o.module == "" for o in sums)  # the engine sums, outside any module


def test_unet_skip_grad_is_a_slice_of_the_concatenation_grad():
    t = unet(1)
    cat = next(o for o in t.ops if o.target == "aten.cat.default")
    c_buf = int(t.op_writes(cat.id)[0])
    assert t.nbytes[c_buf] == 2 * MiB
    # up0.conv's backward writes the concatenation's grad (2 MiB) ...
    bwd = next(o for o in t.ops if o.phase is Phase.BACKWARD and o.module == "up0.conv")
    g_cat = t.views[bwd.writes[0]]
    assert t.nbytes[g_cat.buffer] == 2 * MiB
    # ... whose first half feeds the up-convolution's backward and whose
    # second half is summed with the bottleneck's grad for the skip
    up = next(o for o in t.ops if o.phase is Phase.BACKWARD and o.module == "up0.upconv")
    first_half = t.views[up.reads[0]]
    (sum_op,) = [o for o in t.ops if o.phase is Phase.BACKWARD and o.target == "aten.add.Tensor"]
    second_half = t.views[sum_op.reads[0]]
    quarter_mib = MiB // 4  # float32 elements in 1 MiB
    assert (first_half.buffer, first_half.offset, first_half.shape) == (
        g_cat.buffer, 0, (quarter_mib,),
    )  # fmt: skip
    assert (second_half.buffer, second_half.offset, second_half.shape) == (
        g_cat.buffer, quarter_mib, (quarter_mib,),
    )  # fmt: skip
    # so the 2 MiB grad lives from up0.conv's backward to the skip's sum
    assert t.freed_after[g_cat.buffer] == sum_op.id


def test_durations_come_from_the_seed_in_whole_units():
    a, b = chain(4, seed=1), chain(4, seed=1)
    assert [o.duration_us for o in a.ops] == [o.duration_us for o in b.ops]
    assert [o.duration_us for o in a.ops] != [o.duration_us for o in chain(4, seed=2).ops]
    assert {o.duration_us for o in a.ops} <= {float(k) for k in range(1, 10)}
    ms = chain(4, seed=1, durations=Durations(Grain.MS))
    assert [o.duration_us for o in ms.ops] == [1000 * o.duration_us for o in a.ops]
    every_ms = unet(2, durations=Durations(Grain.MS, 1, 1))
    assert {o.duration_us for o in every_ms.ops} == {1000.0}
    # the seed changes durations only
    assert np.array_equal(a.nbytes, chain(4, seed=2).nbytes)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="n_layers=0 must be an integer >= 1"):
        chain(0)
    with pytest.raises(ValueError, match="act_mib=0.5 must be an integer >= 1"):
        residual(1, act_mib=0.5)
    with pytest.raises(ValueError, match="lo=3, hi=2"):
        Durations(Grain.US, 3, 2)
    with pytest.raises(ValueError, match="pad_ops=-1 must be >= 0"):
        unet(1, pad_ops=-1)
    with pytest.raises(ValueError, match=r"n_ops=5 is below the smallest random_dag \(6 ops\)"):
        random_dag(5)
    with pytest.raises(ValueError, match=r"n_ops=20 is below the smallest unet \(23 ops\)"):
        sized(20, family=Family.UNET)


# ---- exact sizes ---------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    n_ops=st.integers(8, 200),
    seed=st.integers(0, 2**32 - 1),
    dropout=st.booleans(),
    optimizer=st.booleans(),
)
def test_random_dag_has_exactly_n_ops(n_ops, seed, dropout, optimizer):
    t = _valid(random_dag(n_ops, seed=seed, dropout=dropout, optimizer=optimizer))
    assert t.n_ops == n_ops
    _mib_or_scalar(t)
    rng_ops = [o for o in t.ops if o.rng]
    assert len(rng_ops) == int(dropout)
    if dropout:
        (op,) = rng_ops
        assert op.target == "aten.native_dropout.default" and op.phase is Phase.FORWARD
        y, mask = (t.views[v] for v in op.writes)
        assert mask.dtype == "bool" and t.nbytes[mask.buffer] == t.nbytes[y.buffer] // 4
    # every weight gets a grad and, with an optimizer, exactly one update
    n_params = t.bytes_by_kind()[BufferKind.PARAM]
    assert t.bytes_by_kind()[BufferKind.GRAD] == n_params
    updates = sum(o.phase is Phase.OPTIMIZER for o in t.ops)
    assert updates == (sum(b.kind is BufferKind.PARAM for b in t.buffers) if optimizer else 0)


def test_random_dag_is_seeded_and_grows_by_extending():
    assert fingerprint(random_dag(100, seed=3)) == fingerprint(random_dag(100, seed=3))
    assert fingerprint(random_dag(100, seed=3)) != fingerprint(random_dag(100, seed=4))
    small, big = random_dag(60, seed=3), random_dag(150, seed=3)
    # the first nodes are the same: a bigger DAG extends a smaller one
    k = small.meta.extra["n_nodes"]
    fwd = [(o.target, o.module) for o in small.ops if o.module.startswith("node")][:k]
    assert fwd == [(o.target, o.module) for o in big.ops if o.module.startswith("node")][:k]
    # skips make some grads sums
    assert any(o.phase is Phase.BACKWARD and o.target == "aten.add.Tensor" for o in big.ops)


@pytest.mark.parametrize("family", list(Family))
def test_sized_hits_every_count(family):
    smallest = {Family.CHAIN: 6, Family.RESIDUAL: 16, Family.UNET: 23, Family.RANDOM_DAG: 6}
    for n in range(smallest[family], 120):
        t = sized(n, seed=n, family=family)
        assert t.n_ops == n
        assert t.meta.extra["generator"] == family.value
    _valid(t)


def test_sized_draws_families_from_the_seed():
    families = {sized(80, seed=s).meta.extra["generator"] for s in range(40)}
    assert families == {f.value for f in Family}
    # below the smallest unet, only what fits is drawn
    assert {sized(10, seed=s).meta.extra["generator"] for s in range(40)} == {
        "chain", "random_dag",
    }  # fmt: skip

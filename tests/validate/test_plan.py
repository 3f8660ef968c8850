"""Plans applied by the replay: swaps, releases and recomputes change where
bytes are and when, never what is computed; plans that cannot hold are
`ValidationError`s naming the event, the op and the buffer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from memplan.planners.core.plan import Recompute, Release, SwapIn, SwapOut
from memplan.traces.model import BufferKind
from memplan.validate import Direction, ValidationError, compare_results, replay

from tests.validate.helpers import (
    Order,
    first_backward_use,
    first_op,
    last_forward_use,
    output_of,
    plan_of,
    recompute_chain,
    trace_of,
    vanilla,
    writers,
)

MiB = 2**20


def _relu_output(trace):
    """Block 1's ReLU output in small_cnn: 4x16x32x32 floats, read by the
    max-pool in forward and by two backward ops much later."""
    b = output_of(trace, first_op(trace, "aten.relu.default"))
    assert trace.buffers[b].nbytes == MiB // 4
    return b, last_forward_use(trace, b), first_backward_use(trace, b)


def test_release_and_recompute_through_batchnorm_changes_nothing():
    trace = trace_of("small_cnn")
    b, last_fwd, first_bwd = _relu_output(trace)
    chain = recompute_chain(trace, b, first_bwd)
    # the BatchNorm output the ReLU read is gone too: the chain re-runs
    # BatchNorm, whose running statistics must not be updated twice
    assert [trace.ops[k].target for k in chain] == [
        "aten.native_batch_norm.default",
        "aten.relu.default",
    ]
    plan = plan_of(trace, Release(b, last_fwd), Recompute(b, first_bwd, chain))
    r = replay(trace, plan=plan, iterations=2)
    compare_results(vanilla("small_cnn"), r)
    assert r.recomputes.tolist() == [1, 1] and (r.recompute_seconds > 0).all()
    # the pool holds exactly the buffer's bytes less while it is released
    saved = trace.memory_curve("framework") - r.memory_curve
    assert (saved[:, last_fwd + 1 : first_bwd] == MiB // 4).all()
    assert (saved[:, : last_fwd + 1] == 0).all() and (saved[:, first_bwd:] == 0).all()


def test_recompute_of_a_dropout_mask_restores_the_generator():
    trace = trace_of("tiny_transformer")
    mask = output_of(trace, first_op(trace, "aten.empty_like.default"))
    ops = writers(trace, mask)
    assert [trace.ops[k].target for k in ops] == [
        "aten.empty_like.default",
        "aten.bernoulli_.float",
        "aten.div_.Scalar",
    ]
    last_fwd, first_bwd = last_forward_use(trace, mask), first_backward_use(trace, mask)
    chain = recompute_chain(trace, mask, first_bwd)
    release = Release(mask, last_fwd)
    plan = plan_of(trace, release, Recompute(mask, first_bwd, chain, restore_rng=True))
    compare_results(vanilla("tiny_transformer", 3), replay(trace, plan=plan, iterations=3))

    no_restore = plan_of(trace, release, Recompute(mask, first_bwd, chain))
    with pytest.raises(
        ValidationError, match=rf"op {ops[1]} \(aten.bernoulli_.float\).*restore_rng"
    ):
        replay(trace, plan=no_restore)
    skip_bernoulli = tuple(k for k in chain if k != ops[1])
    bad = plan_of(trace, release, Recompute(mask, first_bwd, skip_bernoulli, restore_rng=True))
    with pytest.raises(
        ValidationError,
        match=rf"brings back buffer {mask} from ops \[{ops[0]}, {ops[2]}\], "
        rf"but the dropped copy was written by ops \[{ops[0]}, {ops[1]}, {ops[2]}\]",
    ):
        replay(trace, plan=bad)


def _out_ended_after(op, b, iterations):
    """The swap-out of `b` after `op` has ended before the next op runs."""
    order = Order()
    for it in range(iterations):
        order.after((it, op), "ended", (Direction.D2H, b, it))
    return order


def test_swap_out_and_in_changes_nothing_and_moves_the_bytes():
    trace = trace_of("small_cnn")
    b, last_fwd, first_bwd = _relu_output(trace)
    plan = plan_of(trace, SwapOut(b, last_fwd), SwapIn(b, first_bwd - 3, first_bwd))
    r = replay(trace, plan=plan, iterations=2, sync=_out_ended_after(last_fwd, b, 2))
    compare_results(vanilla("small_cnn"), r)
    assert [(t.direction, t.buffer, t.iteration) for t in r.transfers] == [
        (Direction.D2H, b, 0),
        (Direction.H2D, b, 0),
        (Direction.D2H, b, 1),
        (Direction.H2D, b, 1),
    ]
    assert r.bytes_moved(Direction.D2H) == r.bytes_moved(Direction.H2D) == 2 * (MiB // 4)
    assert r.host_peak_bytes == MiB // 4
    assert r.peak_bytes <= trace.peak("framework")[0]
    out, into = r.transfers[:2]
    assert out.end_s <= into.start_s  # one lane: the swap-in follows the swap-out
    # the swap-out freed the bytes when it ended: at the swap-in's deadline the
    # buffer is back, so the pool is what the framework has there
    assert (r.memory_curve[:, first_bwd] == trace.memory_curve("framework")[first_bwd]).all()


def test_a_throttled_swap_in_stalls_the_op_that_needs_it():
    trace = trace_of("small_cnn")
    b, last_fwd, first_bwd = _relu_output(trace)
    bw = 5e6  # 256 KiB take 52 ms each way
    plan = plan_of(trace, SwapOut(b, last_fwd), SwapIn(b, first_bwd - 1, first_bwd))
    order = _out_ended_after(last_fwd, b, 2)
    r = replay(trace, plan=plan, iterations=2, bandwidth_bytes_per_s=bw, sync=order)
    compare_results(vanilla("small_cnn"), r)
    link_free = 0.0  # the emulated link holds each copy for its bytes' time
    for t in r.transfers:
        link_free = max(t.ready_s, link_free) + (MiB // 4) / bw
        assert t.end_s >= link_free - 1e-9
    # the swap-in starts after op first_bwd - 1 and takes 52 ms: op first_bwd waits
    assert (r.wait_seconds >= 0.8 * (MiB // 4) / bw).all()


def test_a_swap_out_deadline_holds_its_op_until_the_copy_ends():
    trace = trace_of("small_cnn")
    b, last_fwd, first_bwd = _relu_output(trace)
    bw = 5e6  # 256 KiB take 52 ms each way
    out = SwapOut(b, last_fwd, before_op=last_fwd + 1)
    plan = plan_of(trace, out, SwapIn(b, first_bwd - 1, first_bwd))
    r = replay(trace, plan=plan, iterations=2, bandwidth_bytes_per_s=bw)
    compare_results(vanilla("small_cnn"), r)
    # op last_fwd + 1 waits for the whole swap-out, op first_bwd for the swap-in
    assert (r.wait_seconds >= 2 * 0.8 * (MiB // 4) / bw).all()
    assert [t.direction for t in r.transfers].count(Direction.D2H) == 2  # no discards
    # so the buffer is gone from the op after its last forward use on, without
    # any ordering of the threads, until its swap-in is triggered
    saved = trace.memory_curve("framework") - r.memory_curve
    assert (saved[:, last_fwd + 1 : first_bwd] == MiB // 4).all()
    assert (saved[:, : last_fwd + 1] == 0).all()


def test_delay_holds_a_transfer_back():
    trace = trace_of("small_cnn")
    b, last_fwd, first_bwd = _relu_output(trace)
    plan = plan_of(trace, SwapOut(b, last_fwd, delay_us=30_000), SwapIn(b, last_fwd + 1, first_bwd))
    r = replay(trace, plan=plan, iterations=1, sync=_out_ended_after(last_fwd, b, 1))
    compare_results(vanilla("small_cnn", 1), r)
    out, into = r.transfers
    assert out.ready_s - out.queued_s == pytest.approx(0.03)
    assert out.start_s >= out.ready_s and into.start_s >= out.end_s


@pytest.mark.parametrize("lanes", [1, 2])
def test_two_lanes_overlap_the_directions_one_lane_serialises_them(lanes):
    trace = trace_of("small_cnn")
    a, a_fwd, a_bwd = _relu_output(trace)
    # a second 256 KiB activation, alive across op a_fwd + 1 and read again in backward
    c = next(
        x
        for x in range(trace.n_buffers)
        if x != a
        and trace.buffers[x].nbytes == MiB // 4
        and trace.created_at[x] <= a_fwd
        and first_backward_use(trace, x) > a_fwd + 1
        and last_forward_use(trace, x) <= a_fwd + 1
    )
    y = a_fwd + 1
    plan = plan_of(
        trace,
        SwapOut(a, a_fwd),
        SwapIn(a, y, a_bwd),
        SwapOut(c, y),
        SwapIn(c, y + 1, first_backward_use(trace, c)),
    )
    # c's swap-in finds c's swap-out started (else it would cancel it, NOTE [ Keep ])
    order = _out_ended_after(a_fwd, a, 1).after((0, y), "started", (Direction.D2H, c, 0))
    r = replay(trace, plan=plan, iterations=1, bandwidth_bytes_per_s=5e6, lanes=lanes, sync=order)
    compare_results(vanilla("small_cnn", 1), r)
    by = {(t.direction, t.buffer): t for t in r.transfers}
    a_in, c_out = by[(Direction.H2D, a)], by[(Direction.D2H, c)]
    assert a_in.start_s >= by[(Direction.D2H, a)].end_s  # the host copy exists first
    overlap = a_in.start_s < c_out.end_s and c_out.start_s < a_in.end_s
    assert overlap == (lanes == 2)


def test_cross_iteration_swap_of_a_parameter():
    trace = trace_of("small_cnn")
    p = max((b for b in trace.buffers if b.kind is BufferKind.PARAM), key=lambda b: b.nbytes).id
    update, first_use = max(writers(trace, p)), int(trace.first_access[p])
    plan = plan_of(
        trace,
        SwapOut(p, update),
        SwapIn(p, trace.n_ops - 1, first_use, next_iteration=True),
    )
    r = replay(trace, plan=plan, iterations=3, sync=_out_ended_after(update, p, 3))
    compare_results(vanilla("small_cnn", 3), r)
    # out in every iteration, back for the next one: none after the last
    outs = [t.iteration for t in r.transfers if t.direction is Direction.D2H]
    ins = [t.iteration for t in r.transfers if t.direction is Direction.H2D]
    assert outs == [0, 1, 2] and ins == [0, 1]


def test_a_stale_host_copy_is_caught():
    trace = trace_of("small_cnn")
    p = 0  # block1.conv.weight
    fwd, bwd, update = (
        int(trace.first_access[p]),
        first_backward_use(trace, p),
        max(writers(trace, p)),
    )
    plan = plan_of(
        trace,
        SwapOut(p, fwd),
        SwapIn(p, fwd + 1, bwd),
        Release(p, update),  # the host copy predates the update
        SwapIn(p, trace.n_ops - 1, fwd, next_iteration=True),
    )
    with pytest.raises(
        ValidationError,
        match=rf"swap_in of buffer 0 after op {trace.n_ops - 1} of iteration 0: "
        rf"no valid host copy \(op {update} wrote it since\)",
    ):
        replay(trace, plan=plan, iterations=2, sync=_out_ended_after(fwd, p, 1))


def test_reading_a_released_buffer_names_the_op_and_the_buffer():
    trace = trace_of("small_cnn")
    b, last_fwd, first_bwd = _relu_output(trace)
    target = trace.ops[first_bwd].target
    with pytest.raises(
        ValidationError,
        match=rf"op {first_bwd} \({target}\) needs buffer {b}, which is not on the device",
    ):
        replay(trace, plan=plan_of(trace, Release(b, last_fwd)))


@pytest.mark.parametrize(
    ("events", "message"),
    [
        (
            lambda b, f, k: [Release(b, f), Release(b, f + 1)],
            "release of buffer {b} after op {f1}: it is not on the device",
        ),
        (
            lambda b, f, k: [Release(b, f), SwapIn(b, f + 1, k)],
            r"no valid host copy \(it was never swapped out\)",
        ),
        (
            lambda b, f, k: [Release(b, f), SwapOut(b, f + 1)],
            "swap_out of buffer {b} after op {f1}: it is not on the device",
        ),
    ],
)
def test_plans_that_cannot_hold(events, message):
    trace = trace_of("small_cnn")
    b, last_fwd, first_bwd = _relu_output(trace)
    plan = plan_of(trace, *events(b, last_fwd, first_bwd))
    expected = message.format(b=b, f=last_fwd, f1=last_fwd + 1)
    with pytest.raises(ValidationError, match=expected):
        replay(trace, plan=plan, iterations=1, bandwidth_bytes_per_s=1e7)


def test_the_vanilla_plan_is_the_vanilla_run():
    trace = trace_of("mlp")
    r = replay(trace, plan=plan_of(trace), iterations=2)
    compare_results(vanilla("mlp"), r)
    np.testing.assert_array_equal(r.memory_curve[0], trace.memory_curve("framework"))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("lanes", [1, 2])
def test_cuda_swaps_and_recomputes_change_nothing(lanes):
    trace = trace_of("small_cnn")
    b, last_fwd, first_bwd = _relu_output(trace)
    chain = recompute_chain(trace, b, first_bwd)
    p = 0  # block1.conv.weight, swapped across iterations
    update, first_use = max(writers(trace, p)), int(trace.first_access[p])
    plan = plan_of(
        trace,
        Release(b, last_fwd),
        Recompute(b, first_bwd, chain),
        SwapOut(p, update),
        SwapIn(p, trace.n_ops - 1, first_use, next_iteration=True),
    )
    vanilla = replay(trace, device="cuda", iterations=3)
    r = replay(trace, device="cuda", iterations=3, plan=plan, lanes=lanes)
    compare_results(vanilla, r)
    assert r.allocator_peak_bytes is not None and r.op_seconds.sum() > 0


def test_a_recompute_of_a_buffer_still_there_does_not_run():
    trace = trace_of("small_cnn")
    b, _, first_bwd = _relu_output(trace)
    plan = plan_of(trace, Recompute(b, first_bwd, recompute_chain(trace, b, first_bwd)))
    r = replay(trace, plan=plan, iterations=2)
    assert r.recomputes.tolist() == [0, 0] and r.recompute_seconds.tolist() == [0.0, 0.0]
    compare_results(vanilla("small_cnn"), r)


def test_a_write_while_the_copy_runs_keeps_the_buffer_and_no_stale_copy():
    trace = trace_of("tiny_transformer")
    make = first_op(trace, "aten.empty_like.default")
    mask = output_of(trace, make)  # bernoulli_ and div_ write it right after
    plan = plan_of(trace, SwapOut(mask, make), SwapIn(mask, make + 3, make + 4))
    # the copy starts before bernoulli_ runs and ends after it wrote the mask:
    # needed while leaving, the mask stays (NOTE [ Keep ]); the host copy is
    # stale and is not kept either, and the swap-in finds it on the device
    out = (Direction.D2H, mask, 0)
    order = Order().after((0, make), "started", out).hold(out, (0, make + 1))
    r = replay(trace, plan=plan, iterations=1, sync=order)
    compare_results(vanilla("tiny_transformer", 1), r)
    assert [(t.direction, t.buffer) for t in r.transfers] == [(Direction.D2H, mask)]
    np.testing.assert_array_equal(r.memory_curve[0], trace.memory_curve("framework"))

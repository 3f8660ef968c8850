"""The replay applies plans with the simulator's semantics (NOTE [ Keep ] in
validate/replay/pool.py, NOTE [ Event semantics ] in sim/model.py): which copies
run and when device bytes are taken and given back. The two threads are put
in a chosen order with `Order` (no timing), and the simulator is run on the
same plan with latencies that give the same order; both must agree."""

from __future__ import annotations

import dataclasses

import numpy as np
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Fixed
from memplan.hwmodels.profile import load_hardware
from memplan.planners.core.plan import SwapIn, SwapOut
from memplan.sim import Job, simulate
from memplan.sim.log import LogKind
from memplan.validate import Direction, compare_results, replay

from tests.validate.helpers import (
    Order,
    first_backward_use,
    last_forward_use,
    output_of,
    plan_of,
    trace_of,
    vanilla,
    writers,
)

MiB = 2**20
COPIES = (LogKind.SWAP_OUT_START, LogKind.SWAP_IN_START)


def _simulate(trace, plan, copy_s: float, nbytes: int, iterations: int = 1):
    """The plan with every op taking 1 ms and a copy of `nbytes` `copy_s`."""
    hw = dataclasses.replace(
        load_hardware("cpu-local"),
        h2d_bytes_per_s=nbytes / copy_s,
        d2h_bytes_per_s=nbytes / copy_s,
        transfer_fixed_s=0.0,
    )
    latency = Fixed(np.full(trace.n_ops, 1e-3))
    return simulate([Job(trace, plan)], DeviceModel(hw, latency), iterations=iterations)


def _sim_copies(res) -> list[tuple[Direction, int, int]]:
    kind = {LogKind.SWAP_OUT_START: Direction.D2H, LogKind.SWAP_IN_START: Direction.H2D}
    return [(kind[e.kind], e.buffer, e.iteration) for e in res.log if e.kind in COPIES]


def _copies(r) -> list[tuple[Direction, int, int]]:
    return [(t.direction, t.buffer, t.iteration) for t in r.transfers]


def _sim_bytes_at_op_starts(res, iteration: int) -> np.ndarray:
    """Device bytes as each op starts (its outputs taken), like the replay's
    `memory_curve` (read as each op ends, before anything after it)."""
    starts = [e.t_us for e in res.log if e.kind is LogKind.OP_START and e.iteration == iteration]
    k = np.searchsorted(res.memory.t_s * 1e6, np.array(starts) + 1e-6, side="right") - 1
    return res.memory.bytes[k]


def test_a_swap_in_cancels_the_free_of_a_swap_out_still_queued_not_its_copy():
    trace = trace_of("small_cnn")
    a = output_of(trace, 4)  # 256 KiB ReLU output, read by op 5, then by op 35
    c = int(trace.op_writes(5)[0])  # the max-pool's 64 KiB output, read by op 6, then by op 34
    assert trace.created_at[c] == 5 and trace.buffers[c].nbytes == MiB // 16
    assert (last_forward_use(trace, a), first_backward_use(trace, a)) == (5, 35)
    assert (last_forward_use(trace, c), first_backward_use(trace, c)) == (6, 34)
    plan = plan_of(trace, SwapOut(a, 5), SwapOut(c, 6), SwapIn(c, 7, 34), SwapIn(a, 30, 35))
    # a's copy holds the lane until op 8 has ended: c's swap-out is queued
    # behind it when c's swap-in fires after op 7, and still runs after it
    # (NOTE [ Keep ]), leaving c on the device with a host copy
    out_a = (Direction.D2H, a, 0)
    order = Order().after((0, 5), "started", out_a).hold(out_a, (0, 8))
    r = replay(trace, plan=plan, iterations=1, sync=order.after((0, 8), "ended", out_a))
    compare_results(vanilla("small_cnn", 1), r)
    assert _copies(r) == [out_a, (Direction.D2H, c, 0), (Direction.H2D, a, 0)]
    saved = trace.memory_curve("framework") - r.memory_curve[0]
    assert (saved[:9] == 0).all() and (saved[9:31] == MiB // 4).all() and (saved[35:] == 0).all()

    # the simulator: a's copy runs from the end of op 5 (6 ms) to 8.5 ms,
    # during op 8; c's swap-in fires at 8 ms
    sim = _simulate(trace, plan, copy_s=2.5e-3, nbytes=MiB // 4)
    assert _sim_copies(sim) == _copies(r)
    skipped = [e.op for e in sim.log if e.kind is LogKind.SKIP and e.buffer == c]
    assert skipped == [7]  # the swap-in, at once; the swap-out's copy is made
    sim_saved = trace.memory_curve("framework") - _sim_bytes_at_op_starts(sim, 0)
    np.testing.assert_array_equal(sim_saved[:31], saved[:31])
    np.testing.assert_array_equal(sim_saved[35:], saved[35:])


def test_a_swap_out_with_a_valid_host_copy_moves_nothing_and_frees_at_once():
    trace = trace_of("small_cnn")
    p = 0  # block1.conv.weight: read by ops 0 and 38, updated by op 45
    assert trace.accesses_of(p).tolist() == [0, 38, 45] and max(writers(trace, p)) == 45
    assert p not in trace.op_accesses(39)
    plan = plan_of(trace, SwapOut(p, 0), SwapIn(p, 36, 38), SwapOut(p, 38), SwapIn(p, 39, 45))
    order = Order()
    for it in range(2):
        order.after((it, 0), "ended", (Direction.D2H, p, it))
    r = replay(trace, plan=plan, iterations=2, sync=order)
    compare_results(vanilla("small_cnn"), r)
    # after op 38 the host copy made after op 0 still holds: the device copy
    # is dropped with no copy; in the next iteration op 45's update made it stale
    out, into = (Direction.D2H, p), (Direction.H2D, p)
    assert [x[:2] for x in _copies(r)] == [out, into, into] * 2
    nbytes = int(trace.buffers[p].nbytes)
    saved = trace.memory_curve("framework") - r.memory_curve
    assert (saved[:, 1:37] == nbytes).all() and (saved[:, 39] == nbytes).all()
    assert (saved[:, [0, 38]] == 0).all() and (saved[:, 45:] == 0).all()

    sim = _simulate(trace, plan, copy_s=1e-4, nbytes=nbytes, iterations=2)
    assert [x[:2] for x in _sim_copies(sim)] == [out, into, into] * 2
    assert [(e.iteration, e.op) for e in sim.log if e.kind is LogKind.DISCARD] == [(0, 38), (1, 38)]
    # as in the replay, the device copy goes before op 39 takes its outputs
    # (the simulator once dropped it after them, counting both in its peak)
    ops = (LogKind.OP_START, LogKind.OP_END)
    order = [
        (e.iteration, e.kind)
        for e in sim.log
        if e.kind is LogKind.DISCARD or (e.kind in ops and e.op == 39)
    ]
    assert order == [
        (it, k) for it in range(2) for k in (LogKind.DISCARD, LogKind.OP_START, LogKind.OP_END)
    ]
    for it in range(2):
        sim_saved = trace.memory_curve("framework") - _sim_bytes_at_op_starts(sim, it)
        # the simulated copy ends during op 1 (the replay's before it starts)
        assert sim_saved[1] == 0
        np.testing.assert_array_equal(sim_saved[2:37], saved[it, 2:37])
        np.testing.assert_array_equal(sim_saved[38:40], saved[it, 38:40])


def test_a_buffer_freed_while_its_copy_runs_keeps_its_bytes_until_the_copy_ends():
    trace = trace_of("tiny_transformer")
    b = 103  # 48 KiB, last read by op 20, freed by the framework after op 23
    assert trace.accesses_of(b).tolist()[-1] == 20 and trace.buffers[b].freed_after == 23
    plan = plan_of(trace, SwapOut(b, 20))
    out = (Direction.D2H, b, 0)
    order = Order().after((0, 20), "started", out).hold(out, (0, 25))
    r = replay(trace, plan=plan, iterations=1, sync=order.after((0, 25), "ended", out))
    compare_results(vanilla("tiny_transformer", 1), r)
    assert _copies(r) == [out] and r.bytes_moved(Direction.D2H) == 48 * 1024
    extra = r.memory_curve[0] - trace.memory_curve("framework")
    assert (extra[24:26] == 48 * 1024).all()
    assert (extra[:24] == 0).all() and (extra[26:] == 0).all()

    # the simulator: the copy runs from 21 ms to 25.5 ms, during op 25
    sim = _simulate(trace, plan, copy_s=4.5e-3, nbytes=48 * 1024)
    sim_extra = _sim_bytes_at_op_starts(sim, 0) - trace.memory_curve("framework")
    np.testing.assert_array_equal(sim_extra, extra)

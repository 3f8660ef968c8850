"""Plans with many events at once: every eligible activation swapped, every
ReLU output recomputed. Many copies in flight, chains that share inputs;
still bit-identical to the vanilla run."""

from __future__ import annotations

import pytest
from memplan.planners.core.plan import Recompute, Release, SwapIn, SwapOut
from memplan.traces.model import BufferKind, Phase
from memplan.validate import Direction, compare_results, replay

from tests.validate.helpers import (
    first_backward_use,
    last_forward_use,
    output_of,
    plan_of,
    recompute_chain,
    trace_of,
    vanilla,
)


def _forward_and_backward(trace):
    """Activations read in forward and again in backward, at least 3 ops apart."""
    out = []
    for b in trace.buffers:
        if b.kind is not BufferKind.ACTIVATION:
            continue
        phases = {trace.ops[k].phase for k in trace.accesses_of(b.id)}
        if {Phase.FORWARD, Phase.BACKWARD} <= phases:
            last_fwd, first_bwd = last_forward_use(trace, b.id), first_backward_use(trace, b.id)
            if first_bwd - last_fwd >= 3:
                out.append((b.id, last_fwd, first_bwd))
    return out


@pytest.mark.parametrize("lanes", [1, 2])
@pytest.mark.parametrize(
    "model", ["small_cnn", pytest.param("tiny_transformer", marks=pytest.mark.slow)]
)
def test_swapping_every_saved_activation_changes_nothing(model, lanes):
    trace = trace_of(model)
    swaps = _forward_and_backward(trace)
    assert len(swaps) >= 8
    events = []
    for b, last_fwd, first_bwd in swaps:
        events += [SwapOut(b, last_fwd), SwapIn(b, first_bwd - 2, first_bwd)]
    r = replay(trace, plan=plan_of(trace, *events), iterations=2, lanes=lanes)
    compare_results(vanilla(model), r)
    # a swap-in that finds its swap-out still queued cancels it (NOTE [ Keep ]
    # in validate/replay/pool.py): how many copies run depends on timing, but every
    # swap-in reads a host copy some swap-out made
    moved = 2 * sum(trace.buffers[b].nbytes for b, _, _ in swaps)
    assert r.bytes_moved(Direction.H2D) <= r.bytes_moved(Direction.D2H) <= moved


def test_recomputing_every_relu_output_changes_nothing():
    trace = trace_of("tiny_resnet")
    relus = [op.id for op in trace.ops if op.target == "aten.relu.default"]
    spans = {}
    for k in relus:
        b = output_of(trace, k)
        spans[b] = (last_forward_use(trace, b), first_backward_use(trace, b))
    events = []
    for b, (last_fwd, first_bwd) in spans.items():
        # ReLU outputs of earlier layers are still released when this one is
        # rebuilt (backward runs in reverse): the chain rebuilds them on the way
        missing = frozenset(r for r, (f, k) in spans.items() if f < first_bwd < k)
        chain = recompute_chain(trace, b, first_bwd, missing)
        events += [Release(b, last_fwd), Recompute(b, first_bwd, chain)]
    r = replay(trace, plan=plan_of(trace, *events), iterations=2)
    compare_results(vanilla("tiny_resnet"), r)
    assert r.recomputes.tolist() == [len(relus)] * 2
    assert (r.memory_curve.sum(axis=1) < trace.memory_curve("framework").sum()).all()

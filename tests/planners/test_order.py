"""Which op orders a trace allows (planners/core/order.py, NOTE [ Allowed orders ])."""

from __future__ import annotations

import itertools

import pytest
from memplan.planners.core.order import (
    OrderError,
    check_order,
    dependencies,
    positions,
    segments,
    topological_order,
)

from tests.sim.handtraces import B, Call, make


def branches():
    """x -> (op0 -> op1) and x -> (op2 -> op3), joined by op4: two independent branches."""
    bufs = [B(1, "input"), B(4), B(1), B(4), B(1), B(1)]
    ops = [
        Call([0], [1]),
        Call([1], [2]),
        Call([0], [3]),
        Call([3], [4]),
        Call([2, 4], [5]),
    ]
    return make(bufs, ops)[0]


def test_both_interleavings_of_independent_branches_are_allowed():
    t = branches()
    allowed = [order for order in itertools.permutations(range(5)) if _allowed(t, order)]
    # Every merge of (0, 1) and (2, 3) followed by 4: C(4, 2) = 6 orders.
    assert len(allowed) == 6
    assert (0, 1, 2, 3, 4) in allowed and (2, 3, 0, 1, 4) in allowed and (0, 2, 1, 3, 4) in allowed
    assert all(o[-1] == 4 and o.index(0) < o.index(1) and o.index(2) < o.index(3) for o in allowed)


def _allowed(t, order) -> bool:
    try:
        check_order(t, order)
    except OrderError:
        return False
    return True


def test_an_order_breaking_a_data_dependency_is_refused():
    t = branches()
    with pytest.raises(
        OrderError,
        match=r"^order: op 1 \(aten.op1.default\) at position 0 "
        r"before op 0 \(aten.op0.default\) that writes buffer 1 it reads$",
    ):
        check_order(t, [1, 0, 2, 3, 4])


def test_an_in_place_write_keeps_its_place_after_the_readers_of_the_old_value():
    # op1 reads buffer 1; op2 writes it in place (relu_); op3 reads the new value.
    t = make(
        [B(1, "input"), B(1), B(1), B(1)],
        [Call([0], [1]), Call([1], [2]), Call([1], [1]), Call([1, 2], [3])],
    )[0]
    assert (1, "reads buffer 1 it overwrites") in dependencies(t)[2]
    with pytest.raises(
        OrderError, match=r"op 2 .* at position 1 before op 1 .* that reads buffer 1 it overwrites"
    ):
        check_order(t, [0, 2, 1, 3])
    check_order(t, [0, 1, 2, 3])


def test_write_after_write_on_one_buffer_keeps_its_order():
    # op0 and op1 both write buffer 1 without reading it; op2 reads it.
    t = make([B(1, "input"), B(1), B(1)], [Call([0], [1]), Call([0], [1]), Call([1], [2])])[0]
    with pytest.raises(
        OrderError, match=r"op 1 .* before op 0 .* that writes buffer 1 it overwrites"
    ):
        check_order(t, [1, 0, 2])


def test_a_view_of_a_buffer_counts_as_the_buffer():
    # Two views of buffer 1: writing through one orders after reading through the other.
    from memplan.traces import io
    from memplan.traces.model import View

    t = make([B(1, "input"), B(1), B(1)], [Call([0], [1]), Call([1], [2]), Call([0], [1])])[0]
    d = io.to_dict(t)
    t2 = io.from_dict(d)
    views = (*t2.views, View(3, 1, (1,), (1,), 0, "float32"))
    ops = list(t2.ops)
    ops[2] = type(ops[2])(2, ops[2].target, ops[2].phase, (0,), (3,), duration_us=1000.0)
    from memplan.traces.model import Trace

    t3 = Trace(t2.meta, t2.buffers, views, tuple(ops))
    with pytest.raises(
        OrderError, match=r"op 2 .* before op 1 .* that reads buffer 1 it overwrites"
    ):
        check_order(t3, [0, 2, 1])


def test_ops_that_draw_random_numbers_keep_their_relative_order():
    # Two dropout-like ops on independent branches: data allow both orders, the RNG does not.
    t = make(
        [B(1, "input"), B(1), B(1), B(1)],
        [Call([0], [1], rng=True), Call([0], [2], rng=True), Call([1, 2], [3])],
    )[0]
    check_order(t, [0, 1, 2])
    with pytest.raises(
        OrderError, match=r"op 1 .* at position 0 before op 0 .* that draws random numbers"
    ):
        check_order(t, [1, 0, 2])


def test_ops_stay_in_their_phase_segment():
    t = make(
        [B(1, "input"), B(1), B(1), B(1)],
        [Call([0], [1]), Call([0], [2], phase="backward"), Call([0], [3], phase="forward")],
    )[0]
    assert segments(t) == (0, 1, 2)
    with pytest.raises(
        OrderError, match=r"op 1 .* at position 2 after op 2 of a later phase segment"
    ):
        check_order(t, [0, 2, 1])


@pytest.mark.parametrize(
    ("order", "message"),
    [
        ([0, 1, 2, 3], r"order: 4 ops, the trace has 5"),
        ([0, 1, 2, 3, 3], r"order\[4\]: op 3 appears twice"),
        ([0, 1, 2, 3, 9], r"order\[4\]: 9 is not an op of the trace \(0..4\)"),
        ([0, 1, 2, 3, "x"], r"order\[4\]: 'x' is not an op id"),
    ],
)
def test_an_order_that_is_not_a_permutation_is_refused(order, message):
    with pytest.raises(OrderError, match=message):
        check_order(branches(), order)


def test_every_allowed_order_is_the_topological_order_of_its_own_positions():
    t = branches()
    for order in itertools.permutations(range(5)):
        if _allowed(t, order):
            assert topological_order(t, positions(order)) == order
    # a priority against the dependencies still gives an allowed order
    back = topological_order(t, [5, 4, 3, 2, 1])
    assert back == (2, 3, 0, 1, 4)
    check_order(t, back)
    with pytest.raises(OrderError, match=r"^priority: 2 values, the trace has 5 ops$"):
        topological_order(t, [0, 1])

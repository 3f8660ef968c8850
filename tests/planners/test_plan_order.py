"""A plan carries its op order (NOTE [ Plans under another order ]): the plan
file keeps it, `validate` and `check` read "after/before" as positions in it,
and the framework's frees move with it (NOTE [ Frees under another order ])."""

from __future__ import annotations

import pytest
from memplan.planners.core import io
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.order import OrderError
from memplan.planners.core.plan import (
    Plan,
    PlanResult,
    Release,
    Status,
    SwapIn,
    SwapOut,
    fingerprint_of,
    validate,
)
from memplan.planners.core.semantics import IndexedPlan, OpTable, frees_in_order

from tests.sim.handtraces import B, Call, make

BRANCHES_FIRST = (0, 2, 1, 3, 4)


def interleaved():
    """x -> a1 -> a2 and x -> b1 -> b2, joined by op4; the trace interleaves
    the branches (op0 makes a1, op1 b1, op2 a2, op3 b2). Buffers: 0 x (input,
    1 MiB), 1 a1 (4), 2 b1 (4), 3 a2 (1), 4 b2 (1), 5 out (1); each is freed
    after its last access in the trace."""
    bufs = [B(1, "input"), B(4), B(4), B(1), B(1), B(1)]
    ops = [Call([0], [1]), Call([0], [2]), Call([1], [3]), Call([2], [4]), Call([3, 4], [5])]
    return make(bufs, ops)


def test_frees_move_to_the_last_access_in_the_new_order():
    t, _ = interleaved()
    # trace order: x after op1, a1 after op2, b1 after op3, the rest after op4
    assert OpTable.of(t).frees == ((), (0,), (1,), (2,), (3, 4, 5))
    # an explicit identity order means the same as none
    assert frees_in_order(t, range(5)) == OpTable.of(t).frees
    # (0, 2, 1, 3, 4): the same ops are last, only their positions change
    assert frees_in_order(t, BRANCHES_FIRST) == ((), (0,), (1,), (2,), (3, 4, 5))
    ip = IndexedPlan.of(Plan(fingerprint_of(t), order=BRANCHES_FIRST), t)
    assert ip.order == BRANCHES_FIRST


def test_a_buffer_the_framework_keeps_past_its_last_access_goes_with_the_op_that_drops_it():
    # buffer 1 is last read by op1 but freed after op2 (an independent op)
    t, _ = make(
        [B(1, "input"), B(1, freed_after=2), B(1), B(1)],
        [Call([0], [1]), Call([1], [2]), Call([0], [3])],
    )
    assert OpTable.of(t).frees == ((), (2,), (0, 1, 3))
    # order (0, 2, 1): op1, the last reader, now comes after op2, which dropped it
    assert frees_in_order(t, (0, 2, 1)) == ((), (1, 2), (0, 3))


def test_the_plan_file_keeps_the_order_and_old_files_load():
    t, _ = interleaved()
    plan = Plan(fingerprint_of(t), (Release(1, 2),), "hand", BRANCHES_FIRST)
    doc = io.to_dict(PlanResult("hand", Status.PLANNED, (plan,)))
    assert doc["plans"][0]["order"] == list(BRANCHES_FIRST)
    assert io.from_dict(doc, [t]).plans[0] == plan
    del doc["plans"][0]["order"]
    assert io.from_dict(doc, [t]).plans[0].order is None


def test_a_plan_file_with_a_refused_order_names_it():
    t, _ = interleaved()
    doc = io.to_dict(
        PlanResult("hand", Status.PLANNED, (Plan(fingerprint_of(t), order=(0, 1, 2, 4, 3)),))
    )
    with pytest.raises(
        OrderError,
        match=r"^plans\[0\]\.order: op 4 .* at position 3 before op 3 .* that writes buffer 4 it reads",
    ):
        io.from_dict(doc, [t])
    doc["plans"][0]["order"] = "0 1 2"
    with pytest.raises(PlanError, match=r"^plans\[0\]\.order: expected a list of op ids"):
        io.from_dict(doc)
    doc["plans"][0]["order"] = [0, -1]
    with pytest.raises(PlanError, match=r"^plans\[0\]\.order\[1\]"):
        io.from_dict(doc)


def test_before_and_after_are_positions_in_the_order():
    # swap x out after op0, back in after op2 for op1: only op2 running before op1 allows it
    t, _ = interleaved()
    events = (SwapOut(0, 0), SwapIn(0, 2, 1))
    with pytest.raises(PlanError, match=r"after_op 2 is not before before_op 1"):
        validate(Plan(fingerprint_of(t), events), t)
    check(Plan(fingerprint_of(t), events, order=BRANCHES_FIRST), t)
    # a release before a later reader in the order: check replays in that order
    late = Plan(fingerprint_of(t), (Release(0, 0),), order=BRANCHES_FIRST)
    with pytest.raises(PlanError, match=r"op 1 .* reads buffer 0, which is absent"):
        check(late, t)

"""Derived arrays and memory curves on a trace small enough to work out by hand."""

from __future__ import annotations

import numpy as np
import pytest
from memplan.traces.model import BufferKind

from tests.traces.test_io import MiB, toy


def test_derived_arrays():
    t = toy()
    assert t.nbytes.tolist() == [4 * MiB, 1 * MiB, 2 * MiB, 3 * MiB]
    assert t.exists_at_start.tolist() == [True, True, False, False]
    assert t.created_at.tolist() == [-1, -1, 0, 1]
    assert t.first_access.tolist() == [0, 0, 0, 1]
    assert t.last_access.tolist() == [0, 0, 1, 2]
    assert t.freed_after.tolist() == [3, 2, 2, 2]  # persistent: n_ops
    assert t.op_reads(0).tolist() == [0, 1]
    assert t.op_writes(1).tolist() == [3]
    assert t.op_accesses(1).tolist() == [2, 3]
    assert t.accesses_of(2).tolist() == [0, 1]
    assert t.accesses_of(0).tolist() == [0]
    assert t.writers_of(2).tolist() == [0]
    assert t.writers_of(3).tolist() == [1]
    assert t.writers_of(0).tolist() == []  # read only


def test_memory_curves_by_hand():
    t = toy()
    # framework: every temp lives to the end -> 4+1+2, 4+1+2+3, 4+1+2+3 MiB
    assert (t.memory_curve("framework") // MiB).tolist() == [7, 10, 10]
    # liveness: x dies after op 0, a after op 1 -> 4+1+2, 4+2+3, 4+3
    assert (t.memory_curve("liveness") // MiB).tolist() == [7, 9, 7]
    assert t.peak("framework") == (10 * MiB, 1)
    assert t.peak("liveness") == (9 * MiB, 1)
    assert (t.memory_curve(kind=BufferKind.ACTIVATION) // MiB).tolist() == [2, 5, 5]
    assert t.bytes_by_kind()[BufferKind.PARAM] == 4 * MiB


def test_bad_policy_is_a_value_error():
    with pytest.raises(ValueError, match="policy='lazy'"):
        toy().memory_curve("lazy")  # type: ignore[arg-type]


def test_curve_sums_kinds():
    t = toy()
    total = sum(t.memory_curve(kind=k) for k in BufferKind)
    np.testing.assert_array_equal(total, t.memory_curve())

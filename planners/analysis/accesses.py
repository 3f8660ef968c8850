"""Which ops access each buffer, and which of those accesses write it.

`AccessTable` holds one trace's per-buffer access lists
(`Trace.buffer_accesses`) with a write flag per access, and finds the gap
between two accesses around an op (where a swap or a recompute can go).
`access_table(trace)` builds it once per trace object.
"""

from __future__ import annotations

import weakref

import numpy as np
from memplan.traces.model import Trace


class AccessTable:
    """Per-buffer access lists of one trace: the ops accessing buffer b are
    `ops[ptr[b]:ptr[b+1]]` (ascending), `writes[k]` says whether access k
    writes the buffer. Built once per trace (`access_table`)."""

    __slots__ = ("trace", "ptr", "ops", "writes", "n_ops")

    def __init__(self, trace: Trace):
        self.trace = trace
        self.n_ops = trace.n_ops
        self.ptr, self.ops = trace.buffer_accesses
        wp, wb = trace.writes_csr
        w_op = np.repeat(np.arange(trace.n_ops, dtype=np.int64), np.diff(wp))
        w_key = w_op * max(trace.n_buffers, 1) + wb
        b_of = np.repeat(np.arange(trace.n_buffers, dtype=np.int64), np.diff(self.ptr))
        a_key = self.ops * max(trace.n_buffers, 1) + b_of
        self.writes = np.isin(a_key, w_key)

    def accesses(self, b: int) -> np.ndarray:
        return self.ops[self.ptr[b] : self.ptr[b + 1]]

    def count(self, b: int) -> int:
        return int(self.ptr[b + 1] - self.ptr[b])

    def gap_around(self, b: int, op: int) -> tuple[int, int, int] | None:
        """The gap of `b`'s accesses that strictly contains `op`: (k, prev, next)
        with prev = k-th access < op < next = (k+1)-th access. For a
        persistent buffer the gap after its last access wraps into the next
        iteration: next is then `first access + n_ops` (and if `op` is before
        the first access, prev is `last access - n_ops`). None if `op` is an
        access of `b` or outside its accessed range."""
        acc = self.accesses(b)
        m = len(acc)
        if m == 0:
            return None
        k = int(np.searchsorted(acc, op, "right")) - 1
        if k >= 0 and acc[k] == op:
            return None
        persistent = bool(self.trace.persistent[b])
        if k < 0:
            if not persistent:
                return None
            return m - 1, int(acc[-1]) - self.n_ops, int(acc[0])
        if k == m - 1:
            if not persistent:
                return None
            return k, int(acc[k]), int(acc[0]) + self.n_ops
        return k, int(acc[k]), int(acc[k + 1])

    def written_between(self, b: int, k0: int, k1: int) -> bool:
        """Whether any of `b`'s accesses k0+1 .. k1 (indices into its list) writes it."""
        p = int(self.ptr[b])
        return bool(self.writes[p + k0 + 1 : p + k1 + 1].any())


_ACCESS_TABLES: weakref.WeakKeyDictionary[Trace, AccessTable] = weakref.WeakKeyDictionary()


def access_table(trace: Trace) -> AccessTable:
    """The `AccessTable` of `trace`, built once per trace object."""
    table = _ACCESS_TABLES.get(trace)
    if table is None:
        table = _ACCESS_TABLES[trace] = AccessTable(trace)
    return table

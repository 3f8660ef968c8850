"""Absences: where in one iteration a buffer may be off the device, and what
having it back costs per period of the steady state (NOTE [ Absences ],
NOTE [ The boundary ]). The time bounds of `planners.analysis.bounds` and
`planners.analysis.window_bound` are built on this table.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction, TimeUnit
from memplan.traces.model import Trace

# NOTE [ Absences ]
# What every plan the checker accepts must do as the simulator runs it (NOTE [ Event semantics ] in
# sim/model.py), under any OOM policy. Buffer x alive across op k but not accessed by it is in a gap
# (p, q) of consecutive accesses p < k < q (p = -1 before an input's or persistent buffer's first,
# q = n after a persistent one's last; (-1, n) if it has none). Op k's release-only memory M_k
# (`liveness`) is its accesses plus its gaps: under budget B, need_k = M_k - B bytes of gaps hold
# no device bytes when k's kernel starts (tau_k) and just before it ends (eps_k). A gap absent at
# such an instant iota is back before its next access by:
# - the lane: a D2H copy after w, x's last write (or creation, or load) before iota, and an H2D
#   copy after iota; per period (NOTE [ The boundary ]) one D2H per epoch (the gaps between two
#   writes, wrapping around for a persistent x) and one H2D per gap, the pieces (p_m, n) and
#   (-1, p_0) of a persistent x being one; within an iteration only copies with w >= -1, q < n;
# - a recompute kernel in (iota, start of q] (never for a persistent x) of at least the cheapest
#   op that writes x, does not read it and writes no persistent buffer, shared by bytes (`rec`).
# A copy takes >= `copy_time` on a lane, kernels the compute stream one at a time; issue costs
# left out. Why, case by case: docs/notes.md, "Absences".


# NOTE [ The boundary ]
# A persistent x last accessed at p_m and first at p_0 is absent across the iteration boundary in
# one gap, split in the table at n. In a run whose iterations >= 1 repeat with period T, every
# period holds, for each absence of x there, its D2H copy (after the last write, of the previous
# iteration for the piece (-1, p_0)) and its H2D copy (of the next iteration for (p_m, n)), on the
# lane in T: a bound charged per period holds for that period, and for the mean of iterations
# 1..N-1 of any run as N grows. A run of N iterations may leave some of that work to iterations 0
# (a D2H after its write) and N (an H2D for it, never started): its mean may fall short of the
# bound by that over N - 1 (for copies, at most one round trip of each persistent buffer). A bound
# charged only copies within one iteration (w >= -1, q < n) holds for each iteration of any run.
# Derivation: docs/notes.md, "Absences".


@dataclass(frozen=True, eq=False)
class Gaps:
    """The gaps of one trace on one device (NOTE [ Absences ]): gap g is
    buffer `buffer[g]`, off the device at most while ops `after[g]` + 1 ..
    `before[g]` - 1 run; `nbytes[g]` its bytes (float64); `d2h[g]`, `h2d[g]`
    the seconds of the copies forced per period if it is absent and comes
    back by the lane (0 where none is forced; NOTE [ The boundary ]): of
    these, one iteration holds the D2H only where `written[g]` >= -1 and the
    H2D only where `before[g]` < `n_ops`; `rec[g]` the seconds of compute a
    recomputation is charged (inf: none possible); `epoch[g]` numbers the
    gaps that can share one D2H copy, `trip[g]` those that can share one H2D
    copy (the two pieces of a persistent buffer's gap across the boundary).
    In op positions of an unrolled run (op j of the previous iteration at
    j - n, of the next at j + n): its D2H starts after `out_after[g]` ends
    (`written[g]` if >= -1, else the buffer's last write of the previous
    iteration), its H2D ends before `in_before[g]` starts (`before[g]`, or
    the buffer's first access of the next iteration)."""

    n_ops: int
    buffer: np.ndarray
    after: np.ndarray
    before: np.ndarray
    nbytes: np.ndarray
    d2h: np.ndarray
    h2d: np.ndarray
    rec: np.ndarray
    written: np.ndarray
    epoch: np.ndarray
    trip: np.ndarray
    out_after: np.ndarray
    in_before: np.ndarray

    def __len__(self) -> int:
        return len(self.buffer)

    def around(self, k: int) -> np.ndarray:
        """int64[]: the gaps op `k` runs in."""
        return np.flatnonzero((self.after < k) & (self.before > k))

    def lane(self, lanes: int) -> np.ndarray:
        """Seconds a gap's copies add to one period's lane time (NOTE [ The
        boundary ]): the round trip on one lane, half of it on two (the
        busier direction is at least the average)."""
        both = self.d2h + self.h2d
        return both / 2 if lanes == 2 else both


class Writes(NamedTuple):
    """Every (op, buffer) write of a trace, in the trace's CSR order: `op`,
    `buffer`, `share` (the buffer's share of the bytes the op writes) and
    `maker` (the op writes the buffer without reading it and writes no
    persistent buffer: it may start a recompute of it)."""

    op: np.ndarray
    buffer: np.ndarray
    share: np.ndarray
    maker: np.ndarray


def writes(trace: Trace) -> Writes:
    """The writes of `trace` (see `Writes`)."""
    n, nb = trace.n_ops, trace.nbytes
    wp, wb = trace.writes_csr
    w_op = np.repeat(np.arange(n, dtype=np.int64), np.diff(wp))
    rp, rb = trace.reads_csr
    r_op = np.repeat(np.arange(n, dtype=np.int64), np.diff(rp))
    width = np.int64(trace.n_buffers + 1)
    reads_it = np.isin(w_op * width + wb, r_op * width + rb)
    out_bytes = np.zeros(n, np.float64)
    np.add.at(out_bytes, w_op, nb[wb])
    share = np.where(out_bytes[w_op] > 0, nb[wb] / np.maximum(out_bytes[w_op], 1), 1.0)
    return Writes(w_op, wb, share, ~reads_it & ~trace.writes_persistent[w_op])


def recompute_costs(trace: Trace, d: np.ndarray) -> np.ndarray:
    """float64[n_buffers]: the compute a recomputation of each buffer is
    charged, in the units of `d` (per op): the least, over the ops that
    write it, do not read it and write no persistent buffer, of that op's
    duration times the buffer's share of the bytes it writes (NOTE
    [ Absences ]); inf where no op qualifies. RNG ops qualify: a chain may
    restore the generator (`Recompute.restore_rng`)."""
    w = writes(trace)
    rec = np.full(trace.n_buffers, np.inf)
    np.minimum.at(rec, w.buffer[w.maker], (d[w.op] * w.share)[w.maker])
    return rec


# NOTE [ Later writes in the chain ]
# A plan's chain remakes x from its first op that writes x and must also
# re-run every later write of x before the op it serves (NOTE [ A chain makes
# every write ] in planners/core/check.py); DTR remakes only buffers no op
# writes after their maker. So a gap (p, q) of x that comes back by
# recompute is charged, over the ops m that write x without reading it, the
# least of: for m <= p, m's share plus the shares of the writes of x in
# (m, p] (an in-place `bernoulli_` after the `empty_like` that made x), least
# at the last such m, as shares are >= 0; for m >= q, m's share alone (no
# access of x lies in (p, q)). Shares as in `recompute_costs`: each op's
# duration split over what it writes by bytes, so the charges of one run of
# one op add up to at most its duration.
def chain_costs(
    trace: Trace, d: np.ndarray, buf: np.ndarray, p: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """float64[gaps]: the recompute charge of each gap (`buf`, `p`, `q`) of
    NOTE [ Later writes in the chain ], in the units of `d`; inf where no
    op qualifies. Never below `recompute_costs` of the buffer."""
    n, w = trace.n_ops, writes(trace)
    wb, w_op, maker, cost = w.buffer, w.op, w.maker, d[w.op] * w.share
    span = np.int64(n + 2)
    key = wb.astype(np.int64) * span + w_op + 1
    order = np.argsort(key, kind="stable")
    key, cost, maker = key[order], cost[order], maker[order]
    cum = np.concatenate([[0.0], np.cumsum(cost)])
    buf = buf.astype(np.int64)
    # before the gap: from the last maker at or before p through the writes up to p
    end = np.searchsorted(key, buf * span + p + 1, side="right")
    mk = np.flatnonzero(maker)
    j = np.searchsorted(key[mk], buf * span + p + 1, side="right") - 1
    at = mk[np.maximum(j, 0)]
    ok = (j >= 0) & (key[at] // span == buf)
    before = np.where(ok, cum[end] - cum[at], np.inf)
    # after it: the cheapest maker at or after q, alone
    best = np.full(len(key), np.inf)  # best[i]: least maker cost at or after i, same buffer
    run = np.inf
    owner = key // span
    for i in range(len(key) - 1, -1, -1):
        if i == len(key) - 1 or owner[i] != owner[i + 1]:
            run = np.inf
        if maker[i]:
            run = min(run, cost[i])
        best[i] = run
    start = np.searchsorted(key, buf * span + q + 1, side="left")
    has = (start < len(key)) & (owner[np.minimum(start, len(key) - 1)] == buf)
    after = np.where(has, best[np.minimum(start, len(key) - 1)], np.inf)
    return np.minimum(before, after)


def gap_table(trace: Trace, device: DeviceModel) -> Gaps:
    """Every gap of `trace` (NOTE [ Absences ]), costed on `device`, in
    seconds per period (NOTE [ The boundary ])."""
    n = trace.n_ops
    bp, acc = trace.buffer_accesses
    owner = np.repeat(np.arange(trace.n_buffers, dtype=np.int64), np.diff(bp))
    same = owner[1:] == owner[:-1]
    within = same & (acc[1:] - acc[:-1] >= 2)
    first, last = trace.first_access, trace.last_access
    head = np.flatnonzero(trace.exists_at_start & (first >= 1))
    tail = np.flatnonzero(trace.persistent & (last >= 0) & (last <= n - 2))
    idle = np.flatnonzero(trace.persistent & (last < 0))
    buf = np.concatenate([owner[:-1][within], head, tail, idle])
    p = np.concatenate(
        [acc[:-1][within], np.full(len(head), -1), last[tail], np.full(len(idle), -1)]
    )
    q = np.concatenate([acc[1:][within], first[head], np.full(len(tail) + len(idle), n)])
    w = _last_write(trace, buf, p)
    nb = trace.nbytes[buf]
    d = device.op_durations(trace, TimeUnit.S)
    d2h = np.asarray(device.copy_time(nb, Direction.D2H, TimeUnit.S), np.float64)
    h2d = np.asarray(device.copy_time(nb, Direction.H2D, TimeUnit.S, duplex=False), np.float64)
    # per period (NOTE [ The boundary ]): before its first write a persistent
    # buffer's host copy is of the previous iteration's last write, whose epoch
    # it shares; one never written keeps the copy it was first swapped out with
    w_end = _last_write(trace, buf, np.full(len(buf), n - 1))
    epoch_w = np.where(w >= -1, w, w_end)
    d2h_forced = epoch_w >= -1
    comes_back = (q <= n - 1) | (trace.persistent[buf] & (last[buf] >= 0))
    rec = np.where(q <= n - 1, chain_costs(trace, d, buf, p, q), np.inf)
    _, epoch = np.unique(buf * np.int64(n + 3) + (epoch_w + 2), return_inverse=True)
    return Gaps(
        n_ops=n,
        buffer=buf.astype(np.int64),
        after=p.astype(np.int64),
        before=q.astype(np.int64),
        nbytes=nb.astype(np.float64),
        d2h=np.where(d2h_forced, d2h, 0.0),
        h2d=np.where(comes_back, h2d, 0.0),
        rec=rec,
        written=w,
        epoch=epoch.astype(np.int64),
        trip=_trips(buf, p, q, n),
        out_after=np.where(w >= -1, w, epoch_w - n).astype(np.int64),
        in_before=np.where(q <= n - 1, q, first[buf] + n).astype(np.int64),
    )


def _trips(buf: np.ndarray, p: np.ndarray, q: np.ndarray, n: int) -> np.ndarray:
    """int64[gaps]: gap numbers, except that a persistent buffer's piece
    (p_m, n) takes the number of its piece (-1, p_0): one absence across the
    boundary, one H2D copy (NOTE [ The boundary ])."""
    trip = np.arange(len(buf), dtype=np.int64)
    heads = np.flatnonzero((p == -1) & (q <= n - 1))
    tails = np.flatnonzero((p >= 0) & (q == n))
    at = np.searchsorted(buf[heads], buf[tails]) if len(heads) else np.zeros(0, np.int64)
    if len(heads):
        at = np.minimum(at, len(heads) - 1)
        pair = buf[heads][at] == buf[tails]
        trip[tails[pair]] = heads[at[pair]]
    return trip


def _last_write(trace: Trace, buf: np.ndarray, p: np.ndarray) -> np.ndarray:
    """int64[gaps]: the op after whose end a D2H copy for the gap may start:
    the last write of the buffer at or before `p` in this iteration (the op
    before its creation, if no write), -1 for an input never written (the
    iteration's start), -2 when none is in this iteration (a persistent
    buffer)."""
    n = trace.n_ops
    wp, wb = trace.writes_csr
    w_op = np.repeat(np.arange(n, dtype=np.int64), np.diff(wp))
    width = np.int64(n + 2)
    keys = np.sort(wb.astype(np.int64) * width + w_op + 1)
    probe = buf * width + p + 1  # writes at ops <= p sort at or below it
    i = np.searchsorted(keys, probe, side="right") - 1
    hit = (i >= 0) & (keys[np.maximum(i, 0)] // width == buf)
    written = np.where(hit, keys[np.maximum(i, 0)] % width - 1, -2)
    # a buffer exists from its creation, before the creating op ends (if that
    # op only read it, a copy could start with it); inputs from the start
    made = np.where(trace.created_at[buf] >= 0, trace.created_at[buf] - 1, -1)
    w = np.maximum(written, np.where(trace.persistent[buf], -2, made))
    return w.astype(np.int64)

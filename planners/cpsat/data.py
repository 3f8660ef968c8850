"""The data section of the CP-SAT planner: everything the model needs, in
integer ticks and bytes, derived once from the traces and the
`DeviceModel` (op durations, copy times, lanes).

A *gap* is a stretch of ops during which a buffer is alive but not accessed:
between two consecutive accesses (`WITHIN`), from the start of the iteration
to an input's or a persistent buffer's first access (`HEAD`; NOTE [ State at
the iteration start ] in cpsat/model.py), or from a persistent buffer's last access
to the end of the iteration, its next access being in the next iteration
(`CROSS`). Only gaps that contain a *hot* op -- one whose keep-everything
memory exceeds the budget (or the peak bound, when minimising the peak) --
get decision variables: leaving a buffer elsewhere never helps.

See NOTE [ CP-SAT semantics ] in `planners/cpsat/model.py` for how these
numbers become constraints.
"""

from __future__ import annotations

import bisect
import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction, TimeUnit
from memplan.hwmodels.errors import LatencyError
from memplan.planners.analysis.bounds import StepOrder, in_step_order, joint_memory_curve
from memplan.planners.core.errors import PlanError
from memplan.planners.core.semantics import OpTable
from memplan.planners.cpsat.chains import ChainGap, GapIndex, RecPoint, recompute_points
from memplan.traces.model import Trace

TICKS_PER_US = 1000  # one tick is a nanosecond: the simulator rounds op durations to 1 ns
TICKS_PER_S = 1_000_000_000
INEXACT_MARGIN = 64  # ticks

# NOTE [ Inexact copy times ]
# The simulator times a copy as `DeviceModel.copy_time` does, without rounding;
# the model rounds each copy up to whole ns, so in the simulator a copy ends
# up to 1 ns earlier than planned. Everything pinned after it (an op that
# waited for a swap-in, the copies triggered after that op) then runs that
# much earlier, and such shifts can add up along a chain of stalls. When
# copy times are not whole ns the margin between a free and the allocation
# it makes room for is therefore raised to INEXACT_MARGIN ns (64 stalls in
# a row before a tie could flip); on hardware whose copies are whole ns it
# stays at `margin_ns`, and the simulator reproduces the model exactly.


# NOTE [ Several jobs ]
# Jobs planned together share the compute, the lane(s) and one budget. The model keeps them
# in step (NOTE [ Jobs in step ] in planners/analysis/bounds.py): one period holds one
# iteration of every job, its ops at the positions of `in_step_order`, and everything per op
# (`dur`, `mem0`, the hot positions, the op chain) is per position; buffers are numbered job
# by job (`buf0`). A gap of job j lies between two of j's accesses but may be absent at any
# position between, other jobs' ops included. On top of NOTE [ CP-SAT semantics ]:
# - each op's request time Q_p is earlier, by the margin, than the next position's, so the
#   simulator serves the ops in this order (NOTE [ FIFO order ] in cpsat/model.py);
# - plan events are triggered by the job's own ops (a swap's hole contains the end of one of
#   its ops; a HEAD gap's copy-out starts after its op 0);
# - no recomputation: another job's op would slip in before the op it serves.
# Jobs must have the same number of ops, else a PlanError.
# Full text and the reasons: docs/notes.md, "Several jobs".


class GapKind(enum.Enum):
    HEAD = "head"  # an input or a persistent buffer, from the iteration start to its first access
    WITHIN = "within"  # between two consecutive accesses in the iteration
    CROSS = "cross"  # a persistent buffer, from its last access to the next iteration's first


@dataclass(frozen=True, slots=True)
class Gap:
    """One decision: keep the buffer, swap it (out after `a`, in before `c`) or
    release it after `a` and recompute it by re-running `recompute_op` before `c`.
    `a`, `c`, `hot` and `recompute_op` are positions (op indices for one job),
    `buffer` a global buffer id of job `job` (NOTE [ Several jobs ]).

    `a` is -1 for a HEAD gap (the iteration start). For a CROSS gap `c` is the
    first access in the next iteration, counted in this iteration's ops
    (`c_next`), and only the ops after `a` in this iteration may see the buffer
    absent (NOTE [ Iteration zero ]). `hot` are the hot ops at which absence
    is counted, ascending; `hot_idx` their positions in `CpsatData.hot`.
    `epoch_prev` are earlier gaps of the same buffer with no write to it in
    between: if one of them was swapped, the host copy is still valid and this
    gap needs no D2H copy. `rec_points` are where it may be recomputed by
    re-running `recompute_op` (NOTE [ Recompute chains ] in cpsat/chains.py),
    its own access `c` last; none if it may not. `temp_bytes` are the
    producer's other outputs, allocated while it re-runs and freed after
    (NOTE [ Recompute ] in cpsat/model.py)."""

    id: int
    buffer: int
    kind: GapKind
    a: int
    c: int
    c_next: bool
    hot: tuple[int, ...]
    hot_idx: tuple[int, ...]
    epoch_prev: tuple[int, ...]
    recompute_op: int = -1
    rec_points: tuple[RecPoint, ...] = ()
    temp_bytes: int = 0  # the producer's other outputs, made for the recomputation only
    job: int = 0

    @property
    def recomputable(self) -> bool:
        return bool(self.rec_points)

    def rec_span(self, op: int) -> tuple[int, int]:
        """(first, last) hot positions (indices into `CpsatData.hot`) at which
        the buffer is absent when recomputed before `op`: those before it."""
        k = bisect.bisect_left(self.hot, op)
        return self.hot_idx[0], self.hot_idx[k - 1]

    def point_index(self, op: int) -> int:
        """The index in `rec_points` of the point before `op`, -1 if none."""
        for i, p in enumerate(self.rec_points):
            if p.op == op:
                return i
        return -1


@dataclass(frozen=True, eq=False)
class CpsatData:
    """Ticks are nanoseconds. `mem0[k]` is the bytes resident while op k runs
    when every buffer is kept until its last access (the release-only plan),
    persistent buffers throughout. `hot` are the ops whose `mem0` exceeds
    `threshold` (the budget, or the peak lower bound in peak mode). With
    several jobs "op k" is position k of `order` and buffer b of job j is
    `buf0[j] + b` (NOTE [ Several jobs ])."""

    traces: tuple[Trace, ...]
    order: StepOrder
    buf0: np.ndarray  # int64[n_jobs + 1] first global buffer id of each job
    n_ops: int
    dur: np.ndarray  # int64[n_ops] op durations
    out_ticks: np.ndarray  # int64[n_buffers] D2H copy time
    in_ticks: np.ndarray  # int64[n_buffers] H2D copy time
    nbytes: np.ndarray  # int64[n_buffers]
    mem0: np.ndarray  # int64[n_ops]
    created: np.ndarray  # int64[n_ops] bytes op k allocates as it starts (its new outputs)
    threshold: int
    hot: np.ndarray  # int64[n_hot] hot ops, ascending
    gaps: tuple[Gap, ...]
    lanes: int
    margin: int  # ticks by which a free must precede an allocation it makes room for
    exact_transfers: bool  # every copy time is a whole number of ticks

    @property
    def compute_ticks(self) -> int:
        return int(self.dur.sum())

    @property
    def n_jobs(self) -> int:
        return len(self.traces)

    @property
    def trace(self) -> Trace:
        """The trace of a one-job model."""
        if len(self.traces) != 1:
            raise ValueError("a model of several jobs has no single trace")
        return self.traces[0]

    def own_prev(self, p: int) -> int:
        """The position of the previous op of p's job, -1 for its op 0."""
        j, k = int(self.order.job[p]), int(self.order.op[p])
        return int(self.order.pos[j][k - 1]) if k else -1


def op_ticks(trace: Trace, device: DeviceModel) -> np.ndarray:
    """int64[n_ops]: op durations in ns, rounded as the simulator rounds them
    (NOTE [ One rounding rule ] in hwmodels/device.py), for one job alone on
    the device (usage 0)."""
    try:
        return device.op_durations(trace, TimeUnit.NS).astype(np.int64)
    except LatencyError as e:
        raise PlanError(f"cpsat: {e}") from None


def copy_ticks(device: DeviceModel, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """(D2H ticks, H2D ticks, exact) per buffer: the device's copy times
    rounded up to whole ns (never shorter than the simulator's). With two
    lanes H2D is costed at the duplex rate (NOTE [ Two lanes ] in
    `cpsat/model.py`)."""
    out_ns = np.asarray(device.copy_time(nbytes, Direction.D2H, TimeUnit.NS), np.float64)
    in_ns = np.asarray(
        device.copy_time(nbytes, Direction.H2D, TimeUnit.NS, duplex=True), np.float64
    )
    out_t = np.ceil(out_ns - 1e-6).astype(np.int64)
    in_t = np.ceil(in_ns - 1e-6).astype(np.int64)
    exact = bool(np.allclose(out_t, out_ns, rtol=0, atol=1e-6)) and bool(
        np.allclose(in_t, in_ns, rtol=0, atol=1e-6)
    )
    return np.maximum(out_t, 1), np.maximum(in_t, 1), exact


def build_data(
    traces: Trace | Sequence[Trace],
    device: DeviceModel,
    threshold: int,
    *,
    margin: int = 1,
    chain_depth: int = 0,
) -> CpsatData:
    """The model's data for one job, or for several in step (NOTE [ Several
    jobs ]), on `device` (its lanes too); positions whose keep-all memory
    exceeds `threshold` bytes are hot. A recomputation may pull its sources'
    up to `chain_depth` deep (NOTE [ Recompute chains ] in cpsat/chains.py)."""
    jobs = (traces,) if isinstance(traces, Trace) else tuple(traces)
    if any(t.n_ops == 0 for t in jobs):
        raise PlanError("cpsat: the trace has no ops")
    try:
        order = in_step_order(jobs)
    except PlanError as e:
        raise PlanError(f"cpsat: {e}") from None
    dur = np.zeros(len(order.job), np.int64)
    for j, t in enumerate(jobs):
        dur[order.pos[j]] = op_ticks(t, device)
    nbytes = np.concatenate([t.nbytes for t in jobs]).astype(np.int64)
    buf0 = np.concatenate([[0], np.cumsum([t.n_buffers for t in jobs])]).astype(np.int64)
    out_t, in_t, exact = copy_ticks(device, nbytes)
    if not exact:  # NOTE [ Inexact copy times ]
        margin = max(margin, INEXACT_MARGIN)
    mem0 = joint_memory_curve(jobs, order)
    created = np.zeros(len(order.job), np.int64)
    for j, t in enumerate(jobs):
        created[order.pos[j]] = OpTable.of(t).create_bytes
    hot = np.flatnonzero(mem0 > threshold).astype(np.int64)
    gaps = _gaps(jobs, order, buf0, hot)
    if len(jobs) == 1:
        gaps = _with_points(jobs[0], gaps, hot, chain_depth)
    return CpsatData(
        traces=jobs,
        order=order,
        buf0=buf0,
        n_ops=len(order.job),
        dur=dur,
        out_ticks=out_t,
        in_ticks=in_t,
        nbytes=nbytes,
        mem0=mem0,
        created=created,
        threshold=int(threshold),
        hot=hot,
        gaps=gaps,
        lanes=device.lanes,
        margin=margin,
        exact_transfers=exact,
    )


# ---- gaps -----------------------------------------------------------------------------
@dataclass(slots=True)
class _Raw:
    buffer: int
    kind: GapKind
    a: int
    c: int
    lo: int  # first op where absence may count
    hi: int  # last op where absence may count


def _raw_gaps(trace: Trace) -> list[_Raw]:
    """Every gap with at least one op where the buffer could be absent."""
    n = trace.n_ops
    out: list[_Raw] = []
    for b in range(trace.n_buffers):
        acc = trace.accesses_of(b).tolist()
        if not acc:
            continue  # inputs nobody reads are released at the start; others never exist
        persistent = bool(trace.persistent[b])
        if trace.exists_at_start[b] and acc[0] >= 2:
            # op 0 sees it absent only if it waits for the copy-out (`_gaps`)
            out.append(_Raw(b, GapKind.HEAD, -1, acc[0], 1, acc[0] - 1))
        for a, c in zip(acc, acc[1:], strict=False):
            if c - a >= 2:
                out.append(_Raw(b, GapKind.WITHIN, a, c, a + 1, c - 1))
        if persistent and acc[-1] <= n - 2:
            out.append(_Raw(b, GapKind.CROSS, acc[-1], acc[0], acc[-1] + 1, n - 1))
    return out


def _gaps(
    traces: tuple[Trace, ...], order: StepOrder, buf0: np.ndarray, hot: np.ndarray
) -> tuple[Gap, ...]:
    gaps: list[Gap] = []
    several = len(traces) > 1
    for j, trace in enumerate(traces):
        pos = order.pos[j].tolist()
        raws, spans, ends = [], [], []
        for r in _raw_gaps(trace):
            # positions where the buffer may be absent (NOTE [ Several jobs ])
            if r.kind is GapKind.HEAD:
                # op 0 sees only a persistent buffer absent, by waiting for its copy-out
                # (NOTE [ Swap-out deadlines in the model ]; several jobs never wait)
                first = 0 if trace.persistent[r.buffer] and not several else 1
                lo, a = pos[0] + first, (pos[0] if several else -1)
            else:
                lo, a = pos[r.a] + 1, pos[r.a]
            hi = pos[-1] if r.kind is GapKind.CROSS else pos[r.c] - 1
            i0, i1 = np.searchsorted(hot, [lo, hi + 1])
            if i1 > i0:
                raws.append(r)
                spans.append((int(i0), int(i1)))
                ends.append((a, pos[r.c]))
        base = len(gaps)
        writes = [set(trace.op_writes(k).tolist()) for k in range(trace.n_ops)]
        by_buffer: dict[int, list[int]] = {}
        for i, (r, (i0, i1), (a, c)) in enumerate(zip(raws, spans, ends, strict=True)):
            prev = by_buffer.setdefault(r.buffer, [])
            epoch = tuple(base + x for x in prev if _same_epoch(trace, writes, raws[x], r))
            rec_op = -1 if several else _producer(trace, writes, r)
            temps = writes[rec_op] - {r.buffer} if rec_op >= 0 else set()
            gaps.append(
                Gap(
                    id=base + i,
                    buffer=int(buf0[j]) + r.buffer,
                    kind=r.kind,
                    a=a,
                    c=c,
                    c_next=r.kind is GapKind.CROSS,
                    hot=tuple(int(k) for k in hot[i0:i1]),
                    hot_idx=tuple(range(i0, i1)),
                    epoch_prev=epoch,
                    recompute_op=rec_op,
                    temp_bytes=int(trace.nbytes[list(temps)].sum()) if temps else 0,
                    job=j,
                )
            )
            prev.append(i)
    return tuple(gaps)


def _same_epoch(trace: Trace, writes: list[set[int]], early: _Raw, late: _Raw) -> bool:
    """No op writes the buffer from the end of `early` to the start of `late`
    (inclusive): a host copy made in `early` is still valid in `late`. Never
    across the iteration boundary (NOTE [ Iteration zero ])."""
    if early.kind is GapKind.CROSS:
        return False
    b = early.buffer
    acc = trace.accesses_of(b)
    between = acc[(acc >= early.c) & (acc <= late.a)]
    return not any(b in writes[k] for k in between.tolist())


def _producer(trace: Trace, writes: list[set[int]], r: _Raw) -> int:
    """The op that may re-make `r`'s buffer for its next access, or -1: a
    WITHIN gap of an activation whose producer draws no random numbers,
    reads none of what it writes, writes no persistent buffer (its other
    outputs are temporaries of the recomputation, `Gap.temp_bytes`), and
    which nothing rewrites before the gap ends. Its sources are NOTE
    [ Recompute chains ]'s business."""
    b = r.buffer
    if r.kind is not GapKind.WITHIN or trace.persistent[b] or trace.exists_at_start[b]:
        return -1
    p = int(trace.created_at[b])
    op = trace.ops[p]
    if op.rng or writes[p] & set(trace.op_reads(p).tolist()):
        return -1
    if any(trace.persistent[w] for w in writes[p]):
        return -1
    acc = trace.accesses_of(b)
    if any(b in writes[k] for k in acc[(acc > p) & (acc < r.c)].tolist()):
        return -1  # rewritten since it was made: re-running p gives the old value
    return p


def _with_points(
    trace: Trace, gaps: tuple[Gap, ...], hot: np.ndarray, depth: int
) -> tuple[Gap, ...]:
    """`gaps` of one job with their recompute points (NOTE [ Recompute chains ])."""
    n = trace.n_ops
    spans = [(g.id, g.buffer, g.a + 1, n - 1 if g.kind is GapKind.CROSS else g.c - 1) for g in gaps]
    cands = [
        ChainGap(g.id, g.buffer, g.a, g.c, g.recompute_op, int(hot[g.hot_idx[0]]))
        for g in gaps
        if g.recompute_op >= 0
    ]
    writes = [set(trace.op_writes(k).tolist()) for k in range(n)]
    points = recompute_points(trace, writes, cands, GapIndex(spans), depth)
    return tuple(
        replace(g, rec_points=points[g.id]) if g.id in points else replace(g, recompute_op=-1)
        for g in gaps
    )


def check_budget_type(budget: object) -> int:
    if isinstance(budget, bool) or not isinstance(budget, int | np.integer) or budget <= 0:
        raise PlanError(f"cpsat: budget={budget!r} must be a positive number of bytes")
    return int(budget)


def horizon(data: CpsatData) -> int:
    """An upper bound on the iteration time of any plan the model allows."""
    rec = sum(int(data.dur[g.recompute_op]) for g in data.gaps if g.recomputable)
    lane = sum(int(data.out_ticks[g.buffer] + data.in_ticks[g.buffer]) for g in data.gaps)
    slack = 2 * data.margin * (len(data.gaps) + data.n_ops) + 1
    return data.compute_ticks + rec + lane + slack


def gcd_bytes(data: CpsatData, peak: bool = False) -> int:
    """The largest unit that divides every byte count of a gap's buffer (and,
    for the peak objective, every hot op's memory and the peak floor, so
    that peaks compare exactly in units)."""
    g = 0
    for gap in data.gaps:
        g = math.gcd(g, int(data.nbytes[gap.buffer]))
    if peak:
        for x in data.mem0[data.hot].tolist():
            g = math.gcd(g, int(x))
        g = math.gcd(g, data.threshold)
    return max(g, 1)

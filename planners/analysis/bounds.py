"""Lower bounds that hold for every plan of one job: the peak no plan can go
below, and the iteration time no plan can beat under a budget on a
`DeviceModel` (NOTE [ Lower bounds ]); for several jobs, bounds on runs that
keep them in step (NOTE [ Jobs in step ]).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction, TimeUnit, op_workspace_bytes
from memplan.planners.analysis.gaps import gap_table, recompute_costs
from memplan.planners.core.errors import PlanError
from memplan.traces.model import Trace

# NOTE [ Lower bounds ]
# Peak: while op k runs, every buffer it reads or writes is on the device with its workspace:
# peak >= max_k working_set(k); and at an iteration's start the simulator holds every
# persistent buffer and every input it loads before any plan event can act: peak >= that too.
# Time (one job): each bound holds for the period T of the steady state of every run of any plan
# the checker accepts, under any OOM policy (NOTE [ The boundary ] in planners/analysis/gaps.py).
# Ops run one after another: T >= sum(d), each d the `DeviceModel`'s rounded to 1 ns as the
# simulator does (NOTE [ One rounding rule ] in hwmodels/device.py). Under budget B, while op k
# runs, M_k - B bytes of its gaps are absent, each at a lane or recompute cost per period
# (NOTE [ Absences ]); the lane is busy at most T and recomputes add to sum(d), relaxed to two
# fractional knapsacks (the single-op bound): T >= the least T with lane_bytes(T) +
# recompute_bytes(T - sum(d)) >= M_k - B for every k; two lanes halve a gap's copies.
# NOTE [ Window bounds ] refines it. The CP-SAT planner's `model_bound_s` holds only over plans
# its model can express (NOTE [ CP-SAT semantics ]), not for every plan.
# Full text: docs/notes.md, "Lower bounds".


@dataclass(frozen=True, slots=True)
class PeakBound:
    """`nbytes` = max(`working_set_bytes` of op `op`, `start_bytes`)."""

    nbytes: int
    op: int
    working_set_bytes: int
    start_bytes: int


@dataclass(frozen=True, slots=True)
class TimeBound:
    """Seconds. `seconds` = max(`compute_s`, `memory_s`); `memory_s` is the
    relaxation of NOTE [ Lower bounds ] at its tightest op `op` (-1 when no op
    exceeds the budget). inf (and `feasible` False) when the budget is below
    the peak bound or no choice of buffers can bring some op under it."""

    seconds: float
    compute_s: float
    memory_s: float
    op: int
    feasible: bool


@dataclass(frozen=True, slots=True)
class Bounds:
    budget_bytes: int
    peak: PeakBound
    time: TimeBound
    model_bound_s: float | None = None  # the CP-SAT bound, within its model's plans
    model_status: str | None = None

    @property
    def best_time_s(self) -> float:
        """The single-op bound, which holds for every plan; the split and
        multi-op bounds may be larger (`window_bound.best_time_bound`)."""
        return self.time.seconds

    def to_dict(self) -> dict:
        return {
            "budget_bytes": self.budget_bytes,
            "peak_bytes": self.peak.nbytes,
            "peak_op": self.peak.op,
            "working_set_bytes": self.peak.working_set_bytes,
            "start_bytes": self.peak.start_bytes,
            "time_s": _num(self.time.seconds),
            "compute_s": self.time.compute_s,
            "memory_s": _num(self.time.memory_s),
            "memory_op": self.time.op,
            "feasible": self.time.feasible,
            "model_bound_s": self.model_bound_s,
            "model_status": self.model_status,
        }


def _num(x: float) -> float | None:
    return None if math.isinf(x) else x


def gap_to_bound(iteration_s: float, bound_s: float) -> float:
    """(iteration time - bound) / bound: 0 is provably optimal."""
    if not bound_s > 0 or math.isinf(bound_s) or math.isnan(iteration_s):
        return math.nan
    return (iteration_s - bound_s) / bound_s


# ---- peak ------------------------------------------------------------------------------
def working_sets(trace: Trace, workspace: bool = True) -> np.ndarray:
    """int64[n_ops]: bytes each op reads or writes (+ its workspace)."""
    p, bufs = trace.access_csr
    op_of = np.repeat(np.arange(trace.n_ops, dtype=np.int64), np.diff(p))
    ws = np.zeros(trace.n_ops, np.int64)
    np.add.at(ws, op_of, trace.nbytes[bufs])  # reduceat breaks on ops that touch nothing
    if workspace:  # the trace's own (NOTE [ Workspaces ] in hwmodels/device.py)
        ws += op_workspace_bytes(trace)
    return ws


def start_bytes(trace: Trace) -> int:
    """Persistent buffers plus the inputs some op reads: resident when an
    iteration starts, before any plan event."""
    read = trace.last_access >= 0
    inputs = trace.exists_at_start & ~trace.persistent & read
    return int(trace.nbytes[trace.persistent].sum() + trace.nbytes[inputs].sum())


def peak_lower_bound(trace: Trace, *, workspace: bool = True) -> PeakBound:
    """No plan runs `trace` with a lower peak (NOTE [ Lower bounds ])."""
    ws = working_sets(trace, workspace)
    k = int(np.argmax(ws)) if len(ws) else -1
    w = int(ws[k]) if k >= 0 else 0
    s = start_bytes(trace)
    return PeakBound(max(w, s), k if w >= s else -1, w, s)


# ---- time ------------------------------------------------------------------------------
def _by_ratio(cost: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = np.isfinite(cost)
    cost, nbytes = cost[ok], nbytes[ok]
    order = np.argsort(cost / np.maximum(nbytes, 1), kind="stable")
    return cost[order], nbytes[order]


def _compute_s(d: np.ndarray) -> float:
    """Seconds of `d` (seconds per op) in series, summed in whole ns."""
    return float(np.round(d * 1e9).sum()) * 1e-9


@dataclass(frozen=True, eq=False)
class _Costs:
    """Per buffer of one job, for jobs in step (NOTE [ Jobs in step ]): (start,
    end) op of its release-only life, bytes, the lane time a round trip costs
    per period, and the compute a recomputation costs (inf where none can)."""

    start: np.ndarray
    end: np.ndarray
    nbytes: np.ndarray
    lane: np.ndarray
    rec: np.ndarray


def _costs(trace: Trace, device: DeviceModel, d: np.ndarray) -> _Costs:
    start, end = trace.lifetimes("liveness")
    nb = trace.nbytes
    writes_any = np.zeros(trace.n_buffers, bool)
    writes_any[trace.writes_csr[1]] = True
    d2h = np.asarray(device.copy_time(nb, Direction.D2H, TimeUnit.S), np.float64)
    # H2D at full speed, never the (slower) duplex rate: a lower bound
    h2d = np.asarray(device.copy_time(nb, Direction.H2D, TimeUnit.S, duplex=False), np.float64)
    # per period: a persistent buffer nobody writes keeps its host copy, and
    # one nobody accesses never comes back
    needs_out = ~trace.persistent | writes_any
    comes_back = ~trace.persistent | (trace.last_access >= 0)
    lane_cost = np.where(comes_back, h2d, 0.0) + np.where(needs_out, d2h, 0.0)
    if device.lanes == 2:
        lane_cost = lane_cost / 2
    rec_cost = np.where(trace.persistent, np.inf, recompute_costs(trace, d))
    return _Costs(start, end, nb, lane_cost, rec_cost)


def time_lower_bound(
    trace: Trace, device: DeviceModel, budget: int, *, workspace: bool = True
) -> TimeBound:
    """No run of `trace` on `device` under `budget` bytes has a shorter
    steady state (period; NOTE [ The boundary ] in planners/analysis/gaps.py):
    the single-op bound of NOTE [ Lower bounds ], at its tightest op."""
    d = device.op_durations(trace, TimeUnit.S)
    compute = _compute_s(d)
    if budget < peak_lower_bound(trace, workspace=workspace).nbytes:
        return TimeBound(math.inf, compute, math.inf, -1, False)
    need = trace.memory_curve("liveness") - budget
    hot = np.flatnonzero(need > 0)
    if len(hot) == 0:
        return TimeBound(compute, compute, 0.0, -1, True)
    gaps = gap_table(trace, device)
    lane = gaps.lane(device.lanes)
    best, best_k = compute, -1
    for k in hot.tolist():
        g = gaps.around(k)
        t_k = _row_time(compute, float(need[k]), lane[g], gaps.rec[g], gaps.nbytes[g])
        if t_k > best:
            best, best_k = t_k, k
    return TimeBound(best, compute, best if best_k >= 0 else 0.0, best_k, math.isfinite(best))


def _row_time(
    compute: float, need: float, lane: np.ndarray, rec: np.ndarray, nbytes: np.ndarray
) -> float:
    """The smallest time at which `need` bytes of these candidates can be off
    the device; inf if they hold fewer bytes than that."""
    if nbytes[np.isfinite(lane) | np.isfinite(rec)].sum() < need * (1 - 1e-12):
        return math.inf
    lc, lb = _by_ratio(lane, nbytes)
    rc, rb = _by_ratio(rec, nbytes)
    return _smallest_time(compute, need, lc, lb, rc, rb)


def _smallest_time(
    compute: float, need: float, lc: np.ndarray, lb: np.ndarray, rc: np.ndarray, rb: np.ndarray
) -> float:
    """Smallest T >= compute with cover(lane, T) + cover(recompute, T - compute)
    >= need (costs sorted by cost per byte). Both covers are piecewise linear
    in T, so their sum is linear between the merged breakpoints: the answer
    is found on the segment where the sum first reaches `need`."""
    lane, rec = _curve(lc, lb), _curve(rc, rb)

    def covered(t: np.ndarray | float) -> np.ndarray:
        return _on(lane, t) + _on(rec, np.asarray(t) - compute)

    if float(covered(compute)) >= need:
        return compute
    knots = np.unique(np.concatenate([lane[0], rec[0] + compute]))
    knots = knots[knots > compute]
    if len(knots) == 0 or float(covered(knots[-1])) < need * (1 - 1e-12):
        return math.inf
    values = covered(knots)
    i = int(np.searchsorted(values, need, side="left"))
    if i == len(knots):  # within the tolerance above: the whole cover
        return float(knots[-1])
    t0 = compute if i == 0 else float(knots[i - 1])
    v0 = float(covered(t0))
    t1, v1 = float(knots[i]), float(values[i])
    return t1 if v1 <= v0 else t0 + (need - v0) * (t1 - t0) / (v1 - v0)


def _curve(cost: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """(cumulative costs, cumulative bytes, free bytes) of a fractional
    knapsack sorted by cost per byte: the bytes it covers as a function of
    its budget, with the items that cost nothing apart (np.interp needs
    increasing costs)."""
    free = cost <= 0
    c = np.concatenate([[0.0], np.cumsum(cost[~free])])
    n = np.concatenate([[0.0], np.cumsum(nbytes[~free], dtype=np.float64)])
    return c, n, float(nbytes[free].sum())


def _on(curve: tuple[np.ndarray, np.ndarray, float], t: np.ndarray | float) -> np.ndarray:
    """Bytes `curve` covers with budget `t` (none below 0)."""
    c, n, free = curve
    t = np.asarray(t, np.float64)
    return np.where(t >= 0, np.interp(t, c, n) + free, 0.0)


def bounds(
    trace: Trace,
    device: DeviceModel,
    *,
    budget_bytes: int | None = None,
    workspace: bool = True,
) -> Bounds:
    """Both bounds at `budget_bytes` (default: the device's memory)."""
    budget = _budget(device, budget_bytes)
    peak = peak_lower_bound(trace, workspace=workspace)
    time = time_lower_bound(trace, device, budget, workspace=workspace)
    return Bounds(budget, peak, time)


def _budget(device: DeviceModel, budget_bytes: int | None) -> int:
    budget = device.hw.memory_bytes if budget_bytes is None else budget_bytes
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise PlanError(f"bounds: budget={budget!r} must be a positive number of bytes")
    return budget


# ---- several jobs ----------------------------------------------------------------------
# NOTE [ Jobs in step ]
# Compute is one FIFO queue shared by all jobs, and a job asks for it as soon as its previous
# op ended (and its next op's swap-ins are done): while every job has an op waiting they take
# turns (job 0's op k, job 1's op k, ...), and jobs with as many ops per iteration stay in step:
# a period holds one iteration of every job in `in_step_order`, is each one's steady iteration
# time, and starts when the compute frees for job 0's op 0. At every position job j is in the
# window of its next op (op 0 past its last); `joint_memory_curve` adds their release-only memory.
# The joint time bound holds for every plan that keeps the jobs in step (the CP-SAT planner's
# do, NOTE [ Several jobs ] in planners/cpsat/data.py): the period is at least all jobs' compute
# in series, and where the joint memory exceeds the budget the excess is off the device while
# that op runs (buffers alive but not accessed by it, and what other jobs create for their next
# op), at the costs of NOTE [ Lower bounds ]. It bounds the period of in-step runs, not every
# run's mean iteration time. The peak bound holds for every plan: all jobs load their
# persistent buffers and inputs at time 0.
# Full text: docs/notes.md, "Jobs in step".


@dataclass(frozen=True, eq=False)
class StepOrder:
    """The ops of one period of jobs in step: position p runs op `op[p]` of job
    `job[p]`; `pos[j][k]` is the position of job j's op k."""

    job: np.ndarray
    op: np.ndarray
    pos: tuple[np.ndarray, ...]

    @property
    def n_jobs(self) -> int:
        return len(self.pos)

    def window_ops(self, j: int) -> np.ndarray:
        """int64[positions]: job j's next op at or after each position (its op 0
        past its last op: its next iteration has started)."""
        p = self.pos[j]
        k = np.searchsorted(p, np.arange(len(self.job)), side="left")
        k[k == len(p)] = 0
        return k.astype(np.int64)


def in_step_order(traces: Sequence[Trace]) -> StepOrder:
    """The round-robin order of NOTE [ Jobs in step ]; PlanError unless every
    job has the same number of ops."""
    counts = [t.n_ops for t in traces]
    if not counts or len(set(counts)) != 1 or counts[0] < 1:
        raise PlanError(
            f"jobs: several jobs stay in step only with the same number of ops per iteration "
            f"(got {counts})"
        )
    k, n = len(traces), counts[0]
    pos = tuple(np.arange(n, dtype=np.int64) * k + j for j in range(k))
    job = np.tile(np.arange(k, dtype=np.int64), n)
    op = np.repeat(np.arange(n, dtype=np.int64), k)
    return StepOrder(job, op, pos)


def joint_memory_curve(traces: Sequence[Trace], order: StepOrder) -> np.ndarray:
    """int64[positions]: release-only bytes of all jobs at each position."""
    mem = np.zeros(len(order.job), np.int64)
    for j, t in enumerate(traces):
        mem += t.memory_curve("liveness")[order.window_ops(j)]
    return mem


def joint_peak_lower_bound(traces: Sequence[Trace], *, workspace: bool = True) -> PeakBound:
    """No plan runs `traces` together with a lower peak: the largest single
    working set, or every job's persistent buffers and inputs at time 0."""
    own = [peak_lower_bound(t, workspace=workspace) for t in traces]
    j = int(np.argmax([p.working_set_bytes for p in own]))
    w = own[j].working_set_bytes
    s = sum(p.start_bytes for p in own)
    return PeakBound(max(w, s), int(own[j].op) if w >= s else -1, w, s)


def joint_time_lower_bound(
    traces: Sequence[Trace],
    device: DeviceModel,
    budget: int,
    *,
    workspace: bool = True,
) -> TimeBound:
    """No in-step run of `traces` on `device` under `budget` bytes has a
    shorter period (NOTE [ Jobs in step ]). `op` is a position of
    `in_step_order`. Op durations are the device's, alone on it (usage 0)."""
    order = in_step_order(traces)
    ds = [device.op_durations(t, TimeUnit.S) for t in traces]
    compute = sum(_compute_s(d) for d in ds)
    if budget < joint_peak_lower_bound(traces, workspace=workspace).nbytes:
        return TimeBound(math.inf, compute, math.inf, -1, False)
    mem0 = joint_memory_curve(traces, order)
    hot = np.flatnonzero(mem0 > budget)
    if len(hot) == 0:
        return TimeBound(compute, compute, 0.0, -1, True)
    costs = [_costs(t, device, d) for t, d in zip(traces, ds, strict=True)]
    windows = [order.window_ops(j) for j in range(len(traces))]
    best, best_p = compute, -1
    for p in hot.tolist():
        jp = int(order.job[p])
        need = float(mem0[p] - budget)
        lane, rec, nb = [], [], []
        for j, (t, c) in enumerate(zip(traces, costs, strict=True)):
            k = int(windows[j][p])
            alive = (c.start <= k) & (c.end >= k)
            if j == jp:
                alive[t.op_accesses(k)] = False
            else:  # made for its next op: maybe not yet allocated (free to leave)
                made = alive & (c.start == k) & ~t.exists_at_start
                need -= float(c.nbytes[made].sum())
                alive &= ~made
            idx = np.flatnonzero(alive)
            lane.append(c.lane[idx])
            rec.append(c.rec[idx])
            nb.append(c.nbytes[idx])
        if need <= 0:
            continue
        t_p = _row_time(
            compute, need, np.concatenate(lane), np.concatenate(rec), np.concatenate(nb)
        )
        if t_p > best:
            best, best_p = t_p, p
    return TimeBound(best, compute, best if best_p >= 0 else 0.0, best_p, math.isfinite(best))


def joint_bounds(
    traces: Sequence[Trace],
    device: DeviceModel,
    *,
    budget_bytes: int | None = None,
    workspace: bool = True,
) -> Bounds:
    """`bounds` for several jobs run together (one job: `bounds` itself)."""
    if len(traces) == 1:
        return bounds(traces[0], device, budget_bytes=budget_bytes, workspace=workspace)
    budget = _budget(device, budget_bytes)
    peak = joint_peak_lower_bound(traces, workspace=workspace)
    time = joint_time_lower_bound(traces, device, budget, workspace=workspace)
    return Bounds(budget, peak, time)

"""Lower bounds that hold for every plan of one job: the peak no plan can go
below, and the iteration time no plan can beat under a budget.

# NOTE [ Lower bounds ]
# Peak: while op k runs, every buffer it reads or writes is on the device,
# with its workspace: peak >= max_k working_set(k). At the start of an
# iteration the simulator holds every persistent buffer and every input it
# loads before any plan event can act (persistent buffers are allocated when
# the job arrives, inputs when the iteration starts): peak >= that too.
#
# Time: ops run one after another, so T >= sum(d), with each d rounded to
# 1 ns as the simulator rounds it (4000 unrounded durations can differ from
# the simulated sum by microseconds). Under a budget B, an op k
# whose release-only memory M_k exceeds B needs M_k - B bytes of buffers that
# are alive but not accessed at k to be off the device while it runs. Each
# such buffer leaves either by a swap, which costs its H2D copy and -- unless
# it is a persistent buffer nobody writes (whose host copy outlives the
# iteration) -- a D2H copy in every iteration, on a lane that is busy at most
# T per iteration; or by recomputation of its producer (not if it consumes
# RNG, not for inputs and persistent buffers), which adds that op's duration
# to the compute stream. Letting every buffer be split fractionally and used
# by both means at once relaxes this to two fractional knapsacks: T is at
# least the smallest T with
#     lane_bytes(T) + recompute_bytes(T - sum(d)) >= M_k - B,
# for every k. With two lanes a byte costs half its round trip (the busier
# direction is at least the average), with H2D at full speed.
#
# The CP-SAT planner's best bound is a bound over the plans its model can
# express (NOTE [ CP-SAT semantics ] lists its rules); it is reported beside
# these, as `model_bound_s`, and is not claimed for every plan.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hwmodels.latency import LatencyModel
from hwmodels.profile import Hardware
from planners.errors import PlanError
from traces.model import Trace


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
        """The largest bound that holds for every plan (the analytic one)."""
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
    if workspace:
        ws += np.fromiter((op.workspace_bytes for op in trace.ops), np.int64, trace.n_ops)
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
def _cover(cost: np.ndarray, nbytes: np.ndarray, budget: float) -> float:
    """Bytes a fractional knapsack covers with `budget` of cost (cheapest per
    byte first); `cost`, `nbytes` sorted by cost per byte."""
    if budget <= 0 or len(cost) == 0:
        return 0.0
    cum = np.cumsum(cost)
    i = int(np.searchsorted(cum, budget, side="right"))
    whole = float(nbytes[:i].sum())
    if i < len(cost):
        whole += float(nbytes[i]) * (budget - (cum[i - 1] if i else 0.0)) / float(cost[i])
    return whole


def _by_ratio(cost: np.ndarray, nbytes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = np.isfinite(cost)
    cost, nbytes = cost[ok], nbytes[ok]
    order = np.argsort(cost / np.maximum(nbytes, 1), kind="stable")
    return cost[order], nbytes[order]


def time_lower_bound(
    trace: Trace,
    hw: Hardware,
    latency: LatencyModel,
    budget: int,
    *,
    lanes: int = 1,
    workspace: bool = True,
) -> TimeBound:
    """No plan runs one iteration of `trace` under `budget` bytes faster."""
    if lanes not in (1, 2):
        raise PlanError(f"bounds: lanes={lanes!r} must be 1 or 2")
    # op durations as the simulator runs them: rounded to 1 ns
    d = np.round(np.asarray(latency.predict_all(trace, hw, 0.0), np.float64) * 1e6, 3) * 1e-6
    compute = float(np.round(d * 1e9).sum()) * 1e-9
    if budget < peak_lower_bound(trace, workspace=workspace).nbytes:
        return TimeBound(math.inf, compute, math.inf, -1, False)
    mem0 = trace.memory_curve("liveness")
    hot = np.flatnonzero(mem0 > budget)
    if len(hot) == 0:
        return TimeBound(compute, compute, 0.0, -1, True)
    start, end = trace.lifetimes("liveness")
    nb = trace.nbytes
    writes_any = np.zeros(trace.n_buffers, bool)
    writes_any[trace.writes_csr[1]] = True
    d2h = np.array([hw.transfer_s(int(x), "d2h") for x in nb])
    h2d = np.array([hw.transfer_s(int(x), "h2d") for x in nb])
    needs_out = ~trace.persistent | writes_any
    lane_cost = h2d + np.where(needs_out, d2h, 0.0)
    if lanes == 2:
        lane_cost = lane_cost / 2
    producer = trace.created_at
    rng = np.fromiter((op.rng for op in trace.ops), bool, trace.n_ops)
    recomputable = (producer >= 0) & ~trace.persistent & ~trace.exists_at_start
    rec_cost = np.full(trace.n_buffers, np.inf)
    ok = recomputable & ~rng[np.maximum(producer, 0)]
    rec_cost[ok] = d[producer[ok]]
    best, best_op = compute, -1
    for k in hot.tolist():
        alive = (start <= k) & (end >= k)
        alive[trace.op_accesses(k)] = False
        need = float(mem0[k] - budget)
        idx = np.flatnonzero(alive)
        lc, lb = _by_ratio(lane_cost[idx], nb[idx])
        rc, rb = _by_ratio(rec_cost[idx], nb[idx])
        t = _smallest_time(compute, need, lc, lb, rc, rb)
        if t > best:
            best, best_op = t, k
    return TimeBound(best, compute, best if best_op >= 0 else 0.0, best_op, math.isfinite(best))


def _smallest_time(
    compute: float, need: float, lc: np.ndarray, lb: np.ndarray, rc: np.ndarray, rb: np.ndarray
) -> float:
    """Smallest T >= compute with cover(lane, T) + cover(recompute, T - compute) >= need."""

    def covered(t: float) -> float:
        return _cover(lc, lb, t) + _cover(rc, rb, t - compute)

    hi = compute + float(lc.sum()) + float(rc.sum())
    if covered(hi) < need * (1 - 1e-12):
        return math.inf
    lo = compute
    if covered(lo) >= need:
        return lo
    for _ in range(100):
        mid = (lo + hi) / 2
        if covered(mid) >= need:
            hi = mid
        else:
            lo = mid
        if hi - lo <= 1e-12 * max(hi, 1e-9):
            break
    return hi


def bounds(
    trace: Trace,
    hw: Hardware,
    latency: LatencyModel,
    *,
    budget_bytes: int | None = None,
    lanes: int = 1,
    workspace: bool = True,
) -> Bounds:
    """Both bounds at `budget_bytes` (default: the device's memory)."""
    budget = hw.memory_bytes if budget_bytes is None else budget_bytes
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise PlanError(f"bounds: budget={budget!r} must be a positive number of bytes")
    peak = peak_lower_bound(trace, workspace=workspace)
    time = time_lower_bound(trace, hw, latency, budget, lanes=lanes, workspace=workspace)
    return Bounds(budget, peak, time)

"""Lower bounds on one iteration's time under a memory budget that look at
more than one instant of the iteration (NOTE [ Window bounds ]), and the
strongest bound proven for every plan (`best_time_bound`), named.

Every bound here holds for the period of the steady state of every run the
simulator makes of any plan the checker accepts, under any OOM policy (NOTE
[ The boundary ] in planners/analysis/gaps.py), as the single-op bound of
`planners.analysis.bounds` does (NOTE [ Lower bounds ]). The CP-SAT
planner's bound is not among them: it holds within its model only.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from memplan.hwmodels.device import DeviceModel, TimeUnit
from memplan.planners.analysis.bounds import (
    TimeBound,
    _budget,
    _compute_s,
    peak_lower_bound,
    time_lower_bound,
)
from memplan.planners.analysis.gaps import Gaps, gap_table
from memplan.planners.analysis.sources import DeadSources
from memplan.planners.analysis.whole import whole_cover
from memplan.traces.model import Trace
from ortools.graph.python import min_cost_flow

# NOTE [ Window bounds ]
# Two bounds on NOTE [ Absences ] (planners/analysis/gaps.py) for the period T of the steady
# state (NOTE [ The boundary ]), D the ops' durations summed, for every choice of their
# parameters (weak duality); as written here, the split bound holds for each iteration.
# Split: at sigma, op k's kernel start or end (D_< the ops before it, D_> the others), an op
# s before sigma and r after it (-1, n: the iteration's start, end), and b1, b2 in [0, 1],
#   T >= (1 - b1) D_< + b1 D_{<=s} + (1 - b2) D_> + b2 D_{>=r} + (the least cost of need_k bytes
#        at cost_g = min(b1 d2h_g [w_g >= s] + b2 h2d_g [q_g <= r, q_g < n], (1 - b2) rec_g)).
# Multi-op: every op over the budget covered at once, each epoch's D2H copy and each trip's H2D
# charged to its gap covering the most ops; for every b in [0, 1],
#   T >= (1 - b) D + (the least cost covering every need_k at min(b lane_g, (1 - b) rec_g)),
# lane_g = the copies charged to g (half on two lanes); solved exactly as a min-cost flow in
# integers (costs per byte rounded down), on at most MAX_ROWS ops (fewer rows only relax it).
# rec_g includes remaking dead sources (NOTE [ Dead sources ] in planners/analysis/sources.py);
# the split bound also covers with whole buffers on its best ops (NOTE [ Whole buffers ]).
# Derivation: docs/notes.md, "Window bounds".

# NOTE [ Split across the boundary ]
# In a run that repeats with period T, the window from the end of op s (any position of the
# unrolled run, s < -1 in the previous iteration) to the end of its next instance is T long and
# holds one instance of every copy and recompute of a period: the split bound's three windows
# are (end s, sigma), (sigma, start r) and (start r, end s + n), for any -n <= s < k and
# k < r <= s + n + 1 (`Gaps.out_after`, `in_before` in those positions). A recompute for an
# access past s + n runs, for the previous period, in the first window (weight 1 - b1). So the
# bound holds for the period (NOTE [ The boundary ] in planners/analysis/gaps.py); where s >= -1
# and every H2D it charges is back within the iteration (`in_before` < n), the windows are one
# iteration's, as in NOTE [ Window bounds ], and it holds for each iteration.

SINGLE_OP, SPLIT, MULTI_OP, COMPUTE, PEAK_FLOOR = (
    "single-op",
    "split",
    "multi-op",
    "compute",
    "peak floor",
)
TIE = 1e-6  # relative: bounds this close name the simpler argument
MAX_ROWS = 128  # ops whose need the multi-op cover keeps
CHECK_EVERY = 8  # the multi-op bound charges dead sources at every 8th kept row
SPLIT_OPS = 48  # ops the split bound screens on a coarse grid of (b1, b2)
SPLIT_SCANNED = 16  # of those, how many it tries at more (s, r)
SPLIT_REFINED = 4  # of those, how many it refines
WHOLE_SCANNED = 4  # of those, how many it screens and refines again with whole buffers
WHOLE_GAIN = 1e-3  # ... if whole buffers raise the op's fractional start by more than this
REFINE_ROUNDS = 2  # rounds of coordinate ascent in a refinement
POINTS = 2  # values of s and of r (besides the iteration's ends) a search tries
# the screening grid of dual weights, dense near 0: copies are dear next to compute
SCREEN = np.array([0.0, 0.003, 0.01, 0.03, 0.1, 0.3, 1.0])
COST_SCALE = 1e16  # integer cost units per second in the min-cost flow
GOLDEN_STEPS = 18  # a bracket of 0.618^18 ~ 2e-4
MAX_UNIT = 1 << 40  # largest integer cost per byte (clipped down: still a bound)


@dataclass(frozen=True, slots=True)
class NamedBound:
    """One lower bound on the iteration time, in seconds: `name` says which
    (`single-op`, `split`, `multi-op`, `compute`, `peak floor`), `where` what
    sets it (e.g. "start of op 320")."""

    name: str
    seconds: float
    where: str = ""


class BestBound(NamedTuple):
    """The strongest bound proven for every plan: (seconds, name)."""

    seconds: float
    name: str


@dataclass(frozen=True, slots=True)
class TimeBounds:
    """Every time bound of one trace at one budget (bytes); `best` the
    largest (the earliest listed of equals: the simplest argument)."""

    budget_bytes: int
    compute_s: float
    bounds: tuple[NamedBound, ...]
    single_op: TimeBound | None = None  # its details, when some op is over the budget

    @property
    def best(self) -> NamedBound:
        """The largest bound; of bounds within TIE of it, the first listed (the
        bounds sum the same durations in different orders)."""
        top = max(b.seconds for b in self.bounds)
        return next(b for b in self.bounds if b.seconds >= top * (1 - TIE))

    def to_dict(self) -> dict:
        inf = math.isinf
        return {
            "best": self.best.name,
            "best_s": None if inf(self.best.seconds) else self.best.seconds,
            "bounds": [
                {"name": b.name, "seconds": None if inf(b.seconds) else b.seconds, "where": b.where}
                for b in self.bounds
            ],
        }


def time_bounds(trace: Trace, device: DeviceModel, budget_bytes: int) -> TimeBounds:
    """Every bound on one iteration of `trace` on `device` under
    `budget_bytes`: the ops' compute, the single-op bound (NOTE [ Lower
    bounds ]) and the split and multi-op bounds (NOTE [ Window bounds ]).
    Below the peak lower bound (no workspace: the simulator allocates none)
    no plan fits: one bound, `peak floor`, of inf seconds. A budget that is
    not a positive number of bytes is a `PlanError`."""
    budget_bytes = _budget(device, budget_bytes)
    d = device.op_durations(trace, TimeUnit.S)
    compute = _compute_s(d)
    floor = peak_lower_bound(trace, workspace=False).nbytes
    if budget_bytes < floor:
        where = f"the budget is below the peak lower bound ({floor} bytes)"
        return TimeBounds(budget_bytes, compute, (NamedBound(PEAK_FLOOR, math.inf, where),))
    out = [NamedBound(COMPUTE, compute, "every op once")]
    need = (trace.memory_curve("liveness") - budget_bytes).astype(np.float64)
    if not (need > 0).any():
        return TimeBounds(budget_bytes, compute, tuple(out))
    single = time_lower_bound(trace, device, budget_bytes, workspace=False)
    out.append(NamedBound(SINGLE_OP, single.seconds, _at(single.op)))
    gaps, sources = gap_table(trace, device), DeadSources(trace, d)
    out.append(split_bound(gaps, d, need, (single.op,) if single.op >= 0 else (), sources=sources))
    out.append(multi_op_bound(gaps, d, need, device.lanes, sources=sources))
    return TimeBounds(budget_bytes, compute, tuple(out), single)


def best_time_bound(trace: Trace, device: DeviceModel, budget_bytes: int) -> BestBound:
    """(seconds, name) of the largest bound of `time_bounds`: what a gap to
    the bound is measured against."""
    b = time_bounds(trace, device, budget_bytes).best
    return BestBound(b.seconds, b.name)


def _at(op: int) -> str:
    return f"op {op}" if op >= 0 else "its copies hide behind compute"


# ---- split ----------------------------------------------------------------------------
def split_bound(
    gaps: Gaps,
    d: np.ndarray,
    need: np.ndarray,
    also: tuple[int, ...] = (),
    *,
    whole: bool = True,
    sources: DeadSources | None = None,
) -> NamedBound:
    """The split bound of NOTE [ Window bounds ] at the best op, instant and
    (s, r) tried, in three rounds on fewer and fewer ops: every hot op if few,
    else those `_pick` chooses and the ops in `also`, on a coarse grid of
    (b1, b2) at a few (s, r) (`_Split.tight`); the best of them at more
    (s, r); the best of those refined by golden sections. With `whole`, the
    best `WHOLE_SCANNED` of those are screened and refined again with
    buffers taken whole (NOTE [ Whole buffers ]); the bound is the larger,
    so never below the fractional one. With `sources`, recomputations are
    charged their dead sources at each op (NOTE [ Dead sources ])."""
    hot = np.flatnonzero(need > 0)
    ops = np.unique(np.concatenate([_pick(hot, need, SPLIT_OPS), np.asarray(also, np.int64)]))
    before = np.concatenate([[0.0], np.cumsum(d)])  # seconds of ops 0..k-1
    splits = [_Split(gaps, k, float(need[k]), before, sources) for k in ops.tolist()]
    ranked = sorted(((sp.scan(sp.pairs(0)), sp) for sp in splits), key=lambda x: -x[0][0])
    ranked = [(sp.scan(sp.pairs(POINTS)), sp) for _, sp in ranked[:SPLIT_SCANNED]]
    ranked.sort(key=lambda x: -x[0][0])
    best, where = -math.inf, ""
    for start, sp in ranked[:SPLIT_REFINED]:
        (v, *_), where_k = sp.refine(start)
        if v > best:
            best, where = v, where_k
    for (v, row, b1, b2, s, r), sp in ranked[:WHOLE_SCANNED] if whole else ():
        # NOTE [ Whole buffers ]: searched again only where whole buffers
        # already raise the fractional optimum (where they do not, the last
        # gap taken in part is a sliver of the need)
        if sp.values(*_one(b1, b2), s, r, True)[row, 0] <= v * (1 + WHOLE_GAIN):
            continue
        (v, *_), where_k = sp.refine(sp.scan(sp.pairs(POINTS), whole=True), whole=True)
        if v > best * (1 + TIE):
            best, where = v, where_k + ", whole buffers"
    return NamedBound(SPLIT, best, where)


Start = tuple[float, int, float, float, int, int]  # value, row, b1, b2, s, r


class _Split:
    """The split bound's dual at op `k` (NOTE [ Window bounds ]): row 0 at its
    start, row 1 at its end, for weights (b1, b2) and ops (s, r) in
    positions of an unrolled run (`Gaps.out_after`): s < -1 or r > n reach
    into the previous or the next iteration (NOTE [ Split across the
    boundary ])."""

    def __init__(
        self, gaps: Gaps, k: int, need: float, before: np.ndarray, sources: DeadSources | None
    ):
        g = _useful(gaps, gaps.around(k))
        rec = gaps.rec if sources is None else sources.gap_rec(gaps, k)
        self.d2h, self.h2d, self.rec = gaps.d2h[g], gaps.h2d[g], rec[g]
        self.nbytes, self.back = gaps.nbytes[g], gaps.before[g]
        self.out_after, self.in_before = gaps.out_after[g], gaps.in_before[g]
        self.k, self.n, self.need, self.before = k, gaps.n_ops, need, before

    def tight(self, within: bool = False) -> tuple[int, int]:
        """(s, r) that make the lane terms tight if every gap went by the lane:
        the last write after which, and the first access before which, the
        copied gaps hold `need` bytes (-1 and n if none do); `within` one
        iteration, or across its ends."""
        out, back = self._out(within), self._back(within)
        order = np.argsort(-self.out_after[out], kind="stable")
        i = np.searchsorted(np.cumsum(self.nbytes[out][order]), self.need)
        s = int(self.out_after[out][order][i]) if i < len(order) else -1
        order = np.argsort(self.in_before[back], kind="stable")
        i = np.searchsorted(np.cumsum(self.nbytes[back][order]), self.need)
        r = int(self.in_before[back][order][i]) if i < len(order) else self.n
        return s, r

    def pairs(self, points: int) -> set[tuple[int, int]]:
        """(s, r) to try: the iteration's ends, `tight`, and `points` more of
        each spread over the writes and accesses of the gaps, within the
        iteration and across its ends; r - s <= n + 1 (the three windows of
        NOTE [ Split across the boundary ] fit in one period)."""
        ss, rs = {-1}, {self.n}
        for within in (True, False):
            s_t, r_t = self.tight(within)
            ss |= {s_t, *_spread(np.unique(self.out_after[self._out(within)]), points)}
            rs |= {r_t, *_spread(np.unique(self.in_before[self._back(within)]), points)}
        return {(s, r) for s in ss for r in rs if r - s <= self.n + 1}

    def _out(self, within: bool) -> np.ndarray:
        """bool[gaps]: a D2H is charged (`within`: after a write of this iteration)."""
        return (self.d2h > 0) & ((self.out_after >= 0) if within else True)

    def _back(self, within: bool) -> np.ndarray:
        """bool[gaps]: an H2D is charged (`within`: back in this iteration)."""
        return (self.h2d > 0) & ((self.in_before < self.n) if within else True)

    def scan(self, pairs: set[tuple[int, int]], whole: bool = False) -> Start:
        """The best bound on the screening grid over `pairs`."""
        b1, b2 = (a.ravel() for a in np.meshgrid(SCREEN, SCREEN))
        best: Start = (-math.inf, 0, 0.0, 0.0, -1, self.n)
        for s, r in sorted(pairs):
            v = self.values(b1, b2, s, r, whole)
            row, i = np.unravel_index(int(np.argmax(v)), v.shape)
            if v[row, i] > best[0]:
                best = (float(v[row, i]), int(row), float(b1[i]), float(b2[i]), s, r)
        return best

    def refine(self, start: Start, whole: bool = False) -> tuple[Start, str]:
        """The largest bound met by coordinate ascent (golden sections on b1
        and b2 in turn) from `start` (its value with the same `whole`), the
        point where it is met, and a description of where that is."""
        value, row, x1, x2, s, r = start
        x = [x1, x2]
        for _ in range(REFINE_ROUNDS):
            for axis in (0, 1):

                def f(t: float, axis: int = axis) -> float:
                    y = list(x)
                    y[axis] = t
                    return float(self.values(*_one(y[0], y[1]), s, r, whole)[row, 0])

                t, v = _golden(f, 0.0, 1.0)
                if v > value:
                    x[axis], value = t, v
        where = f"{('start', 'end')[row]} of op {self.k}"
        if s >= 0:
            where += f", copies out after op {s}"
        elif s < -1:
            where += f", copies out after op {s + self.n} of the previous iteration"
        if r < self.n:
            where += f", back before op {r}"
        elif r > self.n:
            where += f", back before op {r - self.n} of the next iteration"
        return (value, row, x[0], x[1], s, r), where

    def values(
        self, b1: np.ndarray, b2: np.ndarray, s: int, r: int, whole: bool = False
    ) -> np.ndarray:
        """float64[2, len(b1)]: the bound at both instants for each (b1, b2);
        -n <= s < k < r <= s + n + 1 (NOTE [ Split across the boundary ]);
        with `whole`, gaps are taken whole (NOTE [ Whole buffers ])."""
        out = self.d2h * (self.out_after >= s)
        back = self.h2d * (self.in_before <= r)
        # a recompute of the previous period, for its next access past the
        # window's end s + n, runs in the first window
        w_rec = np.where(self.back > s + self.n, 1 - b1[:, None], 1 - b2[:, None])
        cost = np.minimum(b1[:, None] * out + b2[:, None] * back, _times(w_rec, self.rec))
        if whole:
            cover = whole_cover(cost, self.nbytes, self.need)
        else:
            cover = _min_cover(cost, self.nbytes, self.need)
        total = self.before[-1]
        rows = []
        for cut in (self._at(self.k), self._at(self.k + 1)):
            rows.append(total - b1 * (cut - self._at(s + 1)) - b2 * (self._at(r) - cut))
        return np.stack(rows) + cover

    def _at(self, pos: int) -> float:
        """Seconds of compute of the unrolled run before position `pos`, from
        this iteration's start (negative before it)."""
        n = self.n
        return float(self.before[pos % n] + self.before[-1] * (pos // n))


def _min_cover(cost: np.ndarray, nbytes: np.ndarray, need: float) -> np.ndarray:
    """float64[rows]: per row of `cost` (rows x gaps, seconds), the least cost
    of `need` bytes taken fractionally from the gaps (`nbytes` > 0), cheapest
    per byte first; inf where all of them are not enough."""
    rows = cost.shape[0]
    if need <= 0:
        return np.zeros(rows)
    if nbytes.sum() < need:
        return np.full(rows, np.inf)
    ratio = cost / nbytes
    order = np.argsort(ratio, axis=1, kind="stable")
    r_sorted = np.take_along_axis(ratio, order, axis=1)
    n_sorted = nbytes[order]
    cum_n = np.cumsum(n_sorted, axis=1)
    cum_c = np.cumsum(np.take_along_axis(cost, order, axis=1), axis=1)
    i = np.minimum((cum_n < need).sum(axis=1), cost.shape[1] - 1)
    r = np.arange(rows)
    prev_n = np.where(i > 0, cum_n[r, i - 1], 0.0)
    prev_c = np.where(i > 0, cum_c[r, i - 1], 0.0)
    return prev_c + (need - prev_n) * r_sorted[r, i]


# ---- multi-op --------------------------------------------------------------------------
def multi_op_bound(
    gaps: Gaps, d: np.ndarray, need: np.ndarray, lanes: int, *, sources: DeadSources | None = None
) -> NamedBound:
    """The multi-op bound of NOTE [ Window bounds ]: a golden-section search
    over b of (1 - b) D + the flow's cover cost. With `sources`, a gap's
    recompute is charged its dead sources at a kept op at or before the
    first it covers (NOTE [ Dead sources ])."""
    hot = np.flatnonzero(need > 0)
    rows = np.sort(_pick(hot, need, MAX_ROWS))
    first = np.searchsorted(rows, gaps.after + 1, side="left")
    last = np.searchsorted(rows, gaps.before, side="left") - 1
    g = np.flatnonzero((first <= last) & (gaps.nbytes > 0))
    width = last[g] - first[g]
    lane = gaps.d2h[g] * _one_per_group(gaps.epoch[g], width)
    lane += gaps.h2d[g] * _one_per_group(gaps.trip[g], width)
    lane = lane / 2 if lanes == 2 else lane
    rec = (
        gaps.rec[g]
        if sources is None
        else sources.gap_rec_from(gaps, g, rows[first[g]], CHECK_EVERY)
    )
    total = _compute_s(d)
    flow = _CoverFlow(need[rows], first[g], last[g], gaps.nbytes[g])

    def value(b: float) -> float:
        return (1 - b) * total + flow.cost(np.minimum(b * lane, _times(1 - b, rec)))

    _, best = _golden(value, 0.0, 1.0)
    return NamedBound(MULTI_OP, best, f"{len(rows)} of the {len(hot)} ops over the budget at once")


class _CoverFlow:
    """min sum cost_g x_g over 0 <= x_g <= nbytes_g with, for every row i,
    sum of x_g over the gaps covering rows first_g..last_g >= need_i: the
    min-cost flow of NOTE [ Window bounds ]."""

    def __init__(self, need: np.ndarray, first: np.ndarray, last: np.ndarray, nbytes: np.ndarray):
        k = len(need)
        rhs = np.concatenate([need, [0.0]]).astype(np.int64)
        self.supply = -(rhs - np.concatenate([[0], rhs[:-1]]))
        self.tails = np.concatenate([last + 1, np.arange(k)]).astype(np.int32)
        self.heads = np.concatenate([first, np.arange(1, k + 1)]).astype(np.int32)
        free = np.full(k, int(nbytes.sum()) + int(rhs.max()) + 1, np.int64)
        self.caps = np.concatenate([nbytes.astype(np.int64), free])
        self.nbytes = nbytes
        self.n_nodes = k + 1

    def cost(self, cost: np.ndarray) -> float:
        """Seconds: the cover's least cost at `cost` (seconds per gap)."""
        unit = np.minimum(np.floor(cost / self.nbytes * COST_SCALE), MAX_UNIT).astype(np.int64)
        units = np.concatenate([unit, np.zeros(len(self.caps) - len(unit), np.int64)])
        m = min_cost_flow.SimpleMinCostFlow()
        m.add_arcs_with_capacity_and_unit_cost(self.tails, self.heads, self.caps, units)
        m.set_nodes_supplies(np.arange(self.n_nodes, dtype=np.int32), self.supply)
        status = m.solve()
        if status == m.INFEASIBLE:
            return math.inf
        if status != m.OPTIMAL:  # a solver failure proves nothing: the cover adds nothing
            return 0.0
        return m.optimal_cost() / COST_SCALE


# ---- helpers ---------------------------------------------------------------------------
def _one_per_group(group: np.ndarray, width: np.ndarray) -> np.ndarray:
    """float64[gaps]: 1 for the gap of each group (an epoch, or a trip) that
    covers the most rows (the first of equals), 0 for the others: the share
    of the group's one copy each is charged (shares of at most 1 per group
    keep the bound)."""
    order = np.lexsort((np.arange(len(group)), -width, group))
    first = np.ones(len(group), bool)
    first[1:] = group[order][1:] != group[order][:-1]
    out = np.zeros(len(group))
    out[order[first]] = 1.0
    return out


def _pick(hot: np.ndarray, need: np.ndarray, most: int) -> np.ndarray:
    """At most `most` of the ops `hot`: all if few, else a quarter of the
    peaks of `need` that need the most, a quarter of those that stand out
    most from their neighbours (a temporary's spike), and a spread of the
    rest (any subset gives a bound)."""
    if len(hot) <= most:
        return hot
    padded = np.concatenate([[-np.inf], need, [-np.inf]])
    above = need[hot] - np.maximum(padded[hot], padded[hot + 2])
    peaks, above = hot[above >= 0], above[above >= 0]
    high = peaks[np.argsort(-need[peaks], kind="stable")[: most // 4]]
    spiky = peaks[np.argsort(-above, kind="stable")[: most // 4]]
    chosen = np.union1d(high, spiky)
    spread = hot[np.linspace(0, len(hot) - 1, most - len(chosen)).astype(np.int64)]
    return np.union1d(chosen, spread)


def _spread(values: np.ndarray, most: int) -> list[int]:
    """At most `most` of `values` (sorted), evenly spread, the last included."""
    if len(values) <= most:
        return values.tolist()
    return values[np.linspace(0, len(values) - 1, most).round().astype(np.int64)].tolist()


def _golden(f: Callable[[float], float], lo: float, hi: float) -> tuple[float, float]:
    """(x, f(x)) of the largest value met by a golden-section search for the
    maximum of `f` on [lo, hi] (ends included): exact for a concave `f` up
    to the last bracket, and a value met in any case."""
    phi = (math.sqrt(5) - 1) / 2
    best = max(((lo, f(lo)), (hi, f(hi))), key=lambda p: p[1])
    x1, x2 = hi - phi * (hi - lo), lo + phi * (hi - lo)
    f1, f2 = f(x1), f(x2)
    for _ in range(GOLDEN_STEPS):
        best = max(best, (x1, f1), (x2, f2), key=lambda p: p[1])
        if f1 >= f2:
            hi, x2, f2 = x2, x1, f1
            x1 = hi - phi * (hi - lo)
            f1 = f(x1)
        else:
            lo, x1, f1 = x1, x2, f2
            x2 = lo + phi * (hi - lo)
            f2 = f(x2)
    return max(best, (x1, f1), (x2, f2), key=lambda p: p[1])


def _one(b1: float, b2: float) -> tuple[np.ndarray, np.ndarray]:
    return np.array([b1]), np.array([b2])


def _useful(gaps: Gaps, g: np.ndarray) -> np.ndarray:
    """The gaps of `g` with bytes: an empty buffer covers nothing."""
    return g[gaps.nbytes[g] > 0]


def _times(w: np.ndarray | float, rec: np.ndarray) -> np.ndarray:
    """w * rec, with inf (no recompute) staying inf even where w is 0."""
    return np.where(np.isfinite(rec), w * np.where(np.isfinite(rec), rec, 0.0), np.inf)

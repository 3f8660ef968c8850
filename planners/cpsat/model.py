"""The CP-SAT model: variables, constraints and objective for one job (or
several in step, NOTE [ Several jobs ] in cpsat/data.py), and the read-out of
a solution.

Sections follow the OR-Tools examples: data (`CpsatData`), variables named by
their indices, constraints one commented block per family, objective. The
solve itself (parameters, status, callbacks) lives in `planners/cpsat/planner.py`.

# NOTE [ CP-SAT semantics ]
# The model costs a plan the way `sim` runs it (NOTE [ Event semantics ] in
# sim/model.py), for one job alone on the device, in steady state (for
# several, read "op k" as "position k" and see NOTE [ Several jobs ]):
# - Op k becomes ready at R_k = max(E_{k-1}, end of every swap-in due before
#   k) (E_{-1} = 0, the iteration start), runs the recomputations placed
#   before it, then itself: E_k = R_k + sum(recompute durations) + d_k. Ops
#   never idle: R_k is an equality, as in the simulator.
# - A swapped gap has an optional D2H interval starting at or after E_a and an
#   H2D interval starting at or after the D2H end and ending by R_c. Every
#   interval of a lane goes into one `add_no_overlap` (one lane shared by
#   both directions, or one per direction with lanes=2). The plan pins every
#   copy to its model start with (trigger op, delay), so the simulator finds
#   the lane free exactly when the model does.
# - Memory is checked per op window [E_{k-1}, E_k], closed at both ends: a
#   buffer in a gap counts as absent at op k only if its D2H copy ended at
#   least `margin` ticks before E_{k-1} and its H2D copy starts at least
#   `margin` ticks after E_k. The simulator processes events of equal time in
#   scheduling order, so a free and an allocation at the same instant may
#   come either way; the margin (1 ns) makes every such tie harmless.
#   Frees in the job's own process (framework frees, Release after op a) are
#   done before op a+1 allocates, so a release counts from window a+1.
# - Absence is decided per segment of a gap's hot ops (one hot op each in the
#   exact model; longer runs when coarsened for large traces): absent over a
#   segment requires the copy-out done before its first op's window and the
#   copy-in started after its last. A swap must be absent over at least one
#   segment: then an op ends between the copy-out and the copy-in, which is
#   where the plan triggers the swap-in (a swap-in triggered while the
#   swap-out is still running would cancel it in the simulator).
# - A gap whose earlier gap of the same write epoch was swapped needs no D2H:
#   the host copy is still valid; the plan releases it after a instead (a
#   synchronous free) and swaps it back in from that copy.
#
# NOTE [ Recompute ]
# A WITHIN gap of buffer b may instead release b after its access a and
# re-run b's producer p just before the access c (on demand, as Capuchin).
# Allowed when p writes only b (no temporaries), does not read b, consumes no
# RNG, b is not rewritten between p and c, and every buffer p reads is
# resident at c: accessed by c, or in a gap at c that is kept (not swapped,
# not recomputed), and not overwritten since p. Chains of recomputation are
# not modelled. The recompute runs on the compute stream inside op c's
# window, its time added to E_c.
#
# NOTE [ Iteration zero ]
# The simulator starts iteration 0 with every persistent buffer resident and
# reports the steady state (the mean of iterations 1..). A cross-iteration
# swap-in that iteration 0 skips must not change its timing, so the model
# forbids cross-iteration swap-ins from stalling (they end by the ready time
# of their op without extending it), and it counts the buffer present at the
# ops before its first access (it is, in iteration 0; the budget must hold
# there too). Cross-iteration gaps therefore save memory only after the
# buffer's last access in the iteration, and a host copy is never assumed
# to survive the iteration boundary. With these rules every iteration has
# the model's timing and stays under the budget.
#
# NOTE [ Two lanes ]
# With lanes=2 each direction has its own lane; an H2D copy is costed at the
# duplex rate (`h2d_duplex_factor`), the slowest the simulator can run it.
# When the factor is below 1 the simulator may finish an H2D copy sooner
# than the model; the plan stays valid in memory but may run a little
# faster than the objective says.
"""

from __future__ import annotations

import enum
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from memplan.planners.cpsat.cuts import add_lane_windows
from memplan.planners.cpsat.data import CpsatData, Gap, GapKind, gcd_bytes, horizon
from memplan.planners.cpsat.solution import KEEP, RECOMPUTE, SWAP, Solution
from ortools.sat.python import cp_model

DIRECT_TERMS_MAX = 200_000  # memory rows as direct sums up to this many terms, else a chain


class Objective(enum.Enum):
    TIME = "time"  # minimise the iteration time under the budget
    PEAK = "peak"  # minimise the peak bytes under an iteration-time cap


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What to build. `budget` caps memory (both objectives); `time_cap` caps
    the iteration (peak mode). `block` hot ops per absence segment. Gaps not
    in `free` (None = all free) are fixed to `incumbent`'s decisions."""

    objective: Objective
    budget: int
    time_cap: int | None = None
    peak_floor: int = 0
    block: int = 1
    free: frozenset[int] | None = None
    incumbent: Solution | None = None
    fine: tuple[int, int] | None = None  # hot positions with one-op segments whatever `block`
    soft: bool = False  # memory may exceed the cap, minimised first (NOTE [ Soft budget ])
    time_floor: int = 0  # a lower bound on the iteration (ticks) valid for every plan


@dataclass(eq=False)
class BuiltModel:
    """The CP-SAT model and handles to its variables."""

    model: cp_model.CpModel
    spec: ModelSpec
    data: CpsatData
    end: list[cp_model.IntVar]
    ready: list[cp_model.LinearExprT]
    swap: dict[int, cp_model.IntVar] = field(default_factory=dict)
    rec: dict[int, cp_model.IntVar] = field(default_factory=dict)
    copy: dict[int, cp_model.LinearExprT] = field(default_factory=dict)
    out_start: dict[int, cp_model.IntVar] = field(default_factory=dict)
    in_start: dict[int, cp_model.IntVar] = field(default_factory=dict)
    in_end: dict[int, cp_model.IntVar] = field(default_factory=dict)  # 0 unless swapped
    in_wrapped: dict[int, cp_model.IntVar] = field(default_factory=dict)  # in_start - T
    segments: dict[int, list[tuple[int, int, cp_model.IntVar]]] = field(default_factory=dict)
    peak: cp_model.IntVar | None = None
    excess: cp_model.IntVar | None = None
    row_excess: list[cp_model.IntVar] = field(default_factory=list)
    excess_weight: int = 0
    excess_step: int = 1  # units per step of excess
    chain: list[cp_model.IntVar] = field(default_factory=list)  # absent units per hot op
    items: list[tuple[int, int, int, int, bool]] = field(default_factory=list)  # h0,h1,w,gap,rec
    objective_unit: int = 1  # bytes per objective unit in peak mode
    n_terms: int = 0

    def is_free(self, g: int) -> bool:
        return self.spec.free is None or g in self.spec.free


def segments_of(
    gap: Gap,
    block: int,
    fine: tuple[int, int] | None = None,
    cut: tuple[int, int] = (-1, -1),
) -> list[tuple[int, int]]:
    """(first, last) hot positions of each absence segment of `gap`: runs of
    its hot positions within one block of `block` consecutive hot ops, one
    op each inside `fine`, never straddling the ends of `cut` (an incumbent's
    absence span, which must stay a union of segments)."""
    out: list[tuple[int, int]] = []
    f0, f1 = fine if fine is not None else (0, -1)

    def key(h: int) -> tuple[int, int, bool]:
        inside = cut[0] <= h <= cut[1]
        return (1, h, inside) if f0 <= h <= f1 else (0, h // block, inside)

    for h in gap.hot_idx:
        if out and key(h) == key(out[-1][0]):
            out[-1] = (out[-1][0], h)
        else:
            out.append((h, h))
    return out


def _holds_own_end(data: CpsatData, g: Gap, lo: int, hi: int) -> bool:
    """An op of `g`'s job ends between the window before position `lo` and
    that of `hi`: a hole over lo..hi leaves room for the job's SwapIn trigger."""
    return data.n_jobs == 1 or bool((data.order.job[lo - 1 : hi + 1] == g.job).any())


# NOTE [ FIFO order ]
# With several jobs the simulator grants the compute in the order the ops ask
# for it. Op p asks at Q_p = max(end of its job's previous op, the swap-ins
# due at p) (the iteration start for an op 0, which no swap-in delays). The
# model runs the ops in the order of its positions, so it requires
# Q_p + margin <= Q_{p+1} wherever a swap-in makes Q_p later than an op end:
# ties between the end of a copy and the end of an op may come either way
# in the simulator (NOTE [ CP-SAT semantics ]); between op ends alone the
# order is that of the compute, already the model's. Across the end of the
# frame, position 0 of the next period asks when its job's last op ended.
def _fifo_order(
    model: cp_model.CpModel,
    data: CpsatData,
    end: list[cp_model.IntVar],
    due: dict[int, list[cp_model.IntVar]],
    H: int,
) -> None:
    n, m = data.n_ops, data.margin

    def request(p: int) -> cp_model.LinearExprT:
        q = data.own_prev(p)
        base: cp_model.LinearExprT = end[q] if q >= 0 else 0
        if not due[p]:
            return base
        r = model.new_int_var(0, H, f"request_k{p}")
        model.add_max_equality(r, [base, *due[p]])
        return r

    for p in range(n):
        if not due[p]:
            continue
        if p + 1 < n:
            nxt = request(p + 1)
        else:  # the next period's position 0: when its job's last op here ends
            nxt = end[int(data.order.pos[int(data.order.job[0])][-1])]
        for w in due[p]:
            model.add(w + m <= nxt)


def build(data: CpsatData, spec: ModelSpec) -> BuiltModel:
    """The model for `data` under `spec` (see the module NOTEs)."""
    # ---- data ------------------------------------------------------------------------
    n, dur, hot, m = data.n_ops, data.dur.tolist(), data.hot.tolist(), data.margin
    nbytes, out_t, in_t = data.nbytes.tolist(), data.out_ticks.tolist(), data.in_ticks.tolist()
    H = spec.time_cap if spec.time_cap is not None else horizon(data)
    inc = spec.incumbent
    model = cp_model.CpModel()
    free = [spec.free is None or g.id in spec.free for g in data.gaps]
    if inc is None and not all(free):
        raise ValueError("fixed gaps need an incumbent solution")

    # ---- variables: op times ------------------------------------------------------------
    prefix = np.cumsum(data.dur).tolist()
    after = (prefix[-1] - np.asarray(prefix)).tolist()  # op time still to come after op k
    end = [
        model.new_int_var(prefix[k], max(H - after[k], prefix[k]), f"end_k{k}") for k in range(n)
    ]
    T = end[-1]
    if spec.time_floor > prefix[-1]:  # the analytic bound: lets the search stop at it
        model.add(end[-1] >= spec.time_floor)

    # where each job's iteration starts, in the frame (NOTE [ Several jobs ]): when
    # its last op of the previous period ended; 0 for the job that ends the frame
    job_start: list[cp_model.LinearExprT] = [
        0 if int(p[-1]) == n - 1 else end[int(p[-1])] - T for p in data.order.pos
    ]

    # ---- variables: one decision per gap --------------------------------------------------
    bm = BuiltModel(model, spec, data, end, [])
    lane_d2h: list[cp_model.IntervalVar] = []
    lane_h2d: list[cp_model.IntervalVar] = []
    lane_load_d2h: list[cp_model.LinearExprT] = []
    lane_load_h2d: list[cp_model.LinearExprT] = []
    for g in data.gaps:
        b = g.buffer
        if free[g.id]:
            bm.swap[g.id] = model.new_bool_var(f"swap_g{g.id}")
            if g.recomputable:
                bm.rec[g.id] = model.new_bool_var(f"rec_g{g.id}")
        else:
            assert inc is not None
            mode = inc.mode[g.id]
            bm.swap[g.id] = model.new_constant(int(mode == SWAP))
            if g.recomputable:
                bm.rec[g.id] = model.new_constant(int(mode == RECOMPUTE))
        top = 2 * H if g.kind is GapKind.CROSS else H
        bm.out_start[g.id] = model.new_int_var(0, H, f"out_start_g{g.id}")
        bm.in_start[g.id] = model.new_int_var(0, top, f"in_start_g{g.id}")

    # ---- constraints: modes and host copies -------------------------------------------------
    for g in data.gaps:
        s = bm.swap[g.id]
        if g.id in bm.rec:
            model.add(s + bm.rec[g.id] <= 1)
        if not g.epoch_prev:
            bm.copy[g.id] = s
        elif free[g.id] or any(free[j] for j in g.epoch_prev):
            # a D2H copy unless an earlier gap of the same write epoch was swapped
            cp = model.new_bool_var(f"copy_g{g.id}")
            model.add_implication(cp, s)
            model.add(cp >= s - sum(bm.swap[j] for j in g.epoch_prev))
            bm.copy[g.id] = cp
        else:
            assert inc is not None
            bm.copy[g.id] = model.new_constant(int(inc.copy[g.id]))

    # ---- constraints: recompute sources stay resident -------------------------------------------
    for g in data.gaps:
        if g.id not in bm.rec:
            continue
        r = bm.rec[g.id]
        for j in g.keep_for_recompute:
            if free[j]:
                model.add(r + bm.swap[j] + bm.rec.get(j, 0) <= 1)
            elif inc is not None and inc.mode[j] != KEEP:
                model.add(r == 0)

    # ---- constraints: transfers ---------------------------------------------------------------
    due: dict[int, list[cp_model.IntVar]] = defaultdict(list)  # op -> in-ends gating it
    shifted: list[tuple[cp_model.IntervalVar, str]] = []
    for g in data.gaps:
        b, s, cp = g.buffer, bm.swap[g.id], bm.copy[g.id]
        os_, is_ = bm.out_start[g.id], bm.in_start[g.id]
        e_a = end[g.a] if g.a >= 0 else 0
        out_iv = model.new_optional_fixed_size_interval_var(os_, out_t[b], cp, f"out_g{g.id}")
        in_iv = model.new_optional_fixed_size_interval_var(is_, in_t[b], s, f"in_g{g.id}")
        lane_d2h.append(out_iv)
        lane_h2d.append(in_iv)
        lane_load_d2h.append(out_t[b] * cp)
        lane_load_h2d.append(in_t[b] * s)
        model.add(os_ >= e_a).only_enforce_if(cp)  # the copy-out follows the access
        model.add(is_ >= os_ + out_t[b]).only_enforce_if(cp)  # in after out
        model.add(is_ >= e_a).only_enforce_if(s)  # (a released gap: in after the release)
        if g.kind is GapKind.CROSS:
            # serves the next iteration without ever stalling it (NOTE [ Iteration zero ]):
            # done when the job's previous op there ends, or its iteration starts
            q = data.own_prev(g.c)
            e_prev = end[q] if q >= 0 else job_start[g.job]
            model.add(is_ + in_t[b] <= T + e_prev).only_enforce_if(s)
            sh = model.new_int_var(-H, 2 * H, f"in_start_wrapped_g{g.id}")
            model.add(sh == is_ - T)
            bm.in_wrapped[g.id] = sh
            shifted.append(
                (
                    model.new_optional_fixed_size_interval_var(
                        sh, in_t[b], s, f"in_wrapped_g{g.id}"
                    ),
                    "h2d",
                )
            )
        else:
            w = model.new_int_var(0, H, f"in_end_g{g.id}")
            model.add(w == is_ + in_t[b]).only_enforce_if(s)
            model.add(w == 0).only_enforce_if(~s)
            bm.in_end[g.id] = w
            due[g.c].append(w)

    # ---- constraints: op chain (fixed order, no idling) -------------------------------------------
    rec_at: dict[int, list[tuple[int, cp_model.IntVar]]] = defaultdict(list)
    for g in data.gaps:
        if g.id in bm.rec:
            rec_at[g.c].append((dur[g.recompute_op], bm.rec[g.id]))
    for k in range(n):
        prev: cp_model.LinearExprT = end[k - 1] if k else 0
        if due[k]:
            r = model.new_int_var(0, H, f"ready_k{k}")
            model.add_max_equality(r, [prev, *due[k]])
        else:
            r = prev
        bm.ready.append(r)
        model.add(end[k] == r + dur[k] + sum(d * x for d, x in rec_at[k]))
    if data.n_jobs > 1:
        _fifo_order(model, data, end, due, H)

    # ---- constraints: the lane(s) ------------------------------------------------------------
    for iv, direction in shifted:
        (lane_h2d if direction == "h2d" else lane_d2h).append(iv)
    if data.lanes == 1:
        model.add_no_overlap(lane_d2h + lane_h2d)
        model.add(sum(lane_load_d2h) + sum(lane_load_h2d) <= T)  # redundant: one period
    else:
        model.add_no_overlap(lane_d2h)
        model.add_no_overlap(lane_h2d)
        model.add(sum(lane_load_d2h) <= T)
        model.add(sum(lane_load_h2d) <= T)

    # ---- constraints: absence, segment by segment ---------------------------------------------
    for g in data.gaps:
        s, cp = bm.swap[g.id], bm.copy[g.id]
        os_, is_, ot = bm.out_start[g.id], bm.in_start[g.id], out_t[g.buffer]
        segs = []
        if free[g.id]:
            cut = inc.absent[g.id] if inc is not None else (-1, -1)
            for h0, h1 in segments_of(g, spec.block, spec.fine, cut):
                z = model.new_bool_var(f"absent_g{g.id}_h{h0}")
                lo, hi = hot[h0], hot[h1]
                model.add_implication(z, s)
                model.add(os_ + ot + m <= end[lo - 1]).only_enforce_if([z, cp])
                model.add(is_ >= end[hi] + m).only_enforce_if(z)
                segs.append((h0, h1, z))
            # a hole that holds the end of one of the job's own ops (NOTE [ Several jobs ])
            model.add_bool_or(
                [z for h0, h1, z in segs if _holds_own_end(data, g, hot[h0], hot[h1])]
            ).only_enforce_if(s)
        else:
            assert inc is not None
            u, v = inc.absent[g.id]
            if inc.mode[g.id] == SWAP:
                model.add(os_ + ot + m <= end[hot[u] - 1]).only_enforce_if(cp)
                model.add(is_ >= end[hot[v]] + m)
        bm.segments[g.id] = segs

    # ---- constraints: the lane around each hot op (redundant) -------------------------------
    add_lane_windows(model, data, bm, free)  # NOTE [ Lane windows ] in cpsat/cuts.py

    # ---- constraints: memory at every hot op ----------------------------------------------------
    unit = gcd_bytes(data, spec.objective is Objective.PEAK)
    fixed_absent = np.zeros(len(hot), np.int64)
    items: list[tuple[int, int, int, cp_model.LinearExprT]] = []  # (h0, h1, weight, literal)
    for g in data.gaps:
        w = nbytes[g.buffer] // unit
        h_first, h_last = g.hot_idx[0], g.hot_idx[-1]
        if free[g.id]:
            items.extend((h0, h1, w, z) for h0, h1, z in bm.segments[g.id])
            bm.items.extend((h0, h1, w, g.id, False) for h0, h1, _ in bm.segments[g.id])
            if g.id in bm.rec:
                items.append((h_first, h_last, w, bm.rec[g.id]))
                bm.items.append((h_first, h_last, w, g.id, True))
        else:
            assert inc is not None
            if inc.mode[g.id] == SWAP:
                u, v = inc.absent[g.id]
                fixed_absent[u : v + 1] += w
            elif inc.mode[g.id] == RECOMPUTE:
                fixed_absent[h_first : h_last + 1] += w
    mem0 = data.mem0[data.hot].tolist()
    if spec.objective is Objective.PEAK:
        lo_p = -(-max(spec.peak_floor, 0) // unit)
        hi_p = spec.budget // unit
        bm.peak = model.new_int_var(min(lo_p, hi_p), hi_p, "peak_units")
        # unit * (peak + absent) >= mem0  <=>  peak + absent >= ceil(mem0 / unit)
        need = [-(-x // unit) - int(f) for x, f in zip(mem0, fixed_absent, strict=True)]
        slack: cp_model.LinearExprT = bm.peak
    else:
        need = [
            -(-(x - spec.budget) // unit) - int(f) for x, f in zip(mem0, fixed_absent, strict=True)
        ]
        slack = 0
    if spec.soft:  # per-row excess, summed: every row that improves counts
        # in steps of `k` units (about a MiB) so that weight * excess fits in int64
        k = max(1, -(-(1 << 20) // unit))
        top = sum(-(-max(x, 0) // k) for x in need)
        k *= max(1, -(-(top * (H + 1)) // (1 << 60)))
        over = [
            model.new_int_var(0, -(-max(x, 0) // k), f"excess_h{h}") for h, x in enumerate(need)
        ]
        bm.row_excess, bm.excess_step = over, k
        bm.excess = model.new_int_var(0, sum(-(-max(x, 0) // k) for x in need), "excess_steps")
        model.add(bm.excess == sum(over))
        need_expr: list[cp_model.LinearExprT] = [x - k * o for x, o in zip(need, over, strict=True)]
    else:
        need_expr = list(need)
    bm.n_terms = sum(h1 - h0 + 1 for h0, h1, _, _ in items)
    if bm.n_terms <= DIRECT_TERMS_MAX:
        rows: list[list[tuple[int, cp_model.LinearExprT]]] = [[] for _ in hot]
        for h0, h1, w, lit in items:
            for h in range(h0, h1 + 1):
                rows[h].append((w, lit))
        for h, row in enumerate(rows):
            model.add(slack + sum(w * x for w, x in row) >= need_expr[h])
    else:  # a running sum over hot positions: each item enters and leaves once
        starts: list[list[tuple[int, cp_model.LinearExprT]]] = [[] for _ in range(len(hot) + 1)]
        stops: list[list[tuple[int, cp_model.LinearExprT]]] = [[] for _ in range(len(hot) + 1)]
        for h0, h1, w, lit in items:
            starts[h0].append((w, lit))
            stops[h1 + 1].append((w, lit))
        total = sum(w for _, _, w, _ in items)
        covered: cp_model.LinearExprT = 0
        for h in range(len(hot)):
            y = model.new_int_var(0, total, f"absent_units_h{h}")
            model.add(
                y == covered + sum(w * x for w, x in starts[h]) - sum(w * x for w, x in stops[h])
            )
            covered = y
            bm.chain.append(y)
            model.add(slack + y >= need_expr[h])
    bm.objective_unit = unit

    # ---- objective ------------------------------------------------------------------------------
    if bm.excess is not None:  # lexicographic: any excess outweighs the whole horizon
        main = bm.peak if bm.peak is not None else T
        weight = (spec.budget // unit + 1) if bm.peak is not None else H + 1
        bm.excess_weight = weight
        model.minimize(weight * bm.excess + main)
    elif spec.objective is Objective.PEAK:
        assert bm.peak is not None
        model.minimize(bm.peak)
    else:
        model.minimize(T)
    return bm

"""The CP-SAT model: variables, constraints and objective for one job (or
several in step, NOTE [ Several jobs ] in cpsat/data.py).

`build` follows the sections of the OR-Tools examples, one function each:
data (`CpsatData`, `ModelSpec`), variables named by their indices (op times,
one decision per gap), constraints one function per family (modes and host
copies, recompute sources, transfers, the op chain, FIFO order, the lanes,
absence and memory in `cpsat/memory.py`, redundant cuts in `cpsat/cuts.py`),
objective. Parameters, solve, status check and read-out are
`cpsat/solve.py`'s.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
from memplan.hwmodels.device import Direction
from memplan.planners.cpsat.cuts import add_lane_windows
from memplan.planners.cpsat.data import CpsatData, GapKind, horizon
from memplan.planners.cpsat.memory import add_absence, add_memory
from memplan.planners.cpsat.spec import RECOMPUTE, SWAP, BuiltModel, ModelSpec, Objective
from ortools.sat.python import cp_model

# NOTE [ CP-SAT semantics ]
# The model costs a plan the way `sim` runs it (NOTE [ Event semantics ] in sim/model.py),
# for one job alone, in steady state (several: NOTE [ Several jobs ]):
# - Op k is ready at R_k = max(E_{k-1}, the swap-ins due before k, the copy-outs it waits
#   for) (E_{-1} = 0), runs its recomputations, then itself: E_k = R_k + recompute + d_k.
#   R_k is an equality: ops never idle.
# - A swapped gap has an optional D2H interval from E_a and an H2D interval after it, ending
#   by R_c; each lane's intervals go into one `add_no_overlap`. The plan pins every copy to
#   its model start (trigger op, delay), so the simulator finds the lane free when the model does.
# - Memory per op window [E_{k-1}, E_k], closed: a gap's buffer is absent at k only if its
#   D2H ended `margin` (1 ns, against ties) before E_{k-1} and its H2D starts `margin` after
#   E_k. Own-process frees after op a count from window a+1.
# - Absence is per segment of hot ops; a swap is absent over at least one, so an op ends
#   between its copies to trigger the swap-in. A gap whose same-epoch earlier gap was swapped
#   reuses the host copy (Release, no D2H). Full text: docs/notes.md, "CP-SAT semantics".
#
# NOTE [ Recompute ]
# A WITHIN gap of buffer b may instead release b after its access a and
# re-run b's producer p before an op r of the gap: at the access c (on
# demand, as Capuchin) or earlier, pulled by a recomputation that reads b
# (NOTE [ Recompute chains ] in cpsat/chains.py). Allowed when p reads none
# of what it writes, writes no persistent buffer, consumes no RNG, b is not
# rewritten between p and c, and every buffer p reads is alive and not
# overwritten since p then, and resident: accessed there, or in a gap there
# that is kept or recomputed no later. The recompute runs on the compute
# stream inside r's window, its time added to r's end. p's other outputs
# (layer norm's mean and rstd) are made again as temporaries and freed when
# it ends, before r makes its own outputs: r's window counts them on top of
# its row (`cpsat/memory.py`; an overcount where one is resident anyway,
# and r's outputs are not made yet), also at an op that is not hot.
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
# NOTE [ State at the iteration start ]
# A persistent buffer first accessed at op f > 1 has a HEAD gap, as an input has: swapped,
# it is copied out after the iteration starts and back before f, every iteration (an
# optimizer state first used after the peak: NOTE [ Offload at the iteration start ] in
# planners/search/offload.py). It starts resident in iteration 0 as in every other, so
# its timing and memory are those of every iteration; op 0 sees it absent only by waiting
# for its copy-out (NOTE [ Swap-out deadlines in the model ]). The buffer's CROSS gap may
# not be swapped too: the copy-out at the iteration start would find it off the device.
#
# NOTE [ Two lanes ]
# With two lanes (`DeviceModel.lanes == 2`) each direction has its own lane;
# an H2D copy is costed at the duplex rate (`copy_time(..., duplex=True)`,
# `h2d_duplex_factor`), the slowest the simulator can run it.
# When the factor is below 1 the simulator may finish an H2D copy sooner
# than the model; the plan stays valid in memory but may run a little
# faster than the objective says.


__all__ = ["BuiltModel", "ModelSpec", "Objective", "build"]

# Per lane direction: the copy intervals (for `add_no_overlap`) and their loads.
_Lanes = defaultdict[Direction, list[cp_model.IntervalVar]]
_Loads = defaultdict[Direction, list[cp_model.LinearExprT]]
# op -> the ends of the swap-ins it waits for
_Due = defaultdict[int, list[cp_model.IntVar]]


def build(data: CpsatData, spec: ModelSpec) -> BuiltModel:
    """The model for `data` under `spec` (see the module NOTEs)."""
    # ---- data
    H = spec.time_cap if spec.time_cap is not None else horizon(data)
    free = [spec.free is None or g.id in spec.free for g in data.gaps]
    if spec.incumbent is None and not all(free):
        raise ValueError("fixed gaps need an incumbent solution")
    # ---- variables
    bm = _op_times(cp_model.CpModel(), data, spec, H)
    _gap_decisions(bm, free)
    # ---- constraints, one family each
    _modes_and_host_copies(bm, free)
    _recompute_sources(bm, free)
    lanes, loads, due = _transfers(bm)
    _swap_out_deadlines(bm, free, due)
    _op_chain(bm, due)
    if data.n_jobs > 1:
        _fifo_order(bm, due)
    _lane_capacity(bm, lanes, loads)
    add_absence(bm, free)
    add_lane_windows(bm.model, data, bm, free)  # NOTE [ Lane windows ] in cpsat/cuts.py
    add_memory(bm, free)
    # ---- objective
    _objective(bm)
    return bm


# ---- variables ----------------------------------------------------------------------
def _op_times(model: cp_model.CpModel, data: CpsatData, spec: ModelSpec, H: int) -> BuiltModel:
    """`end_k{k}` per op, within what the ops before and after it leave of the
    horizon; the iteration at least the analytic bound."""
    n = data.n_ops
    prefix = np.cumsum(data.dur).tolist()
    after = (prefix[-1] - np.asarray(prefix)).tolist()  # op time still to come after op k
    end = [
        model.new_int_var(prefix[k], max(H - after[k], prefix[k]), f"end_k{k}") for k in range(n)
    ]
    if spec.time_floor > prefix[-1]:  # the analytic bound: lets the search stop at it
        model.add(end[-1] >= spec.time_floor)
    return BuiltModel(model, spec, data, H, end)


def _gap_decisions(bm: BuiltModel, free: list[bool]) -> None:
    """Per gap `swap_g{g}` (and, where it may be recomputed, `rec_g{g}` and one
    `rec_g{g}_k{r}` per recompute point r), or constants for a fixed gap; the
    start of its copy out and in."""
    model, H = bm.model, bm.horizon
    for g in bm.data.gaps:
        if free[g.id]:
            bm.swap[g.id] = model.new_bool_var(f"swap_g{g.id}")
            if g.recomputable:
                r = bm.rec[g.id] = model.new_bool_var(f"rec_g{g.id}")
                if len(g.rec_points) == 1:
                    bm.rec_at[g.id] = [r]
                else:
                    at = [model.new_bool_var(f"rec_g{g.id}_k{p.op}") for p in g.rec_points]
                    model.add(r == sum(at))
                    bm.rec_at[g.id] = at
        else:
            inc = bm.fixed()
            mode = inc.mode[g.id]
            bm.swap[g.id] = model.new_constant(int(mode == SWAP))
            if g.recomputable:
                bm.rec[g.id] = model.new_constant(int(mode == RECOMPUTE))
                bm.rec_at[g.id] = [
                    model.new_constant(int(mode == RECOMPUTE and inc.rec_at[g.id] == p.op))
                    for p in g.rec_points
                ]
        top = 2 * H if g.kind is GapKind.CROSS else H
        bm.out_start[g.id] = model.new_int_var(0, H, f"out_start_g{g.id}")
        bm.in_start[g.id] = model.new_int_var(0, top, f"in_start_g{g.id}")


# ---- constraints: modes and host copies ------------------------------------------------
def _modes_and_host_copies(bm: BuiltModel, free: list[bool]) -> None:
    """At most one mode per gap; `copy_g{g}`: a swap makes a D2H copy unless an
    earlier gap of the same write epoch was swapped (its host copy is valid)."""
    model = bm.model
    heads = {g.buffer: g.id for g in bm.data.gaps if g.kind is GapKind.HEAD}
    for g in bm.data.gaps:
        s = bm.swap[g.id]
        if g.id in bm.rec:
            model.add(s + bm.rec[g.id] <= 1)
        if g.kind is GapKind.CROSS and g.buffer in heads:  # NOTE [ State at the iteration start ]
            model.add(s + bm.swap[heads[g.buffer]] <= 1)
        if not g.epoch_prev:
            bm.copy[g.id] = s
        elif free[g.id] or any(free[j] for j in g.epoch_prev):
            cp = model.new_bool_var(f"copy_g{g.id}")
            model.add_implication(cp, s)
            model.add(cp >= s - sum(bm.swap[j] for j in g.epoch_prev))
            bm.copy[g.id] = cp
        else:
            bm.copy[g.id] = model.new_constant(int(bm.fixed().copy[g.id]))


# ---- constraints: recompute sources are resident ------------------------------------------
def _recompute_sources(bm: BuiltModel, free: list[bool]) -> None:
    """A gap recomputed before op r needs every source gap there kept or
    recomputed no later than r; before an op other than its own access, a
    recomputation at r that reads it (NOTE [ Recompute ])."""
    model, gaps = bm.model, bm.data.gaps
    for g in gaps:
        if not g.recomputable:
            continue
        for x, pt in zip(bm.rec_at[g.id], g.rec_points, strict=True):
            if not free[g.id] and bm.fixed().rec_at[g.id] != pt.op:
                continue  # fixed elsewhere (or kept): nothing to require
            for sid in pt.sources:
                s = gaps[sid]
                later = [y for y, q in zip(bm.rec_at.get(sid, ()), s.rec_points) if q.op > pt.op]
                model.add(x + bm.swap[sid] + sum(later) <= 1)
            if pt.pullers:
                model.add(x <= sum(bm.rec_at[h][gaps[h].point_index(pt.op)] for h in pt.pullers))


# ---- constraints: transfers ----------------------------------------------------------------
def _transfers(bm: BuiltModel) -> tuple[_Lanes, _Loads, _Due]:
    """Per gap an optional D2H interval `out_g{g}` after its access and an H2D
    interval `in_g{g}` after that; a cross-iteration copy-in also as
    `in_wrapped_g{g}` in the next period, never stalling it (NOTE [ Iteration
    zero ]). Returns the intervals and loads per lane direction, and per op the
    swap-in ends it waits for."""
    model, data, H, end, T = bm.model, bm.data, bm.horizon, bm.end, bm.T
    n = data.n_ops
    out_t, in_t = data.out_ticks.tolist(), data.in_ticks.tolist()
    # where each job's iteration starts, in the frame (NOTE [ Several jobs ]): when
    # its last op of the previous period ended; 0 for the job that ends the frame
    job_start: list[cp_model.LinearExprT] = [
        0 if int(p[-1]) == n - 1 else end[int(p[-1])] - T for p in data.order.pos
    ]
    lanes: _Lanes = defaultdict(list)
    loads: _Loads = defaultdict(list)
    due: _Due = defaultdict(list)
    wrapped: list[cp_model.IntervalVar] = []
    for g in data.gaps:
        b, s, cp = g.buffer, bm.swap[g.id], bm.copy[g.id]
        os_, is_ = bm.out_start[g.id], bm.in_start[g.id]
        e_a = end[g.a] if g.a >= 0 else 0
        out_iv = model.new_optional_fixed_size_interval_var(os_, out_t[b], cp, f"out_g{g.id}")
        in_iv = model.new_optional_fixed_size_interval_var(is_, in_t[b], s, f"in_g{g.id}")
        lanes[Direction.D2H].append(out_iv)
        lanes[Direction.H2D].append(in_iv)
        loads[Direction.D2H].append(out_t[b] * cp)
        loads[Direction.H2D].append(in_t[b] * s)
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
            name = f"in_wrapped_g{g.id}"
            wrapped.append(model.new_optional_fixed_size_interval_var(sh, in_t[b], s, name))
        else:
            w = model.new_int_var(0, H, f"in_end_g{g.id}")
            model.add(w == is_ + in_t[b]).only_enforce_if(s)
            model.add(w == 0).only_enforce_if(~s)
            bm.in_end[g.id] = w
            due[g.c].append(w)
    lanes[Direction.H2D].extend(wrapped)
    return lanes, loads, due


# ---- constraints: swap-out deadlines -----------------------------------------------------------
# NOTE [ Swap-out deadlines in the model ]
# A swap whose copy-out cannot end before the memory is needed may still
# pay if the op that needs it waits: the plan's `SwapOut.before_op` (planners
# NOTE [ Swap-out deadlines ]), which the heuristics set on most swaps. In
# the model (one job) a swapped gap may `wait`: its first hot op h waits
# for its copy-out, R_h = max(E_{h-1}, swap-ins due, copy-out ends waited
# for) -- no margin: the op resumes when the copy's end has freed the bytes
# -- and the gap counts absent from h on (its first segment) with the
# copy-out ended by R_h instead of `margin` before E_{h-1}. While h waits,
# the buffer is still resident but h's outputs are not yet made: the wait
# row of h asks mem0[h] - (bytes op h creates) - (absent at h) + (bytes of
# the gaps waited for at h) to be within the budget (`cpsat/memory.py`),
# which covers the simulator's memory from the end of op h-1 to the start
# of op h. A copy-out that makes no copy (a valid host copy) never waits,
# nor one of a persistent buffer: the model never counts on a host copy
# across iterations (NOTE [ Iteration zero ]), but the simulator keeps it
# when nothing wrote the buffer, and its copy-out then ends at once. But a
# HEAD gap's (NOTE [ State at the iteration start ]) may wait when the
# iteration writes the buffer and no gap after its last write is swapped:
# then no host copy outlives the iteration. Several jobs never wait (NOTE [ Several jobs ] in cpsat/data.py: the
# waiting op would let another job's op run first).
def _heads_that_copy(data: CpsatData) -> dict[int, list[int]]:
    """Per HEAD gap of a persistent buffer the iteration writes (one job),
    the buffer's other gaps from its last write on: while none of them is
    swapped, its copy-out at the iteration start copies (NOTE [ Swap-out
    deadlines in the model ])."""
    trace = data.trace
    by_buffer: dict[int, list[int]] = defaultdict(list)
    for g in data.gaps:
        by_buffer[g.buffer].append(g.id)
    out: dict[int, list[int]] = {}
    for g in data.gaps:
        b = g.buffer
        if g.kind is not GapKind.HEAD or not trace.persistent[b]:
            continue
        writes = [k for k in trace.accesses_of(b).tolist() if b in trace.op_writes(k)]
        if writes:
            last = max(writes)
            out[g.id] = [x for x in by_buffer[b] if x != g.id and data.gaps[x].a >= last]
    return out


def _swap_out_deadlines(bm: BuiltModel, free: list[bool], due: _Due) -> None:
    """`wait_g{g}` per swappable gap, its copy-out's end `wait_end_g{g}` among
    the ends its first hot op waits for (NOTE [ Swap-out deadlines in the
    model ])."""
    model, data, H = bm.model, bm.data, bm.horizon
    if data.n_jobs > 1 or not bm.spec.waits:
        return
    persistent = np.concatenate([t.persistent for t in data.traces])
    heads = _heads_that_copy(data)
    for g in data.gaps:
        if persistent[g.buffer] and g.id not in heads:
            continue  # its host copy may outlive the iteration: the copy-out may not happen
        if free[g.id]:
            y = model.new_bool_var(f"wait_g{g.id}")
            model.add(y <= bm.copy[g.id])
        elif bm.fixed().wait[g.id]:
            y = model.new_constant(1)
        else:
            continue
        for later in heads.get(g.id, ()):  # no host copy from the last iteration
            model.add(y + bm.swap[later] <= 1)
        w = model.new_int_var(0, H, f"wait_end_g{g.id}")
        model.add(w == bm.out_start[g.id] + int(data.out_ticks[g.buffer])).only_enforce_if(y)
        model.add(w == 0).only_enforce_if(~y)
        bm.wait[g.id], bm.wait_end[g.id] = y, w
        due[g.hot[0]].append(w)


# ---- constraints: op chain (fixed order, no idling) ------------------------------------------
def _op_chain(bm: BuiltModel, due: _Due) -> None:
    """`ready_k{k}` = max(end of op k-1, the swap-ins due at k, the copy-outs
    it waits for); op k ends its
    duration and the recomputations placed before it later."""
    model, data, end = bm.model, bm.data, bm.end
    dur = data.dur.tolist()
    rec_at: dict[int, list[tuple[int, cp_model.IntVar]]] = defaultdict(list)
    for g in data.gaps:
        for x, pt in zip(bm.rec_at.get(g.id, ()), g.rec_points):
            rec_at[pt.op].append((dur[g.recompute_op], x))
    for k in range(data.n_ops):
        prev: cp_model.LinearExprT = end[k - 1] if k else 0
        if due[k]:
            r = model.new_int_var(0, bm.horizon, f"ready_k{k}")
            model.add_max_equality(r, [prev, *due[k]])
        else:
            r = prev
        bm.ready.append(r)
        model.add(end[k] == r + dur[k] + sum(d * x for d, x in rec_at[k]))


# ---- constraints: FIFO order of several jobs ------------------------------------------------
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
def _fifo_order(bm: BuiltModel, due: _Due) -> None:
    model, data, end, H = bm.model, bm.data, bm.end, bm.horizon
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


# ---- constraints: the lane(s) --------------------------------------------------------------
def _lane_capacity(bm: BuiltModel, lanes: _Lanes, loads: _Loads) -> None:
    """One `add_no_overlap` per lane: both directions share one, or one each
    (NOTE [ Two lanes ]); each lane busy at most one period (redundant)."""
    model, T = bm.model, bm.T
    d2h, h2d = lanes[Direction.D2H], lanes[Direction.H2D]
    if bm.data.lanes == 1:
        model.add_no_overlap(d2h + h2d)
        model.add(sum(loads[Direction.D2H]) + sum(loads[Direction.H2D]) <= T)
    else:
        model.add_no_overlap(d2h)
        model.add_no_overlap(h2d)
        model.add(sum(loads[Direction.D2H]) <= T)
        model.add(sum(loads[Direction.H2D]) <= T)


# ---- objective ------------------------------------------------------------------------------
def _objective(bm: BuiltModel) -> None:
    """Minimise T, or the peak; with a soft budget any excess first."""
    model, spec, unit = bm.model, bm.spec, bm.objective_unit
    if bm.excess is not None:  # lexicographic: any excess outweighs the whole horizon
        main = bm.peak if bm.peak is not None else bm.T
        weight = (spec.budget // unit + 1) if bm.peak is not None else bm.horizon + 1
        bm.excess_weight = weight
        model.minimize(weight * bm.excess + main)
    elif spec.objective is Objective.PEAK:
        assert bm.peak is not None
        model.minimize(bm.peak)
    else:
        model.minimize(bm.T)

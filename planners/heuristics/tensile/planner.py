"""TENSILE (Zhang et al.): greedy swap scheduling at the global memory peak,
across jobs and across iterations, then MSPS recompute.

Algorithm 3 in order:

1. Activity analysis: release every buffer right after its last access
   (`planners.heuristics.vanilla.release_only_plan`).
2. Repeat: peak analysis over all jobs (Algorithm 1, `analysis.peak_analysis`);
   take the largest buffer resident at the global peak that can be swapped
   (Algorithm 2): its swap-out as early as possible after the access before
   the peak, its swap-in as late as possible before the access after it,
   each in a free interval of the lane, and only if both copies hide behind
   compute (a swap that cannot be hidden is not scheduled). Stop when no
   buffer at the peak can be swapped, when the peak fits the budget, or by
   the paper's stopping rule.
3. If the peak still exceeds the budget: recompute (§IV-D) accesses that
   swapping never released, by highest MSPS with Capuchin's update after
   each choice, recompute chains allowed, until it fits
   (`recompute`, NOTE [ TENSILE recompute rounds ]).

Without a budget TENSILE lowers the peak as far as hidden swaps go and never
recomputes (recompute always costs time); with one it stops as soon as the
peak fits. If it cannot get there it returns its plan anyway, stopped with no
move left, and says how much the runtime safety net must make up
(NOTE [ Short of the budget ]).
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterator, Sequence
from typing import NamedTuple

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction
from memplan.planners.analysis import (
    BOTH,
    EPS_US,
    STEADY,
    LaneSet,
    PeakAnalysis,
    as_traces,
    check_budget,
    peak_analysis,
    predict_timelines,
)
from memplan.planners.analysis.lanes import FreeTime
from memplan.planners.core.options import options_dict
from memplan.planners.core.plan import (
    Plan,
    PlanResult,
    Reason,
    Status,
    SwapIn,
    SwapOut,
    fingerprint_of,
    fit_result,
)
from memplan.planners.heuristics.tensile.job import JobPlanning, PickOrder, event_order, us
from memplan.planners.heuristics.tensile.options import TensileOptions
from memplan.planners.heuristics.tensile.recompute import Recomputer
from memplan.traces.model import Trace

# NOTE [ Which gap is swapped ]
# A swap empties one gap between a buffer's accesses; for a buffer resident at a job's peak op
# p, the gap containing p: swap-out in the earliest free lane slot after the access before p,
# ending before p starts; swap-in in the latest free slot ending before the access after p
# (minus `margin_us`), starting once p and the swap-out end. Fixed by the gap alone, its hole
# only shrinks as the lane fills: cached per gap, a gap whose hole misses p is skipped
# unsearched (Algorithm 2, lines 20-22, starts at the generating access instead). With
# `swap_rest` (line 43) the later gaps up to the next write are emptied too: a "release" (host
# copy still valid) as a SwapOut without lane time (unlike a Release, it copies, not loses,
# the data if the run cancelled the earlier swap-out) and a swap-in as late as the lane
# allows. A persistent buffer's last gap wraps into the next iteration (cross-iteration swap:
# SwapIn with `next_iteration`); iteration 0 starts with it resident, so a peak counting it
# loses only the hole before its end (NOTE [ Peak analysis on the op grid ]).
# Full text: docs/notes.md, "Which gap is swapped".
#
# NOTE [ Swap-out deadlines in TENSILE ]
# A committed swap counts the buffer absent from the first op that starts
# after its copy ends (the hole's first op); the swap-out names that op as
# its deadline (`SwapOut.before_op`, planners.core.plan
# NOTE [ Swap-out deadlines ]). A copy that ends late then stalls compute,
# which the simulator and a replay show as time, instead of holding its bytes
# past the op the plan counted it gone by. Without it, a peak-minimising plan,
# whose forward and backward peaks end up level, peaks higher wherever the
# lane falls behind (replays with and without deadlines: docs/planners.md).
# A swap-out that moves no bytes (a discard) needs none.


# NOTE [ Swap-ins after the peak ]
# A gap lowers the peak only if its swap-in runs after the peak op ends and
# before the access that closes the gap. So a round asks the lane, for a
# block of candidate gaps of one job at once, whether it has free time that
# long anywhere in each one's window (`FreeTime.may_fit`: one scan of the
# free stretches after the peak op, NOTE [ Free time after a start ]), and
# tries only the gaps where it may: the others' tries would fail, so the
# plan is the one trying every gap gives. Many gaps close behind a queue of
# swap-ins that fills the lane after the peak (a residual step's skip
# connections at their backward ops); the scan passes the queue once for
# all of them.


# NOTE [ Candidates in pick order ]
# A round tries the gaps around the peak largest buffer first and stops at
# the first swap that succeeds, which on most rounds is among the first
# few. So a round walks a fixed order of all buffers (`PickOrder`: size,
# then job, then buffer, the order the round has always used) in blocks of
# 256, 512, ..., keeps the buffers of each block resident at their job's
# peak op, and looks up their gaps `GAP_LOOKUPS` at a time: a round that
# stops early costs the head of the order, not the step (a 30k-op step
# holds ten thousand buffers at its peak).
GAP_LOOKUPS = 256


# NOTE [ Short of the budget ]
# TENSILE's system runs its plan with passive swapping underneath: what the
# plan leaves over the budget is swapped on demand at run time, and the
# paper's overheads include it. So when no swap or recompute is left and
# the predicted peak is still over the budget, the plan is returned, not
# dropped: `Status.STOPPED` with `Reason.NO_MOVE_LEFT` (the planner stopped
# short; the problem is not said to be infeasible), and the detail names the
# bytes the runtime safety net (`--fallback passive|dtr`) must make up.


def tensile(
    traces: Sequence[Trace],
    device: DeviceModel,
    *,
    budget_bytes: int | None = None,
    options: TensileOptions | None = None,
) -> PlanResult:
    """Plan `traces` (one per job, run together on `device`) with TENSILE."""
    t0 = time.perf_counter()
    opts = options or TensileOptions()
    jobs = as_traces(traces)
    budget = check_budget(budget_bytes)
    planner = _Tensile(jobs, device, budget, opts)
    planner.run()
    return planner.result(t0)


class Candidate(NamedTuple):
    """A gap a round may swap: buffer `buffer` of job `jb` between its
    accesses at ops `prev` and `nxt` around the peak op `pp` (unrolled op
    indices); `gap` is the global index of the access opening it."""

    jb: JobPlanning
    buffer: int
    gap: int
    prev: int
    nxt: int
    pp: int


class _Tensile:
    def __init__(
        self,
        traces: tuple[Trace, ...],
        device: DeviceModel,
        budget: int | None,
        opts: TensileOptions,
    ):
        self.traces = traces
        self.opts = opts
        self.budget = budget
        timelines = predict_timelines(traces, device)
        self.timelines = timelines
        self.jobs = [JobPlanning(j, t, timelines[j], device, opts) for j, t in enumerate(traces)]
        self.lanes = LaneSet(timelines, lanes=device.lanes, per_job_lane=opts.per_job_lane)
        self.pick = PickOrder(traces)
        self.rounds = 0
        self.recomputer: Recomputer | None = None
        self.stop = ""
        self.history: list[int] = []

    # ---- Algorithm 3 ------------------------------------------------------------
    def run(self) -> None:
        o = self.opts
        while True:
            pa = peak_analysis([jb.state for jb in self.jobs])
            self.history.append(pa.peak_bytes)
            if self.budget is not None and pa.peak_bytes <= self.budget:
                self.stop = "fits"
                return
            if self._stalled():
                self.stop = "stopping rule"
                break
            if self.rounds >= o.max_iterations:
                self.stop = "max_iterations"
                break
            if not self._swap_round(pa):
                self.stop = "no swap"
                break
            self.rounds += 1
        if self.budget is None or not o.recompute:
            return
        # §IV-D: NOTE [ TENSILE recompute rounds ] in tensile/recompute.py
        self.recomputer = Recomputer(self.jobs, self.budget, o)
        fits = self.recomputer.run()
        self.stop += ", fits after recompute" if fits else ", no recompute left"

    def _stalled(self) -> bool:
        o, h = self.opts, self.history
        if self.rounds <= o.stop_after or len(h) <= o.stop_window:
            return False
        old, new = h[-1 - o.stop_window], h[-1]
        return old - new < o.stop_min_gain * old

    # ---- Algorithm 2 -------------------------------------------------------------
    def _swap_round(self, pa: PeakAnalysis) -> bool:
        """Swap the largest buffer at the peak that can be swapped; False if none."""
        total = sum(jb.swaps for jb in self.jobs)
        rate, capped = self.opts.max_swap_rate, len(self.jobs) > 1 and self.opts.max_swap_rate < 1
        for jb, b, g, prev, nxt, pp in self._candidates(pa):  # NOTE [ Which gap is swapped ]
            if capped and nxt < jb.n and jb.swaps > rate * total:
                continue  # NOTE [ Max swapping rate ]: not for cross-iteration swaps
            if self._try_gap(jb, b, g, prev, nxt, pp):
                return True
        return False

    def _candidates(self, pa: PeakAnalysis) -> Iterator[Candidate]:
        """The gaps around each job's peak op that may be swapped, in pick
        order: largest buffer first (ties: lower job, then lower buffer),
        looked up in blocks that double (NOTE [ Candidates in pick order ])."""
        free: dict[int, FreeTime] = {}  # job -> the lane after its peak op
        for block_job, block_buf in self.pick.resident_blocks(pa, self.jobs):
            for at in range(0, len(block_job), GAP_LOOKUPS):
                yield from self._gaps_in_pick_order(
                    pa, block_job[at : at + GAP_LOOKUPS], block_buf[at : at + GAP_LOOKUPS], free
                )

    def _gaps_in_pick_order(
        self, pa: PeakAnalysis, job: np.ndarray, buf: np.ndarray, free: dict[int, FreeTime]
    ) -> Iterator[Candidate]:
        """The candidates among buffers `buf` of jobs `job` (in pick order)."""
        rows: list[tuple[int, Candidate]] = []  # (place in the block, candidate)
        for jb in self.jobs:
            mine = np.flatnonzero(job == jb.j)
            if len(mine) == 0:
                continue
            p = pa.job_peak_op[jb.j]
            ok, g, prev, nxt, pp = self._gaps_at(jb, buf[mine], p)
            if jb.j not in free:
                free[jb.j] = self._free_after(jb, p)
            ok[ok] = self._swap_in_may_fit(jb, buf[mine][ok], nxt[ok], free[jb.j])
            i, *cols = (x[ok].tolist() for x in (mine, buf[mine], g, prev, nxt, pp))
            found = map(Candidate, itertools.repeat(jb), *cols)
            if len(self.jobs) == 1:  # already in pick order
                yield from found
            else:
                rows += zip(i, found)
        rows.sort(key=lambda r: r[0])
        yield from (c for _i, c in rows)

    def _gaps_at(self, jb: JobPlanning, res: np.ndarray, p: int):
        """For buffers `res` resident at op p (not accessed by it): the gap of
        each around p, as arrays (ok, gap id, prev, next, p) in unrolled op
        indices with 0 <= prev < p < next; `ok` is False for a buffer
        without such a gap, a gap already used, or one whose cached hole
        cannot contain p."""
        n, t = jb.n, jb.table
        lo, hi = t.ptr[res], t.ptr[res + 1]
        pos = np.searchsorted(jb.acc_key, res * (n + 1) + p, "left")
        has_prev, has_next = pos > lo, pos < hi
        persistent = jb.trace.persistent[res]
        ok = (has_prev & has_next) | (persistent & (hi > lo))
        prev_i = np.where(has_prev, pos - 1, hi - 1)
        next_i = np.where(has_next, pos, lo)
        prev_i, next_i = np.minimum(prev_i, len(t.ops) - 1), np.minimum(next_i, len(t.ops) - 1)
        prev = t.ops[prev_i] - np.where(has_prev, 0, n)
        nxt = t.ops[next_i] + np.where(has_next, 0, n)
        shift = np.where(prev < 0, n, 0)
        prev, nxt, pp = prev + shift, nxt + shift, p + shift
        if self.opts.count_first_iteration:
            ok &= pp < n  # the peak lies in the next-iteration part: iteration 0 keeps it
        gid = prev_i
        ok &= ~jb.done[gid]
        te, ts = jb.hole_te[gid], jb.hole_ts[gid]
        known = ~np.isnan(te)
        if known.any():
            # unrolled ready time / end of the peak op
            later = pp >= n
            ps = np.where(later, jb.tl.unrolled_ready(p, 1), jb.tl.unrolled_ready(p, 0))
            pe = np.where(later, jb.tl.unrolled_end(p, 1), jb.tl.unrolled_end(p, 0))
            ok &= ~known | ((te + EPS_US <= ps) & (ts - EPS_US >= pe))
        return ok, gid, prev, nxt, np.broadcast_to(pp, ok.shape)

    def _free_after(self, jb: JobPlanning, p: int) -> FreeTime:
        """The lane's free time for jb's swap-ins after peak op p ends, to
        the end of the next iteration (NOTE [ Swap-ins after the peak ])."""
        lo = jb.t_end(p) + EPS_US
        return self.lanes.free_after(jb.j, lo, lo + 2 * jb.tl.period_us, Direction.H2D)

    def _swap_in_may_fit(
        self, jb: JobPlanning, bufs: np.ndarray, nxt: np.ndarray, free: FreeTime
    ) -> np.ndarray:
        """bool per buffer: False where its swap-in finds no free lane time
        after the peak op (`free`) and before op `nxt` (unrolled) closing its
        gap, so its gap cannot be swapped (NOTE [ Swap-ins after the peak ]).
        A gap around the peak op in the next iteration gets the wider window
        from this one: a no still holds."""
        due = jb.unrolled_ready_us[nxt] - EPS_US - self.opts.margin_us
        return free.may_fit(jb.d_in_us[bufs], due)

    def _host_valid(self, jb: JobPlanning, b: int, g: int) -> bool:
        """Whether a swap-out of `b` earlier in the iteration left a host copy
        that is still valid after access `g` (no write since)."""
        gaps = jb.out_gaps.get(b)
        if not gaps:
            return False
        earlier = [x for x in gaps if x < g]
        if not earlier:
            return False
        g0 = max(earlier)
        return not bool(jb.table.writes[g0 + 1 : g + 1].any())

    def _hole(
        self, jb: JobPlanning, b: int, prev: int, nxt: int, release: bool
    ) -> tuple[float, float, float | None] | None:
        """The largest hole the lane allows in gap (prev, nxt): (te, ts,
        swap-out start or None for a release), or None."""
        lanes, j = self.lanes, jb.j
        lo = jb.t_end(prev)
        due = jb.t_ready(nxt) - EPS_US - self.opts.margin_us
        if release:
            te, s_out = lo, None
        else:
            d_out = jb.d_out[b]
            s_out = lanes.earliest(j, lo, due, d_out, Direction.D2H)
            if s_out is None:
                return None
            te = s_out + d_out
        s_in = lanes.latest(j, te + EPS_US, due, jb.d_in[b], Direction.H2D)
        if s_in is None:
            return None
        return te, s_in, s_out

    def _try_gap(self, jb: JobPlanning, b: int, g: int, prev: int, nxt: int, pp: int) -> bool:
        release = self._host_valid(jb, b, g)
        hole = self._hole(jb, b, prev, nxt, release)
        if hole is None:
            jb.hole_te[g], jb.hole_ts[g] = math.inf, -math.inf
            return False
        te, ts, s_out = hole
        jb.hole_te[g], jb.hole_ts[g] = te, ts
        if not (te + EPS_US <= jb.t_ready(pp) and jb.t_end(pp) <= ts - EPS_US):
            return False
        if not self._commit(jb, b, g, prev, nxt, te, ts, s_out):
            return False
        if self.opts.swap_rest and nxt < jb.n:
            self._swap_rest(jb, b, g)
        return True

    def _commit(
        self,
        jb: JobPlanning,
        b: int,
        g: int,
        prev: int,
        nxt: int,
        te: float,
        ts: float,
        s_out: float | None,
    ) -> bool:
        """Book the copies, cut the hole, record the events. False (nothing
        done) if the hole holds no op or the swap-in has no trigger."""
        tl, n = jb.tl, jb.n
        ranges = tl.ops_within(te + EPS_US, ts - EPS_US)
        if not ranges:
            return False
        try:
            after, delay, r = tl.trigger(ts, te + EPS_US)
        except ValueError:
            return False
        cross = nxt >= n
        if r == 1 and not cross:  # pragma: no cover - times within one iteration
            return False
        which_r1 = STEADY if bool(jb.trace.persistent[b]) else 0
        for lo, hi, rr in ranges:
            if rr == 0:
                jb.state.add_hole(b, lo, hi, BOTH)
            elif which_r1:
                jb.state.add_hole(b, lo, hi, which_r1)
        if s_out is None:
            # a valid host copy: the simulator discards the device copy without
            # a transfer. Not a Release: if timing shifts and the copy this
            # relies on was cancelled, a SwapOut still copies
            # (NOTE [ Which gap is swapped ])
            jb.events.append(SwapOut(b, prev, 0.0))
        else:
            self.lanes.book(jb.j, s_out, jb.d_out[b], Direction.D2H)
            # the deadline: NOTE [ Swap-out deadlines in TENSILE ]
            due = next((lo for lo, _hi, rr in ranges if rr == 0), -1)
            delay_out = us(s_out - jb.t_end(prev))
            jb.events.append(SwapOut(b, prev, delay_out, before_op=due if due > prev else -1))
            jb.out_gaps.setdefault(b, []).append(g)
            # b's later gaps may now be emptied by a release: forget their holes
            end = int(jb.table.ptr[b + 1])
            jb.hole_te[g + 1 : end] = np.nan
            jb.hole_ts[g + 1 : end] = np.nan
        self.lanes.book(jb.j, ts, jb.d_in[b], Direction.H2D)
        jb.events.append(SwapIn(b, after, nxt % n, us(delay), next_iteration=cross and r == 0))
        jb.done[g] = True
        jb.swaps += 1
        return True

    def _swap_rest(self, jb: JobPlanning, b: int, g: int) -> None:
        """Algorithm 2 line 43: the later gaps of `b` up to its next write get
        a release and a swap-in, as far as the lane allows."""
        t = jb.table
        last = int(t.ptr[b + 1]) - 1
        x = g + 1
        while x < last and not t.writes[x]:
            if not jb.done[x]:
                prev, nxt = int(t.ops[x]), int(t.ops[x + 1])
                hole = self._hole(jb, b, prev, nxt, True)
                if hole is not None:
                    te, ts, _ = hole
                    self._commit(jb, b, x, prev, nxt, te, ts, None)
            x += 1

    # ---- the result --------------------------------------------------------------
    def result(self, t0: float) -> PlanResult:
        rc = self.recomputer
        plans = []
        for jb in self.jobs:
            evs = jb.events + (rc.events(jb.j) if rc else [])
            evs.sort(key=event_order)
            plans.append(Plan(fingerprint_of(jb.trace), tuple(evs), jb.trace.meta.model))
        pa = peak_analysis([jb.state for jb in self.jobs])
        peak = pa.peak_bytes
        rec_us = [rc.time_us(jb.j) if rc else 0.0 for jb in self.jobs]
        stats = {
            "peak_bytes": peak,
            "job_peak_bytes": list(pa.job_peak_bytes),
            "vanilla_peak_bytes": sum(t.peak("framework")[0] for t in self.traces),
            "liveness_peak_bytes": sum(t.peak("liveness")[0] for t in self.traces),
            "swaps": [jb.swaps for jb in self.jobs],
            "recomputes": [rc.count(jb.j) if rc else 0 for jb in self.jobs],
            "recompute_time_s": sum(rec_us) * 1e-6,
            # [job, buffer, before_op, MSPS (bytes/s) when taken], in pick order
            "recompute_picks": [list(x) for x in rc.picks] if rc else [],
            "rounds": self.rounds,
            "stop": self.stop,
            "predicted_iteration_time_s": [
                (tl.period_us + r) * 1e-6 for tl, r in zip(self.timelines, rec_us, strict=True)
            ],
        }
        options = {"budget_bytes": self.budget, **options_dict(self.opts)}
        if self.budget is None or peak <= self.budget:
            return fit_result("tensile", plans, peak, self.budget, t0, options=options, stats=stats)
        return PlanResult(  # NOTE [ Short of the budget ]
            planner="tensile",
            status=Status.STOPPED,
            plans=tuple(plans),
            reason=Reason.NO_MOVE_LEFT,
            detail=(
                f"predicted peak {peak} B is over the budget {self.budget} B with no swap or "
                f"recompute left; the runtime safety net (--fallback) must make up "
                f"{peak - self.budget} B"
            ),
            solve_time_s=time.perf_counter() - t0,
            options=options,
            stats=stats,
        )

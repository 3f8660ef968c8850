"""Capuchin (Peng et al., ASPLOS'20): tensor-granularity swap and recompute,
chosen by free time and MSPS, saving only what the budget needs.

Algorithm 1 (hybrid policy) over the predicted tensor access sequence:
candidates are the buffers whose accesses straddle the memory peak, ranked
by free time FT; they are swapped while an in-trigger hides the swap-in;
after that each step compares the cheapest swap with the cheapest recompute
(Algorithm 2: highest MSPS with its iterative update) and takes the one with
less overhead, until the memory to save is reached.

Capuchin needs a budget (it saves `peak - budget` and nothing more): called
without one it stops with `Reason.NO_BUDGET` and no plans -- it is a result, not an error, so a sweep goes on. (The
comparison defaults the budget to the peak TENSILE reached.)
"""

from __future__ import annotations

import time
from collections.abc import Container, Sequence
from typing import Any

import numpy as np
from memplan.hwmodels.device import DeviceModel, Direction
from memplan.planners.analysis import (
    EPS_US,
    LaneSet,
    Timeline,
    access_table,
    as_traces,
    check_budget,
    memory_of_plan,
    msps,
    predict_timelines,
)
from memplan.planners.core.errors import PlanError
from memplan.planners.core.options import options_dict
from memplan.planners.core.plan import (
    Event,
    Plan,
    PlanResult,
    Reason,
    Recompute,
    Release,
    Status,
    SwapIn,
    SwapOut,
    empty_plan,
    fingerprint_of,
    fit_result,
)
from memplan.planners.heuristics.capuchin.hybrid import Hybrid
from memplan.planners.heuristics.capuchin.options import (
    NO_BUDGET,
    Candidate,
    CapuchinOptions,
    Choice,
    SwapSlots,
)
from memplan.traces.model import Trace

# NOTE [ Capuchin candidates and rounds ]
# - The "measured execution" is our predicted one (`analysis.predict_timelines`, the
#   framework's frees); memory is `analysis.memory_of_plan`'s op grid.
# - Memory to save = peak - budget at the current peak op p. Candidates: access pairs
#   (evicted, back) of non-persistent buffers resident at p with p strictly between them;
#   each chosen one lowers the peak by its bytes.
# - Capuchin refines over iterations by feedback; we refine over rounds: once the saving is
#   reached the memory is predicted again, and Algorithm 1 runs again around a new peak op
#   still over budget, until no candidate is left (the plan so far is returned).
# - Several jobs: each planned alone against a share of the budget in proportion to its
#   vanilla peak. Full text: docs/notes.md, "Capuchin candidates and rounds".
#
# NOTE [ Capuchin swaps ]
# - FT = SwapInStartTime - SwapOutEndTime at the ideal times (Eq. 1); longest first.
# - PCIe carries one copy at a time (§4.4): copies are booked on the job's lane
#   (`analysis.LaneSet`). The swap-out takes the earliest free slot after the evicted access
#   and must end before p starts (else no swap). The swap-in is triggered by the latest op
#   outside the peak whose end starts a free slot ending before the back access; with none,
#   it takes the earliest slot after p, and the back access's wait is its overhead.
# - Phase 1 takes candidates in FT order while their swap-in is hidden; then each step takes
#   the cheaper of swapping the longest-FT candidate and recomputing the highest-MSPS one
#   (§4.5), ties to swapping.
# - Each swap-out's deadline (`SwapOut.before_op`) is the first op starting after its
#   planned copy end (planners.core.plan NOTE [ Swap-out deadlines ]): a late copy stalls
#   instead of overrunning the memory counted. Full text: docs/notes.md; measured in
#   docs/planners.md.


class JobPlanner:
    """Capuchin for one job against `budget` bytes."""

    def __init__(
        self, trace: Trace, tl: Timeline, device: DeviceModel, budget: int, opts: CapuchinOptions
    ):
        self.trace, self.tl, self.device = trace, tl, device
        self.copy_us = {
            d: device.copy_time(trace.nbytes, d, duplex=True).tolist() for d in Direction
        }
        self.budget, self.opts = budget, opts
        self.table = access_table(trace)
        self.dur = tl.duration_us
        self.start_us, self.end_us = tl.start_us, tl.end_us
        self.lane = LaneSet([tl], lanes=device.lanes)
        self.lane_version = 0
        self.choices: list[Choice] = []
        self.gaps: dict[int, list[Candidate]] = {}  # buffer -> chosen evictions
        self.failed: set[tuple[int, int]] = set()  # (buffer, evict) not to try again
        life_start, life_end = trace.lifetimes("framework")
        self.life_start, self.life_end = life_start.tolist(), life_end.tolist()
        self.persistent = trace.persistent.tolist()
        self.rounds = 0
        self.plan = empty_plan(trace)
        self.state = memory_of_plan(trace, tl, self.plan, device)
        self._swap_cache: dict[int, tuple[int, SwapSlots | None]] = {}

    # ---- availability ------------------------------------------------------------
    def _evicted_at(self, s: int, x: int) -> bool:
        return any(c.covers(x) for c in self.gaps.get(s, ()))

    def available(self, s: int, x: int, assumed: Container[int] | None = None) -> bool:
        """Whether buffer `s` is on the device when op `x` is due (chosen
        evictions count; candidates in `assumed` are taken to be there)."""
        if self.persistent[s]:
            return True
        if not (self.life_start[s] < x <= self.life_end[s]) and not (
            self.trace.exists_at_start[s] and x <= self.life_end[s]
        ):
            return False
        if assumed is not None and s in assumed:
            return True
        return not self._evicted_at(s, x)

    def lineage(
        self, b: int, x: int, assumed: Container[int] | None
    ) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        return msps.chain(
            self.trace,
            b,
            x,
            lambda s: self.available(s, x, assumed),
            max_ops=self.opts.max_recompute_ops,
            table=self.table,
        )

    # ---- rounds ------------------------------------------------------------------
    def run(self) -> None:
        while self.rounds < self.opts.max_rounds:
            peak, p = self.state.peak()
            if peak <= self.budget or p < 0:
                return
            self.rounds += 1
            if not self._round(p, peak - self.budget):
                return
            self._assemble()

    def _candidates(self, p: int) -> list[Candidate]:
        t = self.trace
        out = []
        for b in self.state.resident_at(p).tolist():
            if self.persistent[b] or t.nbytes[b] == 0:
                continue
            acc = self.table.accesses(b)
            k = int(np.searchsorted(acc, p, "right")) - 1
            if k < 0 or k + 1 >= len(acc) or acc[k] == p:
                continue
            evict, back = int(acc[k]), int(acc[k + 1])
            if (b, evict) in self.failed or any(c.evict == evict for c in self.gaps.get(b, ())):
                continue
            nb = int(t.nbytes[b])
            ft = (self.start_us[back] - self._copy_us(b, Direction.H2D)) - (
                self.end_us[evict] + self._copy_us(b, Direction.D2H)
            )
            out.append(Candidate(b, evict, back, nb, float(ft)))
        out.sort(key=lambda c: (-c.ft_us, c.buffer))
        return out

    def _round(self, p: int, mem_saving: int) -> bool:
        """Algorithm 1 around peak op `p`; False if nothing could be chosen."""
        pool = self._candidates(p)
        if not pool:
            return False
        chosen_before = len(self.choices)
        # phase 1: swaps whose in-trigger hides the swap-in, by FT
        self._swap_cache.clear()
        i = 0
        while i < len(pool) and mem_saving > 0:
            c = pool[i]
            sw = self.swap_try(c, p)
            if sw is None or sw.overhead_us > 0:
                break
            self.choose_swap(c, sw)
            mem_saving -= c.nbytes
            i += 1
        if mem_saving > 0 and i < len(pool):
            Hybrid(self, pool[i:], p).run(mem_saving)
        return len(self.choices) > chosen_before

    # ---- swaps ---------------------------------------------------------------------
    def swap_try(self, c: Candidate, p: int) -> SwapSlots | None:
        """The lane slots and in-trigger of swapping `c` around peak op `p`
        (NOTE [ Capuchin swaps ]); None if the swap-out cannot end before p."""
        hit = self._swap_cache.get(c.buffer)
        if hit is not None and hit[0] == self.lane_version:
            return hit[1]
        sw = self._swap_slots(c, p)
        self._swap_cache[c.buffer] = (self.lane_version, sw)
        return sw

    def _copy_us(self, b: int, direction: Direction) -> float:
        """Microseconds a copy of buffer `b` holds its lane (H2D at the duplex
        rate when the device has two lanes, as CP-SAT costs it)."""
        return self.copy_us[direction][b]

    def _swap_slots(self, c: Candidate, p: int) -> SwapSlots | None:
        lane = self.lane
        d_out = self._copy_us(c.buffer, Direction.D2H)
        d_in = self._copy_us(c.buffer, Direction.H2D)
        lo = float(self.end_us[c.evict])
        s_out = lane.earliest(0, lo, float(self.start_us[p]) - EPS_US, d_out, Direction.D2H)
        if s_out is None:
            return None
        lo_in = max(s_out + d_out, float(self.end_us[p])) + EPS_US
        due = float(self.start_us[c.back]) - EPS_US
        s_in = lane.latest(0, lo_in, due, d_in, Direction.H2D)
        overhead = 0.0
        if s_in is None:
            s_in = lane.earliest(0, lo_in, lo_in + self.tl.period_us, d_in, Direction.H2D)
            if s_in is None:
                return None
            overhead = max(0.0, s_in + d_in - due)
        after = int(np.searchsorted(self.end_us, s_in + 1e-9, "right")) - 1
        after = min(max(after, p), c.back - 1)
        delay = max(0.0, s_in - float(self.end_us[after]))
        return SwapSlots(overhead, s_out, s_in, after, delay)

    def choose_swap(self, c: Candidate, sw: SwapSlots) -> None:
        d_out = self._copy_us(c.buffer, Direction.D2H)
        self.lane.book(0, sw.out_start, d_out, Direction.D2H)
        self.lane.book(0, sw.in_start, self._copy_us(c.buffer, Direction.H2D), Direction.H2D)
        self.lane_version += 1
        self.choices.append(Choice(c, sw))
        self.gaps.setdefault(c.buffer, []).append(c)

    def choose_recompute(
        self, c: Candidate, found: tuple[tuple[int, ...], tuple[int, ...]]
    ) -> None:
        ops = found[0]
        rng = any(self.trace.ops[k].rng for k in ops)
        self.choices.append(Choice(c, None, ops, rng))
        self.gaps.setdefault(c.buffer, []).append(c)

    # ---- the plan --------------------------------------------------------------------
    def _assemble(self) -> None:
        """Rebuild recompute chains against all evictions, then the plan and
        its predicted memory."""
        kept: list[Choice] = []
        for ch in self.choices:
            if ch.swap is None:
                c = ch.cand
                found = self.lineage(c.buffer, c.back, None)
                if found is None:
                    self.failed.add((c.buffer, c.evict))
                    self.gaps[c.buffer].remove(c)
                    continue
                ch.ops = found[0]
                ch.rng = any(self.trace.ops[k].rng for k in ch.ops)
            kept.append(ch)
        self.choices = kept
        events: list[Event] = []
        for ch in self.choices:
            c, sw = ch.cand, ch.swap
            if sw is not None:
                out_delay = max(0.0, sw.out_start - float(self.end_us[c.evict]))
                # the first op the plan counts the buffer gone for is the
                # copy's deadline (planners.core.plan NOTE [ Swap-out deadlines ])
                out_end = sw.out_start + self._copy_us(c.buffer, Direction.D2H)
                due = int(np.searchsorted(self.tl.ready_us, out_end + EPS_US, "left"))
                due = due if c.evict < due < c.back else -1
                events.append(SwapOut(c.buffer, c.evict, out_delay, before_op=due))
                events.append(SwapIn(c.buffer, sw.in_after, c.back, sw.in_delay))
            else:
                events.append(Release(c.buffer, c.evict))
                events.append(Recompute(c.buffer, c.back, ch.ops, ch.rng))
        self.plan = Plan(fingerprint_of(self.trace), tuple(events), self.trace.meta.model)
        self.state = memory_of_plan(self.trace, self.tl, self.plan, self.device)

    def stats(self) -> dict[str, Any]:
        swaps = [ch for ch in self.choices if ch.swap is not None]
        recs = [ch for ch in self.choices if ch.swap is None]
        return {
            "budget_bytes": self.budget,
            "peak_bytes": self.state.peak()[0],
            "rounds": self.rounds,
            "swaps": len(swaps),
            "recomputes": len(recs),
            "swap_overhead_us": sum(ch.swap.overhead_us for ch in swaps if ch.swap),
            "recompute_us": float(sum(self.dur[list(ch.ops)].sum() for ch in recs)),
        }


def capuchin(
    traces: Sequence[Trace],
    device: DeviceModel,
    *,
    budget_bytes: int | None = None,
    options: CapuchinOptions | None = None,
    timelines: Sequence[Timeline] | None = None,
) -> PlanResult:
    """Capuchin on every job alone, saving what `budget_bytes` needs. Without
    a budget it stops with `Reason.NO_BUDGET` and no plans. `timelines`: one
    per job, the access times to plan from (Capuchin's measured iteration:
    `measured.measured_timeline`); None: predicted from `device`."""
    t0 = time.perf_counter()
    jobs = as_traces(traces)
    budget = check_budget(budget_bytes)
    opts = options or CapuchinOptions()
    if budget is None:
        return PlanResult(
            planner="capuchin",
            status=Status.STOPPED,
            plans=(),
            reason=Reason.NO_BUDGET,
            detail=NO_BUDGET,
            solve_time_s=time.perf_counter() - t0,
            options=options_dict(opts),
        )
    if timelines is None:
        timelines = predict_timelines(jobs, device)
    elif len(timelines) != len(jobs) or any(
        tl.n_ops != t.n_ops for tl, t in zip(timelines, jobs, strict=True)
    ):
        raise PlanError("capuchin: timelines must be one per job, one time per op")
    vanilla = [t.peak("framework")[0] for t in jobs]
    total = sum(vanilla)
    plans, stats, peaks = [], [], []
    for t, tl, v in zip(jobs, timelines, vanilla, strict=True):
        share = budget if len(jobs) == 1 else (budget * v) // max(total, 1)
        jp = JobPlanner(t, tl, device, share, opts)
        jp.run()
        plans.append(jp.plan)
        st = jp.stats()
        stats.append(st)
        peaks.append(st["peak_bytes"])
    # each job against its share: one over its share has no move left
    over = next((s for s in stats if s["peak_bytes"] > s["budget_bytes"]), None)
    return fit_result(
        "capuchin",
        plans,
        over["peak_bytes"] if over else sum(peaks),
        over["budget_bytes"] if over else None,
        t0,
        options=options_dict(opts),
        stats={"peak_bytes": sum(peaks), "job_peak_bytes": peaks, "jobs": stats},
    )

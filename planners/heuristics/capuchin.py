"""Capuchin (Peng et al., ASPLOS'20): tensor-granularity swap and recompute,
chosen by free time and MSPS, saving only what the budget needs.

Algorithm 1 (hybrid policy) over the predicted tensor access sequence:
candidates are the buffers whose accesses straddle the memory peak, ranked
by free time FT; they are swapped while an in-trigger hides the swap-in;
after that each step compares the cheapest swap with the cheapest recompute
(Algorithm 2: highest MSPS with its iterative update) and takes the one with
less overhead, until the memory to save is reached.

Capuchin needs a budget (it saves `peak - budget` and nothing more): called
without one it returns `feasible=False`, no plans, and the reason in
`stats["reason"]` -- it is a result, not an error, so a sweep goes on. (The
comparison defaults the budget to the peak TENSILE reached.)

# NOTE [ Capuchin candidates and rounds ]
# - The "measured execution" is our predicted one: the timeline of
#   `analysis.predict_timelines` (jobs run together, each planned alone) and
#   the framework's frees; the memory is `analysis.memory_of_plan`'s op grid.
# - Memory to save = peak - budget at the current peak op p. Candidates are
#   access pairs (evicted access, back access) of non-persistent buffers
#   resident at p with p strictly between the two accesses (so the buffer is
#   accessed more than once and its accesses span the peak). Each chosen
#   candidate lowers the peak by its bytes (`mem_saving -= t.mem`).
# - Capuchin refines its plan over iterations by feedback; we refine it over
#   rounds: when the saving is reached the plan's memory is predicted again,
#   and if the peak moved to another op still over budget, Algorithm 1 runs
#   again around that op. No candidate left with the peak over budget:
#   `feasible=False` (the plan so far is returned).
# - Several jobs: each is planned alone against a share of the budget
#   proportional to its vanilla peak.
#
# NOTE [ Capuchin swaps ]
# - FT = SwapInStartTime - SwapOutEndTime with the ideal times: the swap-out
#   starts when the evicted access ends, the swap-in ends when the back
#   access starts (Eq. 1); candidates are ranked by FT, longest first.
# - PCIe carries one copy at a time (§4.4): copies are booked on the job's
#   lane timeline (`analysis.LaneSet`). The swap-out takes the earliest free
#   slot after the evicted access and must end before p starts (else it does
#   not lower this peak: no swap). The in-trigger is the latest op whose end
#   (+ `delay_us`) starts a free slot ending before the back access, and it
#   may not lie inside the peak: the copy starts after p ends. If no such
#   slot exists the swap-in takes the earliest free slot after p, and its
#   overhead is the time the back access waits for it.
# - Phase 1 takes candidates in FT order while their swap-in is hidden. At
#   the first one that is not, phase 2 starts: each step weighs the swap of
#   the remaining candidate with the longest FT against the recompute of the
#   one with the highest MSPS and takes the one with less overhead (§4.5:
#   "compare the minimal overhead of swapping or recomputing ..."); the
#   other stays a candidate. Ties go to swapping.
#
# - Each swap-out names the first op that starts after its planned copy
#   end as its deadline (`SwapOut.before_op`): the op this plan counts the
#   buffer gone for waits for a late copy instead of running with it
#   (planners.core.plan NOTE [ Swap-out deadlines ]). Measured on CPU replays,
#   without it tiny_resnet's plan peaked 1.8% over the simulation in one
#   run of 16. It costs stall where the lane is congested (simulated for
#   the CPU replay: +4.6% iteration time on mlp, +8.2% on linear_chain,
#   nothing on the three others); without it those plans ran with more
#   memory than the planner counted at the ops it checked.
#
# NOTE [ Capuchin recompute ]
# - Recompute frees the buffer after the evicted access (`Release`) and
#   re-runs its lineage on demand before the back access (`Recompute`),
#   §4.4. The lineage is `planners.analysis.msps.chain`: the buffer's producer and,
#   recursively, the producers of inputs not on the device then -- freed by
#   the framework, or evicted by this plan over the back access -- up to
#   `max_recompute_ops` ops (NOTE [ What can be recomputed ] in msps.py).
# - MSPS = bytes / (rp_time + ext_time) with Algorithm 2's iterative update:
#   first every candidate's sources are taken to be on the device; when t is
#   chosen, a candidate that recomputes from t recomputes from t's sources
#   instead (rp_time += t.rp_time), and a candidate that chosen recomputes
#   read as a source carries their repeated work in ext_time. We apply a
#   replacement only when t is really absent over that candidate's back
#   access (its evicted gap contains it), and treat a swapped candidate the
#   same way for the others' lineages (Algorithm 2 only knows recomputes).
# - Chains are rebuilt from the final evictions when the plan is assembled:
#   a later eviction of a source lengthens an earlier chain. A recompute
#   whose chain can no longer be built is dropped and not tried again.
# - Recompute overhead = the chain's predicted time (+ ext_time); it is not
#   fed back into the timeline (Capuchin measures it in the next iteration).
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from memplan.hwmodels.latency import LatencyModel
from memplan.hwmodels.profile import Hardware
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
    transfer_us,
)
from memplan.planners.core.plan import (
    Event,
    Plan,
    PlanResult,
    Recompute,
    Release,
    SwapIn,
    SwapOut,
    empty_plan,
    fingerprint_of,
)
from memplan.planners.registry import PlannerSpec, make_options, options_dict
from memplan.traces.model import Trace

NO_BUDGET = "capuchin saves only what a budget needs: give budget_bytes"


@dataclass(frozen=True, slots=True)
class CapuchinOptions:
    """- `recompute`: consider recomputation (False: swap only).
    - `max_recompute_ops`: longest recompute chain (lineage) in ops.
    - `max_rounds`: cap on Algorithm 1 rounds per job (NOTE [ Capuchin
      candidates and rounds ])."""

    recompute: bool = True
    max_recompute_ops: int = 32
    max_rounds: int = 1000

    def __post_init__(self) -> None:
        if self.max_recompute_ops < 1:
            raise ValueError(f"max_recompute_ops={self.max_recompute_ops!r} must be >= 1")
        if self.max_rounds < 1:
            raise ValueError(f"max_rounds={self.max_rounds!r} must be >= 1")


@dataclass(slots=True)
class _Cand:
    """One access pair of one buffer: evicted after op `evict`, needed again
    by op `back`. Swap and Algorithm 2 state."""

    buffer: int
    evict: int
    back: int
    nbytes: int
    ft_us: float
    srcs: set[int] = field(default_factory=set)
    rp_us: float = math.inf  # inf: not recomputable
    ext_us: float = 0.0
    version: int = 0

    @property
    def recompute_us(self) -> float:
        return self.rp_us + self.ext_us

    @property
    def msps(self) -> float:
        t = self.recompute_us
        if math.isinf(t):
            return 0.0
        return math.inf if t <= 0 else self.nbytes / (t * 1e-6)

    def covers(self, op: int) -> bool:
        """Whether the buffer is off the device while `op` runs, once evicted."""
        return self.evict < op < self.back


@dataclass(frozen=True, slots=True)
class _Swap:
    overhead_us: float
    out_start: float
    in_start: float
    in_after: int
    in_delay: float


@dataclass(slots=True)
class _Choice:
    cand: _Cand
    swap: _Swap | None = None  # None: recompute
    ops: tuple[int, ...] = ()
    rng: bool = False


class _JobPlanner:
    """Capuchin for one job against `budget` bytes."""

    def __init__(
        self, trace: Trace, tl: Timeline, hw: Hardware, budget: int, opts: CapuchinOptions
    ):
        self.trace, self.tl, self.hw = trace, tl, hw
        self.budget, self.opts = budget, opts
        self.table = access_table(trace)
        self.dur = tl.duration_us
        self.start_us, self.end_us = tl.start_us, tl.end_us
        self.lane = LaneSet([tl])
        self.lane_version = 0
        self.choices: list[_Choice] = []
        self.gaps: dict[int, list[_Cand]] = {}  # buffer -> chosen evictions
        self.failed: set[tuple[int, int]] = set()  # (buffer, evict) not to try again
        life_start, life_end = trace.lifetimes("framework")
        self.life_start, self.life_end = life_start.tolist(), life_end.tolist()
        self.persistent = trace.persistent.tolist()
        self.rounds = 0
        self.plan = empty_plan(trace)
        self.state = memory_of_plan(trace, tl, self.plan, hw)
        self._swap_cache: dict[int, tuple[int, _Swap | None]] = {}

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

    def _lineage(
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

    def _candidates(self, p: int) -> list[_Cand]:
        t, hw = self.trace, self.hw
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
            ft = (self.start_us[back] - transfer_us(hw, nb, "h2d")) - (
                self.end_us[evict] + transfer_us(hw, nb, "d2h")
            )
            out.append(_Cand(b, evict, back, nb, float(ft)))
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
            sw = self._swap_try(c, p)
            if sw is None or sw.overhead_us > 0:
                break
            self._choose_swap(c, sw)
            mem_saving -= c.nbytes
            i += 1
        if mem_saving > 0 and i < len(pool):
            self._hybrid(pool[i:], p, mem_saving)
        return len(self.choices) > chosen_before

    def _hybrid(self, pool: list[_Cand], p: int, mem_saving: int) -> None:
        """Phase 2: the cheapest swap against the best-MSPS recompute."""
        by_buf = {c.buffer: c for c in pool}
        users: dict[int, set[int]] = {}
        heap: list[tuple[float, int, int, int]] = []
        if self.opts.recompute:
            for c in pool:
                found = self._lineage(c.buffer, c.back, by_buf)
                if found is None:
                    continue
                ops, sources = found
                c.rp_us = float(self.dur[list(ops)].sum())
                c.srcs = {s for s in sources if not self.persistent[s]}
                for s in c.srcs:
                    users.setdefault(s, set()).add(c.buffer)
                heapq.heappush(heap, (-c.msps, c.buffer, c.version, c.buffer))
        swap_order = sorted(pool, key=lambda c: (-c.ft_us, c.buffer))
        no_swap: set[int] = set()
        recomps: set[int] = set()
        alive = set(by_buf)

        def best_recompute() -> _Cand | None:
            while heap:
                _neg, _tie, ver, b = heap[0]
                c = by_buf[b]
                if b not in alive or ver != c.version or math.isinf(c.rp_us):
                    heapq.heappop(heap)
                    continue
                return c
            return None

        def best_swap() -> tuple[_Cand, _Swap] | None:
            for c in swap_order:
                if c.buffer not in alive or c.buffer in no_swap:
                    continue
                sw = self._swap_try(c, p)
                if sw is None:
                    no_swap.add(c.buffer)
                    continue
                return c, sw
            return None

        def touch(c: _Cand) -> None:
            c.version += 1
            if not math.isinf(c.rp_us):
                heapq.heappush(heap, (-c.msps, c.buffer, c.version, c.buffer))

        def replace_source(t: _Cand) -> None:
            """Candidates reading t over its gap now recompute from t's sources."""
            for b in list(users.get(t.buffer, ())):
                cand = by_buf[b]
                if b not in alive or not t.covers(cand.back):
                    continue
                cand.srcs.discard(t.buffer)
                users[t.buffer].discard(b)
                if math.isinf(t.rp_us):
                    cand.rp_us = math.inf
                else:
                    cand.srcs |= t.srcs
                    for s in t.srcs:
                        users.setdefault(s, set()).add(b)
                    cand.rp_us += t.rp_us
                    cand.ext_us = cand.rp_us * len(users.get(b, set()) & recomps)
                touch(cand)

        while mem_saving > 0:
            s = best_swap()
            r = best_recompute()
            if s is None and r is None:
                return
            if s is not None and (r is None or s[1].overhead_us <= r.recompute_us):
                c, sw = s
                self._choose_swap(c, sw)
                alive.discard(c.buffer)
                replace_source(c)
                mem_saving -= c.nbytes
                continue
            assert r is not None
            found = self._lineage(r.buffer, r.back, alive)  # the others are still there
            if found is None:
                r.rp_us = math.inf
                touch(r)
                continue
            # Algorithm 2, lines 5-15: chosen recomputes that read t now read t's sources
            ext_ct = 1
            for b in list(users.get(r.buffer, ())):
                if b in recomps and r.covers(by_buf[b].back):
                    rp = by_buf[b]
                    rp.srcs.discard(r.buffer)
                    rp.srcs |= r.srcs
                    users[r.buffer].discard(b)
                    for x in r.srcs:
                        users.setdefault(x, set()).add(b)
                    ext_ct += 1
            recomps.add(r.buffer)
            alive.discard(r.buffer)
            self._choose_recompute(r, found)
            mem_saving -= r.nbytes
            # lines 17-35: update the MSPS of the candidates left
            replace_source(r)
            for x in r.srcs:
                cand = by_buf.get(x)
                if cand is not None and x in alive and cand.covers(r.back):
                    cand.ext_us = ext_ct * cand.rp_us if not math.isinf(cand.rp_us) else 0.0
                    touch(cand)

    # ---- swaps ---------------------------------------------------------------------
    def _swap_try(self, c: _Cand, p: int) -> _Swap | None:
        """The lane slots and in-trigger of swapping `c` around peak op `p`
        (NOTE [ Capuchin swaps ]); None if the swap-out cannot end before p."""
        hit = self._swap_cache.get(c.buffer)
        if hit is not None and hit[0] == self.lane_version:
            return hit[1]
        sw = self._swap_slots(c, p)
        self._swap_cache[c.buffer] = (self.lane_version, sw)
        return sw

    def _swap_slots(self, c: _Cand, p: int) -> _Swap | None:
        hw, lane = self.hw, self.lane
        d_out = float(transfer_us(hw, c.nbytes, "d2h"))
        d_in = float(transfer_us(hw, c.nbytes, "h2d"))
        lo = float(self.end_us[c.evict])
        s_out = lane.earliest(0, lo, float(self.start_us[p]) - EPS_US, d_out)
        if s_out is None:
            return None
        lo_in = max(s_out + d_out, float(self.end_us[p])) + EPS_US
        due = float(self.start_us[c.back]) - EPS_US
        s_in = lane.latest(0, lo_in, due, d_in)
        overhead = 0.0
        if s_in is None:
            s_in = lane.earliest(0, lo_in, lo_in + self.tl.period_us, d_in)
            if s_in is None:
                return None
            overhead = max(0.0, s_in + d_in - due)
        after = int(np.searchsorted(self.end_us, s_in + 1e-9, "right")) - 1
        after = min(max(after, p), c.back - 1)
        delay = max(0.0, s_in - float(self.end_us[after]))
        return _Swap(overhead, s_out, s_in, after, delay)

    def _choose_swap(self, c: _Cand, sw: _Swap) -> None:
        hw = self.hw
        self.lane.book(0, sw.out_start, float(transfer_us(hw, c.nbytes, "d2h")))
        self.lane.book(0, sw.in_start, float(transfer_us(hw, c.nbytes, "h2d")))
        self.lane_version += 1
        self.choices.append(_Choice(c, sw))
        self.gaps.setdefault(c.buffer, []).append(c)

    def _choose_recompute(self, c: _Cand, found: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
        ops = found[0]
        rng = any(self.trace.ops[k].rng for k in ops)
        self.choices.append(_Choice(c, None, ops, rng))
        self.gaps.setdefault(c.buffer, []).append(c)

    # ---- the plan --------------------------------------------------------------------
    def _assemble(self) -> None:
        """Rebuild recompute chains against all evictions, then the plan and
        its predicted memory."""
        kept: list[_Choice] = []
        for ch in self.choices:
            if ch.swap is None:
                c = ch.cand
                found = self._lineage(c.buffer, c.back, None)
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
                out_end = sw.out_start + float(transfer_us(self.hw, c.nbytes, "d2h"))
                due = int(np.searchsorted(self.tl.ready_us, out_end + EPS_US, "left"))
                due = due if c.evict < due < c.back else -1
                events.append(SwapOut(c.buffer, c.evict, out_delay, before_op=due))
                events.append(SwapIn(c.buffer, sw.in_after, c.back, sw.in_delay))
            else:
                events.append(Release(c.buffer, c.evict))
                events.append(Recompute(c.buffer, c.back, ch.ops, ch.rng))
        self.plan = Plan(fingerprint_of(self.trace), tuple(events), self.trace.meta.model)
        self.state = memory_of_plan(self.trace, self.tl, self.plan, self.hw)

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
    hw: Hardware,
    latency: LatencyModel,
    *,
    budget_bytes: int | None = None,
    **options: Any,
) -> PlanResult:
    """Capuchin on every job alone (options: see `CapuchinOptions`), saving
    what `budget_bytes` needs. Without a budget: `feasible=False`, no plans,
    `stats["reason"]`."""
    t0 = time.perf_counter()
    jobs = as_traces(traces)
    budget = check_budget(budget_bytes)
    opts = make_options(PlannerSpec("capuchin", capuchin, CapuchinOptions), options)
    if budget is None:
        return PlanResult(
            planner="capuchin",
            feasible=False,
            plans=(),
            solve_time_s=time.perf_counter() - t0,
            options=options_dict(opts),
            stats={"reason": NO_BUDGET},
        )
    timelines = predict_timelines(jobs, hw, latency)
    vanilla = [t.peak("framework")[0] for t in jobs]
    total = sum(vanilla)
    plans, stats, peaks = [], [], []
    for t, tl, v in zip(jobs, timelines, vanilla, strict=True):
        share = budget if len(jobs) == 1 else (budget * v) // max(total, 1)
        jp = _JobPlanner(t, tl, hw, share, opts)
        jp.run()
        plans.append(jp.plan)
        st = jp.stats()
        stats.append(st)
        peaks.append(st["peak_bytes"])
    feasible = all(s["peak_bytes"] <= s["budget_bytes"] for s in stats)
    return PlanResult(
        planner="capuchin",
        feasible=feasible,
        plans=tuple(plans),
        solve_time_s=time.perf_counter() - t0,
        options=options_dict(opts),
        stats={"peak_bytes": sum(peaks), "job_peak_bytes": peaks, "jobs": stats},
    )

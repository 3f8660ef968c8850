"""TENSILE §IV-D: after swap scheduling, recompute the accesses that swapping
never released, chosen by MSPS with Capuchin's update after each choice
(Capuchin §4.5, Algorithm 2), until the memory fits.

`Recomputer(jobs, budget, opts).run()` works on the jobs' planning
state (`job.JobPlanning`): it cuts holes into their op-grid memory and
keeps its choices; `events(j)` writes job j's out as plan events. See
NOTE [ TENSILE recompute rounds ] and NOTE [ MSPS update in TENSILE ].
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from memplan.planners.analysis import BOTH, EPS_US, msps, peak_analysis
from memplan.planners.core.plan import Event, Recompute, Release, SwapOut
from memplan.planners.heuristics.tensile.job import JobPlanning
from memplan.planners.heuristics.tensile.options import TensileOptions

# NOTE [ TENSILE recompute rounds ]
# §IV-D recomputes "tensor accesses which have never been released": a candidate is a gap,
# around a job's peak op in the iteration, of a non-persistent buffer no swap or release has
# emptied (`JobPlanning.done`): released after the access opening it, remade before the one
# closing it by a chain of <= `max_recompute_ops` ops (`msps.chain`: its producer, or all its
# writes with `recompute_in_place`, and those of its inputs then off the device). Rounds, as
# Capuchin's: peak analysis (Algorithm 1) names each job's peak op; candidates around it are
# valued by MSPS = bytes / recompute seconds (Eq. 4), the best taken, the rest updated
# (NOTE [ MSPS update in TENSILE ]), until the peaks fit the budget or no job peaks at that
# op; a round taking nothing ends the phase (the runtime safety net has the rest). A recompute
# costs memory and moves ops, so none is placed where its chain's other outputs make the
# needing op reach the job's current peak, or before an op at whose ready time a triggered
# swap-out's copy awaits its lane slot (undelayed, it could pass copies planned before it).
# Full text: docs/notes.md, "TENSILE recompute rounds".
#
# NOTE [ MSPS update in TENSILE ]
# Capuchin's Algorithm 2, with the chains rebuilt exactly instead of patched:
# - Init (lines 1-2): the other candidates are on the device, so a chain costs its own ops.
# - Choosing t takes its buffer off the device over its gap: a candidate (lines 17-21) or
#   chosen recompute (lines 6-12) whose chain read t there is rebuilt, growing by t's producer
#   and what t's chain needed.
# - A candidate c read inside its gap by chosen recomputes would lengthen their chains: that
#   actual growth is c's ext_time (lines 22-33); c is dropped if one would get no chain within
#   `max_recompute_ops`.
# - MSPS = bytes / (own chain time + ext_time); the next pick is the highest MSPS after the
#   update (ties: more bytes, then lower job, buffer, gap).
# A multi-op chain is one Recompute event making its off-device sources as temporaries, freed
# at its end: a source's own Recompute would keep it resident until its next release.
# Full text: docs/notes.md, "MSPS update in TENSILE".


@dataclass(slots=True)
class Gap:
    """Recomputing `buffer` of job `job` over one access gap: released after
    op `prev`, made again by `chain.ops` before op `nxt`. `gap` is the
    global index of the access that opens the gap (`JobPlanning.done`);
    `outputs` the chain's other writes. If this gap is chosen, the chosen
    recomputes in `ext` switch to the chains given there (they read `buffer`
    inside the gap), which costs `ext_us` more (NOTE [ MSPS update in TENSILE ])."""

    job: int
    buffer: int
    gap: int
    prev: int
    nxt: int
    chain: msps.RecomputeCandidate
    outputs: frozenset[int]
    ext: list[Ext] = field(default_factory=list)
    ext_us: float = 0.0

    @property
    def nbytes(self) -> int:
        return self.chain.saving_bytes

    @property
    def cost_us(self) -> float:
        """Recompute time this choice adds, own chain and extensions (us)."""
        return self.chain.time_us + self.ext_us

    @property
    def msps(self) -> float:
        """Memory saving per second (bytes/s); infinite for a free chain."""
        t = self.cost_us
        return math.inf if t <= 0 else self.nbytes / (t * 1e-6)

    def covers(self, op: int) -> bool:
        """Whether the buffer is off the device while `op` runs, once chosen."""
        return self.prev < op < self.nxt

    def touches(self, b: int) -> bool:
        """Whether the chain reads `b` from outside or writes it besides its buffer."""
        return b in self.chain.sources or b in self.outputs


class _Lists:
    """One job's per-buffer arrays as Python lists, for scalar look-ups."""

    def __init__(self, jb: JobPlanning):
        self.ptr = jb.table.ptr.tolist()
        self.ops = jb.table.ops.tolist()
        self.start, self.end = jb.state.start.tolist(), jb.state.end.tolist()
        self.persistent = jb.trace.persistent.tolist()


class Ext(NamedTuple):
    """A chosen recompute `r` whose chain becomes `chain` (writing
    `outputs` besides its buffer) if a candidate is chosen."""

    r: Gap
    chain: msps.RecomputeCandidate
    outputs: frozenset[int]


def order_key(g: Gap) -> tuple:
    """Sort key of the pick order: highest MSPS first; ties: more bytes,
    then lower job, buffer, gap."""
    return (-g.msps, -g.nbytes, g.job, g.buffer, g.gap)


class Recomputer:
    """The recompute phase over `jobs` (NOTE [ TENSILE recompute rounds ])."""

    def __init__(self, jobs: Sequence[JobPlanning], budget: int, opts: TensileOptions):
        self.jobs, self.budget = jobs, budget
        self.max_ops, self.in_place = opts.max_recompute_ops, opts.recompute_in_place
        self.chosen: list[Gap] = []
        # (job, buffer, before_op, MSPS in bytes/s when taken; None: a chain
        # that takes no time), in pick order
        self.picks: list[tuple[int, int, int, float | None]] = []
        self._safe: dict[tuple[int, int], bool] = {}
        self._views = [_Lists(jb) for jb in jobs]

    # ---- rounds ------------------------------------------------------------------
    def run(self) -> bool:
        """Recompute until the peak fits; whether it does."""
        while True:
            pa = peak_analysis([jb.state for jb in self.jobs])
            if pa.peak_bytes <= self.budget:
                return True
            if not self._round(pa.job_peak_op, self._candidates(pa)):
                return False

    def _candidates(self, pa) -> list[Gap]:
        out = []
        for jb in self.jobs:
            p = pa.job_peak_op[jb.j]
            if p < 0:
                continue
            t, table = jb.trace, jb.table
            for b in pa.resident[jb.j].tolist():
                if t.persistent[b] or t.nbytes[b] == 0:
                    continue
                gap = table.gap_around(b, p)
                if gap is None or gap[1] < 0 or gap[2] >= jb.n:
                    continue
                k, prev, nxt = gap
                g = int(table.ptr[b]) + k
                if jb.done[g] or not self._safe_before(jb, nxt):
                    continue
                c = self._gap(jb, b, g, prev, nxt)
                if c is not None and self._extension(c):
                    out.append(c)
        return out

    def _round(self, peak_ops: Sequence[int], pool: list[Gap]) -> bool:
        took = False
        while pool:
            tops = [int(jb.state.curve.max()) for jb in self.jobs]
            if sum(tops) <= self.budget:
                return True
            ok = [
                c
                for c in pool
                if self.jobs[c.job].state.curve[peak_ops[c.job]] >= tops[c.job]
                and self._below_peak(c, tops[c.job])
            ]
            if not ok:
                break
            best = min(ok, key=order_key)
            pool.remove(best)
            # its extensions afresh: one chosen since may have changed what they read
            if self._extension(best) and self._below_peak(best, tops[best.job]):
                self._take(best, pool)
                took = True
        return took

    # ---- chains ------------------------------------------------------------------
    def _present(self, jb: JobPlanning, s: int, x: int) -> bool:
        """Whether buffer `s` is on the device when op `x` is due, for the
        plan so far: alive then (activity analysis) and in no emptied gap
        (`AccessTable.gap_around` on lists: this is the inner loop)."""
        v = self._views[jb.j]
        persistent = v.persistent[s]
        if not persistent and not v.start[s] <= x <= v.end[s]:
            return False
        lo, hi, ops = v.ptr[s], v.ptr[s + 1], v.ops
        i = bisect.bisect_right(ops, x, lo, hi) - 1  # the last access at or before x
        if i < lo:
            gap = hi - 1 if persistent else -1  # a persistent buffer's gap wraps
        elif ops[i] == x or (i == hi - 1 and not persistent):
            gap = -1
        else:
            gap = i
        return gap < 0 or not jb.done[gap]

    def _chain(
        self, jb: JobPlanning, b: int, prev: int, nxt: int, without: int = -1
    ) -> msps.RecomputeCandidate | None:
        """The chain that makes `b` again before `nxt`, with `without` taken
        off the device too (a choice not made yet)."""
        return msps.candidate(
            jb.trace,
            jb.j,
            b,
            prev,
            nxt,
            jb.durations,
            lambda s: s != without and self._present(jb, s, nxt),
            max_ops=self.max_ops,
            in_place=self.in_place,
        )

    def _gap(self, jb: JobPlanning, b: int, g: int, prev: int, nxt: int) -> Gap | None:
        chain = self._chain(jb, b, prev, nxt)
        if chain is None:
            return None
        return Gap(jb.j, b, g, prev, nxt, chain, self._outputs(jb, chain))

    def _outputs(self, jb: JobPlanning, chain: msps.RecomputeCandidate) -> frozenset[int]:
        t = jb.trace
        out = {int(w) for k in chain.ops for w in t.op_writes(k).tolist()}
        return frozenset(out - {chain.buffer})

    def _extension(self, c: Gap) -> bool:
        """Set c's `ext`: the chosen chains that choosing c lengthens; False
        if one of them could no longer be built."""
        c.ext, c.ext_us = [], 0.0
        jb = self.jobs[c.job]
        for r in self.chosen:
            if r.job != c.job or not c.covers(r.nxt) or not r.touches(c.buffer):
                continue
            new = self._chain(jb, r.buffer, r.prev, r.nxt, without=c.buffer)
            if new is None:
                return False
            c.ext.append(Ext(r, new, self._outputs(jb, new)))
            c.ext_us += new.time_us - r.chain.time_us
        return True

    def _below_peak(self, c: Gap, top: int) -> bool:
        """Whether the temporaries c adds keep every op below `top` bytes."""
        add = {c.nxt: c.chain.temp_bytes}
        for r, new, _outputs in c.ext:
            add[r.nxt] = add.get(r.nxt, 0) + new.temp_bytes - r.chain.temp_bytes
        curve = self.jobs[c.job].state.curve
        for op, d in add.items():
            if d > 0 and int(curve[op]) - (c.nbytes if c.covers(op) else 0) + d >= top:
                return False
        return True

    def _safe_before(self, jb: JobPlanning, op: int) -> bool:
        """Whether no swap-out of the job is triggered but not started when
        `op` is ready (NOTE [ TENSILE recompute rounds ])."""
        key = (jb.j, op)
        hit = self._safe.get(key)
        if hit is None:
            t, period = jb.t_ready(op), jb.tl.period_us
            hit = True
            for ev in jb.events:
                if not isinstance(ev, SwapOut) or ev.delay_us <= 0:
                    continue
                fired = jb.t_end(ev.after_op) if ev.after_op >= 0 else 0.0
                k = math.floor((t - fired) / period)  # the repetition fired last before t
                fired += k * period
                if fired <= t + EPS_US and fired + ev.delay_us > t + EPS_US:
                    hit = False
                    break
            self._safe[key] = hit
        return hit

    # ---- a choice and the update -----------------------------------------------------
    def _take(self, t: Gap, pool: list[Gap]) -> None:
        """Choose t, then update the candidates left (NOTE [ MSPS update in TENSILE ])."""
        jb = self.jobs[t.job]
        jb.state.add_hole(t.buffer, t.prev + 1, t.nxt - 1, BOTH)
        jb.state.add_bytes(t.nxt, t.chain.temp_bytes)
        jb.done[t.gap] = True
        changed = {t.buffer} | set(t.chain.sources) | t.outputs
        for r, new, outputs in t.ext:  # chosen chains that read t now make it too
            changed |= set(r.chain.sources) | r.outputs | set(new.sources) | outputs
            jb.state.add_bytes(r.nxt, new.temp_bytes - r.chain.temp_bytes)
            r.chain, r.outputs = new, outputs
        self.picks.append((t.job, t.buffer, t.nxt, t.msps if math.isfinite(t.msps) else None))
        rebuilt = {id(e.r) for e in t.ext}
        t.ext, t.ext_us = [], 0.0
        self.chosen.append(t)
        for c in list(pool):
            if c.job != t.job:
                continue
            if t.covers(c.nxt) and c.touches(t.buffer):
                chain = self._chain(jb, c.buffer, c.prev, c.nxt)
                if chain is None:
                    pool.remove(c)
                    continue
                c.chain, c.outputs = chain, self._outputs(jb, chain)
            # an extension is stale if it concerns a rebuilt chain, or read t
            stale = c.buffer in changed or any(
                id(e.r) in rebuilt
                or (t.covers(e.r.nxt) and (t.buffer in e.chain.sources or t.buffer in e.outputs))
                for e in c.ext
            )
            if stale and not self._extension(c):
                pool.remove(c)

    # ---- read-out ------------------------------------------------------------------
    def events(self, j: int) -> list[Event]:
        """Job j's chosen recomputes as plan events."""
        out: list[Event] = []
        for g in self.chosen:
            if g.job == j:
                c = g.chain
                out += [Release(g.buffer, g.prev), Recompute(g.buffer, g.nxt, c.ops, c.restore_rng)]
        return out

    def time_us(self, j: int) -> float:
        """Job j's recompute time per iteration, as predicted (us)."""
        return sum(g.chain.time_us for g in self.chosen if g.job == j)

    def count(self, j: int) -> int:
        return sum(1 for g in self.chosen if g.job == j)

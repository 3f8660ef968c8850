"""Capuchin's phase 2 (§4.5 with Algorithm 2): each step weighs the cheapest
swap left against the recompute with the highest MSPS, whose value is updated
iteratively as recomputes are chosen."""

from __future__ import annotations

import heapq
import math
from collections.abc import Container
from typing import Protocol

import numpy as np
from memplan.planners.heuristics.capuchin.options import Candidate, CapuchinOptions, SwapSlots

# NOTE [ Capuchin recompute ]
# - Recompute (§4.4): `Release` after the evicted access, `Recompute` of its lineage before
#   the back access; the lineage is `planners.analysis.msps.chain`, up to `max_recompute_ops`
#   ops (NOTE [ What can be recomputed ] in msps.py).
# - MSPS = bytes / (rp_time + ext_time), with Algorithm 2's iterative update, applied only
#   where the chosen t is really absent over that candidate's back access, and for swapped
#   candidates too (Algorithm 2 only knows recomputes).
# - Chains are rebuilt from the final evictions when the plan is assembled; a recompute whose
#   chain can no longer be built is dropped and not tried again.
# - Recompute overhead = the chain's predicted time (+ ext_time), not fed back into the
#   timeline (Capuchin measures it in the next iteration). Full text: docs/notes.md.


class JobChoices(Protocol):
    """What phase 2 reads of one job's planner and the choices it makes on it
    (`capuchin.JobPlanner`): predicted op durations (us), which buffers are
    persistent, a candidate's lineage and swap slots."""

    opts: CapuchinOptions
    dur: np.ndarray
    persistent: list[bool]

    def lineage(
        self, b: int, x: int, assumed: Container[int] | None
    ) -> tuple[tuple[int, ...], tuple[int, ...]] | None: ...

    def swap_try(self, c: Candidate, p: int) -> SwapSlots | None: ...

    def choose_swap(self, c: Candidate, sw: SwapSlots) -> None: ...

    def choose_recompute(
        self, c: Candidate, found: tuple[tuple[int, ...], tuple[int, ...]]
    ) -> None: ...


class Hybrid:
    """Phase 2 over the candidates `pool` left at peak op `p`
    (NOTE [ Capuchin recompute ]): `run(mem_saving)` chooses swaps and
    recomputes on `planner` until the saving is reached or nothing is left."""

    def __init__(self, planner: JobChoices, pool: list[Candidate], p: int):
        self.planner, self.p = planner, p
        self.by_buf = {c.buffer: c for c in pool}
        self.users: dict[int, set[int]] = {}  # source buffer -> candidates reading it
        self.heap: list[tuple[float, int, int, int]] = []  # (-MSPS, tie, version, buffer)
        if planner.opts.recompute:
            for c in pool:
                found = planner.lineage(c.buffer, c.back, self.by_buf)
                if found is None:
                    continue
                ops, sources = found
                c.rp_us = float(planner.dur[list(ops)].sum())
                c.srcs = {s for s in sources if not planner.persistent[s]}
                for s in c.srcs:
                    self.users.setdefault(s, set()).add(c.buffer)
                heapq.heappush(self.heap, (-c.msps, c.buffer, c.version, c.buffer))
        self.swap_order = sorted(pool, key=lambda c: (-c.ft_us, c.buffer))
        self.no_swap: set[int] = set()
        self.recomps: set[int] = set()
        self.alive = set(self.by_buf)

    def run(self, mem_saving: int) -> None:
        while mem_saving > 0:
            s = self.best_swap()
            r = self.best_recompute()
            if s is None and r is None:
                return
            if s is not None and (r is None or s[1].overhead_us <= r.recompute_us):
                c, sw = s
                self.planner.choose_swap(c, sw)
                self.alive.discard(c.buffer)
                self.replace_source(c)
                mem_saving -= c.nbytes
            elif r is not None and self.take_recompute(r):
                mem_saving -= r.nbytes

    def best_recompute(self) -> Candidate | None:
        heap = self.heap
        while heap:
            _neg, _tie, ver, b = heap[0]
            c = self.by_buf[b]
            if b not in self.alive or ver != c.version or math.isinf(c.rp_us):
                heapq.heappop(heap)
                continue
            return c
        return None

    def best_swap(self) -> tuple[Candidate, SwapSlots] | None:
        for c in self.swap_order:
            if c.buffer not in self.alive or c.buffer in self.no_swap:
                continue
            sw = self.planner.swap_try(c, self.p)
            if sw is None:
                self.no_swap.add(c.buffer)
                continue
            return c, sw
        return None

    def touch(self, c: Candidate) -> None:
        c.version += 1
        if not math.isinf(c.rp_us):
            heapq.heappush(self.heap, (-c.msps, c.buffer, c.version, c.buffer))

    def replace_source(self, t: Candidate) -> None:
        """Candidates reading t over its gap now recompute from t's sources."""
        users = self.users
        for b in list(users.get(t.buffer, ())):
            cand = self.by_buf[b]
            if b not in self.alive or not t.covers(cand.back):
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
                cand.ext_us = cand.rp_us * len(users.get(b, set()) & self.recomps)
            self.touch(cand)

    def take_recompute(self, r: Candidate) -> bool:
        """Choose recomputing `r` (False if its chain cannot be built now)."""
        by_buf, users = self.by_buf, self.users
        found = self.planner.lineage(r.buffer, r.back, self.alive)  # the others are still there
        if found is None:
            r.rp_us = math.inf
            self.touch(r)
            return False
        # Algorithm 2, lines 5-15: chosen recomputes that read t now read t's sources
        ext_ct = 1
        for b in list(users.get(r.buffer, ())):
            if b in self.recomps and r.covers(by_buf[b].back):
                rp = by_buf[b]
                rp.srcs.discard(r.buffer)
                rp.srcs |= r.srcs
                users[r.buffer].discard(b)
                for x in r.srcs:
                    users.setdefault(x, set()).add(b)
                ext_ct += 1
        self.recomps.add(r.buffer)
        self.alive.discard(r.buffer)
        self.planner.choose_recompute(r, found)
        # lines 17-35: update the MSPS of the candidates left
        self.replace_source(r)
        for x in r.srcs:
            cand = by_buf.get(x)
            if cand is not None and x in self.alive and cand.covers(r.back):
                cand.ext_us = ext_ct * cand.rp_us if not math.isinf(cand.rp_us) else 0.0
                self.touch(cand)
        return True

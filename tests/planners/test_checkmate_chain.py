"""CP-SAT on Checkmate's linear chain (`traces.synthetic.checkmate_chain`):
2n + 1 ops of 1 us, op j writing buffer j (one unit, 64 MiB), op j >= 1
reading op j - 1 and backward op 2n - i reading forward op i; a copy of a
unit takes milliseconds, so only recomputation pays.

Two brute forces, sharing no code with the planner:
- `pebbling`: the rematerialisation game of Checkmate, a Dijkstra over (next
  op, resident set): an op needs its inputs and its output resident while it
  runs, any buffer may be dropped at any time, a forward buffer may be made
  again from its resident predecessor at one unit of time. Its optimum bounds
  every plan from below.
- `one_recompute`: the plans whose moves are CP-SAT's on this graph (NOTE
  [ Recompute chains ] in planners/cpsat/chains.py): a set D of forward
  buffers, each released after its forward reader and made again once, just
  before the first op that needs it -- its backward reader, or the
  recomputation of its successor (a chain) -- and resident from then on.

Budgets are in units (`UNIT` bytes each), times in units of 1 us.
"""

from __future__ import annotations

import heapq
import itertools

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Measured
from memplan.hwmodels.profile import load_hardware
from memplan.planners.core.check import check
from memplan.planners.core.plan import Recompute, Status
from memplan.planners.cpsat.planner import CpsatOptions, cpsat
from memplan.sim import Job, simulate
from memplan.traces.synthetic import checkmate_chain

UNIT = 64 << 20
TICKS_PER_UNIT = 1000  # a 1 us op, in ns


# ---- the brute forces -------------------------------------------------------------------
def _reads(n: int) -> list[tuple[int, ...]]:
    reads: list[tuple[int, ...]] = [() if j == 0 else (j - 1,) for j in range(2 * n + 1)]
    for i in range(n):
        reads[2 * n - i] = (2 * n - i - 1, i)
    return reads


def pebbling(n: int, b: int) -> int | None:
    """The fewest unit ops that run the chain in `b` units, or None."""
    reads = _reads(n)
    last = {x: k for k, r in enumerate(reads) for x in r}
    start = (0, frozenset[int]())
    dist = {start: 0}
    heap = [(0, 0, ())]
    while heap:
        cost, i, res_t = heapq.heappop(heap)
        res = frozenset(res_t)
        if dist.get((i, res), 1 << 30) < cost:
            continue
        if i == 2 * n + 1:
            return cost
        moves: list[tuple[int, int, frozenset[int]]] = []
        for x in res:  # drop a forward buffer (others cannot be made again)
            if x < n:
                moves.append((0, i, res - {x}))
        for j in range(n):  # make forward buffer j again from j - 1
            alive = last.get(j, -1) >= i
            if alive and j not in res and (j == 0 or j - 1 in res) and len(res) < b:
                moves.append((1, i, res | {j}))
        if set(reads[i]) <= res and len(res) < b:  # run op i; drop what is dead
            done = frozenset(x for x in res | {i} if last.get(x, -1) > i)
            moves.append((1, i + 1, done))
        for c, k, r in moves:
            if cost + c < dist.get((k, r), 1 << 30):
                dist[(k, r)] = cost + c
                heapq.heappush(heap, (cost + c, k, tuple(sorted(r))))
    return None


def one_recompute(n: int, b: int) -> int | None:
    """The fewest unit ops of a plan with CP-SAT's moves (module docstring)
    within `b` units, or None: every set D of droppable forward buffers
    (0..n-2; n-1 is read by the next two ops), replayed op by op."""
    reads = _reads(n)
    last = {x: k for k, r in enumerate(reads) for x in r}
    best = None
    for k in range(n):
        for drop in itertools.combinations(range(n - 1), k):
            d = set(drop)
            if best is None and _replay_peak(n, reads, last, d) <= b:
                best = 2 * n + 1 + k
        if best is not None:
            return best
    return None


def _replay_peak(n: int, reads: list[tuple[int, ...]], last: dict[int, int], d: set[int]) -> int:
    res: set[int] = set()
    peak = 0
    for i in range(2 * n + 1):
        for x in reads[i]:
            while x not in res:  # make it, and the dropped run below it, again
                y = x
                while y - 1 >= 0 and y - 1 in d and y - 1 not in res:
                    y -= 1
                res.add(y)
        peak = max(peak, len(res) + 1)
        res.add(i)
        res -= {x for x in res if last.get(x, 2 * n) <= i}
        res -= {j for j in d if j + 1 == i}  # released after its forward reader
    return peak


# The lead's table (a pebbling brute force of its own), re-derived here.
PEBBLING = {
    (4, 3): 15, (4, 4): 11, (4, 5): 10, (4, 6): 9,
    (6, 4): 18, (6, 5): 16, (6, 6): 15,
    (8, 4): 26, (8, 5): 22, (8, 6): 21,
    (10, 5): 29, (10, 6): 27, (10, 7): 26,
    (12, 5): 37, (12, 6): 33, (12, 7): 32,
}  # fmt: skip


@pytest.mark.parametrize(("n", "b"), list(PEBBLING))
def test_pebbling_brute_force_matches_the_table(n, b):
    assert pebbling(n, b) == PEBBLING[(n, b)]


@pytest.mark.parametrize("n", [4, 6, 8, 10])
def test_one_recompute_per_unit_below_the_peak_is_the_pebbling_optimum_from_b(n):
    """Every plan recomputes at least one unit per unit below the vanilla peak
    n + 2; where the pebbling optimum is that, CP-SAT's moves reach it, and
    they never beat the pebbling game."""
    for b in range(3, n + 3):
        peb, one = pebbling(n, b), one_recompute(n, b)
        assert peb is not None and peb >= 3 * n + 3 - b
        if peb == 3 * n + 3 - b:
            assert one == peb, (n, b)
        assert one is None or one >= peb
    big = (n + 2) // 2
    if n >= 8:  # Checkmate's figure
        assert one_recompute(n, big) == pebbling(n, big) == 2 * n + 1 + big


# ---- CP-SAT against them ------------------------------------------------------------------
def plan_chain(n: int, b: int, **options):
    t = checkmate_chain(n)
    device = DeviceModel(load_hardware("rtx-a6000"), Measured())
    opts = CpsatOptions(**{"hint": None, "num_workers": 2, "time_limit_s": 30.0, **options})
    return t, device, cpsat([t], device, budget_bytes=b * UNIT, options=opts)


def simulated_units(t, device, plan, b: int) -> float:
    """The simulated steady iteration in units, after `check`; no OOM."""
    check(plan, t)
    res = simulate([Job(t, plan)], device, budget=b * UNIT, iterations=3, oom="fail")
    job = res.jobs[0]
    assert not job.oom and res.peak_bytes <= b * UNIT
    return job.iteration_time_s * 1e6


@pytest.mark.parametrize("n", [4, 6, 8, 10])
def test_cpsat_finds_the_brute_force_optimum_at_every_budget(n):
    for b in range(3, n + 2):
        peb, one = pebbling(n, b), one_recompute(n, b)
        t, device, r = plan_chain(n, b)
        if one is not None:
            assert r.stats["status"] == "OPTIMAL", (n, b, r.explain())
            assert round(r.stats["iteration_time_s"] * 1e9) == one * TICKS_PER_UNIT, (n, b)
            assert simulated_units(t, device, r.plans[0], b) == pytest.approx(one, abs=1e-6)
        elif r.feasible:  # only swaps are left, thousands of op times each
            assert r.stats["iteration_time_s"] * 1e6 > 10 * peb
        else:
            assert r.status is Status.STOPPED, r.explain()


def test_chains_are_needed_at_checkmates_budget():
    # at B = (n + 2) // 2 = 5 five of the seven droppable units must go while
    # three are kept: two dropped units are adjacent, and recomputing the
    # upper one pulls the lower one along (a Recompute before an op that
    # does not read its buffer)
    n, big = 8, 5
    _, _, flat = plan_chain(n, big, chain_depth=0)
    t, device, r = plan_chain(n, big)
    assert r.stats["status"] == "OPTIMAL"
    assert round(r.stats["iteration_time_s"] * 1e9) == (2 * n + 1 + big) * TICKS_PER_UNIT
    assert not flat.feasible or flat.stats["iteration_time_s"] > r.stats["iteration_time_s"]
    reads = _reads(n)
    pulled = [
        e
        for e in r.plans[0].events
        if isinstance(e, Recompute) and e.buffer not in reads[e.before_op]
    ]
    assert pulled
    assert simulated_units(t, device, r.plans[0], big) == pytest.approx(2 * n + 1 + big, abs=1e-6)


@pytest.mark.parametrize("n", [16, 32])
def test_cpsat_proves_checkmates_optimum(n):
    big = (n + 2) // 2
    t, device, r = plan_chain(n, big)
    assert r.stats["status"] == "OPTIMAL" and r.status is Status.PLANNED
    assert round(r.stats["iteration_time_s"] * 1e9) == (2 * n + 1 + big) * TICKS_PER_UNIT
    assert r.stats["best_bound"] == r.stats["objective"]
    assert simulated_units(t, device, r.plans[0], big) == pytest.approx(2 * n + 1 + big, abs=1e-6)


def test_the_hint_comes_from_a_heuristic_that_fits():
    n, big = 16, 9
    t, device, r = plan_chain(n, big, hint="best")
    fits = r.stats["hint_fits"]
    assert r.stats["hint"].split()[0] in fits
    assert r.stats["iteration_time_s"] <= r.stats["hint_iteration_s"]
    assert round(r.stats["iteration_time_s"] * 1e9) == (2 * n + 1 + big) * TICKS_PER_UNIT

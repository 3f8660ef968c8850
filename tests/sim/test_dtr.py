"""The `dtr` OOM policy (NOTE [ DTR ] in sim/remat.py, NOTE [ DTR's scan ] in
sim/dtr.py), worked by hand: which buffer goes (least h = c / (m * s)), how
it comes back (remade by re-running producers, fetched, or swapped), what
plan events do to a dropped buffer, and the per-job figures of the net.

Hand cases use `handtraces`: MiB sizes, 1 MiB/ms both ways with no fixed
cost (a swap of n MiB costs 2n ms, a fetch n ms), op durations in ms. h is
quoted in ms per MiB per ms of staleness. The property tests check the scan
against a plain one and every remake against the trace's write history.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Measured, Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners.core.plan import Recompute, Release, SwapIn, SwapOut
from memplan.planners.heuristics.vanilla import release_only_plan
from memplan.sim import Job, LogKind, OomPolicy, simulate
from memplan.sim import model as sim_model
from memplan.sim.dtr import DtrPool
from memplan.sim.job import CompiledJob
from memplan.sim.remat import ABSENT, RematTable
from memplan.sim.state import DEV
from memplan.traces import io, synthetic
from memplan.traces.synthetic import Durations, Grain

from tests.sim.handtraces import B, Call, MiB, fmt, gpu, make
from tests.sim.test_lifetimes import check_lifetimes, run
from tests.sim.test_model import plan

K = LogKind
NET = {"drop", "discard", "evict_start", "evict_end", "fetch_start", "fetch_end", "skip"}
NET |= {"recompute_start", "recompute_end", "oom"}


def net(log) -> list[tuple]:
    """The log without op and iteration bounds: what the net (and the plan) did."""
    return [e for e in fmt(log) if e[1] in NET]


def dtr(trace, lat, budget_mib: int, plan_=None, iterations: int = 1):
    return simulate(
        [Job(trace, plan_)],
        DeviceModel(gpu(), lat),
        iterations=iterations,
        budget=budget_mib * MiB,
        oom=OomPolicy.DTR,
    )


# ---- which buffer goes -------------------------------------------------------------
def test_h_evicts_a_big_recent_cheap_buffer_before_a_small_stale_expensive_one():
    # a (1 MiB) is made by op0 (8 ms), c (4 MiB) by op1 (1 ms); op2 needs 2 MiB
    # at 9 with 5 of 6 in use. LRU would evict a (used at 0). h: a = 8 / (1 * 9)
    # = 0.89, c = 1 / (4 * 1) = 0.25: c is dropped. op3 needs c: op1 re-runs
    # 10->11 (x, read by no one, died after op2).
    t, lat = make(
        [B(1, name="a"), B(4, name="c"), B(2, name="x")],
        [Call([], [0], 8), Call([], [1]), Call([], [2]), Call([1], []), Call([0], [])],
    )
    r = dtr(t, lat, 6)
    assert net(r.log) == [
        (9.0, "drop", 2, 1),
        (10.0, "recompute_start", 1, 1),
        (11.0, "recompute_end", 1, 1),
    ]
    j = r.jobs[0]
    assert j.iteration_times_s == (0.013,)
    assert (j.evictions, j.evicted_bytes, j.passive_swaps) == (1, 4 * MiB, 0)
    assert (j.remat_s, j.recompute_s, j.stall_s) == (0.001, 0.001, 0.0)
    assert j.net_used and r.peak_bytes == 5 * MiB
    # passive evicts the LRU buffer instead: a out 9->10, fetched back 12->13
    p = simulate([t], DeviceModel(gpu(), lat), iterations=1, budget=6 * MiB, oom="passive")
    assert [e for e in net(p.log) if e[1].endswith("start")] == [
        (9.0, "evict_start", 2, 0, "lane0"),
        (12.0, "fetch_start", 4, 0, "lane0"),
    ]
    assert p.jobs[0].iteration_times_s == (0.014,)


def test_evictions_in_one_instant_go_by_h_not_by_age_or_size():
    # Three buffers made by op0-op2 and read by op4-op6; op3 needs 6 MiB at 6
    # with 6 of 8 in use, so two must go. At 6 (no neighbourhoods: nothing is
    # absent): p (1 MiB, op0 1 ms, used at 0) h = 1 / (1 * 6) = 0.17;
    # q (2 MiB, op1 4 ms, used at 1) h = 4 / (2 * 5) = 0.4;
    # w (3 MiB, op2 1 ms, used at 5) h = 1 / (3 * 1) = 0.33.
    # p goes (4 MiB needed still), then w: by age the order would be p, q;
    # by size w, q.
    t, lat = make(
        [B(1, name="p"), B(2, name="q"), B(3, name="w"), B(6, name="x")],
        [
            Call([], [0]),
            Call([], [1], 4),
            Call([], [2]),
            Call([], [3]),
            Call([0], []),
            Call([1], []),
            Call([2], []),
        ],
    )
    r = dtr(t, lat, 8)
    assert [e for e in net(r.log) if e[1] == "drop"] == [(6.0, "drop", 3, 0), (6.0, "drop", 3, 2)]
    # x died after op3 (7): p is remade 7->8 for op4, w 10->11 for op6
    assert [e for e in net(r.log) if e[1] == "recompute_start"] == [
        (7.0, "recompute_start", 0, 0),
        (10.0, "recompute_start", 2, 2),
    ]
    assert r.jobs[0].iteration_times_s == (0.012,)


def test_an_evicted_neighbourhood_makes_a_buffer_dearer():
    # op0 (3 ms) makes u; op1 (1 ms) makes q from u; op2 (1 ms) makes p; op3
    # needs 1 MiB at 5. On its own q is the better victim: 1 / (1 * 2) = 0.5
    # against p's 1 / (1 * 1) = 1. But u died after op1, so remaking q needs
    # u again: e* adds op0's 3 ms, q costs 4 / (1 * 2) = 2, and p goes. op5
    # remakes p (op2) 7->8.
    bufs = [B(1, name="u"), B(1, name="q"), B(1, name="p"), B(1, name="w")]
    ops = [Call([], [0], 3), Call([0], [1]), Call([], [2]), Call([], [3])]
    t, lat = make(bufs, [*ops, Call([1], []), Call([2], [])])
    r = dtr(t, lat, 2)
    assert net(r.log) == [
        (5.0, "drop", 3, 2),
        (7.0, "recompute_start", 2, 2),
        (8.0, "recompute_end", 2, 2),
    ]
    assert r.jobs[0].iteration_times_s == (0.009,)
    # u alive and resident (op6 reads it; budget 3): nothing is absent, q is
    # dropped (u's own h is 3 / (1 * 2) = 1.5) and remade (op1) 6->7 for op4
    t, lat = make(bufs, [*ops, Call([1], []), Call([2], []), Call([0], [])])
    r = dtr(t, lat, 3)
    assert net(r.log) == [
        (5.0, "drop", 3, 1),
        (6.0, "recompute_start", 1, 1),
        (7.0, "recompute_end", 1, 1),
    ]
    assert r.jobs[0].iteration_times_s == (0.010,)


# ---- how it comes back -------------------------------------------------------------
def test_a_chain_is_remade_recursively_and_a_dead_ancestor_dies_again():
    # a -> b -> c (2 MiB each, 1 ms each); b dies after op2, a lives to op5, c
    # to op4. op3 needs 6 MiB (the budget) at 3 with a and c resident (b is
    # dead): a (used at 1) h = 1 / (2 * 2) = 0.25; c (used at 2) costs its
    # 1 ms plus dead b's 1 ms: 2 / (2 * 1) = 1. a goes; still 2 MiB short, so
    # c goes too. op4 needs c at 4: b is absent, and a: op0 4->5, op1 5->6,
    # op2 6->7, then b's second life ends; op4 7->8, op5 (a resident) 8->9.
    t, lat = make(
        [B(2, name="a"), B(2, name="b"), B(2, name="c"), B(6, name="x")],
        [
            Call([], [0]),
            Call([0], [1]),
            Call([1], [2]),
            Call([], [3]),
            Call([2], []),
            Call([0], []),
        ],
    )
    r = dtr(t, lat, 6)
    assert net(r.log) == [
        (3.0, "drop", 3, 0),
        (3.0, "drop", 3, 2),
        (4.0, "recompute_start", 0, 0),
        (5.0, "recompute_end", 0, 0),
        (5.0, "recompute_start", 1, 1),
        (6.0, "recompute_end", 1, 1),
        (6.0, "recompute_start", 2, 2),
        (7.0, "recompute_end", 2, 2),
    ]
    j = r.jobs[0]
    assert j.iteration_times_s == (0.009,)
    assert (j.evictions, j.evicted_bytes, j.remat_s, j.recompute_s) == (2, 4 * MiB, 0.003, 0.003)
    assert [(t_ * 1e3, b // MiB) for t_, b in zip(r.memory.t_s, r.memory.bytes)][3:] == [
        (3.0, 4), (3.0, 2), (3.0, 0), (3.0, 6),  # b dies; a, c dropped; x
        (4.0, 0), (4.0, 2), (5.0, 4), (6.0, 6),  # x dies; a, b, c remade
        (7.0, 4), (8.0, 2), (9.0, 0),  # b dies again; c, a die
    ]  # fmt: skip


def test_a_buffer_with_a_host_copy_is_discarded_and_fetched():
    # i (input, 2 MiB) is read by op0, op2 and op4; budget 4 MiB. op1 needs
    # 2 MiB at 1 with i and y resident and y in use: i, an input, is swapped
    # out (1->3). op2 fetches it (4->6): its host copy stays valid. op3 needs
    # 2 MiB at 7 with z in use: i is discarded (no bytes move), and op4
    # fetches it again (8->10).
    t, lat = make(
        [B(2, "input", name="i"), B(2, name="y"), B(2, name="z"), B(2, name="v")],
        [Call([0], [1]), Call([1], [2]), Call([0], []), Call([2], [3]), Call([0], [])],
    )
    r = dtr(t, lat, 4)
    assert net(r.log) == [
        (1.0, "evict_start", 1, 0, "lane0"),
        (3.0, "evict_end", 1, 0, "lane0"),
        (4.0, "fetch_start", 2, 0, "lane0"),
        (6.0, "fetch_end", 2, 0, "lane0"),
        (7.0, "discard", 3, 0),
        (8.0, "fetch_start", 4, 0, "lane0"),
        (10.0, "fetch_end", 4, 0, "lane0"),
    ]
    j = r.jobs[0]
    assert j.iteration_times_s == (0.011,)
    assert (j.evictions, j.evicted_bytes, j.passive_swaps) == (2, 4 * MiB, 4)
    assert (j.stall_s, j.bytes_d2h, j.bytes_h2d, j.remat_s) == (0.006, 2 * MiB, 4 * MiB, 0.0)


def test_a_persistent_buffer_is_swapped_out_not_recomputed():
    # w (param) is read by op0, which makes a, and by op2. op1 needs 2 MiB at
    # 1 with w and a (in use) filling the budget: w cannot be remade, so it
    # is swapped out (1->3) and fetched for op2 (4->6).
    t, lat = make(
        [B(2, "param", name="w"), B(2, name="a"), B(2, name="b")],
        [Call([0], [1]), Call([1], [2]), Call([0, 2], [])],
    )
    assert (table(t, lat).prod[0], table(t, lat).droppable[0]) == (-1, False)
    r = dtr(t, lat, 4)
    assert net(r.log) == [
        (1.0, "evict_start", 1, 0, "lane0"),
        (3.0, "evict_end", 1, 0, "lane0"),
        (4.0, "fetch_start", 2, 0, "lane0"),
        (6.0, "fetch_end", 2, 0, "lane0"),
    ]
    j = r.jobs[0]
    assert (j.iteration_times_s, j.evictions, j.passive_swaps, j.remat_s) == ((0.007,), 1, 2, 0.0)


def test_a_multi_output_producer_brings_its_dropped_outputs_back_together():
    # op0 makes a and b (1 MiB each); op1 needs 2 MiB at 1, budget 2: a and b
    # tie (1 / (1 * 1)), a goes first (the lower id), then b. op2 needs a:
    # op0 re-runs 2->3 and b, dropped and still valid, stays: op3 finds it.
    t, lat = make(
        [B(1, name="a"), B(1, name="b"), B(2, name="x")],
        [Call([], [0, 1]), Call([], [2]), Call([0], []), Call([1], [])],
    )
    r = dtr(t, lat, 2)
    assert net(r.log) == [
        (1.0, "drop", 1, 0),
        (1.0, "drop", 1, 1),
        (2.0, "recompute_start", 0, 0),
        (3.0, "recompute_end", 0, 0),
    ]
    assert (r.jobs[0].iteration_times_s, r.jobs[0].remat_s) == ((0.005,), 0.001)


# ---- plan events meet dropped buffers ----------------------------------------------
def test_a_planned_swap_of_a_dropped_buffer_is_skipped_and_the_op_remakes_it():
    # The plan swaps a out after op1 and in after op2 for op3. Budget 3: op1
    # needs 2 MiB at 1 and a is dropped first; the swap-out finds it gone, the
    # swap-in finds no host copy (both `skip`), and op3 remakes a (op0, 3->4).
    t, lat = make(
        [B(2, name="a"), B(2, name="b")],
        [Call([], [0]), Call([], [1]), Call([1], []), Call([0], [])],
    )
    p = plan(t, SwapOut(0, 1), SwapIn(0, 2, 3))
    r = dtr(t, lat, 3, p)
    assert net(r.log) == [
        (1.0, "drop", 1, 0),
        (2.0, "skip", 1, 0),
        (3.0, "skip", 2, 0),
        (3.0, "recompute_start", 0, 0),
        (4.0, "recompute_end", 0, 0),
    ]
    j = r.jobs[0]
    assert (j.iteration_times_s, j.bytes_d2h, j.bytes_h2d) == ((0.005,), 0, 0)
    # passive swaps a out 1->3, and the plan's swap-in brings it back 5->7
    passive = simulate([Job(t, p)], DeviceModel(gpu(), lat), budget=3 * MiB, oom="passive")
    assert passive.jobs[0].iteration_times_s[0] == 0.008


def test_a_planned_recompute_remakes_a_dropped_source_first():
    # The plan releases c after op1 and recomputes it (op1) for op3. op2 needs
    # 3 MiB at 2 (budget 4): a, op1's input, is dropped. For op3 the plan's
    # chain finds a absent: a is remade (op0, 3->4), then the chain runs
    # (op1, 4->5). op4 finds a resident.
    t, lat = make(
        [B(2, name="a"), B(1, name="c"), B(3, name="d")],
        [Call([], [0]), Call([0], [1]), Call([], [2]), Call([1], []), Call([0], [])],
    )
    r = dtr(t, lat, 4, plan(t, Release(1, 1), Recompute(1, 3, (1,))))
    assert net(r.log) == [
        (2.0, "drop", 2, 0),
        (3.0, "recompute_start", 0, 0),
        (4.0, "recompute_end", 0, 0),
        (4.0, "recompute_start", 1, 1),
        (5.0, "recompute_end", 1, 1),
    ]
    j = r.jobs[0]
    assert (j.iteration_times_s, j.recompute_s, j.remat_s) == ((0.007,), 0.002, 0.001)


# ---- out of memory -----------------------------------------------------------------
def test_a_remake_that_cannot_fit_runs_out_of_memory_cleanly():
    # a (dead after op1) -> x; y (3 MiB) made by op2; op3 reads x and y: 5 MiB
    # of a 4 MiB budget. At op2 x is dropped; op3 needs x, whose remake needs
    # a again (2 MiB) beside y, in use: nothing can go, no copy is in flight:
    # out of memory at op3, allocating a. The job's memory comes back.
    t, lat = make(
        [B(2, name="a"), B(2, name="x"), B(3, name="y")],
        [Call([], [0]), Call([0], [1]), Call([], [2]), Call([1, 2], [])],
    )
    r = dtr(t, lat, 4)
    assert net(r.log) == [(2.0, "drop", 2, 1), (3.0, "oom", 3, 0)]
    j = r.jobs[0]
    assert (j.oom, j.oom_at, j.evictions) == (True, (0, 3, 0), 1)
    assert math.isnan(j.iteration_time_s) and r.memory.bytes[-1] == 0
    # below what op1 alone needs (a and x): at once, nothing evicted
    r = dtr(t, lat, 3)
    assert (r.jobs[0].oom_at, r.jobs[0].evictions, net(r.log)) == (
        (0, 1, 1),
        0,
        [(1.0, "oom", 1, 1)],
    )


# ---- what can be remade (RematTable) -------------------------------------------------
def table(trace, lat, plan_=None) -> RematTable:
    device = DeviceModel(gpu(), lat)
    return RematTable(CompiledJob(0, Job(trace, plan_), 1, device), device)


def test_what_can_be_remade_and_until_when():
    # op0 makes u (dead after op1), op1 makes q and a from u: remade from
    # nothing, whatever lives. op3 writes a in place: a can be remade before
    # op3 at the latest, enough (it dies after op3), but s = f(a), made by
    # op2 and read at op8, cannot be dropped. r comes from an RNG op: never
    # remade; v = f(r) can, while r lives (to op8). g = f(w), w a param that
    # op7 updates: remakeable up to op7, read at op8: not droppable.
    t, lat = make(
        [B(1, name="u"), B(1, name="q"), B(1, name="a"), B(1, name="s"), B(1, name="r")]
        + [B(1, name="v"), B(1, "param", name="w"), B(1, name="g")],
        [
            Call([], [0]),
            Call([0], [1, 2]),
            Call([2], [3]),
            Call([2], [2]),
            Call([], [4], rng=True),
            Call([4], [5]),
            Call([6], [7]),
            Call([6], [6], phase="optimizer"),
            Call([1, 3, 4, 5, 7], []),
        ],
    )
    tb = table(t, lat)
    never = 1 << 62
    assert tb.prod == [0, 1, 1, 2, -1, 5, -1, 6]
    assert tb.limit == [never, never, 3, 3, -1, 8, -1, 7]
    assert tb.droppable == [True, True, True, False, False, True, False, False]
    assert tb.remakeable(3, 3) and not tb.remakeable(3, 4) and not tb.remakeable(4, 0)
    # a plan that releases r after op5 (with a host copy or not: the table
    # cannot tell) leaves v remakeable only until op5
    tb = table(t, lat, plan(t, Release(4, 5)))
    assert (tb.limit[5], tb.droppable[5]) == (5, False)


# ---- independent checks: the scan against a plain one, remakes against history ----
CHECKED: list[int] = []  # choices checked by CheckedDtrPool, per run


def plain_e_star(s, t: RematTable, b: int) -> float:
    """DTR's e* of `b` by closure first, then costs: the absent buffers that
    remaking `b` reaches through absent remakeable ones without a host copy;
    each reached host copy costs its fetch, each distinct producer its run."""
    reads = s.c.trace.op_reads
    closure: set[int] = set()
    todo = [int(z) for z in reads(t.prod[b])]
    while todo:
        z = todo.pop()
        if z in closure or s.where[z] not in ABSENT:
            continue
        closure.add(z)
        if not s.host[z] and t.prod[z] >= 0:
            todo.extend(int(y) for y in reads(t.prod[z]))
    fetched = sum(t.fetch[z] for z in closure if s.host[z])
    producers = {t.prod[z]: t.redo[z] for z in closure if not s.host[z] and t.prod[z] >= 0}
    producers.pop(t.prod[b], None)
    return fetched + sum(producers.values())


def plain_candidates(pool: DtrPool) -> list[tuple[float, int, float, int]]:
    """(h, job, last use, buffer) of every buffer the pool may evict now."""
    out = []
    now = pool.env.now
    for j, s in enumerate(pool.jobs):
        t = pool.tables[j]
        for b, w in enumerate(s.where):
            m = s.c.nbytes[b]
            if w != DEV or not m or b in s.pinned:
                continue
            if not s.alive[b]:
                c = t.swap[b]
            elif s.host[b]:
                c = t.fetch[b]
            elif t.droppable[b]:
                c = t.redo[b] + plain_e_star(s, t, b)
            else:
                c = t.swap[b]
            age = max(now - s.last_use[b], 1e-3)
            out.append((c / (m * age), j, s.last_use[b], b))
    return out


class CheckedDtrPool(DtrPool):
    """`DtrPool` whose every choice is checked against `plain_candidates`."""

    def victim(self):
        got = super().victim()
        every = plain_candidates(self)
        if got is None:
            assert not every
            return got
        mine = next(c for c in every if (c[1], c[3]) == got)
        # the least h (to rounding: the pool divides per-byte costs), and
        # among equal h the lower job, then the staler, then the lower id
        assert math.isclose(mine[0], min(every)[0], rel_tol=1e-12), (mine, min(every))
        # (h equal to rounding but not exactly: the strictly smaller one may win
        # the tie, as 5.423809664857383e-09 beat ...385 of a staler buffer)
        ties = [c for c in every if math.isclose(c[0], mine[0], rel_tol=1e-12)]
        first = min(ties, key=lambda c: c[1:])
        assert mine[1:] == first[1:] or mine[0] < first[0], (mine, first)
        CHECKED[-1] += 1
        return got


@pytest.fixture
def checked(monkeypatch):
    monkeypatch.setitem(sim_model.POOLS, OomPolicy.DTR, CheckedDtrPool)
    CHECKED.append(0)
    return CHECKED


def check_remakes(result) -> int:
    """Every re-run op (all of them `dtr` remakes under a plan without
    Recompute) is pure -- no RNG, it writes only what it creates -- and its
    inputs and the buffer it remakes hold the values they had when it ran:
    no op wrote them since. Returns how many there were."""
    n = 0
    for j, trace in enumerate(result.traces):
        created = trace.created_at.tolist()
        version = [0] * trace.n_buffers
        ran: dict[int, tuple[dict[int, int], dict[int, int]]] = {}
        for e in result.log:
            if e.job != j:
                continue
            if e.kind is K.ITER_START:
                ran = {}
            elif e.kind is K.OP_START:
                writes = trace.op_writes(e.op).tolist()
                for w in writes:
                    version[w] += 1
                reads = trace.op_reads(e.op).tolist()
                ran[e.op] = ({z: version[z] for z in reads}, {w: version[w] for w in writes})
            elif e.kind is K.RECOMPUTE_START:
                k, x = e.op, e.buffer
                assert not trace.ops[k].rng
                assert all(created[w] == k for w in trace.op_writes(k).tolist())
                read_then, wrote_then = ran[k]  # it ran earlier in this iteration
                assert all(version[z] == v for z, v in read_then.items()), (k, x)
                assert version[x] == wrote_then[x], (k, x)
                n += 1
    return n


A6000 = load_hardware("rtx-a6000")


def shipped(name: str):
    return io.load(f"zoo:{name}")


def test_a_vanilla_step_that_fail_cannot_run_completes_under_dtr(checked):
    # resnet50 at 50% of its liveness peak, two iterations: `fail` runs out of
    # memory; `dtr` runs every op of both iterations, within the budget, with
    # every choice the plain scan's, every remake valid, the memory conserved
    t = shipped("resnet50")
    device = DeviceModel(A6000, Roofline())
    budget = int(t.peak("liveness")[0] * 0.5)
    assert simulate([t], device, iterations=2, budget=budget).oom
    p = run([Job(t)], A6000, Roofline(), iterations=2, budget=budget, oom="dtr")
    r, j = p.result, p.result.jobs[0]
    assert not j.oom and r.peak_bytes <= budget
    assert sum(e.kind is K.OP_END for e in r.log) == 2 * t.n_ops
    assert j.net_used and j.evictions > 0 and j.evicted_bytes > 0
    assert j.evictions == sum(e.kind in (K.DROP, K.DISCARD, K.EVICT_END) for e in r.log)
    assert check_remakes(r) > 0 and 0 < j.remat_s == j.recompute_s
    assert checked[-1] > 0
    check_lifetimes(p)


def test_dtr_is_deterministic():
    # two resnet50 jobs, the second 5 ms later, in 60% of one job's peak
    # twice over: two runs, and a run on freshly loaded traces, agree exactly
    t = shipped("resnet50")
    device = DeviceModel(A6000, Roofline())
    budget = int(t.peak("liveness")[0] * 1.2)

    def once(trace):
        jobs = [Job(trace, release_only_plan(trace)), Job(trace, arrival_s=0.005)]
        return simulate(jobs, device, iterations=2, budget=budget, oom="dtr")

    a, b, c = once(t), once(t), once(shipped("resnet50"))
    assert sum(j.evictions for j in a.jobs) > 0
    for other in (b, c):
        assert other.log == a.log
        assert other.to_dict() == a.to_dict()
        assert (other.memory.bytes == a.memory.bytes).all()


def test_with_room_enough_dtr_never_acts():
    t = shipped("resnet50")
    device = DeviceModel(A6000, Roofline())
    fail = simulate([t], device, iterations=2)
    r = simulate([t], device, iterations=2, budget=fail.peak_bytes, oom="dtr")
    assert not r.jobs[0].net_used and r.log == fail.log


V100 = load_hardware("v100-sxm2-16gb")


def test_random_steps_under_dtr(checked):
    # random steps (dropout: RNG outputs; release_only: plan releases), a
    # budget from 20% of the vanilla peak to all of it: the memory is
    # conserved, the budget holds, every remake is valid, every choice the
    # plain scan's -- and with room enough the net never acts
    acted = {"remakes": 0, "completed under pressure": 0}

    @settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(
        n_ops=st.integers(8, 60),
        seed=st.integers(0, 2**32 - 1),
        dropout=st.booleans(),
        released=st.booleans(),
        share=st.floats(0.2, 1.0),
    )
    def prop(n_ops, seed, dropout, released, share):
        t = synthetic.random_dag(
            n_ops, seed=seed, dropout=dropout, durations=Durations(Grain.MS, 1, 9)
        )
        plan_ = release_only_plan(t) if released else None
        vanilla = simulate([Job(t, plan_)], DeviceModel(V100, Measured()), iterations=2)
        budget = max(1, int(vanilla.peak_bytes * share))
        p = run([Job(t, plan_)], V100, Measured(), iterations=2, budget=budget, oom="dtr")
        j = p.result.jobs[0]
        if p.samples:  # (an OOM at the job's start allocates nothing)
            check_lifetimes(p)
        acted["remakes"] += check_remakes(p.result)
        assert p.result.peak_bytes <= budget
        if not j.oom:
            assert all(math.isfinite(x) for x in j.iteration_times_s)
            acted["completed under pressure"] += j.evictions > 0
        if budget >= vanilla.peak_bytes:
            assert not j.net_used

    prop()
    assert min(acted.values()) > 0 and checked[-1] > 0, acted

"""Plan semantics in one core: `OpTable` and `IndexedPlan` on hand-worked
traces, and the one rule for duplicate events (NOTE [ Duplicate events ])
as the checker, the simulator, the replay's schedule and the op-grid memory
apply it."""

from __future__ import annotations

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners import registry
from memplan.planners.analysis import memory_of_plan, predict_timeline
from memplan.planners.analysis.queued import queued_peak
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Plan, Recompute, Release, SwapIn, SwapOut, fingerprint_of
from memplan.planners.core.semantics import IndexedPlan, OpTable, Recomputation
from memplan.sim import Job, simulate
from memplan.traces import synthetic
from memplan.validate.replay.schedule import build_schedule

from tests.sim.handtraces import B, Call, MiB, fmt, gpu, make


def plan(t, *events) -> Plan:
    return Plan(fingerprint_of(t), events)


# x (1 MiB input) and w (1 MiB param) -> op0 -> h (2); op1 (draws random
# numbers) h -> y (1); op2 y -> g (1); op3 reads h and g and updates w.
# u (4 MiB input) is read by no op (the framework frees it after op 0).
def step():
    return make(
        [B(1, "input"), B(1, "param"), B(2), B(1), B(1), B(4, "input", freed_after=0)],
        [
            Call([0, 1], [2]),
            Call([2], [3], rng=True),
            Call([3], [4]),
            Call([2, 4], [1], phase="optimizer"),
        ],
    )


def test_op_table_of_a_hand_trace():
    t, _ = step()
    tab = OpTable.of(t)
    assert tab is OpTable.of(t)  # built once per trace
    assert tab.n_ops == 4
    assert tab.accesses == ((0, 1, 2), (2, 3), (3, 4), (1, 2, 4))
    assert tab.creates == ((2,), (3,), (4,), ())
    assert tab.need == ((0, 1), (2,), (3,), (1, 2, 4))
    assert tab.create_bytes == (2 * MiB, MiB, MiB, 0)
    assert tab.writes == ((2,), (3,), (4,), (1,))
    # x after its last use, u where the trace says, y after op2, h and g after op3
    assert tab.frees == ((0, 5), (), (3,), (2, 4))
    assert (tab.persistent, tab.inputs) == ((1,), (0, 5))


def test_an_op_table_holds_one_object_per_buffer_id():
    """NOTE [ One object per buffer id ]: every access, creation, write and
    free of a buffer in the table is the same int object."""
    t = synthetic.sized(600, seed=0, family=synthetic.Family.RESIDUAL)
    table = OpTable.of(t)
    fields = (table.accesses, table.need, table.creates, table.writes, table.frees)
    seen: dict[int, int] = {}  # buffer id -> id() of its object
    n = 0
    for per_op in fields:
        for ids in per_op:
            for b in ids:
                n += 1
                assert seen.setdefault(b, id(b)) == id(b), b
    for b in table.persistent + table.inputs:
        assert seen.setdefault(b, id(b)) == id(b), b
    assert n > 5 * t.n_ops and len(seen) == t.n_buffers


def test_an_op_table_holds_one_object_per_size():
    """NOTE [ One object per buffer id ]: `nbytes` and `create_bytes` are the
    trace's sizes, equal values the same int object in both."""
    t = synthetic.sized(600, seed=0, family=synthetic.Family.RESIDUAL)
    table = OpTable.of(t)
    assert table.nbytes == tuple(t.nbytes.tolist())
    for i, made in enumerate(table.creates):
        assert table.create_bytes[i] == sum(int(t.nbytes[b]) for b in made)
    seen: dict[int, int] = {}  # size -> id() of its object
    for x in table.nbytes + table.create_bytes:
        assert seen.setdefault(x, id(x)) == id(x), x
    big = [x for x in seen if x > 256]  # CPython shares small ints anyway
    assert len(big) >= 2 and len(table.nbytes) > 10 * len(seen)


def test_an_op_table_shares_kind_size_pairs_and_writes_that_are_creations():
    """NOTE [ Fewer streams per op ]: `kind_bytes` is the trace's (kind,
    size) per buffer, one object per distinct pair; `writes[i]` is the
    trace's writes of op i, the very tuple `creates[i]` when they are equal."""
    t = synthetic.sized(600, seed=0, family=synthetic.Family.RESIDUAL)
    table = OpTable.of(t)
    assert table.kind_bytes == tuple(zip(t.kind_index.tolist(), t.nbytes.tolist()))
    assert len({id(p) for p in table.kind_bytes}) == len(set(table.kind_bytes)) < 20
    shared = 0
    for i in range(t.n_ops):
        w = table.writes[i]
        assert w == tuple(int(b) for b in t.op_writes(i))
        if w and w == table.creates[i]:
            assert w is table.creates[i]
            shared += 1
    assert shared > t.n_ops // 2


def test_indexed_plan_groups_events_by_trigger_in_plan_order():
    t, _ = step()
    events = (
        SwapOut(2, 1),  # 0
        Release(5, -1),  # 1: an input released at the start is never loaded
        SwapIn(2, 1, 3),  # 2
        Recompute(4, 3, (1, 2), restore_rng=True),  # 3
        Release(3, 1),  # 4
        SwapOut(1, -1),  # 5: a parameter, at the start
    )
    p = plan(t, *events)
    ip = IndexedPlan.of(p, t)
    assert ip.triggered == (
        ((5, events[5]),),
        (),
        ((0, events[0]), (2, events[2]), (4, events[4])),
        (),
        (),
    )
    assert ip.unloaded == ((1, events[1]),)
    assert ip.inputs == (0,)
    assert ip.start_events() == ((1, events[1]), (5, events[5]))
    # op1 re-reads h from outside the chain; op2's y comes from op1
    assert ip.recompute == {
        (4, 3): Recomputation(3, events[3], ((1, (2,)), (2, ())), (3,)),
    }
    assert (ip.recompute_ops, ip.rng_ops) == ({1, 2}, {1})


def test_vanilla_plan_indexes_to_nothing():
    t, _ = step()
    ip = IndexedPlan.of(plan(t), t)
    assert ip.triggered == ((),) * 5
    assert (ip.unloaded, ip.inputs, ip.recompute) == ((), (0, 5), {})
    assert ip.start_events() == ()


# ---- NOTE [ Duplicate events ] ------------------------------------------------------
# a (2 MiB) is made by op0 and read by op3 (ops 1 and 2 make 1 MiB each).
def chain():
    return make(
        [B(2), B(1, freed_after=3), B(1)],
        [Call([], [0], 1), Call([], [1], 3), Call([], [2], 3), Call([0], [], 1)],
    )


TWICE = (
    "events[2] (recompute of buffer 0): a second recompute of buffer 0 before op 3 (also events[1])"
)


def test_a_second_recompute_before_one_op_is_rejected_everywhere():
    t, lat = chain()
    p = plan(t, Release(0, 0), Recompute(0, 3, (0,)), Recompute(0, 3, (0,)))
    dev = DeviceModel(gpu(), lat)
    for index in (
        lambda: IndexedPlan.of(p, t),
        lambda: check(p, t),
        lambda: simulate([Job(t, p)], dev),
        lambda: simulate([Job(t, p)], dev, check=False),  # was: the last one won
        lambda: build_schedule(p, t),  # was: the last one won
        lambda: memory_of_plan(t, predict_timeline(t, dev), p, dev),
    ):
        with pytest.raises(PlanError) as e:
            index()
        assert str(e.value) == TWICE


def test_recomputes_of_one_buffer_before_different_ops_are_independent():
    t, _ = make([B(1), B(1)], [Call([], [0]), Call([0], [1]), Call([1], []), Call([0, 1], [])])
    p = plan(t, Release(0, 0), Recompute(0, 1, (0,)), Release(0, 1), Recompute(0, 3, (0,)))
    check(p, t)
    assert sorted(IndexedPlan.of(p, t).recompute) == [(0, 1), (0, 3)]


def test_a_repeated_swap_out_finds_its_buffer_gone():
    # applied in plan order: the second swap-out of a finds it leaving, the
    # simulator skips it, the checker rejects it
    t, lat = chain()
    p = plan(t, SwapOut(0, 0), SwapOut(0, 0), SwapIn(0, 1, 3))
    assert [ev for _e, ev in IndexedPlan.of(p, t).triggered[1]] == list(p.events[:2])
    with pytest.raises(PlanError) as e:
        check(p, t)
    assert str(e.value) == (
        "iteration 0, after op 0: events[1] (swap_out of buffer 0): buffer 0 is not on the "
        "device (swapped out after op 0 of iteration 0 by events[0])"
    )
    r = simulate([Job(t, p)], DeviceModel(gpu(), lat), iterations=1, check=False)
    assert fmt(r.log)[:6] == [
        (0.0, "iter_start", -1, -1),
        (0.0, "op_start", 0, -1),
        (1.0, "op_end", 0, -1),
        (1.0, "skip", 0, 0),
        (1.0, "op_start", 1, -1),
        (1.0, "swap_out_start", 0, 0, "lane0"),
    ]
    assert (r.jobs[0].bytes_d2h, r.jobs[0].bytes_h2d) == (2 * MiB, 2 * MiB)
    assert build_schedule(p, t).after[1] == p.events[:2]


def test_a_repeated_swap_in_waits_for_the_one_copy():
    t, lat = chain()
    p = plan(t, SwapOut(0, 0), SwapIn(0, 1, 3), SwapIn(0, 1, 3))
    check(p, t)
    r = simulate([Job(t, p)], DeviceModel(gpu(), lat), iterations=1)
    assert (r.jobs[0].bytes_d2h, r.jobs[0].bytes_h2d, r.jobs[0].stall_s) == (2 * MiB, 2 * MiB, 0)


def test_an_input_released_at_the_start_is_never_loaded():
    t, lat = step()
    dev = DeviceModel(gpu(), lat)
    p = plan(t, Release(5, -1))
    check(p, t)
    vanilla = simulate([t], dev, iterations=1)
    r = simulate([Job(t, p)], dev, iterations=1)
    # op0 holds x, w, h and u; without u the peak is op2's w, h, y and g
    assert (vanilla.jobs[0].peak_bytes, r.jobs[0].peak_bytes) == (8 * MiB, 5 * MiB)
    assert "release" not in {e[1] for e in fmt(r.log)}  # not an event: u is not loaded
    # the replay loads every input, then applies the release with the start's events
    assert build_schedule(p, t).after[0] == (Release(5, -1),)
    # a second release of u: the checker finds it gone, the simulator loads nothing
    twice = plan(t, Release(5, -1), Release(5, -1))
    with pytest.raises(PlanError, match=r"events\[1\] \(release of buffer 5\): buffer 5 is not on"):
        check(twice, t)
    r2 = simulate([Job(t, twice)], dev, iterations=1, check=False)
    assert r2.jobs[0].peak_bytes == r.jobs[0].peak_bytes


# ---- the queued peak ---------------------------------------------------------------
# a (2) by op0, c (2) by op1, x (1) by op2 (1.5 ms; the framework frees it
# after op4), d (3) by op3, e (2) by op4 from d; op5 reads a, c and e. a and
# c are swapped out after they are made and back after op4. On one FIFO lane
# a copies out 1->3 and c waits for it: 3->5, so c is still on the device
# when op4 (4.5-5.5) makes e.
def queue():
    return make(
        [B(2), B(2), B(1, freed_after=4), B(3), B(2)],
        [
            Call([], [0]),
            Call([], [1]),
            Call([], [2], 1.5),
            Call([], [3]),
            Call([3], [4]),
            Call([0, 1, 4], []),
        ],
    )


def test_queued_peak_counts_a_copy_waiting_for_the_lane():
    t, lat = queue()
    dev = DeviceModel(gpu(), lat)
    tl = predict_timeline(t, dev)
    swaps = (SwapOut(0, 0), SwapOut(1, 1), SwapIn(0, 4, 5), SwapIn(1, 4, 5))
    # op4: c (its copy ends at 5), x, d and e; the vanilla peak: a + c + x + d + e
    assert queued_peak(t, tl, plan(t, *swaps), dev) == 8 * MiB
    assert t.peak()[0] == queued_peak(t, tl, plan(t), dev) == 10 * MiB
    # x released after its last use: op4 holds c, d and e
    p = plan(t, *swaps, Release(2, 2))
    check(p, t)
    assert queued_peak(t, tl, p, dev) == 7 * MiB
    assert simulate([Job(t, p)], dev).peak_bytes == 7 * MiB


def test_queued_peak_is_the_simulators_peak_on_vdnn_plans():
    """The queue replays what the simulator does with one job on one lane: on
    vDNN's plans for random steps the two peaks are the same byte count."""
    dev = DeviceModel(load_hardware("rtx-a6000"), Roofline())
    compared = 0
    for seed in range(12):
        t = synthetic.random_dag(50, seed=seed)
        res = registry.run("vdnn", [t], dev)
        if not res.plans or not res.plans[0].events:
            continue
        p = res.plans[0]
        sim_peak = simulate([Job(t, p)], dev, context_reserve=0).jobs[0].peak_bytes
        assert queued_peak(t, predict_timeline(t, dev), p, dev) == sim_peak, seed
        compared += 1
    assert compared >= 6


def test_queued_peak_models_swaps_and_releases_only():
    t, lat = queue()
    dev = DeviceModel(gpu(), lat)
    tl = predict_timeline(t, dev)
    with pytest.raises(ValueError, match=r"recomputes are not modelled \(events\[1\]\)"):
        queued_peak(t, tl, plan(t, Release(0, 0), Recompute(0, 5, (0,))), dev)
    with pytest.raises(ValueError, match=r"delayed copies are not modelled \(events\[0\]\)"):
        queued_peak(t, tl, plan(t, SwapOut(0, 0, 100.0), SwapIn(0, 4, 5)), dev)


def test_an_event_valid_for_one_trace_is_checked_again_for_another():
    # NOTE [ Events validated once ]: what a trace remembers is its own
    from memplan.planners.core.plan import validate

    t, _ = step()
    small, _ = make([B(1, "input"), B(1)], [Call([0], [1])])
    ev = SwapIn(3, 1, 3)  # y: fine on `step`; `small` has no buffer 3
    validate(plan(t, ev), t)
    validate(plan(t, ev), t)  # remembered
    with pytest.raises(PlanError, match=r"unknown buffer 3"):
        validate(plan(small, ev), small)
    bad = SwapIn(3, 2, 1)  # after_op not before before_op: refused every time
    for _ in range(2):
        with pytest.raises(PlanError, match=r"after_op 2 is not before before_op 1"):
            validate(plan(t, bad), t)

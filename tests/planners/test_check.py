"""The static checker: plans that keep every op's data pass; each way of
losing data is a `PlanError` naming iteration, op or event, buffer and reason."""

from __future__ import annotations

import pytest
from memplan.planners.core.check import check
from memplan.planners.core.errors import PlanError
from memplan.planners.core.plan import Plan, Recompute, Release, SwapIn, SwapOut
from memplan.planners.heuristics.vanilla import release_only_plan, vanilla_plan
from memplan.traces import synthetic
from memplan.traces.io import fingerprint

from tests.sim.handtraces import B, Call, make
from tests.sim.test_model import param_step, swap_chain


def plan(t, *events):
    return Plan(fingerprint(t), events)


def test_good_plans_pass():
    t, _ = swap_chain()
    check(plan(t, SwapOut(0, 0), SwapIn(0, 1, 3)), t)
    check(plan(t, SwapOut(0, 0, 500.0), SwapIn(0, 2, 3)), t)  # late: a stall, not an error
    t, _ = param_step()
    check(plan(t, SwapOut(0, 2), SwapIn(0, 4, 0, next_iteration=True)), t)


def test_read_of_a_swapped_out_buffer():
    t, _ = swap_chain()
    with pytest.raises(PlanError) as e:
        check(plan(t, SwapOut(0, 0)), t)
    assert str(e.value) == (
        "iteration 0, op 3 (aten.op3.default): reads buffer 0, which is absent "
        "(swapped out after op 0 of iteration 0 by events[0]) and not swapped in or "
        "recomputed before it"
    )


def test_read_of_a_released_buffer():
    t, _ = swap_chain()
    with pytest.raises(PlanError, match=r"op 3 .*reads buffer 0, which is absent \(released after op 1 of iteration 0 by events\[0\]\)"):  # fmt: skip
        check(plan(t, Release(0, 1)), t)


def test_swap_in_needs_a_host_copy():
    t, _ = swap_chain()
    with pytest.raises(PlanError) as e:
        check(plan(t, Release(0, 0), SwapIn(0, 1, 3)), t)
    assert str(e.value) == (
        "iteration 0, after op 1: events[1] (swap_in of buffer 0): no host copy to read "
        "(released after op 0 of iteration 0 by events[0], with no swap-out since it was "
        "last written)"
    )


def test_host_copy_survives_until_a_write():
    # a: written by op0, read by op2 and op4, updated in place by op3 (ops 5, 6 pad)
    t, _ = make(
        [B(2), B(1)],
        [Call([], [0]), Call([], [1]), Call([0], []), Call([0], [0]), Call([0, 1], [])],
    )
    # out, in, then out again without a copy in between: the first host copy is reused
    check(plan(t, SwapOut(0, 0), SwapIn(0, 1, 2), Release(0, 2), SwapIn(0, 2, 3)), t)
    # after op3's write the host copy is stale
    with pytest.raises(PlanError, match=r"after op 3: events\[3\] \(swap_in of buffer 0\): no host copy"):  # fmt: skip
        check(plan(t, SwapOut(0, 0), SwapIn(0, 1, 2), Release(0, 3), SwapIn(0, 3, 4)), t)


def test_events_on_absent_or_dead_buffers():
    t, _ = swap_chain()
    with pytest.raises(PlanError, match=r"events\[1\] \(release of buffer 0\): buffer 0 is not on the device \(swapped out"):  # fmt: skip
        check(plan(t, SwapOut(0, 0), Release(0, 1)), t)
    with pytest.raises(PlanError, match=r"after the start of the iteration: events\[0\] \(swap_out of buffer 0\): buffer 0 is not alive then \(created by op 0"):  # fmt: skip
        check(plan(t, SwapOut(0, -1)), t)
    # buffer 2 is freed by the framework after op 2 (its last access)
    with pytest.raises(PlanError, match=r"events\[0\] \(swap_out of buffer 2\): buffer 2 is not alive then \(created by op 2, freed by the framework after op 2\)"):  # fmt: skip
        check(plan(t, SwapOut(2, 3)), t)


def test_cross_iteration_swap_must_come_back():
    # iteration 0 starts with p resident; iteration 1 finds it on the host
    t, _ = param_step()
    with pytest.raises(PlanError) as e:
        check(plan(t, SwapOut(0, 2)), t)
    assert str(e.value).startswith(
        "iteration 1, op 0 (aten.op0.default): reads buffer 0, which is absent "
        "(swapped out after op 2 of iteration 0 by events[0])"
    )
    # op0 is the first op: only a swap-in triggered in the previous iteration serves it
    check(plan(t, SwapOut(0, 2), SwapIn(0, 3, 0, next_iteration=True)), t)


def recompute_trace():
    # x (input) -> op0 -> a -> op1 (rng) -> b -> op2 -> c; op3 reads a, b, c
    return make(
        [B(1, "input", freed_after=3), B(2), B(1), B(1)],
        [Call([0], [1]), Call([1], [2], rng=True), Call([2], [3]), Call([1, 2, 3], [])],
    )[0]


def test_recompute_restores_a_released_buffer():
    t = recompute_trace()
    check(plan(t, Release(1, 1), Recompute(1, 3, (0,))), t)
    # without the recompute, op 3 reads a released buffer
    with pytest.raises(PlanError, match="op 3 .*reads buffer 1, which is absent"):
        check(plan(t, Release(1, 1)), t)


def test_recompute_sources_must_be_present():
    t = recompute_trace()
    with pytest.raises(PlanError) as e:
        check(plan(t, Release(0, 0), Release(1, 1), Recompute(1, 3, (0,))), t)
    assert str(e.value) == (
        "iteration 0, op 3: recompute of buffer 1 needs buffer 0, which is absent "
        "(released after op 0 of iteration 0 by events[0]) and not recomputed before op 3"
    )


def test_collective_recompute():
    # b is recomputed from a, which is itself recomputed before the same op
    t = recompute_trace()
    check(
        plan(
            t,
            Release(1, 2),
            Release(2, 2),
            Recompute(2, 3, (1,), restore_rng=True),
            Recompute(1, 3, (0,)),
        ),
        t,
    )


def test_recompute_of_rng_ops_needs_restore():
    t = recompute_trace()
    with pytest.raises(PlanError) as e:
        check(plan(t, Release(2, 2), Recompute(2, 3, (1,))), t)
    assert str(e.value) == (
        "events[1] (recompute of buffer 2 before op 3): op 1 (aten.op1.default) consumes "
        "RNG state; recomputing it changes the result unless restore_rng is set"
    )
    check(plan(t, Release(2, 2), Recompute(2, 3, (1,), restore_rng=True)), t)


def test_recompute_source_overwritten_in_place():
    # op2 updates a in place after op1 made b from it: recomputing b by
    # re-running op1 before op4 would read the updated a.
    t, _ = make(
        [B(1, "input", freed_after=4), B(2), B(1), B(1)],
        [Call([0], [1]), Call([1], [2]), Call([1], [1]), Call([2], [3]), Call([2, 3], [])],
    )
    with pytest.raises(PlanError, match=r"source buffer 1 read by op 1 is overwritten by op 2 \(aten.op2.default\) before op 4"):  # fmt: skip
        check(plan(t, Release(2, 3), Recompute(2, 4, (1,))), t)


def test_a_chain_makes_every_write_of_its_buffer():
    # NOTE [ A chain makes every write ]: op1 makes b (empty_like), op2 fills
    # it in place (bernoulli_), op3 reads it. Re-running op1 alone before op3
    # would give back the empty b, not the filled one.
    t, _ = make(
        [B(1, "input", freed_after=3), B(1), B(1)],
        [Call([0], [1]), Call([], [1], rng=True), Call([1], [2]), Call([0, 1, 2], [])],
    )
    with pytest.raises(PlanError) as e:
        check(plan(t, Release(1, 2), Recompute(1, 3, (0,))), t)
    assert str(e.value) == (
        "events[1] (recompute of buffer 1 before op 3): op 1 (aten.op1.default) writes "
        "buffer 1 after op 0 and is not in the chain; the recomputed value would differ"
    )
    check(plan(t, Release(1, 2), Recompute(1, 3, (0, 1), restore_rng=True)), t)


@pytest.mark.parametrize("seed", range(6))
def test_baselines_pass_on_random_steps(seed):
    t = synthetic.random_dag(80 + 10 * seed, seed=seed, dropout=seed % 2 == 0)
    check(vanilla_plan(t), t)
    check(release_only_plan(t), t)


def test_wrong_trace():
    t, _ = swap_chain()
    other = recompute_trace()
    with pytest.raises(PlanError, match="made for trace"):
        check(plan(t), other)


def test_the_replay_stops_when_an_iteration_ends_where_it_began(monkeypatch):
    # a plan that leaves every buffer as iteration 0 found it is replayed once;
    # with a cross-iteration swap-in (the weight starts iteration 1 off the
    # device) until the persistent state repeats: iterations 0 and 1
    from memplan.planners.core import check as checker

    runs = []
    real = checker._Replay._iteration
    monkeypatch.setattr(
        checker._Replay, "_iteration", lambda self: (runs.append(self.it), real(self))
    )
    t, _ = swap_chain()
    check(plan(t, SwapOut(0, 0), SwapIn(0, 1, 3)), t)
    assert runs == [0]
    runs.clear()
    t, _ = param_step()
    check(plan(t, SwapOut(0, 2), SwapIn(0, 4, 0, next_iteration=True)), t)
    assert runs == [0, 1]

"""Update groups (NOTE [ Update groups ] in traces/updates.py): the optimizer
step split by the buffers it writes, worked out by hand on tiny steps and
checked on a shipped Adam trace."""

from __future__ import annotations

from pathlib import Path

from memplan.traces import io
from memplan.traces.updates import UpdateGroup, update_groups

from tests.sim.handtraces import B, Call, make

ROOT = Path(__file__).resolve().parents[2]

# x, two parameters, their gradients and Adam-like moments, a learning rate
# every update reads, a temporary and an activation
BUFS = [
    B(1, "input"),
    B(2, "param"),
    B(3, "param"),
    B(2, "grad"),
    B(3, "grad"),
    B(2, "optimizer_state"),
    B(3, "optimizer_state"),
    B(1, "optimizer_state"),
    B(2, "other"),
    B(1),
]
STEP = [
    Call([0, 1, 2], [9]),
    Call([9, 1], [3], phase="backward"),
    Call([9, 2], [4], phase="backward"),
]


def opt(reads, writes):
    return Call(reads, writes, phase="optimizer")


def test_a_for_loop_optimizer_makes_a_group_per_parameter():
    # p0: moment from g0 and lr (op 3), a temporary from it (4), the update (5);
    # p1: moment (6), update (7). The shared lr (7) is only read: it links nothing.
    t, _ = make(
        BUFS,
        [
            *STEP,
            opt([3, 7], [5]),
            opt([5], [8]),
            opt([8, 7], [1]),
            opt([4, 7], [6]),
            opt([6, 7], [2]),
        ],
    )
    assert update_groups(t) == (
        UpdateGroup(ops=(3, 4, 5), params=(1,), state=(5,), grads=(3,)),
        UpdateGroup(ops=(6, 7), params=(2,), state=(6,), grads=(4,)),
    )


def test_a_foreach_op_makes_one_group_of_all():
    # one op writes both moments, one the temporary, one both parameters
    t, _ = make(BUFS, [*STEP, opt([3, 4, 7], [5, 6]), opt([5, 6], [8]), opt([8, 7], [1, 2])])
    assert update_groups(t) == (
        UpdateGroup(ops=(3, 4, 5), params=(1, 2), state=(5, 6), grads=(3, 4)),
    )


def test_a_step_without_an_optimizer_has_no_groups():
    t, _ = make(
        [B(1, "input"), B(2, "param"), B(2, "grad"), B(1)],
        [Call([0, 1], [3]), Call([3, 1], [2], phase="backward")],
    )
    assert update_groups(t) == ()


def test_adam_for_loop_on_vgg16_is_a_group_per_parameter():
    # the shipped traces run Adam's for-loop: 7 ops per parameter (lerp_, mul_,
    # addcmul_, sqrt, div, add_, addcdiv_), its two moments, its gradient
    t = io.load(ROOT / "traces" / "data" / "vgg16_b16_adam.json.gz")
    groups = update_groups(t)
    params = [b.id for b in t.buffers if b.kind.value == "param"]
    assert len(groups) == len(params) == 32
    assert sorted(p for g in groups for p in g.params) == params
    names = {b.id: b.name for b in t.buffers}
    for g in groups:
        (p,), (g_,) = g.params, g.grads
        assert len(g.ops) == 7
        assert [names[s] for s in g.state] == [f"{names[p]}.exp_avg", f"{names[p]}.exp_avg_sq"]
        assert names[g_] == f"{names[p]}.grad"
    optimizer_ops = [op.id for op in t.ops if op.phase.value == "optimizer"]
    assert sorted(i for g in groups for i in g.ops) == optimizer_ops

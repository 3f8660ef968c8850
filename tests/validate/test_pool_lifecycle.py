"""The replay's device pool as a driver of the transition function
(`planners.core.lifecycle`): each step below is one a replay takes, and the
pool must end where the function says, with the bytes it says."""

from __future__ import annotations

import torch
from memplan.planners.core.lifecycle import ARRIVING, DEAD, DEV, LEAVING, OFF
from memplan.validate.replay.pool import DevicePool, NoHostCopy, NotOnDevice
from memplan.validate.replay.transfer import Direction, Transfer

from tests.semantics import cases as c

A2 = 4  # `cases.step`: a2 (b4, 2 MiB), made by op 1 from a1


def pool() -> DevicePool:
    trace = c.step()[0]
    p = DevicePool(trace, torch.device("cpu"), (torch.uint8,) * trace.n_buffers)
    p.start_iteration()
    return p


def storage(p: DevicePool, b: int) -> torch.UntypedStorage:
    return torch.zeros(int(p.trace.nbytes[b]), dtype=torch.uint8).untyped_storage()


def make(direction: Direction, b: int):
    nbytes = int(c.step()[0].nbytes[b])
    return lambda life: Transfer(direction, b, 0, f"{direction.value} of {b}", nbytes, 0, 0, life)


def created(p: DevicePool, b: int, op: int = 1) -> None:
    assert p.begin_op(op, (), (b,), int(p.trace.nbytes[b])) is None
    p.end_op(op, (b,), [storage(p, b)], None, ())


def swapped_out(p: DevicePool, b: int, at_once: bool = True) -> None:
    """A swap-out of `b` whose copy runs to its end."""
    t = p.begin_swap_out(b, at_once, make(Direction.D2H, b))
    assert t is not None and p.ready(t)
    src = p.start_swap_out(t)
    assert src is not None
    t.host = torch.empty(0, dtype=torch.uint8).set_(src).clone().untyped_storage()
    p.finish_swap_out(t)


def test_a_swap_out_leaves_a_host_copy_and_frees_the_bytes():
    p = pool()
    created(p, A2)
    assert p.current_bytes == 2 * c.MiB
    swapped_out(p, A2)
    assert p.state(A2).where == OFF and p.host_valid(A2) and p.current_bytes == 0


def test_a_recompute_keeps_a_valid_host_copy_as_the_simulator_does():
    """REMAKE keeps the life and its host copy: a second swap-out without a
    delay is then a discard (no transfer, the bytes go at once)."""
    p = pool()
    created(p, A2)
    swapped_out(p, A2)
    assert p.gone(A2)
    assert p.begin_op(1, (), (A2,), 2 * c.MiB) is None  # the chain makes it again
    p.end_op(1, (A2,), [storage(p, A2)], frozenset({A2}), ())
    p.restore(A2)
    assert p.state(A2).where == DEV and p.host_valid(A2)
    assert p.begin_swap_out(A2, True, make(Direction.D2H, A2)) is None
    assert p.gone(A2) and p.current_bytes == 0


def test_a_need_keeps_a_leaving_buffer_and_waits_for_an_arriving_one():
    p = pool()
    created(p, A2)
    t = p.begin_swap_out(A2, True, make(Direction.D2H, A2))
    assert p.state(A2).where == LEAVING
    assert p.need(A2) is True  # kept: the copy's end leaves it on the device
    assert p.ready(t) and p.start_swap_out(t) is not None
    t.host = torch.zeros(2 * c.MiB, dtype=torch.uint8).untyped_storage()
    p.finish_swap_out(t)
    assert p.state(A2).where == DEV and p.host_valid(A2) and p.current_bytes == 2 * c.MiB
    p.release(A2)  # the host copy serves the swap-in
    tin, new = p.begin_swap_in(A2, make(Direction.H2D, A2))
    assert new and p.state(A2).where == ARRIVING and p.need(A2) is tin


def test_a_swap_in_without_a_host_copy_and_a_release_of_an_absent_buffer_are_refused():
    p = pool()
    created(p, A2)
    p.release(A2)
    try:
        p.begin_swap_in(A2, make(Direction.H2D, A2))
    except NoHostCopy as e:
        assert e.why == "it was never swapped out"
    else:
        raise AssertionError("a swap-in with no host copy was queued")
    try:
        p.release(A2)
    except NotOnDevice:
        pass
    else:
        raise AssertionError("a release of an absent buffer passed")


def test_a_framework_free_during_a_running_copy_leaves_the_bytes_to_the_copy():
    p = pool()
    created(p, A2)
    t = p.begin_swap_out(A2, True, make(Direction.D2H, A2))
    assert p.ready(t) and p.start_swap_out(t) is not None
    p.framework_free(A2)
    assert p.state(A2) == DEAD
    assert p.current_bytes == 2 * c.MiB  # the copy still reads them
    t.host = torch.zeros(2 * c.MiB, dtype=torch.uint8).untyped_storage()
    p.finish_swap_out(t)
    assert p.current_bytes == 0 and not p.host_valid(A2)

"""No replay waits for ever: delays are bounded, a copy lane that dies hands
its error to the compute thread, and a stuck lane is a `ValidationError`
(NOTE [ Bounded waits ] in validate/replay/executor.py, NOTE [ A lane that
dies ] in validate/replay/lanes.py). Each replay runs on a helper thread
joined with a generous bound, so a regression fails instead of hanging."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from memplan.planners.core.plan import SwapIn, SwapOut
from memplan.validate import replay
from memplan.validate.errors import ValidationError
from memplan.validate.replay import executor
from memplan.validate.replay.lanes import Lane
from memplan.validate.replay.transfer import Direction, Transfer

from tests.validate.helpers import (
    Order,
    first_backward_use,
    last_forward_use,
    output_of,
    plan_of,
    trace_of,
)

BOUND_S = 120.0  # far above what any case below takes; only a hang reaches it


def _bounded(fn: Any) -> BaseException | None:
    """Run `fn` on a thread; the exception it raised (None: returned)."""
    box: list[BaseException | None] = [None]

    def target() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001 -- the outcome under test
            box[0] = e

    th = threading.Thread(target=target, daemon=True)
    th.start()
    th.join(BOUND_S)
    assert not th.is_alive(), "the replay hung"
    return box[0]


def _swap_plan(delay_us: float = 0.0):
    """small_cnn with op 4's output swapped out after its last forward use
    and back before its first backward use."""
    trace = trace_of("small_cnn")
    a = output_of(trace, 4)
    out, back = last_forward_use(trace, a), first_backward_use(trace, a)
    return trace, a, plan_of(trace, SwapOut(a, out, delay_us), SwapIn(a, back - 1, back))


class _Boom(BaseException):
    """Not an Exception: escapes a transfer's steps and kills the lane thread."""


class _KillLane:
    """A LaneSync (NOTE [ Test synchronisation ]) whose first copy kills its lane."""

    def copy_started(self, t: Transfer) -> None:
        raise _Boom("lane thread died")

    def copy_ending(self, t: Transfer) -> None:
        pass

    def op_done(self, iteration: int, op: int) -> None:
        pass


@pytest.mark.parametrize("delay_us", [1e9, 1e308, 10.5e6])
def test_a_delay_longer_than_a_replay_waits_is_refused_before_it_starts(delay_us):
    trace, _a, plan = _swap_plan(delay_us)
    with pytest.raises(ValidationError, match=r"events\[0\]\.delay_us: .* us is longer than a replay waits out \(10 s\)"):  # fmt: skip
        replay(trace, plan=plan, iterations=1)


def test_max_delay_must_be_finite():
    trace, _a, plan = _swap_plan()
    with pytest.raises(ValidationError, match="max_delay_s=inf must be a finite number"):
        replay(trace, plan=plan, max_delay_s=float("inf"))


def test_a_dead_lane_hands_its_error_to_the_compute_thread():
    # the swap-out's copy kills the lane thread: the swap-in before op `back`
    # waits on a transfer no lane will end -- it must end with the lane's error
    trace, _a, plan = _swap_plan()
    err = _bounded(lambda: replay(trace, plan=plan, iterations=1, sync=_KillLane()))
    assert isinstance(err, ValidationError)
    assert "copy lane 0 stopped: _Boom('lane thread died')" in str(err)


@pytest.mark.parametrize("deadline", [True, False])
def test_a_stuck_lane_is_an_error_not_a_hang(monkeypatch, deadline):
    # the swap-out's copy never ends (held by the test): with a deadline the
    # compute thread gives up waiting for it after the slack; without one the
    # replay ends and gives up waiting for the lane
    # the compute thread waits after op `out` until the copy has started, so a
    # busy machine cannot reach the buffer's next use first (which cancels a
    # swap-out not yet started, and the replay would end without the lane)
    monkeypatch.setattr(executor, "WAIT_SLACK_S", 0.25)
    release, started = threading.Event(), threading.Event()
    trace = trace_of("small_cnn")
    a = output_of(trace, 4)
    out = last_forward_use(trace, a)

    class Hold(_KillLane):
        def copy_started(self, t: Transfer) -> None:
            started.set()
            release.wait()

        def op_done(self, iteration: int, op: int) -> None:
            if op == out:
                assert started.wait(BOUND_S), "the swap-out never started"

    plan = plan_of(trace, SwapOut(a, out, 0.0, out + 1 if deadline else -1))
    try:
        err = _bounded(lambda: replay(trace, plan=plan, iterations=1, sync=Hold()))
    finally:
        release.set()
    assert isinstance(err, ValidationError)
    if deadline:
        assert str(err) == (
            f"swap_out of buffer {a} after op {out} of iteration 0: "
            f"not over after waiting 0.25 s for it"
        )
    else:
        assert str(err) == (
            "copy lane memplan-copy-lane-0 has not finished its transfers 0.25 s after the last op"
        )


def test_a_small_delay_still_replays():
    # the compute thread waits after op `out` until the delayed swap-out has
    # started: on a fast machine the ops up to the swap-in could otherwise end
    # within the delay, and a swap-in of a buffer not yet copied out skips both
    trace, a, plan = _swap_plan(delay_us=500.0)
    out = last_forward_use(trace, a)
    order = Order().after((0, out), "started", (Direction.D2H, a, 0))
    r = replay(trace, plan=plan, iterations=1, sync=order)
    (out, _back) = sorted(r.transfers, key=lambda x: x.start_s)
    assert out.direction is Direction.D2H and out.ready_s - out.queued_s >= 499e-6


# ---- the lane on its own ---------------------------------------------------------
class _Mover:
    cuda = False

    def __init__(self) -> None:
        self.failed: list[tuple[int, str]] = []

    def arrive(self, t: Transfer) -> bool:
        return True

    def start(self, t: Transfer, lane: int) -> bool:
        return True

    def end(self, t: Transfer) -> None:
        pass

    def fail(self, t: Transfer, error: Exception) -> None:
        self.failed.append((t.buffer, str(error)))


def _transfer(b: int, ready_s: float) -> Transfer:
    return Transfer(Direction.D2H, b, 0, f"swap_out of buffer {b}", 1, ready_s, ready_s, 0)


def test_a_lane_that_dies_fails_what_it_held_and_queued_and_what_comes_later():
    mover = _Mover()
    now = time.perf_counter()
    lane = Lane(0, mover, None, now, _KillLane())
    held, queued = _transfer(1, now), _transfer(2, now + 3600.0)
    lane.submit(queued)
    lane.submit(held)
    lane.start()
    assert held.done.wait(BOUND_S) and queued.done.wait(BOUND_S)
    lane.join(BOUND_S)
    assert not lane.is_alive()
    late = _transfer(3, now)
    lane.submit(late)
    assert late.done.is_set()
    why = "copy lane 0 stopped: _Boom('lane thread died')"
    assert mover.failed == [(1, why), (2, why), (3, why)]


def test_a_ready_time_past_any_timer_does_not_kill_the_lane():
    # acquire(timeout=1e302) raises OverflowError: the lane clamps its sleep
    mover = _Mover()
    now = time.perf_counter()
    lane = Lane(0, mover, None, now)
    far, near = _transfer(1, now + 1e302), _transfer(2, now + 0.01)
    lane.submit(far)
    lane.start()
    lane.submit(near)
    assert near.done.wait(BOUND_S)
    assert lane.is_alive() and not far.done.is_set() and mover.failed == []
    with lane._lock:  # let it stop: nothing else can end the far one
        lane._queue.clear()
    lane.close()
    lane.join(BOUND_S)
    assert not lane.is_alive()

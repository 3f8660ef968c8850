"""The compute stream's requests (sim/stream.py): FIFO grants, and the
`with` form that gives the stream back as `simpy.Resource`'s does."""

from __future__ import annotations

import simpy
from memplan.sim.stream import ComputeStream


def kernel(env, stream, name, start, dur, log):
    yield env.timeout(start)
    try:
        with stream.request() as req:
            yield req
            log.append((env.now, name, "start"))
            yield env.timeout(dur)
            log.append((env.now, name, "end"))
    except simpy.Interrupt:
        log.append((env.now, name, "stopped"))


def test_leaving_the_block_hands_the_stream_to_the_next_in_line():
    env = simpy.Environment()
    stream, log = ComputeStream(env), []
    env.process(kernel(env, stream, "a", 0, 3, log))
    env.process(kernel(env, stream, "b", 1, 2, log))
    env.process(kernel(env, stream, "c", 2, 1, log))
    env.run()
    assert log == [(0, "a", "start"), (3, "a", "end"), (3, "b", "start"), (5, "b", "end"),
                   (5, "c", "start"), (6, "c", "end")]  # fmt: skip
    assert (stream.busy, list(stream.queue)) == (False, [])


def test_an_interrupt_while_queued_withdraws_the_request():
    env = simpy.Environment()
    stream, log = ComputeStream(env), []
    env.process(kernel(env, stream, "a", 0, 4, log))
    queued = env.process(kernel(env, stream, "b", 1, 1, log))
    env.process(kernel(env, stream, "c", 2, 1, log))

    def stop_b():
        yield env.timeout(3)
        queued.interrupt()

    env.process(stop_b())
    env.run()
    assert log == [(0, "a", "start"), (3, "b", "stopped"), (4, "a", "end"), (4, "c", "start"),
                   (5, "c", "end")]  # fmt: skip
    assert (stream.busy, list(stream.queue)) == (False, [])


def test_an_error_inside_the_block_gives_the_stream_back():
    env = simpy.Environment()
    stream, log = ComputeStream(env), []

    def failing():
        with stream.request() as req:
            yield req
            yield env.timeout(2)
            raise ValueError("kernel failed")

    def guarded():
        try:
            yield from failing()
        except ValueError:
            log.append((env.now, "failed"))

    env.process(guarded())
    env.process(kernel(env, stream, "b", 1, 1, log))
    env.run()
    assert log == [(2, "failed"), (2, "b", "start"), (3, "b", "end")]

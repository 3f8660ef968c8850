"""The compute stream that kernels of all jobs queue on, FIFO.

A `simpy.Resource` of capacity 1 does this with a request object, a put and
a get queue and a release event per kernel; profiled on densenet121 x 4
jobs, that machinery was half the simulator's time. `ComputeStream` keeps
only what the model uses: one event per request, succeeded when the stream
is the requester's, in the order requested. Event order is the Resource's:
a free stream grants a request with an event scheduled now (as the
Resource's request succeeds at once), a release hands the stream to the
next requester by succeeding its event; the Resource's own release event,
which nothing waits on, is gone.
"""

from __future__ import annotations

from collections import deque

import simpy


class ComputeStream:
    """One stream, FIFO: `request()` gives an event that fires when the
    stream is the caller's; `release()` passes it on; `cancel(ev)` withdraws
    a request (and gives the stream back if it was granted)."""

    __slots__ = ("env", "busy", "queue")

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.busy = False
        self.queue: deque[simpy.Event] = deque()

    def request(self) -> simpy.Event:
        ev = self.env.event()
        if self.busy:
            self.queue.append(ev)
        else:
            self.busy = True
            ev.succeed()
        return ev

    def release(self) -> None:
        if self.queue:
            self.queue.popleft().succeed()
        else:
            self.busy = False

    def cancel(self, ev: simpy.Event) -> None:
        if ev.triggered:
            self.release()
        else:
            self.queue.remove(ev)

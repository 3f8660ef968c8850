"""The compute stream that kernels of all jobs queue on, FIFO.

A `simpy.Resource` of capacity 1 does this with a request object, a put and
a get queue and a release event per kernel; profiled on densenet121 x 4
jobs, that machinery was half the simulator's time. `ComputeStream` keeps
only what the model uses: one event per request, succeeded when the stream
is the requester's, in the order requested. Event order is the Resource's:
a free stream grants a request with an event scheduled now (as the
Resource's request succeeds at once), a release hands the stream to the
next requester by succeeding its event; the Resource's own release event,
which nothing waits on, is gone. A request is a context manager as the
Resource's is: `with stream.request() as req: yield req` gives the stream
back when the block is left, or withdraws the request if it is still queued.
"""

from __future__ import annotations

from collections import deque
from types import TracebackType

import simpy


class Request(simpy.Event):
    """A request for `stream` (`ComputeStream.request` makes it): fires when the
    stream is the requester's. Leaving its `with` block cancels it
    (`ComputeStream.cancel`), except on a generator's cleanup, as SimPy's
    `Request` does."""

    stream: ComputeStream

    def __enter__(self) -> Request:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if exc_type is not GeneratorExit:
            self.stream.cancel(self)


class ComputeStream:
    """One stream, FIFO: `request()` gives an event that fires when the
    stream is the caller's; `release()` passes it on; `cancel(req)`
    withdraws a request (and gives the stream back if it was granted)."""

    __slots__ = ("env", "busy", "queue")

    def __init__(self, env: simpy.Environment):
        self.env = env
        self.busy = False
        self.queue: deque[Request] = deque()

    def request(self) -> Request:
        req = Request(self.env)
        req.stream = self  # set here, not by an `__init__` of its own: a call less per kernel
        if self.busy:
            self.queue.append(req)
        else:
            self.busy = True
            req.succeed()
        return req

    def release(self) -> None:
        if self.queue:
            self.queue.popleft().succeed()
        else:
            self.busy = False

    def cancel(self, req: Request) -> None:
        if req.triggered:
            self.release()
        else:
            self.queue.remove(req)

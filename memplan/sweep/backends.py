"""Where a sweep's scenarios run: a local process pool, or a Ray cluster.

A backend takes scenarios (plain data: paths and strings) and yields
`Done` as each finishes, in whatever order they finish; workers import
memplan and load the traces from their paths, so no torch object crosses a
process boundary (NOTE [ Sweep backends ]).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import socket
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from typing import Any, NamedTuple

from memplan.sweep.scenario import SweepTask, run_scenario
from memplan.traces.errors import MemplanError

BACKENDS = ("local", "ray")
RAY_MISSING = "--backend ray needs Ray: pip install 'memplan[ray]'"


class Done(NamedTuple):
    """One finished scenario: its record, the wall seconds it took and where."""

    record: dict[str, Any]
    seconds: float
    worker: str


def compute(s: SweepTask) -> Done:
    """Run one scenario in whichever process this is (a worker's task)."""
    t0 = time.perf_counter()
    record = run_scenario(s)
    return Done(record, time.perf_counter() - t0, f"{os.uname().nodename}:{os.getpid()}")


# NOTE [ Sweep backends ]
# local: one worker runs the scenarios in the sweep's own process; more run in a
# `ProcessPoolExecutor` started by the forkserver (not forked from the sweep's torch and
# threads). A worker that dies breaks the pool: the sweep stops with an error naming it
# rather than waiting forever, and a rerun resumes. Workers ignore SIGINT; the sweep ends
# them on its way out (`_processes`: the executor has no public way before Python 3.14), so
# an interrupted sweep leaves no worker and no traceback per worker behind.
# ray: one task of one CPU per scenario; `--address` joins a running cluster (memplan
# installed, traces readable; a HOST:PORT not answering on TCP is refused at once), else a
# local instance of `workers` CPUs is started and shut down at the end. Ray is imported only
# here, when asked for; unfinished tasks are cancelled on the way out.
# Full text: docs/notes.md, "Sweep backends".
def local(scenarios: Sequence[SweepTask], workers: int) -> Iterator[Done]:
    """Run `scenarios` on `workers` local processes (NOTE [ Sweep backends ])."""
    if workers <= 1 or len(scenarios) <= 1:
        for s in scenarios:
            yield compute(s)
        return
    context = multiprocessing.get_context("forkserver")
    # the roofline classifies ops by their torch schemas: import torch once, before the forks
    context.set_forkserver_preload(["torch", "memplan.sweep.backends", "memplan.comparison"])
    pool = ProcessPoolExecutor(
        min(workers, len(scenarios)), mp_context=context, initializer=_quiet_worker
    )
    try:
        futures = [pool.submit(compute, s) for s in scenarios]
        for future in as_completed(futures):
            try:
                yield future.result()
            except BrokenProcessPool:
                raise MemplanError(
                    "sweep: a worker process died (killed, or out of memory?); "
                    "run the sweep again to resume it"
                ) from None
    finally:
        busy = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in busy:
            proc.terminate()
        for proc in busy:
            proc.join()


def _quiet_worker() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def ray_module() -> Any:
    """Ray, or a one-line MemplanError saying how to install it."""
    try:
        import ray
    except ImportError:
        raise MemplanError(RAY_MISSING) from None
    return ray


def ray(scenarios: Sequence[SweepTask], workers: int, address: str | None = None) -> Iterator[Done]:
    """Run `scenarios` as Ray tasks (NOTE [ Sweep backends ])."""
    ray = ray_module()
    if not scenarios:  # all resumed: no cluster to start
        return
    started = not ray.is_initialized()
    if started:
        if address is not None:
            check_address(address)
            try:
                ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
            except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
                why = (str(e).splitlines() or [type(e).__name__])[0]
                raise MemplanError(
                    f"--address {address}: cannot join a Ray cluster: {why}"
                ) from None
        else:
            ray.init(
                num_cpus=workers, include_dashboard=False, log_to_driver=False,
                logging_level=logging.WARNING,
            )  # fmt: skip
    task = ray.remote(num_cpus=1, max_retries=0)(compute)
    pending = [task.remote(s) for s in scenarios]
    try:
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            if pending:  # and whatever else is ready by now, in one call
                more, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
                ready += more
            for ref in ready:
                yield ray.get(ref)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)
        if started:
            ray.shutdown()


def check_address(address: str, timeout_s: float = 10.0) -> None:
    """A `HOST:PORT` (or `ray://HOST:PORT`) address answers on TCP, checked
    before `ray.init`, which retries an unreachable one for minutes."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        return  # "auto", or a form Ray resolves itself
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except (OSError, ValueError) as e:
        why = getattr(e, "strerror", None) or str(e) or type(e).__name__
        raise MemplanError(f"--address {address}: no Ray cluster answers there: {why}") from None


def run(
    backend: str,
    scenarios: Sequence[SweepTask],
    workers: int,
    address: str | None = None,
) -> Iterator[Done]:
    """The scenarios' results from `backend` (local or ray), as they finish."""
    if backend == "local":
        return local(scenarios, workers)
    if backend == "ray":
        return ray(scenarios, workers, address)
    raise MemplanError(f"--backend={backend!r} must be one of {', '.join(BACKENDS)}")

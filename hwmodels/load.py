"""Background load for microbenchmarks: TENSILE's `gpu_usage`, reproduced.

A load level is the fraction of wall time a competitor *asks* for; what it
gets depends on the scheduler, so the CPU microbenchmark records the usage it
observed during each measurement (see NOTE [ Observed usage ] in
`hwmodels.microbench`).
- CPU: one worker process per measuring core, pinned to that core, spins
  for `usage * period` and sleeps for the rest of each period. Processes,
  not threads, so the spin never holds the measuring interpreter's GIL;
  plain subprocesses, not multiprocessing, so nothing re-imports `__main__`.
- CUDA: a thread keeps a side stream busy with matmuls for `usage * period`
  of each period, then sleeps; torch releases the GIL while it waits.

Both are context managers with a `set(usage)` that takes effect within one
period, so one sample can be timed at every usage level without restarting
the load. Workers exit on their own if the parent dies.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from typing import Any

PERIOD_S = 0.001

# The worker: a bare interpreter (no site, no imports beyond the stdlib) that
# reads its usage from stdin, one number per line, and exits at EOF -- so it
# also exits when the parent dies and its end of the pipe closes.
_WORKER = r"""
import os, select, sys, time
core, period = int(sys.argv[1]), float(sys.argv[2])
if core >= 0 and hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {core})
fd, usage, buf = sys.stdin.fileno(), 0.0, b""
while True:
    if select.select([fd], [], [], 0)[0]:
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        *lines, buf = (buf + chunk).split(b"\n")
        if lines:
            usage = float(lines[-1])
    t0 = time.perf_counter()
    busy = usage * period
    while time.perf_counter() - t0 < busy:
        pass
    # sleep at least a little every period: a waking task preempts the
    # measured one at once, so even usage=1 interleaves at period scale
    time.sleep(max(period - (time.perf_counter() - t0), 5e-5))
"""


class CpuLoad:
    """Competing spinner processes, one per entry of `cores` (None: one,
    placed by the OS)."""

    def __init__(self, cores: list[int] | None, period_s: float = PERIOD_S):
        self.cores = list(cores) if cores else [-1]
        self.period_s = period_s
        self._procs: list[subprocess.Popen[bytes]] = []

    def __enter__(self) -> CpuLoad:
        for core in self.cores:
            self._procs.append(
                subprocess.Popen(
                    [sys.executable, "-I", "-S", "-c", _WORKER, str(core), str(self.period_s)],
                    stdin=subprocess.PIPE,
                )
            )
        return self

    def set(self, usage: float) -> None:
        for p in self._procs:
            assert p.stdin is not None
            p.stdin.write(f"{float(usage)}\n".encode())
            p.stdin.flush()
        time.sleep(2 * self.period_s)  # let the next period pick it up

    def __exit__(self, *exc: object) -> None:
        for p in self._procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in self._procs:
            try:
                p.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=2.0)
        self._procs.clear()


class CudaLoad:
    """A side stream kept busy `usage` of each period by matmuls (CUDA only)."""

    def __init__(self, device: Any, period_s: float = 0.01, size: int = 2048):
        import torch

        self._torch = torch
        self.device = device
        self.period_s = period_s
        self._usage = 0.0
        self._stop = threading.Event()
        self._stream = torch.cuda.Stream(device=device)
        self._a = torch.randn(size, size, device=device)
        self._thread = threading.Thread(target=self._run, daemon=True)
        # time one matmul so a period can be filled with a whole number of them
        with torch.cuda.stream(self._stream):
            for _ in range(3):
                self._a @ self._a
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                self._a @ self._a
            end.record()
        end.synchronize()
        self._mm_s = max(start.elapsed_time(end) / 10 * 1e-3, 1e-6)

    def _run(self) -> None:
        torch = self._torch
        while not self._stop.is_set():
            t0 = time.perf_counter()
            n = int(self._usage * self.period_s / self._mm_s)
            if n:
                with torch.cuda.stream(self._stream):
                    for _ in range(n):
                        self._a @ self._a
                self._stream.synchronize()
            rest = self.period_s - (time.perf_counter() - t0)
            if rest > 0:
                time.sleep(rest)

    def __enter__(self) -> CudaLoad:
        self._thread.start()
        return self

    def set(self, usage: float) -> None:
        self._usage = float(usage)
        time.sleep(2 * self.period_s)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)
        self._torch.cuda.synchronize(self.device)

"""Capture and load times.

Figures:
- capture of resnet50 at batch 16 on the meta device (needs torchvision: run
  with the zoo venv, `.venv-zoo/bin/python benchmarks/capture.py`; skipped
  with a note otherwise), median of 3 runs after one unmeasured run;
- load (read, gunzip, parse, validate) of every shipped trace, median of 5.
Wall-clock time.perf_counter on this machine; machines are noisy, compare
ratios measured in one run.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memplan.traces import io  # noqa: E402
from memplan.traces.capture import CaptureOptions, capture  # noqa: E402
from memplan.traces.errors import TraceError  # noqa: E402
from memplan.traces.zoo import resolve  # noqa: E402


def median_time(fn, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), out


def main() -> None:
    print("capture (meta device, batch 16, Adam), median of 3 after one warm run:")
    try:
        factory = resolve("resnet50")
        capture(factory, 16, CaptureOptions(device="meta"))
        t, trace = median_time(lambda: capture(factory, 16, CaptureOptions(device="meta")), 3)
        print(
            f"  resnet50: {t:.2f} s  ({trace.n_ops} ops, {trace.n_buffers} buffers, "
            f"{trace.n_ops / t:.0f} ops/s)"
        )
    except TraceError as e:
        print(f"  resnet50: skipped ({e})")
    print("load of shipped traces (read + gunzip + parse + validate), median of 5:")
    for path in sorted((ROOT / "traces" / "data").glob("*.json.gz")):
        t, trace = median_time(lambda p=path: io.load(p), 5)
        print(
            f"  {path.name:<34} {t * 1e3:8.1f} ms  {path.stat().st_size / 2**20:6.2f} MiB  "
            f"{trace.n_ops:>6} ops {trace.n_buffers:>6} buffers"
        )


if __name__ == "__main__":
    main()

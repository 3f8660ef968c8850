"""Keeping freed host memory in the process, so a CPU "device" allocates as a
GPU's caching allocator does.

See NOTE [ Host allocations ] above `cache_host_allocations`.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h
KEEP_BYTES = 1 << 30


# NOTE [ Host allocations ]
# On CPU the "device" and the host are both malloc'd memory. glibc returns large freed
# blocks to the kernel (above the mmap and trim thresholds), so the next allocation of that
# size faults its pages in again, and since the mmap threshold moves with the process's
# history, one op's time depends on what ran before it; in a replay every copy pays the same
# faults. A GPU's caching allocator and a pinned host pool fault nothing in steady state.
# `cache_host_allocations` sets both thresholds to 1 GiB, so glibc keeps freed memory and
# the thresholds stop moving. It is process-wide and one-way, so the commands that time ops
# on the CPU (`memplan microbench`, `memplan validate`) call it once at start; the
# microbenchmark records whether it took (`DatasetMeta.host_allocations_cached`). What the
# faults cost: docs/latency.md and docs/validation.md; full text: docs/notes.md.
def cache_host_allocations() -> bool:
    """NOTE [ Host allocations ]: keep freed host memory in the process (glibc
    only). Returns whether the setting took."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, KEEP_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, KEEP_BYTES)
    )

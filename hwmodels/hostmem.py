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
# On CPU the "device" and the host are both malloc'd memory. glibc returns a
# large freed block to the kernel (blocks above the mmap threshold, and the
# heap's top above the trim threshold), so the next allocation of that size
# touches fresh pages again: about one page fault per 4 KiB. Large ops then
# run at a fraction of the bandwidth small ones get, and because the mmap
# threshold moves with the process's history (it rises to the largest
# mmapped block freed so far), one op's time depends on what ran before it.
# In a replay, every swapped-out copy and every buffer brought back pays the
# same faults, on the copy lane and on the compute thread that reuses the
# memory. A GPU's caching allocator and a pinned host pool keep their blocks
# and fault nothing in steady state. `cache_host_allocations` sets both
# thresholds to 1 GiB, which makes glibc keep freed memory and stops the
# thresholds moving. The setting is process-wide and one-way (glibc has no
# call to read the old values back), so the CLI commands and benchmarks that
# time ops on the CPU (`memplan microbench`, `memplan validate`) call it once
# at start; the microbenchmark records whether it took
# (`DatasetMeta.host_allocations_cached`). What the faults cost when glibc
# returns memory: docs/latency.md (microbenchmarks) and docs/validation.md
# (replays).
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

"""Keeping freed host memory in the process, so a CPU "device" allocates as a
GPU's caching allocator does.

# NOTE [ Host allocations ]
On CPU the "device" and the host are both malloc'd memory. glibc returns a
large freed block to the kernel (blocks above the mmap threshold, and the
heap's top above the trim threshold), so the next allocation of that size
touches fresh pages again: about one page fault per 4 KiB. Worse, both
thresholds move with the process's history (the mmap threshold rises to the
largest mmapped block freed so far, up to 32 MiB), so one op's time depends
on what ran before it: in a microbenchmark run, float32 ops writing 16-64
MiB measured either ~70 GB/s or ~5 GB/s depending on that history. A GPU's
caching allocator and a pinned host pool keep their blocks and fault
nothing in steady state. `cache_host_allocations` sets both thresholds to
1 GiB, which makes glibc keep freed memory and stops the thresholds moving.
The setting is process-wide and one-way (glibc has no call to read the old
values back), so the CLI commands and benchmarks that time ops on the CPU
(`memplan microbench`, `memplan validate`) call it once at start; the
microbenchmark records whether it took (`DatasetMeta.host_allocations_cached`).
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h
KEEP_BYTES = 1 << 30


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

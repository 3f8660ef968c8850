"""Keeping freed host memory in the process, so a CPU "device" allocates as a
GPU's caching allocator does.

# NOTE [ Host allocations ]
On CPU the "device" and the host are both malloc'd memory. glibc returns a
large freed block to the kernel (blocks above the mmap threshold, and the
heap's top above the trim threshold), so the next allocation of that size
touches fresh pages again: about one page fault per 4 KiB. In a
microbenchmark run, elementwise ops writing 32 MiB or more (always above
the threshold) ran at a median ~5 GB/s against ~70 GB/s for smaller ones;
between 16 and 32 MiB they were mixed, because the mmap threshold moves with
the process's history (it rises to the largest mmapped block freed so far),
so one op's time depended on what ran before it. In a replay, every
swapped-out copy and every buffer brought back paid the same faults: 2-3 ms
of CPU per iteration for a plan moving 8 MiB each way, on the copy lane and
on the compute thread that reuses the memory. A GPU's
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

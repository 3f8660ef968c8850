"""Keeping freed host memory in the process (hwmodels/hostmem.py)."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest


def test_host_allocations_can_be_cached_on_glibc():
    """Process-wide and one-way (NOTE [ Host allocations ]): in a child process."""
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    code = "from hwmodels.hostmem import cache_host_allocations as c; print(c())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "True"

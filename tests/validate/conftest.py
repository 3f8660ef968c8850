"""Replays run one intra-op thread: the models are tiny, and on a busy
machine a parallel region waiting for a descheduled worker thread costs
milliseconds per op. Results do not depend on it (checked bit for bit)."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _one_intra_op_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

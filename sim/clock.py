"""The simulation's clock: SimPy's environment, and the one shortcut the
model takes through it (NOTE [ Kernels that nothing interleaves ])."""

from __future__ import annotations

import simpy


# NOTE [ Kernels that nothing interleaves ]
# A kernel is a timeout the job's process waits on. When no other event is
# due before it ends (the heap's earliest is later), waiting on it through
# SimPy changes nothing but the clock: nothing else runs meanwhile and the
# process is the next to resume. `Clock.skip_to` then moves the clock to
# the kernel's end at once (the same sum SimPy would schedule at, so the
# same float) and the process goes on without the heap push, the pop and
# the generator's resume. An event due at the very instant the kernel ends
# is scheduled earlier, so SimPy would run it first: such a kernel is waited
# on as before. A kernel skipped so still counts as one event (`n_events`).
# A lone job's ops are mostly kernels nothing interleaves (a copy's end
# falls in one kernel of the many it overlaps): with squeeze's plans at 50%,
# 92% of densenet121's kernels are skipped (42% of its events still go
# through the heap: copies, waits) and 89% of bert_base's (72%: it moves
# about 1200 buffers over the lane an iteration).
# `tests/sim/test_skip_to.py` runs the same cases with the skip off
# (`Clock.skipping = False`) and compares the logs entry by entry.
class Clock(simpy.Environment):
    """SimPy's environment that can skip a kernel nothing interleaves."""

    skipping = True  # off only to test against SimPy's own stepping

    def __init__(self) -> None:
        super().__init__()
        self.skipped = 0

    def skip_to(self, t: float) -> bool:
        """Move the clock to `t` if no event is due before or at `t` (NOTE
        [ Kernels that nothing interleaves ]); False (nothing done) if one is."""
        q = self._queue
        if not self.skipping or (q and q[0][0] <= t):
            return False
        self._now = t
        self.skipped += 1
        return True

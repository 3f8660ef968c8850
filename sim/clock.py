"""The simulation's clock: SimPy's environment, and the one shortcut the
model takes through it (NOTE [ Kernels that nothing interleaves ])."""

from __future__ import annotations

import simpy


# NOTE [ Kernels that nothing interleaves ]
# A kernel is a timeout the job's process waits on. When no other event is due before it ends
# (the heap's earliest is later), waiting on it through SimPy changes nothing but the clock:
# nothing else runs meanwhile and the process is the next to resume. `Clock.skip_to` then moves
# the clock to the kernel's end at once (the same sum SimPy would schedule at, so the same
# float) and the process goes on without the heap push, the pop and the generator's resume. An
# event due at the very instant the kernel ends is scheduled earlier, so SimPy would run it
# first: such a kernel is waited on as before. A kernel skipped so still counts as one event
# (`n_events`). A lone job's ops are mostly kernels nothing interleaves.
# `tests/sim/test_skip_to.py` runs the same cases with the skip off (`Clock.skipping = False`)
# and compares the logs entry by entry.
# Measurements: docs/notes.md, "Kernels that nothing interleaves".
class Clock(simpy.Environment):
    """SimPy's environment that can skip a kernel nothing interleaves."""

    skipping = True  # off only to test against SimPy's own stepping

    def __init__(self) -> None:
        super().__init__()
        self.skipped = 0

    def skip_to(self, t: float) -> bool:
        """Move the clock to `t` if no event is due before or at `t` (NOTE
        [ Kernels that nothing interleaves ]); False (nothing done) if one is."""
        if not self.skipping or self.peek() <= t:
            return False
        self._now = t  # the environment's own clock: no public setter moves it
        self.skipped += 1
        return True

"""NOTE [ Garbage collection in simulate ]: the caller's objects are frozen
during a run and given back afterwards; a caller's own freeze is kept."""

from __future__ import annotations

import gc
import importlib

from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.sim import simulate
from memplan.traces import synthetic

DEV = DeviceModel(load_hardware("rtx-a6000"), Roofline())


def test_simulate_unfreezes_what_it_froze():
    gc.unfreeze()
    simulate([synthetic.chain(3)], DEV, iterations=1)
    assert gc.get_freeze_count() == 0


def test_simulate_freezes_during_the_run(monkeypatch):
    module = importlib.import_module("memplan.sim.simulate")

    gc.unfreeze()
    counts = []
    real = module._run

    def spy(*args):
        counts.append(gc.get_freeze_count())
        return real(*args)

    monkeypatch.setattr(module, "_run", spy)
    module.simulate([synthetic.chain(3)], DEV, iterations=1)
    assert counts and counts[0] > 0
    assert gc.get_freeze_count() == 0


def test_a_callers_freeze_is_kept():
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        simulate([synthetic.chain(3)], DEV, iterations=1)
        assert gc.get_freeze_count() >= before > 0
    finally:
        gc.unfreeze()

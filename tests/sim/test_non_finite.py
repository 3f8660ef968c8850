"""A simulation whose times come out non-finite is an error, not a result
(NOTE [ Trace sanity ranges ])."""

from __future__ import annotations

import warnings

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Fixed
from memplan.hwmodels.profile import load_hardware
from memplan.sim import simulate
from memplan.sim.errors import SimError
from memplan.traces import synthetic


@pytest.mark.parametrize("seconds", [1e308, 1e302])
def test_ops_too_long_to_add_up_are_a_sim_error(seconds):
    """1e308 s is finite, but in microseconds (x 1e6) it is not; two ops of
    1e302 s are 1e308 us each, finite, and their sum is not."""
    t = synthetic.chain(2)
    durations = [1e-3] * t.n_ops
    durations[1] = durations[2] = seconds
    device = DeviceModel(load_hardware("rtx-a6000"), Fixed(durations), 1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy's overflow in s * 1e6
        with pytest.raises(SimError, match=r"the simulated makespan is not finite \(inf s\)"):
            simulate([t], device, iterations=2)


def test_long_but_finite_ops_are_a_result():
    """Ops of a day each (the longest a trace may record) still simulate."""
    t = synthetic.chain(2)
    device = DeviceModel(load_hardware("rtx-a6000"), Fixed([86_400.0] * t.n_ops), 1)
    result = simulate([t], device, iterations=2)
    assert result.makespan_s == pytest.approx(2 * 86_400.0 * t.n_ops, rel=1e-9)

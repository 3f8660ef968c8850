"""The device model: one rounding rule for op durations, one formula for copy
times. Figures worked out by hand on `handmade.device()` (25 GB/s each way,
2.5 us per copy, H2D at half speed beside a D2H copy)."""

from __future__ import annotations

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel, Direction, TimeUnit
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.latency import Fixed

from tests.hwmodels.handmade import Call, device, make


def one_op_trace(n_ops: int = 3):
    return make([Call("aten.relu.default", ((4,),), (4,)) for _ in range(n_ops)])


def test_copy_time_is_fixed_cost_plus_bytes_over_bandwidth():
    dm = DeviceModel(device(), Fixed([0.0]))
    # 25e9 bytes take 1 s; 2.5 us fixed on top
    assert dm.copy_time(25_000_000_000, Direction.D2H, TimeUnit.S) == pytest.approx(1.0000025)
    assert dm.copy_time(25_000_000, Direction.H2D) == pytest.approx(1002.5)  # us
    assert dm.copy_time(25_000, Direction.H2D, TimeUnit.NS) == pytest.approx(3500.0)
    np.testing.assert_allclose(
        dm.copy_time(np.array([0, 25_000_000]), Direction.D2H), [2.5, 1002.5]
    )
    # exactly the simulator's arithmetic for an int (no numpy on its hot path)
    assert dm.copy_time(12345, Direction.D2H) == 2.5e-6 * 1e6 + 12345 * 1e6 / 25e9


def test_duplex_rate_applies_only_to_h2d_with_two_lanes():
    one = DeviceModel(device(), Fixed([0.0]), lanes=1)
    two = DeviceModel(device(), Fixed([0.0]), lanes=2)
    # half of 25 GB/s: 25 MB take 2 ms, plus the fixed 2.5 us
    assert two.copy_time(25_000_000, Direction.H2D, duplex=True) == pytest.approx(2002.5)
    assert one.copy_time(25_000_000, Direction.H2D, duplex=True) == pytest.approx(1002.5)
    assert two.copy_time(25_000_000, Direction.D2H, duplex=True) == pytest.approx(1002.5)


def test_op_durations_round_once_to_a_nanosecond():
    t = one_op_trace()
    dm = DeviceModel(device(), Fixed([1.0000004e-3, 2.0000006e-3, 0.0]))
    assert dm.op_durations(t).tolist() == [1000.0, 2000.001, 0.0]  # us, to 1 ns
    assert dm.op_durations(t, TimeUnit.NS).tolist() == [1_000_000, 2_000_001, 0]
    np.testing.assert_allclose(dm.op_durations(t, TimeUnit.S), [1e-3, 2.000001e-3, 0.0])


def test_bad_devices_and_durations_are_named():
    with pytest.raises(LatencyError, match="lanes=3 must be 1"):
        DeviceModel(device(), Fixed([0.0]), lanes=3)
    with pytest.raises(LatencyError, match="extra_per_transfer_s=-1"):
        DeviceModel(device(), Fixed([0.0]), extra_per_transfer_s=-1)
    with pytest.raises(LatencyError, match="returned bad durations"):
        DeviceModel(device(), Fixed([1e-3, float("nan"), 0.0])).op_durations(one_op_trace())

    class Short(Fixed):  # a model that ignores the trace's length
        def predict_all(self, trace, hw, usage=0.0):
            return np.array([1e-3])

    with pytest.raises(LatencyError, match="need 3 finite values"):
        DeviceModel(device(), Short([1e-3])).op_durations(one_op_trace())


def test_transfer_cost_per_copy_in_units():
    dm = DeviceModel(device(), Fixed([0.0]), extra_per_transfer_s=3e-5)
    assert dm.transfer_cost() == pytest.approx(30.0)
    assert dm.transfer_cost(TimeUnit.NS) == pytest.approx(30_000.0)

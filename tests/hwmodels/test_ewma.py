"""EWMA plan updating (TENSILE §IV-E), worked by hand over a three-op trace."""

from __future__ import annotations

import numpy as np
import pytest
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.latency import EWMA, Fixed

from tests.hwmodels.handmade import add, device, make

HW = device()


def three_ops():
    return make([add(8), add(8), add(8)]), Fixed([1.0, 2.0, 3.0])


def test_fold_and_change_rate():
    t, base = three_ops()
    m = EWMA(base, alpha=0.5)
    assert m.predict_all(t, HW).tolist() == [1.0, 2.0, 3.0]  # nothing observed: the base
    assert m.change_rate(t, HW) == 0.0
    m.observe(t, HW, 0, 3.0)  # 0.5 * 3 + 0.5 * 1 = 2
    assert m.predict_all(t, HW).tolist() == [2.0, 2.0, 3.0]
    m.observe(t, HW, [0], [3.0])  # 0.5 * 3 + 0.5 * 2 = 2.5
    assert m.predict(t.ops[0], t, HW) == 2.5
    # before any re-plan, s is the base's sum: |7.5 - 6| / 6
    assert m.change_rate(t, HW) == pytest.approx(0.25)
    assert m.is_stale(t, HW, threshold=0.2) and not m.is_stale(t, HW, threshold=0.3)
    assert m.mark_planned(t, HW) == 7.5
    assert m.change_rate(t, HW) == 0.0
    m.observe(t, HW, 1, 4.0)  # 0.5 * 4 + 0.5 * 2 = 3 -> s' = 2.5 + 3 + 3 = 8.5
    assert m.change_rate(t, HW) == pytest.approx(1.0 / 7.5)
    assert m.is_stale(t, HW, 0.1) and not m.is_stale(t, HW, 0.15)


def test_repeated_ids_fold_in_order_and_whole_iterations():
    t, base = three_ops()
    m = EWMA(base, alpha=0.5)
    m.observe(t, HW, [2, 2], [5.0, 1.0])  # 3 -> 4 -> 2.5
    assert m.predict_all(t, HW)[2] == 2.5
    m.observe_iteration(t, HW, np.array([1.0, 4.0, 2.5]))
    assert m.predict_all(t, HW).tolist() == [1.0, 3.0, 2.5]


def test_alpha_one_takes_the_latest_and_state_is_per_trace():
    t, base = three_ops()
    other = make([add(8), add(8), add(8)])
    m = EWMA(base, alpha=1.0)
    m.observe(t, HW, 1, 7.0)
    assert m.predict_all(t, HW).tolist() == [1.0, 7.0, 3.0]
    assert m.predict_all(other, HW).tolist() == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda m, t: m.observe(t, HW, [3], [1.0]), "op ids must be in 0..2"),
        (lambda m, t: m.observe(t, HW, [0, 1], [1.0]), "2 op ids but 1 latencies"),
        (lambda m, t: m.observe(t, HW, [0], [-1.0]), "finite and >= 0"),
        (lambda m, t: m.observe(t, HW, [0], [float("nan")]), "finite and >= 0"),
    ],
)
def test_bad_observations(call, message):
    t, base = three_ops()
    with pytest.raises(LatencyError, match=message):
        call(EWMA(base), t)


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5])
def test_bad_alpha(alpha):
    with pytest.raises(LatencyError, match="alpha"):
        EWMA(Fixed([1.0]), alpha=alpha)

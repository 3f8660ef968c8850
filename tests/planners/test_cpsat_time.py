"""NOTE [ The time limit is the planner's ] in planners/cpsat/search.py: the
searches end a reserve before `time_limit_s`, so that the solver's late stop
and the read-out still fit in it."""

from __future__ import annotations

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Measured
from memplan.hwmodels.profile import load_hardware
from memplan.planners.cpsat import search
from memplan.planners.cpsat.options import CpsatOptions
from memplan.traces.synthetic import checkmate_chain

MiB = 1 << 20


@pytest.mark.parametrize(
    "limit,reserve",
    [(60.0, 1.2), (5.0, 0.1), (100.0, 1.5), (1000.0, 1.5), (0.5, 0.01)],
)
def test_the_reserve_is_a_share_of_the_limit_up_to_a_cap(limit, reserve):
    assert search._deadline(10.0, limit) == pytest.approx(10.0 + limit - reserve)


def test_the_exact_search_gets_the_deadline_less_the_reserve(monkeypatch):
    seen = []

    def exact(data, spec, opts, hint, start, deadline, info):
        seen.append(deadline)
        return "UNKNOWN", None, None

    monkeypatch.setattr(search, "_exact", exact)
    t = checkmate_chain(8, unit_bytes=MiB)
    device = DeviceModel(load_hardware("rtx-a6000"), Measured())
    r = search.run((t,), device, 5 * MiB, CpsatOptions(hint=None, time_limit_s=60.0), 100.0)
    assert seen == [pytest.approx(100.0 + 60.0 - 1.2)]
    assert r.stats["status"] == "UNKNOWN" and not r.plans

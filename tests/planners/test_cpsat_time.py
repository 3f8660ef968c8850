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


def test_a_window_starts_only_if_its_build_still_fits(monkeypatch):
    # NOTE [ Windows ]: a clock that moves 2 s per model build and a solve's
    # whole limit per solve (2.7 s a window). Windows end at 4.7 and 9.4 s of
    # a 10 s deadline; a third would be built from 9.4 to 11.4 s, past it,
    # so it is not started (starting while 0.5 s were left ran to 11.45 s).
    from types import SimpleNamespace

    import numpy as np
    from memplan.planners.cpsat import lns
    from memplan.planners.cpsat.spec import ModelSpec, Objective

    clock = [0.0]

    def build(data, spec):
        clock[0] += 2.0
        return None

    def solve(bm, opts, limit, start, what):
        clock[0] += limit
        return SimpleNamespace(solution=None)

    monkeypatch.setattr(lns, "build", build)
    monkeypatch.setattr(lns, "solve", solve)
    monkeypatch.setattr(lns, "time_left", lambda deadline: max(deadline - clock[0], 0.05))
    monkeypatch.setattr(lns, "slack", lambda data, sol, cap: np.zeros(len(data.hot)))
    monkeypatch.setattr(lns, "_window_gaps", lambda data, w0, w1, most: frozenset())
    monkeypatch.setattr(lns, "time", SimpleNamespace(perf_counter=lambda: clock[0]))
    inc = SimpleNamespace(iteration_ticks=10, peak_bytes=1)
    info = {"windows": 0, "windows_improved": 0}
    opts = CpsatOptions(lns_window_hot_ops=4, lns_window_time_s=2.7)
    data = SimpleNamespace(hot=np.arange(12))
    out = lns._windows(data, ModelSpec(Objective.TIME, 1), opts, inc, 10.0, info)
    assert out is inc and info["windows"] == 2 and clock[0] == pytest.approx(9.4)

"""The two baselines: the empty plan and TENSILE's release-after-last-access."""

from __future__ import annotations

from memplan.planners.core.plan import Release
from memplan.planners.heuristics.vanilla import (
    release_only,
    release_only_plan,
    vanilla,
    vanilla_plan,
)

from tests.sim.handtraces import B, Call, MiB, make
from tests.traces.test_io import toy


def test_release_only_frees_after_the_last_access():
    t = toy()  # w param, x input (last read by op0), a (op0 -> op1), r (op1 -> op2)
    assert release_only_plan(t).events == (Release(1, 0), Release(2, 1))
    assert vanilla_plan(t).events == ()


def test_unread_input_is_released_at_the_start():
    t, _ = make([B(1, "input", freed_after=0), B(1)], [Call([], [1]), Call([1], [])])
    assert release_only_plan(t).events == (Release(0, -1),)


def test_results_are_feasible_against_the_summed_peaks():
    t = toy()  # framework peak 10 MiB, liveness 9 MiB
    v, r = vanilla([t], budget_bytes=9 * MiB), release_only([t], budget_bytes=9 * MiB)
    assert (v.planner, v.feasible, v.stats["peak_bytes"]) == ("vanilla", False, 10 * MiB)
    assert (r.planner, r.feasible, r.stats["peak_bytes"]) == ("release_only", True, 9 * MiB)
    assert not release_only([t, t], budget_bytes=17 * MiB).feasible  # TENSILE: MP = sum of MP_j
    assert vanilla([t, t]).feasible and len(vanilla([t, t]).plans) == 2
    assert r.options == {"budget_bytes": 9 * MiB} and r.solve_time_s >= 0

"""NOTE [ Offload at the iteration start ] (planners/search/offload.py), on a
case worked by hand."""

from __future__ import annotations

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Measured
from memplan.planners.analysis.optimes import predict_timelines
from memplan.planners.core.check import check
from memplan.planners.core.plan import Plan, Status, SwapIn, SwapOut
from memplan.planners.heuristics.vanilla import release_only_plan
from memplan.planners.search.offload import offload_candidates, offload_events
from memplan.planners.search.squeeze import SqueezeOptions, squeeze
from memplan.sim import Job, simulate

from memplan.evaluator import sim_evaluator
from tests.planners.bruteforce import B, MiB, Step, tiny_hw, tiny_trace


def _case():
    """P (buffer 0, 1 MiB) and O (buffer 1, 2 MiB) are persistent; O is read
    and updated by the last op only, as an optimizer state is. Op 0 (2 ms)
    makes A (2 MiB), op 1 C (2 MiB) from A, op 2 G (1 MiB) from C and P, op 3
    updates O from G; other ops take 1 ms, the lane moves 1 MiB per ms.
    Release-only memory per op: 5, 7 (the peak), 6, 4 MiB."""
    trace = tiny_trace(
        [B(1, "param"), B(2, "param"), B(2), B(2), B(1)],
        [Step((0,), (2,), ms=2), Step((2,), (3,)), Step((3, 0), (4,)), Step((4, 1), (1,))],
    )
    return trace, DeviceModel(tiny_hw(), Measured())


def test_the_state_used_after_the_peak_is_offloaded_from_the_iteration_start():
    trace, device = _case()
    assert offload_candidates(trace) == [(3, 1)]  # P is read by op 0, before the peak
    tl = predict_timelines([trace], device)[0]
    events, freed = offload_events(trace, device, tl, offload_candidates(trace), 1.0, 5 * MiB)
    # O's copy out ends at 2 ms, op 1's predicted start: op 1 waits for it.
    # Packed late, O's copy in would start at 2 ms (after op 0), but with O
    # back, ops 1 and 2 need 7 and 6 MiB: not before op 2 ends.
    assert events == (SwapOut(1, -1, before_op=1), SwapIn(1, 2, 3))
    assert freed == 2 * MiB
    plan = Plan(
        release_only_plan(trace).trace_fingerprint,
        (*release_only_plan(trace).events, *events),
    )
    check(plan, trace)
    # each iteration: O out 0-2 ms under op 0, op 1 2-3, op 2 3-4, O in 4-6,
    # op 3 6-7; the first iteration the same (O starts resident either way)
    run = simulate([Job(trace, plan)], device, iterations=2, budget=5 * MiB)
    assert not run.oom and not run.jobs[0].net_used
    assert run.jobs[0].iteration_times_s == pytest.approx([7e-3, 7e-3])
    assert run.peak_bytes == 5 * MiB


def test_squeeze_finds_the_offload_where_no_heuristic_fits():
    """At 5 MiB no heuristic fits (TENSILE's swap of O across iterations
    leaves it resident through the first one); the offloaded start does. It
    is optimal: O must be off for ops 1 and 2 (7 and 6 MiB with it), cannot
    come back before op 2 ends (at 4 ms at the earliest), and takes 2 ms to,
    so op 3 runs at 6-7 ms."""
    trace, device = _case()
    ev = sim_evaluator([trace], device, 5 * MiB)
    plain = squeeze(
        [trace], device, budget_bytes=5 * MiB, evaluator=ev,
        options=SqueezeOptions(nets="", offload="", max_evaluations=60),
    )  # fmt: skip
    assert plain.status is Status.STOPPED
    r = squeeze(
        [trace], device, budget_bytes=5 * MiB, evaluator=ev,
        options=SqueezeOptions(nets="", max_evaluations=60),
    )  # fmt: skip
    assert r.status is Status.PLANNED, r.explain()
    assert r.stats["start"] == "release_only+offload1"
    run = simulate([Job(trace, r.plans[0])], device, iterations=3, budget=5 * MiB)
    assert not run.oom and not run.jobs[0].net_used
    assert run.jobs[0].iteration_time_s == pytest.approx(7e-3)


def test_offload_shares_are_checked():
    with pytest.raises(ValueError, match="offload"):
        SqueezeOptions(offload="0.5,2")
    with pytest.raises(ValueError, match="commas"):
        SqueezeOptions(offload="half")

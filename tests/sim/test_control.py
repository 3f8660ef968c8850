"""The scheduler hook: plan changes at iteration boundaries and what the
controller observes (sim/control.py, NOTE [ Plan changes at a boundary ]).

Hand-worked on `param_step` of test_model.py: p (2 MiB param) is read by
op0 and updated by op2; ops take 1, 2, 1, 3, 4 ms (11 ms an iteration);
copies move 1 MiB per ms, so p's copies take 2 ms.
"""

from __future__ import annotations

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.planners.core.plan import Plan, SwapIn, SwapOut
from memplan.sim import Job, LateSwapIn, PlanChange, SimError, simulate
from memplan.sim.exports import chrome_trace

from tests.sim.handtraces import fmt, gpu
from tests.sim.test_model import param_step, plan

MS = 1e-3
MiB_ = 1 << 20


class Scripted:
    """A controller that answers with fixed changes and records reports."""

    def __init__(self, on_arrival=(), on_iteration=None):
        self.on_arrival = list(on_arrival)
        self.on_iteration = on_iteration or {}
        self.reports = []
        self.calls = []

    def job_arrived(self, job, now_s, jobs):
        self.calls.append(("arrived", job, round(now_s / MS, 6), tuple(jobs)))
        return [c for c in self.on_arrival if c.job == job]

    def job_left(self, job, now_s, jobs):
        self.calls.append(("left", job, round(now_s / MS, 6), tuple(jobs)))
        return []

    def iteration_ended(self, report):
        self.reports.append(report)
        return self.on_iteration.get((report.job, report.iteration), [])


def cross_plan(t) -> Plan:
    # TENSILE's cross-iteration swap: p out after its update, in for the next iteration
    return plan(t, SwapOut(0, 2), SwapIn(0, 4, 0, next_iteration=True))


def run(jobs, ctl, iterations=4):
    t, lat = param_step()
    return simulate(jobs, DeviceModel(gpu(), lat), iterations=iterations, controller=ctl)


def test_plan_a_for_b_at_a_known_time():
    # A in force from the start. The change is ready at 15 ms, inside it1
    # (11-24 ms: its op0 stalls 2 ms on p's swap-in), so it takes effect at
    # the boundary at 24 ms: it2 and it3 run vanilla. The swap-in A triggered
    # at the end of it1 still runs (24-26 ms) and op0 of it2 waits for it as
    # for any arriving buffer; it2 then takes 2 + 11 ms, it3 11 ms.
    t, _ = param_step()
    ctl = Scripted([PlanChange(0, None, 15 * MS, "to vanilla")])
    r = run([Job(t, cross_plan(t))], ctl)
    j = r.jobs[0]
    assert j.plan_versions == (0, 0, 1, 1)
    assert j.plan_changes == ((2, 15 * MS, "to vanilla"),)
    assert [round(x / MS, 6) for x in j.iteration_times_s] == [11, 13, 13, 11]
    events = [e for e in fmt(r.log) if e[1] not in ("op_start", "op_end")]
    assert events[11:] == [
        (24.0, "iter_end", -1, -1),
        (24.0, "plan", -1, 1),
        (24.0, "iter_start", -1, -1),
        (24.0, "stall_start", 0, 0),
        (24.0, "swap_in_start", 4, 0, "lane0"),
        (26.0, "swap_in_end", 4, 0, "lane0"),
        (26.0, "stall_end", 0, 0),
        (37.0, "iter_end", -1, -1),
        (37.0, "iter_start", -1, -1),
        (48.0, "iter_end", -1, -1),
    ]
    assert j.bytes_d2h == 4 * MiB_ and j.passive_swaps == 0  # no swap-out under vanilla
    assert ctl.calls == [("arrived", 0, 0.0, (0,)), ("left", 0, 48.0, ())]
    marks = [e for e in chrome_trace(r)["traceEvents"] if e["ph"] == "i"]
    assert [(e["name"], e["ts"], e["pid"]) for e in marks] == [("plan change (version 1)", 24e3, 1)]


def test_what_the_controller_observes():
    t, _ = param_step()
    ctl = Scripted()
    run([Job(t, cross_plan(t))], ctl, iterations=2)
    r0, r1 = ctl.reports
    assert (r0.job, r0.iteration, r0.start_s, r0.end_s) == (0, 0, 0.0, 11 * MS)
    np.testing.assert_allclose(r0.op_start_s / MS, [0, 1, 3, 4, 7])
    np.testing.assert_allclose(r0.op_durations_s / MS, [1, 2, 1, 3, 4])
    assert r0.late_swap_ins == () and r0.stall_s == 0
    # it1: op0 waits 2 ms for p's swap-in, a 2 ms copy started at 11 ms
    np.testing.assert_allclose(r1.op_start_s / MS, [13, 14, 16, 17, 20])
    assert r1.late_swap_ins == (LateSwapIn(0, 0, 2 * MS, 2 * MS),)
    assert r1.stall_s == pytest.approx(2 * MS)
    assert r0.peak_bytes == r1.peak_bytes == 6 * MiB_  # p + a + g in op1 (test_model)


def test_a_later_change_replaces_a_pending_one():
    # both answered at it0's end (11 ms); the second, ready at 30 ms, replaces
    # the first (ready at 12 ms) before it took effect: it0-it2 run A, it3
    # (from 37 ms) runs vanilla, and only one change is applied.
    t, _ = param_step()
    first = PlanChange(0, None, 12 * MS, "first")
    second = PlanChange(0, None, 30 * MS, "second")
    ctl = Scripted(on_iteration={(0, 0): [first, second]})
    r = run([Job(t, cross_plan(t))], ctl)
    assert r.jobs[0].plan_versions == (0, 0, 0, 1)
    assert r.jobs[0].plan_changes == ((3, 30 * MS, "second"),)


def test_no_op_reads_an_absent_buffer_across_a_change():
    # Plan B leaves p on the host at the end of every iteration and brings it
    # back at the next one's start. Changing to vanilla, whose ops expect p
    # resident, finds p on the host with no swap-in planned: the simulator
    # must fetch it (a passive swap, 2 ms of stall) -- an op reading an
    # absent buffer would be a SimError. Changing back to B then works from
    # a resident p (its start-of-iteration swap-in is a skip).
    t, _ = param_step()
    b = plan(t, SwapOut(0, 2), SwapIn(0, -1, 0))
    to_vanilla = PlanChange(0, None, 0.0, "vanilla")
    back = PlanChange(0, b, 0.0, "B again")
    ctl = Scripted(on_iteration={(0, 0): [to_vanilla], (0, 1): [back]})
    r = run([Job(t, b)], ctl, iterations=3)
    j = r.jobs[0]
    assert j.plan_versions == (0, 1, 2)
    fetched = [e for e in fmt(r.log) if e[1].startswith("fetch")]
    assert fetched == [(11.0, "fetch_start", 0, 0, "lane0"), (13.0, "fetch_end", 0, 0, "lane0")]
    assert [x.passive_swaps for x in ctl.reports] == [0, 1, 0]
    assert [round(x.stall_s / MS, 6) for x in ctl.reports] == [0, 2, 0]


def test_changes_across_random_boundaries_keep_every_input_present():
    # every pair of plans (A, B, vanilla) switched at every boundary of a
    # 5-iteration run: the run ends without an absent read, every iteration
    # ran every op once, and the plan in force is what was asked.
    t, _ = param_step()
    plans = [cross_plan(t), plan(t, SwapOut(0, 2), SwapIn(0, -1, 0)), None]
    for k in range(9):
        order = [plans[(k + i) % 3] if i % 2 else plans[k % 3] for i in range(5)]
        on_it = {(0, i): [PlanChange(0, order[i + 1], 0.0, f"v{i + 1}")] for i in range(4)}
        ctl = Scripted(on_iteration=on_it)
        r = run([Job(t, order[0])], ctl, iterations=5)
        assert r.jobs[0].plan_versions == (0, 1, 2, 3, 4)
        starts = [e for e in r.log if e.kind.value == "op_start"]
        assert len(starts) == 5 * t.n_ops
        assert not r.oom


def test_bad_changes_are_errors():
    t, _ = param_step()
    for change, msg in [
        (PlanChange(3, None, 0.0, "x"), "no such job"),
        (PlanChange(0, None, float("nan"), "x"), "ready_s"),
    ]:
        with pytest.raises(SimError, match=msg):
            run([Job(t)], Scripted(on_iteration={(0, 0): [change]}))

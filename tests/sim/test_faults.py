"""Faults, nothing lost: arrivals mid-iteration, departures mid-copy, slow
lanes, jitter and outside usage (sim/dynamics.py), by hand and over random
scenarios (hypothesis).

Hand cases use `handtraces`: MiB sizes, 1 MiB per ms on every lane, op
durations in ms.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Roofline
from memplan.planners.core.plan import SwapIn, SwapOut
from memplan.sim import Job, LaneSlowdown, PlanChange, SimError, simulate
from memplan.sim.exports import chrome_trace
from memplan.sim.log import LogKind
from memplan.traces import synthetic

from tests.sim.handtraces import B, Call, MiB, fmt, gpu, make
from tests.sim.test_model import param_step, plan, swap_chain

K = LogKind


def three_ops():
    # op0 makes x, op1 reads x and makes y, op2 reads y: 2 ms each, 1 MiB each
    return make([B(1), B(1)], [Call([], [0], 2), Call([0], [1], 2), Call([1], [], 2)])


def test_a_second_job_landing_mid_iteration():
    # Job 1 arrives at 3 ms, in job 0's op1 (2-4 ms): it takes x's bytes at
    # once and queues for compute behind op1, so its op0 runs 4-6 ms; job 0's
    # op2, queued at 4 ms behind it, runs 6-8 ms; job 1 then has the device.
    t, lat = three_ops()
    r = simulate([Job(t), Job(t, arrival_s=0.003)], DeviceModel(gpu(), lat), iterations=1)
    assert fmt(r.log, job=True) == [
        (0, 0.0, "iter_start", -1, -1),
        (0, 0.0, "op_start", 0, -1),
        (0, 2.0, "op_end", 0, -1),
        (0, 2.0, "op_start", 1, -1),
        (1, 3.0, "iter_start", -1, -1),
        (0, 4.0, "op_end", 1, -1),
        (1, 4.0, "op_start", 0, -1),
        (1, 6.0, "op_end", 0, -1),
        (0, 6.0, "op_start", 2, -1),
        (0, 8.0, "op_end", 2, -1),
        (0, 8.0, "iter_end", -1, -1),
        (1, 8.0, "op_start", 1, -1),
        (1, 10.0, "op_end", 1, -1),
        (1, 10.0, "op_start", 2, -1),
        (1, 12.0, "op_end", 2, -1),
        (1, 12.0, "iter_end", -1, -1),
    ]
    assert (r.memory.t_s * 1e3).tolist() == [0, 2, 3, 4, 6, 8, 10, 12]
    assert (r.memory.bytes // MiB).tolist() == [1, 2, 3, 2, 3, 2, 1, 0]
    assert [j.iteration_times_s for j in r.jobs] == [(0.008,), (0.009,)]
    # what a controller sees: job 0's op2 queued 4-6 ms; job 1's op0 3-4 ms
    # and its op1 6-8 ms (behind job 0's op2)
    ctl = Recorder()
    simulate(
        [Job(t), Job(t, arrival_s=0.003)], DeviceModel(gpu(), lat), iterations=1, controller=ctl
    )
    (r0, r1) = sorted(ctl.reports, key=lambda x: x.job)
    np.testing.assert_allclose(r0.op_queue_s * 1e3, [0, 0, 2])
    np.testing.assert_allclose(r0.op_durations_s * 1e3, [2, 2, 2])
    np.testing.assert_allclose(r1.op_queue_s * 1e3, [1, 2, 0])
    np.testing.assert_allclose(r1.op_start_s * 1e3, [4, 8, 10])


class Recorder:
    def __init__(self):
        self.reports = []

    def job_arrived(self, job, now_s, jobs):
        return []

    def job_left(self, job, now_s, jobs):
        return []

    def iteration_ended(self, report):
        self.reports.append(report)
        return []


def test_departure_mid_copy():
    # a (2 MiB) copies out 1-3 ms while op1 (1-4 ms) makes b (1 MiB). The job
    # leaves at 2 ms: b's bytes return then; a's, under the running copy,
    # when the copy ends at 3 ms (NOTE [ Departures ]). Nothing else runs.
    t, lat = swap_chain()
    p = plan(t, SwapOut(0, 0), SwapIn(0, 1, 3))
    r = simulate([Job(t, p, departure_s=0.002)], DeviceModel(gpu(), lat), iterations=2)
    assert fmt(r.log) == [
        (0.0, "iter_start", -1, -1),
        (0.0, "op_start", 0, -1),
        (1.0, "op_end", 0, -1),
        (1.0, "op_start", 1, -1),
        (1.0, "swap_out_start", 0, 0, "lane0"),
        (2.0, "depart", -1, -1),
        (3.0, "swap_out_end", 0, 0, "lane0"),
    ]
    assert (r.memory.t_s * 1e3).tolist() == [0, 1, 2, 3]
    assert (r.memory.bytes // MiB).tolist() == [2, 3, 2, 0]
    j = r.jobs[0]
    assert (j.departed, j.end_s, j.iteration_times_s, j.oom) == (True, 0.002, (), False)
    marks = [e for e in chrome_trace(r)["traceEvents"] if e["ph"] == "i"]
    assert [(e["name"], e["ts"]) for e in marks] == [("departure", 2e3)]


def test_departure_before_the_last_iteration_and_without_iterations():
    # 8 ms iterations (swap_chain); leaving at 20 ms ends it2 unfinished;
    # with no iteration count the job iterates until it leaves
    t, lat = swap_chain()
    dev = DeviceModel(gpu(), lat)
    for iterations in (5, None):
        r = simulate([Job(t, iterations=iterations, departure_s=0.020)], dev)
        assert r.jobs[0].iteration_times_s == (0.008, 0.008)
        assert r.jobs[0].end_s == 0.020
    # it leaves after its last iteration: nothing happens at its departure
    r = simulate([Job(t, iterations=1, departure_s=0.020)], dev)
    assert (r.jobs[0].departed, r.jobs[0].end_s, r.makespan_s) == (False, 0.008, 0.008)
    with pytest.raises(SimError, match="departure_s"):
        simulate([Job(t, arrival_s=0.01, departure_s=0.01)], dev)


def test_a_slow_lane_window():
    # a's swap-out starts at 1 ms: 2 ms of work; the lane is 2x slower until
    # 2 ms, so 1-2 ms does half a ms of it and the rest ends at 3.5 ms. Its
    # swap-in (at 4 ms, after the window) is full speed.
    t, lat = swap_chain()
    p = plan(t, SwapOut(0, 0), SwapIn(0, 1, 3))
    slow = [LaneSlowdown(2.0, 0.0, 0.002)]
    for lanes in (1, 2):
        dev = DeviceModel(gpu(), lat, lanes=lanes)
        r = simulate([Job(t, p)], dev, iterations=1, lane_slowdowns=slow)
        copies = [e[:2] for e in fmt(r.log) if len(e) == 5]
        assert copies == [(1.0, "swap_out_start"), (3.5, "swap_out_end")] + [
            (4.0, "swap_in_start"),
            (6.0, "swap_in_end"),
        ]
    with pytest.raises(SimError, match="factor"):
        LaneSlowdown(0.5, 0.0, 1.0)


def test_jitter_is_seeded():
    t = synthetic.chain(3)
    dev = DeviceModel(gpu(), Roofline())
    base = simulate([t, t], dev)
    zero = simulate([t, t], dev, jitter=0.0, seed=5)
    a = simulate([t, t], dev, jitter=0.3, seed=1)
    b = simulate([t, t], dev, jitter=0.3, seed=1)
    c = simulate([t, t], dev, jitter=0.3, seed=2)
    assert zero.log == base.log
    assert a.log == b.log and a.to_dict() == b.to_dict()
    assert a.log != c.log and a.log != base.log
    with pytest.raises(SimError, match="jitter"):
        simulate([t], dev, jitter=math.nan)


def test_outside_usage_stretches_every_kernel():
    # the roofline stretches an op by 1 / (1 - usage): twice as long at 0.5
    t = synthetic.chain(3)
    dev = DeviceModel(gpu(), Roofline())
    alone = simulate([t], dev, iterations=1).jobs[0].iteration_time_s
    half = simulate([t], dev, iterations=1, usage=0.5).jobs[0].iteration_time_s
    assert half == pytest.approx(2 * alone, rel=1e-6)
    with pytest.raises(SimError, match="usage"):
        simulate([t], dev, usage=1.5)


def test_a_job_arriving_when_the_lane_is_most_booked():
    # Job 0 swaps out a and c (2 MiB each) after op0: at 1 ms both queue, 4 ms
    # of copies ahead -- the most the lane is ever booked. Job 1 lands at that
    # instant with the same plan: its swap-outs wait behind job 0's (5-9 ms),
    # job 0's swap-in of a follows (9-11 ms), then job 1's (11-13 ms); each
    # c comes back by cancelling its own swap-out's free (a skip: its swap-in
    # triggers at 5 and 8 ms, while that swap-out is still on the lane).
    t, lat = make(
        [B(2), B(2), B(1), B(1)],
        [Call([], [0, 1], 1), Call([], [2], 3), Call([], [3], 3), Call([0, 1], [], 1)],
    )
    p = plan(t, SwapOut(0, 0), SwapOut(1, 0), SwapIn(0, 1, 3), SwapIn(1, 1, 3))
    jobs = [Job(t, p), Job(t, p, arrival_s=0.001)]
    r = simulate(jobs, DeviceModel(gpu(), lat), iterations=1, budget=12 * MiB, oom="passive")
    copies = [e[:5] for e in fmt(r.log, job=True) if len(e) == 6 and e[2].endswith("start")]
    assert copies == [
        (0, 1.0, "swap_out_start", 0, 0),
        (0, 3.0, "swap_out_start", 0, 1),
        (1, 5.0, "swap_out_start", 0, 0),
        (1, 7.0, "swap_out_start", 0, 1),
        (0, 9.0, "swap_in_start", 1, 0),
        (1, 11.0, "swap_in_start", 1, 0),
    ]
    assert [(j.iteration_times_s, j.passive_swaps) for j in r.jobs] == [((0.015,), 0)] * 2
    assert_nothing_lost(r, 12 * MiB)


# ---- invariants over random scenarios ----------------------------------------------
def assert_nothing_lost(r, budget: int) -> None:
    """No negative or unordered times, one kernel at a time, one copy per
    lane at a time, each job's time accounted, the budget held or OOM."""
    times = [e.t_us for e in r.log]
    assert all(x >= 0 and math.isfinite(x) for x in times)
    assert times == sorted(times)
    busy = []  # compute intervals: ops and recomputes of every job
    lanes: dict[int, list] = {}
    for j in r.jobs:
        assert 0 <= j.start_s <= j.end_s and all(x >= 0 for x in j.iteration_times_s)
        assert j.stall_s >= 0 and j.recompute_s >= 0
    open_: dict[tuple, float] = {}
    for e in r.log:
        key = (e.job, e.op, e.buffer)
        if e.kind in (K.OP_START, K.RECOMPUTE_START):
            open_[("c", *key)] = e.t_us
        elif e.kind in (K.OP_END, K.RECOMPUTE_END):
            busy.append((open_.pop(("c", *key)), e.t_us))
        elif e.lane >= 0 and e.kind.value.endswith("_start"):
            open_[("l", *key)] = e.t_us
        elif e.lane >= 0:
            lanes.setdefault(e.lane, []).append((open_.pop(("l", *key)), e.t_us))
    for spans in (busy, *lanes.values()):
        spans.sort()
        assert all(a[1] <= b[0] + 1e-6 for a, b in zip(spans, spans[1:], strict=False))
    if not r.oom:
        assert r.device_peak_bytes <= budget
    for j in r.jobs:  # alone on the device: its time is kernels + recompute + stall
        if len(r.jobs) == 1 and not j.oom and not j.departed:
            kernels = sum(b - a for a, b in busy) / 1e6 - j.recompute_s
            assert j.end_s - j.start_s == pytest.approx(kernels + j.recompute_s + j.stall_s)


class Flip:
    """A controller switching each job between its plan and vanilla at the
    iterations `at` names, ready at once or later."""

    def __init__(self, plans, at):
        self.plans, self.at = plans, at

    def job_arrived(self, job, now_s, jobs):
        return []

    def job_left(self, job, now_s, jobs):
        return []

    def iteration_ended(self, rep):
        delay = self.at.get((rep.job, rep.iteration))
        if delay is None:
            return []
        own = self.plans[rep.job]
        return [PlanChange(rep.job, None if rep.iteration % 2 == 0 else own, rep.end_s + delay, "")]


def cases():
    st_, sl = param_step(), swap_chain()
    return [
        (st_[0], plan(st_[0], SwapOut(0, 2), SwapIn(0, 4, 0, next_iteration=True)), st_[1]),
        (st_[0], plan(st_[0], SwapOut(0, 2), SwapIn(0, -1, 0)), st_[1]),
        (sl[0], plan(sl[0], SwapOut(0, 0), SwapIn(0, 1, 3)), sl[1]),
    ]


CASES = cases()


@st.composite
def scenarios(draw):
    n = draw(st.integers(1, 3))
    picks = [draw(st.integers(0, len(CASES) - 1)) for _ in range(n)]
    jobs = []
    for k in picks:
        t, p, _lat = CASES[k]
        arrival = draw(st.sampled_from([0.0, 0.001, 0.0025, 0.007, 0.011]))
        leave = draw(st.sampled_from([None, 0.002, 0.005, 0.013, 0.03]))
        departure = None if leave is None else arrival + leave
        jobs.append(Job(t, p, arrival_s=arrival, iterations=3, departure_s=departure))
    windows = draw(st.lists(st.tuples(st.sampled_from([2.0, 5.0]), st.integers(0, 20)), max_size=2))
    slow = [LaneSlowdown(f, a / 1e3, (a + 4) / 1e3) for f, a in windows]
    at = {(j, i): draw(st.sampled_from([0.0, 0.004])) for j in range(n) for i in range(2)}
    return dict(
        jobs=jobs,
        picks=picks,
        jitter=draw(st.sampled_from([0.0, 0.2, 1.0])),
        seed=draw(st.integers(0, 3)),
        oom=draw(st.sampled_from(["fail", "stall", "passive", "dtr"])),
        budget_mib=draw(st.integers(4, 24)),
        lanes=draw(st.sampled_from([1, 2])),
        slow=slow,
        flip=draw(st.booleans()),
        at=at,
    )


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_random_scenarios_and_faults_lose_nothing(sc):
    # every case's ops have the same latencies per trace: one latency model per trace
    lat = CASES[sc["picks"][0]][2]
    if len({id(CASES[k][0]) for k in sc["picks"]}) > 1:
        lat = _per_trace_latency(sc["picks"])
    ctl = Flip([j.plan for j in sc["jobs"]], sc["at"]) if sc["flip"] else None
    budget = sc["budget_mib"] * MiB
    r = simulate(
        sc["jobs"],
        DeviceModel(gpu(), lat, lanes=sc["lanes"]),
        budget=budget,
        oom=sc["oom"],
        seed=sc["seed"],
        jitter=sc["jitter"],
        lane_slowdowns=sc["slow"],
        controller=ctl,
    )
    assert_nothing_lost(r, budget)
    for j, job in zip(r.jobs, sc["jobs"], strict=True):
        done = len(j.iteration_times_s)
        assert done == 3 or j.oom or j.departed
        assert len(j.plan_versions) == done
        if job.departure_s is not None and j.departed:
            assert j.end_s == pytest.approx(job.departure_s)


class _PerTrace:
    """Fixed latencies looked up by trace (the hand traces differ in ops)."""

    name = "per-trace"

    def __init__(self, by_trace):
        self.by_trace = by_trace

    def predict_all(self, trace, hw, usage=0.0):
        return np.asarray(self.by_trace[id(trace)].predict_all(trace, hw, usage))


def _per_trace_latency(picks):
    return _PerTrace({id(CASES[k][0]): CASES[k][2] for k in picks})


def test_progress_counts_the_iterations_of_all_jobs():
    t, lat = three_ops()
    calls: list[int] = []
    r = simulate([Job(t), Job(t, arrival_s=0.003)], DeviceModel(gpu(), lat), progress=calls.append)
    assert calls == [1, 2, 3, 4, 5, 6]
    assert r.log == simulate([Job(t), Job(t, arrival_s=0.003)], DeviceModel(gpu(), lat)).log

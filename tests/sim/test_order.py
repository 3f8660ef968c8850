"""The simulator runs a plan's op order (NOTE [ Plans under another order ]):
on two independent branches, running one branch to its end before the other
lowers the peak, by bytes worked out by hand."""

from __future__ import annotations

import pytest
from memplan.hwmodels.device import DeviceModel, TimeUnit
from memplan.planners.core.plan import Plan, Release, fingerprint_of
from memplan.sim import Job, SimError, simulate
from memplan.sim.job import CompiledJob

from tests.planners.test_plan_order import BRANCHES_FIRST, interleaved
from tests.sim.handtraces import MiB, fmt, gpu


def run(order):
    t, lat = interleaved()
    plan = Plan(fingerprint_of(t), order=order)
    return simulate([Job(t, plan)], DeviceModel(gpu(), lat), iterations=1)


def test_reordering_two_branches_lowers_the_peak():
    # Trace order 0,1,2,3,4 (MiB resident while each op runs, its outputs made):
    #   op0 x+a1 = 1+4 = 5; op1 +b1 = 9, x freed -> 8; op2 +a2 = 9, a1 freed -> 5;
    #   op3 +b2 = 6, b1 freed -> 2; op4 +out = 3.  Peak 9 MiB.
    # Order 0,2,1,3,4: op0 5; op2 +a2 = 6, a1 freed -> 2; op1 +b1 = 6, x freed -> 5;
    #   op3 +b2 = 6, b1 freed -> 2; op4 +out = 3.  Peak 6 MiB.
    assert run(None).peak_bytes == 9 * MiB
    assert run(BRANCHES_FIRST).peak_bytes == 6 * MiB
    assert run(tuple(range(5))).peak_bytes == 9 * MiB


def test_the_ops_run_in_the_plan_order():
    res = run(BRANCHES_FIRST)
    starts = [row[2] for row in fmt(res.log) if row[1] == "op_start"]
    assert starts == list(BRANCHES_FIRST)
    # every op takes 1 ms; the iteration is as long whatever the order
    assert res.jobs[0].iteration_time_s == run(None).jobs[0].iteration_time_s


def test_dtr_refuses_a_reordered_plan():
    # DTR's remakes reason in the trace's op order (sim/remat.py)
    t, lat = interleaved()
    plan = Plan(fingerprint_of(t), order=BRANCHES_FIRST)
    with pytest.raises(SimError, match=r"^job 0: oom=dtr remakes buffers in the trace's op order"):
        simulate([Job(t, plan)], DeviceModel(gpu(), lat), budget=8 * MiB, oom="dtr")
    identity = Plan(fingerprint_of(t), order=tuple(range(5)))
    simulate([Job(t, identity)], DeviceModel(gpu(), lat), budget=16 * MiB, oom="dtr")


def test_the_per_op_tuples_follow_the_plan_in_use():
    """NOTE [ One tuple per op ]: `ops[i]` is op i's row of the tables, with
    the events after op i, at the start and after a plan change."""
    t, lat = interleaved()
    dev = DeviceModel(gpu(), lat)
    c = CompiledJob(0, Job(t, Plan(fingerprint_of(t), (Release(1, 0),))), 1, dev)

    def rows(c):
        return [
            (c.accs[i], c.need[i], c.create[i], c.create_bytes[i], c.writes[i], c.frees[i],
             c.triggers[i + 1])
            for i in range(t.n_ops)
        ]  # fmt: skip

    assert list(c.ops) == rows(c) and c.ops[0][6]  # the release after op 0
    c.use_plan(Plan(fingerprint_of(t), order=BRANCHES_FIRST), dev)
    assert list(c.ops) == rows(c) and not any(op[6] for op in c.ops)


def test_the_loop_runs_the_plan_s_order_and_one_float_per_duration():
    """NOTE [ Fewer streams per op ]: the trace's order as a range, the
    plan's own as given; the kernels' durations, equal values one object."""
    t, lat = interleaved()
    dev = DeviceModel(gpu(), lat)
    c = CompiledJob(0, Job(t, Plan(fingerprint_of(t))), 1, dev)
    assert c.order == range(t.n_ops)
    c.use_plan(Plan(fingerprint_of(t), order=BRANCHES_FIRST), dev)
    assert tuple(c.order) == BRANCHES_FIRST
    want = dev.op_durations(t, TimeUnit.US).tolist()
    assert c.kernels == want and len(set(want)) < len(want)  # some ops last as long
    seen: dict[float, int] = {}  # duration -> id() of its object
    for x in c.kernels:
        assert seen.setdefault(x, id(x)) == id(x), x

"""Dynamic workloads through the app shell's controllers: TENSILE_up's
EWMA-triggered re-plans (the plan in force per iteration, worked out by
hand), Capuchin's in-trigger feedback against the simulator's own reports,
and the phases of a run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Fixed, Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners.core.plan import SwapIn, SwapOut
from memplan.planners.heuristics.capuchin.measured import FEEDBACK_FRACTION
from memplan.planners.heuristics.tensile.update import PlanningTime, UpdateOptions
from memplan.sim import Job, simulate
from memplan.traces import synthetic

from memplan.controllers import CapuchinController, TensileController
from memplan.dynamic import phases, run_dynamic

HW = load_hardware("rtx-a6000")
NO_TIME = PlanningTime(0.0, 0.0)


def test_ewma_replans_at_the_boundary_until_the_estimates_settle():
    # The scheduler predicts every op at 2 ms; it runs in 1 ms. With alpha
    # 0.3 the estimate after k observed iterations is e_k = 1 + 0.7^k (ms),
    # and the change rate is |e_k - e_p| / e_p, e_p the estimate the plan in
    # force was made from: after iteration 0, |1.7 - 2| / 2 = 0.15; after 1,
    # |1.49 - 1.7| / 1.7 = 0.1235; after 2, |1.343 - 1.49| / 1.49 = 0.0987
    # (no re-plan: the sum planned from stays 1.49); after 3,
    # |1.2401 - 1.49| / 1.49 = 0.1677. With threshold 0.1: re-plans after
    # iterations 0, 1 and 3. Planning takes no time, so each re-plan is in
    # force from the next iteration.
    t = synthetic.chain(3)
    run_dev = DeviceModel(HW, Fixed(np.full(t.n_ops, 1e-3)))
    pred_dev = DeviceModel(HW, Fixed(np.full(t.n_ops, 2e-3)))
    up = UpdateOptions(threshold=0.1, alpha=0.3)
    ctl = TensileController([t], pred_dev, None, update=up, planning=NO_TIME)
    res = simulate([Job(t)], run_dev, iterations=5, controller=ctl)
    job = res.jobs[0]
    # 1: the plan made at arrival, in force from iteration 0 (NOTE [ Plans at arrival ])
    assert job.plan_versions == (1, 2, 3, 3, 4)
    assert [(it, reason) for it, _, reason in job.plan_changes] == [
        (0, "arrival of job 0"),
        (1, "latency change rate 0.15 > 0.1"),
        (2, "latency change rate 0.124 > 0.1"),
        (4, "latency change rate 0.168 > 0.1"),
    ]
    # TENSILE_cs: the arrival plan and nothing else
    cs = TensileController([t], pred_dev, None, planning=NO_TIME)
    assert (
        simulate([Job(t)], run_dev, iterations=5, controller=cs).jobs[0].plan_versions == (1,) * 5
    )


def test_a_replan_waits_for_the_boundary_after_its_planning_time():
    # same drift; an iteration is 12 ops x 1 ms = 12 ms (and the plan's
    # copies), planning 12 ops x 1.5 ms = 18 ms, 1.5 iterations. The
    # re-plan made at the end of iteration 0 (rate 0.15) is ready 18 ms
    # later and taken at the start of iteration 3; the reports of
    # iterations 1 and 2 come while it is pending: no re-plan (NOTE [ One
    # re-plan at a time ]). After iteration 3, against the 1.7 ms it was
    # made from, the estimate 1 + 0.7^4 = 1.2401 ms is 0.27 off: a re-plan,
    # ready after the run.
    t = synthetic.chain(3)
    assert t.n_ops == 12
    run_dev = DeviceModel(HW, Fixed(np.full(t.n_ops, 1e-3)))
    pred_dev = DeviceModel(HW, Fixed(np.full(t.n_ops, 2e-3)))
    slow = PlanningTime(0.0, 1.5e-3)
    ctl = TensileController([t], pred_dev, None, update=UpdateOptions(0.1), planning=slow)
    job = simulate([Job(t)], run_dev, iterations=5, controller=ctl).jobs[0]
    assert job.plan_versions == (1, 1, 1, 2, 2)
    ends = [r.end_s for r in ctl.record.reports]
    assert [(it, why) for it, _, why in job.plan_changes] == [
        (0, "arrival of job 0"),
        (3, "latency change rate 0.15 > 0.1"),
    ]
    assert job.plan_changes[1][1] == pytest.approx(ends[0] + 0.018)
    assert ends[1] < ends[0] + 0.018 <= ends[2]
    (_, ready, why) = ctl.record.changes[-1]
    assert (ready, why) == (pytest.approx(ends[3] + 0.018), "latency change rate 0.271 > 0.1")
    assert len(ctl.record.changes) == 3


def test_capuchin_feedback_moves_late_in_triggers_by_five_percent_of_the_copy():
    t = synthetic.chain(6, act_mib=64)
    dev = DeviceModel(HW, Roofline())
    vanilla = simulate([t], dev, iterations=1)
    budget = int(0.6 * vanilla.peak_bytes)
    ctl = CapuchinController([t], dev, budget, planning=NO_TIME)
    seen = []
    orig = ctl.iteration_ended

    def spy(report):
        before = ctl.measured.get(report.job)
        old = before.plan if before else None
        out = orig(report)
        seen.append((report, old, out))
        return out

    ctl.iteration_ended = spy
    res = simulate([t], dev, iterations=6, budget=budget, oom="passive", controller=ctl)
    feedback = [(r, old, out) for r, old, out in seen if out and "feedback" in out[0].reason]
    assert res.jobs[0].plan_versions[0] == 0  # iteration 0: no plan, measured
    assert res.jobs[0].plan_versions[1] == 1  # planned from it
    assert feedback, "the hand-sized swaps should arrive late at least once"
    tl = ctl.measured[0].timeline

    def at(ev):
        return (0.0 if ev.after_op < 0 else float(tl.end_us[ev.after_op])) + ev.delay_us

    moved = 0
    for report, old, out in feedback:
        new = out[0].plan
        late = {(x.buffer, x.before_op): x.copy_s for x in report.late_swap_ins}
        for a, b in zip(old.events, new.events, strict=True):
            if not isinstance(a, SwapIn) or (a.buffer, a.before_op) not in late:
                assert a == b
                continue
            evict = max(
                e.after_op for e in old.events if isinstance(e, SwapOut) and e.buffer == a.buffer
            )
            want = max(
                at(a) - FEEDBACK_FRACTION * late[(a.buffer, a.before_op)] * 1e6, at_op(tl, evict)
            )
            assert at(b) == pytest.approx(want, abs=1e-6)
            moved += want > at_op(tl, evict)
    # some moved by the whole 5% step, not only to the clamp at the eviction
    assert moved > 0


def at_op(tl, op):
    return 0.0 if op < 0 else float(tl.end_us[op])


def test_phases_of_two_jobs_one_arriving_later():
    # vanilla: a's iterations are 12 ms alone; b arrives at 20.5 ms, inside
    # a's iteration 1 (12-27 ms, slowed by b's kernels in the queue). Cold:
    # a0, b0; one job: a1 (it started before b arrived); two jobs: a2, b1,
    # a3 (b leaves at 68 ms, after a3 started at 51 ms).
    t = synthetic.chain(3)
    dev = DeviceModel(HW, Fixed(np.full(t.n_ops, 1e-3)))
    jobs = [Job(t, iterations=4, name="a"), Job(t, arrival_s=0.0205, iterations=2, name="b")]
    run = run_dynamic(jobs, dev, ["tensile_cs"], planning=NO_TIME)
    got = phases(run)
    starts = [(r.job, r.iteration, r.start_s) for r in run.vanilla.record.reports]
    want = [(0, 0, 0.0), (0, 1, 0.012), (1, 0, 0.0205), (0, 2, 0.027), (1, 1, 0.044), (0, 3, 0.051)]
    assert [(j, i, round(t, 9)) for j, i, t in starts] == want
    assert [(p.method, p.label, p.iterations) for p in got] == [
        ("vanilla", "cold start", 2),
        ("vanilla", "1 job, after arrival 1", 1),
        ("vanilla", "2 jobs, after arrival 2", 3),
        ("tensile_cs", "cold start", 2),
        ("tensile_cs", "1 job, after arrival 1", 1),
        ("tensile_cs", "2 jobs, after arrival 2", 3),
    ]
    # a1 ran 15 ms: b's kernels queue with its last 6.5 ms of ops from 20.5 ms
    assert got[1].mean_iteration_s == pytest.approx(0.015)
    assert [p.metrics.msr for p in got[:3]] == [0.0, 0.0, 0.0]
    # the budget is 70% of vanilla's device peak, and every phase's peak is
    # the memory curve's most within its iterations
    assert run.budget_bytes == int(0.7 * run.vanilla.result.device_peak_bytes)
    assert max(p.peak_bytes for p in got[:3]) == run.vanilla.result.peak_bytes
    again = run_dynamic(jobs, dev, ["tensile_cs"], planning=NO_TIME)
    assert phases(again) == got


def test_compare_dynamic_from_the_cli_is_the_same_for_the_same_seed(tmp_path, capsys):
    from memplan.traces import io

    from memplan.cli import main

    path = tmp_path / "chain.json"
    io.save(synthetic.chain(4, act_mib=16), path)
    argv = ["compare", "--gpu", "rtx-a6000", "--job", f"{path}@0s:30", "--job",
            f"{path}@2ms:20", "--dynamic", "tensile_up,capuchin", "--jitter", "0.2",
            "--seed", "7", "--budget", "80%", "--json"]  # fmt: skip
    assert main(argv) == 0
    first = json.loads(capsys.readouterr().out)
    assert main([*argv, "--out", str(tmp_path / "rep")]) == 0
    assert json.loads(capsys.readouterr().out) == first
    assert {p.name for p in (tmp_path / "rep").iterdir()} == {
        "report.md",
        "report.json",
        "timeline.png",
    }
    methods = {p["method"] for p in first["phases"]}
    assert methods == {"vanilla", "tensile_up", "capuchin"}
    assert set(first["totals"]) == {"tensile_up", "capuchin"}
    # capuchin's first plan is the one measured from iteration 0
    reasons = [c["reason"] for c in first["plan_changes"]["capuchin"]]
    assert reasons and reasons[0] == "planned from measured iteration 0"
    assert main([*argv[:-3], "--seed", "8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) != first


def test_compare_dynamic_names_an_unknown_method(tmp_path, capsys):
    from memplan.traces import io

    from memplan.cli import main

    path = tmp_path / "chain.json"
    io.save(synthetic.chain(2), path)
    argv = ["compare", str(path), "--gpu", "rtx-a6000", "--dynamic", "tensile,vdnn"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown method 'tensile'" in err[0]

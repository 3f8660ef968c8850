"""`--fallback` and percentage budgets in compare, simulate and plan
(NOTE [ The safety net ] in memplan/comparison.py)."""

from __future__ import annotations

import json
from pathlib import Path

from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.sim import simulate
from memplan.traces import io

from memplan.cli import main
from memplan.comparison import vanilla_peak

ROOT = Path(__file__).resolve().parents[2]
RESNET = str(ROOT / "traces" / "data" / "resnet50_b16_adam.json.gz")
DEV = DeviceModel(load_hardware("rtx-a6000"), Roofline())


def _rows(capsys) -> dict:
    return {r["planner"]: r for r in json.loads(capsys.readouterr().out)["rows"]}


def test_a_row_says_how_it_fit(capsys):
    """At half the vanilla peak vDNN's plan and the bare job run out without a
    net; with the dtr net the job finishes, evicting; squeeze fits alone."""
    argv = ["compare", RESNET, "--gpu", "rtx-a6000", "--budget", "50%", "--json",
            "--planners", "vdnn,squeeze,dtr,passive", "--option", "squeeze.max_evaluations=60"]  # fmt: skip
    assert main([*argv, "--fallback", "none"]) == 0
    alone = _rows(capsys)
    assert main([*argv, "--fallback", "dtr"]) == 0
    net = _rows(capsys)
    budget = int(vanilla_peak([io.load(RESNET)], DEV) * 0.5)
    for rows in (alone, net):
        assert {r["budget_bytes"] for r in rows.values()} == {budget}
        assert rows["squeeze"]["fit"] == "alone" and rows["squeeze"]["feasible"]
        for w in ("dtr", "passive"):  # witnesses: no plan, the policy alone
            assert rows[w]["fit"] == "net" and rows[w]["evictions"] > 0 and not rows[w]["feasible"]
    if alone["vdnn"]["fit"] != "alone":
        assert alone["vdnn"]["fit"] == "oom" and alone["vdnn"]["iteration_time_s"] is None
        assert net["vdnn"]["fit"] == "net" and net["vdnn"]["evictions"] > 0
        assert not net["vdnn"]["feasible"]
    best_witness = min(net[w]["iteration_time_s"] for w in ("dtr", "passive"))
    assert net["squeeze"]["iteration_time_s"] <= best_witness
    assert net["squeeze"]["bound"] and net["squeeze"]["gap"] >= -1e-9


def test_simulate_takes_the_net_and_a_share(capsys):
    argv = ["simulate", RESNET, "--gpu", "rtx-a6000", "--budget", "50%", "--json"]
    assert main([*argv, "--fallback", "dtr"]) == 0
    doc = json.loads(capsys.readouterr().out)
    job = doc["jobs"][0]
    assert not job["oom"] and job["evictions"] > 0
    assert main([*argv, "--oom", "fail"]) == 0  # the old name still works
    assert json.loads(capsys.readouterr().out)["jobs"][0]["oom"]
    expected = simulate([io.load(RESNET)], DEV, budget=1 << 40).peak_bytes // 2
    assert doc["budget_bytes"] == expected


def test_plan_says_whether_the_plan_fits(capsys, tmp_path):
    argv = ["plan", RESNET, "--gpu", "rtx-a6000", "--planner", "vdnn", "--budget", "50%", "--json"]
    assert main([*argv, "--fallback", "dtr"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["simulated"]["fallback"] == "dtr"
    assert doc["simulated"]["fit"] in ("alone", "net")


def test_bad_fallback_and_share_are_one_line_errors(capsys):
    for extra in (["--fallback", "lru"], ["--budget", "0%"], ["--budget", "abc%"]):
        argv = ["compare", RESNET, "--gpu", "rtx-a6000", "--planners", "vdnn", *extra]
        try:
            code = main(argv)
        except SystemExit as e:  # argparse's own choice check
            code = e.code
        assert code == 2
        assert "Traceback" not in capsys.readouterr().err


def test_a_plan_the_simulator_runs_out_on_never_fits(monkeypatch):
    """A planner that claims its plan fits (PLANNED) is judged by the
    simulation: out of memory there, the row is not feasible, whatever the
    planner said; with a net it is 'net', never 'alone'."""
    from memplan.planners import registry
    from memplan.planners.core.options import NoOptions
    from memplan.planners.core.plan import PlanResult, Status
    from memplan.planners.heuristics.vanilla import release_only_plan

    from memplan.comparison import Fit, compare_planners, vanilla_peak
    from memplan.runconfig import RunConfig

    def boastful(traces, device, *, budget_bytes=None, options=None):
        return PlanResult("boastful", Status.PLANNED, [release_only_plan(t) for t in traces])

    monkeypatch.setattr(registry, "_EXTRA", dict(registry._EXTRA))  # the test's own
    registry.register(registry.PlannerSpec("boastful", boastful, NoOptions))
    trace = io.load(RESNET)
    half = int(vanilla_peak([trace], DEV) * 0.5)
    for fallback, fit in (("none", Fit.OOM), ("passive", Fit.NET)):
        c = compare_planners(
            [trace], DEV, ["boastful"], budget=half, config=RunConfig(fallback=fallback)
        )
        (row,) = c.rows
        assert row.fit == fit and not row.feasible


def test_bounds_take_a_share_of_the_vanilla_peak(capsys):
    argv = ["bounds", RESNET, "--gpu", "rtx-a6000", "--time-limit", "0", "--json"]
    assert main([*argv, "--budget", "50%"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["budget_bytes"] == vanilla_peak([io.load(RESNET)], DEV) // 2

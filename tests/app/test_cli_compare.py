"""`memplan compare` and `memplan plan` end to end on a shipped trace."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from memplan.planners.core import io as plan_io
from memplan.planners.core.check import check
from memplan.traces import io

from memplan.cli import main

ROOT = Path(__file__).resolve().parents[2]
RESNET = str(ROOT / "traces" / "data" / "resnet50_b16_adam.json.gz")
HEURISTICS = ["release_only", "tensile", "capuchin", "vdnn", "checkpoint"]


def test_compare_json_rows_and_report(tmp_path, capsys):
    out = tmp_path / "report"
    argv = ["compare", RESNET, "--gpu", "rtx-a6000", "--planners", ",".join(HEURISTICS),
            "--out", str(out), "--json"]  # fmt: skip
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    rows = {r["planner"]: r for r in doc["rows"]}
    assert list(rows) == HEURISTICS
    keys = {"planner", "feasible", "peak_bytes", "msr", "eor", "cbr", "iteration_time_s",
            "plan_time_s"}  # fmt: skip
    assert all(keys <= r.keys() for r in rows.values())
    vanilla = doc["vanilla"]["peak_bytes"]
    trace = io.load(RESNET)
    assert vanilla == trace.peak("framework")[0]
    for r in rows.values():
        assert r["feasible"], r
        assert r["peak_bytes"] <= vanilla
        assert r["msr"] == pytest.approx((vanilla - r["peak_bytes"]) / vanilla)
        assert r["cbr"] == pytest.approx(r["msr"] / r["eor"])
    assert rows["release_only"]["peak_bytes"] == trace.peak("liveness")[0]
    assert rows["tensile"]["eor"] == pytest.approx(1.0)  # TENSILE hides every swap
    # capuchin got the peak TENSILE reached as its budget
    assert rows["capuchin"]["budget_bytes"] == rows["tensile"]["peak_bytes"]
    names = {p.name for p in (out / "plans").iterdir()}
    assert names == {f"{n}.json" for n in HEURISTICS}
    assert {"report.md", "report.json", "memory.png"} <= {p.name for p in out.iterdir()}
    result = plan_io.load(out / "plans" / "tensile.json", [trace])
    check(result.plans[0], trace)


def test_compare_reports_a_budget_it_cannot_meet_as_infeasible(capsys):
    argv = ["compare", RESNET, "--gpu", "rtx-a6000", "--planners", "tensile,checkpoint",
            "--budget", "500MiB", "--json"]  # fmt: skip
    assert main(argv) == 0
    rows = json.loads(capsys.readouterr().out)["rows"]
    assert [r["feasible"] for r in rows] == [False, False]


def test_two_jobs_share_one_lane(capsys):
    argv = ["compare", f"{RESNET}:2", "--gpu", "rtx-a6000", "--planners", "tensile", "--json"]
    assert main(argv) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["jobs"] == ["resnet50#0", "resnet50#1"]
    assert doc["rows"][0]["feasible"]


def test_plan_writes_a_checked_plan(tmp_path, capsys):
    out = tmp_path / "plan.json"
    argv = ["plan", RESNET, "--planner", "checkpoint", "--gpu", "rtx-a6000", "--out", str(out)]
    assert main(argv) == 0
    assert "checkpoint: planned" in capsys.readouterr().out
    trace = io.load(RESNET)
    check(plan_io.load(out, [trace]).plans[0], trace)


def test_plan_takes_an_option_with_or_without_its_planner_s_name(tmp_path, capsys):
    def events(*option: str) -> list:
        out = tmp_path / f"{len(list(tmp_path.iterdir()))}.json"
        argv = ["plan", RESNET, "--planner", "checkpoint", "--gpu", "rtx-a6000", "--out", str(out)]
        assert main([*argv, *option]) == 0
        return json.loads(out.read_text())["plans"][0]["events"]

    two = events("--option", "segments=2")
    assert events("--option", "checkpoint.segments=2") == two  # as compare takes it
    assert events("--option", "segments=3") != two  # the option is read
    capsys.readouterr()
    argv = ["plan", RESNET, "--planner", "checkpoint", "--gpu", "rtx-a6000",
            "--option", "tensile.recompute=false"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "an option of 'tensile', but the planner is 'checkpoint'" in err[0]


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--planners", "nope"], "unknown planner 'nope'"),
        (["--option", "tensile.nope=1", "--planners", "tensile"], "unknown option 'nope'"),
        (["--option", "vdnn.layers=all", "--planners", "tensile"], "is not being compared"),
        (["--budget", "12QB"], "--budget='12QB'"),
        (["--gpu", "no-such-gpu"], "no-such-gpu"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    base = ["compare", RESNET, "--gpu", "rtx-a6000"]
    if "--gpu" in argv:
        base = base[:2]
    assert main(base + argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_count_suffix_must_be_a_number(capsys):
    assert main(["compare", f"{RESNET}:x", "--gpu", "rtx-a6000"]) == 2
    assert "COUNT after ':'" in capsys.readouterr().err


def test_cpsat_joins_the_comparison_with_a_gap_to_the_bound(capsys):
    argv = ["compare", RESNET, "--gpu", "a100-pcie-40gb", "--planners", "tensile,cpsat",
            "--budget", "1.45GiB", "--time-limit", "20", "--json"]  # fmt: skip
    assert main(argv) == 0
    rows = {r["planner"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["cpsat"]["feasible"] and rows["tensile"]["feasible"]
    # the bound holds for every plan, and CP-SAT is never worse than its TENSILE hint
    assert rows["cpsat"]["gap"] >= -1e-6 and rows["tensile"]["gap"] >= -1e-6
    assert rows["cpsat"]["iteration_time_s"] <= rows["tensile"]["iteration_time_s"] * (1 + 1e-6)
    assert rows["cpsat"]["peak_bytes"] <= int(1.45 * 2**30)

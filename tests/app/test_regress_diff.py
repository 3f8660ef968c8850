"""Tolerances and verdicts of `memplan regress`, worked out by hand (NOTE
[ Regression tolerances ]): no scenario runs here."""

from __future__ import annotations

import pytest

from memplan.regress import baseline as bl
from memplan.regress.diff import SCENARIO, Verdict, counts, diff, markdown, verdict
from memplan.regress.suite import SuiteError, Tolerance, parse_suite


# Figures are binary fractions, so |now - baseline| and rel * |baseline| are exact.
@pytest.mark.parametrize(
    "tol, baseline, now, ok",
    [
        (Tolerance(abs=0.5), 8.0, 8.5, True),  # on the abs boundary
        (Tolerance(abs=0.5), 8.0, 7.5, True),
        (Tolerance(abs=0.5), 8.0, 8.5 + 2**-40, False),
        (Tolerance(rel=0.25), 8.0, 10.0, True),  # 0.25 * 8 = 2: on the rel boundary
        (Tolerance(rel=0.25), 8.0, 6.0, True),
        (Tolerance(rel=0.25), 8.0, 10.0 + 2**-40, False),
        (Tolerance(rel=0.25), -8.0, -10.0, True),  # relative to |baseline|
        (Tolerance(abs=0.5, rel=0.25), 8.0, 10.0, True),  # rel allows more than abs
        (Tolerance(abs=0.5, rel=0.25), 1.0, 1.5, True),  # abs allows more than rel
        (Tolerance(abs=0.5, rel=0.25), 1.0, 1.5 + 2**-40, False),
        (Tolerance(rel=0.25), 0.0, 2**-40, False),  # rel of zero allows nothing
        (Tolerance(abs=0.5), 3, 4, False),  # integers (bytes, evictions)
        (Tolerance(abs=1), 3, 4, True),
        (Tolerance(exact=True), 8.0, 8.0, True),
        (Tolerance(exact=True), 8.0, 8.0 + 2**-40, False),
        (Tolerance(abs=1.0), None, None, True),  # null only equals null
        (Tolerance(abs=1.0), None, 0.0, False),
        (Tolerance(abs=1.0), 0.0, None, False),
        (Tolerance(exact=True), "split", "split", True),
        (Tolerance(exact=True), "split", "compute", False),
    ],
)
def test_tolerance_boundaries(tol, baseline, now, ok):
    assert tol.allows(baseline, now) is ok


@pytest.mark.parametrize(
    "metric, baseline, now, expected",
    [
        ("eor", 1.0, 1.005, Verdict.OK),
        ("eor", 1.0, 1.02, Verdict.REGRESSED),  # lower is better
        ("eor", 1.0, 0.98, Verdict.IMPROVED),
        ("msr", 0.5, 0.48, Verdict.REGRESSED),  # higher is better
        ("msr", 0.5, 0.52, Verdict.IMPROVED),
        ("stall_ms", 0.0, 1.0, Verdict.REGRESSED),  # from zero: by the sign
        ("stall_ms", 1.0, 0.0, Verdict.IMPROVED),
        ("vanilla_ms", 10.0, 9.0, Verdict.CHANGED),  # the yardstick moved
        ("bound_ms", 10.0, 11.0, Verdict.CHANGED),
        ("eor", 1.0, None, Verdict.CHANGED),
        ("bound_name", "split", "compute", Verdict.CHANGED),
    ],
)
def test_verdict_by_direction(metric, baseline, now, expected):
    tol = Tolerance(exact=True) if metric == "bound_name" else Tolerance(rel=0.01)
    assert verdict(metric, tol, baseline, now) is expected


def record(identity, status="alone", eor=1.0, planner="tensile"):
    return {"identity": identity, "name": f"job {identity}", "inputs": {"planner": planner},
            "status": status, "metrics": {"eor": eor, "msr": 0.5}}  # fmt: skip


BASE = bl.Baseline(
    "0.1.0",
    "0" * 16,
    ("eor", "msr"),
    {
        "a" * 16: bl.Entry("job a", "tensile", "alone", {"eor": 1.0, "msr": 0.5}),
        "b" * 16: bl.Entry("job b", "vdnn", "alone", {"eor": 2.0, "msr": 0.5}),
        "c" * 16: bl.Entry("job c", "vdnn", "alone", {"eor": 2.0, "msr": 0.5}),
    },
)
GATES = {"eor": Tolerance(rel=0.01), "msr": Tolerance(abs=0.01)}


def test_diff_missing_status_improved_and_regressed():
    records = [
        record("a" * 16),  # as before
        record("b" * 16, eor=1.5, planner="vdnn"),  # improved: no failure
        record("c" * 16, status="net", eor=3.0, planner="vdnn"),  # a status change
        record("d" * 16),  # not in the baseline
        record("e" * 16),
    ]
    records[4]["identity"] = "a" * 16  # the same scenario, worse
    records[4]["metrics"]["eor"] = 1.25
    lines = diff(records, BASE, GATES)
    got = [(x.identity[0], x.metric, x.verdict) for x in lines]
    assert got == [
        ("a", "eor", Verdict.OK), ("a", "msr", Verdict.OK),
        ("b", "eor", Verdict.IMPROVED), ("b", "msr", Verdict.OK),
        ("c", "status", Verdict.STATUS),  # its figures are not compared
        ("d", SCENARIO, Verdict.MISSING),
        ("a", "eor", Verdict.REGRESSED), ("a", "msr", Verdict.OK),
    ]  # fmt: skip
    assert lines[2].cells()[-1] == "improved (-25.00%)"
    assert lines[4].cells()[3:5] == ("alone", "net")
    c = counts(lines[:6])
    assert (c.scenarios, c.failed, c.improved, c.passed) == (4, 2, 1, 2)
    md = markdown(lines[:6], records[:4], BASE, ("eor", "msr"), "t")
    assert "**FAIL: 4 scenarios, 2 within tolerance, 2 failed, 1 improved" in md
    # vdnn's medians: eor of b and c, 2 and 2 then, 1.5 and 3 now
    assert "| vdnn | 2 | 2 -> 2.25 | 0.5 -> 0.5 |" in md


def test_baseline_round_trip(tmp_path):
    path = tmp_path / "b.json"
    bl.save(BASE, path)
    again = bl.load(path)
    assert again == BASE
    bl.save(again, tmp_path / "c.json")
    assert (tmp_path / "c.json").read_bytes() == path.read_bytes()


def test_a_fast_grid_may_repeat_scenarios_of_another(tmp_path):
    from memplan.traces import io
    from memplan.traces.synthetic import chain

    io.save(chain(4), tmp_path / "t.json")
    grid = {"traces": "t.json", "gpus": "rtx-a6000", "planners": ["tensile", "vdnn"]}
    doc = {"grids": [grid, {**grid, "planners": "vdnn", "fast": True}],
           "metrics": {"status": "exact", "eor": {"rel": 0.01}}}  # fmt: skip
    suite = parse_suite(doc, "s.toml", base=tmp_path)
    assert [s.planner for s in suite.scenarios] == ["tensile", "vdnn"]
    assert [s.planner for s in suite.selected(only_fast=True)] == ["vdnn"]
    assert list(suite.metrics) == ["eor"]  # status is always gated
    fast_only = parse_suite({**doc, "grids": [{**grid, "traces": "gone.json"}, doc["grids"][1]]},
                            "s.toml", base=tmp_path, only_fast=True)  # fmt: skip
    assert [s.planner for s in fast_only.scenarios] == ["vdnn"]  # the other grid is not read
    with pytest.raises(SuiteError, match=r"s.toml: no grid marked fast = true"):
        parse_suite({**doc, "grids": [grid]}, "s.toml", base=tmp_path, only_fast=True)

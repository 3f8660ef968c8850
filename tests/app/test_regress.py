"""`memplan regress` end to end: the shipped suite against the shipped
baseline, a baseline made with --update and run again, an injected planner
option that worsens EOR, and bad suites and baselines."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from memplan.planners import registry
from memplan.traces import io
from memplan.traces.capture import capture
from memplan.traces.zoo import ZOO

from memplan.cli import main

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "regress" / "shipped.toml"
SHIPPED_BASELINE = ROOT / "regress" / "shipped.baseline.json"

# capuchin on small_cnn (batch 16) at 60% of its vanilla peak with the DTR net,
# roofline latencies: without recompute it swaps what it recomputed, and EOR
# rises by about 12%
SUITE = """
[grid]
traces = ["cnn.json.gz"]
gpus = "rtx-a6000"
planners = "capuchin"
budgets = "60%"
fallbacks = "dtr"
latency = "roofline"

[metrics]
status = "exact"
eor = { rel = 0.01 }
iteration_ms = { rel = 0.01, abs = 0.01 }
"""


@pytest.fixture(scope="module")
def cnn_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("regress")
    io.save(capture(ZOO["small_cnn"], 16, model_name="small_cnn"), d / "cnn.json.gz")
    (d / "suite.toml").write_text(SUITE)
    return d


def regress(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["regress", *argv, "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def test_shipped_fast_subset_passes(capsys):
    code, out, _ = regress(capsys, str(SHIPPED), "--baseline", str(SHIPPED_BASELINE),
                           "--only-fast", "--workers", "1")  # fmt: skip
    assert code == 0, out
    assert out.startswith("PASS: 8 scenarios, 8 within tolerance, 0 failed")


@pytest.mark.slow
def test_shipped_suite_passes(capsys):
    code, out, _ = regress(capsys, str(SHIPPED), "--baseline", str(SHIPPED_BASELINE))
    assert code == 0, out
    assert out.startswith("PASS: 60 scenarios, 60 within tolerance, 0 failed")


def _without_recompute(real):
    def make_options(spec, given=None):
        options = real(spec, given)
        name = spec if isinstance(spec, str) else spec.name
        return dataclasses.replace(options, recompute=False) if name == "capuchin" else options

    return make_options


def test_update_rerun_and_a_worse_eor(cnn_dir, capsys, monkeypatch, tmp_path):
    suite, baseline = str(cnn_dir / "suite.toml"), str(tmp_path / "b.json")
    code, out, _ = regress(capsys, suite, "--baseline", baseline, "--update", "--workers", "1")
    assert code == 0 and out.startswith(f"wrote {baseline}: 1 scenarios")
    doc = json.loads(Path(baseline).read_text())
    assert doc["schema"] == "memplan.baseline/1" and doc["metrics"] == ["eor", "iteration_ms"]
    ((entry),) = doc["scenarios"].values()
    assert entry["planner"] == "capuchin" and entry["status"] == "net"
    assert doc["provenance"]["command"] == "memplan regress"
    assert [t["name"] for t in doc["provenance"]["traces"]] == ["small_cnn"]

    summary = tmp_path / "summary.md"
    code, out, _ = regress(capsys, suite, "--baseline", baseline, "--workers", "1",
                           "--summary", str(summary))  # fmt: skip
    assert (code, out) == (0, "PASS: 1 scenarios, 1 within tolerance, 0 failed\n")
    assert "**PASS: 1 scenarios" in summary.read_text()

    monkeypatch.setattr(registry, "make_options", _without_recompute(registry.make_options))
    code, out, _ = regress(capsys, suite, "--baseline", baseline, "--workers", "1",
                           "--summary", str(summary))  # fmt: skip
    assert code == 1
    (eor,) = [line for line in out.splitlines() if "  eor  " in line]
    assert eor.startswith("cnn x1 rtx-a6000 capuchin 60% dtr latency=roofline  capuchin")
    assert "regressed (+" in eor
    assert f"{entry['metrics']['eor']:.6g}" in eor and "rel 0.01" in eor
    assert out.splitlines()[-1].startswith("FAIL: 1 scenarios, 0 within tolerance, 1 failed")
    md = summary.read_text()
    assert "**FAIL" in md and "| eor |" in md and "| capuchin | 1 |" in md


def test_a_scenario_missing_from_the_baseline_fails(cnn_dir, capsys, tmp_path):
    baseline = tmp_path / "b.json"
    baseline.write_text(json.dumps({"schema": "memplan.baseline/1", "memplan_version": "0.1.0",
        "suite": "0" * 16, "metrics": ["eor"], "scenarios": {}}))  # fmt: skip
    code, out, err = regress(capsys, str(cnn_dir / "suite.toml"), "--baseline", str(baseline),
                             "--workers", "1")  # fmt: skip
    assert code == 1
    assert "(scenario)  null      net  -          not in baseline" in out
    assert "was made for another version of the suite" in err


GOOD_GRID = '[grid]\ntraces = "cnn.json.gz"\ngpus = "rtx-a6000"\nplanners = "tensile"\n'
GOOD_METRICS = "[metrics]\neor = { rel = 0.01 }\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("[grid\n", "not valid TOML"),
        (GOOD_METRICS, "no scenarios: give a [grid] table or [[grids]] tables"),
        (GOOD_GRID, "no [metrics] table"),
        (GOOD_GRID + GOOD_METRICS + "[extra]\n", 'unknown table "extra"'),
        (GOOD_GRID + "[metrics]\nspeed = { rel = 0.1 }\n", "metrics.speed: unknown metric"),
        (GOOD_GRID + "[metrics]\neor = { rel = -0.1 }\n", "metrics.eor.rel: expected a number in"),
        (GOOD_GRID + "[metrics]\neor = { rel = 0.1, max = 2 }\n", "metrics.eor.max: unknown field"),
        (GOOD_GRID + "[metrics]\neor = {}\n", "metrics.eor: an empty table"),
        (GOOD_GRID + "[metrics]\neor = 0.1\n", 'metrics.eor: expected "exact" or a table'),
        (GOOD_GRID + '[metrics]\nstatus = { abs = 1 }\neor = "exact"\n', 'metrics.status: expected "exact"'),
        (GOOD_GRID + '[metrics]\nstatus = "exact"\n', "no metric to gate besides status"),
        (GOOD_GRID + 'fast = "yes"\n' + GOOD_METRICS, "grid.fast: expected true or false"),
        (GOOD_GRID + "budgets = \"120 apples\"\n" + GOOD_METRICS, "grid.budgets"),
        (GOOD_GRID.replace('"tensile"', "3") + GOOD_METRICS, "grid.planners"),
        ('[[grids]]\ntraces = "nope.json"\ngpus = "rtx-a6000"\nplanners = "tensile"\n' + GOOD_METRICS,
         "grids[0].traces[0]"),
    ],
)  # fmt: skip
def test_a_bad_suite_is_one_line_and_exit_2(cnn_dir, capsys, tmp_path, text, message):
    (cnn_dir / "bad.toml").write_text(text)
    baseline = tmp_path / "never.json"
    code, out, err = regress(capsys, str(cnn_dir / "bad.toml"), "--baseline", str(baseline),
                             "--update")  # fmt: skip
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err and "bad.toml" in err, err
    assert not baseline.exists()


def _baseline(**changes):
    doc = {"schema": "memplan.baseline/1", "memplan_version": "0.1.0", "suite": "0" * 16,
           "metrics": ["eor"], "scenarios": {"0123456789abcdef": {"name": "x", "planner":
           "tensile", "status": "alone", "metrics": {"eor": 1.5}}}}  # fmt: skip
    entry = doc["scenarios"]["0123456789abcdef"]
    for key, value in changes.items():
        target = entry if key.startswith("e_") else doc
        key = key.removeprefix("e_")
        if value is ...:
            del target[key]
        else:
            target[key] = value
    return json.dumps(doc)


@pytest.mark.parametrize(
    "text, message",
    [
        ("{", "not valid JSON"),
        ("[]", "top level: expected an object"),
        (_baseline(schema="memplan.baseline/2"), "schema: expected 'memplan.baseline/1'"),
        (_baseline(suite="xyz"), "suite: expected 16 hex digits"),
        (_baseline(extra=1), "baseline.extra: unknown field"),
        (_baseline(metrics=["speed"]), "metrics[0]: unknown metric"),
        (_baseline(memplan_version=...), "memplan_version: missing"),
        (_baseline(scenarios={"abc": {}}), "scenarios.abc: expected a scenario identity"),
        (_baseline(e_status="fine"), ".status: unknown status"),
        (_baseline(e_metrics={"eor": True}), "metrics.eor: expected a number"),
        (_baseline(e_metrics={}), "metrics.eor: missing"),
        (_baseline(e_metrics={"eor": 1, "msr": 2}), "metrics.msr: not one of the baseline's"),
        (_baseline(e_planner=...), ".planner: missing"),
        (_baseline(e_colour="red"), ".colour: unknown field"),
        (_baseline(provenance=[]), "provenance: expected an object"),
    ],
)  # fmt: skip
def test_a_bad_baseline_is_one_line_and_exit_2(capsys, tmp_path, text, message):
    from memplan.regress.baseline import BaselineError, load

    path = tmp_path / "b.json"
    path.write_text(text)
    with pytest.raises(BaselineError, match="b.json"):
        load(path)
    # the baseline is read before the suite: no scenario runs
    code, out, err = regress(capsys, str(SHIPPED), "--baseline", str(path))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and message in err, err


def test_no_baseline_without_update_is_exit_2(capsys, tmp_path):
    code, _, err = regress(capsys, str(SHIPPED), "--baseline", str(tmp_path / "none.json"))
    assert code == 2 and "no such baseline file (make one with --update)" in err


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--summary", "{tmp}/no/s.md"], "--summary {tmp}/no/s.md: folder {tmp}/no does not exist"),
        (["--baseline", "{tmp}", "--update"], "--baseline {tmp}: is a directory"),
        (
            ["--baseline", "/dev/null", "--update"],
            "--baseline /dev/null: exists and is not a regular",
        ),
    ],
)
def test_outputs_are_checked_before_any_work(capsys, tmp_path, extra, message):
    argv = [str(SHIPPED), "--baseline", str(tmp_path / "b.json"), "--update"]
    argv += [a.replace("{tmp}", str(tmp_path)) for a in extra]
    code, out, err = regress(capsys, *argv)
    assert code == 2 and out == "" and message.replace("{tmp}", str(tmp_path)) in err, err
    assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("workers", ["0", "-1", "nan", "1025"])
def test_bad_worker_counts(capsys, workers):
    with pytest.raises(SystemExit) as e:
        main(["regress", str(SHIPPED), "--baseline", "b.json", "--workers", workers])
    assert e.value.code == 2 and "--workers" in capsys.readouterr().err

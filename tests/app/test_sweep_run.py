"""The issue's acceptance for `memplan sweep`: 200 scenarios give the same
results.jsonl, byte for byte, on 1 or 2 local workers and on Ray; a sweep
killed midway resumes without running a finished scenario again (counted);
the summary is written."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from memplan.traces import io, synthetic

from memplan.cli import main
from memplan.sweep.grid import load_grid
from memplan.sweep.scenario import STATUSES

# 5 job mixes (one of them a model captured on meta) x 5 planners x 4 budgets x 2 lane
# settings = 200 scenarios of a few milliseconds each
GRID = """
[grid]
traces = ["chain.json", "residual.json", ["chain.json", "residual.json"], "chain.json:2"]
models = ["mlp"]
batch_sizes = 8
gpus = "rtx-a6000"
planners = ["vanilla", "release_only", "checkpoint", {name = "checkpoint", segments = 2},
            "tensile"]
budgets = ["none", "95%", "80%", "60%"]
lanes = [1, 2]
"""


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> tuple[Path, bytes]:
    """The grid file and the results.jsonl of a 1-worker run (in this process)."""
    d = tmp_path_factory.mktemp("sweep_run")
    io.save(synthetic.chain(4), d / "chain.json")
    io.save(synthetic.residual(2), d / "residual.json")
    (d / "grid.toml").write_text(GRID)
    out = d / "reference"
    argv = ["sweep", str(d / "grid.toml"), "--out", str(out), "--workers", "1", "--parquet"]
    assert main(argv) == 0
    return d / "grid.toml", (out / "results.jsonl").read_bytes()


def _alive(pid: int, timeout_s: float = 10.0) -> bool:
    """Is process `pid` still there after up to `timeout_s` (polled)?"""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.01)
    return True


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_the_reference_run_holds_every_scenario_in_grid_order_and_a_summary(sweep):
    grid, reference = sweep
    out = grid.parent / "reference"
    records = [json.loads(x) for x in reference.decode().splitlines()]
    keys = [s.key() for s in load_grid(grid, traces_dir=out / "traces").scenarios]
    assert len(keys) == len(set(keys)) == 200
    assert [r["key"] for r in records] == keys
    assert (out / "traces" / "mlp_b8_adam.json.gz").is_file()  # the model, captured
    statuses = {r["status"] for r in records}
    assert statuses <= set(STATUSES) and {"alone", "oom"} <= statuses
    text = (out / "summary.md").read_text()
    for planner in ("vanilla", "release_only", "checkpoint", "tensile"):
        rs = [r for r in records if r["inputs"]["planner"] == planner]
        counts = " | ".join(str(sum(r["status"] == s for r in rs)) for s in STATUSES)
        assert f"| {planner} | {counts} |" in text
    assert (out / "pareto.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    import pyarrow.parquet as pq

    table = pq.read_table(out / "results.parquet")
    assert table.num_rows == 200 and table.column("key").to_pylist() == keys
    assert table.column("msr").to_pylist() == [r["metrics"]["msr"] for r in records]


def test_two_workers_give_the_same_bytes_as_one(sweep, tmp_path):
    grid, reference = sweep
    out = tmp_path / "two"
    assert main(["sweep", str(grid), "--out", str(out), "--workers", "2", "--no-progress"]) == 0
    assert (out / "results.jsonl").read_bytes() == reference
    workers = {json.loads(x)["worker"] for x in _lines(out / "timings.jsonl")}
    assert str(os.getpid()) not in {w.rsplit(":", 1)[1] for w in workers}  # ran elsewhere


def test_a_torn_last_line_is_dropped_and_the_rest_resumed(sweep, tmp_path, capsys):
    grid, reference = sweep
    out = tmp_path / "torn"
    out.mkdir()
    lines = reference.decode().splitlines(keepends=True)
    (out / "results.jsonl").write_text("".join(lines[:150]) + lines[150][:40])
    (out / ".results.jsonl.k1ll3d.tmp").write_text(lines[0])  # SIGKILL in an atomic write
    assert main(["sweep", str(grid), "--out", str(out), "--workers", "1", "--no-progress"]) == 0
    assert "(50 run, 150 resumed, 1 old lines dropped)" in capsys.readouterr().out
    assert (out / "results.jsonl").read_bytes() == reference
    assert len(_lines(out / "timings.jsonl")) == 50


def test_a_killed_sweep_resumes_without_running_finished_scenarios_again(sweep, tmp_path,
                                                                         capsys):  # fmt: skip
    grid, reference = sweep
    out = tmp_path / "killed"
    results, timings = out / "results.jsonl", out / "timings.jsonl"
    argv = [sys.executable, "-m", "memplan", "sweep", str(grid), "--out", str(out),
            "--workers", "2", "--no-progress"]  # fmt: skip
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while p.poll() is None and len(_lines(results)) < 5:  # poll: kill once some are in
            time.sleep(0.005)
        p.send_signal(signal.SIGTERM)
        _out, err = p.communicate(timeout=120)
    finally:
        p.kill()
    assert p.returncode == 143 and "terminated (SIGTERM)" in err, err
    done = _lines(results)
    assert 5 <= len(done) < 200, "the sweep ended before the signal: no resume to test"
    assert len(_lines(timings)) == len(done)  # a record and its timing go together
    assert all(line.encode() + b"\n" in reference for line in done)
    pids = {int(json.loads(x)["worker"].rsplit(":", 1)[1]) for x in _lines(timings)}
    assert pids and not any(_alive(pid) for pid in pids)  # no worker outlives the sweep
    assert main(["sweep", str(grid), "--out", str(out), "--workers", "2", "--no-progress"]) == 0
    said = capsys.readouterr().out
    assert f"({200 - len(done)} run, {len(done)} resumed)" in said
    computed = [json.loads(x)["key"] for x in _lines(timings)]
    assert len(computed) == len(set(computed)) == 200  # every scenario computed exactly once
    assert results.read_bytes() == reference


def test_another_sweeps_directory_is_refused(sweep, tmp_path, capsys):
    grid, _reference = sweep
    out = tmp_path / "other"
    out.mkdir()
    (out / "results.jsonl").write_text('{"key": "0123456789abcdef"}\n')
    assert main(["sweep", str(grid), "--out", str(out), "--no-progress"]) == 2
    assert "none of a scenario of this grid" in capsys.readouterr().err
    assert (out / "results.jsonl").read_text() == '{"key": "0123456789abcdef"}\n'


@pytest.mark.slow
def test_ray_gives_the_same_bytes(sweep, tmp_path):
    ray = pytest.importorskip("ray")
    grid, reference = sweep
    out = tmp_path / "ray"
    argv = ["sweep", str(grid), "--out", str(out), "--backend", "ray", "--workers", "2",
            "--no-progress"]  # fmt: skip
    try:
        assert main(argv) == 0
    finally:
        assert not ray.is_initialized()  # the backend started Ray and shut it down
    assert (out / "results.jsonl").read_bytes() == reference
    workers = {json.loads(x)["worker"] for x in _lines(out / "timings.jsonl")}
    assert str(os.getpid()) not in {w.rsplit(":", 1)[1] for w in workers}


@pytest.mark.slow
def test_a_ray_address_nobody_answers_is_one_line(sweep, tmp_path, capsys):
    pytest.importorskip("ray")
    grid, _reference = sweep
    argv = ["sweep", str(grid), "--out", str(tmp_path / "o"), "--backend", "ray",
            "--address", "127.0.0.1:1"]  # fmt: skip
    assert main(argv) == 2
    assert "--address 127.0.0.1:1: no Ray cluster answers there" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()

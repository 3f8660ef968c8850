"""`memplan simulate` and `compare` with --job, --scenario, --jitter,
--usage and --lane-slowdown: the jobs arrive and leave as asked, the same
seed gives the same results, and bad input is one line, exit 2."""

from __future__ import annotations

import json
import re

import pytest
from memplan.traces import io

from memplan.cli import main
from tests.sim.test_cli import hand_toml
from tests.sim.test_model import swap_chain


@pytest.fixture
def files(tmp_path):
    t, _ = swap_chain()  # 8 ms an iteration on the hand GPU, alone
    io.save(t, tmp_path / "chain.json.gz")
    (tmp_path / "hand.toml").write_text(hand_toml())
    return tmp_path


def run(capsys, command, *argv):
    try:
        code = main([command, *map(str, argv)])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def hand(files):
    return ["--gpu", files / "hand.toml", "--latency", "measured"]


def test_jobs_arrive_and_leave_as_asked(files, capsys):
    # job 0 at 0 for 2 iterations; job 1 at 20 ms (job 0 ended at 16 ms),
    # leaving at 30 ms: one 8 ms iteration done, the second cut at 30 ms
    t = files / "chain.json.gz"
    code, out, err = run(
        capsys, "simulate", *hand(files), "--json", "--iterations", "2",
        "--job", t, "--job", f"{t}@20ms:until=30ms",
    )  # fmt: skip
    assert code == 0, err
    a, b = json.loads(out)["jobs"]
    assert (a["start_s"], a["end_s"], a["iteration_times_s"]) == (0.0, 0.016, [0.008, 0.008])
    assert (b["start_s"], b["end_s"], b["departed"]) == (0.02, 0.03, True)
    assert b["iteration_times_s"] == [0.008]
    code, out, err = run(
        capsys, "simulate", *hand(files), "--iterations", "2", "--job", t,
        "--job", f"{t}@20ms:until=30ms",
    )  # fmt: skip
    rows = [line.split() for line in out.splitlines()[1:4]]
    assert rows[0][-2:] == ["arrived", "ended"]
    assert rows[1][-4:] == ["0.000", "ms", "16.000", "ms"]
    assert rows[2][-5:] == ["20.000", "ms", "30.000", "ms", "(left)"]


def test_a_scenario_with_faults_is_the_same_for_the_same_seed(files, capsys):
    f = files / "s.toml"
    f.write_text(
        'jitter = 0.3\nlane_slowdown = ["3x@0ms-5ms"]\n[launch]\norder = "random"\n'
        "gap_s = 0.004\n" + '[[job]]\ntrace = "chain.json.gz"\niterations = 2\n' * 3
    )
    outs = []
    for seed in (1, 1, 2):
        code, out, err = run(
            capsys, "simulate", *hand(files), "--scenario", f, "--json", "--seed", seed,
            "--job", f"{files / 'chain.json.gz'}@1ms:1", "--usage", "0.1",
        )  # fmt: skip
        assert code == 0, err
        outs.append(json.loads(out))
    assert outs[0] == outs[1] and outs[0] != outs[2]
    assert len(outs[0]["jobs"]) == 4
    assert sorted(j["start_s"] for j in outs[0]["jobs"]) == [0.0, 0.001, 0.004, 0.008]
    code, out, err = run(
        capsys, "compare", *hand(files), "--scenario", f, "--json", "--seed", "3",
        "--planners", "vdnn",
    )  # fmt: skip
    assert code == 0, err
    rows = json.loads(out)["rows"]
    code, again, err = run(
        capsys, "compare", *hand(files), "--scenario", f, "--json", "--seed", "3",
        "--planners", "vdnn",
    )  # fmt: skip
    assert rows[0]["gap"] is None  # the bounds are of jobs in step, not of a scenario
    rows_again = json.loads(again)["rows"]
    for r in (*rows, *rows_again):
        r.pop("plan_time_s")  # wall time of the planner
    assert rows == rows_again


@pytest.mark.parametrize(
    "argv, msg",
    [
        (["--job", "{t}@5:2"], "expected a time with a unit"),
        (["--job", "{t}@1s:0"], "from 1 to 1000"),
        (["--job", "{dir}/none.json@1s"], "none.json"),
        (["--lane-slowdown", "4@1s-2s", "{t}"], "FACTORx@START-END"),
        (["--lane-slowdown", "4x@2s-1s", "{t}"], "after the start"),
        (["--jitter", "inf", "{t}"], "--jitter"),
        (["--usage", "-0.5", "{t}"], "--usage"),
        (["--scenario", "{dir}/missing.toml"], "no such scenario file"),
        (["--scenario", "{dir}/bad.toml"], 'job\\[0\\]: unknown field "arival_s"'),
        ([], "no jobs"),
    ],
)
def test_bad_arguments_are_one_line(files, capsys, argv, msg):
    (files / "bad.toml").write_text('[[job]]\ntrace = "chain.json.gz"\narival_s = 1\n')
    args = [a.format(t=files / "chain.json.gz", dir=files) for a in argv]
    for command in ("simulate", "compare"):
        code, out, err = run(capsys, command, *hand(files), *args)
        assert code == 2 and out == ""
        assert re.search(msg, err), err
        assert err.count("\n") <= 2  # argparse adds its usage line

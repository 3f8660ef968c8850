"""Issue 17, arguments: every argument case of the issue's "Arguments" and
"Capture" bullets, and seeded bad values for every option of every command,
through the CLI's `main` in-process with a time limit each. A bad value is
rejected in one line naming the option, with exit 2; nothing hangs, nothing
raises.

The seeded part draws, for each option, bad values of its kind (a size, a
rate, a finite number, a whole number, a choice) from pools where every
value is bad for that kind and range, in the forms `--opt value` and
`--opt=value`. Parse-time rejections cost milliseconds, so every command
(microbench and validate included) is safe to call with them: a bad value
that were accepted would start real work and show as a hang.
"""

from __future__ import annotations

import argparse
import json
import random
import re
from pathlib import Path

import pytest
from memplan.hwmodels.profile import profile_path
from memplan.traces import io, synthetic

from tests.fuzz.harness import assert_clean, assert_rejected, run_cli

TIMEOUT_S = 20.0
GPU = ["--gpu", "rtx-a6000"]


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, str]:
    """A small trace (chain(3): vanilla peak 13 MiB), an empty file and a
    text file (as --latency models), and a 64 MiB GPU profile."""
    d = tmp_path_factory.mktemp("args")
    trace = d / "chain.json"
    io.save(synthetic.chain(3), trace)
    (d / "empty.pt").write_bytes(b"")
    (d / "text.pt").write_text("not a model\n")
    toml = profile_path("rtx-a6000").read_text()
    toml = re.sub(r"(?m)^memory_bytes = .*$", f"memory_bytes = {64 * 2**20}", toml, count=1)
    (d / "small.toml").write_text(re.sub(r"(?m)^name = .*$", 'name = "small-gpu"', toml, count=1))
    return {"trace": str(trace), "dir": str(d)}


def _sub(argv: list[str], files: dict[str, str]) -> list[str]:
    """T (or T:N) is the trace, DIR the scratch directory."""
    return [
        files["trace"] + a[1:] if a == "T" or a.startswith("T:") else a.replace("DIR", files["dir"])
        for a in argv
    ]


# (argv with T for the trace and DIR for a scratch directory, names the one
# stderr line must contain)
ISSUE_CASES = [
    # sizes need a unit or are whole bytes; finite; within the device
    (["simulate", "T", *GPU, "--budget", "1.5"], ["--budget", "GiB"]),
    (["simulate", "T", *GPU, "--budget", "1e400"], ["--budget"]),
    (["plan", "T", *GPU, "--planner", "tensile", "--budget", "1e400GiB"], ["--budget", "finite"]),
    (["simulate", "T", *GPU, "--budget", "100GiB"], ["--budget", "device memory"]),
    (["plan", "T", *GPU, "--planner", "vdnn", "--budget", "49GiB"], ["--budget", "rtx-a6000"]),
    (["bounds", "T", *GPU, "--budget", "2TiB", "--time-limit", "0"], ["--budget"]),
    (["compare", "T", *GPU, "--budget", "1TB", "--planners", "vdnn"], ["--budget"]),
    (["simulate", "T", *GPU, "--budget", ""], ["--budget"]),
    (["simulate", "T", *GPU, "--budget", "5GiB/s"], ["--budget", "not a rate"]),
    # rates and sizes are told apart
    (["validate", "T", "--planner", "vdnn", "--bandwidth", "5GiB"], ["--bandwidth", "5GiB/s"]),
    (["validate", "T", "--planner", "vdnn", "--bandwidth", "nan"], ["--bandwidth"]),
    (["validate", "T", "--planner", "vdnn", "--bandwidth", "1e400GB/s"], ["--bandwidth"]),
    (["validate", "T", "--planner", "vdnn", "--bandwidth", "3B/s"], ["--bandwidth"]),
    # TRACE:N bounded, accepted by every command that takes traces
    (["plan", "T:1000", *GPU, "--planner", "vdnn"], ["COUNT", "64"]),
    (["compare", "T:65", *GPU, "--planners", "vdnn"], ["COUNT", "64"]),
    (["simulate", "T:0", *GPU], ["COUNT"]),
    (["simulate", "T:x", *GPU], ["COUNT"]),
    (["simulate", "T:3", "T:3", "T:60", *GPU], ["66 jobs", "64"]),
    (["inspect", "T:3"], ["inspect", "one trace"]),
    (["bounds", "T:3", *GPU], ["bounds", "one trace"]),
    (["latency", "predict", "T:2", "--hardware", "rtx-a6000"], ["one trace"]),
    # float options finite and ranged
    (["bounds", "T", *GPU, "--time-limit", "nan"], ["--time-limit"]),
    (["bounds", "T", *GPU, "--time-limit=inf"], ["--time-limit"]),
    (["bounds", "T", *GPU, "--time-limit", "-1"], ["--time-limit"]),
    (["compare", "T", *GPU, "--time-limit", "0"], ["--time-limit"]),
    (["plan", "T", *GPU, "--planner", "cpsat", "--option", "time_limit_s=nan"], ["time_limit_s"]),
    (["latency", "predict", "T", "--hardware", "rtx-a6000", "--usage", "1.5"], ["--usage"]),
    (["microbench", "--out", "DIR/d.json.gz", "--min-block-ms", "nan"], ["--min-block-ms"]),
    # --latency pointing at an empty or non-model file
    (["simulate", "T", *GPU, "--latency", "DIR/empty.pt"], ["DIR/empty.pt"]),
    (["simulate", "T", *GPU, "--latency", "DIR/text.pt"], ["DIR/text.pt"]),
    (["simulate", "T", *GPU, "--latency", "DIR"], ["DIR", "directory"]),
    (["simulate", "T", *GPU, "--latency", ""], ["--latency"]),
    (["simulate", "T", *GPU, "--latency", "DIR/missing.pt"], ["DIR/missing.pt"]),
    # unknown names, option typos
    (["simulate", "T", "--gpu", "rtx-9999"], ["rtx-9999"]),
    (["plan", "T", *GPU, "--planner", "tensil"], ["tensil"]),
    (["compare", "T", *GPU, "--planners", "vdnn,nope"], ["nope"]),
    (["plan", "T", *GPU, "--planner", "checkpoint", "--option", "segmnts=4"], ["segmnts"]),
    (["plan", "T", *GPU, "--planner", "checkpoint", "--option", "segments=-4"], ["segments"]),
    (["compare", "T", *GPU, "--option", "checkpoint"], ["--option"]),
    (["simulate", "T", *GPU, "--budjet", "4GiB"], ["--budjet"]),
    (["simulate", "T", *GPU, "--budget", "4", "GiB"], ["GiB"]),
    (["simulate", "T", *GPU, "--lanes", "3"], ["--lanes"]),
    (["simulate", "T", *GPU, "--fallback", "panic"], ["--fallback"]),
    (["validate", "T", "--planner", "vdnn", "--budget", "60%"], ["--budget", "not a share"]),
    # capture: arguments (the workload errors are in tests/traces)
    (["capture", "--model", "os:getcwd", "--batch", "2", "--out", "DIR/o.json"], ["os:getcwd"]),
    (["capture", "--model", "mlp", "--batch", "2.5", "--out", "DIR/o.json"], ["--batch"]),
    (
        ["capture", "--model", "mlp", "--batch", "2", "--threads", "0", "--out", "DIR/o.json"],
        ["--threads"],
    ),  # fmt: skip
    (["capture", "--model", "mlp", "--batch", "2", "--measure", "--out", "DIR/o.json"], ["meta"]),
    (
        ["capture", "--model", "mlp", "--batch", "2", "--threads", "2", "--out", "DIR/o.json"],
        ["--threads", "--measure"],
    ),  # fmt: skip: --threads without a measured cpu capture would be ignored
    (
        ["capture", "--model", "mlp", "--batch", "2", "--device", "tpu", "--out", "DIR/o.json"],
        ["tpu"],
    ),  # fmt: skip
    # capacity (issue 18; more in tests/app/test_capacity.py)
    (["capacity", "--model", "mlp", *GPU, "--jobs", "0"], ["--jobs"]),
    (["capacity", "--model", "mlp", *GPU, "--max-eor", "-1"], ["--max-eor"]),
    (["capacity", "--model", "resnet51", *GPU], ["resnet51"]),
    (["capacity", "--model", "mlp", *GPU, "--budget", "1MiB"], ["nothing fits"]),
]


@pytest.mark.parametrize(("argv", "names"), ISSUE_CASES, ids=lambda x: " ".join(x)[:60])
def test_issue_argument_cases_are_rejected_in_one_line(files, argv, names):
    o = run_cli(_sub(argv, files), TIMEOUT_S)
    assert_rejected(o, *(n.replace("DIR", files["dir"]) for n in names))
    assert not Path(files["dir"], "o.json").exists()


ACCEPTED = [
    (["simulate", "T:3", *GPU, "--iterations", "2"], "chain"),
    (["simulate", "T", "T:2", *GPU, "--budget", "64MiB", "--iterations", "1"], "64.00 MiB"),
    (["plan", "T:2", *GPU, "--planner", "vdnn", "--budget=48MiB"], "48.00 MiB"),
    (["inspect", "T:1", "--top", "0"], "buffers"),
    (["bounds", "T", *GPU, "--budget", "12582912", "--time-limit", "0"], "12.00 MiB"),
    (["simulate", "T", *GPU, "--budget", "48GiB", "--iterations", "1"], "48.00 GiB"),
]


@pytest.mark.parametrize(("argv", "expect"), ACCEPTED, ids=lambda x: " ".join(x)[:60])
def test_good_arguments_run(files, argv, expect):
    o = run_cli(_sub(argv, files), TIMEOUT_S)
    assert_clean(o)
    assert o.code == 0 and expect in o.stdout, o.describe()


def _commands() -> list[str]:
    """Every command of the CLI, read from its parser (none can be missed)."""
    from memplan.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(sub.choices)


@pytest.mark.parametrize("command", _commands())
def test_every_command_has_help(command):
    o = run_cli([command, "--help"], TIMEOUT_S)
    assert_clean(o)
    assert o.code == 0 and "usage: memplan" in o.stdout, o.describe()


def test_simulate_runs_trace_copies_as_jobs(files):
    o = run_cli(["simulate", f"{files['trace']}:3", *GPU, "--iterations", "1"], TIMEOUT_S)
    assert o.code == 0, o.describe()
    rows = [line.split()[0] for line in o.stdout.splitlines()[2:5]]
    assert rows == ["0", "1", "2"], o.stdout


def test_budgets_above_the_device(files):
    """NOTE [ Budgets above the device ] on a 64 MiB GPU: 65MiB is refused;
    1000% of chain(3)'s 13 MiB vanilla peak is about 130 MiB, cut to 64 MiB
    with a warning."""
    small = ["--gpu", str(Path(files["dir"], "small.toml"))]
    o = run_cli(["simulate", files["trace"], *small, "--budget", "65MiB"], TIMEOUT_S)
    assert_rejected(o, "--budget", "small-gpu has 64.00 MiB")
    o = run_cli(["simulate", files["trace"], *small, "--budget", "1000%"], TIMEOUT_S)
    assert o.code == 0 and "budget 64.00 MiB" in o.stdout, o.describe()
    assert "warning: --budget 1000%" in o.stderr and "using 64.00 MiB" in o.stderr, o.stderr
    o = run_cli(["simulate", files["trace"], *small, "--budget", "64MiB"], TIMEOUT_S)
    assert o.code == 0 and not o.stderr.strip(), o.describe()
    compare = ["compare", files["trace"], *small, "--planners", "vdnn", "--json"]
    o = run_cli([*compare, "--budget", "1000%"], TIMEOUT_S)
    assert o.code == 0 and "using 64.00 MiB" in o.stderr, o.describe()
    assert json.loads(o.stdout)["rows"][0]["budget_bytes"] == 64 * 2**20, o.stdout[:300]


# ---- seeded bad values for every option of every command ---------------------------------
BAD_FLOAT = ["nan", "NaN", "inf", "-inf", "1e400", "-1e400", "", "abc", "1,5", "0x10", "9" * 60]
BAD_INT = ["1.5", "nan", "inf", "", "abc", "1e3", "9" * 60, "2**3", "\u0663", " ", "1_000x"]
BAD_SIZE = ["1.5", "nan", "inf", "1e400", "", "abc", "-1GiB", "0", "1.5GiB/s", "2PiB", "4 parsecs",
            "9" * 60, "0.0001KiB", "0.5B", "1e400GiB"]  # fmt: skip
BAD_FRACTIONS = ["nan", "1.5", "-0.1", "", ",", "abc", "0,,x", "inf", "0,1e400"]
BAD_HIDDEN = ["64,abc", "0", "100000000", "1,2,3,4,5,6,7,8,9", "", ",", "nan", "1.5", "-4"]
BAD_RATE = ["5GiB", "512MB", "nan", "inf", "", "-1GB/s", "0GB/s", "1e400", "5", "1PB/s", "fast"]

# command prefix (T = the trace, DIR = scratch), option, kind, extra bad values for its range
OPTIONS = [
    (["simulate", "T", *GPU], "--budget", BAD_SIZE + ["49GiB"]),
    (["simulate", "T", *GPU], "--iterations", BAD_INT + ["0", "-1", "1001"]),
    (["plan", "T", *GPU, "--planner", "vdnn"], "--budget", BAD_SIZE + ["1001%", "0%", "%"]),
    (["compare", "T", *GPU, "--planners", "vdnn"], "--time-limit", BAD_FLOAT + ["0", "-1"]),
    (["compare", "T", *GPU, "--planners", "vdnn"], "--iterations", BAD_INT + ["0"]),
    (["bounds", "T", *GPU], "--time-limit", BAD_FLOAT + ["-1", "86401"]),
    (["bounds", "T", *GPU, "--time-limit", "0"], "--budget", BAD_SIZE),
    (["inspect", "T"], "--top", BAD_INT + ["-1", "100001"]),
    (["latency", "predict", "T", "--hardware", "rtx-a6000"], "--usage", BAD_FLOAT + ["1.01"]),
    (["latency", "predict", "T", "--hardware", "rtx-a6000"], "--top", BAD_INT + ["-1"]),
    (["latency", "train", "DIR/none.json.gz", "--out", "DIR/m.pt"], "--ensemble", BAD_INT + ["0"]),
    (["latency", "train", "DIR/none.json.gz", "--out", "DIR/m.pt"], "--epochs", BAD_INT + ["0"]),
    (["capture", "--model", "mlp", "--out", "DIR/o.json"], "--batch", BAD_INT + ["0", "-2"]),
    (
        ["capture", "--model", "mlp", "--batch", "2", "--out", "DIR/o.json"],
        "--warmup",
        BAD_INT + ["-1", "101"],
    ),  # fmt: skip
    (
        ["capture", "--model", "mlp", "--batch", "2", "--out", "DIR/o.json"],
        "--threads",
        BAD_INT + ["0"],
    ),  # fmt: skip
    (
        ["capture", "--model", "mlp", "--batch", "2", "--out", "DIR/o.json"],
        "--seed",
        BAD_INT + ["-1"],
    ),  # fmt: skip
    (["validate", "T", "--planner", "vdnn"], "--bandwidth", BAD_RATE),
    (["validate", "T", "--planner", "vdnn"], "--iterations", BAD_INT + ["1"]),
    (["validate", "T", "--planner", "vdnn"], "--runs", BAD_INT + ["0"]),
    (["validate", "T", "--planner", "vdnn"], "--threads", BAD_INT + ["0"]),
    (["validate", "T", "--planner", "vdnn"], "--budget", BAD_SIZE),
    (
        ["export", "DIR/none.plan.json", "--trace", "T", "--out", "DIR/r.json"],
        "--job",
        BAD_INT + ["-1"],
    ),  # fmt: skip
    (["microbench", "--out", "DIR/d.json.gz"], "--samples", BAD_INT + ["0"]),
    (["microbench", "--out", "DIR/d.json.gz"], "--repeats", BAD_INT + ["0"]),
    (["microbench", "--out", "DIR/d.json.gz"], "--min-block-ms", BAD_FLOAT + ["0", "-5"]),
    (["microbench", "--out", "DIR/d.json.gz"], "--threads", BAD_INT + ["0"]),
    (["microbench", "--out", "DIR/d.json.gz"], "--usage", BAD_FRACTIONS),
    (["latency", "train", "DIR/none.json.gz", "--out", "DIR/m.pt"], "--hidden", BAD_HIDDEN),
    (["capacity", "--model", "mlp", *GPU], "--max-eor", BAD_FLOAT + ["0", "-1"]),
    (["capacity", "--model", "mlp", *GPU], "--iterations", BAD_INT + ["0", "101"]),
    (["capacity", "--model", "mlp", *GPU, "--jobs", "auto"], "--batch", BAD_INT + ["0"]),
    (["capacity", "--model", "mlp", *GPU], "--budget", BAD_SIZE + ["49GiB", "50%"]),
    (["capacity", "--gpu", "rtx-a6000"], "--jobs", ["0", "-1", "65", "", "nan", ":3", "x:0"]),
    (["capacity", "--model", "mlp", *GPU], "--batches", ["", "0:4", "4:2", "a", "1:2:3"]),
    (["capacity", "--model", "mlp", *GPU], "--accumulate", BAD_INT + ["0", "1025"]),
]


def _draw(seed: int, per_option: int) -> list[tuple[list[str], str]]:
    rng = random.Random(seed)
    cases = []
    for prefix, option, pool in OPTIONS:
        for value in rng.sample(pool, min(per_option, len(pool))):
            form = [f"{option}={value}"] if rng.random() < 0.5 else [option, value]
            cases.append(([*prefix, *form], option))
    return cases


def _run_seeded(files: dict[str, str], seed: int, per_option: int) -> int:
    failures = []
    cases = _draw(seed, per_option)
    for argv, option in cases:
        o = run_cli(_sub(argv, files), TIMEOUT_S)
        try:
            assert_rejected(o, option)
        except AssertionError as e:
            failures.append(str(e).splitlines()[0][:300])
    assert not failures, f"{len(failures)} of {len(cases)}:\n" + "\n".join(failures[:20])
    return len(cases)


@pytest.mark.parametrize("seed", [0, 1])
def test_seeded_bad_values_of_every_option(files, seed):
    assert _run_seeded(files, seed, per_option=6) >= 6 * len(OPTIONS) - 6


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(2, 8))
def test_seeded_bad_values_of_every_option_more_seeds(files, seed):
    _run_seeded(files, seed, per_option=len(BAD_SIZE) + 3)

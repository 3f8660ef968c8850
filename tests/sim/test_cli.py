"""`memplan simulate`: the table, --json, --out, and one-line errors."""

from __future__ import annotations

import json

import pytest
from memplan.planners.core import io as plan_io
from memplan.planners.core.plan import Plan, PlanResult, Status, SwapIn, SwapOut
from memplan.traces import io
from memplan.traces.io import fingerprint

from memplan.cli import main
from tests.sim.handtraces import MiB, gpu
from tests.sim.test_model import swap_chain

FIELDS = [
    "memory_bytes",
    "h2d_bytes_per_s",
    "d2h_bytes_per_s",
    "transfer_fixed_s",
    "copy_engines",
    "h2d_duplex_factor",
    "mem_bw_bytes_per_s",
    "launch_overhead_s",
    "peak_flops",
]


def hand_toml() -> str:
    """`handtraces.gpu()` as a profile, every number written exactly."""
    hw = gpu()
    lines = [f'name = "{hw.name}"']
    lines += [f"{k} = {getattr(hw, k)!r}" for k in FIELDS[:-1]]
    lines += ["[peak_flops]", "float32 = 1e12", "[source]"]
    lines += [f'{k} = "hand-worked test value"' for k in FIELDS]
    return "\n".join(lines) + "\n"


@pytest.fixture
def files(tmp_path):
    t, _ = swap_chain()
    io.save(t, tmp_path / "chain.json.gz")
    (tmp_path / "hand.toml").write_text(hand_toml())
    plan = Plan(fingerprint(t), (SwapOut(0, 0), SwapIn(0, 2, 3)), "hand")
    plan_io.save(PlanResult("hand", Status.PLANNED, (plan,)), tmp_path / "late.json")
    return tmp_path


def run(capsys, *argv):
    try:
        code = main(["simulate", *map(str, argv)])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_json_output_is_exact(files, capsys):
    code, out, _ = run(
        capsys, files / "chain.json.gz", "--gpu", files / "hand.toml", "--latency", "measured",
        "--plan", files / "late.json", "--iterations", "2", "--json",
    )  # fmt: skip
    assert code == 0
    doc = json.loads(out)
    (job,) = doc["jobs"]
    assert job["iteration_times_s"] == [0.010, 0.010]
    assert {k: job[k] for k in ("iteration_time_s", "peak_bytes", "stall_s", "bytes_h2d",
                                "bytes_d2h", "passive_swaps", "oom")} == {
        "iteration_time_s": 0.010,
        "peak_bytes": 3 * MiB,
        "stall_s": 0.004,
        "bytes_h2d": 4 * MiB,
        "bytes_d2h": 4 * MiB,
        "passive_swaps": 0,
        "oom": False,
    }  # fmt: skip
    assert (doc["peak_bytes"], doc["budget_bytes"], doc["lanes"]) == (3 * MiB, 1024 * MiB, ["pcie"])


def test_table_and_report_folder(files, capsys):
    out_dir = files / "report"
    code, out, _ = run(
        capsys, files / "chain.json.gz", files / "chain.json.gz", "--gpu", files / "hand.toml",
        "--latency", "measured", "--plan", "release_only", "--budget", "8MiB", "--lanes", "2",
        "--out", out_dir,
    )  # fmt: skip
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "hand-gpu: 2 lanes (h2d, d2h), budget 8.00 MiB, oom fail, latency measured"
    assert lines[1].split() == [
        "job", "name", "iteration", "peak", "stall", "recompute", "H2D", "D2H", "net", "OOM"
    ]  # fmt: skip
    assert lines[2].split()[:4] == [
        "0",
        "hand",
        "16.000",
        "ms",
    ]  # two jobs: 16 ms of kernels, interleaved
    assert sorted(p.name for p in out_dir.iterdir()) == [
        "gantt.png", "memory.png", "result.json", "snapshot.pickle", "timeline.json"
    ]  # fmt: skip
    result = json.loads((out_dir / "result.json").read_text())
    assert (
        result["traces"] == [str(files / "chain.json.gz")] * 2 and result["latency"] == "measured"
    )
    assert json.loads((out_dir / "timeline.json").read_text())["traceEvents"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--budget", "lots"], "--budget='lots': expected a size"),
        (["--oom", "panic"], "invalid choice: 'panic'"),
        (["--plan", "vanilla", "--plan", "vanilla"], "--plan: 2 plans for 1 traces"),
        (["--iterations", "0"], "argument --iterations: expected a whole number in [1, 1000]"),
        (["--budget", "1MiB"], None),  # an OOM is a result, not an error
    ],
)
def test_errors_are_one_line(files, capsys, extra, message):
    code, out, err = run(
        capsys, files / "chain.json.gz", "--gpu", files / "hand.toml", "--latency", "measured",
        *extra,
    )  # fmt: skip
    if message is None:
        assert code == 0 and "iteration 0 op 0" in out
        return
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and message in err


def test_plan_for_another_trace_is_rejected(files, capsys):
    other = files / "other.json.gz"
    from tests.sim.test_model import param_step

    io.save(param_step()[0], other)
    code, _, err = run(capsys, other, "--gpu", files / "hand.toml", "--plan", files / "late.json")
    assert code == 2
    assert "late.json: plans[0]: made for trace" in err and len(err.strip().splitlines()) == 1


def test_a_run_out_of_memory_is_said_so_not_a_makespan(files, capsys):
    # swap_chain's first op alone needs more than 1 MiB: the job runs out at
    # iteration 0 and the summary says so instead of "makespan 0.000 ms"
    code, out, _ = run(
        capsys, files / "chain.json.gz", "--gpu", files / "hand.toml", "--latency", "measured",
        "--budget", "1MiB",
    )  # fmt: skip
    assert code == 0
    assert out.splitlines()[-1].endswith("1 of 1 job(s) ran out of memory"), out
    assert "makespan" not in out

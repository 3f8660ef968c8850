"""--allocator and --context-reserve from the command line, and the memory
planners plan for (NOTE [ The planners' view of the caching allocator ])."""

from __future__ import annotations

import dataclasses
import json

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.traces import io
from memplan.traces.errors import MemplanError
from memplan.traces.model import Trace

from memplan.cli import main
from memplan.plannerview import planner_view
from memplan.runconfig import RunConfig
from tests.sim.handtraces import MiB, gpu
from tests.sim.test_allocator_sim import frag_trace
from tests.sim.test_cli import hand_toml


@pytest.fixture
def files(tmp_path):
    t, _ = frag_trace()
    io.save(t, tmp_path / "frag.json.gz")
    (tmp_path / "hand.toml").write_text(hand_toml())
    return tmp_path


def cli(capsys, command, files, *argv):
    base = [command, str(files / "frag.json.gz"), "--gpu", str(files / "hand.toml")]
    try:
        code = main([*base, "--latency", "measured", *map(str, argv)])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_simulate_reports_the_caching_allocator(files, capsys):
    # the case of test_caching_fragmentation_worked_by_hand
    code, out, _ = cli(capsys, "simulate", files, "--allocator", "caching", "--json")
    doc = json.loads(out)
    assert code == 0
    assert {k: doc[k] // MiB for k in ("allocated_peak_bytes", "reserved_peak_bytes",
                                       "fragmentation_bytes", "device_peak_bytes")} == {
        "allocated_peak_bytes": 15, "reserved_peak_bytes": 40, "fragmentation_bytes": 25,
        "device_peak_bytes": 40,
    }  # fmt: skip
    assert (doc["allocator"], doc["jobs"][0]["reserved_peak_bytes"]) == ("caching", 40 * MiB)
    code, out, _ = cli(capsys, "simulate", files, "--allocator", "caching")
    assert "allocator caching: allocated 15.00 MiB, reserved 40.00 MiB, fragmentation " in out
    assert out.splitlines()[-1].startswith("peak 40.00 MiB of 1.00 GiB; pinned host 0 B; makespan")


def test_a_share_of_the_vanilla_peak_is_of_the_device_peak(files, capsys):
    code, out, _ = cli(
        capsys, "simulate", files, "--allocator", "caching", "--budget", "150%", "--json"
    )
    assert (code, json.loads(out)["budget_bytes"]) == (0, 60 * MiB)  # 150% of 40 MiB
    code, out, _ = cli(capsys, "simulate", files, "--budget", "150%", "--json")
    assert json.loads(out)["budget_bytes"] == int(15 * MiB * 1.5)  # exact: of the tensors


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--context-reserve", "lots"], "--context-reserve='lots': expected a size"),
        (["--context-reserve=-5MiB"], "--context-reserve='-5MiB'"),
        (["--context-reserve", "2GiB"], "leaves nothing of the budget"),
        (["--allocator", "buddy"], "invalid choice: 'buddy'"),
    ],
)
def test_bad_memory_options_are_one_line_errors(files, capsys, argv, message):
    code, _, err = cli(capsys, "simulate", files, *argv)
    assert code == 2 and message in err, err
    assert "Traceback" not in err


def test_context_reserve_zero_and_units(files, capsys):
    for text, nbytes in (("0", 0), ("0MiB", 0), ("10MiB", 10 * MiB)):
        code, out, _ = cli(capsys, "simulate", files, "--context-reserve", text, "--json")
        assert (code, json.loads(out)["context_reserve_bytes"]) == (0, nbytes)


def test_compare_and_plan_are_judged_by_the_allocator(files, capsys):
    # 30 MiB hold the 15 MiB of tensors but not the caching allocator's 40
    argv = ["--planners", "release_only", "--budget", "30MiB", "--json"]
    code, out, _ = cli(capsys, "compare", files, *argv)
    (row,) = json.loads(out)["rows"]
    assert (code, row["fit"], row["fragmentation_bytes"]) == (0, "alone", 0)
    code, out, _ = cli(capsys, "compare", files, *argv, "--allocator", "caching")
    doc = json.loads(out)
    (row,) = doc["rows"]
    assert (row["fit"], row["feasible"], doc["vanilla"]["peak_bytes"]) == ("oom", False, 40 * MiB)
    code, out, _ = cli(
        capsys, "compare", files, "--planners", "release_only", "--allocator", "caching"
    )
    assert "allocator caching" in out and "reserved" in out.splitlines()[2]
    code, out, _ = cli(
        capsys, "plan", files, "--planner", "release_only", "--budget", "30MiB", "--allocator",
        "caching", "--json",
    )  # fmt: skip
    assert (code, json.loads(out)["simulated"]["fit"]) == (0, "oom")


def with_sizes(trace: Trace, sizes: list[int]) -> Trace:
    bufs = tuple(
        dataclasses.replace(b, nbytes=n) for b, n in zip(trace.buffers, sizes, strict=True)
    )
    ops = list(trace.ops)
    ops[1] = dataclasses.replace(ops[1], workspace_bytes=3 * MiB)
    return Trace(trace.meta, bufs, trace.views, tuple(ops), trace.saved)


def test_the_planners_view():
    t = with_sizes(frag_trace()[0], [1000, 11 * MiB, 10 * MiB - 1])
    dev = DeviceModel(gpu(), frag_trace()[1])
    # exact, no reserve: the jobs and the budget as they are
    seen, budget = planner_view([t, t], dev, 100 * MiB)
    assert (seen[0] is t, budget) == (True, 100 * MiB)
    # caching: sizes as the allocator gives them alone; the budget less two
    # contexts of 10 MiB and each job's largest workspace (3 MiB)
    seen, budget = planner_view([t, t], dev, 100 * MiB, RunConfig("caching", 10 * MiB))
    assert [b.nbytes for b in seen[0].buffers] == [1024, 12 * MiB, 10 * MiB]
    assert budget == 100 * MiB - 2 * 10 * MiB - 2 * 3 * MiB
    # smartpool: exact sizes, the same budget; no budget stays none
    seen, budget = planner_view([t], dev, 100 * MiB, RunConfig("smartpool", MiB))
    assert ([b.nbytes for b in seen[0].buffers], budget) == (
        [1000, 11 * MiB, 10 * MiB - 1],
        96 * MiB,
    )
    assert planner_view([t], dev, None, RunConfig("caching"))[1] is None
    with pytest.raises(MemplanError, match="leaves nothing to plan for"):
        planner_view([t], dev, 12 * MiB, RunConfig("caching", 10 * MiB))

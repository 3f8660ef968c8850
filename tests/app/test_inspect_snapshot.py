"""`memplan simulate --out` / `compare --out` write PyTorch memory snapshots,
and `memplan inspect SNAPSHOT.pickle` reads them back (and real runs' ones):
the same peaks round trip, `--trace` prints a trace's prediction beside
them, and what is not a snapshot is one line and exit 2."""

from __future__ import annotations

import json
import pickle

import pytest
from memplan.traces import io, synthetic

from memplan.cli import main
from tests.fuzz.harness import assert_rejected, run_cli

GPU = ["--gpu", "rtx-a6000"]


def cli(capsys, *argv) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def chain(tmp_path):
    p = tmp_path / "chain.json.gz"
    io.save(synthetic.chain(3, act_mib=4), p)
    return p


@pytest.mark.parametrize("allocator", ["exact", "caching", "smartpool"])
def test_a_simulation_round_trips_through_inspect(tmp_path, capsys, chain, allocator):
    out = tmp_path / "run"
    code, text, _ = cli(capsys, "simulate", f"{chain}:2", *GPU, "--allocator", allocator,
                        "--out", out)  # fmt: skip
    assert code == 0 and "snapshot.pickle" in text
    result = json.loads((out / "result.json").read_text())
    code, text, _ = cli(capsys, "inspect", out / "snapshot.pickle", "--json")
    assert code == 0
    got = json.loads(text)
    (d,) = got["devices"]
    # the tensors' peak (the memory curve's, less the two jobs' contexts,
    # held from start to end) and the allocator's reserved peak
    tensors = result["peak_bytes"] - 2 * result["context_reserve_bytes"]
    assert (d["allocated_peak_bytes"], d["reserved_peak_bytes"]) == (
        tensors,
        result["reserved_peak_bytes"],
    )
    assert got["memplan"] == {"hardware": "rtx-a6000", "allocator": allocator}
    assert d["consistent"] and d["actions"]["alloc"] > 0
    # the table says the same
    code, text, _ = cli(capsys, "inspect", out / "snapshot.pickle")
    assert code == 0 and f"allocator {allocator}: simulated time" in text


def test_against_a_trace(tmp_path, capsys, chain):
    # one vanilla job: the snapshot's peak is the trace's vanilla peak, and
    # its end (before the job leaves) the persistent bytes: chain(3) with 1 MiB
    # weights and momentum, 3 layers: 6 MiB
    out = tmp_path / "run"
    assert cli(capsys, "simulate", chain, *GPU, "--out", out)[0] == 0
    code, text, _ = cli(capsys, "inspect", out / "snapshot.pickle", "--trace", chain, "--json")
    got = json.loads(text)
    t = io.load(chain)
    assert got["trace"]["vanilla_peak_bytes"] == t.peak()[0]
    assert got["trace"]["persistent_bytes"] == 6 << 20
    (d,) = got["devices"]
    assert d["allocated_peak_bytes"] == t.peak()[0] and d["allocated_end_bytes"] == 6 << 20
    code, text, _ = cli(capsys, "inspect", out / "snapshot.pickle", "--trace", chain)
    assert code == 0
    assert [line.split()[-1] for line in text.splitlines() if "  1.000" in line] == ["1.000"] * 2


def test_compare_writes_a_snapshot_per_simulation(tmp_path, capsys, chain):
    out = tmp_path / "cmp"
    code, text, _ = cli(capsys, "compare", chain, *GPU, "--budget", "14MiB",
                        "--planners", "checkpoint,passive", "--out", out, "--json")  # fmt: skip
    assert code == 0
    report = json.loads(text)
    names = sorted(p.name for p in (out / "snapshots").iterdir())
    assert names == ["checkpoint.pickle", "passive.pickle", "vanilla.pickle"]
    for row in report["rows"]:
        code, text, _ = cli(capsys, "inspect", out / "snapshots" / f"{row['planner']}.pickle",
                            "--json")  # fmt: skip
        (d,) = json.loads(text)["devices"]
        assert d["allocated_peak_bytes"] == row["peak_bytes"]
    # an old report with its snapshots is replaced whole; a snapshots/
    # folder holding anything else is not a report
    assert cli(capsys, "compare", chain, *GPU, "--planners", "passive", "--out", out)[0] == 0
    assert sorted(p.name for p in (out / "snapshots").iterdir()) == [
        "passive.pickle",
        "vanilla.pickle",
    ]
    (out / "snapshots" / "notes.txt").write_text("mine")
    o = run_cli(["compare", str(chain), *GPU, "--planners", "passive", "--out", str(out)])
    assert_rejected(o, "snapshots/")
    assert (out / "snapshots" / "notes.txt").read_text() == "mine"


def test_what_is_not_a_snapshot(tmp_path, chain):
    bad = tmp_path / "bad.pickle"
    bad.write_bytes(b"\x80\x04not really")
    assert_rejected(run_cli(["inspect", str(bad)]), "bad.pickle", "not a readable pickle")
    bad.write_bytes(pickle.dumps({"segments": [{"blocks": [], "address": -1, "total_size": 0}]}))
    assert_rejected(run_cli(["inspect", str(bad)]), "bad.pickle", "segments[0].address")
    # a trace is no snapshot to compare with a trace
    assert_rejected(run_cli(["inspect", str(chain), "--trace", str(chain)]), "--trace")
    # a snapshot named like a trace is still read as one (by its first byte)
    snap = tmp_path / "snap.json"
    snap.write_bytes(pickle.dumps({"segments": [], "device_traces": []}))
    o = run_cli(["inspect", str(snap)])
    assert o.code == 0 and "PyTorch memory snapshot" in o.stdout
    assert_rejected(run_cli(["inspect", str(tmp_path / "none.pickle")]), "no such snapshot file")

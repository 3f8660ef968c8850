"""`memplan capacity --axis seq` (NOTE [ Capacity over the sequence ]): the
longest sequence of a tiny hf: llama, checked against captures at the answer
and one token more, and bad arguments refused in one line."""

from __future__ import annotations

import json

import pytest
from memplan.traces import io

from tests.app.test_capture_models import TINY
from tests.extras import needs_transformers
from tests.fuzz.harness import assert_clean, assert_rejected, run_cli

GPU = ["--gpu", "p100-pcie-16gb"]
MiB = 2**20
LLAMA = ["--model", "hf:llama", "--config", TINY]


@needs_transformers
def test_the_longest_vanilla_seq_of_a_tiny_llama_is_the_last_capture_that_fits(tmp_path):
    budget = 6 * MiB
    argv = ["capacity", *GPU, *LLAMA, "--axis", "seq", "--batch", "2", "--seqs", "16:512",
            "--budget", str(budget), "--planners", "vanilla", "--no-progress", "--json"]  # fmt: skip
    o = run_cli(argv, 120)
    assert_clean(o)
    assert o.code == 0, o.describe()
    doc = json.loads(o.stdout)
    assert doc["axis"] == "seq" and doc["batch"] == 2 and doc["range"] == [16, 512]
    vanilla = doc["answers"][0]
    seq = vanilla["largest"]
    assert vanilla["planner"] == "vanilla" and 16 < seq < 512
    probes = {p["x"]: p for p in vanilla["probes"]}
    assert probes[seq]["fits"] and not probes[seq + 1]["fits"]
    # independently: vanilla's peak is the trace `memplan capture` records
    # (for the --gpu, as capacity captures), under the budget at the answer
    # and over it one token later
    for s, under in ((seq, True), (seq + 1, False)):
        out = tmp_path / f"seq{s}.json.gz"
        argv = ["capture", *LLAMA, "--seq", str(s), "--batch", "2", "--target",
                "p100-pcie-16gb", "--out", str(out)]  # fmt: skip
        assert run_cli(argv, 60).code == 0
        peak = io.load(out).peak()[0]
        assert (peak <= budget) is under
        if under:
            assert vanilla["peak_bytes"] == peak


@needs_transformers
def test_the_seq_table_names_the_axis_and_the_range_stops_at_the_models_positions():
    argv = ["capacity", *GPU, *LLAMA, "--config", "max_position_embeddings=160", "--axis",
            "seq", "--batch", "1", "--planners", "vanilla", "--no-progress"]  # fmt: skip
    o = run_cli(argv, 120)
    assert_clean(o)
    assert o.code == 0, o.describe()
    assert o.stdout.startswith("longest seq of hf:llama at batch 1 on p100-pcie-16gb")
    assert "range 128..160" in o.stdout and "160 (top of range)" in o.stdout
    assert "one per seq used" in o.stdout


BAD = [
    (["--model", "hf:llama", "--axis", "seq"], ["--axis seq", "--batch"]),
    (["--model", "hf:llama", "--axis", "seq", "--batch", "2", "--seq", "64"], ["--seq", "--seqs"]),
    (["--model", "hf:llama", "--axis", "seq", "--batch", "2", "--batches", "1:4"], ["--batches"]),
    (["--model", "hf:llama", "--axis", "seq", "--jobs", "auto"], ["--axis seq", "--jobs auto"]),
    (["--jobs", "mlp:2", "--axis", "seq", "--batch", "2"], ["--axis seq", "mix"]),
    (["--trace", "T", "--axis", "seq"], ["--axis seq", "--trace"]),
    (["--model", "mlp", "--axis", "seq", "--batch", "2"], ["--axis seq: --seq", "hf:", "'mlp'"]),
    (["--model", "mlp", "--axis", "seq", "--batch", "2", "--seqs", "9:5"], ["--seqs", "LO <= HI"]),
    (["--model", "mlp", "--axis", "seq", "--batch", "2", "--seqs", "a:b"], ["--seqs", "LO:HI"]),
    (["--model", "mlp", "--seqs", "1:5"], ["--seqs", "--axis seq"]),
    (["--model", "mlp", "--axis", "sequence"], ["--axis"]),
]


@pytest.mark.parametrize(("argv", "names"), BAD, ids=lambda x: " ".join(x)[:50])
def test_bad_seq_arguments_are_refused_in_one_line(tmp_path, argv, names):
    argv = [str(tmp_path / "t.json") if a == "T" else a for a in argv]
    o = run_cli(["capacity", *argv, *GPU, "--no-progress"], 60)
    assert_rejected(o, *names)


@needs_transformers
def test_a_seq_past_the_models_positions_is_refused_in_one_line():
    argv = [*LLAMA, "--config", "max_position_embeddings=64", "--axis", "seq", "--batch", "2",
            "--seqs", "16:128"]  # fmt: skip
    o = run_cli(["capacity", *argv, *GPU, "--no-progress"], 60)
    assert_rejected(o, "--seqs 16:128", "max_position_embeddings=64")

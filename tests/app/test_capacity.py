"""`memplan capacity` (NOTE [ Capacity search ], NOTE [ Capacity time
limits ]): the search against brute force, largest batches and job counts
worked out by hand, scaling that does not hold said on stderr, and bad
arguments refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from memplan.traces import io, synthetic
from memplan.traces.zoo import MLP, Workload
from torch import nn

from memplan.capacity import largest
from tests.fuzz.harness import assert_clean, assert_rejected, run_cli

GPU = ["--gpu", "p100-pcie-16gb"]
MiB = 2**20


def _json(argv: list[str]) -> dict:
    o = run_cli(["capacity", *argv, "--json"], 60)
    assert_clean(o)
    assert o.code == 0, o.describe()
    return json.loads(o.stdout)


def _answers(doc: dict) -> dict[str, dict]:
    return {a["planner"]: a for a in doc["answers"]}


# ---- the search ----------------------------------------------------------------------
@given(
    lo=st.integers(1, 50),
    span=st.integers(0, 5000),
    cut=st.integers(-1, 5100),
    start=st.integers(1, 6000),
)
def test_largest_is_the_last_x_that_fits(lo, span, cut, start):
    hi = lo + span
    calls: list[int] = []

    def fits(x):
        assert lo <= x <= hi and x not in calls  # inside the range, each x once
        calls.append(x)
        return x <= lo + cut

    got = largest(fits, lo, hi, start)
    brute = max((x for x in range(lo, hi + 1) if x <= lo + cut), default=None)
    assert got == brute
    assert len(calls) <= 4 * (hi.bit_length() + 2)


def test_largest_refuses_an_empty_range():
    with pytest.raises(ValueError, match="lo=5, hi=4"):
        largest(lambda x: True, 5, 4, 5)


# ---- by hand -------------------------------------------------------------------------
# mlp (784 -> 512 -> 256 -> 10, Adam): its vanilla peak is at the Adam step
# of fc1.weight (sqrt and div make two temporaries of its size), up to a few
# hundred samples: the params, their grads and both Adam moments (4 P), the
# two temporaries (2 W1), and the batch (B x 784 float32) with its int64
# labels, still alive until the step ends. The tests pass --opt foreach=false:
# capacity captures for its --gpu, whose default is foreach (NOTE [ Optimizer
# defaults ]), and the formula counts one update per parameter.
FOR_LOOP = ["--opt", "foreach=false"]
P = 4 * (784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10)
W1 = 4 * 784 * 512
PER_SAMPLE = 784 * 4 + 8


def mlp_peak(batch: int) -> int:
    return 4 * P + 2 * W1 + PER_SAMPLE * batch


def test_the_largest_vanilla_batch_of_an_mlp_by_hand():
    assert mlp_peak(300) == 12_727_552
    common = [*GPU, "--model", "mlp", "--batches", "2:800", "--no-progress", *FOR_LOOP]
    doc = _json([*common, "--planners", "vanilla", "--budget", str(mlp_peak(300))])
    vanilla = _answers(doc)["vanilla"]
    assert vanilla["largest"] == 300 and vanilla["peak_bytes"] == mlp_peak(300)
    assert vanilla["eor"] == 1.0 and vanilla["fit"] == "alone"
    assert doc["budget_bytes"] == mlp_peak(300) and doc["axis"] == "batch"
    check = doc["scaling_checks"][0]
    assert check["ok"] and check["captured_peak_bytes"] == check["scaled_peak_bytes"]
    # a byte less, a batch less; the planners' searches end on a fit next to a
    # failure (or the top of the range)
    doc = _json([*common, "--planners", "tensile,dtr", "--budget", str(mlp_peak(300) - 1)])
    answers = _answers(doc)
    assert answers["vanilla"]["largest"] == 299
    for a in answers.values():
        probes = {p["x"]: p for p in a["probes"]}
        assert probes[a["largest"]]["fits"]
        assert a["largest"] == doc["ceiling"] or not probes[a["largest"] + 1]["fits"]
        assert a["largest"] >= 299  # a plan frees at least what vanilla does


def test_the_most_jobs_of_a_synthetic_chain_by_hand(tmp_path):
    """chain(3) peaks at 13 MiB (traces.synthetic); identical jobs run in
    step on the shared compute stream and peak together: n jobs take 13n MiB."""
    trace = tmp_path / "chain.json"
    io.save(synthetic.chain(3), trace)
    common = ["--trace", str(trace), *GPU, "--jobs", "auto", "--planners", "vanilla"]
    assert _answers(_json([*common, "--budget", f"{3 * 13}MiB"]))["vanilla"]["largest"] == 3
    doc = _json([*common, "--budget", str(3 * 13 * MiB - 1)])
    assert _answers(doc)["vanilla"]["largest"] == 2
    assert doc["axis"] == "jobs" and doc["batch"] == 1 and doc["captures"] == 0
    # each job's CUDA context is inside the budget: 14 MiB a job with 1 MiB each
    reserve = [*common, "--context-reserve", "1MiB"]
    doc = _json([*reserve, "--budget", f"{3 * 14}MiB"])
    assert _answers(doc)["vanilla"]["largest"] == 3 and doc["context_reserve_bytes"] == MiB
    assert _answers(_json([*reserve, "--budget", str(3 * 14 * MiB - 1)]))["vanilla"]["largest"] == 2
    doc = _json([*common, "--budget", "1GiB", "--allocator", "caching"])  # the profile context
    assert doc["allocator"] == "caching" and doc["context_reserve_bytes"] > 0
    assert _answers(doc)["vanilla"]["largest"] >= 1
    # --jobs N is one fit test: two copies fit in 26 MiB, three do not
    fixed = ["--trace", str(trace), *GPU, "--planners", "vanilla", "--budget", "26MiB"]
    assert _answers(_json([*fixed, "--jobs", "2"]))["vanilla"]["largest"] == 2
    assert _answers(_json([*fixed, "--jobs", "3"]))["vanilla"]["largest"] is None


# ---- scaling that does not hold ------------------------------------------------------
class _Grows(nn.Module):
    """An MLP whose step copies its batch first above 12 samples: one more op
    and buffer than at the base batches 8 and 12."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.clone() if x.shape[0] > 12 else x)


def grows(batch_size: int) -> Workload:
    x, y = torch.randn(batch_size, 784), torch.randint(0, 10, (batch_size,))
    return Workload(_Grows().train(), (x,), (y,), F.cross_entropy)


def test_a_failed_scaling_check_is_said_and_every_batch_is_captured():
    argv = ["capacity", "--model", "tests.app.test_capacity:grows", *GPU, "--planners",
            "vanilla", "--budget", str(mlp_peak(300)), "--batches", "2:800", *FOR_LOOP]  # fmt: skip
    o = run_cli(argv, 60)
    assert o.code == 0, o.describe()
    assert "note: tests.app.test_capacity:grows: scaling off, every batch is captured" in o.stderr
    assert "number of buffers" in o.stderr
    assert "structure: number of buffers" in o.stdout  # the check line of the table
    doc = json.loads(run_cli([*argv, "--json"], 60).stdout)  # valid JSON: no Infinity
    assert doc["scaling_checks"][0]["ok"] is False
    assert doc["scaling_checks"][0]["max_rel_error"] is None
    # the copy of the batch adds B x 784 x 4 bytes before the step; the peak
    # at the Adam step is unchanged (the copy is dead by then)
    assert "vanilla       300" in o.stdout or "vanilla  300" in o.stdout, o.stdout


# ---- outputs -------------------------------------------------------------------------
def test_out_writes_a_report_directory(tmp_path):
    out = tmp_path / "cap"
    argv = ["capacity", "--model", "mlp", *GPU, "--planners", "vdnn", "--budget", "16MiB",
            "--batches", "2:600", "--out", str(out), "--max-eor", "3"]  # fmt: skip
    o = run_cli(argv, 60)
    assert o.code == 0, o.describe()
    assert sorted(p.name for p in out.iterdir()) == ["capacity.png", "report.json", "report.md"]
    doc = json.loads((out / "report.json").read_text())
    assert doc["max_eor"] == 3.0 and {a["planner"] for a in doc["answers"]} == {"vanilla", "vdnn"}
    for a in doc["answers"]:
        assert a["eor"] is None or a["eor"] <= 3.0
    assert "# memplan capacity" in (out / "report.md").read_text()
    assert (out / "capacity.png").read_bytes()[:4] == b"\x89PNG"
    assert run_cli(argv, 60).code == 0  # an old report is replaced whole


def test_amp_reaches_every_capture():
    # the options every probe's capture is made with carry --amp (and the
    # target, which autocast on meta needs: the --gpu by default)
    from memplan.traces.model import Amp

    from memplan.cli import build_parser
    from memplan.commands.capacity import _capture_options

    args = build_parser().parse_args(["capacity", "--model", "mlp", *GPU, "--amp", "fp16"])
    opts = _capture_options(args)
    assert opts.amp is Amp.FP16 and opts.target is not None
    args = build_parser().parse_args(["capacity", "--model", "mlp", *GPU])
    assert _capture_options(args).amp is Amp.NONE


# ---- bad arguments -------------------------------------------------------------------
BAD = [
    (["--model", "mlp", "--jobs", "0"], ["--jobs", "from 1 to 64"]),
    (["--model", "mlp", "--jobs", "mlp:0,small_cnn"], ["--jobs", "COUNT >= 1"]),
    (["--jobs", "mlp:40,small_cnn:40"], ["--jobs", "80 jobs"]),
    (["--model", "mlp", "--max-eor", "-1"], ["--max-eor"]),
    (["--model", "mlp", "--max-eor", "nan"], ["--max-eor"]),
    (["--model", "resnet51"], ["unknown workload 'resnet51'"]),
    (["--model", "mlp", "--budget", "1MiB"], ["nothing fits", "batch 1", "1.00 MiB"]),
    (["--model", "mlp", "--budget", "1MiB", "--batches", "5:9"], ["nothing fits", "batch 5"]),
    (["--model", "mlp", "--batches", "9:5"], ["--batches", "LO <= HI"]),
    (["--model", "mlp", "--batches", "0:5"], ["--batches"]),
    (["--model", "mlp", "--batches", "a:b"], ["--batches", "LO:HI"]),
    (["--model", "mlp", "--batches", "1:" + "9" * 40], ["--batches", "1000000"]),
    (["--model", "mlp", "--jobs", "auto"], ["--jobs auto", "--batch"]),
    (["--model", "mlp", "--batch", "4", "--batches", "1:9"], ["--batches", "--batch"]),
    ([], ["--model", "--trace"]),
    (["--model", "mlp", "--jobs", "small_cnn:2"], ["--jobs", "drop --model"]),
    (["--model", "mlp", "--budget", "50%"], ["--budget", "share"]),
    (["--model", "mlp", "--budget", "17GiB"], ["--budget", "device memory"]),
    (["--model", "mlp", "--planners", "tensil"], ["tensil"]),
    (["--model", "mlp", "--planners", ","], ["--planners"]),
    (["--model", "mlp", "--option", "squeeze.max_evaluations=5"], ["squeeze", "not being"]),
    (["--model", "mlp", "--planners", "squeeze", "--option", "squeeze.nope=1"], ["nope"]),
    (["--model", "mlp", "--optimizer", "lion"], ["--optimizer", "lion"]),
    (["--model", "mlp", "--opt", "foo=1"], ["--opt", "foo"]),
    (["--model", "mlp", "--opt", "lr=1", "--opt", "lr=2"], ["--opt", "twice"]),
    (["--model", "mlp", "--accumulate", "0"], ["--accumulate"]),
    (["--trace", "T", "--optimizer", "sgd"], ["--optimizer", "--trace"]),
    (["--trace", "T", "--amp", "bf16"], ["--amp", "--trace"]),
    (["--model", "mlp", "--amp", "bf16", "--dtype", "bf16"], ["--amp bf16", "--dtype bf16"]),
    (["--model", "mlp", "--iterations", "0"], ["--iterations"]),
    (["--model", "mlp", "--fallback", "panic"], ["--fallback"]),
    (["--trace", "T", "--batch", "4"], ["--batch", "--trace"]),
    (["--trace", "T:3"], ["one trace"]),
    (["--trace", "DIR/missing.json"], ["missing.json"]),
    (["--model", "mlp", "--out", "DIR/no/such"], ["--out", "does not exist"]),
]


@pytest.fixture(scope="module")
def chain_file(tmp_path_factory) -> tuple[str, str]:
    d = tmp_path_factory.mktemp("cap")
    io.save(synthetic.chain(3), d / "chain.json")
    return str(d / "chain.json"), str(d)


@pytest.mark.parametrize(("argv", "names"), BAD, ids=lambda x: " ".join(x)[:50])
def test_bad_arguments_are_refused_in_one_line(chain_file, argv, names):
    trace, d = chain_file
    argv = [trace + a[1:] if a == "T" or a.startswith("T:") else a.replace("DIR", d) for a in argv]
    o = run_cli(["capacity", *argv, *GPU, "--no-progress"], 60)
    assert_rejected(o, *names)
    assert not Path(d, "no").exists()

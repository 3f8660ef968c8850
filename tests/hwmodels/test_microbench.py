"""Microbenchmarks: samples, background load, a tiny measured run, the CLI end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from memplan.hwmodels import shapes
from memplan.hwmodels.dataset import load_dataset, save_dataset
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.hostmem import cache_host_allocations
from memplan.hwmodels.load import CpuLoad
from memplan.hwmodels.microbench import MicrobenchOptions, OtherActivity, cpu_setup, run_microbench
from memplan.hwmodels.opclass import OpClass, classify
from memplan.traces import io

from memplan.cli import main


@pytest.fixture
def small_shapes(monkeypatch):
    """Shrink the samplers' caps so a run takes a second, not minutes."""
    monkeypatch.setattr(shapes, "MAX_NUMEL", 2**12)
    monkeypatch.setattr(shapes, "MAX_MM_FLOPS", 2e6)
    monkeypatch.setattr(shapes, "MAX_CONV_FLOPS", 2e6)


@pytest.mark.parametrize("cls", shapes.MEASURED_CLASSES)
def test_samples_are_seeded_json_calls_of_their_class(cls):
    a = shapes.sample_specs(cls, 30, seed=1)
    assert a == shapes.sample_specs(cls, 30, seed=1)
    assert a != shapes.sample_specs(cls, 30, seed=2)
    for s in a:
        assert classify(s.target) is cls
        json.dumps(s.args)  # the JSON form a trace stores


def test_cpu_load_workers_start_and_stop():
    with CpuLoad(None) as load:
        procs = list(load._procs)
        load.set(0.5)
        assert all(p.poll() is None for p in procs)
    assert all(p.poll() is not None for p in procs)


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2
    or not os.path.exists("/proc/stat"),
    reason="needs two cores to pin to and /proc/stat",
)  # fmt: skip
def test_other_activity_sees_a_spinner_on_another_core():
    """A CPU-bound process pinned to the last core keeps about one core busy;
    the monitor of a run measuring on the first core must see most of it."""
    first, last = min(os.sched_getaffinity(0)), max(os.sched_getaffinity(0))
    spin = (
        f"import os, time\nos.sched_setaffinity(0, {{{last}}})\n"
        "t = time.time()\nwhile time.time() - t < 0.6:\n    pass\n"
    )
    monitor = OtherActivity([first])
    proc = subprocess.Popen([sys.executable, "-c", spin])
    monitor.start()
    proc.wait()
    busy = monitor.stop()
    assert 0.5 <= busy <= len(monitor.others) + 0.05
    assert OtherActivity(list(range(os.cpu_count() or 1))).stop() == -1.0  # no other cores


def test_tiny_run_makes_a_valid_dataset(small_shapes, tmp_path):
    opts = MicrobenchOptions(samples=3, usage_levels=(0.0, 1.0), repeats=1, min_block_s=5e-4,
                             classes=(OpClass.ELEMENTWISE, OpClass.MATMUL, OpClass.REDUCTION))  # fmt: skip
    old_threads = torch.get_num_threads()
    ds = run_microbench(opts)
    assert torch.get_num_threads() == old_threads  # restored
    assert ds.trace.n_ops == 9 - ds.meta.skipped
    assert len(ds.op) == 2 * ds.trace.n_ops
    assert (ds.latency_s > 0).all() and ((ds.usage >= 0) & (ds.usage <= 1)).all()
    assert ds.meta.copy["h2d_bytes_per_s"] > 0
    # measured as a caching allocator would allocate, and recorded (hwmodels/hostmem.py)
    assert ds.meta.host_allocations_cached is cache_host_allocations()
    io.from_dict(io.to_dict(ds.trace))  # a valid trace: the featurizer reads it like any other
    path = tmp_path / "d.json.gz"
    save_dataset(ds, path)
    back = load_dataset(path)
    assert back.meta == ds.meta
    assert np.array_equal(back.latency_s, ds.latency_s) and np.array_equal(back.op, ds.op)
    assert np.array_equal(back.heldout(), ds.heldout())


def test_cpu_setup_restores_affinity_and_threads():
    before = (torch.get_num_threads(), os.sched_getaffinity(0))
    with cpu_setup(1) as cores:
        assert torch.get_num_threads() == 1
        assert os.sched_getaffinity(0) == set(cores)
    assert (torch.get_num_threads(), os.sched_getaffinity(0)) == before


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"device": "tpu"}, "device='tpu'"),
        ({"usage_levels": (0.0, 1.5)}, "must be fractions"),
        ({"samples": 0}, "must be >= 1"),
    ],
)
def test_bad_options(kwargs, message):
    with pytest.raises(LatencyError, match=message):
        MicrobenchOptions(**kwargs)


def test_bad_dataset_files(tmp_path):
    with pytest.raises(LatencyError, match="no such microbenchmark dataset"):
        load_dataset(tmp_path / "none.json.gz")
    p = tmp_path / "x.json"
    p.write_text('{"schema": "memplan.trace/1"}')
    with pytest.raises(LatencyError, match="schema: expected 'memplan.microbench/1'"):
        load_dataset(p)


def test_cli_microbench_train_eval_predict(small_shapes, tmp_path, capsys):
    data, model = tmp_path / "d.json.gz", tmp_path / "m.pt"
    rc = main(["microbench", "--samples", "6", "--classes", "elementwise,matmul", "--usage", "0,0.5",
               "--repeats", "1", "--min-block-ms", "0.5", "--out", str(data), "--no-progress"])  # fmt: skip
    assert rc == 0 and "measurements" in capsys.readouterr().out
    rc = main(["latency", "train", str(data), "--out", str(model), "--epochs", "30",
               "--ensemble", "1", "--hidden", "8,8"])  # fmt: skip
    assert rc == 0 and "trained 2 op classes" in capsys.readouterr().out
    assert main(["latency", "eval", str(model), str(data), "--rows", "all"]) == 0
    out = capsys.readouterr().out
    assert "MLP MdAPE" in out and "matmul" in out
    assert main(["latency", "eval", str(model), str(data), "--rows", "all", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["mlp"]["all"]["n"] == len(load_dataset(data).op)
    # the model's own samples, timed by it
    trace = tmp_path / "t.json"
    io.save(load_dataset(data).trace, trace)
    assert (
        main(["latency", "predict", str(trace), "--hardware", "cpu-local", "--model", str(model)])
        == 0
    )
    assert "MLP timed" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["microbench", "--usage", "0,2", "--out", "x"],
        ["microbench", "--classes", "convolution", "--out", "x"],
        ["latency", "eval", "missing.pt", "missing.json.gz"],
        ["latency", "train", "missing.json.gz", "--out", "m.pt"],
        ["latency", "predict", "missing.json", "--hardware", "nope"],
    ],
)
def test_cli_bad_input_is_one_line_exit_2(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"memplan {argv[0]}: error: ") and err.count("\n") == 1


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tiny_run(small_shapes):
    opts = MicrobenchOptions(device="cuda", samples=2, usage_levels=(0.0, 0.5), repeats=2,
                             min_block_s=1e-3, classes=(OpClass.MATMUL, OpClass.ELEMENTWISE),
                             hardware_name="cuda-local")  # fmt: skip
    ds = run_microbench(opts)
    assert (ds.latency_s > 0).all()
    assert set(ds.usage.tolist()) == {0.0, 0.5}  # CUDA rows keep the load level
    assert ds.meta.copy["h2d_bytes_per_s"] > 1e9

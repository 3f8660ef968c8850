"""`memplan sweep`'s grid, its records and its Pareto fronts, checked by hand,
against `memplan compare --json`, and against a brute force."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.kernels import KernelModel
from memplan.hwmodels.profile import load_hardware, profile_path
from memplan.traces import io, synthetic

import memplan
from memplan.cli import main
from memplan.comparison import best_bound
from memplan.sweep import summary
from memplan.sweep.grid import load_grid
from memplan.sweep.scenario import SweepTask, run_scenario

MIB = 1 << 20


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sweep_grid")
    io.save(synthetic.chain(4), d / "a.json")
    io.save(synthetic.residual(2), d / "b.json")
    return d


def _grid(folder: Path, body: str, name: str = "grid.toml") -> Path:
    path = folder / name
    path.write_text(body)
    return path


def test_the_scenarios_are_the_product_of_the_axes_in_grid_order(folder):
    path = _grid(folder, """
[grid]
traces = ["a.json", ["a.json", "b.json:2"]]
gpus = ["rtx-a6000", "p100-pcie-16gb"]
planners = ["tensile", {name = "checkpoint", segments = 2}]
budgets = ["60%", "none"]
fallbacks = "dtr"
""")  # fmt: skip
    a, b = str(folder / "a.json"), str(folder / "b.json")
    got = load_grid(path).scenarios
    expected = [
        SweepTask(
            traces=jobs, gpu=gpu, planner=planner, options=options, budget=budget, fallback="dtr"
        )  # fmt: skip
        for jobs in [(a,), (a, b, b)]
        for gpu in ["rtx-a6000", "p100-pcie-16gb"]
        for planner, options in [("tensile", ()), ("checkpoint", (("segments", 2),))]
        for budget in ["60%", None]
    ]
    assert got == expected
    assert got[0].name() == "a x1 rtx-a6000 tensile 60% dtr"
    assert got[-1].name() == "a x1 + b x2 p100-pcie-16gb checkpoint(segments=2) no-budget dtr"


def test_identity_is_of_contents_and_key_adds_the_version(folder, tmp_path, monkeypatch):
    shutil.copy(folder / "a.json", tmp_path / "renamed.json")
    here = SweepTask(traces=(str(folder / "a.json"),), gpu="rtx-a6000", planner="tensile")
    moved = SweepTask(traces=(str(tmp_path / "renamed.json"),), gpu="rtx-a6000", planner="tensile")
    other = SweepTask(traces=(str(folder / "b.json"),), gpu="rtx-a6000", planner="tensile")
    assert here.identity() == moved.identity() != other.identity()
    assert here.inputs()["jobs"][0]["fingerprint"] == io.fingerprint(io.load(folder / "a.json"))
    key = here.key()
    assert key != here.identity() and len(key) == 16
    monkeypatch.setattr(memplan, "__version__", "99.0")
    assert here.key() != key and here.identity() == moved.identity()


@pytest.mark.parametrize(
    "argv, planner",
    [
        (["--budget", "70%", "--fallback", "passive", "--planners", "tensile"], "tensile"),
        (["--planners", "checkpoint", "--option", "checkpoint.segments=2"], "checkpoint"),
    ],
)
def test_a_record_has_the_figures_compare_prints(folder, capsys, argv, planner):
    trace = str(folder / "a.json")
    assert main(["compare", trace, "--gpu", "rtx-a6000", "--json", *argv]) == 0
    doc = json.loads(capsys.readouterr().out)
    (row,) = doc["rows"]
    budget = argv[1] if argv[0] == "--budget" else None
    fallback = "passive" if "passive" in argv else "none"
    options = (("segments", 2),) if "--option" in argv else ()
    s = SweepTask(traces=(trace,), gpu="rtx-a6000", planner=planner, options=options,
                 budget=budget, fallback=fallback)  # fmt: skip
    record = run_scenario(s)
    m = record["metrics"]
    assert record["status"] == row["fit"]
    assert m["budget_bytes"] == row["budget_bytes"]
    assert m["peak_bytes"] == row["peak_bytes"]
    assert m["vanilla_peak_bytes"] == doc["vanilla"]["peak_bytes"]
    assert m["iteration_ms"] == pytest.approx(row["iteration_time_s"] * 1e3, rel=1e-12)
    assert m["vanilla_ms"] == pytest.approx(doc["vanilla"]["iteration_time_s"] * 1e3, rel=1e-12)
    for key in ("msr", "eor", "cbr", "gap"):
        assert m[key] == row[key], key
    assert m["bound_name"] == row["bound"]
    device = DeviceModel(load_hardware("rtx-a6000"), KernelModel())  # the default --latency
    limit = m["budget_bytes"] or device.hw.memory_bytes  # exact allocator: no contexts
    seconds, name = best_bound([io.load(trace)], device, limit)
    assert m["bound_ms"] == pytest.approx(seconds * 1e3, rel=1e-9) and name == m["bound_name"]
    assert (m["bytes_out"], m["bytes_in"]) == (row["bytes_d2h"], row["bytes_h2d"])
    assert m["net_evictions"] == row["evictions"]
    assert record["reason"] == row["reason"]
    # the same record, byte for byte, from a second run
    assert json.dumps(run_scenario(s), sort_keys=True) == json.dumps(record, sort_keys=True)


def test_a_budget_above_the_gpu_is_an_error_record_and_oom_is_a_status(folder):
    trace = str(folder / "a.json")
    big = run_scenario(SweepTask(traces=(trace,), gpu="p100-pcie-16gb", planner="tensile",
                                budget="20GiB"))  # fmt: skip
    assert big["status"] == "error" and "more than the device memory" in big["reason"]
    assert big["metrics"] == dict.fromkeys(big["metrics"])
    # a share above the device is cut to its memory, and the record says so
    # (NOTE [ Budgets above the device ]: compare warns on stderr instead)
    small = folder / "small.toml"
    text = profile_path("rtx-a6000").read_text()
    small.write_text(re.sub(r"(?m)^memory_bytes = .*$", f"memory_bytes = {MIB}", text, count=1))
    cut = run_scenario(SweepTask(traces=(trace,), gpu=str(small), planner="vdnn",
                                budget="1000%"))  # fmt: skip
    assert cut["metrics"]["budget_bytes"] == MIB and cut["metrics"]["vanilla_peak_bytes"] > MIB / 10
    assert "more than the device memory" in cut["reason"] and "using 1.00 MiB" in cut["reason"]
    tight = run_scenario(SweepTask(traces=(trace,), gpu="rtx-a6000", planner="vanilla",
                                  budget="50%"))  # fmt: skip
    assert tight["status"] == "oom" and tight["metrics"]["msr"] is None
    assert tight["metrics"]["budget_bytes"] == tight["metrics"]["vanilla_peak_bytes"] // 2


BAD = [
    ("[grid]\ntraces = 'a.json'\nplanners = 'tensile'\n", "grid: missing field 'gpus'"),
    ("[grid]\ntraces='a.json'\ngpus='rtx-a6000'\nplanners='tensile'\nbudget='1GiB'\n",
     'grid: unknown field "budget"'),
    ("[grid]\ntraces = [42]\ngpus = 'rtx-a6000'\nplanners = 'tensile'\n", "grid.traces[0]:"),
    ("[grid]\ntraces = ['nope.json']\ngpus = 'rtx-a6000'\nplanners = 'tensile'\n",
     "grid.traces[0]: "),
    ("[grid]\ntraces = ['a.json:0']\ngpus = 'rtx-a6000'\nplanners = 'tensile'\n",
     "grid.traces[0]: 'a.json:0': COUNT"),
    ("[grid]\ntraces = [[]]\ngpus = 'rtx-a6000'\nplanners = 'tensile'\n",
     "grid.traces[0]: an empty job mix"),
    ("[grid]\ntraces = ['a.json', ['b.json', 7]]\ngpus = 'rtx-a6000'\nplanners = 'tensile'\n",
     "grid.traces[1][1]: expected a string"),
    ("[grid]\ntraces = 'a.json'\ngpus = ['no-such-gpu']\nplanners = 'tensile'\n", "grid.gpus[0]:"),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = ['nosuch']\n",
     "grid.planners[0]: unknown planner 'nosuch'"),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\n"
     "planners = [{name = 'checkpoint', segments = 'many'}]\n", "grid.planners[0]: checkpoint"),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = [{name = 'squeeze', x = 1}]\n",
     "grid.planners[0]: squeeze: unknown option 'x'"),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = [{segments = 2}]\n",
     "grid.planners[0]: a planner table needs name"),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = [{name = 'dtr', seed = 1}]\n",
     "grid.planners[0]: dtr is a witness"),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = ['tensile', 'tensile']\n",
     "grid.planners[1]: \"tensile\" is given twice"),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = 'tensile'\nbudgets = ['0%']\n",
     "grid.budgets[0]: "),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = 'tensile'\nbudgets = ['-5GiB']\n",
     "grid.budgets[0]: "),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = 'tensile'\nbudgets = [true]\n",
     "grid.budgets[0]: expected a string"),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = 'tensile'\nbudgets = []\n",
     "grid.budgets: an empty list"),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = 'tensile'\nfallbacks = ['lru']\n",
     "grid.fallbacks[0]: \"lru\" is not one of none, passive, dtr"),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = 'tensile'\nallocators = 'magic'\n",
     "grid.allocators: \"magic\" is not one of"),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = 'tensile'\nlanes = [3]\n",
     "grid.lanes[0]: expected an integer in [1, 2]"),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = 'tensile'\niterations = 0\n",
     "grid.iterations: expected an integer in [1, 1000]"),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = 'tensile'\nseeds = [-1]\n",
     "grid.seeds[0]: expected an integer"),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = 'tensile'\nlatency = 'fast'\n",
     "grid.latency: \"fast\" is not kernel, roofline"),
    ("[grid]\nmodels = ['mlp']\ngpus = 'rtx-a6000'\nplanners = 'tensile'\n",
     "grid: missing field 'batch_sizes'"),
    ("[grid]\nmodels = ['nosuch']\nbatch_sizes = 8\ngpus = 'rtx-a6000'\nplanners = 'tensile'\n",
     "grid.models[0]: unknown workload"),
    ("[grid]\ntraces = 'a.json'\nbatch_sizes = 8\ngpus = 'rtx-a6000'\nplanners = 'tensile'\n",
     "grid.batch_sizes: applies to models"),
    ("[grid]\ngpus = 'rtx-a6000'\nplanners = 'tensile'\n", "grid: no jobs"),
    ("[grid]\ntraces = 'a.json'\ngpus = 'rtx-a6000'\nplanners = 'tensile'\n[other]\n",
     'unknown table "other"'),
    ("[grid\n", "not valid TOML"),
    ("title = 'x'\n", "unknown table"),
    ("", "no [grid] table"),
]  # fmt: skip


@pytest.mark.parametrize("body, expected", BAD, ids=[e for _b, e in BAD])
def test_a_bad_grid_is_one_line_naming_the_field_and_exit_2(folder, tmp_path, capsys, body,
                                                           expected):  # fmt: skip
    path = _grid(folder, body, "bad.toml")
    out = tmp_path / "out"
    assert main(["sweep", str(path), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"bad.toml: {expected}" in err, err
    assert not out.exists()  # refused before any work


def test_a_bad_out_or_a_missing_extra_is_refused_before_any_work(folder, tmp_path, capsys,
                                                                monkeypatch):  # fmt: skip
    path = _grid(folder, "[grid]\ntraces='a.json'\ngpus='rtx-a6000'\nplanners='vanilla'\n")
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    assert main(["sweep", str(path), "--out", str(foreign)]) == 2
    assert "not a sweep's (notes.txt)" in capsys.readouterr().err
    out = tmp_path / "out"
    monkeypatch.setitem(__import__("sys").modules, "ray", None)  # import ray fails
    assert main(["sweep", str(path), "--out", str(out), "--backend", "ray"]) == 2
    assert "pip install 'memplan[ray]'" in capsys.readouterr().err
    monkeypatch.setitem(__import__("sys").modules, "pyarrow", None)
    assert main(["sweep", str(path), "--out", str(out), "--parquet"]) == 2
    assert "pip install 'memplan[parquet]'" in capsys.readouterr().err
    assert main(["sweep", str(path), "--out", str(out), "--address", "x:1"]) == 2
    assert "--backend ray" in capsys.readouterr().err
    assert not out.exists()


def _dominated(p: tuple[float, float], q: tuple[float, float]) -> bool:
    """q dominates p: at least as much memory saved, at most the overhead, and not equal."""
    return q[0] >= p[0] and q[1] <= p[1] and q != p


@pytest.mark.parametrize("seed", range(40))
def test_the_pareto_front_is_the_set_no_point_dominates(seed):
    rng = random.Random(seed)
    n = rng.randint(0, 30)
    grid = rng.choice([3, 6, 1000])  # few values: many ties and equal points
    points = [(rng.randint(0, grid) / grid, 1 + rng.randint(0, grid) / grid) for _ in range(n)]
    front = summary.pareto_front(points)
    brute = [i for i, p in enumerate(points) if not any(_dominated(p, q) for q in points)]
    assert sorted(front) == brute
    assert front == sorted(front, key=lambda i: (points[i][1], -points[i][0], i))

"""Issue 17, plans: seeded mutants of a valid plan file (tests/fuzz/plan_mutants.py)
through `memplan simulate --plan` (every mutant), `memplan export` (every
third) and `memplan validate --plan` (a few, on a tiny captured trace: it
replays tensors), in-process with a time limit each. Zero tracebacks, zero
hangs; a mutant the generator calls bad is rejected in one line naming the
file and the field, a valid variant runs to exit 0 with whole, printable
output."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Roofline
from memplan.hwmodels.profile import load_hardware
from memplan.planners.core.check import iteration_us
from memplan.traces import io, synthetic

from tests.fuzz.harness import Outcome, assert_clean, assert_rejected, assert_whole, run_cli
from tests.fuzz.plan_mutants import CLASSES, Base, Mutant, mutants

GPU = "a100-pcie-40gb"
TIMEOUT_S = 20.0  # a simulation here takes tens of ms
VALIDATE_TIMEOUT_S = 120.0
QUICK = ["--iterations", "2", "--runs", "1", "--samples", "1"]
# a time printed as inf or nan, or a negative size (not the "-40gb" of a GPU's name)


def _base(
    d: Path, trace_path: Path, planner: str, gpu: str, budget: str, iteration: float | None = None
) -> tuple[Base, set[str]]:
    """A plan of `trace_path` by `planner` through the CLI, as a `Base` (the
    iteration on `gpu` by the roofline, unless given), and its event kinds."""
    out = d / f"{planner}.json"
    o = run_cli(
        ["plan", str(trace_path), "--planner", planner, "--gpu", gpu, "--budget", budget]
        + ["--latency", "roofline", "--out", str(out)],
        60.0,
    )
    assert_clean(o)
    assert o.code == 0, o.describe()
    doc = json.loads(out.read_text())
    trace = io.load(trace_path)
    kinds = {e["type"] for e in doc["plans"][0]["events"]}
    return Base(
        doc,
        trace.n_ops,
        trace.n_buffers,
        iteration or iteration_us(trace, DeviceModel(load_hardware(gpu), Roofline())),
    ), kinds


@pytest.fixture(scope="module")
def chain_base(tmp_path_factory):
    """chain(4) and capuchin's plan at 60% of its peak: a release, a
    recompute, a swap-out with a deadline and a swap-in."""
    d = tmp_path_factory.mktemp("fuzz_plans")
    trace_path = d / "chain.json"
    io.save(synthetic.chain(4), trace_path)
    base, kinds = _base(d, trace_path, "capuchin", GPU, "60%")
    assert kinds == {"swap_out", "swap_in", "release", "recompute"}
    return trace_path, base


def judge(o: Outcome, m: Mutant, path: Path, *, simulated: bool) -> None:
    """The verdict of `m` on outcome `o`; `simulated`: the command simulates
    or replays the plan (else a `simulated_only` rejection is a valid file)."""
    if m.either:
        assert_clean(o)
        if o.code == 2:
            assert_rejected(o)
        return
    if m.field is None or (m.simulated_only and not simulated):
        assert_whole(o, f"{m.cls}: {m.what}")
        return
    # simulate checks the plan count across its --plan options, not in one file
    names = (m.field,) if m.cls == "plan_count" else (path.name, m.field)
    assert_rejected(o, *names)


def run_mutants(tmp_path: Path, trace_path: Path, base: Base, seed: int, n: int) -> Counter:
    seen: Counter = Counter()
    failures: list[str] = []
    out = tmp_path / "runtime.json"
    for k, m in enumerate(mutants(base, seed, n)):
        path = tmp_path / f"p{seed}_{k}{m.suffix}"
        path.write_bytes(m.data)
        sim = ["simulate", str(trace_path), "--gpu", GPU, "--plan", str(path), "--iterations", "2"]
        runs: list[tuple[list[str], bool]] = [(sim, True)]
        if k % 3 == 0:
            runs.append(
                (["export", str(path), "--trace", str(trace_path), "--out", str(out)], False)
            )
        for argv, simulated in runs:
            o = run_cli(argv, TIMEOUT_S)
            try:
                judge(o, m, path, simulated=simulated)
            except AssertionError as e:
                failures.append(f"mutant {k} ({m.cls}: {m.what}): {e}")
        seen[m.cls] += 1
        path.unlink()
    assert not failures, f"{len(failures)} failures, the first:\n" + "\n\n".join(failures[:3])
    return seen


def test_300_plan_mutants(tmp_path, chain_base):
    trace_path, base = chain_base
    seen = run_mutants(tmp_path, trace_path, base, seed=17, n=len(CLASSES) * 17)
    assert sum(seen.values()) >= 300
    assert set(seen) == set(CLASSES) and min(seen.values()) == 17  # round-robin


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_more_plan_mutants(tmp_path, chain_base, seed):
    # 1620 more over two seeds: sized with the rest of the slow tests to keep
    # the whole suite, which CI runs, within its 10 minutes
    trace_path, base = chain_base
    run_mutants(tmp_path, trace_path, base, seed=seed, n=len(CLASSES) * 45)


def test_the_issues_plans(tmp_path, chain_base):
    # the cases issue 17 reports, by hand: each one line naming the field
    trace_path, base = chain_base
    cases = {
        "delay_us": [
            ('"delay_us": 0.0', '"delay_us": ' + "1" + "0" * 400),
            ('"delay_us": 0.0', '"delay_us": 1e308'),
        ],  # fmt: skip
        "type": [('"type": "release"', '"type": {}')],
        "nested": [('"stats": {', '"stats": {"x": ' + "[" * 100_000 + "]" * 100_000 + ", ")],
    }
    text = json.dumps(base.doc)
    for field, edits in cases.items():
        for old, new in edits:
            assert old in text
            path = tmp_path / "p.json"
            path.write_text(text.replace(old, new, 1))
            o = run_cli(["simulate", str(trace_path), "--gpu", GPU, "--plan", str(path)], TIMEOUT_S)
            assert_rejected(o, "p.json", field)


# ---- validate: a small share, on a captured trace (it replays tensors) ----------------------
@pytest.fixture(scope="module")
def mlp_base(tmp_path_factory):
    from tests.validate.helpers import trace_of

    d = tmp_path_factory.mktemp("fuzz_validate")
    trace_path = d / "mlp.json"
    io.save(trace_of("mlp"), trace_path)
    # validate measures the iteration on this machine (about 20 ms here): the
    # delays "past the iteration" are drawn past 10 s, past any it measures
    base, kinds = _base(d, trace_path, "capuchin", "cpu-local", "70%", iteration=10e6)
    assert "swap_out" in kinds
    return trace_path, base


def _validate(tmp_path: Path, trace_path: Path, m: Mutant) -> Outcome:
    path = tmp_path / f"v{m.suffix}"
    path.write_bytes(m.data)
    argv = ["validate", str(trace_path), "--plan", str(path), *QUICK]
    o = run_cli(argv, VALIDATE_TIMEOUT_S)
    if m.cls == "delay_valid":  # within 10 s, not within the measured iteration: either
        assert_clean(o)
        assert o.code == 0 or "delay_us" in o.stderr, o.describe()
    else:
        judge(o, m, path, simulated=True)
    return o


VALIDATED = ("delay_not_finite", "delay_absurd", "delay_past_iteration", "type", "nested")


def test_validate_refuses_bad_delays_and_replays_a_valid_plan(tmp_path, mlp_base):
    # the delays that hung or crashed the replay, and a valid file: each clean and in bounded time
    trace_path, base = mlp_base
    picked = {}
    for m in mutants(base, seed=5, n=len(CLASSES) * 3):
        if m.cls in VALIDATED and m.cls not in picked:
            picked[m.cls] = m
    assert set(picked) == set(VALIDATED)
    for m in picked.values():
        _validate(tmp_path, trace_path, m)
    valid = Mutant("valid", "the planner's own file", json.dumps(base.doc).encode(), ".json", None)
    _validate(tmp_path, trace_path, valid)


@pytest.mark.slow
def test_more_validate_mutants(tmp_path, mlp_base):
    trace_path, base = mlp_base
    for m in mutants(base, seed=11, n=len(CLASSES) * 2):
        _validate(tmp_path, trace_path, m)

"""Issue 17, traces: seeded mutants of a small valid trace through `memplan
inspect`, `simulate` and `plan`, in-process with a time limit each. Zero
tracebacks, zero hangs; every mutant the generator calls bad is rejected in
one line naming the file and the field, and every valid variant runs to
exit 0 with output that is whole (no inf / NaN times, no negative sizes) and
printable (encodes as UTF-8, lone surrogates escaped).

Bad mutants go through one command each (the three in turn: the loader is
the same); valid ones through all three in `make test`'s 510, through one
in turn in the slow 1500 (`make test` runs those too, so they are kept to
about 20 s).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from memplan.traces import io, synthetic

from tests.fuzz.harness import assert_rejected, assert_whole, run_cli
from tests.fuzz.trace_mutants import CLASSES, mutants

TIMEOUT_S = 10.0
BUDGET = "10MiB"  # chain(3): vanilla peak 13 MiB, so the planner has work to do


def commands(path: Path) -> list[list[str]]:
    p = str(path)
    return [
        ["inspect", p],
        ["simulate", p, "--gpu", "rtx-a6000"],
        ["plan", p, "--gpu", "rtx-a6000", "--budget", BUDGET, "--planner", "tensile"],
    ]


def run_mutants(tmp_path: Path, seed: int, n: int, *, every_command: bool) -> Counter:
    """Run `n` mutants of seed `seed` (valid ones through every command, or
    one in turn); returns how many of each class and verdict ran."""
    base = io.to_dict(synthetic.chain(3))
    seen: Counter = Counter()
    failures: list[str] = []
    for k, m in enumerate(mutants(base, seed, n)):
        path = tmp_path / f"m{seed}_{k}{m.suffix}"
        path.write_bytes(m.data)
        argvs = commands(path)
        if m.field is not None or not every_command:
            argvs = [argvs[k % len(argvs)]]
        for argv in argvs:
            o = run_cli(argv, TIMEOUT_S)
            try:
                if m.field is None:
                    assert_whole(o, f"{m.cls}: {m.what}")
                else:
                    assert_rejected(o, path.name, m.field)
            except AssertionError as e:
                failures.append(f"mutant {k} ({m.cls}: {m.what}): {e}")
        seen[(m.cls, m.field is None)] += 1
        path.unlink()
    assert not failures, f"{len(failures)} failures, the first:\n" + "\n\n".join(failures[:3])
    return seen


def test_500_trace_mutants(tmp_path):
    seen = run_mutants(tmp_path, seed=17, n=510, every_command=True)
    assert sum(seen.values()) == 510
    for cls in CLASSES:  # round-robin: every class ran 30 times
        assert seen[(cls, False)] + seen[(cls, True)] == 30
    valid = sum(n for (_, ok), n in seen.items() if ok)
    assert 40 <= valid <= 200  # both verdicts well represented


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_more_trace_mutants(tmp_path, seed):
    """1500 more mutants over three other seeds (2010 in all)."""
    run_mutants(tmp_path, seed=seed, n=500, every_command=False)

"""A real `memplan compare --out DIR` process, sent SIGTERM or SIGINT at
seeded random moments over its life -- start-up (the parser and torch being
imported), planning, simulating, writing -- leaves the old report or the
complete new one, never a mix, and no temporary beside it; it says one line,
never a traceback (NOTE [ Signals in memplan ], NOTE [ Report directories ]).
And a reader that closes the pipe early ends memplan quietly (NOTE [ Exit
codes ])."""

from __future__ import annotations

import json
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from memplan.sim.snapshot_read import read_snapshot
from memplan.traces import io, synthetic

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/status").exists(), reason="reads a process's signal mask from /proc"
)

_SCRIPT = Path(sys.executable).with_name("memplan")
MEMPLAN = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-m", "memplan"]

OLD = {"report.md": "the old report\n", "memory.png": "old png", "plans/old.json": "{}"}
NEW = {
    "report.md",
    "report.json",
    "memory.png",
    "plans/tensile.json",
    "plans/checkpoint.json",
    "snapshots/vanilla.pickle",
    "snapshots/tensile.pickle",
    "snapshots/checkpoint.pickle",
}
SAID = {signal.SIGINT: (130, "memplan: interrupted"),
        signal.SIGTERM: (143, "memplan: terminated (SIGTERM)")}  # fmt: skip


def _files(d: Path) -> set[str]:
    return {str(p.relative_to(d)) for p in d.rglob("*") if p.is_file()}


def _write_old(out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    (out / "plans").mkdir(parents=True)
    for name, text in OLD.items():
        (out / name).write_text(text)


def _state(out: Path) -> str:
    """'old' or 'new' (complete, every file whole), else AssertionError."""
    assert out.is_dir(), "no report directory at all"
    names = _files(out)
    if names == set(OLD):
        assert {n: (out / n).read_text() for n in OLD} == OLD, "the old report was changed"
        return "old"
    assert names == NEW, f"a mix of reports: {sorted(names)}"
    assert (out / "report.md").read_text().startswith("# memplan compare")
    for name in NEW - {"report.md", "memory.png"}:
        if name.endswith(".pickle"):
            read_snapshot(out / name)  # whole: a truncated pickle is a SimError
        else:
            json.loads((out / name).read_text())
    png = (out / "memory.png").read_bytes()
    assert png.startswith(b"\x89PNG") and png[-12:-4] == b"\x00\x00\x00\x00IEND"
    return "new"


def _handlers_installed(pid: int) -> bool:
    """Has memplan's main installed its handlers (SIGTERM caught), or exited?"""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    caught = next(line.split()[1] for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught, 16) & (1 << (signal.SIGTERM - 1)))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A small trace, and how long one undisturbed run takes (seconds)."""
    root = tmp_path_factory.mktemp("signals")
    trace = root / "chain.json.gz"
    io.save(synthetic.chain(12), trace)
    out = root / "report"
    _write_old(out)
    t0 = time.monotonic()
    p = subprocess.run([*_argv(trace, out)], capture_output=True, text=True, timeout=300)
    lifetime = time.monotonic() - t0
    assert p.returncode == 0, p.stderr
    assert _state(out) == "new"
    assert sorted(p.name for p in root.iterdir()) == ["chain.json.gz", "report"]
    return trace, lifetime


def _argv(trace: Path, out: Path) -> list[str]:
    return [*MEMPLAN, "compare", str(trace), "--gpu", "rtx-a6000",
            "--planners", "tensile,checkpoint", "--out", str(out)]  # fmt: skip


def _kill_runs(setup, tmp_path, n: int, seed: int) -> list[tuple]:
    """`n` runs, each signalled once at a seeded random moment; checks each."""
    trace, lifetime = setup
    rng = random.Random(seed)
    out = tmp_path / "report"
    seen = []
    for i in range(n):
        sig = (signal.SIGTERM, signal.SIGINT)[i % 2]
        # a third of the moments in the first 0.5 s: start-up, torch imported
        delay = rng.uniform(0, 0.5) if i % 3 == 0 else rng.uniform(0, lifetime * 1.1)
        _write_old(out)
        p = subprocess.Popen(
            _argv(trace, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        if sig == signal.SIGINT:
            # Before main's first line Python's own SIGINT handling applies
            # (NOTE [ Signals in memplan ]): the clock starts at memplan's.
            deadline = time.monotonic() + 60
            while not _handlers_installed(p.pid) and time.monotonic() < deadline:
                time.sleep(0.001)
        time.sleep(delay)
        p.send_signal(sig)
        stdout, stderr = p.communicate(timeout=120)
        what = f"run {i}: {sig.name} after {delay:.3f} s -> exit {p.returncode}\n{stderr}"
        assert "Traceback" not in stderr, what
        code, line = SAID[sig]
        if p.returncode == 0:
            assert stderr == "" and "wrote" in stdout, what
        elif p.returncode == -signal.SIGTERM:  # killed before main's handlers: silent
            assert sig == signal.SIGTERM and stderr == "", what
        else:
            assert (p.returncode, stderr) == (code, line + "\n"), what
        state = _state(out)
        assert p.returncode != 0 or state == "new", what
        assert [q.name for q in tmp_path.iterdir()] == ["report"], what  # no temporaries
        seen.append((sig.name, round(delay, 3), p.returncode, state))
    return seen


def test_signals_at_random_moments_leave_a_whole_report(setup, tmp_path):
    seen = _kill_runs(setup, tmp_path, n=6, seed=17)
    assert any(code in (130, 143) for _, _, code, _ in seen), seen


@pytest.mark.slow
def test_signals_at_many_random_moments_leave_a_whole_report(setup, tmp_path):
    seen = _kill_runs(setup, tmp_path, n=24, seed=1701)
    assert any(code in (130, 143) for _, _, code, _ in seen), seen


# ---- broken pipes ------------------------------------------------------------------
def test_a_reader_that_stops_early_ends_memplan_quietly():
    """1588 lines (89 KB, more than a pipe holds): the reader takes one and
    closes; memplan stops with 141 and nothing on stderr."""
    argv = [*MEMPLAN, "latency", "predict", "zoo:resnet50", "--hardware", "rtx-a6000",
            "--top", "1588"]  # fmt: skip
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout.readline().startswith(b"resnet50")
    p.stdout.close()
    stderr = p.stderr.read().decode()
    assert (p.wait(timeout=120), stderr) == (141, "")


def test_a_short_output_into_a_closed_pipe_is_quiet_too():
    """`memplan inspect zoo:resnet50 | head -1`: the output fits in the pipe,
    so it may end 0 or 141, and either way silently."""
    p = subprocess.run(
        f"{' '.join(MEMPLAN)} inspect zoo:resnet50 | head -1; exit ${{PIPESTATUS[0]}}",
        shell=True,
        executable="/bin/bash",
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode in (0, 141) and p.stderr == ""
    assert p.stdout.startswith("resnet50") and p.stdout.count("\n") == 1

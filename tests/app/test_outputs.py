"""Outputs (issue 17): every `--out` checked before any work, one line and
exit 2 when it cannot be written (NOTE [ Output paths ]); report directories
replaced whole or not at all (NOTE [ Report directories ]); exit codes kept
(NOTE [ Exit codes ]): a bug is 70 with its traceback, never 1."""

from __future__ import annotations

import argparse
import os
import signal
import stat
from pathlib import Path

import pytest

from memplan import interrupts, outputs
from memplan.cli import EXIT_INTERNAL_ERROR, build_parser, main
from memplan.commands import inspect as inspect_command
from tests.fuzz.harness import assert_rejected, run_cli

# Every command that writes, with arguments that would fail on their own if
# the command did any work before checking its output: a missing input file,
# an unknown model, an unknown op class. So an error naming the output is
# proof that the output was checked first.
FILE_OUTPUTS = {
    ("capture", "--out"): ["capture", "--model", "no_such_pkg:nothing", "--batch", "2"],
    ("plan", "--out"): ["plan", "{missing}", "--planner", "tensile", "--gpu", "rtx-a6000"],
    ("export", "--out"): ["export", "{missing}", "--trace", "{missing}"],
    ("latency train", "--out"): ["latency", "train", "{missing}"],
    ("microbench", "--out"): ["microbench", "--classes", "no_such_class"],
    ("microbench", "--profile-out"): [
        "microbench", "--classes", "no_such_class", "--out", "{ok}/data.json.gz"],
}  # fmt: skip
DIR_OUTPUTS = {
    ("simulate", "--out"): ["simulate", "{missing}", "--gpu", "rtx-a6000"],
    ("compare", "--out"): ["compare", "{missing}", "--gpu", "rtx-a6000"],
    ("capacity", "--out"): ["capacity", "--trace", "{missing}", "--gpu", "rtx-a6000"],
    ("sweep", "--out"): ["sweep", "{missing}"],
}


def _writers(parser: argparse.ArgumentParser, prefix: str = "") -> set[tuple[str, str]]:
    """(command, option) for every option of the CLI that names an output."""
    found = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= _writers(sub, f"{prefix} {name}".strip())
        for opt in action.option_strings:
            if opt in ("--out", "--profile-out"):
                found.add((prefix, opt))
    return found


def test_the_tables_hold_every_command_that_writes():
    assert _writers(build_parser()) == set(FILE_OUTPUTS) | set(DIR_OUTPUTS)


def _argv(template: list[str], option: str, out: str, tmp_path: Path) -> list[str]:
    ok = tmp_path / "ok"
    ok.mkdir(exist_ok=True)
    fill = {"{missing}": str(tmp_path / "missing.json"), "{ok}": str(ok)}
    args = [fill.get(a, a.replace("{ok}", str(ok))) for a in template]
    return [*args, option, out]


def _unwritable(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`folder` read-only, as a user other than root sees it (root passes
    permission bits: os.access is made to answer as for anyone else)."""
    folder.chmod(0o555)
    if os.geteuid() == 0:
        real = os.access
        monkeypatch.setattr(
            os, "access", lambda p, mode: False if Path(p) == folder else real(p, mode)
        )


def _entries(tmp_path: Path) -> set[str]:
    return {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")}


FILE_CASES = ["directory", "no folder", "file as folder", "unwritable", "device", "empty"]


@pytest.mark.parametrize(
    "command,case",
    [
        (command, case)
        for command in FILE_OUTPUTS
        for case in FILE_CASES
        # `--profile-out ""` is the option's default: no profile
        if (command[1], case) != ("--profile-out", "empty")
    ],
    ids=lambda x: x if isinstance(x, str) else " ".join(x),
)
def test_a_file_output_that_cannot_be_written_is_refused_before_any_work(
    tmp_path, monkeypatch, command, case
):
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "ro").mkdir()
    out, said = {
        "directory": (str(tmp_path), "is a directory"),
        "no folder": (str(tmp_path / "no" / "x.out"), "does not exist"),
        "file as folder": (str(tmp_path / "a_file" / "x.out"), "is not a folder"),
        "unwritable": (str(tmp_path / "ro" / "x.out"), "is not writable"),
        "device": (os.devnull, "not a regular file"),
        "empty": ("", "empty path"),
    }[case]
    if case == "unwritable":
        _unwritable(tmp_path / "ro", monkeypatch)
    argv = _argv(FILE_OUTPUTS[command], command[1], out, tmp_path)
    before = _entries(tmp_path)
    o = run_cli(argv, timeout_s=60)
    assert_rejected(o, command[1], out, said)
    assert _entries(tmp_path) == before
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)  # never replaced by a file


@pytest.mark.parametrize("case", ["file", "no parent", "not a report", "unwritable", "empty"])
@pytest.mark.parametrize("command", list(DIR_OUTPUTS), ids=" ".join)
def test_a_report_directory_that_cannot_be_written_is_refused_before_any_work(
    tmp_path, monkeypatch, command, case
):
    (tmp_path / "a_file").write_text("x")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    (mine / "memory.png").write_text("a report name, but the notes are not")
    (tmp_path / "ro").mkdir()
    out, said = {
        "file": (str(tmp_path / "a_file"), "not a directory"),
        "no parent": (str(tmp_path / "no" / "report"), "does not exist"),
        "not a report": (str(mine), "notes.txt"),
        "unwritable": (str(tmp_path / "ro" / "report"), "is not writable"),
        "empty": ("", "empty path"),
    }[case]
    if case == "unwritable":
        _unwritable(tmp_path / "ro", monkeypatch)
    argv = _argv(DIR_OUTPUTS[command], "--out", out, tmp_path)
    before = _entries(tmp_path)
    o = run_cli(argv, timeout_s=60)
    assert_rejected(o, "--out", out, said)
    assert _entries(tmp_path) == before
    assert (mine / "notes.txt").read_text() == "keep me"


def test_a_failed_write_is_one_line_and_exit_2(tmp_path, monkeypatch):
    """An OSError while writing (here a full disk, simulated) names the output."""
    import errno

    from memplan.planners.core import io as plan_io

    def full(*a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(plan_io, "save", full)
    out = tmp_path / "plan.json"
    o = run_cli(["plan", "zoo:resnet50", "--planner", "vdnn", "--gpu", "rtx-a6000",
                 "--out", str(out)], timeout_s=120)  # fmt: skip
    assert_rejected(o, "--out", str(out), "No space left on device")
    assert list(tmp_path.iterdir()) == []


# ---- report directories -------------------------------------------------------------
def _old_report(d: Path) -> dict[str, str]:
    (d / "plans").mkdir(parents=True)
    files = {"memory.png": "old png", "report.md": "old md", "plans/tensile.json": "{}"}
    for name, text in files.items():
        (d / name).write_text(text)
    return files


def _contents(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): p.read_text() for p in sorted(d.rglob("*")) if p.is_file()}


def test_a_report_replaces_an_old_one_whole(tmp_path):
    """The issue's case: new files must not land beside the old memory.png."""
    out = tmp_path / "report"
    _old_report(out)
    with outputs.report_dir(out) as d:
        assert d.parent == tmp_path and d != out and list(d.iterdir()) == []
        (d / "report.md").write_text("new md")
    assert _contents(out) == {"report.md": "new md"}
    assert [p.name for p in tmp_path.iterdir()] == ["report"]
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(out.stat().st_mode) == 0o777 & ~umask


@pytest.mark.parametrize("error", [RuntimeError("a bug"), interrupts.Interrupted(signal.SIGTERM)])
def test_a_report_that_fails_midway_leaves_the_old_one_and_no_temporary(tmp_path, error):
    out = tmp_path / "report"
    old = _old_report(out)
    with pytest.raises(type(error)), outputs.report_dir(out) as d:
        (d / "report.md").write_text("half")
        raise error
    assert _contents(out) == old
    assert [p.name for p in tmp_path.iterdir()] == ["report"]


def test_a_signal_during_the_swap_waits_for_it(tmp_path, monkeypatch):
    """SIGTERM between renaming the old report aside and the new one in is
    held (NOTE [ Signals in memplan ]) and raised once the new one is whole."""
    out = tmp_path / "report"
    _old_report(out)
    renames = []
    real = os.rename

    def rename(a, b):
        real(a, b)
        renames.append(Path(b).name)
        if len(renames) == 1:
            signal.raise_signal(signal.SIGTERM)

    old = interrupts.install()
    try:
        monkeypatch.setattr(os, "rename", rename)
        with pytest.raises(interrupts.Interrupted) as e, outputs.report_dir(out) as d:
            (d / "report.md").write_text("new md")
    finally:
        interrupts.restore(old)
    assert e.value.exit_code == 143
    assert renames[1] == "report"  # the new report went in before the signal was raised
    assert _contents(out) == {"report.md": "new md"}
    assert [p.name for p in tmp_path.iterdir()] == ["report"]


def test_an_empty_directory_takes_a_report(tmp_path):
    out = tmp_path / "report"
    out.mkdir()
    with outputs.report_dir(out) as d:
        (d / "result.json").write_text("{}")
    assert _contents(out) == {"result.json": "{}"}


# ---- exit codes --------------------------------------------------------------------
@pytest.mark.parametrize(
    "signum,code,line",
    [(signal.SIGINT, 130, "memplan: interrupted"),
     (signal.SIGTERM, 143, "memplan: terminated (SIGTERM)")],
)  # fmt: skip
def test_a_signal_is_one_line_and_its_exit_code(monkeypatch, capsys, signum, code, line):
    def run(args):
        signal.raise_signal(signum)
        raise AssertionError("not interrupted")

    monkeypatch.setattr(inspect_command, "run", run)
    before = {s: signal.getsignal(s) for s in interrupts.SIGNALS}
    assert main(["inspect", "zoo:resnet50"]) == code
    assert capsys.readouterr().err == line + "\n"
    assert {s: signal.getsignal(s) for s in interrupts.SIGNALS} == before  # put back


def test_a_bug_keeps_its_traceback_and_exits_70_not_1(monkeypatch, capsys):
    def run(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(inspect_command, "run", run)
    assert main(["inspect", "zoo:resnet50"]) == EXIT_INTERNAL_ERROR == 70
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ZeroDivisionError: a bug" in err
    assert err.splitlines()[-1].startswith("memplan: internal error")

"""Run the `memplan` CLI in-process on one argument list, with a time limit,
and judge the outcome as issue 17 asks: no traceback, no hang, bad input
rejected in one line with exit code 2.

`run_cli` calls `memplan.cli.main` as the console script does (SystemExit
from argparse becomes its code) with stdout and stderr captured and a
SIGALRM timer that raises `Hang` -- a BaseException, so no `except
Exception` in the code under test can swallow it. Anything that escapes
`main` other than SystemExit is kept as a traceback: the finding the fuzz
tests exist to catch.
"""

from __future__ import annotations

import contextlib
import io
import re
import signal
import traceback
from collections.abc import Sequence
from dataclasses import dataclass

from memplan.cli import main


class Hang(BaseException):
    """The CLI ran past its time limit."""


@dataclass(frozen=True)
class Outcome:
    argv: tuple[str, ...]
    code: int | None  # None: it raised or hung
    stdout: str
    stderr: str
    traceback: str | None = None
    hung: bool = False

    def describe(self) -> str:
        tail = self.traceback or self.stderr
        return (
            f"memplan {' '.join(self.argv)} -> code {self.code}, hung={self.hung}\n{tail[-2000:]}"
        )


def _alarm(signum: int, frame: object) -> None:
    raise Hang


def run_cli(argv: Sequence[str], timeout_s: float = 10.0) -> Outcome:
    """`memplan *argv` in this process, at most `timeout_s` seconds of wall clock."""
    out, err = io.StringIO(), io.StringIO()
    code: int | None = None
    tb: str | None = None
    hung = False
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, timeout_s)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = int(main(list(argv)) or 0)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    except Hang:
        hung = True
    except BaseException:  # noqa: BLE001 -- the traceback is the finding
        tb = traceback.format_exc()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return Outcome(tuple(argv), code, out.getvalue(), err.getvalue(), tb, hung)


def assert_clean(o: Outcome) -> None:
    """No traceback, no hang, a documented exit code (0, 1, 2)."""
    assert not o.hung, f"hang: {o.describe()}"
    assert o.traceback is None, f"traceback: {o.describe()}"
    assert "Traceback (most recent call last)" not in o.stderr, f"traceback: {o.describe()}"
    assert o.code in (0, 1, 2), f"exit code: {o.describe()}"


def assert_rejected(o: Outcome, *names: str) -> None:
    """Exit 2 with exactly one line on stderr that names each of `names`
    (a field, an argument), compared case-insensitively."""
    assert_clean(o)
    assert o.code == 2, f"accepted (exit {o.code}): {o.describe()}"
    lines = [line for line in o.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, f"not one line: {o.describe()}"
    for name in names:
        assert name.lower() in lines[0].lower(), f"{name!r} not named: {o.describe()}"


# A time printed as inf or nan, or a negative size: a result that is not whole.
GARBAGE = re.compile(r"\b(inf|nan)\b|(?<![\w.-])-\d[\d.]*\s*[KMGTPE]?i?B\b", re.IGNORECASE)


def assert_whole(o: Outcome, what: str) -> None:
    """A valid input `what` accepted (exit 0) with output that prints as
    UTF-8 (no lone surrogate printed as is) and holds no garbage figure."""
    assert_clean(o)
    assert o.code == 0, f"valid input ({what}) not accepted: {o.describe()}"
    o.stdout.encode("utf-8")  # raises on a lone surrogate printed as is
    o.stderr.encode("utf-8")
    bad = GARBAGE.search(o.stdout)
    assert bad is None, f"garbage {bad.group(0)!r} in the output of {what}: {o.describe()}"

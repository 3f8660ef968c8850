"""SIGINT and SIGTERM as one exception, `Interrupted`, raised in the main
thread so that every `finally` and `except BaseException` on the way out runs
(temporary files and report directories are removed), and short sections
that must not be cut in two (`deferred()`): a rename pair, a cleanup.
"""

from __future__ import annotations

import signal
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

# NOTE [ Signals in memplan ]
# `memplan.cli.main` installs the handler first thing and removes it on the way out. It
# raises `Interrupted` (a `KeyboardInterrupt`, so Ctrl-C cleanup serves SIGTERM too) once; a
# second signal while the first unwinds is ignored (SIGKILL is the hard stop). Inside
# `deferred()` a signal is held until the section ends -- done in Python, not with
# `pthread_sigmask`, since torch's threads may receive the signal. Exit codes: 130 for
# SIGINT, 143 for SIGTERM. Before `main` runs, Python's defaults apply (no output yet).
# Where a signal's exception would be lost or rewritten, `main` still exits as interrupted:
# - `install` sets `sys.unraisablehook` (an `Interrupted` in a `__del__` or weakref
#   callback is dropped, not printed) and `main` asks `fired()` when the command ends;
# - `memplan.cli` imports torch inside `deferred()` (an exception inside torch's import
#   through pybind11 aborts the process);
# - an exception with an `Interrupted` among its causes (`raised_from`), or escaping after
#   one fired, exits as interrupted; once one fired, warnings are not shown.
# Full text, with the failures seen: docs/notes.md, "Signals in memplan".
SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM arrived; `exit_code` is 128 + the signal number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def describe(self) -> str:
        return "interrupted" if self.signum == signal.SIGINT else "terminated (SIGTERM)"


class _State:  # a plain class: this module loads before anything else (no dataclasses)
    def __init__(self) -> None:
        self.fired = 0  # the signal an Interrupted was raised for: ignore further ones
        self.depth = 0  # nesting of deferred()
        self.pending: int | None = None  # a signal held by deferred()
        self.old_hook = sys.unraisablehook  # what `install` replaced
        self.old_showwarning = warnings.showwarning


_state = _State()


def _handler(signum: int, frame: object) -> None:
    if _state.fired:
        return
    if _state.depth:
        _state.pending = signum
        return
    _state.fired = signum
    raise Interrupted(signum)


def _unraisable(info: object) -> None:
    """NOTE [ Signals in memplan ]: an `Interrupted` a callback dropped is
    not printed (`fired()` still has it); anything else goes to the hook
    `install` replaced."""
    if isinstance(getattr(info, "exc_value", None), Interrupted):
        return
    _state.old_hook(info)


def _showwarning(*args: object, **kwargs: object) -> None:
    """NOTE [ Signals in memplan ]: once a signal fired, a library's warning
    about what it cut short is not printed."""
    if not _state.fired:
        _state.old_showwarning(*args, **kwargs)  # type: ignore[arg-type]


def install() -> dict[int, object] | None:
    """Route SIGINT and SIGTERM to `Interrupted`; returns the old handlers
    for `restore`, or None off the main thread (where Python allows no
    handlers; the caller's own apply)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    old = {s: signal.getsignal(s) for s in SIGNALS}
    _state.fired, _state.depth, _state.pending = 0, 0, None
    for s in SIGNALS:
        signal.signal(s, _handler)
    if sys.unraisablehook is not _unraisable:
        _state.old_hook = sys.unraisablehook
        sys.unraisablehook = _unraisable
    if warnings.showwarning is not _showwarning:
        _state.old_showwarning = warnings.showwarning
        warnings.showwarning = _showwarning
    return old


def restore(old: dict[int, object] | None) -> None:
    """Put back the handlers `install` replaced."""
    if old is None:
        return
    for s, h in old.items():
        signal.signal(s, h)  # type: ignore[arg-type]
    if sys.unraisablehook is _unraisable:
        sys.unraisablehook = _state.old_hook
    if warnings.showwarning is _showwarning:
        warnings.showwarning = _state.old_showwarning


def ignore() -> None:
    """SIGINT and SIGTERM ignored from now on: the process has finished its
    work and is exiting (NOTE [ Signals in memplan ])."""
    if threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            signal.signal(s, signal.SIG_IGN)


def raised_from(e: BaseException) -> Interrupted | None:
    """The `Interrupted` that `e` was raised from, following `__cause__`
    (NOTE [ Signals in memplan ]), or None."""
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, Interrupted):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__
    return None


def fired() -> Interrupted | None:
    """The interruption already raised, should some code have swallowed it."""
    return Interrupted(_state.fired) if _state.fired else None


@contextmanager
def deferred() -> Iterator[None]:
    """A section no signal cuts in two: one that arrives inside is raised as
    `Interrupted` when the section ends (with our handler installed)."""
    _state.depth += 1
    try:
        yield
    finally:
        _state.depth -= 1
        if not _state.depth and _state.pending is not None and not _state.fired:
            signum, _state.pending = _state.pending, None
            _state.fired = signum
            raise Interrupted(signum)

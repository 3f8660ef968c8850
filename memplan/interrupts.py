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
# `memplan.cli.main` installs the handler first thing, before the parser and
# torch are imported, and removes it on the way out. The handler raises
# `Interrupted` (a `KeyboardInterrupt`, so code that cleans up after Ctrl-C
# cleans up after SIGTERM too) once: a signal that arrives while the first
# unwinds is ignored, so cleanup is never cut short by a second Ctrl-C (SIGKILL
# is the hard stop). Inside `deferred()` a signal is held and raised when the
# section ends. Deferral is done here, in Python, and not with
# `pthread_sigmask`: torch's worker threads do not block the signal, the kernel
# may deliver it to one of them, and CPython would still run the handler in
# the main thread at once. Exit codes: 130 for SIGINT, 143 for SIGTERM (128 +
# the signal's number, what a shell reports for a process the signal killed).
# Before `main` runs -- the interpreter's own start-up and the import of
# `memplan.cli`: 35-45 ms from spawn, measured on a 2-core VM at load 4.6 --
# Python's defaults apply: SIGTERM ends the
# process silently and SIGINT prints Python's KeyboardInterrupt traceback; no
# output has been started then, so nothing is left behind.
# A signal can land while Python runs a callback whose exceptions it only
# reports -- a weakref callback of the import machinery, a `__del__` -- and
# there `Interrupted` is dropped and printed as "Exception ignored ...
# Traceback" (seen in the signal test: a SIGTERM 0.6 s into `compare` landed
# in an import lock's callback). `install` sets `sys.unraisablehook` so that
# such an `Interrupted` is not printed; `main` asks `fired()` when the
# command ends and exits as interrupted (any output is whole: the command
# ran to its end). Sending the signal again from the hook does not help: its
# handler runs at once, inside the hook, and is dropped again.
# A signal that lands while torch is imported is worse: the import calls
# Python from C++ (pybind11), and an exception there ends the process with
# SIGABRT (exit -6, "terminate called after throwing ... Interrupted"; seen
# in the signal test 0.39 s into `compare`). `memplan.cli` therefore imports
# torch and builds its parser inside `deferred()`.
# Python itself wraps an exception in one place a signal can land: Python
# 3.11 turns one raised in a descriptor's `__set_name__`, as a class is made,
# into RuntimeError("Error calling __set_name__ ...") from it (seen in the
# signal test with the suite on two workers: a SIGINT during matplotlib's
# import, which `compare` makes late, for its figure); numpy's C import
# drops it for an ImportError with no cause (seen in CI: a SIGTERM 0.08 s in).
# `main` exits as interrupted, not as an internal error, when an exception
# has an `Interrupted` among its causes (`raised_from`) or escapes after one
# was raised (`fired()`). A library may also catch what the signal broke and
# carry on with a warning (matplotlib's "Unable to import Axes3D", seen in
# CI): once a signal fired, `install`'s `warnings.showwarning` prints none.
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

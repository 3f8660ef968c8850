"""NOTE [ Signals in memplan ]: a signal that lands in a callback whose
exceptions Python only reports (here a `__del__`) is not printed as an
ignored traceback, and `fired()` still has it for `main`; one that Python
re-raises wrapped in another exception, or that a library replaces with its
own, still exits as interrupted; a warning printed after the signal is dropped."""

from __future__ import annotations

import contextlib
import gc
import signal
import sys
import types

from memplan import interrupts


class _SignalsOnDeath:
    def __del__(self) -> None:
        signal.raise_signal(signal.SIGTERM)  # the handler runs inside __del__


def test_an_interrupt_a_callback_drops_is_quiet_and_kept(capsys):
    old = interrupts.install()
    try:
        _SignalsOnDeath()  # dies at once, by reference count: Interrupted is dropped
        swallowed = interrupts.fired()
    finally:
        interrupts.restore(old)
    assert swallowed is not None and swallowed.exit_code == 143
    assert "Exception ignored" not in capsys.readouterr().err


def test_other_unraisable_exceptions_still_reach_the_old_hook():
    seen = []
    before, sys.unraisablehook = sys.unraisablehook, seen.append
    try:
        old = interrupts.install()
        sys.unraisablehook(types.SimpleNamespace(exc_value=ValueError("x")))
        interrupts.restore(old)
    finally:
        sys.unraisablehook = before
    assert [str(u.exc_value) for u in seen] == ["x"]


def test_restore_puts_the_unraisable_hook_back():
    before = sys.unraisablehook
    old = interrupts.install()
    assert sys.unraisablehook is not before
    interrupts.restore(old)
    assert sys.unraisablehook is before
    gc.collect()


def test_a_signal_while_the_parser_imports_is_raised_after_them(monkeypatch, capsys):
    # torch's import calls Python from C++, where an exception aborts the
    # process: a signal landing there must wait until the imports end
    from memplan import cli

    built = []
    real = cli.build_parser

    def build():
        signal.raise_signal(signal.SIGTERM)  # as if it landed inside an import
        built.append(True)  # not reached if the handler raised at once
        return real()

    monkeypatch.setattr(cli, "build_parser", build)
    assert cli.main(["hw", "list"]) == 143
    assert built == [True]
    assert capsys.readouterr().err == "memplan: terminated (SIGTERM)\n"


class _SignalsWhenNamed:
    def __set_name__(self, owner: type, name: str) -> None:
        signal.raise_signal(signal.SIGINT)  # the handler raises inside __set_name__


def test_an_interrupt_python_wraps_exits_as_interrupted(monkeypatch, capsys):
    # Python 3.11 re-raises what `__set_name__` raised as RuntimeError("Error
    # calling __set_name__ ...") from it: a SIGINT during an import that makes
    # such a class (matplotlib's) must still exit 130, not as a bug
    from memplan import cli

    def run(argv):
        type("Made", (), {"x": _SignalsWhenNamed()})
        return 0

    monkeypatch.setattr(cli, "_run", run)
    assert cli.main(["hw", "list"]) == 130
    assert capsys.readouterr().err == "memplan: interrupted\n"


def test_an_error_raised_from_another_is_still_a_bug(monkeypatch, capsys):
    from memplan import cli

    def run(argv):
        raise RuntimeError("wrapped") from ValueError("inner")

    monkeypatch.setattr(cli, "_run", run)
    assert cli.main(["hw", "list"]) == cli.EXIT_INTERNAL_ERROR
    assert "internal error" in capsys.readouterr().err


def test_an_interrupt_a_library_replaces_exits_as_interrupted(monkeypatch, capsys):
    # numpy's C import catches what a signal raised while it loads `datetime`
    # and raises ImportError with no cause (seen in CI): the signal was taken,
    # so what escapes afterwards is the interruption, not a bug
    from memplan import cli

    def run(argv):
        with contextlib.suppress(KeyboardInterrupt):
            signal.raise_signal(signal.SIGTERM)
        raise ImportError('PyCapsule_Import could not import module "datetime"')

    monkeypatch.setattr(cli, "_run", run)
    assert cli.main(["hw", "list"]) == 143
    assert capsys.readouterr().err == "memplan: terminated (SIGTERM)\n"


def test_a_warning_after_a_signal_is_not_printed():
    # matplotlib catches what a SIGINT broke in its Axes3D import and warns
    # "Unable to import Axes3D" (seen in CI): the run is interrupted, and the
    # warning is its consequence, not news
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        old = interrupts.install()
        try:
            warnings.warn("before the signal", UserWarning, stacklevel=1)
            with contextlib.suppress(KeyboardInterrupt):
                signal.raise_signal(signal.SIGINT)
            warnings.warn("after the signal", UserWarning, stacklevel=1)
        finally:
            interrupts.restore(old)
        assert warnings.showwarning is not interrupts._showwarning
    assert [str(w.message) for w in seen] == ["before the signal"]

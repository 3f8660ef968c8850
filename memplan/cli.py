"""The `memplan` command line: one subcommand per module in `memplan.commands`.

Bad input anywhere below raises a `MemplanError`; here it becomes one line on
stderr and exit code 2. Anything else is a bug and keeps its traceback (exit
70, never 1: 1 is a check the user asked for that failed; NOTE [ Exit codes ]).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import select
import sys
import traceback
from collections.abc import Sequence

from memplan import interrupts

# NOTE [ Exit codes ]
# 0 done; 1 a check the user asked for failed (`validate`: the results
# differ); 2 bad input (a `MemplanError`, argparse's usage errors, an output
# that cannot be written); 130 interrupted by SIGINT (Ctrl-C) and 143 by
# SIGTERM (NOTE [ Signals in memplan ] in memplan/interrupts.py); 141 the
# reader of stdout went away (`memplan inspect ... | head -1`: stdout is
# pointed at /dev/null and memplan stops quietly, as a program killed by
# SIGPIPE would, so `set -o pipefail` sees it like any other tool's); 70 an
# internal error (a bug: the traceback is printed). The README's "Errors and
# exit codes" lists them for users.
EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERNAL_ERROR = 70
EXIT_BROKEN_PIPE = 141

# Each module defines `register(subparsers)`, which adds its parser and sets
# `func(args) -> int` as the parser default.
COMMAND_MODULES: tuple[str, ...] = (
    "capture",
    "inspect",
    "simulate",
    "hw",
    "microbench",
    "latency",
    "plan",
    "compare",
    "capacity",
    "bounds",
    "validate",
    "export",
    "sweep",
    "regress",
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, as for every other bad input
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="memplan",
        description=(
            "Plan and simulate GPU memory schedules (swap, recompute, release) "
            "for deep-learning training steps."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(f"memplan.commands.{name}").register(sub)
    return parser


def _say(message: str) -> None:
    """One line on stderr, whatever characters it holds (line breaks and lone
    surrogates from a file's names print escaped instead of failing)."""
    enc = getattr(sys.stderr, "encoding", None) or "utf-8"
    line = message.replace("\r", "\\r").replace("\n", "\\n")
    line = line.encode(enc, "backslashreplace").decode(enc, "replace")
    with contextlib.suppress(OSError):  # stderr itself gone (a closed pipe): nothing to say
        print(line, file=sys.stderr, flush=True)


def _run(argv: Sequence[str] | None) -> int:
    # NOTE [ Signals in memplan ]: torch's import runs Python from C++ (pybind11);
    # an Interrupted raised there aborts the process (SIGABRT, exit -6), and
    # numpy's turns it into an ImportError; so the first imports, numpy's and
    # torch's among them, hold a signal until they end
    with interrupts.deferred():
        import torch  # noqa: F401 -- loaded here, whichever command loads it first

        from memplan.traces.errors import MemplanError

        parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args) or 0)
    except MemplanError as e:
        _say(f"memplan {args.command}: error: {e}")
        return EXIT_BAD_INPUT
    sys.stdout.flush()  # a closed pipe shows here, inside main's handling
    return code


def _stdout_gone() -> bool:
    """Is stdout a pipe (or socket) whose reader has closed it?"""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return False
    if not hasattr(select, "poll"):  # no poll(): assume the pipe was stdout's
        return True
    poll = select.poll()
    poll.register(fd, select.POLLOUT)
    return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's last flush cannot fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def _interrupted(e: KeyboardInterrupt) -> int:
    what = e.describe() if isinstance(e, interrupts.Interrupted) else "interrupted"
    _say(f"memplan: {what}")
    return e.exit_code if isinstance(e, interrupts.Interrupted) else 130


def _internal_error() -> int:
    traceback.print_exc()
    _say("memplan: internal error (the traceback above is a bug in memplan; please report it)")
    return EXIT_INTERNAL_ERROR


def main(argv: Sequence[str] | None = None) -> int:
    """Run `memplan *argv` and return its exit code (NOTE [ Exit codes ]);
    argparse's usage errors and --help leave as SystemExit. With `argv`
    None, main is the program (the console script, `python -m memplan`):
    on its way out SIGINT and SIGTERM are ignored, the process has only to
    exit; with `argv` given, the caller's signal handlers are put back."""
    old = None
    try:
        old = interrupts.install()  # before anything heavy is imported
        code = _run(argv)
        swallowed = interrupts.fired() if old is not None else None
        if swallowed is not None:  # some library caught our KeyboardInterrupt
            raise swallowed
        return code
    except KeyboardInterrupt as e:
        return _interrupted(e)
    except BrokenPipeError:
        if not _stdout_gone():
            return _internal_error()
        _silence_stdout()
        return EXIT_BROKEN_PIPE
    except Exception as e:  # noqa: BLE001 -- a bug: loud, and never exit 1
        # Python or a library wrapped it (NOTE [ Signals in memplan ])
        cause = interrupts.raised_from(e) or (interrupts.fired() if old is not None else None)
        return _interrupted(cause) if cause is not None else _internal_error()
    finally:
        outputs = sys.modules.get("memplan.outputs")
        if outputs is not None:
            outputs.remove_temporaries()
        if argv is None:
            interrupts.ignore()
        else:
            interrupts.restore(old)


if __name__ == "__main__":
    sys.exit(main())

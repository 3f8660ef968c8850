"""The `memplan` command line: one subcommand per module in `memplan.commands`.

Bad input anywhere below raises a `MemplanError`; here it becomes one line on
stderr and exit code 2. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from memplan.traces.errors import MemplanError

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
    "bounds",
    "validate",
    "export",
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MemplanError as e:
        print(f"memplan {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("memplan: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())

"""Where commands write: output paths checked before any work, OSError while
writing as one line (`OutputError`, exit 2), and report directories that
appear whole or not at all.
"""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from memplan.interrupts import deferred
from memplan.traces.errors import MemplanError

# NOTE [ Output paths ]
# `check_file` and `check_dir` run first in every command that writes, before
# any trace is loaded, so a bad `--out` costs nothing. A file output must not
# be a directory or an existing non-regular file (`--out /dev/null` would
# otherwise have its device node replaced by the rename), and its folder must
# exist and be writable: memplan creates no folders for a file (a typo in a
# folder name is an error, not a new tree). A report directory's parent must
# exist and be writable; the directory itself may be new, empty, or an old
# report -- one holding only names memplan writes into reports
# (`REPORT_NAMES`; `plans/` holding only `.json` files, `snapshots/` only
# `.pickle` files). Anything else is
# refused rather than replaced: `--out .` or `--out ~` must never delete a
# user's files. Writability is `os.access`, which root passes everywhere but
# on a read-only file system; a write that fails anyway is still one line.

# What `memplan compare`, `simulate` and `capacity` write into a report directory.
REPORT_NAMES = frozenset(
    {"plans", "report.md", "report.json", "memory.png", "result.json", "timeline.json", "gantt.png",
     "snapshot.pickle", "snapshots", "capacity.png"}
)  # fmt: skip
REPORT_FOLDERS = {"plans": ".json", "snapshots": ".pickle"}  # and what they hold

# Temporary directories made by report_dir and not yet renamed into place or
# removed (NOTE [ Report directories ]).
_temporaries: set[Path] = set()


class OutputError(MemplanError):
    """An output path that cannot be written, or a write that failed."""


def _check_folder(folder: Path, path: str | os.PathLike[str], what: str) -> None:
    if not folder.exists():
        raise OutputError(f"{what} {path}: folder {folder} does not exist")
    if not folder.is_dir():
        raise OutputError(f"{what} {path}: {folder} is not a folder")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{what} {path}: folder {folder} is not writable")


def check_file(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """`path` as a file memplan can write (NOTE [ Output paths ]), else OutputError."""
    if not str(path):
        raise OutputError(f"{what}: empty path")
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{what} {path}: is a directory; give a file name")
    if p.exists() and not p.is_file():
        raise OutputError(f"{what} {path}: exists and is not a regular file")
    _check_folder(p.parent, path, what)
    return p


def _foreign(d: Path) -> list[str]:
    """Entries of `d` that are not part of a memplan report."""
    out = []
    for e in sorted(d.iterdir()):
        if e.name not in REPORT_NAMES:
            out.append(e.name)
        elif e.name in REPORT_FOLDERS and (
            not e.is_dir() or any(not f.name.endswith(REPORT_FOLDERS[e.name]) for f in e.iterdir())
        ):
            out.append(f"{e.name}/")
    return out


def check_dir(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """`path` as a report directory memplan can write or replace whole
    (NOTE [ Output paths ]), else OutputError; returns it resolved."""
    if not str(path):
        raise OutputError(f"{what}: empty path")
    p = Path(os.path.realpath(path))
    if p.exists() and not p.is_dir():
        raise OutputError(f"{what} {path}: exists and is not a directory (a report is a folder)")
    _check_folder(p.parent, path, what)
    if p.is_dir():
        try:
            foreign = _foreign(p)
        except OSError as e:
            raise OutputError(f"{what} {path}: cannot read the old directory: {e.strerror}") from e
        if foreign:
            names = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            raise OutputError(
                f"{what} {path}: the directory holds files that are not a memplan report "
                f"({names}); give a new directory (an old report is replaced whole)"
            )
    return p


@contextmanager
def writing(path: str | os.PathLike[str], what: str = "--out") -> Iterator[None]:
    """Write one output file inside: OSError becomes OutputError, and a
    signal waits for the write to finish (or be undone), so the writer's
    temporary file never outlives it (NOTE [ Signals in memplan ])."""
    try:
        with deferred():
            yield
    except OSError as e:
        raise OutputError(f"{what} {path}: cannot write: {e.strerror or e}") from e


# NOTE [ Report directories ]
# A report directory is written into a temporary sibling, `.NAME.XXXX.tmp`,
# and renamed into place: with no old report, one rename; over an old one,
# the old is renamed aside (`.NAME.XXXX.old`), the new renamed in, the old
# removed. Both rename pairs and the removal run inside `deferred()`, so
# SIGINT and SIGTERM land before (the old report stays, the temporary is
# removed) or after (the new report is whole). The window: between the two
# renames -- microseconds -- the path does not exist; a reader then sees no
# report, never a mix. Only SIGKILL or a crash inside it leaves the old
# report at its `.old` name; SIGKILL at any other time can leave a `.tmp`
# sibling. (Linux's renameat2(RENAME_EXCHANGE) would close the window but is
# not portable and not in Python's standard library.) The temporaries are
# also registered so that `memplan.cli.main` removes any that a signal
# during cleanup left (`remove_temporaries`).
@contextmanager
def report_dir(path: str | os.PathLike[str], what: str = "--out") -> Iterator[Path]:
    """Yield an empty temporary directory to write a report into; on a clean
    exit it replaces `path` whole (NOTE [ Report directories ]), on any
    exception it is removed. OSError becomes OutputError."""
    target = check_dir(path, what)
    tmp: Path | None = None
    try:
        with deferred():
            tmp = Path(
                tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
            )
            _temporaries.add(tmp)
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp makes 0700; a report is an ordinary folder
        yield tmp
        with deferred():
            _swap(tmp, target)
            _temporaries.discard(tmp)
    except OSError as e:
        raise OutputError(f"{what} {path}: cannot write: {e.strerror or e}") from e
    finally:
        if tmp in _temporaries:
            with deferred():
                shutil.rmtree(tmp, ignore_errors=True)
                _temporaries.discard(tmp)


def _swap(new: Path, target: Path) -> None:
    if not target.exists():
        os.rename(new, target)
        return
    old = target.with_name(f".{target.name}.{secrets.token_hex(4)}.old")
    os.rename(target, old)
    try:
        os.rename(new, target)
    except OSError:
        os.rename(old, target)
        raise
    shutil.rmtree(old, ignore_errors=True)


def remove_temporaries() -> None:
    """Remove every temporary report directory not renamed into place (run
    by `memplan.cli.main` on its way out, when signals no longer raise)."""
    while _temporaries:
        shutil.rmtree(_temporaries.pop(), ignore_errors=True)

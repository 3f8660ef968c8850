"""A sweep's output directory: results.jsonl streamed and resumed, the final
file in grid order, timings.jsonl, and results.parquet on request.

NOTE [ Sweep results ] says what is kept and what is byte-identical.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from memplan.interrupts import deferred
from memplan.outputs import OutputError, check_dir, writing
from memplan.traces.errors import MemplanError
from memplan.traces.io import atomic_write_bytes

RESULTS = "results.jsonl"
TIMINGS = "timings.jsonl"
PARQUET = "results.parquet"
SUMMARY = "summary.md"
FIGURE = "pareto.png"
TRACES = "traces"  # models captured before the sweep
SWEEP_NAMES = frozenset({RESULTS, TIMINGS, PARQUET, SUMMARY, FIGURE, TRACES})
PARQUET_MISSING = "--parquet needs pyarrow: pip install 'memplan[parquet]'"


def check_out(path: str) -> Path:
    """`--out` as a sweep directory: new, empty, or holding a sweep's files
    (a run to resume); anything else is refused (NOTE [ Output paths ])."""
    if not path:
        raise OutputError("--out: empty path")
    p = Path(os.path.realpath(path))
    if not p.is_dir():
        return check_dir(path)  # new, or not a folder: the usual checks and messages
    try:
        names = sorted(e.name for e in p.iterdir())
    except OSError as e:
        raise OutputError(f"--out {path}: cannot read the directory: {e.strerror}") from e
    foreign = [n for n in names if n not in SWEEP_NAMES and not _leftover(n)]
    if foreign:
        shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
        raise OutputError(
            f"--out {path}: the directory holds files that are not a sweep's ({shown}); "
            "give a new directory, or the --out of the sweep to resume"
        )
    if not os.access(p, os.W_OK | os.X_OK):
        raise OutputError(f"--out {path}: directory is not writable")
    return p


def _leftover(name: str) -> bool:
    """A temporary file of an atomic write that SIGKILL left (`.results.jsonl.x1y2.tmp`)."""
    return name.endswith(".tmp") and any(name.startswith(f".{n}.") for n in SWEEP_NAMES)


def record_line(record: dict[str, Any]) -> str:
    """A record as its line of results.jsonl (canonical: sorted keys)."""
    return json.dumps(record, sort_keys=True, allow_nan=False)


# NOTE [ Sweep results ]
# results.jsonl holds one JSON record per scenario (memplan/sweep/scenario.py,
# NOTE [ Sweep records ]). While the sweep runs, each record is appended and
# flushed as it finishes, inside `deferred()` so SIGINT/SIGTERM never cut a
# line in two (SIGKILL or a crash can: the torn last line is dropped on
# resume). On start, every line that parses and whose key is a scenario of
# this grid is kept and its scenario is not run again; lines of other
# scenarios (a grid edited since) are dropped; a file none of whose lines
# belongs to the grid is another sweep's, and is refused rather than
# dropped. The kept lines are rewritten first (atomically), so appends never
# follow a torn line. When every scenario is done, the file is rewritten
# atomically in the grid's order: the same grid gives the same bytes for any
# backend, worker count or history of interruptions. timings.jsonl gets one
# line per scenario computed in this directory (key, wall seconds, worker),
# appended in the order they finish and never rewritten: wall time is not
# deterministic, so it stays out of the records.
class Results:
    """results.jsonl of the sweep in `out` over the scenarios `keys` (in grid
    order); `done` maps the keys already in the file to their lines."""

    def __init__(self, out: Path, keys: Sequence[str]) -> None:
        self.out = out
        self.keys = list(keys)
        self.path = out / RESULTS
        self.done: dict[str, str] = {}
        self.dropped = 0  # lines not kept: torn, unreadable or of other scenarios
        self._file: Any = None
        self._timings: Any = None

    def resume(self) -> int:
        """Read what a previous run left, keep the lines of this grid, and
        open the files for appending; returns how many scenarios are done."""
        wanted = set(self.keys)
        lines = self._old_lines()
        readable = 0
        for line in lines:
            key = _key_of(line)
            readable += key is not None
            if key in wanted and key not in self.done:
                self.done[key] = line
        self.dropped = len(lines) - len(self.done)
        if readable and not self.done:
            raise MemplanError(
                f"--out {self.out}: {RESULTS} holds {readable} results, none of a scenario of "
                "this grid (another sweep's, or another memplan version's); give a new directory"
            )
        with writing(self.path):
            if self.dropped or (lines and not self.path.read_bytes().endswith(b"\n")):
                atomic_write_bytes(
                    self.path, "".join(f"{x}\n" for x in self.done.values()).encode()
                )
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 -- closed by close()
            self._timings = open(self.out / TIMINGS, "a", encoding="utf-8")  # noqa: SIM115
        return len(self.done)

    def _old_lines(self) -> list[str]:
        try:
            raw = self.path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return []
        except OSError as e:
            raise OutputError(f"--out {self.path}: cannot read: {e.strerror}") from e
        return [x for x in raw.split("\n") if x.strip()]

    def add(self, record: dict[str, Any], seconds: float, worker: str) -> None:
        """Append one finished scenario (whole, or not at all, on a signal)."""
        line = record_line(record)
        key = record["key"]
        timing = json.dumps({"key": key, "seconds": round(seconds, 6), "worker": worker})
        with writing(self.path), deferred():
            self._file.write(line + "\n")
            self._file.flush()
            self._timings.write(timing + "\n")
            self._timings.flush()
        self.done[key] = line

    def close(self) -> None:
        for f in (self._file, self._timings):
            if f is not None:
                f.close()
        self._file = self._timings = None

    def finish(self) -> list[dict[str, Any]]:
        """Rewrite results.jsonl in grid order (NOTE [ Sweep results ]) and
        return the records in that order."""
        self.close()
        missing = [k for k in self.keys if k not in self.done]
        if missing:
            raise MemplanError(f"sweep: {len(missing)} scenarios have no result (internal)")
        text = "".join(f"{self.done[k]}\n" for k in self.keys)
        with writing(self.path):
            atomic_write_bytes(self.path, text.encode())
        return [json.loads(self.done[k]) for k in self.keys]


def _key_of(line: str) -> str | None:
    """The key of a record line; None for a torn or foreign line."""
    try:
        doc = json.loads(line)
    except ValueError:
        return None
    if not isinstance(doc, dict) or not isinstance(doc.get("key"), str):
        return None
    return doc["key"]


def check_parquet() -> None:
    """pyarrow is importable, or a one-line error saying how to get it."""
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        raise MemplanError(PARQUET_MISSING) from None


def write_parquet(records: Sequence[dict[str, Any]], path: Path) -> None:
    """One row per record: key, identity, version, name, status, reason, each
    metric as a column, and the inputs as a JSON string."""
    import io as _io

    import pyarrow as pa
    import pyarrow.parquet as pq

    from memplan.sweep.scenario import METRICS

    columns: dict[str, list[Any]] = {
        name: [r[name] for r in records]
        for name in ("key", "identity", "version", "name", "status", "reason")
    }
    for m in METRICS:
        columns[m] = [r["metrics"][m] for r in records]
    columns["inputs"] = [json.dumps(r["inputs"], sort_keys=True) for r in records]
    counts = ("peak_bytes", "vanilla_peak_bytes", "budget_bytes", "bytes_out", "bytes_in",
              "net_evictions")  # fmt: skip
    types = {m: pa.int64() if m in counts else pa.float64() for m in METRICS if m != "bound_name"}
    schema = pa.schema([(k, types.get(k, pa.string())) for k in columns])
    table = pa.table({k: pa.array(v, type=schema.field(k).type) for k, v in columns.items()})
    buf = _io.BytesIO()
    pq.write_table(table, buf)
    with writing(path):
        atomic_write_bytes(path, buf.getvalue())

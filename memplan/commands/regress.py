"""`memplan regress SUITE.toml --baseline B.json`: run a suite of scenarios
and gate its figures against a baseline (docs/regress.md)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memplan.units import integer

if TYPE_CHECKING:
    from memplan.regress.baseline import Baseline
    from memplan.regress.suite import Suite
    from memplan.sweep.scenario import SweepTask

# NOTE [ Regress exit codes ]
# 0: every scenario's status and gated figures are within tolerance of the
# baseline (improvements beyond tolerance included: NOTE [ Regression
# tolerances ] in memplan/regress/suite.py), or --update wrote the baseline;
# 1: a figure regressed or changed, a status changed, or a scenario is not
# in the baseline -- the diff table on stdout says which; 2: bad input (a
# malformed suite or baseline, no baseline file without --update, an output
# that cannot be written), before any scenario runs.
EXIT_REGRESSED = 1


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "regress",
        help="run a suite of scenarios and gate planner quality against a baseline",
        description=(
            "Run every scenario of SUITE.toml (grids in the `memplan sweep` format, a "
            "[metrics] table of tolerances; docs/regress.md) and compare each scenario's "
            "status and gated metrics with the baseline. Exit 0: all within tolerance; 1: "
            "something regressed (a table of scenario, planner, metric, baseline, now, "
            "tolerance, verdict on stdout); 2: bad input."
        ),
    )
    p.add_argument("suite", metavar="SUITE.toml", help="the suite file")
    p.add_argument(
        "--baseline", required=True, metavar="B.json", help="the baseline (memplan.baseline/1)"
    )
    p.add_argument(
        "--update",
        action="store_true",
        help="write the baseline from this run instead of failing on differences (with "
        "--only-fast, entries of the other scenarios are kept)",
    )
    p.add_argument("--summary", metavar="FILE.md", help="write a markdown summary for a CI page")
    p.add_argument(
        "--workers",
        type=integer(1, 1024),
        metavar="N",
        help="local worker processes (default: the CPU count; 1 runs in this process)",
    )
    p.add_argument("--only-fast", action="store_true", help="run the grids marked fast = true only")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the suite and diff it against the baseline, or rewrite the
    baseline (--update); the exit code per NOTE [ Regress exit codes ]."""
    from memplan import outputs
    from memplan.regress import baseline as bl
    from memplan.regress import diff
    from memplan.regress.suite import load_suite
    from memplan.traces.io import atomic_write_bytes

    if args.summary is not None:
        outputs.check_file(args.summary, "--summary")  # before any work: NOTE [ Output paths ]
    if args.update:
        outputs.check_file(args.baseline, "--baseline")
    old = _old_baseline(args.baseline, args.update)
    suite = load_suite(args.suite, only_fast=args.only_fast)
    metrics = tuple(suite.metrics)
    if args.update and args.only_fast and old is not None and old.metrics != metrics:
        raise bl.BaselineError(
            f"{args.baseline}: gates {', '.join(old.metrics)} and the suite {', '.join(metrics)}; "
            "update the whole baseline (--update without --only-fast)"
        )
    _notes(suite, old, args.baseline)
    records = run_all(suite.selected(args.only_fast), args.workers, args.no_progress)
    against = old if old is not None else bl.Baseline("", suite.fingerprint, metrics, {})
    lines = diff.diff(records, against, suite.metrics)
    rows = [x.cells() for x in lines if x.verdict is not diff.Verdict.OK]
    if rows and old is not None:  # a new baseline: nothing to compare with
        print(diff.text_table(rows))
    c = diff.counts(lines)
    if args.summary is not None:
        title = f"memplan regress {Path(args.suite).name}"
        text = diff.markdown(lines, records, against, metrics, title)
        with outputs.writing(args.summary, "--summary"):
            atomic_write_bytes(args.summary, text.encode())
    if args.update:
        new = _updated(old, suite, records, args.only_fast)
        bl.save(new, args.baseline)
        updated = c.scenarios - c.passed
        print(
            f"wrote {args.baseline}: {len(new.entries)} scenarios ({c.passed} unchanged "
            f"within tolerance, {updated} updated)"
        )
        return 0
    print(diff.verdict_line(c))
    return EXIT_REGRESSED if c.failed else 0


def _old_baseline(path: str, update: bool) -> Baseline | None:
    """The baseline at `path`; None when it does not exist and --update will
    write it (without --update a missing baseline is bad input)."""
    from memplan.regress.baseline import BaselineError, load

    if update and not Path(path).exists():
        return None
    if not Path(path).exists():
        raise BaselineError(f"{path}: no such baseline file (make one with --update)")
    return load(path)


def _notes(suite: Suite, old: Baseline | None, path: str) -> None:
    """Say on stderr when the baseline was made by another memplan or suite."""
    import memplan

    if old is None:
        return
    if old.version != memplan.__version__:
        print(f"note: {path} was written by memplan {old.version}; this is "
              f"{memplan.__version__}", file=sys.stderr)  # fmt: skip
    if old.suite != suite.fingerprint:
        print(f"note: {path} was made for another version of the suite (fingerprint "
              f"{old.suite}, now {suite.fingerprint})", file=sys.stderr)  # fmt: skip


def run_all(scenarios: list[SweepTask], workers: int | None, quiet: bool) -> list[dict[str, Any]]:
    """Every scenario's record, in the suite's order: on the sweep's local
    backend (`workers` processes; 1 runs them here), with a progress bar."""
    from tqdm import tqdm

    from memplan.sweep.backends import local

    n = workers if workers is not None else (os.cpu_count() or 1)
    by_id: dict[str, dict[str, Any]] = {}
    with tqdm(total=len(scenarios), unit="scenario", desc="regress", disable=quiet) as bar:
        for done in local(scenarios, min(n, len(scenarios))):
            by_id[done.record["identity"]] = done.record
            bar.update(1)
    return [by_id[s.identity()] for s in scenarios]


def _updated(
    old: Baseline | None, suite: Suite, records: list[dict[str, Any]], only_fast: bool
) -> Baseline:
    """The baseline this run makes: its records' entries, and with
    --only-fast the old entries of the scenarios it did not run."""
    import memplan
    from memplan.regress import baseline as bl

    metrics = tuple(suite.metrics)
    entries = {}
    if old is not None and only_fast:
        entries.update(old.entries)
    entries.update({r["identity"]: bl.entry_of(r, metrics) for r in records})
    return bl.Baseline(memplan.__version__, suite.fingerprint, metrics, entries,
                       _provenance(suite, records))  # fmt: skip


def _provenance(suite: Suite, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The baseline's provenance (NOTE [ Provenance ]): the distinct traces
    of its scenarios; each scenario's profile and settings are in its
    identity, so the profile is left null."""
    from memplan.provenance import provenance

    prov = provenance([], None, options={"suite": suite.fingerprint,
                      "metrics": {m: t.text() for m, t in suite.metrics.items()}},
                      seed=None, command="memplan regress")  # fmt: skip
    seen: dict[str, str] = {}
    for r in records:
        for job in r["inputs"]["jobs"]:
            seen.setdefault(job["fingerprint"], job["model"])
    prov["traces"] = [{"name": n, "fingerprint": f} for f, n in sorted(seen.items())]
    return prov

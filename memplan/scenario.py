"""Workload scenarios: jobs that arrive, run and leave, and what moves
under them (jitter, outside usage, slow lanes).

Two ways in: `--job TRACE@2.5s:20` on the command line (`job_spec`), and a
scenario file (`load`), a small TOML document:

```toml
seed = 1                         # the jitter's seed (default 0)
jitter = 0.05                    # sigma of each kernel's log-normal noise (default 0)
usage = 0.2                      # load from outside the jobs, a fraction (default 0)
lane_slowdown = ["4x@1s-3s"]     # windows of slow lanes (default none)

[launch]                         # optional: the paper's random launch (TENSILE §V-E)
order = "random"                 # "given" (default) or "random"
seed = 1                         # the order's seed (default: the top-level seed)
gap_s = 0.5                      # the k-th job launched arrives at start_s + k * gap_s
start_s = 0.0

[[job]]                          # one table per job, in order
trace = "zoo:small_cnn"          # as `memplan simulate` takes it; relative to this file
arrival_s = 0.0                  # default 0 (not with order = "random")
iterations = 20                  # default: --iterations (with departure_s: until it leaves)
departure_s = 5.0                # optional (NOTE [ Departures ] in sim/dynamics.py)
plan = "vanilla"                 # optional, simulate only: a plan file or built-in name
name = "cnn"                     # optional
```

Every field is checked (`traces/fields.py`); an unknown key, a wrong type
or an absurd value is one line naming the field, exit 2 from the CLI.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from memplan.planners.core.plan import Plan
from memplan.sim import Job
from memplan.sim.dynamics import MAX_JITTER, LaneSlowdown
from memplan.sim.errors import SimError
from memplan.traces import fields
from memplan.traces.fields import shown
from memplan.traces.io import read_toml
from memplan.traces.model import Trace

MAX_TIME_S = 7 * 86400.0  # a week of simulated time: beyond it a number is a typo
MAX_ITERATIONS = 1000  # as --iterations
MAX_SCENARIO_BYTES = 1 << 20
_TIME = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?)\s*(ms|us|s)\s*$")
_UNIT_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job of a scenario, before its trace is loaded."""

    trace: str
    arrival_s: float = 0.0
    iterations: int | None = None
    departure_s: float | None = None
    plan: str | None = None
    name: str = ""


@dataclass(frozen=True, slots=True)
class Scenario:
    """Jobs in the order given (arrivals already placed) and what moves."""

    jobs: tuple[JobSpec, ...] = ()
    seed: int = 0
    jitter: float = 0.0
    usage: float = 0.0
    lane_slowdowns: tuple[LaneSlowdown, ...] = ()

    def options(self) -> dict[str, Any]:
        """`simulate`'s keywords for what moves."""
        return {
            "seed": self.seed,
            "jitter": self.jitter,
            "usage": self.usage,
            "lane_slowdowns": self.lane_slowdowns,
        }


@dataclass(frozen=True, slots=True)
class JobMix:
    """The jobs of a comparison as they arrive and leave (`specs`, one per
    trace, in order) and what moves under them (`moves`)."""

    specs: tuple[JobSpec, ...]
    moves: Scenario

    def jobs(self, traces: Sequence[Trace], plans: Sequence[Plan | None]) -> list[Job]:
        if len(traces) != len(self.specs):
            raise SimError(f"workload: {len(self.specs)} job specs for {len(traces)} traces")
        return [
            Job(
                t,
                p,
                arrival_s=s.arrival_s,
                iterations=s.iterations,
                name=s.name or f"{t.meta.model or 'job'}#{i}",
                departure_s=s.departure_s,
            )
            for i, (s, t, p) in enumerate(zip(self.specs, traces, plans, strict=True))
        ]

    def options(self) -> dict[str, Any]:
        return self.moves.options()

    @property
    def static(self) -> bool:
        """Every job starts at 0 and runs the simulation's iterations, and
        nothing moves: the jobs of a plain comparison."""
        same = all(
            s.arrival_s == 0 and s.iterations is None and s.departure_s is None for s in self.specs
        )
        m = self.moves
        return same and not (m.jitter or m.usage or m.lane_slowdowns)


def jobs_for(
    mix: JobMix | None, traces: Sequence[Trace], plans: Sequence[Plan | None]
) -> list[Job]:
    """The jobs of a comparison: `mix`'s, or each trace at 0 for the
    simulation's iterations."""
    if mix is None:
        mix = JobMix(tuple(JobSpec("") for _ in traces), Scenario())
    return mix.jobs(traces, plans)


# ---- text forms ------------------------------------------------------------------------
def time_s(text: str, what: str) -> float:
    """`2.5s`, `500ms`, `20us` -> seconds in [0, MAX_TIME_S]; a unit is required."""
    m = _TIME.match(text)
    if not m:
        raise SimError(f"{what}={text!r}: expected a time with a unit, e.g. 2.5s or 500ms")
    value = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not math.isfinite(value) or value > MAX_TIME_S:
        raise SimError(f"{what}={text!r}: at most {MAX_TIME_S:g} s")
    return value


def job_spec(text: str) -> JobSpec:
    """`TRACE[@TIME][:N | :until=TIME]` (`--job`): the trace (as `simulate`
    takes it, zoo:NAME too), its arrival, and its iterations or departure."""
    what = f"--job {text!r}"
    if Path(text).is_file():  # a file whose name itself holds '@' or ':' (NOTE [ Job copies ])
        return JobSpec(text)
    body, iterations, departure = text, None, None
    head, sep, tail = body.rpartition(":")
    if sep and head and (tail.startswith("until=") or (tail.isascii() and tail.isdigit())):
        body = head
        if tail.startswith("until="):
            departure = time_s(tail[len("until=") :], f"{what}: until")
        elif len(tail) > 6 or not 1 <= int(tail) <= MAX_ITERATIONS:
            raise SimError(f"{what}: iterations after ':' must be from 1 to {MAX_ITERATIONS}")
        else:
            iterations = int(tail)
    arrival = 0.0
    head, sep, tail = body.rpartition("@")
    if sep and not head:
        raise SimError(f"{what}: no trace before '@'")
    if sep:
        arrival = time_s(tail, f"{what}: arrival after '@'")
        body = head
    if not body:
        raise SimError(f"{what}: no trace before '@' or ':'")
    if departure is not None and departure <= arrival:
        raise SimError(f"{what}: until={departure:g}s is not after its arrival ({arrival:g}s)")
    return JobSpec(body, arrival, iterations, departure)


def lane_slowdown(text: str, what: str = "--lane-slowdown") -> LaneSlowdown:
    """`4x@1s-3s`: lanes 4 times slower from 1 s to 3 s."""
    factor, at, window = text.partition("@")
    start, dash, end = window.partition("-")
    if not at or not dash or not factor.lower().endswith("x"):
        raise SimError(f"{what}={text!r}: expected FACTORx@START-END, e.g. 4x@1s-3s")
    try:
        f = float(factor[:-1]) if len(factor) < 30 else math.inf
    except ValueError:
        raise SimError(f"{what}={text!r}: the factor {factor!r} is not a number") from None
    a, b = time_s(start, f"{what} start"), time_s(end, f"{what} end")
    try:
        return LaneSlowdown(f, a, b)
    except SimError as e:
        raise SimError(f"{what}={text!r}: {e}") from None


# ---- the file ------------------------------------------------------------------------
_TOP = {"seed", "jitter", "usage", "lane_slowdown", "launch", "job"}
_LAUNCH = {"order", "seed", "gap_s", "start_s"}
_JOB = {"trace", "arrival_s", "iterations", "departure_s", "plan", "name"}


def load(path: str | Path) -> Scenario:
    """The scenario file at `path` (module docstring); SimError naming the
    file and field for anything wrong."""
    p, doc = read_toml(path, SimError, "scenario file", MAX_SCENARIO_BYTES)
    return parse(doc, str(p), p.parent)


def _keys(table: dict[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise SimError(
            f"{where}: unknown field {shown(unknown[0])} (known: {', '.join(sorted(allowed))})"
        )


def parse(doc: dict[str, Any], where: str, base: Path | None = None) -> Scenario:
    """A scenario from its TOML document (`where` names it in errors; trace
    and plan paths are relative to `base`)."""
    E = SimError
    _keys(doc, _TOP, where)
    seed = fields.integer(doc.get("seed", 0), f"{where}: seed", E, 0, 2**32 - 1)
    jitter = fields.number(doc.get("jitter", 0.0), f"{where}: jitter", E, 0.0, MAX_JITTER)
    usage = fields.number(doc.get("usage", 0.0), f"{where}: usage", E, 0.0, 1.0)
    slows = fields.array(doc.get("lane_slowdown", []), f"{where}: lane_slowdown", E)
    windows = tuple(
        lane_slowdown(
            fields.string(x, f"{where}: lane_slowdown[{k}]", E), f"{where}: lane_slowdown[{k}]"
        )
        for k, x in enumerate(slows)
    )
    raw_jobs = fields.array(doc.get("job", []), f"{where}: job", E)
    if not raw_jobs:
        raise SimError(f"{where}: no [[job]] tables: a scenario needs at least one job")
    jobs = [_job(x, f"{where}: job[{k}]", base) for k, x in enumerate(raw_jobs)]
    launch = fields.obj(doc.get("launch", {}), f"{where}: launch", E)
    jobs = _launch(launch, jobs, f"{where}: launch", seed, raw_jobs)
    return Scenario(tuple(jobs), seed, jitter, usage, windows)


def _job(raw: Any, where: str, base: Path | None) -> JobSpec:
    E = SimError
    t = fields.obj(raw, where, E)
    _keys(t, _JOB, where)
    if "trace" not in t:
        raise SimError(f"{where}: no trace (a trace file or zoo:NAME)")
    trace = _path(fields.text(t["trace"], f"{where}.trace", E), base)
    arrival = fields.number(t.get("arrival_s", 0.0), f"{where}.arrival_s", E, 0.0, MAX_TIME_S)
    iterations = None
    if "iterations" in t:
        iterations = fields.integer(t["iterations"], f"{where}.iterations", E, 1, MAX_ITERATIONS)
    departure = None
    if "departure_s" in t:
        departure = fields.number(t["departure_s"], f"{where}.departure_s", E, 0.0, MAX_TIME_S)
        if departure <= arrival:
            raise SimError(f"{where}.departure_s: {departure:g} is not after arrival_s {arrival:g}")
    plan = None
    if "plan" in t:
        plan = fields.text(t["plan"], f"{where}.plan", E)
        plan = plan if plan in ("vanilla", "release_only") else _path(plan, base)
    name = fields.text(t.get("name", ""), f"{where}.name", E)
    return JobSpec(trace, arrival, iterations, departure, plan, name)


def _path(text: str, base: Path | None) -> str:
    """A path relative to the scenario file (zoo: names and absolute paths as given)."""
    if base is None or text.startswith("zoo:") or Path(text).is_absolute():
        return text
    return str(base / text)


def _launch(
    launch: dict[str, Any], jobs: list[JobSpec], where: str, seed: int, raw: Sequence[Any]
) -> list[JobSpec]:
    """Arrivals under `[launch]`: as given, or one by one in a random order."""
    E = SimError
    _keys(launch, _LAUNCH, where)
    order = fields.string(launch.get("order", "given"), f"{where}.order", E)
    if order not in ("given", "random"):
        raise SimError(f'{where}.order: expected "given" or "random", got {shown(order)}')
    if order == "given":
        extra = sorted(set(launch) - {"order"})
        if extra:
            raise SimError(f'{where}.{extra[0]}: only with order = "random"')
        return jobs
    for k, t in enumerate(raw):
        if "arrival_s" in t or "departure_s" in t:
            key = "arrival_s" if "arrival_s" in t else "departure_s"
            raise SimError(
                f'{where}: order = "random" sets the arrivals; job[{k}].{key} is given '
                "(give iterations instead)"
            )
    rng_seed = fields.integer(launch.get("seed", seed), f"{where}.seed", E, 0, 2**32 - 1)
    gap = fields.number(launch.get("gap_s", 0.0), f"{where}.gap_s", E, 0.0, MAX_TIME_S)
    start = fields.number(launch.get("start_s", 0.0), f"{where}.start_s", E, 0.0, MAX_TIME_S)
    order_of = np.random.default_rng(rng_seed).permutation(len(jobs))
    out = list(jobs)
    for k, j in enumerate(order_of.tolist()):
        out[j] = replace(jobs[j], arrival_s=start + k * gap)
    return out

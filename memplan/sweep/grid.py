"""A sweep's grid: a TOML `[grid]` table whose axes multiply into scenarios.

Every field is checked here, before any work, and a bad one is a one-line
`GridError` naming the file and the field (docs/sweep.md has the format).
`parse_grid` takes the table's contents, so another file (a regression
suite) can hold a `[grid]` table and parse it the same way.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memplan.runconfig import Fallback
from memplan.sim.state import Allocator
from memplan.sweep.scenario import SweepTask, load_profile, load_trace
from memplan.traces import fields
from memplan.traces.errors import MemplanError
from memplan.traces.io import read_toml

MAX_SCENARIOS = 100_000
MAX_BATCH = 1_000_000
MAX_ITERATIONS = 1000
MAX_SEED = 2**32 - 1
LATENCIES = ("kernel", "roofline", "measured", "mlp")
# The axes, in the order they multiply (the first varies slowest).
AXES = ("gpus", "planners", "budgets", "fallbacks", "allocators", "lanes", "latency",
        "iterations", "seeds")  # fmt: skip
KNOWN = frozenset({"traces", "models", "batch_sizes", "optimizer", *AXES})


class GridError(MemplanError):
    """A grid (or the grid of a suite) that cannot be swept."""


@dataclass(frozen=True)
class Capture:
    """A model to capture on the meta device before the sweep starts."""

    model: str
    batch: int
    optimizer: str
    path: Path


@dataclass
class Grid:
    """The scenarios of a grid, in its fixed order (NOTE [ Grid order ]), and
    the captures they need first (their traces are at `Capture.path`)."""

    scenarios: list[SweepTask]
    captures: list[Capture] = field(default_factory=list)
    where: str = ""


def load_grid(path: str | Path, traces_dir: Path | None = None) -> Grid:
    """The `[grid]` table of the TOML file at `path`; relative paths in it
    are relative to the file; models are captured into `traces_dir`."""
    p, doc = read_toml(path, GridError, "grid file")
    unknown = sorted(set(doc) - {"grid"})
    if unknown:
        raise GridError(f"{p}: unknown table {fields.shown(unknown[0])} (a grid file has [grid])")
    if "grid" not in doc:
        raise GridError(f"{p}: no [grid] table")
    table = fields.obj(doc["grid"], f"{p}: grid", GridError)
    return parse_grid(table, f"{p}: grid", base=p.parent, traces_dir=traces_dir)


# NOTE [ Grid order ]
# The scenarios are the product of the job mixes (the `traces` entries in
# order, then each model at each batch size) and the axes in `AXES` order,
# the first varying slowest: jobs, gpus, planners, budgets, fallbacks,
# allocators, lanes, latency, iterations, seeds. Every axis takes one value
# or a list; an axis left out has the default of `memplan compare` (budgets:
# "none", the GPU's memory). A value given twice in an axis is refused, so
# no scenario appears twice. The order is the order of results.jsonl.
def parse_grid(
    doc: dict[str, Any],
    where: str,
    *,
    base: Path | None = None,
    traces_dir: Path | None = None,
) -> Grid:
    """The grid in `doc` (the contents of a `[grid]` table); `where` starts
    every error (`suite.toml: grid`), `base` is the folder relative paths
    are in (default: the working directory), `traces_dir` where models are
    captured to (NOTE [ Grid order ])."""
    base = base if base is not None else Path(".")
    fields.obj(doc, where, GridError)
    unknown = sorted(set(doc) - KNOWN)
    if unknown:
        known = ", ".join(sorted(KNOWN))
        raise GridError(f"{where}: unknown field {fields.shown(unknown[0])} (fields: {known})")
    mixes = _trace_mixes(doc, where, base)
    captures = _captures(doc, where, traces_dir)
    mixes += [(str(c.path),) for c in captures]
    if not mixes:
        raise GridError(f"{where}: no jobs: give traces or models (with batch_sizes)")
    axes = {
        "gpus": _axis(doc, "gpus", where, lambda v, w: _gpu(v, w, base), None),
        "planners": _axis(doc, "planners", where, _planner, None),
        "budgets": _axis(doc, "budgets", where, _budget, ["none"]),
        "fallbacks": _axis(
            doc, "fallbacks", where, _choice(*(f.value for f in Fallback)), ["none"]
        ),
        "allocators": _axis(
            doc, "allocators", where, _choice(*(a.value for a in Allocator)), ["exact"]
        ),
        "lanes": _axis(doc, "lanes", where, _integer(1, 2), [1]),
        "latency": _axis(doc, "latency", where, lambda v, w: _latency(v, w, base), ["kernel"]),
        "iterations": _axis(doc, "iterations", where, _integer(1, MAX_ITERATIONS), [3]),
        "seeds": _axis(doc, "seeds", where, _integer(0, MAX_SEED), [0]),
    }
    total = len(mixes)
    for values in axes.values():
        total *= len(values)
    if total > MAX_SCENARIOS:
        raise GridError(f"{where}: {total} scenarios; at most {MAX_SCENARIOS} in one grid")
    scenarios = [
        SweepTask(
            traces=jobs, gpu=gpu, planner=planner[0], options=planner[1], budget=budget,
            fallback=fallback, allocator=allocator, lanes=lanes, latency=latency,
            iterations=iterations, seed=seed,
        )  # fmt: skip
        for jobs, gpu, planner, budget, fallback, allocator, lanes, latency, iterations, seed
        in itertools.product(mixes, *(axes[a] for a in AXES))
    ]  # fmt: skip
    return Grid(scenarios, captures, where)


def _axis(
    doc: dict[str, Any],
    name: str,
    where: str,
    parse: Callable[[Any, str], Any],
    default: list[Any] | None,
) -> list[Any]:
    """The values of axis `name`: one value or a non-empty list, each parsed."""
    if name not in doc:
        if default is None:
            raise GridError(f"{where}: missing field {name!r}")
        return [parse(v, f"{where}.{name}") for v in default]
    raw = doc[name]
    items = [raw] if not isinstance(raw, list) else raw
    if not items:
        raise GridError(f"{where}.{name}: an empty list (give at least one value)")
    out: list[Any] = []
    for i, item in enumerate(items):
        w = f"{where}.{name}" if not isinstance(raw, list) else f"{where}.{name}[{i}]"
        value = parse(item, w)
        if value in out:
            raise GridError(f"{w}: {fields.shown(item)} is given twice")
        out.append(value)
    return out


def _wrap(where: str, e: MemplanError) -> GridError:
    return GridError(f"{where}: {e}")


# ---- jobs --------------------------------------------------------------------------
def _trace_mixes(doc: dict[str, Any], where: str, base: Path) -> list[tuple[str, ...]]:
    """The `traces` entries as job mixes: `PATH`, `PATH:COUNT` or a list of them."""
    from memplan.commands.machine import MAX_JOBS, job_specs

    if "traces" not in doc:
        return []
    raw = doc["traces"]
    entries = [raw] if isinstance(raw, str) else fields.array(raw, f"{where}.traces", GridError)
    mixes: list[tuple[str, ...]] = []
    for i, entry in enumerate(entries):
        w = f"{where}.traces[{i}]"
        specs = entry if isinstance(entry, list) else [entry]
        if not specs:
            raise GridError(f"{w}: an empty job mix")
        jobs: list[str] = []
        for j, spec in enumerate(specs):
            wj = f"{w}[{j}]" if isinstance(entry, list) else w
            spec = fields.string(spec, wj, GridError)
            try:
                if Path(_relative(spec, base)).exists():  # a file named `x:2` is that file
                    path, count = _relative(spec, base), 1
                else:
                    ((path, count),) = job_specs([spec])  # messages show the spec as written
                    path = _relative(path, base)
                load_trace(path)
            except MemplanError as e:
                raise _wrap(wj, e) from None
            jobs += [path] * count
        if len(jobs) > MAX_JOBS:
            raise GridError(f"{w}: {len(jobs)} jobs; at most {MAX_JOBS} run together on one GPU")
        if tuple(jobs) in mixes:
            raise GridError(f"{w}: the same job mix is given twice")
        mixes.append(tuple(jobs))
    return mixes


def _relative(spec: str, base: Path) -> str:
    """A trace or profile path relative to the grid's folder (`zoo:` names as they are)."""
    if not spec.strip():
        raise GridError("an empty path")
    if spec.startswith("zoo:") or Path(spec).is_absolute():
        return spec
    return str(base / spec)


def _captures(doc: dict[str, Any], where: str, traces_dir: Path | None) -> list[Capture]:
    """Each model at each batch size, to be captured into `traces_dir`."""
    from memplan.traces.zoo import resolve

    if "models" not in doc:
        for key in ("batch_sizes", "optimizer"):
            if key in doc:
                raise GridError(f"{where}.{key}: applies to models; give models too")
        return []
    models = _axis(doc, "models", where, _model, None)
    for i, m in enumerate(models):
        try:
            resolve(m)
        except MemplanError as e:
            raise _wrap(f"{where}.models[{i}]", e) from None
    batches = _axis(doc, "batch_sizes", where, _integer(1, MAX_BATCH), None)
    optimizer = fields.text(doc.get("optimizer", "adam"), f"{where}.optimizer", GridError)
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]*", optimizer):
        raise GridError(f"{where}.optimizer: expected an optimizer name, got {optimizer!r}")
    if traces_dir is None:
        raise GridError(f"{where}.models: models are captured into the sweep's --out/traces")
    out = []
    for model, batch in itertools.product(models, batches):
        stem = re.sub(r"[^A-Za-z0-9_.-]", "_", model)
        path = traces_dir / f"{stem}_b{batch}_{optimizer.lower()}.json.gz"
        out.append(Capture(model, batch, optimizer, path))
    return out


def _model(value: Any, where: str) -> str:
    text = fields.text(value, where, GridError)
    if not text.strip():
        raise GridError(f"{where}: an empty model name")
    return text


# ---- axes --------------------------------------------------------------------------
def _gpu(value: Any, where: str, base: Path) -> str:
    text = fields.text(value, where, GridError)
    spec = _relative(text, base) if text.endswith(".toml") else text
    try:
        load_profile(spec)
    except MemplanError as e:
        raise _wrap(where, e) from None
    return spec


def _planner(value: Any, where: str) -> tuple[str, tuple[tuple[str, object], ...]]:
    """A planner name, or a table `{name = ..., OPTION = VALUE, ...}` checked
    against the planner's typed options."""
    from memplan.comparison import WITNESSES
    from memplan.planners import registry

    if isinstance(value, dict):
        given = dict(value)
        if "name" not in given:
            raise GridError(f'{where}: a planner table needs name = "PLANNER"')
        name = fields.text(given.pop("name"), f"{where}.name", GridError)
    else:
        name, given = fields.text(value, where, GridError), {}
    if name in WITNESSES:
        if given:
            raise GridError(f"{where}: {name} is a witness (no plan) and takes no options")
        return name, ()
    try:
        options = registry.make_options(name, given)
    except MemplanError as e:
        raise _wrap(where, e) from None
    values = registry.options_dict(options)
    return name, tuple(sorted((k, _frozen(values[k])) for k in given))


def _frozen(value: Any) -> Any:
    """A JSON value with lists as tuples, so a scenario is hashable."""
    if isinstance(value, list | tuple):
        return tuple(_frozen(v) for v in value)
    return value


def _budget(value: Any, where: str) -> str | None:
    """`"none"`, `"60%"` (of the jobs' vanilla peak) or a size (`"12GiB"`, bytes)."""
    from memplan.commands.machine import budget_fraction
    from memplan.units import parse_size

    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    text = fields.text(value, where, GridError).strip()
    if text.lower() == "none":
        return None
    try:
        if text.endswith("%"):
            budget_fraction(_Budget(text))
        else:
            parse_size(text, "budget")
    except MemplanError as e:
        raise _wrap(where, e) from None
    return text


@dataclass
class _Budget:  # what machine.budget_fraction reads
    budget: str


def _choice(*allowed: str) -> Callable[[Any, str], str]:
    def parse(value: Any, where: str) -> str:
        text = fields.text(value, where, GridError)
        if text not in allowed:
            raise GridError(f"{where}: {fields.shown(text)} is not one of {', '.join(allowed)}")
        return text

    return parse


def _integer(lo: int, hi: int) -> Callable[[Any, str], int]:
    def parse(value: Any, where: str) -> int:
        return fields.integer(value, where, GridError, lo, hi)

    return parse


def _latency(value: Any, where: str, base: Path) -> str:
    text = fields.text(value, where, GridError)
    if text in LATENCIES:
        return text
    if not text.strip():
        raise GridError(f"{where}: empty; expected kernel, roofline, measured, mlp or a model file")
    path = Path(_relative(text, base))
    if not path.is_file():
        raise GridError(
            f"{where}: {fields.shown(text)} is not kernel, roofline, measured, mlp or a latency "
            "model file"
        )
    return str(path)

"""One scenario of a sweep: jobs, a GPU, a planner with options, a budget and
how the run is simulated -- and the one JSON record its run comes to.

A scenario is plain data (paths and strings), so it crosses process and
machine boundaries as is; `run_scenario` loads what it names and runs it
through the code `memplan compare` uses (`memplan.comparison`).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import memplan
from memplan.traces.errors import MemplanError
from memplan.traces.fields import finite_or_none

SHARE_SUFFIX = "%"
# The record's metrics, in the order summary tables show them.
METRICS = (
    "iteration_ms", "vanilla_ms", "peak_bytes", "vanilla_peak_bytes", "budget_bytes", "msr",
    "eor", "cbr", "gap", "bound_ms", "bound_name", "stall_ms", "recompute_ms", "bytes_out",
    "bytes_in", "net_evictions",
)  # fmt: skip
STATUSES = ("alone", "net", "oom", "infeasible", "stopped", "error")
# Profile fields that describe a profile rather than the device it models, or
# that only a capture reads (the architecture a trace is captured for): a
# scenario simulates given traces, and its identity is what the simulation reads.
_PROFILE_PROSE = ("source", "description", "device", "compute_capability")


@dataclass(frozen=True)
class SweepTask:
    """One task of a sweep (NOTE [ SweepTask keys ]). `traces` holds one entry
    per job (a path or `zoo:NAME`; a job mix is several entries), `budget`
    the budget as the user wrote it (`"60%"` of the jobs' vanilla peak, a
    size, None: the GPU's memory), `options` the planner's options as sorted
    (name, value) pairs."""

    traces: tuple[str, ...]
    gpu: str
    planner: str
    options: tuple[tuple[str, object], ...] = ()
    budget: str | None = None
    fallback: str = "none"
    allocator: str = "exact"
    lanes: int = 1
    latency: str = "kernel"
    iterations: int = 3
    seed: int = 0

    def name(self) -> str:
        """A short readable label: `resnet50_b16_adam x1 rtx-a6000 tensile 60% dtr`."""
        counts: dict[str, int] = {}
        for t in self.traces:
            counts[trace_label(t)] = counts.get(trace_label(t), 0) + 1
        jobs = " + ".join(f"{label} x{n}" for label, n in counts.items())
        planner = self.planner
        if self.options:
            planner += "(" + ",".join(f"{k}={_plain(v)}" for k, v in self.options) + ")"
        parts = [jobs, Path(self.gpu).stem if self.gpu.endswith(".toml") else self.gpu, planner]
        parts.append(self.budget if self.budget is not None else "no-budget")
        if self.fallback != "none":
            parts.append(self.fallback)
        if self.allocator != "exact":
            parts.append(self.allocator)
        if self.lanes != 1:
            parts.append(f"{self.lanes}lanes")
        if self.latency != "kernel":
            parts.append(f"latency={trace_label(self.latency)}")
        if self.iterations != 3:
            parts.append(f"{self.iterations}it")
        if self.seed != 0:
            parts.append(f"seed={self.seed}")
        return " ".join(parts)

    def inputs(self) -> dict[str, Any]:
        """Everything the run depends on, as canonical JSON values: each job's
        trace by model, batch and fingerprint, the profile's values, the
        latency model (a file by its sha256), and the settings. No paths and
        no memplan version (NOTE [ SweepTask keys ])."""
        return {
            "jobs": [_trace_inputs(t) for t in self.traces],
            "gpu": _profile_inputs(self.gpu),
            "planner": self.planner,
            "options": {k: _plain(v) for k, v in self.options},
            "budget": self.budget,
            "fallback": self.fallback,
            "allocator": self.allocator,
            "lanes": self.lanes,
            "latency": _latency_inputs(self.latency),
            "iterations": self.iterations,
            "seed": self.seed,
        }

    def identity(self) -> str:
        """sha256 (16 hex digits) of `inputs()`: the same across memplan versions."""
        return _digest(self.inputs())

    def key(self) -> str:
        """sha256 (16 hex digits) of `inputs()` and memplan's version: the
        sweep's resume key."""
        return _digest({"inputs": self.inputs(), "version": memplan.__version__})


# NOTE [ SweepTask keys ]
# A scenario's `identity` hashes what its result depends on: the traces by
# content (their fingerprints, so a trace moved or renamed keeps its
# identity, and one re-captured differently does not), the GPU profile's
# values (not its file or prose), the planner and its options, the budget as
# written, and the simulation's settings. Paths never enter it: a suite
# checked in a repository has the same identities on every machine. Its
# `key` adds memplan's version: a sweep resumed by another version recomputes
# everything, while a regression baseline (which matches on identity) is
# compared across versions. The seed goes to the planner's own `seed` option
# when it has one and the grid does not set it; planners without randomness
# ignore it (their scenarios still differ by key).
def _digest(doc: Any) -> str:
    blob = json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _plain(value: Any) -> Any:
    """A TOML option value as JSON (tuples as lists)."""
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    return value


def trace_label(spec: str) -> str:
    """`zoo:NAME` -> NAME; a path -> its file name without .json/.json.gz."""
    if spec.startswith("zoo:"):
        return spec[4:]
    name = Path(spec).name
    for suffix in (".gz", ".json", ".toml"):
        name = name.removesuffix(suffix)
    return name


def _file_stamp(path: str) -> tuple[str, int, int]:
    """(path, mtime, size): a cache key that notices a rewritten file."""
    from memplan.traces import io

    p = io.resolve(path)
    try:
        st = p.stat()
    except OSError:
        return str(p), -1, -1
    return str(p), st.st_mtime_ns, st.st_size


@functools.lru_cache(maxsize=64)
def _loaded(stamp: tuple[str, int, int]) -> Any:
    from memplan.traces import io

    return io.load(stamp[0])


def load_trace(spec: str) -> Any:
    """The trace at `spec` (a path or `zoo:NAME`), loaded once per process."""
    return _loaded(_file_stamp(spec))


@functools.lru_cache(maxsize=64)
def _fingerprint(stamp: tuple[str, int, int]) -> str:
    from memplan.traces import io

    return io.fingerprint(_loaded(stamp))


def _trace_inputs(spec: str) -> dict[str, Any]:
    stamp = _file_stamp(spec)
    meta = _loaded(stamp).meta
    return {"model": meta.model, "batch": meta.batch_size, "fingerprint": _fingerprint(stamp)}


@functools.lru_cache(maxsize=32)
def load_profile(gpu: str) -> Any:
    from memplan.hwmodels.profile import load_hardware

    return load_hardware(gpu)


def _profile_inputs(gpu: str) -> dict[str, Any]:
    values = dataclasses.asdict(load_profile(gpu))
    return {k: v for k, v in values.items() if k not in _PROFILE_PROSE}


def _latency_inputs(spec: str) -> str:
    """The latency model: its name, or a model file by its sha256."""
    if spec in ("kernel", "roofline", "measured", "mlp") or not os.path.isfile(spec):
        return spec
    return "sha256:" + hashlib.sha256(Path(spec).read_bytes()).hexdigest()


@functools.lru_cache(maxsize=8)
def _latency_model(spec: str) -> Any:
    from memplan.commands.machine import latency_model

    return latency_model(spec)


# ---- running one -------------------------------------------------------------------
def run_scenario(s: SweepTask) -> dict[str, Any]:
    """Run `s` as `memplan compare` runs one planner (NOTE [ Sweep records ])
    and return its record; a `MemplanError` inside is the record's `error`."""
    record: dict[str, Any] = {
        "key": s.key(),
        "identity": s.identity(),
        "version": memplan.__version__,
        "name": s.name(),
        "inputs": s.inputs(),
    }
    try:
        status, reason, metrics = _run(s)
    except MemplanError as e:
        status, reason, metrics = "error", _one_line(str(e)), dict.fromkeys(METRICS)
    return {**record, "status": status, "reason": reason, "metrics": metrics}


def _one_line(text: str) -> str:
    return text.replace("\r", " ").replace("\n", " ")


# NOTE [ Sweep records ]
# One scenario is one `compare_planners` call with one planner, so its
# figures are those `memplan compare --json` prints for that planner (the
# vanilla run, the budget -- a share resolved on the vanilla peak with the
# same allocator, cut to the device's memory as compare does -- the safety
# net, the gap to the best bound). Status: the run's fit (`alone`, `net`,
# `oom`); with no plan, `stopped` when the planner ran out of its limits,
# `error` when it raised or its plan failed the check, `infeasible`
# otherwise. `bound_ms` is the bound `gap` was measured against, read back
# from the gap (iteration / (1 + gap)) rather than computed a second time:
# the window bounds are most of a scenario's time on a large trace. Times
# are in milliseconds, sizes in bytes; a metric not defined
# for the status (the metrics of a run that did not finish) is null. Wall
# time spent planning is not deterministic, so it is not in the record: the
# sweep writes it to `timings.jsonl` (memplan/sweep/store.py).
def _run(s: SweepTask) -> tuple[str, str, dict[str, Any]]:
    from memplan.commands import machine
    from memplan.comparison import compare_planners
    from memplan.hwmodels.device import DeviceModel

    traces = [load_trace(t) for t in s.traces]
    hw = load_profile(s.gpu)
    args = SimpleNamespace(
        budget=s.budget, latency=s.latency, allow_foreign_measurements=False,
        allocator=s.allocator, context_reserve=None, fallback=s.fallback,
    )  # fmt: skip
    machine.check_measured(args, traces, hw)  # type: ignore[arg-type]
    device = DeviceModel(hw, _latency_model(s.latency), lanes=s.lanes)
    budget, cut = machine.resolve_budget_quietly(args, traces, device)  # type: ignore[arg-type]
    comparison = compare_planners(
        traces,
        device,
        [s.planner],
        budget=budget,
        iterations=s.iterations,
        options=_options(s),
        config=machine.run_config(args),  # type: ignore[arg-type]
    )
    (row,) = comparison.rows
    vanilla = comparison.to_dict()["vanilla"]
    metrics: dict[str, Any] = dict.fromkeys(METRICS)
    metrics.update(
        vanilla_ms=_ms(vanilla["iteration_time_s"]),
        vanilla_peak_bytes=vanilla["peak_bytes"],
        budget_bytes=row.budget_bytes,
    )
    status = _status(row)
    if row.finished:
        metrics.update(
            iteration_ms=_ms(row.iteration_time_s),
            peak_bytes=row.peak_bytes,
            msr=finite_or_none(row.msr),
            eor=finite_or_none(row.eor),
            cbr=finite_or_none(row.cbr),
            gap=finite_or_none(row.gap),
            bound_name=row.bound or None,
            stall_ms=_ms(row.stall_s),
            recompute_ms=_ms(row.recompute_s),
            bytes_out=row.bytes_d2h,
            bytes_in=row.bytes_h2d,
            net_evictions=row.evictions,
        )
        if metrics["gap"] is not None:  # gap = (t - bound) / bound: NOTE [ Gap to the bound ]
            metrics["bound_ms"] = metrics["iteration_ms"] / (1 + metrics["gap"])
    reason = "; ".join(x for x in (cut, row.reason) if x)
    return status, _one_line(reason), metrics


def _options(s: SweepTask) -> dict[str, dict[str, Any]]:
    """The planner's options, with the scenario's seed for a planner that has
    a `seed` option the grid leaves unset (NOTE [ SweepTask keys ])."""
    from memplan.comparison import WITNESSES
    from memplan.planners import registry

    given = {k: _plain(v) for k, v in s.options}
    if s.planner not in WITNESSES:
        fields = registry.option_fields(registry.get(s.planner))
        if "seed" in fields and "seed" not in given:
            given["seed"] = s.seed
    return {s.planner: given} if given else {}


def _status(row: Any) -> str:
    from memplan.comparison import Fit
    from memplan.planners.core.plan import Status

    if row.fit != Fit.NO_PLAN:
        return row.fit.value
    if row.result is None:
        return "error" if row.reason.startswith("planner error") else "infeasible"
    if row.reason.startswith("check:"):
        return "error"
    return "stopped" if row.result.status == Status.STOPPED else "infeasible"


def _ms(seconds: float | None) -> float | None:
    x = finite_or_none(seconds)
    return None if x is None else x * 1e3

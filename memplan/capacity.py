"""Capacity: the largest batch or sequence, or the most jobs, that fits a GPU with each
planner, and at what slowdown (NOTE [ Capacity search ]).

The fit test is `memplan compare`'s: plan, check and simulate at the budget
(`comparison.run_planner`), scored against the vanilla run of the same
jobs. What is searched over -- a batch size, or a number of copies of one
job -- is a function `jobs_at(x) -> traces` the caller gives.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from memplan.comparison import UNLIMITED_BYTES, WITNESSES, Fit, planned_jobs, run_planner
from memplan.hwmodels.device import DeviceModel
from memplan.planners.analysis.bounds import peak_lower_bound, start_bytes
from memplan.planners.heuristics.vanilla import vanilla_plan
from memplan.runconfig import DEFAULT_RUN, Fallback, RunConfig
from memplan.sim import SimResult, simulate
from memplan.traces.errors import MemplanError
from memplan.traces.fields import finite_or_none, nan_to_none, record
from memplan.traces.model import Trace
from memplan.traces.scaling import BatchTraces, Check
from memplan.units import format_bytes

# NOTE [ Capacity search ]
# The answer is the largest x that fits: the batch of every job, or (`--jobs auto`) the
# number of copies of one job. A probe is one planner's fit test at one x, as in `memplan
# compare` (`run_planner` with the `--fallback` net): it fits when the run fits alone (or,
# with a fallback, finishes with the net; the witnesses passive and dtr when their run
# finishes) and its EOR against vanilla without a budget is at most `max_eor`. vanilla, the
# reference, is always tested without the net. The ceiling comes first: the largest x whose
# peak lower bound fits (`jobs_bound`, NOTE [ Lower bounds ] in planners/analysis/bounds.py);
# every planner is searched in [lo, ceiling], and lo above it is an error. The fit is taken
# as monotone in x: step up while probes fit (the step doubling from a quarter of the start)
# or halve down while not, then bisect -- about 2 log2(x) probes. vanilla starts from a
# linear estimate, every other planner from the largest answer so far; a planner whose fit
# is not monotone has its probes in the result. Probes at one x share traces, bound and
# vanilla run. Full text: docs/notes.md, "Capacity search".
DEFAULT_ITERATIONS = 2
BOUND = "peak lower bound"  # what `progress` is told while the ceiling is searched


def largest(fits: Callable[[int], bool], lo: int, hi: int, start: int) -> int | None:
    """The largest x in [lo, hi] with `fits(x)`, for `fits` true up to some
    x and false after; None when `fits(lo)` is false (NOTE [ Capacity
    search ]). `fits` is called once per x at most."""
    if not 1 <= lo <= hi:
        raise ValueError(f"lo={lo}, hi={hi}: need 1 <= lo <= hi")
    seen: dict[int, bool] = {}

    def ok(x: int) -> bool:
        if x not in seen:
            seen[x] = fits(x)
        return seen[x]

    x = min(max(start, lo), hi)
    if ok(x):
        good, step = x, max(1, x // 4)
        while True:
            if good == hi:
                return good
            nxt = min(hi, good + step)
            if not ok(nxt):
                bad = nxt
                break
            good, step = nxt, step * 2
    else:
        bad = x
        while True:
            if bad == lo:
                return None
            nxt = max(lo, bad // 2)
            if ok(nxt):
                good = nxt
                break
            bad = nxt
    while bad - good > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


def jobs_bound(traces: Sequence[Trace]) -> int:
    """Bytes no plan can run `traces` together below (NOTE [ Capacity search ])."""
    ops = max(peak_lower_bound(t).nbytes for t in traces)
    return max(ops, sum(start_bytes(t) for t in traces))


def vanilla_trace_peak(traces: Sequence[Trace]) -> int:
    """The jobs' vanilla peaks added up (an estimate: they do not peak at once)."""
    return sum(t.peak()[0] for t in traces)


def estimate(x1: int, p1: int, x2: int, p2: int, budget: int) -> int:
    """The x where the line through (x1, p1) and (x2, p2) reaches `budget`
    (x1 when it does not rise)."""
    if p2 <= p1 or x2 == x1:
        return x1
    return max(1, int(x1 + (budget - p1) * (x2 - x1) / (p2 - p1)))


# ---- results ---------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Probe:
    """One fit test: how its run went (`Fit.BOUND` when the peak lower bound
    is above the budget: not planned); times in seconds."""

    x: int
    fits: bool
    fit: Fit
    peak_bytes: int | None
    iteration_time_s: float
    eor: float
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return record(self)


@dataclass(frozen=True, slots=True)
class Answer:
    """One planner: the largest x that fits (None: none in the range) and the
    probe there, with every probe it took."""

    planner: str
    largest: int | None
    at: Probe | None
    probes: tuple[Probe, ...]
    search_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        at = self.at
        return {
            "planner": self.planner,
            "largest": self.largest,
            "peak_bytes": at.peak_bytes if at else None,
            "eor": nan_to_none(at.eor) if at else None,
            "iteration_time_s": nan_to_none(at.iteration_time_s) if at else None,
            "fit": at.fit.value if at else None,
            "search_s": self.search_s,
            "probes": [p.to_dict() for p in sorted(self.probes, key=lambda p: p.x)],
        }


@dataclass(frozen=True, slots=True)
class Settings:
    """How to test a fit: `budget_bytes` for all jobs together, the EOR cap
    (None: any), simulated iterations, planner options (`PLANNER ->
    ["key=value", ...]`) and how the runs are simulated (`config`: the
    safety net and the memory model, NOTE [ Context reserve ])."""

    planners: tuple[str, ...]
    budget_bytes: int
    max_eor: float | None = None
    iterations: int = DEFAULT_ITERATIONS
    options: dict[str, list[str]] = field(default_factory=dict)
    config: RunConfig = DEFAULT_RUN


@dataclass(frozen=True, eq=False)
class Capacity:
    """The answers of every planner on one axis ("batch", "seq" or "jobs")."""

    axis: str
    jobs: str  # what runs: "resnet50 x2, bert_base" at a batch, or one job
    batch: int | None  # the batch of every job in a jobs or seq search
    hardware: str
    memory_bytes: int
    settings: Settings
    lo: int
    hi: int
    answers: tuple[Answer, ...]
    ceiling: int  # the largest x whose peak lower bound fits the budget
    notes: tuple[str, ...] = ()
    checks: tuple[tuple[str, Check], ...] = ()  # (model, check of its batch scaling)
    captures: int = 0  # traces captured (the rest were scaled)
    context_bytes: int = 0  # one job's CUDA context in the runs (NOTE [ Context reserve ])

    def answer(self, planner: str) -> Answer:
        return next(a for a in self.answers if a.planner == planner)

    def to_dict(self) -> dict[str, Any]:
        s = self.settings
        return {
            "axis": self.axis,
            "jobs": self.jobs,
            "batch": self.batch,
            "hardware": self.hardware,
            "memory_bytes": self.memory_bytes,
            "budget_bytes": s.budget_bytes,
            "fallback": s.config.fallback.value,
            "max_eor": s.max_eor,
            "iterations": s.iterations,
            "allocator": s.config.allocator.value,
            "context_reserve_bytes": self.context_bytes,
            "range": [self.lo, self.hi],
            "ceiling": self.ceiling,
            "answers": [a.to_dict() for a in self.answers],
            "notes": list(self.notes),
            "captures": self.captures,
            "scaling_checks": [
                {"model": m, **c._asdict(), "max_rel_error": finite_or_none(c.max_rel_error)}
                for m, c in self.checks
            ],
        }


# ---- the search ------------------------------------------------------------------------
class Search:
    """Probes of every planner over one axis; traces, bounds and vanilla runs
    are kept per x (NOTE [ Capacity search ])."""

    def __init__(
        self,
        jobs_at: Callable[[int], list[Trace]],
        device: DeviceModel,
        settings: Settings,
        progress: Callable[[str, int], None] | None = None,
        *,
        axis: str = "batch",
    ) -> None:
        self.jobs_at = jobs_at
        self.axis = axis
        self.device = device
        self.settings = settings
        self.progress = progress
        self._traces: dict[int, list[Trace]] = {}
        self._bound: dict[int, int] = {}
        self._vanilla: dict[int, SimResult] = {}

    def traces(self, x: int) -> list[Trace]:
        if x not in self._traces:
            self._traces[x] = self.jobs_at(x)
        return self._traces[x]

    def bound(self, x: int) -> int:
        """The jobs' peak lower bound at `x`, with their CUDA contexts."""
        if x not in self._bound:
            traces = self.traces(x)
            context = self.settings.config.context_bytes(self.device.hw)
            self._bound[x] = jobs_bound(traces) + context * len(traces)
        return self._bound[x]

    def vanilla(self, x: int) -> SimResult:
        if x not in self._vanilla:
            traces = self.traces(x)
            self._vanilla[x] = simulate(
                planned_jobs(traces, [vanilla_plan(t) for t in traces]),
                self.device,
                iterations=self.settings.iterations,
                budget=UNLIMITED_BYTES,
                check=False,
                **self.settings.config.memory,
            )
        return self._vanilla[x]

    def probe(self, planner: str, x: int) -> Probe:
        """`planner`'s fit test at `x` (NOTE [ Capacity search ])."""
        if self.progress is not None:
            self.progress(planner, x)
        s = self.settings
        need = self.bound(x)
        if need > s.budget_bytes:
            why = f"needs at least {need} bytes (peak lower bound), budget {s.budget_bytes}"
            return Probe(x, False, Fit.BOUND, None, math.nan, math.nan, why)
        config = s.config.with_fallback(Fallback.NONE) if planner == "vanilla" else s.config
        row = run_planner(
            planner,
            self.traces(x),
            self.device,
            self.vanilla(x),
            budget=s.budget_bytes,
            iterations=s.iterations,
            options=s.options.get(planner),
            config=config,
        )
        net_ok = config.fallback != Fallback.NONE or planner in WITNESSES
        fits = row.fit == Fit.ALONE or (row.fit == Fit.NET and net_ok)
        reason = row.reason
        if fits and s.max_eor is not None and not row.eor <= s.max_eor:
            fits, reason = False, f"EOR {row.eor:.3f} > {s.max_eor}"
        return Probe(x, fits, row.fit, row.peak_bytes, row.iteration_time_s, row.eor, reason)

    def answer(self, planner: str, lo: int, hi: int, start: int) -> Answer:
        t0 = time.perf_counter()
        probes: dict[int, Probe] = {}

        def fits(x: int) -> bool:
            probes[x] = self.probe(planner, x)
            return probes[x].fits

        best = largest(fits, lo, hi, start)
        at = probes[best] if best is not None else None
        return Answer(planner, best, at, tuple(probes.values()), time.perf_counter() - t0)

    def start(self, anchors: tuple[int, int]) -> int:
        """Where vanilla's search starts: the jobs' vanilla trace peaks at
        the two `anchors`, extrapolated to the budget."""
        (x1, x2), budget = anchors, self.settings.budget_bytes
        p1, p2 = (vanilla_trace_peak(self.traces(x)) for x in anchors)
        return estimate(x1, p1, x2, p2, budget)

    def ceiling(self, lo: int, hi: int, start: int) -> int:
        """The largest x in [lo, hi] whose peak lower bound fits the budget:
        no plan fits above it. MemplanError when not even `lo` can fit."""
        budget = self.settings.budget_bytes

        def under(x: int) -> bool:
            if self.progress is not None:
                self.progress(BOUND, x)
            return self.bound(x) <= budget

        top = largest(under, lo, hi, start)
        if top is None:
            raise MemplanError(
                f"nothing fits: at {at_x(self.axis, lo)} the jobs need at least {format_bytes(self.bound(lo))} "
                f"({self.bound(lo)} B, their peak lower bound), more than the budget of "
                f"{format_bytes(budget)} ({budget} B)"
            )
        return top

    def run(self, lo: int, hi: int, start: int) -> tuple[int, list[Answer]]:
        """(the ceiling, every planner's answer in [lo, ceiling]): each
        search starts at the largest answer so far (vanilla, first, at
        `start`; NOTE [ Capacity search ])."""
        top = self.ceiling(lo, hi, start)
        answers: list[Answer] = []
        for planner in self.settings.planners:
            found = [a.largest for a in answers if a.largest is not None]
            answers.append(self.answer(planner, lo, top, max(found, default=start)))
        return top, answers


def at_x(axis: str, x: int) -> str:
    """`x` on `axis` in words: "batch 8", "seq 512", "8 job(s)"."""
    return f"{x} job(s)" if axis == "jobs" else f"{axis} {x}"


# ---- the three searches ----------------------------------------------------------------
def check_batch(start: int, bases: tuple[int, int], lo: int, hi: int) -> int | None:
    """Where to check batch scaling against a capture: at the start of the
    search (where the answers are likely), else past the bases; None when
    the range has no batch for it."""
    for b in (start, 2 * bases[1]):
        b = min(max(b, lo, 2), hi)
        if b not in bases and b >= 2:
            return b
    return None


def batch_capacity(
    models: Sequence[tuple[str, BatchTraces, int]],
    device: DeviceModel,
    settings: Settings,
    lo: int,
    hi: int,
    progress: Callable[[str, int], None] | None = None,
) -> Capacity:
    """The largest batch of every job, per planner: `models` are (name, its
    traces, copies), all at one batch. Each model's scaling is checked
    against a capture where the search starts (NOTE [ Batch scaling ])."""

    def jobs_at(batch: int) -> list[Trace]:
        out: list[Trace] = []
        for _, traces, copies in models:
            out += [traces.trace(batch).trace] * copies
        return out

    search = Search(jobs_at, device, settings, progress)
    start = search.start(models[0][1].bases)
    checks = []
    for name, traces, _ in models:
        b = check_batch(start, traces.bases, lo, hi)
        if b is not None and traces.scaling:
            checks.append((name, traces.check(b)))
    top, answers = search.run(lo, hi, start)
    notes = [f"{name}: {line}" for name, traces, _ in models for line in traces.notes]
    return _capacity(
        search,
        lo,
        hi,
        top,
        answers,
        jobs=_describe((name, n) for name, _, n in models),
        batch=None,
        notes=tuple(notes),
        checks=tuple(checks),
        captures=sum(t.captures for _, t, _ in models),
    )


def jobs_capacity(
    trace: Trace,
    name: str,
    device: DeviceModel,
    settings: Settings,
    lo: int,
    hi: int,
    progress: Callable[[str, int], None] | None = None,
) -> Capacity:
    """The most copies of the job `trace` (at its batch) that fit together,
    per planner, in [lo, hi]."""
    search = Search(lambda n: [trace] * n, device, settings, progress, axis="jobs")
    start = search.start((1, 2))
    top, answers = search.run(lo, hi, start)
    return _capacity(search, lo, hi, top, answers, jobs=name, batch=trace.meta.batch_size)


# NOTE [ Capacity over the sequence ]
# `--axis seq` searches the tokens per sequence of a model that takes one (hf:), every job
# at one given batch, with the probes, ceiling and order of NOTE [ Capacity search ] and x
# the sequence length. Every trace is captured at its own sequence length; none is scaled:
# bytes are affine in the sequence plus quadratic where attention is math (seq x seq
# scores), so NOTE [ Batch scaling ]'s two-point fit does not hold, and a fit across three
# captures checked against a fourth is not built yet. Capturing is exact; a search costs
# about 2 log2(seq) captures per model, shared by every planner (traces are kept per x).
# vanilla starts from the line through the vanilla peaks at LO and 2 LO: an over-estimate
# where attention is quadratic, from which the search halves down.
def seq_capacity(
    name: str,
    capture_at: Callable[[int], Trace],
    device: DeviceModel,
    settings: Settings,
    seqs: tuple[int, int],
    *,
    batch: int,
    copies: int = 1,
    progress: Callable[[str, int], None] | None = None,
) -> Capacity:
    """The longest sequence of `copies` jobs of the model `name` at `batch`
    that fits, per planner, in `seqs` (lo, hi): `capture_at(seq)` is its
    trace at that sequence length (NOTE [ Capacity over the sequence ])."""
    lo, hi = seqs
    captured: list[int] = []

    def jobs_at(seq: int) -> list[Trace]:
        captured.append(seq)
        return [capture_at(seq)] * copies

    search = Search(jobs_at, device, settings, progress, axis="seq")
    start = search.start((lo, min(hi, 2 * lo)))
    top, answers = search.run(lo, hi, start)
    jobs = _describe([(name, copies)])
    return _capacity(search, lo, hi, top, answers, jobs=jobs, batch=batch, captures=len(captured))


def _capacity(
    search: Search, lo: int, hi: int, top: int, answers: list[Answer], **fields: Any
) -> Capacity:
    """The `Capacity` of a finished search: its axis, device and settings,
    plus `fields` (jobs, batch, and what the axis adds)."""
    s, hw = search.settings, search.device.hw
    return Capacity(
        axis=search.axis,
        hardware=hw.name,
        memory_bytes=hw.memory_bytes,
        settings=s,
        lo=lo,
        hi=hi,
        answers=tuple(answers),
        ceiling=top,
        context_bytes=s.config.context_bytes(hw),
        **fields,
    )


def _describe(jobs: Any) -> str:
    return ", ".join(name if n == 1 else f"{name} x{n}" for name, n in jobs)

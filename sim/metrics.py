"""What a simulation measured: per-job results, the memory curve, the log,
and TENSILE's metrics of a planned run against the vanilla run.

TENSILE (§V): MSR = (VMP - EMP) / VMP is the memory saving ratio of the
experiment's memory peak EMP against the vanilla peak VMP; EOR = ETC / VTC the
ratio of the experiment's time cost to the vanilla one; CBR = MSR / EOR the
cost-benefit ratio. Per job the peak is the job's own and the time cost its
wall time from arrival to end; in total the peak is the global one and the
time cost the makespan.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from memplan.sim.errors import SimError
from memplan.sim.log import Log, Rows
from memplan.sim.model import GpuModel
from memplan.sim.state import Allocator, JobState, OomPolicy
from memplan.traces.fields import nan_to_none
from memplan.traces.model import BUFFER_KINDS, Trace


@dataclass(frozen=True, slots=True)
class JobResult:
    """One job. Times in seconds, sizes in bytes. `iteration_time_s` is the
    steady state: the mean of the iterations after the first (the first alone
    if only one ran; NaN after an OOM). `oom_at` is (iteration, op, buffer)
    of the allocation that failed, op -1 at the start of an iteration.

    What the OOM policy -- the safety net under a plan -- did, summed over
    all iterations (NOTE [ Out of memory ] in sim/memory.py):
    - `evictions`, `evicted_bytes`: the job's buffers the policy evicted to
      make room (for this job or another), whatever the way: a swap-out, a
      discard of a device copy with a valid host copy, a `dtr` drop;
    - `passive_swaps`: the policy's transfers of this job's buffers: its
      evictions that copy or discard, and every on-demand fetch of an
      absent buffer with a host copy (which every policy does);
    - `remat_s`: compute time of `dtr`'s remakes (NOTE [ DTR ]);
    - `stall_s`: compute waiting, for planned copies and for memory
      (evictions by copy included); `recompute_s`: compute time of re-run
      ops, the plan's recomputes and `remat_s` both.

    Device memory (NOTE [ Device peaks ]): `peak_bytes` counts what the
    memory curve does (buffers, workspaces, the context);
    `allocated_peak_bytes` and `reserved_peak_bytes` the job's allocator
    without its context; `device_peak_bytes` the reserve and the context,
    what the budget is held against; `pinned_peak_bytes` the most host
    bytes its plan parked (NOTE [ Pinned host memory ] in sim/memory.py)."""

    index: int
    name: str
    iteration_times_s: tuple[float, ...]
    iteration_time_s: float
    start_s: float
    end_s: float
    peak_bytes: int
    stall_s: float
    recompute_s: float
    bytes_h2d: int
    bytes_d2h: int
    passive_swaps: int
    oom: bool
    oom_at: tuple[int, int, int] | None = None
    evictions: int = 0
    evicted_bytes: int = 0
    remat_s: float = 0.0
    allocated_peak_bytes: int = 0
    reserved_peak_bytes: int = 0
    device_peak_bytes: int = 0
    pinned_peak_bytes: int = 0
    # NOTE [ Plan changes at a boundary ] in sim/boundary.py: per iteration
    # completed, the plan in force (0: the job's own); (iteration, ready_s,
    # reason) of each change applied
    plan_versions: tuple[int, ...] = ()
    plan_changes: tuple[tuple[int, float, str], ...] = ()
    departed: bool = False  # left at its departure_s (NOTE [ Departures ] in sim/dynamics.py)

    @property
    def time_s(self) -> float:
        """Wall time from arrival to end."""
        return self.end_s - self.start_s

    @property
    def net_used(self) -> bool:
        """The OOM policy acted: it evicted, fetched or remade something. A
        job that ran to its end with this False fit on its own."""
        return bool(self.evictions or self.passive_swaps or self.remat_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "iteration_time_s": nan_to_none(self.iteration_time_s),
            "iteration_times_s": list(self.iteration_times_s),
            "peak_bytes": self.peak_bytes,
            "stall_s": self.stall_s,
            "recompute_s": self.recompute_s,
            "bytes_h2d": self.bytes_h2d,
            "bytes_d2h": self.bytes_d2h,
            "passive_swaps": self.passive_swaps,
            "evictions": self.evictions,
            "evicted_bytes": self.evicted_bytes,
            "remat_s": self.remat_s,
            "allocated_peak_bytes": self.allocated_peak_bytes,
            "reserved_peak_bytes": self.reserved_peak_bytes,
            "device_peak_bytes": self.device_peak_bytes,
            "pinned_peak_bytes": self.pinned_peak_bytes,
            "net_used": self.net_used,
            "oom": self.oom,
            "oom_at": list(self.oom_at) if self.oom_at else None,
            "start_s": self.start_s,
            "end_s": nan_to_none(self.end_s),
            "departed": self.departed,
            "plan_versions": list(self.plan_versions),
            "plan_changes": [list(x) for x in self.plan_changes],
        }


@dataclass(frozen=True, eq=False)
class MemoryCurve:
    """Device bytes after every change, in time order (several samples may
    share a time: the last one holds from then on). `by_kind[:, k]` counts the
    buffers of kind `BUFFER_KINDS[k]` (made when first read: NOTE [ The curve
    by kind ]), `by_job[:, j]` those of job j."""

    t_s: np.ndarray
    bytes: np.ndarray
    by_job: np.ndarray
    kind: np.ndarray = field(repr=False)  # per sample: the kind index of its buffer
    delta: np.ndarray = field(repr=False)  # per sample: +/- bytes

    @classmethod
    def from_samples(cls, samples: Rows, n_jobs: int) -> MemoryCurve:
        """From the pool's samples: rows of (time_us, job, kind index, +/- bytes)."""
        t_us, cols = samples.columns()
        job, kind, delta = cols[:, 0], cols[:, 1], cols[:, 2]
        by_job = _running_sums(job, delta, n_jobs)
        return cls(t_us / 1e6, np.cumsum(delta), by_job, kind, delta)

    @functools.cached_property
    def by_kind(self) -> np.ndarray:
        return _running_sums(self.kind, self.delta, len(BUFFER_KINDS))


def _running_sums(which: np.ndarray, delta: np.ndarray, n: int) -> np.ndarray:
    """int64[m, n]: column c the running sum of the deltas whose `which` is c."""
    out = np.zeros((len(delta), n), np.int64)
    out[np.arange(len(delta)), which] = delta
    return np.cumsum(out, axis=0, out=out)


# NOTE [ The curve by kind ]
# `by_kind` was a samples x kinds matrix and its running sum, 2 x 48 bytes a
# sample: on a 30k-op step run 3 iterations (204k samples), 20 MB of fresh
# memory that only a figure (the memory timeline's stack) reads. Made in
# every `simulate`, it cost each call of a search loop its time and the page
# faults of that memory (0.04-0.14 a simulated op from 3k to 30k ops, as the
# C allocator gave the memory back between calls; none at 1k). It is made
# when first read instead, from the samples' kinds and deltas the curve
# keeps, and summed in place as `by_job` is: no page faults after the first
# call at any size, and building the result fell from 0.28-0.34 us a
# simulated op to 0.22-0.25 (three runs, old and new alternated, 1k to 30k
# ops).


@dataclass(frozen=True, eq=False)
class SimResult:
    """Everything `simulate` measured. `n_events` counts SimPy events;
    `traces` are the jobs' traces (to name ops and buffers in timelines).
    Device memory of all jobs together as in `JobResult` (NOTE [ Device
    peaks ]), with `fragmentation_bytes`, and `context_reserve_bytes` per job."""

    jobs: tuple[JobResult, ...]
    peak_bytes: int
    budget_bytes: int
    makespan_s: float
    memory: MemoryCurve
    log: Log  # a sequence of LogEntry (NOTE [ A flat log ] in sim/log.py)
    hardware: str
    lanes: tuple[str, ...]
    oom_policy: OomPolicy
    n_events: int
    seed: int
    traces: tuple[Trace, ...] = ()
    allocator: Allocator = Allocator.EXACT
    context_reserve_bytes: int = 0
    allocated_peak_bytes: int = 0
    reserved_peak_bytes: int = 0
    fragmentation_bytes: int = 0
    device_peak_bytes: int = 0
    pinned_peak_bytes: int = 0
    # (seconds, bytes) after each change of the device bytes under an
    # allocator model: reserved (or pools) plus contexts; None with exact
    device_curve: tuple[np.ndarray, np.ndarray] | None = None

    @property
    def oom(self) -> bool:
        return any(j.oom for j in self.jobs)

    def to_dict(self) -> dict[str, Any]:
        """The summary (no log, no curve) as JSON values."""
        return {
            "hardware": self.hardware,
            "lanes": list(self.lanes),
            "oom_policy": self.oom_policy.value,
            "budget_bytes": self.budget_bytes,
            "peak_bytes": self.peak_bytes,
            "allocator": self.allocator.value,
            "context_reserve_bytes": self.context_reserve_bytes,
            "allocated_peak_bytes": self.allocated_peak_bytes,
            "reserved_peak_bytes": self.reserved_peak_bytes,
            "fragmentation_bytes": self.fragmentation_bytes,
            "device_peak_bytes": self.device_peak_bytes,
            "pinned_peak_bytes": self.pinned_peak_bytes,
            "makespan_s": self.makespan_s,
            "events": self.n_events,
            "seed": self.seed,
            "jobs": [j.to_dict() for j in self.jobs],
        }


def _job_result(s: JobState, peak: int, dev: tuple[int, int, int]) -> JobResult:
    spans_us = [e - b for b, e in zip(s.iter_start_us, s.iter_end_us, strict=False)]
    if s.oom is not None or not spans_us:
        steady = math.nan
    elif len(spans_us) == 1:
        steady = spans_us[0] / 1e6
    else:
        steady = sum(spans_us[1:]) / (len(spans_us) - 1) / 1e6
    return JobResult(
        index=s.c.index,
        name=s.c.name,
        iteration_times_s=tuple(x / 1e6 for x in spans_us),
        iteration_time_s=steady,
        start_s=s.start_us / 1e6,
        end_s=s.end_us / 1e6,
        peak_bytes=peak,
        stall_s=s.stall_us / 1e6,
        recompute_s=s.recompute_us / 1e6,
        bytes_h2d=s.bytes_h2d,
        bytes_d2h=s.bytes_d2h,
        passive_swaps=s.passive,
        oom=s.oom is not None,
        oom_at=s.oom,
        evictions=s.evictions,
        evicted_bytes=s.evicted_bytes,
        remat_s=s.remat_us / 1e6,
        allocated_peak_bytes=dev[0],
        reserved_peak_bytes=dev[1],
        device_peak_bytes=dev[2],
        pinned_peak_bytes=s.parked_peak,
        plan_versions=tuple(s.plan_versions[: len(spans_us)]) or (0,) * len(spans_us),
        plan_changes=tuple(s.plan_changes),
        departed=s.departed,
    )


def build_result(model: GpuModel, hardware: str, seed: int) -> SimResult:
    mem = model.mem
    curve = MemoryCurve.from_samples(mem.samples, len(model.jobs))
    job_peaks = curve.by_job.max(axis=0) if len(curve.t_s) else np.zeros(len(model.jobs), np.int64)
    view = device_view(model, curve)
    jobs = tuple(
        _job_result(s, int(job_peaks[s.c.index]), view.jobs[s.c.index]) for s in model.jobs
    )
    ends = [s.end_us for s in model.jobs if not math.isnan(s.end_us)]
    return SimResult(
        jobs=jobs,
        peak_bytes=int(curve.bytes.max(initial=0)),
        budget_bytes=mem.budget,
        makespan_s=max(ends, default=0.0) / 1e6,
        memory=curve,
        log=model.log,
        hardware=hardware,
        lanes=model.pcie.names,
        oom_policy=model.policy,
        n_events=model.n_events,
        seed=seed,
        traces=tuple(s.c.trace for s in model.jobs),
        allocator=model.allocator,
        context_reserve_bytes=model.context_bytes,
        allocated_peak_bytes=view.allocated,
        reserved_peak_bytes=view.reserved,
        fragmentation_bytes=view.fragmentation,
        device_peak_bytes=view.device,
        pinned_peak_bytes=mem.parked_peak,
        device_curve=view.curve,
    )


# ---- device memory -------------------------------------------------------------
# NOTE [ Device peaks ]
# Per job and for the device, in bytes:
# - allocated: exact, the buffers and workspaces (the memory curve without
#   the contexts); caching, the allocator's blocks, counted whole (PyTorch's
#   `allocated_bytes`); smartpool, the most bytes live at once (a job: its
#   layout's lower bound; the device: the curve without the contexts);
# - reserved: exact, as allocated; caching, the segments; smartpool, the
#   pools' footprints of the jobs running at once;
# - device: reserved plus the contexts (exact: the memory curve), the
#   figure the budget is held against and TENSILE's metrics compare;
# - fragmentation (device only): caching, reserved - allocated at the
#   reserved peak (the most allocated while reserved stays at its peak);
#   smartpool, reserved - allocated (the layout over its bound); exact, 0.
# The device's peaks are peaks over time, not sums of the jobs' peaks.
@dataclass(frozen=True, slots=True)
class DeviceView:
    """(allocated, reserved, device) peaks per job, and the device's, with
    its curve (seconds, bytes) under an allocator model."""

    jobs: tuple[tuple[int, int, int], ...]
    allocated: int
    reserved: int
    fragmentation: int
    device: int
    curve: tuple[np.ndarray, np.ndarray] | None = None


def device_view(model: GpuModel, curve: MemoryCurve) -> DeviceView:
    """The peaks of NOTE [ Device peaks ]. Under smartpool this admits the
    jobs' pools too, marking a job whose pool does not fit out of memory
    (NOTE [ SmartPool in the simulator ] in sim/simulate.py)."""
    if model.allocator is Allocator.CACHING:
        return _caching_view(model)
    tensors, by_job = _without_contexts(model, curve)
    if model.allocator is Allocator.SMARTPOOL:
        return _smartpool_view(model, by_job)
    n = len(model.jobs)
    dev = curve.by_job.max(axis=0) if len(curve.t_s) else np.zeros(n, np.int64)
    own = by_job.max(axis=0) if len(curve.t_s) else np.zeros(n, np.int64)
    jobs = tuple((int(own[j]), int(own[j]), int(dev[j])) for j in range(n))
    peak = int(tensors.max(initial=0))
    return DeviceView(jobs, peak, peak, 0, int(curve.bytes.max(initial=0)))


def _without_contexts(model: GpuModel, curve: MemoryCurve) -> tuple[np.ndarray, np.ndarray]:
    """The memory curve, in total and by job, without the jobs' contexts."""
    rows = model.mem.context_rows
    if not rows:
        return curve.bytes, curve.by_job
    at = np.array(rows, np.int64)
    delta = np.diff(curve.bytes, prepend=0)
    ctx = np.zeros_like(delta)
    ctx[at] = delta[at]
    by_job = np.zeros_like(curve.by_job)
    by_job[at, [model.mem.samples[r][1] for r in rows]] = delta[at]
    return curve.bytes - np.cumsum(ctx), curve.by_job - np.cumsum(by_job, axis=0)


def _caching_view(model: GpuModel) -> DeviceView:
    books = model.mem.caching
    assert books is not None  # the pool of a run under `caching` keeps its ledger
    total = peak = 0
    own = [0] * len(model.jobs)
    own_peak = [0] * len(model.jobs)
    for _t, j, d in books.device_samples:
        total += d
        own[j] += d
        peak = max(peak, total)
        own_peak[j] = max(own_peak[j], own[j])
    jobs = tuple(
        (a.peak_allocated, a.peak_reserved, own_peak[j]) for j, a in enumerate(books.backs)
    )
    frag = books.reserved_peak - books.allocated_at_peak
    curve = _curve([(t, d) for t, _j, d in books.device_samples])
    return DeviceView(jobs, books.allocated_peak, books.reserved_peak, frag, peak, curve)


def _curve(changes: list[tuple[float, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, bytes after each change) from (time_us, +/- bytes) in order."""
    t = np.fromiter((x[0] for x in changes), np.float64, len(changes)) / 1e6
    d = np.fromiter((x[1] for x in changes), np.int64, len(changes))
    return t, np.cumsum(d)


def _smartpool_view(model: GpuModel, by_job: np.ndarray) -> DeviceView:
    mem = model.mem
    assert mem.ledger is not None  # the pool of a run under `smartpool` keeps its ledger
    ctx, budget = model.context_bytes, mem.budget
    lays = [back.layout() for back in mem.ledger.backs]
    running: list[tuple[float, int]] = []  # (end_us, bytes) of the admitted jobs
    steps: list[tuple[float, int, int]] = []  # (time_us, +/- device, +/- footprint)
    for s in sorted(model.jobs, key=lambda s: (s.start_us, s.c.index)):
        t, fp = s.start_us, lays[s.c.index].footprint
        running = [(e, x) for e, x in running if e > t]
        if sum(x for _e, x in running) + fp + ctx > budget:
            if s.oom is None:  # its pool cannot be made
                s.oom = (0, -1, -1)
            continue
        running.append((s.end_us, fp + ctx))
        steps += [(t, fp + ctx, fp), (s.end_us, -fp - ctx, -fp)]
    device = reserved = dev_now = res_now = 0
    steps.sort()  # at equal times the ends (negative) first
    for _t, d, r in steps:
        dev_now += d
        res_now += r
        device, reserved = max(device, dev_now), max(reserved, res_now)
    admitted = [s.c.index for s in model.jobs if s.oom != (0, -1, -1)]
    allocated = int(by_job[:, admitted].sum(axis=1).max(initial=0)) if len(by_job) else 0
    jobs = tuple((lay.live_peak, lay.footprint, lay.footprint + ctx) for lay in lays)
    curve = _curve([(t, d) for t, d, _r in steps])
    return DeviceView(jobs, allocated, reserved, max(0, reserved - allocated), device, curve)


# ---- TENSILE's metrics ---------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Metrics:
    """Peaks in bytes, time costs in seconds; NaN when either run hit an OOM."""

    vmp_bytes: int
    emp_bytes: int
    vtc_s: float
    etc_s: float
    msr: float
    eor: float
    cbr: float

    @classmethod
    def of(cls, vmp: int, emp: int, vtc: float, etc: float, valid: bool = True) -> Metrics:
        nan = math.nan
        msr = (vmp - emp) / vmp if valid and vmp > 0 else nan
        eor = etc / vtc if valid and vtc > 0 else nan
        cbr = msr / eor if not (math.isnan(msr) or math.isnan(eor)) and eor > 0 else nan
        return cls(vmp, emp, vtc, etc, msr, eor, cbr)


@dataclass(frozen=True, slots=True)
class Savings:
    """TENSILE's metrics of a planned run against the vanilla run of the same
    jobs: per job, and in total (global peak, makespan)."""

    jobs: tuple[Metrics, ...]
    total: Metrics


def savings(vanilla: SimResult, planned: SimResult) -> Savings:
    """TENSILE's MSR, EOR and CBR of `planned` against `vanilla` (the same
    jobs on the same hardware), per job and in total."""
    if len(vanilla.jobs) != len(planned.jobs):
        raise SimError(
            f"savings: the vanilla run has {len(vanilla.jobs)} jobs, "
            f"the planned run {len(planned.jobs)}"
        )
    per_job = tuple(
        Metrics.of(
            v.device_peak_bytes, p.device_peak_bytes, v.time_s, p.time_s, not (v.oom or p.oom)
        )
        for v, p in zip(vanilla.jobs, planned.jobs, strict=True)
    )
    total = Metrics.of(
        vanilla.device_peak_bytes,
        planned.device_peak_bytes,
        vanilla.makespan_s,
        planned.makespan_s,
        not (vanilla.oom or planned.oom),
    )
    return Savings(per_job, total)

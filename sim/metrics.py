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

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from memplan.sim.errors import SimError
from memplan.sim.log import LogEntry
from memplan.sim.model import GpuModel
from memplan.sim.state import JobState, OomPolicy
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
      ops, the plan's recomputes and `remat_s` both."""

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
        def num(x: float) -> float | None:
            return None if math.isnan(x) else x

        return {
            "name": self.name,
            "iteration_time_s": num(self.iteration_time_s),
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
            "net_used": self.net_used,
            "oom": self.oom,
            "oom_at": list(self.oom_at) if self.oom_at else None,
            "start_s": self.start_s,
            "end_s": num(self.end_s),
        }


@dataclass(frozen=True, eq=False)
class MemoryCurve:
    """Device bytes after every change, in time order (several samples may
    share a time: the last one holds from then on). `by_kind[:, k]` counts the
    buffers of kind `BUFFER_KINDS[k]`, `by_job[:, j]` those of job j."""

    t_s: np.ndarray
    bytes: np.ndarray
    by_kind: np.ndarray
    by_job: np.ndarray

    @classmethod
    def from_samples(cls, samples: list[tuple[float, int, int, int]], n_jobs: int) -> MemoryCurve:
        m = len(samples)
        t = np.fromiter((x[0] for x in samples), np.float64, m) / 1e6
        job = np.fromiter((x[1] for x in samples), np.int64, m)
        kind = np.fromiter((x[2] for x in samples), np.int64, m)
        delta = np.fromiter((x[3] for x in samples), np.int64, m)
        rows = np.arange(m)
        by_kind = np.zeros((m, len(BUFFER_KINDS)), np.int64)
        by_kind[rows, kind] = delta
        by_job = np.zeros((m, n_jobs), np.int64)
        by_job[rows, job] = delta
        return cls(t, np.cumsum(delta), np.cumsum(by_kind, 0), np.cumsum(by_job, 0))


@dataclass(frozen=True, eq=False)
class SimResult:
    """Everything `simulate` measured. `n_events` counts SimPy events;
    `traces` are the jobs' traces (to name ops and buffers in timelines)."""

    jobs: tuple[JobResult, ...]
    peak_bytes: int
    budget_bytes: int
    makespan_s: float
    memory: MemoryCurve
    log: tuple[LogEntry, ...]
    hardware: str
    lanes: tuple[str, ...]
    oom_policy: OomPolicy
    n_events: int
    seed: int
    traces: tuple[Trace, ...] = ()

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
            "makespan_s": self.makespan_s,
            "events": self.n_events,
            "seed": self.seed,
            "jobs": [j.to_dict() for j in self.jobs],
        }


def _job_result(s: JobState, peak: int) -> JobResult:
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
    )


def build_result(model: GpuModel, hardware: str, seed: int) -> SimResult:
    mem = model.mem
    curve = MemoryCurve.from_samples(mem.samples, len(model.jobs))
    job_peaks = curve.by_job.max(axis=0) if len(curve.t_s) else np.zeros(len(model.jobs), np.int64)
    jobs = tuple(_job_result(s, int(job_peaks[s.c.index])) for s in model.jobs)
    ends = [s.end_us for s in model.jobs if not math.isnan(s.end_us)]
    return SimResult(
        jobs=jobs,
        peak_bytes=int(curve.bytes.max(initial=0)),
        budget_bytes=mem.budget,
        makespan_s=max(ends, default=0.0) / 1e6,
        memory=curve,
        log=tuple(model.log),
        hardware=hardware,
        lanes=model.pcie.names,
        oom_policy=model.policy,
        n_events=model.n_events,
        seed=seed,
        traces=tuple(s.c.trace for s in model.jobs),
    )


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
        Metrics.of(v.peak_bytes, p.peak_bytes, v.time_s, p.time_s, not (v.oom or p.oom))
        for v, p in zip(vanilla.jobs, planned.jobs, strict=True)
    )
    total = Metrics.of(
        vanilla.peak_bytes,
        planned.peak_bytes,
        vanilla.makespan_s,
        planned.makespan_s,
        not (vanilla.oom or planned.oom),
    )
    return Savings(per_job, total)

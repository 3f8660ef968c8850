"""The replay device as the simulator sees it: per-op latencies measured by a
vanilla replay, and a hardware profile whose copy lane is the replay's own.

Host memory: a CPU replay should allocate as a device's caching allocator
does, without page faults on reused sizes; the CLI and the benchmark call
`cache_host_allocations` once at start, and `validate_plan` leaves it to its
caller (NOTE [ Host allocations ] in `hwmodels/hostmem.py`)."""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import numpy as np
import torch
from memplan.hwmodels.device import DeviceModel
from memplan.hwmodels.latency import Fixed
from memplan.hwmodels.microbench import measure_copy
from memplan.hwmodels.profile import Hardware, load_hardware
from memplan.planners.core.plan import Plan, SwapIn, SwapOut, fingerprint_of
from memplan.traces.model import BufferKind, Trace
from memplan.validate.errors import ValidationError
from memplan.validate.replay.result import ReplayResult

# NOTE [ What the simulator is told ]
# The simulator predicts a replay, so every figure it gets is measured on the replay, never
# taken from a datasheet:
# - Op latency (`Fixed`): per op, the least call time over the steady iterations, plus the
#   replay's per-op harness cost spread evenly over the ops, so a vanilla replay is
#   predicted at its measured best and what is left to predict is what the plan adds
#   (NOTE [ Steady figures ] in `validate/calibrate/report.py`).
# - Lane bandwidth: the throttle when given (NOTE [ Throttled copies ] in
#   `validate/replay/lanes.py`), else `hwmodels.microbench.measure_copy`.
# - Fixed cost per transfer: from a probe replay (NOTE [ The lane probe ]), which covers the
#   lane thread's wake-up and bookkeeping, not the microbenchmark's memcpy.
# - Memory: the machine's RAM or the card's; replays and simulation run without a budget.
# Full text: docs/notes.md, "What the simulator is told".

# NOTE [ The lane probe ]
# A probe replay swaps up to `PROBE_SWAPS` buffers (the largest gaps of activations first,
# then parameters if too few) out after one access and back just before the next. The fixed
# cost is the median over its transfers of how late each ended after the link's own schedule
# (start: the later of its ready time and the link's previous scheduled end; length:
# `nbytes / bandwidth`), at least 0: the lane thread's wake-up, GIL wait and bookkeeping. It moves
# the trace's own sizes through the replay's own lanes; a trace without such buffers gets no
# probe and a cost of 0. It runs as often as the plan is sampled, each after a vanilla
# replay; the least contended pair gives the figure (NOTE [ Contention ]), and again in every
# bracket (NOTE [ Paired runs ] in `validate/calibrate/brackets.py`), where it is pooled, for
# NOTE [ Transfers cost the compute thread too ]. The simulator adds the cost to every
# copy's time and so also holds the lane for it, which the emulated link does not: a lane
# busy back to back is predicted slower by that much per copy.
# What it replaced, and the measurements behind `PROBE_SWAPS`: docs/notes.md, "The lane probe".

# NOTE [ Transfers cost the compute thread too ]
# Queueing a copy runs on the compute thread, and the lane thread's Python (holding the GIL)
# and, on CPU, its memcpy take from it: ops wait for the GIL and share cores and memory
# bandwidth. The simulator's copy engine costs compute nothing, so the cost is put into the
# latencies: per transfer, on the op whose end triggers it. Its size: what the compute
# thread of the probe replay takes in its best steady iteration, stalls aside, beyond the
# vanilla replay run just before it (`busy_s`), per transfer; the median over the samples,
# pooled over the whole validation (the pairs before planning and one per bracket after),
# because the cost swings between regimes lasting seconds. Whole iterations, not each op's
# least time (the lane thread slows a different op each iteration); wall time, as GIL waits
# count. Sizes, regimes and what else was tried: docs/notes.md, same title.

# NOTE [ Contention ]
# The machine is shared: while another process holds the cores, the replay's
# compute thread is runnable but not running, and its ops take 2-3x their time
# (here: on-CPU time of a replay steady within 10%, wall time 1-2.5x). Linux
# counts that time per thread (`/proc/thread-self/schedstat`, the second
# field: nanoseconds waiting on a run queue). `Sample.contention` is that wait
# over the wall time of a replay, of the calling thread -- the one that runs
# the ops. The lane probe's fixed cost comes from its least contended sample;
# plan replays are picked by `drift` (and by how well their bracket's probe
# agrees with the pooled cost per transfer) instead (NOTE [ Paired runs ] in
# `validate/calibrate/brackets.py`), which also sees a slowdown no thread waits for (a
# sibling vCPU's load). Both are reported with the figures, as the caveat to
# read them by. Where schedstat is missing, contention is NaN.


PROBE_SWAPS = 16
PROBE_KINDS = (BufferKind.ACTIVATION, BufferKind.PARAM)  # what plans swap most
PROBE_ITERATIONS = 6
T = TypeVar("T")


def _run_queue_s() -> float:
    """Seconds the calling thread has waited for a CPU (NaN if unknown)."""
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) * 1e-9
    except (OSError, IndexError, ValueError):
        return math.nan


@dataclass(frozen=True, slots=True)
class Sample(Generic[T]):
    """What `fn` returned, the share of its wall time the calling thread
    spent waiting for a CPU (NOTE [ Contention ]), and the CPU seconds the
    calling thread used meanwhile."""

    value: T
    contention: float
    cpu_s: float = math.nan


def sampled(fn: Callable[[], T]) -> Sample[T]:
    q0, c0, t0 = _run_queue_s(), time.thread_time(), time.perf_counter()
    value = fn()
    wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
    return Sample(value, (_run_queue_s() - q0) / wall if wall > 0 else math.nan, cpu)


def quietest(samples: list[Sample[T]]) -> Sample[T]:
    """The least contended sample (the first one when contention is unknown)."""
    known = [s for s in samples if not math.isnan(s.contention)]
    return min(known, key=lambda s: s.contention) if known else samples[0]


@dataclass(frozen=True, slots=True)
class LaneModel:
    """A replay lane: bytes/s, and seconds every transfer pays on top of its
    bytes on the lane (`fixed_s`) and on the compute thread (`compute_s`,
    NOTE [ Transfers cost the compute thread too ]). `throttled`: the
    bandwidth is the executor's throttle, not measured. `probes`: how many
    transfers the fixed cost is the median of."""

    bandwidth_bytes_per_s: float
    fixed_s: float
    throttled: bool
    probes: int
    compute_s: float = 0.0
    compute_samples: tuple[float, ...] = ()  # per pair: what `compute_s` is the median of

    def pooled(self, more: list[float]) -> LaneModel:
        """This lane with `compute_s` the median over its own samples and
        `more` (NOTE [ Transfers cost the compute thread too ])."""
        samples = (*self.compute_samples, *more)
        if not samples:
            return self
        median = max(statistics.median(samples), 0.0)
        return dataclasses.replace(self, compute_s=median, compute_samples=samples)


@dataclass(frozen=True, slots=True)
class Measurement:
    """What vanilla replays measured: per-op seconds (call + harness share,
    NOTE [ What the simulator is told ]), the hardware profile of the replay
    device, and the compute-thread seconds each transfer costs."""

    hardware: Hardware
    op_seconds: np.ndarray  # float64[n_ops]
    overhead_s: float  # the harness share included in every op, seconds
    iteration_s: float  # the vanilla replay's median steady iteration
    compute_s: float = 0.0  # per transfer, on the op that triggers it

    def device(self, lanes: int = 1, *, scale: float = 1.0) -> DeviceModel:
        """The replay device as planners and the simulator cost it: the
        measured latencies (times `scale`), the lane's figures in the
        profile, and each planned transfer's compute-thread cost as the
        device's `extra_per_transfer_s` (NOTE [ Transfers cost the compute
        thread too ]): the simulator charges it to the op that triggers the
        copy, not a latency folded by hand."""
        return DeviceModel(
            self.hardware,
            Fixed(self.op_seconds * scale),
            lanes,
            extra_per_transfer_s=self.compute_s,
        )


def steady(values: np.ndarray) -> np.ndarray:
    """The rows of a per-iteration array after the first (the first alone if
    only one ran): warm-up excluded, as the simulator's steady time does."""
    return values[1:] if len(values) > 1 else values


def op_latencies(*vanilla: ReplayResult) -> tuple[np.ndarray, float, float]:
    """(per-op seconds, per-op harness seconds, best steady iteration) of
    vanilla replays; see NOTE [ What the simulator is told ]."""
    ops = np.min([steady(v.op_seconds).min(axis=0) for v in vanilla], axis=0)
    iteration = min(best_iteration(v) for v in vanilla)
    n = max(len(ops), 1)
    overhead = max(iteration - float(ops.sum()), 0.0) / n
    return ops + overhead, overhead, iteration


def best_iteration(result: ReplayResult) -> float:
    """The least steady iteration time of a replay (NOTE [ Steady figures ]
    in `validate/calibrate/report.py`)."""
    return float(steady(result.iteration_seconds).min())


def probe_plan(trace: Trace, max_swaps: int = PROBE_SWAPS) -> Plan | None:
    """NOTE [ The lane probe ]: swap-outs after one access of an activation
    (then, if too few, of a parameter) and swap-ins before its next, largest
    gaps first; None if there is none."""
    found = []
    for buf in trace.buffers:
        if buf.kind not in PROBE_KINDS or buf.nbytes == 0:
            continue
        acc = trace.accesses_of(buf.id)
        if len(acc) < 2:
            continue
        gaps = np.diff(acc)
        k = int(np.argmax(gaps))
        if gaps[k] >= 3:
            param = buf.kind is BufferKind.PARAM
            found.append((param, -int(gaps[k]), buf.id, int(acc[k]), int(acc[k + 1])))
    if not found:
        return None
    found.sort()
    events: list[SwapOut | SwapIn] = []
    for _param, _gap, b, first, second in found[:max_swaps]:
        events += [SwapOut(b, first), SwapIn(b, second - 2, second)]
    return Plan(fingerprint_of(trace), tuple(events), trace.meta.model)


def lane_fixed_cost(
    result: ReplayResult, bandwidth_bytes_per_s: float, lanes: int = 1
) -> tuple[float, int]:
    """(median fixed seconds per transfer, transfers) of a replay's transfers
    on `lanes` lanes (2: swap-outs on one, swap-ins on the other); see NOTE
    [ The lane probe ]."""
    late = []
    link_free: dict[object, float] = {}  # per lane: when the link's schedule is free
    for t in sorted(result.transfers, key=lambda t: t.start_s):
        lane = t.direction if lanes > 1 else None
        link_end = max(t.ready_s, link_free.get(lane, -np.inf)) + t.nbytes / bandwidth_bytes_per_s
        link_free[lane] = link_end
        late.append(t.end_s - link_end)
    if not late:
        return 0.0, 0
    return max(statistics.median(late), 0.0), len(late)


def measure_lane(
    trace: Trace,
    *,
    device: str,
    bandwidth_bytes_per_s: float | None,
    lanes: int,
    seed: int,
    samples: int = 1,
) -> LaneModel:
    """The lane of a replay of `trace` on `device` (NOTE [ What the simulator
    is told ], NOTE [ The lane probe ], NOTE [ Transfers cost the compute
    thread too ]): from `samples` pairs of a vanilla replay and a probe
    replay."""
    from memplan.validate.replay.executor import replay

    throttled = bandwidth_bytes_per_s is not None
    if bandwidth_bytes_per_s is None:
        copy = measure_copy(torch.device(device))
        bandwidth_bytes_per_s = float(min(copy["h2d_bytes_per_s"], copy["d2h_bytes_per_s"]))
    bw = bandwidth_bytes_per_s
    plan = probe_plan(trace)
    if plan is None:
        return LaneModel(bw, 0.0, throttled, 0)

    def run(probe: Plan | None) -> Sample[ReplayResult]:
        return sampled(
            lambda: replay(
                trace,
                device=device,
                iterations=PROBE_ITERATIONS,
                seed=seed,
                plan=probe,
                bandwidth_bytes_per_s=bw if throttled and probe else None,
                lanes=lanes,
            )
        )

    pairs = [(run(None), run(plan)) for _ in range(samples)]
    quiet = quietest([Sample(p, max(p[0].contention, p[1].contention)) for p in pairs]).value
    fixed, n = lane_fixed_cost(quiet[1].value, bw, lanes)
    lane = LaneModel(bw, fixed, throttled, n)
    return lane.pooled([compute_sample(v.value, p.value) for v, p in pairs])


def compute_sample(vanilla: ReplayResult, probe: ReplayResult) -> float:
    """Seconds per transfer the probe replay's compute thread took beyond the
    vanilla replay's (NOTE [ Transfers cost the compute thread too ])."""
    per_iteration = max(len(probe.transfers) / len(probe.iteration_seconds), 1.0)
    return (busy_s(probe) - busy_s(vanilla)) / per_iteration


def busy_s(result: ReplayResult) -> float:
    """What the compute thread takes in the best steady iteration of a
    replay, stalls and recomputes aside (NOTE [ Transfers cost the compute
    thread too ])."""
    busy = result.iteration_seconds - result.wait_seconds - result.recompute_seconds
    return float(steady(busy).min())


def device_hardware(device: str, lane: LaneModel, lanes: int, overhead_s: float) -> Hardware:
    """The profile of the replay device, field by field: its copy figures
    and memory measured here, the harness's per-op cost as the launch
    overhead; its compute figures, which a `Fixed` latency never reads, are
    the base profile's (`cpu-local` on CPU, a measured profile on CUDA)."""
    dev = torch.device(device)
    how = "measured by memplan validate on this replay device"
    bw_source = (
        "the replay's throttle (validate/replay/lanes.py NOTE [ Throttled copies ])"
        if lane.throttled
        else f"{how}: hwmodels.microbench.measure_copy"
    )
    if dev.type == "cuda":
        from memplan.hwmodels.calibrate import measure_profile

        base = measure_profile("cuda", name="cuda-replay")
        memory = int(torch.cuda.get_device_properties(dev).total_memory)
        duplex = 1.0 if lane.throttled else base.h2d_duplex_factor
    else:
        base = load_hardware("cpu-local")
        memory = int(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        duplex = 1.0  # each lane thread sleeps out its own throttle; unthrottled: see README
    source = {
        "h2d_bytes_per_s": bw_source,
        "d2h_bytes_per_s": bw_source,
        "transfer_fixed_s": f"{how}: lane probe, median of {lane.probes} transfers",
        "copy_engines": "the replay's copy lanes",
        "h2d_duplex_factor": "throttled lanes do not slow each other"
        if lane.throttled
        else base.source.get("h2d_duplex_factor", ""),
        "launch_overhead_s": f"{how}: the replay harness's per-op cost",
        "memory_bytes": "the device's memory; replays run without a budget",
        "peak_flops": f"{base.name} (unused: the latencies are measured)",
        "mem_bw_bytes_per_s": f"{base.name} (unused: the latencies are measured)",
    }
    return Hardware(
        name=f"{dev.type}-replay",
        memory_bytes=memory,
        h2d_bytes_per_s=lane.bandwidth_bytes_per_s,
        d2h_bytes_per_s=lane.bandwidth_bytes_per_s,
        transfer_fixed_s=lane.fixed_s,
        copy_engines=max(lanes, 1),
        h2d_duplex_factor=duplex,
        peak_flops=dict(base.peak_flops),
        mem_bw_bytes_per_s=base.mem_bw_bytes_per_s,
        launch_overhead_s=overhead_s,
        source=source,
        description=f"the replay device {device} as memplan validate measured it",
    )


def measurement(hardware: Hardware, lane: LaneModel, *vanilla: ReplayResult) -> Measurement:
    """The latencies vanilla replays measured, with `hardware` and the
    compute-thread cost of the lane's transfers."""
    if vanilla[0].op_seconds.shape[1] == 0:
        raise ValidationError("the vanilla replay ran no ops")
    ops, overhead, iteration = op_latencies(*vanilla)
    return Measurement(hardware, ops, overhead, iteration, lane.compute_s)

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
# The simulator predicts a replay, so every figure it gets is measured on the
# replay itself, never taken from a datasheet:
# - Op latency (`Fixed`): per op, the least call time over the steady
#   iterations (all but the first), plus the replay's per-op harness cost --
#   the part of the best steady iteration that no op call accounts for
#   (argument views, pool bookkeeping, the framework's frees), spread evenly
#   over the ops. A vanilla replay's iteration is then predicted to be
#   exactly its measured best: what is left to predict is what the plan adds
#   (stalls, recomputes, copies, NOTE [ Steady figures ] in
#   `validate/calibrate/report.py`).
# - Lane bandwidth: the throttle when one is given (NOTE [ Throttled copies ]
#   in `validate/replay/lanes.py`), else the device's measured copy speed
#   (`hwmodels.microbench.measure_copy`: memcpy on CPU, pinned copies on
#   CUDA).
# - Fixed cost per transfer: measured by a probe replay (NOTE [ The lane
#   probe ]), not the microbenchmark's 4-byte memcpy: a replay's transfer
#   also pays for waking the lane thread, its bookkeeping, the throttle's
#   sleep overshoot, and for waking the compute thread that waits on it.
# - Memory: the machine's RAM (CPU) or the card's (CUDA); replays run without
#   a budget, and so does the simulation.

# NOTE [ The lane probe ]
# A probe replay applies a plan of its own to the trace: up to `PROBE_SWAPS`
# activation buffers, the largest gaps between two accesses first, then
# parameters if there are too few (a small model like `mlp` has four, too few
# transfers to measure), swapped out after one access and back in just before
# the next. The fixed cost is the median, over the probe's transfers, of how
# late each one ended after the link's own schedule says it does (start: the
# later of its ready time and the link's previous end by that schedule;
# length: `nbytes / bandwidth`), at least 0: the time from the bytes' end to
# the moment the lane thread ends the transfer -- its timer wake-up, its wait
# for the GIL, its bookkeeping -- which every transfer pays, here 30-45 us.
# The probe moves the trace's own buffer sizes through the replay's own lanes,
# so the figure covers what a plan's transfers pay, whatever plan is validated
# afterwards. A trace without such buffers gets no probe and a fixed cost of
# 0. The probe runs as often as the plan is sampled, each time after a vanilla
# replay; the least contended pair gives the fixed cost (NOTE [ Contention ]).
# It runs again in every bracket of `validate_plan`, between the first vanilla
# replay and the plan's (NOTE [ Paired runs ] in `validate/calibrate/brackets.py`), for
# the compute-thread cost (NOTE [ Transfers cost the compute thread too ]).
#
# The simulator adds the fixed cost to every copy's time on the lane, so a
# copy's end comes that much after its bytes there too. It then also holds the
# lane for it, which the emulated link does not (a late lane thread does not
# delay the link's next copy, NOTE [ Throttled copies ] in
# `validate/replay/lanes.py`): a lane busy back to back is predicted slower than it
# is, by the fixed cost per copy. Measured before as the span from the later
# of the ready time and the previous transfer's actual end, it hid the
# lateness of every copy that queued behind another and read 9-15 us; the
# simulations missed about 40 us of stall per copy a compute op waited on.
# Measured over 3 replays of each heuristic plan of the five built-in models,
# the new figure moved the mean |time error| from 4.8% to 3.7% and the worst
# from 12.5% to 10.1% (tiny_resnet under TENSILE went from +3.3% to +10.1%,
# the cases that waited on copies from -9% to -3%).
#
# `PROBE_SWAPS` = 16, measured against 48: 48 swaps cut the spread of the
# per-transfer compute cost over repeated probes of tiny_resnet from 26% to
# 8%, but read it lower (37 against 45 us), and over 8 benchmark runs each the
# time error's 90th percentile went from 6.5% to 8.3%. Re-probing inside every
# bracket and simulating each bracket with its own probe's figure did no
# better either: 6.0% against 5.7%, with three misses against none (one probe
# replay reads the cost with a wide spread); nor did a 0.1 ms GIL switch
# interval during replays (6.1% against 6.5%, one miss in 8 runs either way).
# What did help is pooling: every bracket's probe joins the figure, and the
# kept bracket is one whose probe agrees with it (NOTE [ Paired runs ] in
# `validate/calibrate/brackets.py`).

# NOTE [ Transfers cost the compute thread too ]
# Queueing a copy (the executor's bookkeeping, waking the lane thread) runs on
# the compute thread, and the lane thread's own work -- its Python, which
# holds the GIL, and on CPU the memcpy itself -- takes from the compute
# thread: an op that returns while the lane thread holds the GIL waits for it,
# and the two share the machine's cores and memory bandwidth. Measured here,
# 50-300 us per transfer (more for larger ones), a fifth of a 15 ms iteration
# for a plan with 40 transfers, about half of it as slower op calls and half
# as harness. The simulator's copy engine costs compute nothing, so the cost
# is put into the latencies instead: per transfer, on the op whose end
# triggers it. Its size is what the compute thread of the probe replay takes
# in its best steady iteration, stalls aside, beyond what that of the vanilla
# replay run just before it takes (`busy_s`), per transfer of an iteration;
# the median over the samples (a pair sees about the same machine; the median
# drops the pairs that did not). The samples are pooled over the whole
# validation: the pairs that measure the lane before planning, and one per
# bracket after it, spread over the minute the plan replays take. The cost
# swings between regimes that last seconds (here 35-45 us per transfer in one,
# 70-100 in another, on tiny_resnet), and a figure taken only before the plan
# replays missed by as much when one of them covered it: tiny_resnet under
# TENSILE, 135 transfers an iteration, was predicted 37% slow once in 8
# benchmark runs, its lane probe alone having read 85 us per transfer. Whole
# iterations, not each op's least time (as the latencies are counted): the
# lane thread slows a different op in each iteration, and each op's least time
# over the iterations leaves that out -- here by half. Wall time, as the GIL
# waits count; noisy on a busy machine (here 100-500 us for `mlp`'s large
# transfers from one sample to the next). The harness time alone misses the
# slower op calls; the compute thread's CPU time misses the GIL waits and
# varies about as much.

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

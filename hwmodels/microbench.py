"""Microbenchmarks: op latencies over seeded random shapes, under background load.

TENSILE §IV-A measures every operator "with different input data and GPU
usage" to train its latency predictor; this module is that measurement.
For each op class it draws shapes (`hwmodels.shapes`), makes the inputs,
calls the aten op by its target name, and times it at each usage level
(`hwmodels.load`): warm-up, then the median of `repeats` blocks, each block
long enough (`min_block_s`) to average over the load's duty cycle.

See NOTE [ Block length ], NOTE [ Observed usage ] and
NOTE [ CPU measurement setup ] next to the code they explain.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import os
import platform
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from memplan.hwmodels.dataset import Dataset, DatasetMeta
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.hostmem import cache_host_allocations
from memplan.hwmodels.load import CpuLoad, CudaLoad
from memplan.hwmodels.opclass import OpClass, classify
from memplan.hwmodels.shapes import MEASURED_CLASSES, SampleSpec, TensorSpec, sample_specs
from memplan.traces.model import Buffer, BufferKind, Op, Phase, Trace, TraceMeta, View
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry


# NOTE [ Block length ]
# A timed block must span several scheduler time slices, or the load level
# decides nothing: a block much shorter than a time slice mostly runs whole
# before a competitor gets the core (observed usage 0 in the median block at
# "usage 0.5"). So the defaults are 10 ms blocks and the median of 5-7 of
# them. What no block length removes is a neighbour: other work running on
# the cores not measured on disturbs the timing through the shared cache and
# memory bus. A CPU run therefore records how busy the cores it does not
# measure on were (`other_busy_cores`, from /proc/stat) and the CLI warns
# when it is not near zero: measure on an idle machine. The measurements
# that chose these defaults: docs/latency.md.
@dataclass(frozen=True, slots=True)
class MicrobenchOptions:
    device: str = "cpu"
    samples: int = 200  # shapes per op class
    usage_levels: tuple[float, ...] = (0.0, 0.5, 1.0)
    seed: int = 0
    repeats: int = 5
    min_block_s: float = 0.010  # see NOTE [ Block length ]
    threads: int = 1
    classes: tuple[OpClass, ...] = MEASURED_CLASSES
    hardware_name: str = "cpu-local"

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise LatencyError(f"device={self.device!r} must be 'cpu' or 'cuda'")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise LatencyError("device='cuda' but torch sees no CUDA device here")
        if self.samples < 1 or self.repeats < 1 or self.threads < 1:
            raise LatencyError("samples, repeats and threads must be >= 1")
        if not self.usage_levels or any(not 0 <= u <= 1 for u in self.usage_levels):
            raise LatencyError(
                f"usage levels {list(self.usage_levels)} must be fractions in [0, 1]"
            )


# ---- making and calling one sample -------------------------------------------------
def make_tensor(spec: TensorSpec, device: torch.device, gen: torch.Generator) -> torch.Tensor:
    dtype = getattr(torch, spec.dtype)
    shape = spec.shape
    if spec.transposed and len(shape) >= 2:
        shape = (*shape[:-2], shape[-1], shape[-2])
    if spec.fill == "mask":
        t = torch.rand(shape, generator=gen) < 0.5
    elif spec.fill.startswith("index:"):
        t = torch.randint(0, int(spec.fill.split(":")[1]), shape, generator=gen, dtype=dtype)
    elif spec.fill == "ones":
        t = torch.ones(shape, dtype=dtype)
    elif spec.fill == "positive":
        t = torch.rand(shape, generator=gen, dtype=dtype) + 0.1
    else:
        t = torch.randn(shape, generator=gen, dtype=dtype)
    t = t.to(device)
    return t.transpose(-1, -2) if spec.transposed and len(shape) >= 2 else t


def _decode(x: Any, tensors: list[torch.Tensor]) -> Any:
    """The Python value of a JSON argument (the inverse of capture's encoding)."""
    if isinstance(x, dict) and len(x) == 1:
        if "view" in x:
            return tensors[x["view"]]
        if "dtype" in x:
            return getattr(torch, x["dtype"])
        if "float" in x:
            return float(x["float"])
        if "device" in x:
            return torch.device(x["device"])
    if isinstance(x, dict):
        return {k: _decode(v, tensors) for k, v in x.items()}
    if isinstance(x, list):
        return [_decode(v, tensors) for v in x]
    return x


def aten_op(target: str) -> Any:
    """The OpOverload behind `aten.packet.overload`."""
    ns, pk, ov = target.split(".")
    return getattr(getattr(getattr(torch.ops, ns), pk), ov)


def make_call(spec: SampleSpec, tensors: list[torch.Tensor]) -> tuple[Any, Callable[[], Any]]:
    func = aten_op(spec.target)
    args = _decode(spec.args.get("args", []), tensors)
    kwargs = {k: _decode(v, tensors) for k, v in spec.args.get("kwargs", {}).items()}
    return func, lambda: func(*args, **kwargs)


# ---- timing ----------------------------------------------------------------------------
def time_cpu(
    fn: Callable[[], Any], repeats: int, min_block_s: float, warmup: bool = True, best: bool = False
) -> float:
    """Median (or with `best`, least) seconds per call over `repeats` blocks of
    calls, each block at least `min_block_s` long (after one warm-up call
    unless told it is warm)."""
    if warmup:
        fn()
    t0 = time.perf_counter()
    fn()
    est = time.perf_counter() - t0
    n = max(1, min(20_000, math.ceil(min_block_s / max(est, 1e-7))))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - t0) / n)
    return min(times) if best else statistics.median(times)


# NOTE [ Observed usage ]
# TENSILE's input is the device's *current* utilisation, not a load setting.
# On a shared CPU the share a competitor gets is up to the scheduler (and to
# whatever else runs on the machine), so a load level alone is a noisy label:
# the same op at one load level can take from its idle time to several times
# that. Each CPU measurement therefore records the usage it saw: per block,
# 1 - (CPU time the measuring process got) / (wall time x threads), and the
# row keeps the median block's (latency, usage) pair. Latency and usage then
# agree (latency ~ idle latency / (1 - usage)) whether the time went to our
# load workers or to someone else's job. What usage cannot see is
# interference that steals no CPU time (another core's job thrashing the
# shared cache or memory bus, a busy hypervisor): it stays in the labels as
# noise. CUDA rows keep the load level (a per-kernel utilisation is not
# observable from the host). The figures behind this: docs/latency.md.
def time_cpu_usage(
    fn: Callable[[], Any], repeats: int, min_block_s: float, threads: int = 1
) -> tuple[float, float]:
    """(seconds per call, observed usage) of the median of `repeats` blocks;
    a block's usage is 1 - (CPU time this process got) / (wall time x threads).
    The function must already be warm (see NOTE [ Observed usage ])."""
    t0 = time.perf_counter()
    fn()
    est = time.perf_counter() - t0
    n = max(1, min(20_000, math.ceil(min_block_s / max(est, 1e-7))))
    blocks = []
    for _ in range(repeats):
        c0, t0 = time.process_time(), time.perf_counter()
        for _ in range(n):
            fn()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        blocks.append((wall / n, min(max(1.0 - cpu / (wall * threads), 0.0), 1.0)))
    blocks.sort()
    return blocks[len(blocks) // 2]


def time_cuda(
    fn: Callable[[], Any], repeats: int, min_block_s: float, warmup: bool = True, best: bool = False
) -> float:
    """As `time_cpu`, timed with CUDA events on the current stream."""
    if warmup:
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    est = start.elapsed_time(end) * 1e-3
    n = max(1, min(20_000, math.ceil(min_block_s / max(est, 1e-7))))
    times = []
    for _ in range(repeats):
        start.record()
        for _ in range(n):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3 / n)
    return min(times) if best else statistics.median(times)


# ---- the synthetic trace -----------------------------------------------------------------
class _TraceBuilder:
    """Accumulates one op per sample, each with its own input and output buffers."""

    def __init__(self) -> None:
        self.buffers: list[Buffer] = []
        self.views: list[View] = []
        self.ops: list[Op] = []

    def _view(self, t: torch.Tensor, kind: BufferKind, op_id: int) -> int:
        b = len(self.buffers)
        self.buffers.append(Buffer(b, t.untyped_storage().nbytes(), kind, freed_after=op_id))
        v = len(self.views)
        dtype = str(t.dtype).removeprefix("torch.")
        self.views.append(View(v, b, tuple(t.shape), tuple(t.stride()), t.storage_offset(), dtype))
        return v

    def add(self, spec: SampleSpec, func: Any, tensors: list[torch.Tensor], out: Any) -> int:
        op_id = len(self.ops)
        reads = [self._view(t, BufferKind.INPUT, op_id) for t in tensors]
        written = _mutated(func, spec, reads)
        in_storages = {t.untyped_storage().data_ptr() for t in tensors}
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        new = [self._view(t, BufferKind.ACTIVATION, op_id) for t in outs
               if t.untyped_storage().data_ptr() not in in_storages]  # fmt: skip
        c = classify(spec.target)
        name = spec.target.split(".")[1]
        phase = (
            Phase.OPTIMIZER
            if c is OpClass.OPTIMIZER
            else (Phase.BACKWARD if "backward" in name else Phase.FORWARD)
        )
        args = _remap(spec.args, reads)
        flops = _flops(func, tensors, spec, out)
        self.ops.append(
            Op(op_id, spec.target, phase, tuple(reads), tuple(new + written), args, flops)
        )
        return op_id

    def trace(self, meta: TraceMeta) -> Trace:
        return Trace(meta, tuple(self.buffers), tuple(self.views), tuple(self.ops))


def _remap(x: Any, ids: list[int]) -> Any:
    if isinstance(x, dict):
        if "view" in x and len(x) == 1:
            return {"view": ids[x["view"]]}
        return {k: _remap(v, ids) for k, v in x.items()}
    if isinstance(x, list):
        return [_remap(v, ids) for v in x]
    return x


def _mutated(func: Any, spec: SampleSpec, reads: list[int]) -> list[int]:
    """View ids of the arguments the schema marks as written (in-place ops)."""
    out: list[int] = []
    pos = spec.args.get("args", [])
    kw = spec.args.get("kwargs", {})
    for i, a in enumerate(func._schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            val = kw.get(a.name) if a.kwarg_only or i >= len(pos) else pos[i]
            refs = val if isinstance(val, list) else [val]
            out += [reads[r["view"]] for r in refs if isinstance(r, dict) and "view" in r]
    return out


def _flops(func: Any, tensors: list[torch.Tensor], spec: SampleSpec, out: Any) -> int:
    """torch.utils.flop_counter's count, as capture records it (0 where it has none)."""
    f = flop_registry.get(func._overloadpacket)
    if f is None:
        return 0
    args = _decode(spec.args.get("args", []), tensors)
    kwargs = {k: _decode(v, tensors) for k, v in spec.args.get("kwargs", {}).items()}
    try:
        return int(f(*args, **kwargs, out_val=out))
    except Exception:  # a formula that does not cover this overload: unknown
        return 0


# ---- the run ------------------------------------------------------------------------------
def ordered_specs(classes: tuple[OpClass, ...], samples: int, seed: int) -> list[SampleSpec]:
    """The samples of a run in measuring order: round-robin over classes, so
    slow drifts of the machine spread evenly over them."""
    by_class = [sample_specs(c, samples, seed) for c in classes]
    return [s for group in zip(*by_class, strict=True) for s in group]


def dataset_specs(ds: Dataset) -> list[SampleSpec]:
    """The `SampleSpec` behind each op of a CPU or CUDA dataset, regenerated
    from its seed (to time the same samples again)."""
    classes = tuple(OpClass(c) for c in ds.meta.classes) or MEASURED_CLASSES
    specs = ordered_specs(classes, ds.meta.samples_per_class, ds.meta.seed)
    skipped = set(ds.meta.skipped_specs)
    kept = [s for i, s in enumerate(specs) if i not in skipped]
    if len(kept) != ds.trace.n_ops or any(
        s.target != op.target for s, op in zip(kept, ds.trace.ops, strict=True)
    ):
        raise LatencyError("dataset: its samples cannot be regenerated by this version")
    return kept


# NOTE [ CPU measurement setup ]
# On CPU the op runs with `threads` intra-op threads, and the process is
# pinned to cores 0..threads-1 for the run; the load workers are pinned to the
# same cores, so `usage` is the share of *those* cores a competitor wants
# (with one spinner per core, usage=1 roughly halves the op's share). Pinning
# also keeps the measurement away from whatever else runs on the other cores.
# Denormals are flushed while measuring (repeated in-place updates would
# otherwise decay into slow denormal arithmetic). Everything is restored after
# but the allocator setting: glibc is made to keep freed memory, as a device's
# caching allocator does, so an op's time does not depend on which allocations
# came before it (NOTE [ Host allocations ] in `hwmodels/hostmem.py`).
@contextlib.contextmanager
def cpu_setup(threads: int) -> Iterator[list[int] | None]:
    """Pin to cores 0..threads-1 with `threads` intra-op threads, flush
    denormals; restore everything on exit (see NOTE [ CPU measurement setup ])."""
    old_threads = torch.get_num_threads()
    can_pin = hasattr(os, "sched_getaffinity")
    old_aff = os.sched_getaffinity(0) if can_pin else None
    cores = sorted(old_aff)[:threads] if old_aff else None
    torch.set_num_threads(threads)
    if can_pin and cores:
        os.sched_setaffinity(0, set(cores))
    torch.set_flush_denormal(True)
    try:
        yield cores
    finally:
        torch.set_flush_denormal(False)
        torch.set_num_threads(old_threads)
        if can_pin and old_aff:
            os.sched_setaffinity(0, old_aff)


def cpu_description(threads: int) -> str:
    model = platform.processor() or platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return f"{model} ({os.cpu_count()} cores), torch {torch.__version__}, {threads} thread(s)"


def _busy_jiffies(cores: set[int]) -> int | None:
    """Busy (non-idle, non-iowait) jiffies of the given cores since boot, from
    /proc/stat; None where that file is not available."""
    try:
        with open("/proc/stat") as f:
            lines = [ln.split() for ln in f if ln.startswith("cpu") and ln[3:4].isdigit()]
    except OSError:
        return None
    total = 0
    for fields in lines:
        if int(fields[0][3:]) in cores:
            vals = [int(x) for x in fields[1:]]
            total += sum(vals) - vals[3] - (vals[4] if len(vals) > 4 else 0)
    return total


BUSY_CORES = 0.05  # other cores' average load above which timings are flagged


def busy_warning(busy: float) -> str | None:
    """The warning when other processes kept `busy` cores busy while we measured
    (NOTE [ Block length ]); None when idle enough or unknown (< 0)."""
    return None if busy <= BUSY_CORES else (
        f"warning: other processes kept {busy:.2f} of the cores not measured on busy while "
        "measuring; shared caches make these timings noisier (NOTE [ Block length ] in "
        "hwmodels/microbench.py): measure on an idle machine")  # fmt: skip


class OtherActivity:
    """How many of the cores outside `measured` other processes kept busy,
    on average between `start()` and `stop()` (-1 when it cannot be known)."""

    def __init__(self, measured: list[int] | None):
        n = os.cpu_count() or 1
        self.others = set(range(n)) - set(measured or [])
        self._j0: int | None = None
        self._t0 = 0.0

    def start(self) -> None:
        self._j0 = _busy_jiffies(self.others) if self.others else None
        self._t0 = time.perf_counter()

    def stop(self) -> float:
        j1 = _busy_jiffies(self.others) if self._j0 is not None else None
        elapsed = time.perf_counter() - self._t0
        if j1 is None or self._j0 is None or elapsed <= 0:
            return -1.0
        return round((j1 - self._j0) / os.sysconf("SC_CLK_TCK") / elapsed, 3)


def run_microbench(
    opts: MicrobenchOptions, progress: Callable[[int, int], None] | None = None
) -> Dataset:
    """Measure every sample at every usage level; `progress(done, total)` after
    each sample. On CPU this first makes glibc keep freed memory for the rest
    of the process (NOTE [ Host allocations ] in `hwmodels/hostmem.py`)."""
    specs = ordered_specs(opts.classes, opts.samples, opts.seed)
    skipped_specs: list[int] = []
    device = torch.device(opts.device)
    gen = torch.Generator().manual_seed(opts.seed)
    builder = _TraceBuilder()
    rows: list[tuple[int, float, float]] = []
    t_start = time.perf_counter()
    cached = opts.device == "cpu" and cache_host_allocations()
    with contextlib.ExitStack() as stack:
        if opts.device == "cpu":
            cores = stack.enter_context(cpu_setup(opts.threads))
            load: Any = stack.enter_context(CpuLoad(cores))
            description = cpu_description(opts.threads)
            others: OtherActivity | None = OtherActivity(cores)
            others.start()
        else:
            load = stack.enter_context(CudaLoad(device))
            description = f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}"
            others = None
        for i, spec in enumerate(specs):
            try:
                tensors = [make_tensor(t, device, gen) for t in spec.tensors]
                func, fn = make_call(spec, tensors)
                out = fn()
            except (RuntimeError, ValueError, IndexError):
                skipped_specs.append(i)  # a shape the kernel rejects: drawn, not measured
                continue
            op_id = builder.add(spec, func, tensors, out)
            del out
            for u in opts.usage_levels:
                load.set(u)
                # the call that recorded the outputs above was the warm-up
                if opts.device == "cpu":
                    t, seen = time_cpu_usage(fn, opts.repeats, opts.min_block_s, opts.threads)
                else:
                    t, seen = time_cuda(fn, opts.repeats, opts.min_block_s, warmup=False), u
                rows.append((op_id, seen, t))
            if progress is not None:
                progress(i + 1, len(specs))
        load.set(0.0)
        other_busy = others.stop() if others is not None else -1.0
        copy = measure_copy(device)
    meta = DatasetMeta(
        device=opts.device,
        hardware=opts.hardware_name,
        description=description,
        torch_version=torch.__version__,
        threads=opts.threads,
        seed=opts.seed,
        usage_levels=tuple(opts.usage_levels),
        samples_per_class=opts.samples,
        repeats=opts.repeats,
        min_block_s=opts.min_block_s,
        created=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        elapsed_s=round(time.perf_counter() - t_start, 1),
        skipped=len(skipped_specs),
        copy=copy,
        classes=tuple(c.value for c in opts.classes),
        skipped_specs=tuple(skipped_specs),
        other_busy_cores=other_busy,
        host_allocations_cached=cached,
    )
    trace = builder.trace(TraceMeta(model="microbench", batch_size=1, device=opts.device,
                                    torch_version=torch.__version__))  # fmt: skip
    op, usage, lat = (np.asarray(c) for c in zip(*rows, strict=True)) if rows else ([], [], [])
    return Dataset(meta, trace, np.asarray(op, np.int64), np.asarray(usage, np.float64),
                   np.asarray(lat, np.float64))  # fmt: skip


# ---- copies ----------------------------------------------------------------------------------
def measure_copy(
    device: torch.device, nbytes: int = 64 * 2**20, repeats: int = 7
) -> dict[str, float]:
    """Copy bandwidth in bytes/s (best of `repeats` copies) and the fixed cost
    of a tiny copy in seconds (median).
    CUDA: pinned host <-> device; CPU: memcpy between two host buffers (both
    directions are the same copy)."""
    if device.type == "cuda":
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
        small_h = torch.empty(4, dtype=torch.uint8, pin_memory=True)
        small_d = torch.empty(4, dtype=torch.uint8, device=device)
        h2d = time_cuda(lambda: dev.copy_(host, non_blocking=True), repeats, 0.0, best=True)
        d2h = time_cuda(lambda: host.copy_(dev, non_blocking=True), repeats, 0.0, best=True)
        fixed = time_cuda(lambda: small_d.copy_(small_h, non_blocking=True), repeats, 0.002)
        return {"h2d_bytes_per_s": nbytes / h2d, "d2h_bytes_per_s": nbytes / d2h, "fixed_s": fixed}
    src = torch.ones(nbytes, dtype=torch.uint8)
    dst = torch.zeros(nbytes, dtype=torch.uint8)
    small_s, small_d = torch.ones(4, dtype=torch.uint8), torch.zeros(4, dtype=torch.uint8)
    t = time_cpu(lambda: dst.copy_(src), repeats, 0.0, best=True)
    fixed = time_cpu(lambda: small_d.copy_(small_s), repeats, 0.002)
    return {"h2d_bytes_per_s": nbytes / t, "d2h_bytes_per_s": nbytes / t, "fixed_s": fixed}

"""Measure a `Hardware` profile of the machine at hand (`cpu-local`, or a CUDA device).

Every figure is measured and its `source` line says how: copy bandwidth and
fixed cost, peak FLOP/s per dtype from a large matmul, memory bandwidth from a
large copy (bytes read + written, the roofline's convention), the per-op floor
from a tiny op. The roofline efficiencies are fitted afterwards on a
microbenchmark dataset (`hwmodels.evaluate.fit_efficiency`).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import threading

import numpy as np
import torch
from memplan.hwmodels.dataset import Dataset
from memplan.hwmodels.hostmem import cache_host_allocations
from memplan.hwmodels.microbench import (
    cpu_description,
    cpu_setup,
    dataset_specs,
    make_call,
    make_tensor,
    measure_copy,
    time_cpu,
    time_cpu_usage,
    time_cuda,
)
from memplan.hwmodels.profile import Hardware
from memplan.traces.target import TargetDevice

_MATMUL_N = {"float32": 1024, "float64": 768, "bfloat16": 512, "float16": 512}


def measure_profile(device: str = "cpu", threads: int = 1, name: str = "cpu-local") -> Hardware:
    """A profile of this machine's CPU (with `threads` threads, pinned as the
    microbenchmark is) or of the current CUDA device."""
    when = datetime.date.today().isoformat()
    if device == "cuda":
        return _measure_cuda(name, when)
    with cpu_setup(threads):
        dev = torch.device("cpu")
        copy = measure_copy(dev)
        duplex = _duplex_factor()
        flops = {d: _matmul_rate(d, dev, time_cpu) for d in _MATMUL_N}
        n = 16 * 2**20
        src, dst = torch.ones(n), torch.zeros(n)
        bw = 2 * 4 * n / time_cpu(lambda: dst.copy_(src), 7, 0.0, best=True)
        a, b = torch.ones(1), torch.ones(1)
        launch = time_cpu(lambda: a.add(b), 7, 0.01, best=True)
    desc = cpu_description(threads)
    how = f"measured by `memplan microbench --profile-out` on {desc}, {when}"
    pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return Hardware(
        name=name,
        description=f"this machine's CPU as a device: {desc}",
        memory_bytes=int(pages),
        h2d_bytes_per_s=copy["h2d_bytes_per_s"],
        d2h_bytes_per_s=copy["d2h_bytes_per_s"],
        transfer_fixed_s=copy["fixed_s"],
        copy_engines=1,
        h2d_duplex_factor=duplex,
        peak_flops=flops,
        mem_bw_bytes_per_s=bw,
        launch_overhead_s=launch,
        device=TargetDevice.CPU,
        source={
            "memory_bytes": f"physical RAM (SC_PHYS_PAGES x SC_PAGE_SIZE), {when}",
            "h2d_bytes_per_s": f"{how}: best of 7 memcpy (Tensor.copy_) of 64 MiB",
            "d2h_bytes_per_s": f"{how}: the same memcpy (host to host has one direction)",
            "transfer_fixed_s": f"{how}: median per-call time of a 4-byte Tensor.copy_",
            "copy_engines": "a host copy is a memcpy on a CPU thread: one lane",
            "h2d_duplex_factor": f"{how}: 64 MiB copy rate with a second copy running / alone",
            "peak_flops": f"{how}: best of 5 rates of square matmuls (n = {_MATMUL_N})",
            "mem_bw_bytes_per_s": f"{how}: bytes read + written by a 64 MiB float32 copy, best of 7",
            "launch_overhead_s": f"{how}: per-call time of a 1-element add, best of 7 blocks",
        },
    )


def _matmul_rate(dtype: str, dev: torch.device, timer) -> float:  # noqa: ANN001
    n = _MATMUL_N[dtype]
    a = torch.randn(n, n, device=dev).to(getattr(torch, dtype))
    return 2.0 * n**3 / timer(lambda: a @ a, 5, 0.05, best=True)


def _duplex_factor() -> float:
    """Copy rate while a second copy runs in another thread, over the rate alone."""
    n = 64 * 2**20
    src, dst = torch.ones(n, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)
    src2, dst2 = torch.ones(n, dtype=torch.uint8), torch.zeros(n, dtype=torch.uint8)
    alone = time_cpu(lambda: dst.copy_(src), 5, 0.0)
    stop = threading.Event()

    def other() -> None:
        while not stop.is_set():
            dst2.copy_(src2)

    t = threading.Thread(target=other, daemon=True)
    t.start()
    try:
        shared = time_cpu(lambda: dst.copy_(src), 5, 0.0)
    finally:
        stop.set()
        t.join()
    return float(min(1.0, alone / shared))


def _measure_cuda(name: str, when: str) -> Hardware:
    dev = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(dev)
    copy = measure_copy(dev)
    flops = {d: _matmul_rate(d, dev, time_cuda) for d in _MATMUL_N}
    n = 64 * 2**20
    src, dst = torch.ones(n, device=dev), torch.zeros(n, device=dev)
    bw = 2 * 4 * n / time_cuda(lambda: dst.copy_(src), 7, 0.0, best=True)
    a, b = torch.ones(1, device=dev), torch.ones(1, device=dev)
    launch = time_cuda(lambda: a.add(b), 7, 0.01, best=True)
    how = f"measured by `memplan microbench --profile-out` on {props.name}, {when}"
    return Hardware(
        name=name,
        description=f"{props.name}, torch {torch.__version__}",
        memory_bytes=int(props.total_memory),
        h2d_bytes_per_s=copy["h2d_bytes_per_s"],
        d2h_bytes_per_s=copy["d2h_bytes_per_s"],
        transfer_fixed_s=copy["fixed_s"],
        copy_engines=2,
        h2d_duplex_factor=0.5,
        peak_flops=flops,
        mem_bw_bytes_per_s=bw,
        launch_overhead_s=launch,
        compute_capability=(props.major, props.minor),
        source={
            "memory_bytes": "torch.cuda.get_device_properties().total_memory",
            "compute_capability": "torch.cuda.get_device_properties(): major.minor",
            "h2d_bytes_per_s": f"{how}: pinned 64 MiB host-to-device copies, CUDA events",
            "d2h_bytes_per_s": f"{how}: pinned 64 MiB device-to-host copies, CUDA events",
            "transfer_fixed_s": f"{how}: 4-byte pinned copy",
            "copy_engines": "assumed: one H2D and one D2H copy engine",
            "h2d_duplex_factor": "assumed: public measured-class figure, H2D halves under D2H",
            "peak_flops": f"{how}: square matmuls (n = {_MATMUL_N})",
            "mem_bw_bytes_per_s": f"{how}: bytes read + written by a 256 MiB device copy",
            "launch_overhead_s": f"{how}: per-call time of a 1-element add",
        },
    )


def remeasure(ds: Dataset, ops: np.ndarray, threads: int = 1) -> np.ndarray:
    """Time the samples behind `ops` of a CPU dataset again, now and without
    load: seconds alone (latency x (1 - observed usage)) per op, NaN where a
    sample could not be made. How far these land from the dataset's own
    labels is the measurement noise no model can beat."""
    specs = dataset_specs(ds)
    if ds.meta.host_allocations_cached:
        cache_host_allocations()  # time them as they were timed
    gen = torch.Generator().manual_seed(ds.meta.seed + 1)
    out = np.full(len(ops), np.nan)
    with cpu_setup(threads):
        for i, o in enumerate(ops):
            spec = specs[int(o)]
            tensors = [make_tensor(t, torch.device("cpu"), gen) for t in spec.tensors]
            _, fn = make_call(spec, tensors)
            fn()
            t, u = time_cpu_usage(fn, ds.meta.repeats, ds.meta.min_block_s, threads)
            out[i] = t * (1.0 - u)
    return out


def with_efficiency(hw: Hardware, efficiency: dict[str, float], how: str) -> Hardware:
    """`hw` with a fitted [roofline_efficiency] table and its source line."""
    source = dict(hw.source)
    source["roofline_efficiency"] = how
    return dataclasses.replace(hw, roofline_efficiency=dict(efficiency), source=source)

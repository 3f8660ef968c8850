"""`memplan capacity` on issue 18's two cases, and the checks of batch scaling
behind it.

For resnet50 on p100-pcie-16gb and bert_base on a100-pcie-40gb (Adam, meta
captures for the GPU -- what its dispatch runs, as `memplan capacity
--model` captures -- kernel-model latencies, the default; one PCIe lane):
1. `memplan capacity --model M --gpu G --planners all --json --no-progress`
   in a subprocess: its wall-clock seconds, imports and captures included
   (target: under 60 s on this machine's 2 shared cores), and the answers;
2. the scaled trace (NOTE [ Batch scaling ]: captures at batches 8 and 12)
   against a real capture at three other batches: the vanilla peak (target:
   within 0.5%) and the largest relative error of any buffer's bytes or
   op's flops;
   and vanilla's answer again under PyTorch's caching allocator with the
   profile's CUDA context (`--allocator caching`);
3. vanilla's largest batch from the command against a plain bisection over
   real captures, each step a capture and a vanilla simulation at the GPU's
   memory (target: equal, plus or minus one);
4. the independent anchor: resnet50 at batch 184 with SGD (momentum 0.9),
   whose trace peak MONeT's authors measured as 15.06 GB on a real GPU.

Needs torchvision and transformers: run with the zoo venv (`make
.venv-zoo/.memplan-setup`, then `.venv-zoo/bin/python benchmarks/capacity.py`);
skipped with a note otherwise. Times are wall clock on a shared machine:
noisy, compare them within one run.

    .venv-zoo/bin/python benchmarks/capacity.py [--models resnet50,bert_base]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memplan.hwmodels.device import DeviceModel  # noqa: E402
from memplan.hwmodels.kernels import KernelModel  # noqa: E402
from memplan.hwmodels.profile import load_hardware  # noqa: E402
from memplan.sim import simulate  # noqa: E402
from memplan.traces.capture import CaptureOptions, capture  # noqa: E402
from memplan.traces.errors import TraceError  # noqa: E402
from memplan.traces.scaling import BatchTraces, mismatch, model_captures  # noqa: E402
from memplan.traces.zoo import resolve  # noqa: E402

CASES = {  # model -> (GPU, batches to check the scaled trace at)
    "resnet50": ("p100-pcie-16gb", (32, 100, 184)),
    "bert_base": ("a100-pcie-40gb", (16, 64, 256)),
}
TARGET_S = 60.0
TARGET_PEAK = 0.005
MONET_GB = 15.06  # ResNet-50, batch 184, SGD momentum: measured by MONeT's authors
GiB = 2**30


def run_command(model: str, gpu: str, *extra: str) -> tuple[float, dict]:
    argv = [sys.executable, "-m", "memplan", "capacity", "--model", model, "--gpu", gpu,
            "--planners", "all", "--json", "--no-progress", *extra]  # fmt: skip
    t0 = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False)
    seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv[1:])} failed ({done.returncode}):\n{done.stderr}")
    for line in done.stderr.splitlines():
        print(f"    stderr: {line}")
    return seconds, json.loads(done.stdout)


def _for(gpu: str) -> CaptureOptions:
    """What `memplan capacity --model` captures with: Adam, for `--gpu`."""
    return CaptureOptions(target=load_hardware(gpu).target())


def bisect_real(model: str, gpu: str) -> tuple[int, int]:
    """(vanilla's largest batch, captures taken): the first power of two
    that does not fit, then bisection; each step a real capture."""
    factory = resolve(model)
    device = DeviceModel(load_hardware(gpu), KernelModel())
    captures = 0

    def fits(batch: int) -> bool:
        nonlocal captures
        captures += 1
        t = capture(factory, batch, _for(gpu), model_name=model)
        return not simulate([t], device, iterations=2, check=False).oom

    good, bad = 0, 1
    while fits(bad):
        good, bad = bad, 2 * bad
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if fits(mid) else (good, mid)
    return good, captures


def check_model(model: str, gpu: str, batches: tuple[int, ...]) -> list[str]:
    failures = []
    print(f"== {model} on {gpu}")
    seconds, doc = run_command(model, gpu)
    ok = seconds < TARGET_S
    failures += [] if ok else [f"{model}: capacity took {seconds:.1f} s"]
    print(f"  memplan capacity --planners all: {seconds:.1f} s wall ({'ok' if ok else 'SLOW'}, "
          f"target < {TARGET_S:.0f} s), {doc['captures']} captures")  # fmt: skip
    for a in doc["answers"]:
        peak = f"{a['peak_bytes'] / GiB:6.2f} GiB" if a["peak_bytes"] else "     -    "
        eor = f"{a['eor']:.3f}" if a["eor"] is not None else "-"
        print(f"    {a['planner']:<13} largest batch {a['largest']!s:>5}  peak {peak}  EOR {eor}"
              f"  ({len(a['probes'])} probes, {a['search_s']:.1f} s)")  # fmt: skip
    print(f"    no plan fits above batch {doc['ceiling']} (peak lower bound)")
    seconds, caching = run_command(model, gpu, "--planners", "vanilla", "--allocator", "caching")
    print(f"  with --allocator caching ({caching['context_reserve_bytes'] / 2**20:.0f} MiB "
          f"context): vanilla largest batch {caching['answers'][0]['largest']} "
          f"({seconds:.1f} s)")  # fmt: skip

    traces = BatchTraces(model_captures(model, _for(gpu)))
    for b in batches:
        scaled = traces.trace(b).trace
        real = capture(resolve(model), b, _for(gpu), model_name=model)
        worst, reason = mismatch(scaled, real, TARGET_PEAK)
        sp, rp = scaled.peak()[0], real.peak()[0]
        err = abs(sp - rp) / rp
        ok = err <= TARGET_PEAK and not reason
        failures += [] if ok else [f"{model} batch {b}: scaled peak off by {err:.3%} {reason}"]
        print(f"  batch {b:>4}: scaled peak {sp / GiB:.4f} GiB, captured {rp / GiB:.4f} GiB, "
              f"error {err:.4%}; largest error of any bytes or flops {worst:.4%} "
              f"({'ok' if ok else 'FAIL'})")  # fmt: skip

    t0 = time.perf_counter()
    real, n = bisect_real(model, gpu)
    mine = next(a["largest"] for a in doc["answers"] if a["planner"] == "vanilla")
    ok = mine is not None and abs(mine - real) <= 1
    failures += [] if ok else [f"{model}: vanilla {mine} vs {real} by real captures"]
    print(f"  vanilla largest batch: {mine} from capacity, {real} by bisection over {n} real "
          f"captures ({time.perf_counter() - t0:.0f} s) ({'ok' if ok else 'FAIL'})")  # fmt: skip
    return failures


def monet_anchor() -> None:
    t = capture(resolve("resnet50"), 184, CaptureOptions(optimizer="sgd"), model_name="resnet50")
    peak = t.peak()[0]
    apart = abs(peak / GiB - MONET_GB) / MONET_GB
    print(f"== anchor: resnet50 batch 184, SGD momentum 0.9: trace peak {peak / GiB:.3f} GiB "
          f"({peak} B); MONeT's authors measured {MONET_GB} GB on a real GPU, {apart:.2%} "
          "apart when their GB are read as GiB (as issue 18 does)")  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(CASES))
    models = [m for m in parser.parse_args().models.split(",") if m]
    try:
        for m in models:
            resolve(m)(1)
    except TraceError as e:
        print(f"capacity benchmark skipped: {e} (run it with .venv-zoo/bin/python)")
        return 0
    failures = []
    for m in models:
        gpu, batches = CASES[m]
        failures += check_model(m, gpu, batches)
    if "resnet50" in models:
        monet_anchor()
    print("\n" + ("all targets met" if not failures else "MISSED:\n  " + "\n  ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""Predicted against measured iteration time on GPUs memplan has never run on.

For every row of benchmarks/data/gpu_time.toml (Lambda's published training
throughput of ResNet-50 and BERT-base, fp32 and AMP, on 13 GPUs; the file
says what ran and where each figure comes from) the benchmark captures the
same training step on the meta device for that GPU (`--target` its profile),
scales it to the row's batch (traces/scaling.py: captures at batches 2 and 4),
and sums the op latencies of the kernel model (hwmodels/kernels.py) and of
the roofline into one iteration. Measured iteration time is batch /
throughput. It prints every row with its error, then the median and worst
|error| separately for the rows of the four GPUs the kernel model is fitted
on and for the held-out rest.

`--fit` fits the kernel model's constants (NOTE [ Kernel model constants ])
on the fitted GPUs' rows only, by least squares on log time (Nelder-Mead),
and prints them with the table they give.

Run with the zoo venv (ResNet-50 needs torchvision, BERT transformers):
    .venv-zoo/bin/python benchmarks/gpu_time.py [--fit]
About 4 minutes on two shared cores, nearly all of it capturing.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
from memplan.hwmodels.kernels import FITTED, KernelConstants, KernelModel, KernelOptions  # noqa: E402
from memplan.hwmodels.latency import Roofline  # noqa: E402
from memplan.hwmodels.profile import Hardware, load_hardware  # noqa: E402
from memplan.traces import scaling  # noqa: E402
from memplan.traces.builders import ModelOptions  # noqa: E402
from memplan.traces.capture import CaptureOptions, capture  # noqa: E402
from memplan.traces.model import Trace  # noqa: E402
from memplan.traces.zoo import resolve  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "gpu_time.toml"
FIT_PROFILES = ("v100-sxm2-16gb", "a100-sxm-80gb", "rtx-a6000", "h100-sxm-80gb")


@dataclass(frozen=True, slots=True)
class Row:
    model: str
    gpu: str
    profile: str
    precision: str
    batch: int
    throughput: float
    unit: str

    @property
    def measured_s(self) -> float:
        return self.batch / self.throughput

    @property
    def fitted(self) -> bool:
        return self.profile in FIT_PROFILES


def load_rows() -> list[Row]:
    doc = tomllib.loads(DATA.read_text())
    fields = {f.name for f in dataclasses.fields(Row)}
    return [Row(**{k: v for k, v in r.items() if k in fields}) for r in doc["row"]]


# NOTE [ The anchors' steps ]
# What memplan captures for each row (the data file says what Lambda ran):
# - resnet50: torchvision's, SGD momentum 0.875 without foreach, NCHW; AMP = autocast fp16
#   with a GradScaler.
# - bert-base: transformers' BERT-base with a two-label token head (as the SQuAD span head),
#   eager attention, sequence 384. fp32: AdamW looped over parameters (BertAdam). AMP: apex
#   O2, so the model is built in fp16 (`--dtype fp16`, no autocast) with a fused AdamW; O2's
#   fp32 master weights are not modelled.
# - every row: TF32 matmuls on, the trace captured for the row's GPU.
# Full text: docs/notes.md, "The anchors' steps".
def _workload(model: str, amp: bool) -> tuple[Callable, str, dict, str]:
    """(workload factory, optimizer, its keywords, autocast) for a row."""
    if model == "resnet50":
        sgd = {"momentum": 0.875, "foreach": False}
        return resolve("tv:resnet50"), "sgd", sgd, "fp16" if amp else "none"
    if model == "bert-base":
        dtype = "fp16" if amp else "fp32"
        opts = ModelOptions(config={"attn_implementation": "eager"}, seq=384, dtype=dtype)
        kw = {"fused": True} if amp else {"foreach": False}
        return resolve("hf:BertForTokenClassification", opts), "adamw", kw, "none"
    raise SystemExit(f"{DATA}: unknown model {model!r}")


_FITS: dict[tuple, scaling.BatchFit] = {}


def trace_for(row: Row, hw: Hardware) -> Trace:
    key = (row.model, row.precision, hw.compute_capability)
    if key not in _FITS:
        factory, opt, kw, amp = _workload(row.model, row.precision == "amp")
        opts = CaptureOptions(optimizer=opt, optimizer_kwargs=kw, target=hw.target(), amp=amp)
        t0 = time.perf_counter()
        pair = [capture(factory, b, opts, model_name=row.model) for b in (2, 4)]
        _FITS[key] = scaling.fit(*pair)
        log(
            f"  captured {row.model} {row.precision} for sm {hw.compute_capability}: "
            f"{time.perf_counter() - t0:.0f}s"
        )
    return _FITS[key].at(row.batch)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def predict(model, trace: Trace, hw: Hardware) -> float:  # noqa: ANN001
    return float(np.sum(model.predict_all(trace, hw)))


def kernel_model(constants: KernelConstants) -> KernelModel:
    return KernelModel(KernelOptions(constants=constants, tf32_matmul=True))


# ---- fitting ---------------------------------------------------------------------------
# NOTE [ Fitting the kernel model ]
# Five constants, each mapped to an unbounded coordinate (the fractions by
# logit, the floor by log), are fitted by Nelder-Mead on the sum of squared
# log errors of the fitted GPUs' rows, from the shipped constants, restarted
# twice from the best point. Held-out rows never enter the objective.
_NAMES = ("tensor_conv", "tensor_matmul", "cuda_cores", "bandwidth", "floor_s")


def _to_x(k: KernelConstants) -> np.ndarray:
    fr = [getattr(k, n) for n in _NAMES[:4]]
    fl = [getattr(k, n) for n in _NAMES[4:]]
    fr = [min(max(f, 1e-6), 1 - 1e-6) for f in fr]
    return np.array([np.log(f / (1 - f)) for f in fr] + [np.log(max(f, 1e-9)) for f in fl])


def _from_x(x: np.ndarray) -> KernelConstants:
    fr = [float(np.clip(1 / (1 + np.exp(-v)), 1e-3, 1.0)) for v in x[:4]]
    fl = [float(min(np.exp(v), 5e-3)) for v in x[4:]]
    return KernelConstants(*fr, *fl)


def nelder_mead(f: Callable[[np.ndarray], float], x0: np.ndarray, iters: int = 600) -> np.ndarray:
    n = len(x0)
    simplex = [x0] + [x0 + np.eye(n)[i] * 0.5 for i in range(n)]
    vals = [f(x) for x in simplex]
    for _ in range(iters):
        order = np.argsort(vals)
        simplex = [simplex[i] for i in order]
        vals = [vals[i] for i in order]
        centroid = np.mean(simplex[:-1], axis=0)
        xr = centroid + (centroid - simplex[-1])
        fr = f(xr)
        if fr < vals[0]:
            xe = centroid + 2 * (centroid - simplex[-1])
            fe = f(xe)
            simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (simplex[-1] - centroid)
            fc = f(xc)
            if fc < vals[-1]:
                simplex[-1], vals[-1] = xc, fc
            else:
                simplex = [simplex[0] + 0.5 * (s - simplex[0]) for s in simplex]
                vals = [f(s) for s in simplex]
    return simplex[int(np.argmin(vals))]


def fit(cases: list[tuple[Row, Trace, Hardware]]) -> KernelConstants:
    fitting = [(r, t, hw) for r, t, hw in cases if r.fitted]

    def loss(x: np.ndarray) -> float:
        m = kernel_model(_from_x(x))
        return sum(np.log(predict(m, t, hw) / r.measured_s) ** 2 for r, t, hw in fitting)

    x = _to_x(FITTED)
    for _ in range(3):
        x = nelder_mead(loss, x)
    return _from_x(x)


# ---- the table -------------------------------------------------------------------------
def print_table(cases: list[tuple[Row, Trace, Hardware]], constants: KernelConstants) -> None:
    km, roof = kernel_model(constants), Roofline()
    head = (
        f"{'model':9} {'gpu (profile)':42} {'prec':5} {'batch':>5} {'measured':>9} "
        f"{'kernel':>9} {'error':>7} {'roofline':>9} {'error':>7}"
    )
    print(head)
    print("-" * len(head))
    errs: dict[tuple[str, bool], list[float]] = {}
    for fitted in (True, False):
        print(f"{'fitted GPUs' if fitted else 'held out'}:")
        for r, t, hw in cases:
            if r.fitted != fitted:
                continue
            k, ro = predict(km, t, hw), predict(roof, t, hw)
            ek, er = k / r.measured_s - 1, ro / r.measured_s - 1
            errs.setdefault(("kernel", fitted), []).append(ek)
            errs.setdefault(("roofline", fitted), []).append(er)
            errs.setdefault((f"kernel {r.model}", fitted), []).append(ek)
            errs.setdefault((f"kernel {r.precision}", fitted), []).append(ek)
            gpu = f"{r.gpu} ({r.profile})"
            print(
                f"{r.model:9} {gpu:42} {r.precision:5} {r.batch:5} {r.measured_s * 1e3:7.0f}ms "
                f"{k * 1e3:7.0f}ms {ek:+7.1%} {ro * 1e3:7.0f}ms {er:+7.1%}"
            )
    print()
    print("|error| of iteration time          rows   median    worst")
    for (name, fitted), e in errs.items():
        a = np.abs(e)
        what = f"{name}, {'fitted' if fitted else 'held out'}"
        print(f"  {what:33} {len(a):4} {np.median(a):8.1%} {a.max():8.1%}")
    print()
    print(
        "kernel model constants: " + ", ".join(f"{n} {getattr(constants, n):.4g}" for n in _NAMES)
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fit", action="store_true", help="fit the constants on the fitted GPUs' rows")
    args = ap.parse_args()
    t_all = time.perf_counter()
    rows = load_rows()
    log(f"{len(rows)} rows from {DATA.relative_to(ROOT)}; capturing on meta")
    cases = []
    for r in rows:
        hw = load_hardware(r.profile)
        cases.append((r, trace_for(r, hw), hw))
    constants = FITTED
    if args.fit:
        t0 = time.perf_counter()
        constants = fit(cases)
        log(f"fitted in {time.perf_counter() - t0:.0f}s")
    print(
        "memplan iteration time vs measured (Lambda's deeplearning-benchmark, NGC 22.09/22.10; "
        "meta captures for each GPU, scaled to the row's batch)"
    )
    print_table(cases, constants)
    log(f"total {time.perf_counter() - t_all:.0f}s")


if __name__ == "__main__":
    main()

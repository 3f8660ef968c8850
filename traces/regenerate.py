"""Regenerate the shipped traces: `python -m memplan.traces.regenerate --out traces/data`.

Needs the zoo extra (torchvision, transformers); `make traces` sets up a venv
with both. Every model is captured on the meta device at batch 16 with Adam.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from memplan.traces import io
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.zoo import resolve

SHIPPED = ("resnet50", "vgg16", "inception_v3", "densenet121", "bert_base", "gpt2")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", default="traces/data")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--models", default=",".join(SHIPPED))
    args = ap.parse_args()
    out = Path(args.out)
    for name in args.models.split(","):
        t0 = time.perf_counter()
        trace = capture(resolve(name), args.batch, CaptureOptions(device="meta"), model_name=name)
        path = out / f"{name}_b{args.batch}_adam.json.gz"
        io.save(trace, path)
        print(
            f"{name}: {trace.n_ops} ops, {trace.n_buffers} buffers, "
            f"{path.stat().st_size / 2**20:.2f} MiB, {time.perf_counter() - t0:.1f} s -> {path}"
        )


if __name__ == "__main__":
    main()

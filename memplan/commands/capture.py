"""`memplan capture`: record one training iteration of a model as a trace file."""

from __future__ import annotations

import argparse
import sys

from memplan.traces import io
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.model import Phase


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capture",
        help="record one training step (forward, backward, optimizer) as a trace",
        description=(
            "Record one full training iteration -- forward, loss, backward, optimizer.step(), "
            "zero_grad(set_to_none=True) -- op by op with every buffer it touches. "
            "On the meta device (default) any model size captures without using memory."
        ),
    )
    p.add_argument(
        "--model",
        required=True,
        help="a zoo name (mlp, small_cnn, resnet50, bert_base, ...) or package.module:callable "
        "taking the batch size and returning a traces.zoo.Workload",
    )
    p.add_argument("--batch", type=int, required=True, help="batch size")
    p.add_argument(
        "--optimizer",
        choices=("adam", "sgd"),
        default="adam",
        help="adam, or sgd with momentum 0.9 (default: adam)",
    )
    p.add_argument("--device", default="meta", help="meta (default), cpu or cuda")
    p.add_argument(
        "--measure",
        action="store_true",
        help="time every op (needs cpu or cuda): median of repeated runs",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="unrecorded iterations first, so optimizer state exists (default 1)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="trace file to write (.json or .json.gz)")
    p.set_defaults(func=run)


class _Progress:
    """One line on stderr, rewritten in place, when stderr is a terminal."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.tty = sys.stderr.isatty()

    def __call__(self, phase: Phase, n_ops: int) -> None:
        if self.tty and n_ops % 50 == 0:
            print(f"\rcapturing {self.name}: {n_ops} ops ({phase.value})", end="", file=sys.stderr)

    def done(self) -> None:
        if self.tty:
            print("\r\033[K", end="", file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from memplan import outputs
    from memplan.traces.zoo import resolve

    outputs.check_file(args.out)  # before any work: NOTE [ Output paths ]
    factory = resolve(args.model)
    opts = CaptureOptions(
        device=args.device,
        optimizer=args.optimizer,
        measure=args.measure,
        warmup_iterations=args.warmup,
        seed=args.seed,
    )
    progress = _Progress(args.model)
    trace = capture(factory, args.batch, opts, model_name=args.model, progress=progress)
    progress.done()
    with outputs.writing(args.out):
        io.save(trace, args.out)
    peak, op = trace.peak()
    print(
        f"captured {args.model} batch {args.batch} on {args.device}: {trace.n_ops} ops, "
        f"{trace.n_buffers} buffers, vanilla peak {peak / 2**20:.1f} MiB at op {op} -> {args.out}"
    )
    return 0

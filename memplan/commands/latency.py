"""`memplan latency train|eval|predict`: the MLP latency predictor and its rivals."""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict

from memplan.commands import machine
from memplan.hwmodels.errors import LatencyError
from memplan.hwmodels.mlptrain import TrainOptions
from memplan.units import integer, number

# latency models `eval` takes by name; anything else is a model file
NAMED_MODELS = ("kernel", "roofline")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "latency",
        help="train and evaluate the MLP latency predictor; predict a trace's op times",
        description=(
            "TENSILE's latency predictor: train one small MLP per op class on "
            "microbenchmarks (`memplan microbench`), evaluate it on held-out shapes "
            "against the roofline, or time every op of a trace with any latency model."
        ),
    )
    lat = p.add_subparsers(dest="latency_command", metavar="ACTION")
    lat.required = True

    t = lat.add_parser("train", help="train an MLP latency model on a microbenchmark dataset")
    t.add_argument("data", metavar="DATA", help="dataset from `memplan microbench`")
    t.add_argument("--out", required=True, metavar="MODEL", help="model file to write (.pt)")
    d = TrainOptions()
    hidden = ",".join(str(h) for h in d.hidden)
    t.add_argument(
        "--hidden",
        default=hidden,
        help=f"hidden layer sizes, 1 to 8 of them from 1 to 4096 (default {hidden})",
    )
    t.add_argument("--ensemble", type=integer(1, 100), default=d.ensemble,
                   help=f"networks per op class (default {d.ensemble})")  # fmt: skip
    t.add_argument("--epochs", type=integer(1, 1_000_000), default=d.epochs,
                   help=f"full-batch training epochs (default {d.epochs})")  # fmt: skip
    t.add_argument("--seed", type=integer(0, 2**63 - 1), default=0)
    t.set_defaults(func=run_train)

    e = lat.add_parser("eval", help="errors of a latency model on a dataset, against the roofline")
    e.add_argument(
        "model",
        metavar="MODEL",
        help="model file from `memplan latency train`, or kernel or roofline (with --hardware)",
    )
    e.add_argument("data", metavar="DATA", help="dataset from `memplan microbench`")
    e.add_argument(
        "--rows",
        choices=("heldout", "train", "all"),
        default="heldout",
        help="which measurements: the held-out shapes (default), the training ones, or all",
    )
    e.add_argument(
        "--hardware", default="", help="profile for the roofline (default: the model's hardware)"
    )
    e.add_argument("--json", action="store_true", help="print JSON instead of a table")
    e.set_defaults(func=run_eval)

    q = lat.add_parser("predict", help="time every op of a trace")
    q.add_argument(
        "trace",
        metavar="TRACE",
        help="trace file (.json or .json.gz), or zoo:NAME for a shipped trace",
    )
    q.add_argument("--hardware", required=True, help="profile name or .toml path")
    q.add_argument(
        "--model",
        default=machine.DEFAULT_LATENCY,
        metavar=machine.LATENCY_CHOICES,
        help="latency model (default kernel: the GPU kernel model, the roofline on a cpu "
        "profile; mlp = the shipped CPU model)",
    )
    q.add_argument(
        "--usage",
        type=number(0, 1),
        default=0.0,
        help="device share taken by others, a fraction in [0, 1] (default 0)",
    )
    q.add_argument("--top", type=integer(0, 100_000), default=10, help="list this many slowest ops")
    q.set_defaults(func=run_predict)


def run_train(args: argparse.Namespace) -> int:
    from memplan import outputs
    from memplan.hwmodels.dataset import load_dataset
    from memplan.hwmodels.mlptrain import TrainOptions, train_mlp

    outputs.check_file(args.out)  # before any work: NOTE [ Output paths ]
    try:
        hidden = tuple(integer(1, 4096)(h) for h in args.hidden.split(","))
    except argparse.ArgumentTypeError:
        hidden = ()
    if not 1 <= len(hidden) <= 8:
        raise LatencyError(
            f"--hidden={args.hidden!r}: expected 1 to 8 sizes from 1 to 4096, such as 64,64,32"
        )
    opts = TrainOptions(hidden=hidden, ensemble=args.ensemble, epochs=args.epochs, seed=args.seed)
    ds = load_dataset(args.data)
    t0 = time.perf_counter()
    model = train_mlp(
        ds, opts, progress=lambda c, n: print(f"  {c.value:<12} {n:>6} training rows", flush=True)
    )
    with outputs.writing(args.out):
        model.save(args.out)
    print(
        f"trained {len(model.nets)} op classes x {opts.ensemble} networks on "
        f"{model.meta.n_train} measurements ({model.meta.hardware}) in "
        f"{time.perf_counter() - t0:.0f} s; wrote {args.out}"
    )
    return 0


def run_eval(args: argparse.Namespace) -> int:
    from memplan.hwmodels.dataset import load_dataset
    from memplan.hwmodels.evaluate import evaluate
    from memplan.hwmodels.latency import Roofline
    from memplan.hwmodels.mlp import MLPLatency
    from memplan.hwmodels.profile import load_hardware

    if args.model in NAMED_MODELS:
        if not args.hardware:
            raise LatencyError(f"latency eval {args.model}: --hardware names the profile it times")
        model, name = machine.latency_model(args.model), args.model
        hw = load_hardware(args.hardware)
    else:
        model, name = MLPLatency.load(args.model), "MLP"
        hw = load_hardware(args.hardware or model.meta.hardware)
    ds = load_dataset(args.data)
    held = ds.heldout()
    rows = {"heldout": held, "train": ~held, "all": held | ~held}[args.rows]
    if not rows.any():
        raise LatencyError(f"{args.data}: no measurements in the {args.rows} split")
    mlp = evaluate(model, ds, hw, rows)
    stats = getattr(model, "last_stats", None)
    roof = evaluate(Roofline(), ds, hw, rows)
    if args.json:
        doc = {
            "rows": args.rows,
            name.lower(): {k: asdict(v) for k, v in mlp.items()},
            "roofline": {k: asdict(v) for k, v in roof.items()},
            "fallback": stats.fallback_by_reason if stats else {},
        }
        print(json.dumps(doc, indent=2))
        return 0
    print(f"{args.rows} rows of {args.data} on {hw.name}: absolute percentage error")
    print(
        f"  {'class':<13}{'n':>6}   {name + ' MdAPE':>13}{'±10%':>7}{'±20%':>7}   {'roofline':>9}"
        f"{'±20%':>7}"
    )
    for k, s in mlp.items():
        r = roof[k]
        print(
            f"  {k:<13}{s.n:>6}   {s.mdape * 100:>12.1f}%{s.within_10 * 100:>6.0f}%"
            f"{s.within_20 * 100:>6.0f}%   {r.mdape * 100:>8.1f}%{r.within_20 * 100:>6.0f}%"
        )
    if stats is not None and stats.n_fallback:
        print(f"  {stats.n_fallback} of {stats.n_ops} rows fell back to the roofline:")
        for reason, n in sorted(stats.fallback_by_reason.items(), key=lambda kv: -kv[1]):
            print(f"    {n:>5}  {reason}")
    return 0


def run_predict(args: argparse.Namespace) -> int:
    from memplan.hwmodels.mlp import MLPLatency
    from memplan.hwmodels.profile import load_hardware

    trace = machine.one_trace(args.trace, "latency predict")
    hw = load_hardware(args.hardware)
    model = machine.latency_model(args.model)
    t0 = time.perf_counter()
    s = model.predict_all(trace, hw, args.usage)
    dt = time.perf_counter() - t0
    print(
        f"{trace.meta.model} batch {trace.meta.batch_size} on {hw.name} ({model.name}, "
        f"usage {args.usage:g}): {trace.n_ops} ops, {s.sum() * 1e3:.2f} ms per iteration "
        f"(predicted in {dt * 1e3:.0f} ms)"
    )
    if isinstance(model, MLPLatency) and model.last_stats is not None:
        st = model.last_stats
        print(f"  MLP timed {st.n_mlp} ops; {st.n_fallback} fell back to the roofline")
        for reason, n in sorted(st.fallback_by_reason.items(), key=lambda kv: -kv[1])[:5]:
            print(f"    {n:>5}  {reason}")
    order = s.argsort()[::-1][: args.top]
    print(f"  slowest {len(order)} ops:")
    for i in order:
        op = trace.ops[int(i)]
        print(f"    #{op.id:<6}{s[i] * 1e3:>9.3f} ms  {op.phase.value:<10}{op.target}")
    return 0

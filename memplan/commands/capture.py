"""`memplan capture`: record one training iteration of a model as a trace file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from memplan.traces import builders, io, optim
from memplan.traces.builders import Dtype, ModelOptions
from memplan.traces.capture import CaptureOptions, capture
from memplan.traces.errors import MemplanError, TraceError
from memplan.traces.model import MAX_ACCUMULATE, Phase
from memplan.traces.target import AttentionBackend, Target
from memplan.units import integer


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capture",
        help="record one training step (forward, backward, optimizer) as a trace",
        description=(
            "Record one full training iteration -- forward, loss, backward, optimizer.step(), "
            "zero_grad(set_to_none=True) -- op by op with every buffer it touches. "
            "On the meta device (default) any model size captures without using memory. "
            "The trace records the optimizer and its keywords, --amp and --accumulate."
        ),
    )
    p.add_argument(
        "--model",
        required=True,
        help="a zoo name (mlp, small_cnn, resnet50, bert_base, ...), tv:NAME (any torchvision "
        "classification or segmentation model: tv:resnet152), hf:ARCH (any transformers "
        "architecture from its config, no download: hf:llama, hf:LlamaForCausalLM) or "
        "package.module:callable taking the batch size and returning a traces.zoo.Workload",
    )
    p.add_argument("--batch", type=integer(1, 1_000_000), required=True, help="batch size")
    p.add_argument(
        "--optimizer",
        default="adam",
        metavar="NAME",
        help="any torch.optim optimizer, any case: adam (default), adamw, sgd, rmsprop, adagrad, "
        "... (not lbfgs, sparseadam). Built as the trace's device runs it: foreach on CUDA "
        "(a cuda capture or a CUDA --target), one update per parameter elsewhere, unless --opt "
        "says foreach or fused; sgd means momentum 0.9 unless --opt momentum=... "
        "(momentum=0: plain SGD, no optimizer state)",
    )
    p.add_argument(
        "--opt",
        type=keywords,
        action="append",
        default=[],
        metavar="K=V,...",
        help="the optimizer's keyword arguments, e.g. lr=1e-3,weight_decay=0.01,betas=(0.9,0.99) "
        "or fused=true (cpu, cuda); numbers, true/false, none and (tuples) are read as such",
    )
    p.add_argument(
        "--amp",
        choices=("bf16", "fp16"),
        default=None,
        help="mixed precision: torch.autocast to bf16, or to fp16 with a GradScaler, around "
        "forward and loss; on --device cpu or cuda, or on meta with a --target (its autocast "
        "emulated; fp16 assumes finite grads: every step is taken)",
    )
    p.add_argument(
        "--accumulate",
        type=integer(1, MAX_ACCUMULATE),
        default=1,
        metavar="K",
        help="gradient accumulation: K forward/backward passes of --batch each, then one "
        "optimizer step; the trace is the whole iteration (default 1)",
    )
    p.add_argument(
        "--device",
        default="meta",
        help="meta (default), cpu or cuda. Models with LSTM/GRU/RNN layers need cpu or cuda, "
        "or on meta a CUDA --target (cuDNN's fused kernel, emulated); --amp needs cpu, cuda "
        "or a --target; optimizers that read tensor values (asgd, adafactor) need cpu or cuda",
    )
    add_target(p)
    add_model_options(p)
    p.add_argument(
        "--measure",
        action="store_true",
        help="time every op (needs cpu or cuda): median of repeated runs",
    )
    p.add_argument(
        "--threads",
        type=integer(1, 1024),
        default=None,
        help="with --measure on cpu: intra-op threads, the process pinned to that many cores "
        "(default 1, as `memplan microbench`); a warning when other processes kept the other "
        "cores busy",
    )
    p.add_argument(
        "--warmup",
        type=integer(0, 100),
        default=1,
        help="unrecorded iterations first, so optimizer state exists (default 1)",
    )
    p.add_argument("--seed", type=integer(0, 2**63 - 1), default=0)
    p.add_argument("--out", required=True, help="trace file to write (.json or .json.gz)")
    p.set_defaults(func=run)


def add_target(p: argparse.ArgumentParser) -> None:
    """`--target` and `--attention`, shared with `memplan capacity`."""
    p.add_argument(
        "--target",
        metavar="PROFILE",
        help="the GPU (a profile of `memplan hw list`, or a .toml) the trace is captured for: "
        "on meta, what PyTorch's CUDA dispatch runs there is recorded -- the attention kernel "
        "it picks (flash, memory-efficient, cuDNN), cuDNN's fused RNNs, autocast's casts; "
        "cpu-local: what cpu runs. Without it a meta capture records meta's own dispatch "
        "(math attention: seq x seq matrices)",
    )
    p.add_argument(
        "--attention",
        choices=[b.value for b in AttentionBackend],
        default=None,
        help="with --target: pin F.scaled_dot_product_attention's kernel, as "
        "torch.nn.attention.sdpa_kernel does (default auto: the one the target picks)",
    )


def add_model_options(p: argparse.ArgumentParser) -> None:
    """How --model's model is built (traces.builders.ModelOptions), shared
    with `memplan capacity`; read by `model_options_of`."""
    g = p.add_argument_group(
        "how the model is built",
        "NOTE [ Model options ] in traces/builders/options.py: which apply to which models",
    )
    g.add_argument(
        "--dtype",
        choices=[d.value for d in Dtype],
        default=None,
        help="the dtype the model is built in (default fp32): pure low-precision training, "
        "parameters, grads, optimizer state and activations all in it, e.g. --dtype bf16 "
        "(--amp instead keeps fp32 parameters). Zoo and package.module:callable models are "
        "converted with .to(dtype), floating inputs and targets too",
    )
    g.add_argument(
        "--config",
        action="append",
        default=None,
        metavar="K=V,...|FILE.json",
        help="hf: only: config fields over the config class's defaults, typed by them, e.g. "
        "hidden_size=2048,num_hidden_layers=16 or attn_implementation=eager (default: the "
        "model's own, sdpa where supported); or a config.json (its dtype is ignored: --dtype "
        "decides). Repeatable: a file first, then fields over it",
    )
    g.add_argument(
        "--seq",
        type=integer(1, 10_000_000),
        default=None,
        metavar="N",
        help="hf: only: tokens per sequence (default min(512, max_position_embeddings)), "
        "e.g. --seq 2048",
    )
    g.add_argument(
        "--image",
        type=integer(32, 100_000),
        default=None,
        metavar="S",
        help="tv: only: random images of S x S pixels (default 224; 299 for inception_v3), "
        "e.g. --image 480",
    )
    g.add_argument(
        "--freeze",
        action="append",
        default=None,
        metavar="PATTERN,...",
        help="parameters left untrained (no grad, no optimizer state): fnmatch patterns on "
        "their names, each must match one, e.g. 'model.embed_tokens.*,lm_head.*'",
    )
    g.add_argument(
        "--lora",
        default=None,
        metavar="K=V,...",
        help="LoRA adapters through peft (pip install peft), every other parameter frozen: "
        "r, alpha, dropout, target_modules, e.g. r=8,alpha=16,target_modules=q_proj,v_proj "
        "(hf: models default to peft's modules for the architecture)",
    )
    g.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        default=None,
        help="hf: only: transformers' gradient checkpointing (non-reentrant): each layer's "
        "forward runs again in backward, its activations not kept",
    )


def check_amp(amp: str | None, built: ModelOptions) -> None:
    """`MemplanError` for --amp over parameters that are not fp32."""
    if amp and built.dtype is not Dtype.FP32:
        raise MemplanError(
            f"--amp {amp} with --dtype {built.dtype.value}: --amp is mixed precision over "
            "fp32 parameters, --dtype pure low-precision training; give one"
        )


def model_options_of(args: argparse.Namespace) -> ModelOptions:
    """The `ModelOptions` of `add_model_options`' arguments."""
    config: dict = {}
    config_file = None
    for text in args.config or []:
        if "=" not in text:
            if config_file is not None:
                raise MemplanError(f"--config {text}: one config file at most ({config_file})")
            config_file = text
            continue
        for key, value in builders.parse_assignments(text, "--config").items():
            if key in config:
                raise MemplanError(f"--config: {key!r} is given twice")
            config[key] = value
    freeze = tuple(p for text in args.freeze or [] for p in builders.parse_freeze(text))
    return ModelOptions(
        dtype=args.dtype or "fp32",
        config=config,
        config_file=config_file,
        seq=args.seq,
        image=args.image,
        freeze=freeze,
        lora=None if args.lora is None else builders.parse_lora(args.lora),
        gradient_checkpointing=bool(args.gradient_checkpointing),
    )


def target_of(args: argparse.Namespace, default: str | None = None) -> Target | None:
    """The `Target` named by `--target` (or `default`), with `--attention`."""
    from memplan.hwmodels.profile import load_hardware

    name = args.target or default
    if name is None:
        if args.attention is not None:
            raise MemplanError("--attention pins the kernel a --target runs: give --target")
        return None
    attention = AttentionBackend(args.attention or "auto")
    try:
        hw = load_hardware(name)
        if args.target is None and hw.device.value == "cuda" and hw.compute_capability is None:
            return None  # a profile of the user's that names no architecture: meta's dispatch
        return hw.target(attention)
    except MemplanError as e:
        raise MemplanError(f"--target: {e}") from None


def keywords(text: str) -> dict:
    """An argparse `type`: `--opt` as a dict (`optim.parse_kwargs`)."""
    try:
        return optim.parse_kwargs(text)
    except TraceError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def merged_keywords(given: list[dict]) -> dict:
    """The `--opt` dicts as one; a key given twice is an error."""
    out: dict = {}
    for kwargs in given:
        for key, value in kwargs.items():
            if key in out:
                raise MemplanError(f"--opt: {key!r} is given twice")
            out[key] = value
    return out


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


@contextmanager
def measuring(args: argparse.Namespace) -> Iterator[dict]:
    """Around a measured capture on cpu: `--threads` and the pinning of
    `memplan microbench`, and a warning when other processes kept the other
    cores busy. Yields the dict filled with what the trace records of it
    (NOTE [ Measured on ] in memplan/commands/machine.py)."""
    found: dict = {}
    if not args.measure:
        yield found
        return
    if args.device != "cpu":
        yield found
        found["measured_on"] = {"device": args.device}
        return
    from memplan.hwmodels.microbench import OtherActivity, busy_warning, cpu_description, cpu_setup

    with cpu_setup(args.threads) as cores:
        others = OtherActivity(cores)
        others.start()
        yield found
        busy = others.stop()
    found["measured_on"] = {
        "device": "cpu",
        "description": cpu_description(args.threads),
        "threads": args.threads,
        "other_busy_cores": busy,
    }
    warning = busy_warning(busy)
    if warning:
        print(warning, file=sys.stderr)


def run(args: argparse.Namespace) -> int:
    from memplan import outputs
    from memplan.traces.zoo import resolve

    if args.threads is not None and not (args.measure and args.device == "cpu"):
        raise MemplanError(
            "--threads applies to a measured capture on cpu (--measure --device cpu)"
        )
    args.threads = args.threads or 1
    outputs.check_file(args.out)  # before any work: NOTE [ Output paths ]
    built = model_options_of(args)
    check_amp(args.amp, built)
    factory = resolve(args.model, built)
    opts = CaptureOptions(
        device=args.device,
        optimizer=args.optimizer,
        optimizer_kwargs=merged_keywords(args.opt),
        amp=args.amp or "none",
        accumulate=args.accumulate,
        target=target_of(args),
        measure=args.measure,
        warmup_iterations=args.warmup,
        seed=args.seed,
    )
    progress = _Progress(args.model)
    with measuring(args) as measured:
        trace = capture(factory, args.batch, opts, model_name=args.model, progress=progress)
    progress.done()
    if measured:  # NOTE [ Measured on ] in memplan/commands/machine.py
        trace = replace(trace, meta=replace(trace.meta, extra={**trace.meta.extra, **measured}))
    trace = builders.recorded(trace, built)
    with outputs.writing(args.out):
        io.save(trace, args.out)
    peak, op = trace.peak()
    m = trace.meta
    how = optim.describe(m.optimizer, m.optimizer_kwargs)
    how += "" if m.amp.value == "none" else f", amp {m.amp.value}"
    how += "" if m.accumulate == 1 else f", {m.accumulate} passes accumulated"
    how += "" if m.target is None else f", for {m.target.describe()}"
    how += f", {built.describe()}" if built.describe() else ""
    print(
        f"captured {args.model} batch {args.batch} on {args.device} ({how}): {trace.n_ops} ops, "
        f"{trace.n_buffers} buffers, vanilla peak {peak / 2**20:.1f} MiB at op {op} -> {args.out}"
    )
    return 0

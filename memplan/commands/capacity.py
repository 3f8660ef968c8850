"""`memplan capacity --model M --gpu G`: the largest batch (or the most jobs)
that fits a GPU with each planner, and at what slowdown."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from memplan.commands import capture, machine
from memplan.traces.errors import MemplanError
from memplan.traces.fields import printable
from memplan.traces.model import MAX_ACCUMULATE
from memplan.units import integer, number, parse_size

if TYPE_CHECKING:
    from memplan.capacity import Capacity, Settings
    from memplan.hwmodels.device import DeviceModel
    from memplan.traces.builders import ModelOptions
    from memplan.traces.capture import CaptureOptions
    from memplan.traces.model import Trace

MAX_BATCH = 1_000_000
DEFAULT_HI = 65_536
DEFAULT_SEQS = (128, 8192)
MAX_SEQ = 10_000_000  # `--seq`'s own limit

# NOTE [ Capacity time limits ]
# Every probe of the search plans once (NOTE [ Capacity search ] in
# memplan/capacity.py), and a search takes about 10 probes per planner, so a
# planner that searches until a limit sets the time of the whole answer. In
# `memplan capacity`, `all` is vanilla, every heuristic planner and the
# witnesses passive and dtr; the searching planners, squeeze, cpsat and
# swapadvisor, run only when named, with limits per probe: swapadvisor 3
# generations of 8 (ended by generations: reproducible), squeeze 20 simulated
# candidates (it is then deterministic, NOTE [ Squeeze ]; about 3 s a probe
# on bert_base, 27 s for its search, where the heuristics take 1-6 s each),
# cpsat 5 s. `--option` overrides them (squeeze.max_evaluations=3000
# searches as `compare` does). A searching planner's answer is what it finds
# within these limits: a larger limit may fit a larger batch.
PROBE_OPTIONS = {
    "squeeze": ["max_evaluations=20", "time_limit_s=60"],
    "cpsat": ["time_limit_s=5"],
    "swapadvisor": ["population=8", "generations=3", "time_limit_s=60"],
}


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capacity",
        help="the largest batch (or sequence, or the most jobs) that fits a GPU, per planner",
        description=(
            "For each planner, the largest batch that fits the GPU -- or, with --jobs auto, "
            "the most concurrent jobs -- and the peak, EOR and iteration time there. A batch "
            "fits a planner when its plan, simulated at the budget, fits alone (with "
            "--fallback: or with the net) and its EOR is at most --max-eor. The search "
            "bisects on the batch; traces at every batch are scaled from captures at two "
            "(meta device), checked against a third, and captured where scaling does not "
            "hold (said on stderr). With --axis seq, the longest sequence (tokens) at --batch "
            "instead, for models that take --seq (hf:): every probe captured at its own "
            "sequence length (NOTE [ Capacity over the sequence ])."
        ),
    )
    what = p.add_mutually_exclusive_group()
    what.add_argument(
        "--model",
        help="a zoo name (resnet50, bert_base, mlp, ...), tv:NAME (torchvision: tv:resnet152), "
        "hf:ARCH (transformers, from its config: hf:llama) or package.module:callable: "
        "captured on the meta device at the batches the search needs, built as --dtype, "
        "--config, --seq, --image, --freeze, --lora, --gradient-checkpointing say",
    )
    what.add_argument(
        "--trace",
        metavar="T",
        help="a trace file: one job at its own batch (a trace cannot change its batch). "
        "With --jobs auto the most copies that fit are searched; with --jobs N, whether N "
        "copies fit. The batch search needs --model",
    )
    machine.add_gpu(p)
    p.add_argument(
        "--planners",
        default="all",
        help="'all' (default: vanilla, every heuristic planner and the passive and dtr "
        "witnesses) or a comma-separated list, e.g. all,squeeze; squeeze, cpsat and "
        "swapadvisor search until a limit and run only when named, with 20 candidates "
        "(squeeze), 5 s (cpsat) or 3 generations of 8 (swapadvisor) per probe; vanilla is "
        "always searched first",
    )
    p.add_argument(
        "--jobs",
        default="1",
        metavar="N|auto|M1:C1,M2:C2",
        help="N copies of the job run together (default 1); auto: the most copies that fit "
        "(at --batch, or the trace's batch); or a mix of models with counts, resnet50:2,"
        "bert_base:1, all at one batch (instead of --model)",
    )
    _add_axis_options(p)
    p.add_argument(
        "--max-eor",
        type=number(0, 1e6, lo_open=True),
        metavar="X",
        help="the most slowdown a fit may cost: EOR (planned time / vanilla time, TENSILE) "
        "at most X (default: any)",
    )
    machine.add_fallback(p)
    p.add_argument(
        "--budget",
        help="device memory for all jobs, their CUDA contexts included (--allocator, "
        "--context-reserve): 8GiB, 512MB or whole bytes, at most the GPU's (default: the "
        "GPU's memory); not a share (the vanilla peak changes with the batch)",
    )
    machine.add_allocator(p)
    machine.add_lanes(p)
    machine.add_latency(p)
    p.add_argument(
        "--iterations",
        type=integer(1, 100),
        default=2,
        help="simulated iterations per probe (default 2: the first and one steady)",
    )
    p.add_argument(
        "--option",
        action="append",
        default=[],
        metavar="PLANNER.KEY=VALUE",
        help="a planner option (repeatable); per probe squeeze gets max_evaluations=20, cpsat "
        "time_limit_s=5 and swapadvisor population=8 and generations=3 unless given here",
    )
    _add_capture_options(p)
    p.add_argument("--out", metavar="DIR", help="write report.md, report.json and capacity.png")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=run)


def _add_axis_options(p: argparse.ArgumentParser) -> None:
    """What is searched, and over what range (--batch, --axis, --seqs, --batches)."""
    p.add_argument(
        "--batch",
        type=integer(1, MAX_BATCH),
        help="the batch of every job, not searched: with --jobs auto or --axis seq, or to test "
        "one batch",
    )
    p.add_argument(
        "--axis",
        choices=("batch", "seq"),
        default="batch",
        help="what is searched: batch (default), or seq, the tokens per sequence of a --model "
        "that takes --seq (hf:), every job at --batch (required)",
    )
    p.add_argument(
        "--seqs",
        metavar="LO:HI",
        help=f"with --axis seq: the range of the search (default {DEFAULT_SEQS[0]}:"
        f"{DEFAULT_SEQS[1]}, HI cut to the model's max_position_embeddings; at most {MAX_SEQ})",
    )
    p.add_argument(
        "--batches",
        metavar="LO:HI",
        help=f"the range of the batch search (default 1:{DEFAULT_HI}, at most {MAX_BATCH})",
    )


def _add_capture_options(p: argparse.ArgumentParser) -> None:
    """How the step is captured with --model (`memplan capture`'s options)."""
    p.add_argument(
        "--optimizer",
        metavar="NAME",
        help="with --model: the captured step's torch.optim optimizer, as `memplan capture "
        "--optimizer` (default adam)",
    )
    p.add_argument(
        "--opt",
        type=capture.keywords,
        action="append",
        metavar="K=V,...",
        help="with --model: the optimizer's keyword arguments, as `memplan capture --opt`",
    )
    p.add_argument(
        "--accumulate",
        type=integer(1, MAX_ACCUMULATE),
        metavar="K",
        help="with --model: K forward/backward passes of the batch per step (default 1); "
        "the batch searched is each pass's",
    )
    p.add_argument(
        "--amp",
        choices=("bf16", "fp16"),
        default=None,
        help="with --model: mixed precision over fp32 parameters, as `memplan capture --amp` "
        "(on meta, autocast as the --target GPU runs it)",
    )
    capture.add_target(p)
    capture.add_model_options(p)  # with --jobs M1:C1,M2:C2: every model is built so


# ---- arguments -------------------------------------------------------------------------
def parse_jobs(text: str) -> int | str | list[tuple[str, int]]:
    """`--jobs`: a count, "auto", or [(model, count), ...]."""
    text = text.strip()
    if text == "auto":
        return "auto"
    if text.isascii() and text.isdigit():
        if len(text) > 6 or not 1 <= int(text) <= machine.MAX_JOBS:
            raise MemplanError(f"--jobs={text!r}: from 1 to {machine.MAX_JOBS} jobs on one GPU")
        return int(text)
    mix: list[tuple[str, int]] = []
    for item in text.split(","):
        model, sep, count = item.strip().rpartition(":")
        if not sep or not (count.isascii() and count.isdigit()):
            model, count = item.strip(), "1"
        if not model or len(count) > 6 or int(count) < 1:
            raise MemplanError(
                f"--jobs: {item.strip()!r}: expected MODEL or MODEL:COUNT with COUNT >= 1 "
                "(or a number of jobs, or auto)"
            )
        mix.append((model, int(count)))
    total = sum(n for _, n in mix)
    if total > machine.MAX_JOBS:
        raise MemplanError(f"--jobs: {total} jobs; at most {machine.MAX_JOBS} run on one GPU")
    return mix


def parse_range(
    text: str | None,
    flag: str = "--batches",
    default: tuple[int, int] = (1, DEFAULT_HI),
    most: int = MAX_BATCH,
) -> tuple[int, int]:
    """`--batches LO:HI` (or `--seqs`: `flag`, with its default and limit)."""
    if text is None:
        return default
    lo, sep, hi = text.partition(":")
    if not (sep and all(s.strip().isascii() and s.strip().isdigit() for s in (lo, hi))):
        raise MemplanError(f"{flag}={text!r}: expected LO:HI, two whole numbers")
    a, b = (int(x) if len(x.strip()) <= 8 else most + 1 for x in (lo, hi))
    if not 1 <= a <= b <= most:
        raise MemplanError(f"{flag}={text!r}: need 1 <= LO <= HI <= {most}")
    return a, b


def planner_list(text: str) -> tuple[str, ...]:
    """vanilla first, then `compare`'s reading of --planners without the
    searching planners in `all` (NOTE [ Capacity time limits ])."""
    from memplan.commands.compare import planner_names
    from memplan.comparison import WITNESSES
    from memplan.planners import registry

    none = registry.Search.NONE
    names: list[str] = ["vanilla"]
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        found = planner_names(item)
        if item == "all":  # the searches run only when named
            found = [n for n in found if n in WITNESSES or registry.traits(n).search is none]
        names += [n for n in found if n not in names]
    if len(names) == 1 and "vanilla" not in text.split(","):
        raise MemplanError("--planners: give 'all' or planner names separated by commas")
    return tuple(names)


def settings(args: argparse.Namespace, device: DeviceModel) -> Settings:
    from memplan.capacity import Settings
    from memplan.commands.compare import parse_options
    from memplan.planners import registry

    planners = planner_list(args.planners)
    options = {k: list(v) for k, v in PROBE_OPTIONS.items() if k in planners}
    for name, items in parse_options(args.option).items():
        if name not in planners:
            raise MemplanError(f"--option {name}.*: planner {name!r} is not being searched")
        options[name] = options.get(name, []) + items
    for name in planners:  # bad options fail before any capture
        if name not in ("passive", "dtr"):
            registry.make_options(name, options.get(name))
    if (args.budget or "").strip().endswith("%"):
        raise MemplanError(
            f"--budget={args.budget!r}: give bytes (8GiB); a share of the vanilla peak has "
            "no fixed size when the batch changes"
        )
    budget = device.hw.memory_bytes
    if args.budget is not None:
        budget = machine.check_budget(parse_size(args.budget, "--budget"), device.hw, args)
    return Settings(
        planners=planners,
        budget_bytes=budget,
        max_eor=args.max_eor,
        iterations=args.iterations,
        options=options,
        config=machine.run_config(args),
    )


# ---- running ---------------------------------------------------------------------------
class _Bar:
    """A tqdm bar over the planners on stderr (off when stderr is no terminal)."""

    def __init__(self, planners: tuple[str, ...], disable: bool) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=len(planners), unit="planner", desc="capacity", disable=True if disable else None
        )
        self.planners = planners
        self.current = ""
        self.probes = 0

    def __call__(self, planner: str, x: int) -> None:
        if planner != self.current and planner in self.planners:
            if self.current:
                self.bar.update(1)
            self.current = planner
        self.probes += 1
        self.bar.set_postfix_str(f"{planner} at {x}", refresh=True)

    def close(self) -> None:
        if self.current:
            self.bar.update(1)
        self.bar.close()


def _check_seq_axis(args: argparse.Namespace, jobs: int | str | list) -> None:
    """`--axis seq`'s rules (NOTE [ Capacity over the sequence ])."""
    if args.axis != "seq":
        if args.seqs is not None:
            raise MemplanError("--seqs is the range of --axis seq: give --axis seq, or --batches")
        return
    if args.trace or isinstance(jobs, list) or jobs == "auto":
        raise MemplanError(
            "--axis seq searches one --model's sequence length: not with --trace, --jobs auto "
            "or a mix of models"
        )
    for opt in ("seq", "batches"):
        if getattr(args, opt) is not None:
            raise MemplanError(f"--{opt} with --axis seq: the sequence is searched (--seqs LO:HI)")
    if args.batch is None:
        raise MemplanError("--axis seq searches the sequence at one batch: give --batch B")


def _check_modes(args: argparse.Namespace, jobs: int | str | list) -> None:
    _check_seq_axis(args, jobs)
    mix = isinstance(jobs, list)
    if mix and (args.model or args.trace):
        raise MemplanError("--jobs names the models (M1:C1,M2:C2): drop --model and --trace")
    if not (mix or args.model or args.trace):
        raise MemplanError("give --model M, --trace T, or --jobs M1:C1,M2:C2 naming the models")
    if jobs == "auto" and args.model and args.batch is None:
        raise MemplanError(
            "--jobs auto searches the number of jobs at one batch: give --batch B (or --trace T)"
        )
    if args.trace:
        for opt in ("batch", "batches", "optimizer", "opt", "accumulate", "amp", "target",
                    "attention", *_MODEL_OPTIONS):  # fmt: skip
            if getattr(args, opt) is not None:
                flag = opt.replace("_", "-")
                raise MemplanError(
                    f"--{flag} with --trace: a trace is one captured step at its own batch; "
                    "use --model to search batches"
                )
    if args.batches is not None and (args.batch is not None or jobs == "auto"):
        raise MemplanError(
            "--batches is the range of the batch search: not with --batch or --jobs auto"
        )


# `capture.add_model_options`' arguments: None when not given
_MODEL_OPTIONS = ("dtype", "config", "seq", "image", "freeze", "lora", "gradient_checkpointing")


def _capture_options(args: argparse.Namespace) -> CaptureOptions:
    from memplan.traces.capture import CaptureOptions

    kwargs = capture.merged_keywords(args.opt or [])
    try:
        return CaptureOptions(
            optimizer=args.optimizer or "adam",
            optimizer_kwargs=kwargs,
            accumulate=args.accumulate or 1,
            amp=args.amp or "none",
            target=capture.target_of(args, default=args.gpu),
        )
    except MemplanError as e:
        raise MemplanError(f"--optimizer, --opt, --accumulate, --amp or --target: {e}") from None


def _scaler(model: str, args: argparse.Namespace, built: ModelOptions):  # noqa: ANN202
    from memplan.traces.scaling import BatchTraces, model_captures

    return BatchTraces(model_captures(model, _capture_options(args), built))


def _default_seqs(model: str, built: ModelOptions) -> tuple[int, int]:
    """`DEFAULT_SEQS`, HI cut to an hf: model's max_position_embeddings."""
    from memplan.traces import builders

    if not model.startswith("hf:"):
        return DEFAULT_SEQS  # refused below: it takes no --seq
    try:
        limit = getattr(
            builders.transformers_model(model[3:], built).config, "max_position_embeddings", None
        )
    except MemplanError:
        return DEFAULT_SEQS  # the same error comes again below, said with --seqs
    hi = min(DEFAULT_SEQS[1], limit) if isinstance(limit, int) and limit > 0 else DEFAULT_SEQS[1]
    return min(DEFAULT_SEQS[0], hi), hi


def _seq_search(args: argparse.Namespace, built: ModelOptions, copies: int) -> Capacity:
    """`--axis seq`: the longest sequence at `--batch`, every probe captured
    (NOTE [ Capacity over the sequence ])."""
    from memplan.capacity import seq_capacity
    from memplan.traces.scaling import model_captures
    from memplan.traces.zoo import resolve

    lo, hi = parse_range(args.seqs, "--seqs", _default_seqs(args.model, built), MAX_SEQ)
    for seq in (lo, hi):  # a model without a sequence, or one too short, fails before any work
        try:
            resolve(args.model, dataclasses.replace(built, seq=seq))
        except MemplanError as e:
            given = "" if args.seqs is None else f" --seqs {lo}:{hi}"
            raise MemplanError(f"--axis seq{given}: {e}") from None
    opts = _capture_options(args)

    def capture_at(seq: int) -> Trace:
        return model_captures(args.model, opts, dataclasses.replace(built, seq=seq))(args.batch)

    device = machine.device(args)
    s = settings(args, device)
    bar = _Bar(s.planners, args.no_progress)
    try:
        return seq_capacity(
            args.model,
            capture_at,
            device,
            s,
            (lo, hi),
            batch=args.batch,
            copies=copies,
            progress=bar,
        )
    finally:
        bar.close()


def search(args: argparse.Namespace) -> Capacity:
    """The capacity the arguments ask for (the search of memplan/capacity.py)."""
    from memplan.capacity import batch_capacity, jobs_capacity
    from memplan.traces.zoo import resolve

    jobs = parse_jobs(args.jobs)
    _check_modes(args, jobs)
    lo, hi = parse_range(args.batches)
    models = jobs if isinstance(jobs, list) else [(args.model, jobs)] if args.model else []
    built = capture.model_options_of(args)
    capture.check_amp(args.amp, built)
    if args.axis == "seq":
        return _seq_search(args, built, jobs)
    for name, _ in models:  # an unknown model, or an option it cannot take, fails before any work
        try:
            resolve(name, built)
        except MemplanError as e:
            raise MemplanError(f"--jobs: {e}" if isinstance(jobs, list) else str(e)) from None
    device = machine.device(args)
    s = settings(args, device)
    bar = _Bar(s.planners, args.no_progress)
    try:
        if args.trace:
            trace = machine.one_trace(args.trace, "capacity")
            machine.check_measured(args, [trace], device.hw)
            n_lo, n_hi = (1, machine.MAX_JOBS) if jobs == "auto" else (jobs, jobs)
            name = trace.meta.model or Path(args.trace).name
            return jobs_capacity(trace, name, device, s, n_lo, n_hi, bar)
        scalers = [(name, _scaler(name, args, built), n) for name, n in models]
        if jobs == "auto":
            trace = scalers[0][1].trace(args.batch).trace
            return jobs_capacity(trace, models[0][0], device, s, 1, machine.MAX_JOBS, bar)
        if args.batch is not None:
            lo = hi = args.batch
        return batch_capacity(scalers, device, s, lo, hi, bar)
    finally:
        bar.close()


def run(args: argparse.Namespace) -> int:
    from memplan import capacity_report, provenance
    from memplan.outputs import check_dir

    if args.out is not None:
        check_dir(args.out)  # before any work: NOTE [ Output paths ]
    c = search(args)
    for line in c.notes:
        print(f"note: {printable(line)}", file=sys.stderr)
    # a --trace search's one trace (loaded again: cheap beside the search);
    # models captured at each probe are named by the options (NOTE [ Provenance ])
    traces = [machine.one_trace(args.trace, "capacity")] if args.trace else []
    prov = provenance.of_command(args, traces, machine.hardware(args))
    written = capacity_report.write(c, Path(args.out), prov) if args.out else []
    if args.json:
        print(capacity_report.to_json(c, prov))
    else:
        print(printable(capacity_report.text(c)))
        if written:
            print(f"\nwrote {Path(args.out)}/: {', '.join(written)}")
    return 0

"""The prepared GPU check of issue 32: does a meta capture for a GPU record
what that GPU runs?

On a machine with CUDA, for each model below this script

1. captures one training step on cuda (the trace records what ran there);
2. captures the same step on meta with the matching target (the device's
   own name and compute capability: `memplan.traces.emulate` decides the
   kernels);
3. prints, per model, both vanilla peaks and their difference, the buffer
   and op counts, and the bytes of each buffer kind that differ;
4. replays one plan (TENSILE at the cpu-local roofline, no budget: it swaps
   and releases) with the exported runtime on cuda, three steps against
   three plain ones, and says whether the gradients are bit-identical.

First (issue 35) it checks the runtime's training-state moves on cuda
(`state_check`): a stack of 2048 x 2048 Linear layers with Adam, three steps
plain and three under a hand-built runtime plan that swaps the optimizer
state out after each step (back for the optimizer), the middle layers'
parameters out after the step (back at their module's forward) and their
gradients out after backward (back for the optimizer); then three steps with
half the layers' optimizer step on the host. Per run: whether losses and
parameters are bit-identical to the plain run (a host step runs the CPU's
kernels: it prints the largest difference if not) and the peak allocated
memory of steps 2-3 in forward and backward and in the optimizer's step,
against the plain run's. `--state-only` runs just this.

Models: the built-in zoo models (mlp, small_cnn, tiny_resnet,
tiny_transformer, lstm), the shipped zoo models where torchvision and
transformers import (resnet50, vgg16, inception_v3, densenet121, bert_base,
gpt2 at batch 8), and a small Llama (`hf:llama`, 4 layers, hidden 512, 8
heads / 2 KV heads, seq 512, bf16 weights) where transformers imports.
It is sized to finish in under 8 minutes on one GPU; `--models` narrows it.
Elsewhere it prints "no CUDA" and exits 0.

    python benchmarks/gpu_check.py [--models mlp,lstm,...] [--batch 8] [--state-only]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from memplan.traces.builders import ModelOptions  # noqa: E402
from memplan.traces.capture import CaptureOptions, capture  # noqa: E402
from memplan.traces.errors import MemplanError  # noqa: E402
from memplan.traces.model import BUFFER_KINDS, Trace  # noqa: E402
from memplan.traces.target import Target, TargetDevice  # noqa: E402
from memplan.traces.workload import Workload  # noqa: E402
from memplan.traces.zoo import resolve  # noqa: E402

BUILTIN = ("mlp", "small_cnn", "tiny_resnet", "tiny_transformer", "lstm")
SHIPPED = ("resnet50", "vgg16", "inception_v3", "densenet121", "bert_base", "gpt2")
LLAMA = "hf:llama (small)"
LLAMA_OPTIONS = ModelOptions(
    dtype="bf16",
    seq=512,
    config={
        "hidden_size": 512,
        "intermediate_size": 1408,
        "num_hidden_layers": 4,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "vocab_size": 32000,
    },
)
MiB = 2**20


def cuda_target() -> Target:
    """The device this runs on as a capture target."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    name = "cuda-" + props.name.lower().replace(" ", "-")
    return Target(name, TargetDevice.CUDA, (props.major, props.minor))


def factory(model: str) -> tuple[Callable[[int], Workload], dict]:
    """The workload factory and capture keywords of a model name here."""
    if model == LLAMA:
        return resolve("hf:llama", LLAMA_OPTIONS), {"optimizer": "adamw"}
    return resolve(model), {}


def bytes_by_kind(trace: Trace) -> dict[str, int]:
    return {k.value: v for k, v in trace.bytes_by_kind().items()}


def compare(model: str, batch: int, target: Target) -> tuple[Trace, str]:
    """Captures on cuda and on meta for `target`; one line of differences."""
    make, kw = factory(model)
    real = capture(
        make, batch, CaptureOptions(device="cuda", target=target, **kw), model_name=model
    )
    emulated = capture(make, batch, CaptureOptions(target=target, **kw), model_name=model)
    p_real, p_emu = real.peak()[0], emulated.peak()[0]
    kinds = bytes_by_kind(real), bytes_by_kind(emulated)
    off = [
        f"{k.value} {(kinds[1].get(k.value, 0) - kinds[0].get(k.value, 0)) / MiB:+.2f}"
        for k in BUFFER_KINDS
        if kinds[0].get(k.value, 0) != kinds[1].get(k.value, 0)
    ]
    line = (
        f"{model:<18}{p_real / MiB:>11.1f}{p_emu / MiB:>11.1f}{(p_emu - p_real) / p_real:>+9.2%}"
        f"{real.n_buffers:>8}{emulated.n_buffers:>8}{real.n_ops:>7}{emulated.n_ops:>7}  "
        f"{', '.join(off) or 'same bytes per kind'}"
    )
    return real, line


def replay_plan(model: str, batch: int, trace: Trace, device: str = "cuda") -> str:
    """Three steps under TENSILE's plan exported to the runtime, against three
    plain steps: whether the gradients are bit-identical."""
    from memplan.hwmodels.device import DeviceModel
    from memplan.hwmodels.latency import Roofline
    from memplan.hwmodels.profile import load_hardware
    from memplan.planners import registry
    from memplan.validate.runtime.hooks import PlanRuntime, export_for

    make, _ = factory(model)
    torch.manual_seed(0)
    with torch.device(device):
        w = make(batch)
    result = registry.run("tensile", [trace], DeviceModel(load_hardware("cpu-local"), Roofline()))
    rp = export_for(w.model, result.plans[0], trace, "tensile")
    rp = dataclasses.replace(rp, state=(), host_step=())  # no optimizer step: gradients only
    nets = copy.deepcopy(w.model), copy.deepcopy(w.model)
    runtime = PlanRuntime(nets[1], rp)
    same = True
    for _ in range(3):
        grads = []
        for i, net in enumerate(nets):
            net.zero_grad(set_to_none=True)
            torch.manual_seed(1)
            ctx = runtime.step() if i else _Nothing()
            with ctx:
                w.loss_fn(net(*w.inputs), *w.targets).backward()
            grads.append([p.grad for p in net.parameters()])
        same &= all(torch.equal(a, b) for a, b in zip(*grads, strict=True) if a is not None)
    offloaded = sum(d.action.value == "offload" for d in rp.saved)
    return f"{'bit-identical' if same else 'DIFFERENT'} ({offloaded} saved tensors offloaded)"


STATE_WIDTH, STATE_LAYERS = 2048, 6  # 16 MiB per weight, 96 MiB of parameters


def _state_net(device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(STATE_LAYERS):
        layers += [torch.nn.Linear(STATE_WIDTH, STATE_WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers).to(device)


def _state_plan(net: torch.nn.Module, host: bool):  # -> RuntimePlan
    """Every optimizer-state tensor out after the step, back for the next
    one; the middle layers' parameters and gradients moved too. `host`: no
    moves, half the layers stepped on the host."""
    from memplan.traces.model import BufferKind
    from memplan.validate.runtime.moments import Moment, StateSwap, When
    from memplan.validate.runtime.plan import RuntimePlan

    names = [n for n, _ in net.named_parameters()]
    if host:
        return RuntimePlan("", "state_check", "hand", (), (), (), (), (), tuple(names[::4]))
    end, opt = When(Moment.STEP_END), When(Moment.OPTIMIZER_STEP)
    after_bwd = When(Moment.AFTER_BACKWARD)
    moves = [
        StateSwap(n, BufferKind.OPTIMIZER_STATE, k, 0, end, When(Moment.AFTER_BACKWARD), opt)
        for n in names
        for k in ("exp_avg", "exp_avg_sq")
    ]
    for n in names[2:-2]:
        module = When(Moment.FORWARD, n.rpartition(".")[0])
        moves.append(StateSwap(n, BufferKind.PARAM, "", 0, end, module, module))
        moves.append(StateSwap(n, BufferKind.GRAD, "", 0, after_bwd, after_bwd, opt))
    return RuntimePlan("", "state_check", "hand", (), (), (), (), tuple(moves), ())


def _peak(cuda: bool, reset: bool) -> int:
    """Peak allocated bytes since the last reset (cuda; 0 elsewhere)."""
    if not cuda:
        return 0
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    if reset:
        torch.cuda.reset_peak_memory_stats()
    return peak


def _state_run(plan, device: str) -> tuple[list[torch.Tensor], list[torch.Tensor], int, int]:
    """Three Adam steps (under `plan` if given): losses, final parameters,
    and over steps 2-3 the peak allocated bytes in forward and backward and
    in the optimizer's step (cuda; 0 elsewhere)."""
    from memplan.validate.runtime.hooks import PlanRuntime

    cuda = device == "cuda"
    net = _state_net(device)
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)
    gen = torch.Generator(device=device).manual_seed(1)
    data = [torch.randn(64, STATE_WIDTH, device=device, generator=gen) for _ in range(3)]
    rt = PlanRuntime(net, plan(net), optimizer=opt) if plan is not None else None
    losses, fb_peak, opt_peak = [], 0, 0
    for i, x in enumerate(data):
        _peak(cuda, reset=True)
        with rt.step() if rt is not None else _Nothing():
            loss = net(x).square().mean()
            loss.backward()
        fb = _peak(cuda, reset=True)
        opt.step()
        opt.zero_grad()
        if i:
            fb_peak, opt_peak = max(fb_peak, fb), max(opt_peak, _peak(cuda, reset=False))
        losses.append(loss.detach())
    if rt is not None:
        rt.close()
    return losses, [p.detach().clone() for p in net.parameters()], fb_peak, opt_peak


def state_check(device: str = "cuda") -> list[str]:
    """Lines: the training-state moves and the host step on `device` against
    plain Adam steps (see the module docstring)."""
    plain = _state_run(None, device)
    lines = []
    for label, host in (("state swaps", False), ("host step", True)):
        got = _state_run(lambda net, host=host: _state_plan(net, host), device)
        pairs = list(zip(plain[0] + plain[1], got[0] + got[1], strict=True))
        same = all(torch.equal(a, b) for a, b in pairs)
        diff = max(float((a.float() - b.float()).abs().max()) for a, b in pairs)
        verdict = "bit-identical" if same else f"DIFFERENT (max |diff| {diff:.3g})"
        lines.append(
            f"{label:<12} {verdict}; peak MiB of steps 2-3 in forward+backward "
            f"{got[2] / MiB:.0f} (plain {plain[2] / MiB:.0f}), in optimizer.step() "
            f"{got[3] / MiB:.0f} (plain {plain[3] / MiB:.0f})"
        )
        if device == "cuda":
            torch.cuda.empty_cache()
    return lines


class _Nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--state-only", action="store_true", help="only the state check")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA: nothing to check here (run this on a machine with a GPU)")
        return 0
    print("runtime training state, 3 Adam steps against plain ones:")
    for line in state_check():
        print(f"  {line}", flush=True)
    if args.state_only:
        return 0
    target = cuda_target()
    models = [m for m in args.models.split(",") if m] or [*BUILTIN, *SHIPPED, LLAMA]
    print(f"device: {target.describe()}, torch {torch.__version__}; batch {args.batch}")
    print(
        f"{'model':<18}{'cuda MiB':>11}{'meta MiB':>11}{'peak':>9}{'bufs':>8}{'bufs':>8}"
        f"{'ops':>7}{'ops':>7}  bytes per kind, meta - cuda (MiB)"
    )
    t0 = time.perf_counter()
    failures = 0
    for model in models:
        name = model
        try:
            trace, line = compare(model, args.batch, target)
            print(line, flush=True)
            print(f"{'':<18}runtime replay: {replay_plan(model, args.batch, trace)}", flush=True)
        except MemplanError as e:
            failures += 1
            print(f"{name:<18}skipped: {e}", flush=True)
        torch.cuda.empty_cache()
    print(f"done in {time.perf_counter() - t0:.0f} s; {failures} model(s) skipped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

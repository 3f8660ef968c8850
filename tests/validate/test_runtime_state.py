"""Training state under the exported runtime: parameters, gradients and
optimizer state moved off the device between moments of a step, and
optimizer steps run on the host, leave three steps of a small model
bit-identical to the plain loop (NOTE [ Moving training state ], NOTE [ The
host optimizer step ] in validate/runtime/state.py)."""

from __future__ import annotations

import contextlib
import copy
import json

import pytest
import torch
from memplan.planners.core.plan import SwapIn, SwapOut
from memplan.traces.model import BufferKind
from memplan.validate.runtime.errors import RuntimePlanError
from memplan.validate.runtime.hooks import PlanRuntime
from memplan.validate.runtime.io import from_dict, to_dict
from memplan.validate.runtime.moments import Moment, StateSwap, When
from memplan.validate.runtime.plan import RuntimePlan, export
from torch import nn

from tests.validate.helpers import plan_of, trace_of

MiB = 2**20
STEPS = 3
START, END = When(Moment.STEP_START), When(Moment.STEP_END)
AFTER_BWD, OPT = When(Moment.AFTER_BACKWARD), When(Moment.OPTIMIZER_STEP)
PARAM, GRAD, STATE = BufferKind.PARAM, BufferKind.GRAD, BufferKind.OPTIMIZER_STATE
KEYS = {"adam": ("exp_avg", "exp_avg_sq"), "sgd": ("momentum_buffer",)}


def make_net(device: str = "cpu") -> nn.Module:
    """Weights of 512 x 512 floats (1 MiB) in the middle."""
    torch.manual_seed(0)
    layers = nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 8)
    return nn.Sequential(*layers).to(device)


def make_opt(name: str, net: nn.Module) -> torch.optim.Optimizer:
    if name == "adam":
        return torch.optim.Adam(net.parameters(), lr=1e-3, weight_decay=0.01)
    return torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)


def rplan(*state: StateSwap, host_step: tuple[str, ...] = ()) -> RuntimePlan:
    return RuntimePlan("f" * 64, "net", "hand", (), (), (), (), state, host_step)


def swap(
    param: str, kind: BufferKind, out: When, back: When, key: str = "", fetch=None
) -> StateSwap:
    nbytes = {"2.weight": MiB, "0.weight": 128 * 1024}.get(param, 0)
    return StateSwap(param, kind, key, nbytes, out, fetch or back, back)


def train(opt_name: str, plan: RuntimePlan | None, probe=None, device: str = "cpu"):
    """Three steps; (losses, parameters after each step, final optimizer
    state by parameter name, runtime). `probe(step, net, opt, rt)` looks at
    the state between the step block and `optimizer.step()`."""
    net = make_net(device)
    opt = make_opt(opt_name, net)
    gen = torch.Generator().manual_seed(1)
    data = [
        (torch.randn(16, 64, generator=gen), torch.randn(16, 8, generator=gen))
        for _ in range(STEPS)
    ]
    rt = PlanRuntime(net, plan, optimizer=opt) if plan is not None else None
    losses, params = [], []
    with rt if rt is not None else contextlib.nullcontext():
        for i, (x, y) in enumerate(data):
            with rt.step() if rt is not None else contextlib.nullcontext():
                loss = nn.functional.mse_loss(net(x.to(device)), y.to(device))
                loss.backward()
            if probe is not None:
                probe(i, net, opt, rt)
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
            params.append({n: p.detach().clone() for n, p in net.named_parameters() if p.numel()})
            if device == "cuda":
                torch.cuda.synchronize()
    params.append({n: p.detach().clone() for n, p in net.named_parameters()})  # after close
    names = {p: n for n, p in net.named_parameters()}
    state = {names[p]: dict(s) for p, s in opt.state.items()}
    if rt is not None and rt.host_optimizer is not None:
        host = {hp: p for p, hp in rt.state.host.pairs}
        state |= {names[host[hp]]: dict(s) for hp, s in rt.host_optimizer.state.items()}
    return losses, params, state, rt


def assert_same(a, b) -> None:
    la, pa, sa, _ = a
    lb, pb, sb, _ = b
    assert all(torch.equal(x, y) for x, y in zip(la, lb, strict=True))
    for step_a, step_b in zip(pa, pb, strict=True):
        for name, t in step_b.items():  # params off after a step are left out
            if name in step_a:
                assert torch.equal(step_a[name], t), name
    assert pa[-1].keys() == pb[-1].keys()
    assert sa.keys() == sb.keys()
    for name in sa:
        for key, t in sa[name].items():
            assert torch.equal(t, sb[name][key]), (name, key)


PLANS = {
    "state": lambda o: rplan(*(swap(n, STATE, END, OPT, k, fetch=START) for n in ("0.weight", "2.weight", "4.bias") for k in KEYS[o])),
    "params": lambda o: rplan(
        swap("2.weight", PARAM, END, When(Moment.FORWARD, "2"), fetch=START),
        swap("2.bias", PARAM, END, When(Moment.FORWARD, "2")),
        swap("0.weight", PARAM, AFTER_BWD, OPT),
    ),
    "grads": lambda o: rplan(swap("2.weight", GRAD, AFTER_BWD, OPT), swap("4.weight", GRAD, AFTER_BWD, OPT)),
    "host": lambda o: rplan(host_step=("0.weight", "2.bias", "4.weight")),
    "all": lambda o: rplan(
        swap("2.weight", PARAM, END, When(Moment.FORWARD, "2")),
        swap("2.weight", GRAD, AFTER_BWD, OPT),
        *(swap("2.weight", STATE, START, OPT, k) for k in KEYS[o]),
        host_step=("0.weight", "4.bias"),
    ),
}  # fmt: skip


@pytest.mark.parametrize("opt_name", ["adam", "sgd"])
@pytest.mark.parametrize("plan", sorted(PLANS))
def test_three_steps_under_state_moves_are_bit_identical(opt_name, plan):
    assert_same(train(opt_name, PLANS[plan](opt_name)), train(opt_name, None))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("plan", ["state", "params", "grads"])
def test_cuda_state_moves_are_bit_identical(plan):
    assert_same(
        train("adam", PLANS[plan]("adam"), device="cuda"), train("adam", None, device="cuda")
    )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_host_step_matches_the_device_step_to_rounding():
    """The host runs the CPU's kernels: equal to the device's to rounding."""
    (la, pa, _, _), (lb, pb, _, _) = (
        train("adam", p, device="cuda") for p in (PLANS["host"]("adam"), None)
    )
    torch.testing.assert_close(pa[-1], pb[-1])
    torch.testing.assert_close(la, lb)


def test_state_off_the_device_is_an_empty_placeholder_with_its_bytes_on_the_host():
    """Between the step block and `optimizer.step()`: 2.weight's gradient
    (left after backward) and Adam's state of 2.weight (left at the step's
    start) are empty on the device, their bytes are in host buffers, 4 MiB in
    all from the second step on (the state is made by the first step)."""
    plan = PLANS["all"]("adam")
    seen: list[tuple[int, bool]] = []
    grads: list[torch.Tensor] = []

    def planned(i, net, opt, rt):
        w = net[2].weight
        slot = next(s for s in rt.state.slots if s.swap.kind is GRAD)
        assert w.grad.numel() == 0 and w.grad.device.type == "cpu"
        assert slot.host is not None and slot.host.numel() == MiB
        grads.append(slot.host.view(torch.float32).view(512, 512).clone())
        state_off = (
            all(opt.state[w][k].numel() == 0 for k in KEYS["adam"]) if i else w not in opt.state
        )
        seen.append((rt.state_stats.off_bytes // MiB, state_off))

    plain: list[torch.Tensor] = []
    train("adam", None, probe=lambda i, net, opt, rt: plain.append(net[2].weight.grad.clone()))
    train("adam", plan, probe=planned)
    assert seen == [(1, True), (3, True), (3, True)]
    assert all(torch.equal(a, b) for a, b in zip(grads, plain, strict=True))


def test_a_parameter_is_back_by_its_modules_forward():
    plan = rplan(swap("2.weight", PARAM, END, When(Moment.FORWARD, "2")))
    net = make_net()
    opt = make_opt("sgd", net)
    shapes: list[tuple[int, ...]] = []
    net[0].register_forward_pre_hook(lambda m, a: shapes.append(tuple(net[2].weight.shape)))
    net[2].register_forward_hook(lambda m, a, o: shapes.append(tuple(net[2].weight.shape)))
    with PlanRuntime(net, plan, optimizer=opt) as rt:
        for _ in range(2):
            with rt.step():
                net(torch.randn(2, 64)).sum().backward()
            opt.step()
            assert net[2].weight.numel() == 0
    assert shapes == [(512, 512), (512, 512), (0,), (512, 512)]
    assert net[2].weight.shape == (512, 512)  # closed: back on the device
    assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks


def test_the_host_step_keeps_the_state_on_the_host_only():
    net = make_net()
    opt = make_opt("adam", net)
    rt = PlanRuntime(net, rplan(host_step=("2.weight",)), optimizer=opt)
    for _ in range(2):
        with rt.step():
            net(torch.randn(2, 64)).sum().backward()
        opt.step()
    assert net[2].weight not in opt.state and len(opt.state) == 5
    (hp,) = rt.host_optimizer.state
    assert type(rt.host_optimizer) is torch.optim.Adam and rt.state_stats.host_steps == 2
    assert rt.host_optimizer.param_groups[0]["weight_decay"] == 0.01
    assert torch.equal(hp, net[2].weight) and hp.data_ptr() != net[2].weight.data_ptr()
    exp_avg = rt.host_optimizer.state[hp]["exp_avg"]
    assert exp_avg.shape == (512, 512) and net[2].weight.grad.shape == (512, 512)  # shown again
    rt.close()
    assert torch.equal(opt.state[net[2].weight]["exp_avg"], exp_avg)  # given back
    assert not rt.host_optimizer.state and not opt._optimizer_step_pre_hooks


def test_the_host_step_follows_the_learning_rate_schedule():
    plan = rplan(host_step=("0.weight", "2.weight"))
    results = []
    for p in (plan, None):
        net = make_net()
        opt = make_opt("sgd", net)
        rt = PlanRuntime(net, p, optimizer=opt) if p else None
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
        for _ in range(STEPS):
            with rt.step() if rt else contextlib.nullcontext():
                net(torch.ones(2, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
            sched.step()
        results.append([p.detach().clone() for p in net.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


# ---- export: plan events to moments ---------------------------------------------------------
def _buffer(trace, name: str) -> int:
    return next(b.id for b in trace.buffers if b.name == name)


def test_export_maps_persistent_swaps_to_moments():
    """The zoo MLP's step: forward ops 0-6 (fc1 at 0, relu 1, fc2 2, fc3 4),
    backward 7-19, Adam 20-61 (fc1.weight's update at 20-26)."""
    t = trace_of("mlp")
    b = {n: _buffer(t, n) for n in ("fc1.weight.exp_avg", "fc1.weight.exp_avg_sq", "fc2.weight", "fc2.weight.grad", "fc1.weight", "fc3.weight")}  # fmt: skip
    rp = export(
        plan_of(
            t,
            SwapOut(b["fc1.weight.exp_avg"], 26),  # after its last use, back next iteration
            SwapIn(b["fc1.weight.exp_avg"], 26, 20, next_iteration=True),
            SwapOut(b["fc1.weight.exp_avg_sq"], -1),  # NOTE [ Offload at the iteration start ]
            SwapIn(b["fc1.weight.exp_avg_sq"], 5, 21),
            SwapOut(b["fc2.weight"], 40),  # TENSILE's cross-iteration swap of an updated weight
            SwapIn(b["fc2.weight"], 50, 2, next_iteration=True),
            SwapOut(b["fc2.weight.grad"], 15),  # after its backward write, back for Adam
            SwapIn(b["fc2.weight.grad"], 16, 34),
            SwapOut(b["fc1.weight"], 0),  # off across backward: leaves after it
            SwapIn(b["fc1.weight"], 1, 26),
            SwapOut(b["fc3.weight"], 54),  # off through the next step's backward
            SwapIn(b["fc3.weight"], 54, 54, next_iteration=True),
        ),
        t,
    )
    fwd = When(Moment.FORWARD, "fc2")
    assert rp.state == (
        StateSwap("fc1.weight", PARAM, "", 1605632, AFTER_BWD, AFTER_BWD, OPT),
        StateSwap("fc2.weight", PARAM, "", 524288, END, END, fwd),
        StateSwap("fc1.weight", STATE, "exp_avg", 1605632, END, END, OPT),
        StateSwap("fc1.weight", STATE, "exp_avg_sq", 1605632, START, AFTER_BWD, OPT),
        StateSwap("fc2.weight", GRAD, "", 524288, AFTER_BWD, AFTER_BWD, OPT),
    )
    reason = "a parameter stays on the device through backward (autograd needs it)"
    assert [(s.event, s.reason) for s in rp.skipped if "release" not in s.reason] == [
        (f"swap_out of buffer {b['fc3.weight']} after op 54", reason),
        (f"swap_in of buffer {b['fc3.weight']} after op 54", reason),
    ]
    assert from_dict(json.loads(json.dumps(to_dict(rp)))) == rp


def test_a_tensile_plan_with_state_swaps_replays_bit_identical():
    """TENSILE's plan for the zoo MLP swaps parameters and gradients after
    backward (and activations); three steps with Adam as the trace's."""
    from tests.validate.test_compare import plan_for
    from tests.validate.test_runtime import workload

    rp = export(plan_for("mlp", "tensile"), trace_of("mlp"), "tensile")
    assert {(s.kind, s.out, s.back) for s in rp.state} == {
        (PARAM, AFTER_BWD, OPT),
        (GRAD, AFTER_BWD, OPT),
    }
    w = workload("mlp")
    runs = []
    for plan in (rp, None):
        net = copy.deepcopy(w.model)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3, foreach=False)
        rt = PlanRuntime(net, plan, optimizer=opt) if plan else None
        losses = []
        for _ in range(STEPS):
            with rt.step() if rt else contextlib.nullcontext():
                loss = w.loss_fn(net(*w.inputs), *w.targets)
                loss.backward()
            opt.step()
            opt.zero_grad()
            losses.append(loss.detach())
        if rt:
            assert rt.state_stats.moved_out == STEPS * len(rp.state) and rt.state_stats.late == 0
        runs.append((losses, [p.detach() for p in net.parameters()]))
    (la, pa), (lb, pb) = runs
    assert all(torch.equal(a, b) for a, b in zip(la + pa, lb + pb, strict=True))


# ---- bad input ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "plan, optimizer, message",
    [
        (rplan(swap("9.weight", PARAM, END, OPT)), True, r"^state\[0\]: parameter '9.weight' is not in the model$"),
        (rplan(swap("2.weight", PARAM, END, When(Moment.FORWARD, "2.conv"))), True, r"^state\[0\] \(2.weight\): module '2.conv' is not in the model$"),
        (rplan(swap("2.weight", STATE, END, OPT, "exp_avg")), False, r"^state\[0\] moves '2.weight.exp_avg' with the optimizer's step: pass the optimizer"),
        (rplan(host_step=("0.bias", "fc.bias")), True, r"^host_step\[1\]: parameter 'fc.bias' is not in the model$"),
        (rplan(host_step=("0.bias",)), False, r"^host_step\[0\] \('0.bias'\): pass the optimizer"),
        (rplan(swap("0.bias", STATE, END, OPT, "exp_avg"), host_step=("0.bias",)), True, r"^state\[0\]: '0.bias.exp_avg' is on the host already"),
    ],
)  # fmt: skip
def test_a_plan_that_does_not_fit_the_model_is_named(plan, optimizer, message):
    net = make_net()
    opt = make_opt("adam", net) if optimizer else None
    with pytest.raises(RuntimePlanError, match=message):
        PlanRuntime(net, plan, optimizer=opt)


def test_a_host_step_of_a_parameter_the_optimizer_lacks_is_named():
    net = make_net()
    opt = torch.optim.SGD(net[0].parameters(), lr=0.1)
    with pytest.raises(RuntimePlanError, match=r"^host_step\[0\]: parameter '2.weight' is in none"):
        PlanRuntime(net, rplan(host_step=("2.weight",)), optimizer=opt)

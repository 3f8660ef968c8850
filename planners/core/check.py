"""Static plan checking: replay a plan in its op order, without time, and reject
any op that would find its data gone.

`check(plan, trace)` returns nothing or raises `PlanError` naming the
iteration, the op or event, the buffer and the reason. It replays at least two
iterations (the first starts with every persistent buffer resident, the second
with whatever the first left) and goes on until an iteration starts in a state
already seen, after which every later iteration repeats a checked one.

Timing is the simulator's business: a swap-in that arrives late stalls
compute, it is not an error. What `check` rejects would corrupt or lose data:

- an op reads or writes a buffer that is absent (swapped out or released, and
  neither swapped in nor recomputed before it);
- a SwapIn with no host copy to read (no SwapOut since the buffer was last
  written -- a host copy made earlier stays valid until a write, as TENSILE
  keeps it until the last access, so a later re-eviction needs no copy);
- a SwapOut or Release of a buffer that is not on the device, or dead;
- a Recompute whose sources are absent when it runs (unless recomputed before
  the same op), were overwritten since the chain first ran, or that consumes
  RNG state without restoring it;
- a second Recompute of one buffer before one op (NOTE [ Duplicate events ]
  in `planners/core/semantics.py`, raised by `IndexedPlan`).

Lane occupancy is timing too: the simulator queues copies FIFO on their lane,
so `check` does not look for a double-booked lane. See NOTE [ Event
semantics ] in `sim/model.py` for the run-time semantics this mirrors; the
per-op tables and the plan's index are the simulator's (`OpTable`,
`IndexedPlan`), and what each event does to a buffer is the transition
function's (`planners.core.lifecycle`), with every copy instantaneous.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memplan.planners.core.errors import PlanError
from memplan.planners.core.lifecycle import DEV, Buffers, Ctx, Do, Event
from memplan.planners.core.order import positions
from memplan.planners.core.plan import Plan, Release, SwapIn, SwapOut, describe, validate
from memplan.planners.core.semantics import IndexedPlan, OpTable, Recomputation, Triggered
from memplan.traces.model import Trace

if TYPE_CHECKING:
    from memplan.hwmodels.device import DeviceModel

MAX_ITERATIONS = 16


# NOTE [ Delays within the iteration ]
# A swap's `delay_us` is TENSILE's Δtime after its trigger op, within the
# iteration. One longer than the whole iteration fires the copy in a later
# iteration than the one it belongs to, which no event means, and a replay
# would wait it out in real time (a delay of 1e9 us is a quarter hour). How
# long the iteration is depends on the device, so the rule lives here, apart
# from the static replay, and is applied where a plan meets its device: the
# simulator's command (`memplan simulate --plan`) and the replay's validation
# (`validate/calibrate/simvsreal.resolve_plan`, on the device it measured).
# The iteration is the vanilla one, the sum of the device's op durations: a
# plan only lengthens it (stalls, recomputes), and no planner sets a delay
# near it (they all set 0), so the bound refuses garbage, not plans. The plan
# file's own bound (`planners/core/io.py` NOTE [ Plan fields ]) needs no
# device: finite, >= 0, at most a day.


def iteration_us(trace: Trace, device: DeviceModel) -> float:
    """The vanilla iteration of `trace` on `device`: its op durations, summed, in us."""
    return float(device.op_durations(trace).sum())


def check_delays(plan: Plan, trace: Trace, device: DeviceModel, where: str = "plan") -> None:
    """Raise `PlanError` naming the event if a swap's `delay_us` is longer
    than the iteration on `device` (NOTE [ Delays within the iteration ])."""
    limit = None
    for e, ev in enumerate(plan.events):
        if isinstance(ev, SwapOut | SwapIn) and ev.delay_us > 0:
            limit = iteration_us(trace, device) if limit is None else limit
            if ev.delay_us > limit:
                raise PlanError(
                    f"{where}.events[{e}].delay_us: {ev.delay_us:g} us is longer than the "
                    f"iteration it belongs to ({limit:g} us of ops on {device.hw.name})"
                )


# NOTE [ A chain makes every write ]
# A Recompute's chain remakes its buffer from the chain's first op that writes
# it; every later write of the buffer before the op the chain serves must be
# in the chain too, or the value made again is an earlier one (an
# `empty_like` re-run without the in-place `bernoulli_` that filled it). So a
# lower bound may charge a remade buffer every write that made it.
def check(plan: Plan, trace: Trace) -> None:
    """Raise `PlanError` unless every op of every iteration finds its buffers
    on the device under `plan`."""
    validate(plan, trace)
    _Replay(plan, trace).run()


class _Replay:
    def __init__(self, plan: Plan, trace: Trace):
        self.trace = trace
        nb = trace.n_buffers
        table = self.table = OpTable.of(trace, plan.order)
        ip = self.ip = IndexedPlan.of(plan, trace, table)
        self.pos = positions(ip.order)  # NOTE [ Plans under another order ]
        for r in ip.recompute.values():
            self._check_chain(r)
        # a static replay loads every input and applies the start's releases
        # (the same as never loading them: NOTE [ Duplicate events ])
        self.start = ip.start_events()
        self.bufs = Buffers(nb)
        self.why: list[tuple[int, int, int] | None] = [None] * nb  # (event, op, iteration)
        self.it = 0

    # ---- static properties of a recompute chain ----------------------------------
    def _check_chain(self, r: Recomputation) -> None:
        t, e, ev, pos = self.trace, r.index, r.event, self.pos
        w = f"events[{e}] ({describe(ev)} before op {ev.before_op})"
        rng = [k for k in ev.ops if t.ops[k].rng]
        if rng and not ev.restore_rng:
            raise PlanError(
                f"{w}: op {rng[0]} ({t.ops[rng[0]].target}) consumes RNG state; "
                f"recomputing it changes the result unless restore_rng is set"
            )
        side = [k for k in ev.ops if t.writes_persistent[k]]
        if side:
            b = next(int(x) for x in t.op_writes(side[0]) if t.persistent[x])
            raise PlanError(
                f"{w}: op {side[0]} ({t.ops[side[0]].target}) writes persistent buffer {b} "
                f"({t.buffers[b].name or t.buffers[b].kind.value}); re-running it would "
                f"update it twice"
            )
        b = ev.buffer
        first = min((k for k in ev.ops if b in t.op_writes(k)), default=None, key=pos.__getitem__)
        if first is not None:  # NOTE [ A chain makes every write ]
            skipped = [
                m
                for m in t.accesses_of(b).tolist()
                if pos[first] < pos[m] < pos[ev.before_op]
                and m not in ev.ops
                and b in t.op_writes(m)
            ]
            if skipped:
                raise PlanError(
                    f"{w}: op {skipped[0]} ({t.ops[skipped[0]].target}) writes buffer {b} after "
                    f"op {first} and is not in the chain; the recomputed value would differ"
                )
        for k, srcs in r.sources:
            for s in srcs:
                later = [
                    m for m in t.accesses_of(s).tolist() if pos[k] < pos[m] < pos[ev.before_op]
                ]
                over = [m for m in later if s in t.op_writes(m)]
                if over:
                    raise PlanError(
                        f"{w}: source buffer {s} read by op {k} is overwritten by op {over[0]} "
                        f"({t.ops[over[0]].target}) before op {ev.before_op}; "
                        f"the recomputed value would differ"
                    )

    # ---- replay ----------------------------------------------------------------
    def run(self) -> None:
        """Replay iterations until one starts in a state an earlier one started
        in (the replay is deterministic: the rest repeats), at most
        `MAX_ITERATIONS`."""
        bufs = self.bufs
        for b in self.table.persistent:
            bufs.create(b)
        seen: set[tuple[tuple, ...]] = set()
        for it in range(MAX_ITERATIONS):
            state = bufs.states()
            if state in seen:
                return
            seen.add(state)
            self.it = it
            self._iteration()

    def _iteration(self) -> None:
        bufs, tab = self.bufs, self.table
        where, free, static_op = bufs.where, bufs.free, bufs.static_op
        bufs.create_all(tab.inputs)
        self._events(self.start, -1)
        triggered, apply = self.ip.triggered, self._apply
        for i in self.ip.order:  # NOTE [ Plans under another order ]
            for b in tab.need[i]:
                if where[b] != DEV:
                    made: list[int] = []
                    self._resolve(b, i, (), made)
                    for x in made:  # a freed source made for the chain: that
                        if not bufs.alive[x]:  # life ends with it, as in the simulator
                            free(x)
            static_op(tab.creates[i], tab.writes[i], tab.frees[i])
            for e, ev in triggered[i + 1]:
                apply(e, ev, i)

    def _resolve(self, b: int, i: int, chain: tuple[int, ...], made: list[int]) -> None:
        """Make absent `b` present before op `i` by its Recompute, or fail;
        `made` collects what was made."""
        hit = self.ip.recompute.get((b, i))
        op = self.trace.ops[i]
        if hit is None:
            if chain:
                raise PlanError(
                    f"iteration {self.it}, op {i}: recompute of buffer {chain[-1]} needs "
                    f"buffer {b}, which is absent ({self._why(b)}) and not recomputed before op {i}"
                )
            raise PlanError(
                f"iteration {self.it}, op {i} ({op.target}): reads buffer {b}, which is absent "
                f"({self._why(b)}) and not swapped in or recomputed before it"
            )
        if b in chain:
            raise PlanError(
                f"events[{hit.index}] ({describe(hit.event)}): recompute chain is cyclic via {chain}"
            )
        for _k, srcs in hit.sources:
            for s in srcs:
                if self.bufs.where[s] != DEV:
                    self._resolve(s, i, (*chain, b), made)
        do = self.bufs.apply(b, Event.NEED, Ctx(recompute=True))
        assert do == Do.RECOMPUTE, Do.names(do)
        self.bufs.apply(b, Event.REMAKE)
        made.append(b)

    def _why(self, b: int) -> str:
        if not self.bufs.alive[b]:
            f = int(self.trace.freed_after[b])
            return f"freed by the framework after op {f}"
        return self._said(b)

    def _said(self, b: int) -> str:
        """What took `b` off the device last, in words (built only for an error)."""
        if self.why[b] is None:
            return "never on the device"
        e, k, it = self.why[b]
        ev = self.ip.plan.events[e]
        verb = "swapped out" if isinstance(ev, SwapOut) else "released"
        return f"{verb} after {_when(k)} of iteration {it} by events[{e}]"

    def _events(self, events: tuple[tuple[int, Triggered], ...], k: int) -> None:
        for e, ev in events:
            self._apply(e, ev, k)

    def _where(self, e: int, ev: Triggered, k: int) -> str:
        return f"iteration {self.it}, after {_when(k)}: events[{e}] ({describe(ev)})"

    def _apply(self, e: int, ev: Triggered, k: int) -> None:
        b, bufs = ev.buffer, self.bufs
        if not bufs.alive[b]:
            w = self._where(e, ev, k)
            c = int(self.trace.created_at[b])
            raise PlanError(
                f"{w}: buffer {b} is not alive then (created by op {c}, "
                f"freed by the framework after op {int(self.trace.freed_after[b])})"
            )
        if isinstance(ev, SwapOut | Release):
            if bufs.where[b] != DEV:
                w = self._where(e, ev, k)
                raise PlanError(f"{w}: buffer {b} is not on the device ({self._said(b)})")
            self.why[b] = (e, k, self.it)
            if isinstance(ev, Release):
                bufs.apply(b, Event.RELEASE)
            else:
                self._swap_out(b, ev.delay_us > 0)
        elif isinstance(ev, SwapIn) and bufs.where[b] != DEV:
            if not bufs.host[b]:
                w = self._where(e, ev, k)
                raise PlanError(
                    f"{w}: no host copy to read ({self._said(b)}, with no swap-out since "
                    f"it was last written)"
                )
            bufs.apply(b, Event.SWAP_IN)
            bufs.apply(b, Event.H2D_END)

    def _swap_out(self, b: int, delayed: bool) -> None:
        """A SwapOut whose copy, if it has bytes to move, happens at once."""
        bufs = self.bufs
        if not bufs.apply(b, Event.SWAP_OUT, Ctx(delayed=delayed)) & Do.COPY_D2H:
            return  # a valid host copy: the device copy is dropped at the trigger
        if bufs.apply(b, Event.COPY_OUT) & Do.LEAVE:
            bufs.apply(b, Event.D2H_START)
            bufs.apply(b, Event.D2H_END)


def _when(k: int) -> str:
    return "the start of the iteration" if k < 0 else f"op {k}"

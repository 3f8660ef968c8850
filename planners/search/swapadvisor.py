"""swapadvisor: SwapAdvisor's genetic search over op orders, memory
allocations and the swap plans that follow (Huang et al., ASPLOS'20; notes
in shared/papers/swapadvisor_notes_zh.txt).

Individuals and operators live in `planners/search/genome.py` (NOTE
[ SwapAdvisor operators ]); this module runs the search (NOTE [ SwapAdvisor
search ]). Fitness is the simulated iteration time under the budget, through
the `Evaluator` the app shell injects: planners never import `sim`.
"""

from __future__ import annotations

import math
import multiprocessing
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
from memplan.hwmodels.device import DeviceModel
from memplan.planners.core.evaluate import Evaluator
from memplan.planners.core.options import options_dict
from memplan.planners.core.plan import Plan, PlanResult, Reason, Status, empty_plan
from memplan.planners.search.genome import (
    Allocation,
    Individual,
    Sizes,
    crossover_alloc,
    crossover_order,
    mutate_alloc,
    mutate_order,
    swap_plan,
)
from memplan.traces.model import Trace

POLICY = "stall"  # a swap-in whose slot is still being copied out waits for it
TEMPERATURE = 0.1  # softmax over t_best / t: a 10% slower individual is e^-0.9 less likely


@dataclass(frozen=True, slots=True)
class SwapAdvisorOptions:
    """`population`: individuals per generation (Np); `generations`: at most
    this many; `time_limit_s`: stop earlier when over (a run cut by time is
    not reproducible, one that ends by `generations` is); `seed`: the
    random generator's; `workers`: processes evaluating candidates (1: in
    this process); `mutation`: the probability P of each mutation step."""

    population: int = 16
    generations: int = 20
    time_limit_s: float = 60.0
    seed: int = 0
    workers: int = 1
    mutation: float = 0.1

    def __post_init__(self) -> None:
        if self.population < 2:
            raise ValueError(f"population={self.population} must be >= 2")
        if self.generations < 0:
            raise ValueError(f"generations={self.generations} must be >= 0")
        if not math.isfinite(self.time_limit_s) or self.time_limit_s <= 0:
            raise ValueError(f"time_limit_s={self.time_limit_s} must be > 0")
        if self.workers < 1:
            raise ValueError(f"workers={self.workers} must be >= 1")
        if not 0.0 <= self.mutation <= 1.0:
            raise ValueError(f"mutation={self.mutation} must be in [0, 1]")


# NOTE [ SwapAdvisor search ]
# - Start: the trace's order and population - 1 random allowed orders, each with a random
#   allocation sized from the peak's need and fitted to the budget less persistent bytes.
# - A generation: parent pairs drawn by softmax selection make 4 children each
#   (NOTE [ SwapAdvisor operators ]), all mutated; the next population is drawn from parents and
#   children by softmax selection without replacement, the best always kept (elitism).
# - Softmax weight exp((t_best / t) / TEMPERATURE); 0 without a plan or a fit; all 0: uniform.
# - Determinism: every draw is made here from one generator seeded by `seed`; forked workers
#   only simulate and are read in submission order, so a seed gives one answer whatever the
#   worker count. Fitness is cached by plan.
# - A generation starts only if one as long as the slowest so far still ends within
#   `time_limit_s`. Full text and the measurement: docs/notes.md, "SwapAdvisor search".
_EVALUATOR: Evaluator | None = None


def _init_worker(evaluator: Evaluator) -> None:
    global _EVALUATOR
    _EVALUATOR = evaluator


def _score(plan: Plan) -> float:
    """In a worker: the plan's fitness by the evaluator it inherited."""
    assert _EVALUATOR is not None
    return _fitness(_EVALUATOR, plan)


def _fitness(evaluator: Evaluator, plan: Plan) -> float:
    """Simulated seconds per iteration; inf when the plan does not fit."""
    ev = evaluator([plan], POLICY)
    return ev.iteration_s if ev.fits else math.inf


def swapadvisor(
    traces: Sequence[Trace],
    device: DeviceModel,
    *,
    budget_bytes: int | None = None,
    options: SwapAdvisorOptions | None = None,
    evaluator: Evaluator | None = None,
) -> PlanResult:
    """Search for the op order, allocation and swaps of one job that run
    fastest within `budget_bytes` in simulation."""
    opts = options or SwapAdvisorOptions()
    t0 = time.perf_counter()

    def result(status, plans, reason=Reason.NONE, detail="", **stats) -> PlanResult:
        return PlanResult(
            "swapadvisor", status, tuple(plans), reason, detail, time.perf_counter() - t0,
            options_dict(opts), stats,
        )  # fmt: skip

    if len(traces) != 1:
        return result(
            Status.STOPPED, (), Reason.MODEL_INFEASIBLE, f"plans one job, got {len(traces)}"
        )
    trace = traces[0]
    if budget_bytes is None:
        return result(Status.PLANNED, (empty_plan(trace),), detail="")
    if evaluator is None:
        detail = "swapadvisor scores plans by simulation: run it from memplan (compare, plan)"
        return result(Status.STOPPED, (), Reason.NO_MOVE_LEFT, detail)
    slots_budget = budget_bytes - int(trace.nbytes[trace.persistent].sum())
    if slots_budget <= 0:
        detail = f"parameters and optimizer state alone exceed the budget {budget_bytes} B"
        return result(Status.STOPPED, (), Reason.MODEL_INFEASIBLE, detail)
    ga = _Search(trace, opts, slots_budget, evaluator, t0)
    best, t_best, gens = ga.run()
    stats = {"generations": gens, "evaluations": ga.evaluations, "iteration_s": t_best}
    if best is None or not math.isfinite(t_best):
        reason = Reason.TIME_LIMIT if ga.timed_out else Reason.NO_MOVE_LEFT
        return result(Status.STOPPED, (), reason, "no individual fits the budget", **stats)
    return result(Status.PLANNED, (best,), **stats)


class _Search:
    def __init__(self, trace, opts, budget, evaluator, t0):
        self.trace, self.opts, self.budget, self.t0 = trace, opts, budget, t0
        self.rng = np.random.default_rng(opts.seed)
        self.sz = Sizes.of(trace, budget)
        self.sizes = self.sz.sizes
        self.evaluator = evaluator
        self.cache: dict[Plan, float] = {}
        self.evaluations = 0
        self.timed_out = False
        self.slowest_s = 0.0  # the longest generation so far (NOTE [ SwapAdvisor search ])

    def out_of_time(self) -> bool:
        """No time left for a generation as long as the slowest so far."""
        left = self.t0 + self.opts.time_limit_s - time.perf_counter()
        self.timed_out = left < self.slowest_s
        return self.timed_out

    def run(self) -> tuple[Plan | None, float, int]:
        o, n = self.opts, self.trace.n_ops
        first = [Individual(tuple(range(n)), self.random_alloc())]
        first += [
            Individual(mutate_order(self.trace, range(n), 1.0, self.rng), self.random_alloc())
            for _ in range(o.population - 1)
        ]
        pool = self._pool()
        try:
            t = time.perf_counter()
            pop = list(zip(first, self.score(first, pool), strict=True))
            self.slowest_s = time.perf_counter() - t
            gens = 0
            for _g in range(o.generations):
                if self.out_of_time():
                    break
                t = time.perf_counter()
                children = self.children(pop)
                pop = self.select(
                    pop + list(zip(children, self.score(children, pool), strict=True))
                )
                self.slowest_s = max(self.slowest_s, time.perf_counter() - t)
                gens += 1
        finally:
            if pool is not None:
                pool.shutdown()
        plan, t = min(pop, key=lambda x: x[1][1])[1]
        return plan, t, gens

    def _pool(self) -> ProcessPoolExecutor | None:
        if self.opts.workers == 1:
            return None
        ctx = multiprocessing.get_context("fork")
        return ProcessPoolExecutor(
            self.opts.workers, mp_context=ctx, initializer=_init_worker,
            initargs=(self.evaluator,),
        )  # fmt: skip

    def score(self, inds, pool) -> list[tuple[Plan | None, float]]:
        """(plan, iteration seconds) per individual, in order."""
        plans = [swap_plan(self.trace, ind, self.sizes) for ind in inds]
        todo = list(dict.fromkeys(p for p in plans if p is not None and p not in self.cache))
        if todo:
            self.evaluations += len(todo)
            if pool is None:
                times = [_fitness(self.evaluator, p) for p in todo]
            else:
                times = list(pool.map(_score, todo))
            self.cache.update(zip(todo, times, strict=True))
        return [(p, math.inf if p is None else self.cache[p]) for p in plans]

    def random_alloc(self) -> Allocation:
        k = len(self.sizes)
        split = tuple(bool(i) and bool(self.rng.random() < 0.5) for i in range(k))
        return self.sz.fit(split, self.sz.per_class(Allocation(split, ()), self.sz.live))

    def weights(self, times: Sequence[float]) -> np.ndarray:
        finite = [t for t in times if math.isfinite(t)]
        if not finite:
            return np.full(len(times), 1.0 / len(times))
        best = min(finite)
        z = np.array([best / t / TEMPERATURE if math.isfinite(t) else -np.inf for t in times])
        w = np.exp(z - z.max())
        return w / w.sum()

    def children(self, pop) -> list[Individual]:
        o, n = self.opts, self.trace.n_ops
        w = self.weights([s[1] for _i, s in pop])
        out: list[Individual] = []
        while len(out) < o.population:
            a, b = (pop[k][0] for k in self.rng.choice(len(pop), 2, replace=True, p=w))
            cr = int(self.rng.integers(n + 1))
            orders = (crossover_order(a.order, b.order, cr), crossover_order(b.order, a.order, cr))
            k = len(self.sizes)
            ca = int(self.rng.integers(k + 1))
            allocs = (
                crossover_alloc(a.alloc, b.alloc, ca, self.sz),
                crossover_alloc(b.alloc, a.alloc, ca, self.sz),
            )
            for order in orders:
                for alloc in allocs:
                    out.append(
                        Individual(
                            mutate_order(self.trace, order, o.mutation, self.rng),
                            mutate_alloc(alloc, o.mutation, self.rng, self.sz),
                        )
                    )
        return out

    def select(self, scored):
        """The next population: the best, then softmax draws without replacement."""
        times = [s[1] for _i, s in scored]
        best = min(range(len(scored)), key=lambda k: (times[k], k))
        w = self.weights(times)
        w[best] = 0.0
        m = self.opts.population - 1
        if w.sum() <= 0 or np.count_nonzero(w) < m:
            w = np.where(np.arange(len(scored)) == best, 0.0, 1.0 + w)
        picks = self.rng.choice(len(scored), m, replace=False, p=w / w.sum())
        return [scored[best]] + [scored[k] for k in picks]


__all__ = ["SwapAdvisorOptions", "swapadvisor"]

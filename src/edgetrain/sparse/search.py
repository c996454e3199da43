"""Budgeted search for a sparse update scheme (Tiny Training, MCUNetV3, section 3.2).

The problem: layer groups (e.g. "layer 7 weights", "last-k biases"), each with a few
options (train 0, 1/8, ..., all channels), each option with a measured accuracy gain
("contribution") and a memory cost in bytes. Choose exactly one option per group,
maximise the summed gain, keep the summed cost within the budget. With additive gains
and costs this is a multiple-choice knapsack, solved exactly here:

    solve_exact          MILP (scipy.optimize.milp / HiGHS), lexicographic: max gain, then min cost
    solve_dp             dynamic programming over cost: the test oracle and fallback
    solve_greedy         best gain per extra byte: the baseline
    evolutionary_search  the paper's method, for non-additive fitness or cost callables

All four take plain records (`Option`) and return a `SearchResult`; they are the
"solve" of extract -> solve -> apply (DESIGN principle 6) and import nothing of ours.
"""
from __future__ import annotations

import math
import numbers
import time
from dataclasses import dataclass
from typing import Callable, Hashable, Optional, Sequence

import numpy as np

# Gains within this (relative to max(1, |optimum|)) are ties, broken by cost: far above
# float64 summation noise over hundreds of groups, far below a measurable accuracy delta.
GAIN_TIE_RTOL = 1e-9
# Widest DP table (cost buckets per group): 256 Ki one-byte buckets covers a 256 KB SRAM
# budget byte-exactly; the choice table is groups x buckets x 1 byte (13 MB for 50 groups).
MAX_DP_BUCKETS = 1 << 18
# HiGHS needs milliseconds on sparse-update sized instances (hundreds of binaries);
# past this the exact DP (or its quantized form) answers instead.
MILP_TIME_LIMIT_S = 60.0
# Share of each generation's children made by mutation, the rest by crossover
# (as in the OFA / MCUNet evolution search the paper reuses).
MUTATION_SHARE = 0.5
# Probability that a gene comes from the first parent in uniform crossover.
CROSSOVER_MIX = 0.5
# Rejection-sampling attempts per child before giving up on it (tight budgets reject
# most random moves; a generation then has fewer children instead of looping forever).
MAX_TRIES_PER_CHILD = 50

Genome = tuple  # one option index per group


@dataclass(frozen=True)
class Option:
    """One choice for one group: what it is, its accuracy gain, its memory cost in bytes."""

    choice: Hashable
    gain: float
    cost: int

    def __post_init__(self):
        if isinstance(self.gain, bool) or not isinstance(self.gain, numbers.Real) \
                or not math.isfinite(self.gain):
            raise ValueError(f"option {self.choice!r}: gain must be a finite number, got {self.gain!r}")
        if isinstance(self.cost, bool) or not isinstance(self.cost, numbers.Integral) or self.cost < 0:
            raise ValueError(f"option {self.choice!r}: cost must be a non-negative integer "
                             f"number of bytes, got {self.cost!r}")


@dataclass(frozen=True)
class SearchResult:
    choices: tuple  # the chosen Option.choice of each group, in group order
    gain: float  # summed gain (or the fitness callable's value)
    cost: int  # summed cost in bytes (or the cost callable's value)
    method: str
    evaluations: int  # candidate evaluations (distinct genomes for the evolutionary search)
    seconds: float
    indices: tuple = ()  # the chosen option index of each group


class InfeasibleBudget(ValueError):
    """Even the cheapest choice for every group does not fit the budget."""

    def __init__(self, budget: int, min_budget: int, what: str = "the cheapest option of every group"):
        if min_budget <= budget:  # the message would contradict itself: the caller has a bug
            raise AssertionError(f"internal error: a budget of {budget} bytes was called infeasible although "
                               f"{what} fits in {min_budget} bytes")
        self.budget = budget
        self.min_budget = min_budget
        super().__init__(f"budget of {budget} bytes is infeasible: the smallest budget that fits "
                         f"is {min_budget} bytes ({what})")


# ---------------------------------------------------------------- extract / check


@dataclass(frozen=True)
class _Problem:
    gains: tuple  # per group: float64 array
    extras: tuple  # per group: int64 array, cost minus the group's cheapest cost
    min_budget: int  # sum of the cheapest costs
    slack: int  # budget - min_budget (>= 0 once checked feasible)


def _check(groups: Sequence[Sequence[Option]], budget: int, require_feasible: bool = True) -> _Problem:
    if isinstance(budget, bool) or not isinstance(budget, numbers.Integral):
        raise ValueError(f"budget must be an integer number of bytes, got {budget!r}")
    gains, extras, min_budget = [], [], 0
    for i, group in enumerate(groups):
        if len(group) == 0:
            raise ValueError(f"group {i} has no options: every group needs at least one "
                             "(e.g. 'do not train', gain 0, cost 0)")
        for opt in group:
            if not isinstance(opt, Option):
                raise ValueError(f"group {i}: expected Option records, got {type(opt).__name__}")
        costs = np.array([int(o.cost) for o in group], dtype=np.int64)
        gains.append(np.array([float(o.gain) for o in group], dtype=np.float64))
        extras.append(costs - costs.min())
        min_budget += int(costs.min())
    if require_feasible and budget < min_budget:
        raise InfeasibleBudget(int(budget), min_budget)
    return _Problem(tuple(gains), tuple(extras), min_budget, int(budget) - min_budget)


def _result(groups, idx, method: str, evaluations: int, t0: float) -> SearchResult:
    idx = tuple(int(j) for j in idx)
    opts = [g[j] for g, j in zip(groups, idx)]
    return SearchResult(choices=tuple(o.choice for o in opts), gain=float(sum(o.gain for o in opts)),
                        cost=int(sum(int(o.cost) for o in opts)), method=method,
                        evaluations=evaluations, seconds=time.perf_counter() - t0, indices=idx)


def _tie_tol(best: float) -> float:
    return GAIN_TIE_RTOL * max(1.0, abs(best))


# ---------------------------------------------------------------- exact: MILP


def solve_exact(groups: Sequence[Sequence[Option]], budget: int) -> SearchResult:
    """Maximise summed gain, one option per group, summed cost <= budget; among optimal
    gains (ties within GAIN_TIE_RTOL) the smallest cost. Two MILPs: max gain, then min
    cost subject to gain >= optimum - tie tolerance."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import csr_array

    t0 = time.perf_counter()
    p = _check(groups, budget)
    if not groups:
        return _result(groups, (), "milp", 0, t0)
    sizes = [len(g) for g in groups]
    gains = np.concatenate(p.gains)
    unit = math.gcd(*(int(e) for e in np.concatenate(p.extras))) or 1
    extras = np.concatenate(p.extras) // unit  # small integers: tighter numerics in HiGHS
    n = gains.size
    rows = np.repeat(np.arange(len(sizes)), sizes)
    one_each = LinearConstraint(csr_array((np.ones(n), (rows, np.arange(n))), shape=(len(sizes), n)), 1, 1)
    fits = LinearConstraint(extras[None, :].astype(np.float64), -np.inf, p.slack // unit)
    starts = np.cumsum([0] + sizes[:-1])

    def run(c, constraints):
        res = milp(c, integrality=np.ones(n), bounds=Bounds(0, 1), constraints=constraints,
                   options={"mip_rel_gap": 0.0, "time_limit": MILP_TIME_LIMIT_S})
        if res.status != 0 or res.x is None:
            return None
        x = np.rint(res.x).astype(np.int64)
        idx = [int(np.argmax(x[s:s + k])) for s, k in zip(starts, sizes)]
        picked = starts + np.array(idx)
        ok = all(x[s:s + k].sum() == 1 for s, k in zip(starts, sizes)) \
            and int(extras[picked].sum()) <= p.slack // unit
        return idx if ok else None  # rounding broke a constraint: let the DP answer

    first = run(-gains, [one_each, fits])
    if first is None:
        return _fallback_dp(groups, budget, "milp did not prove optimality", t0)
    best = _result(groups, first, "milp", 1, t0)
    floor = best.gain - _tie_tol(best.gain)
    second = run(extras.astype(np.float64), [one_each, fits, LinearConstraint(gains[None, :], floor, np.inf)])
    if second is not None:
        cheaper = _result(groups, second, "milp", 2, t0)
        if cheaper.gain >= floor and cheaper.cost <= best.cost:
            best = cheaper
    return _result(groups, best.indices, "milp", 2, t0)


def _fallback_dp(groups, budget, why: str, t0: float) -> SearchResult:
    r = solve_dp(groups, budget)
    return _result(groups, r.indices, f"{r.method} (fallback: {why})", r.evaluations, t0)


# ---------------------------------------------------------------- exact: DP over cost


def _dp_width(extras, slack: int, unit: int) -> int:
    return min(slack // unit, sum(int(-(-e.max() // unit)) for e in extras)) + 1


def _dp_unit(extras, slack: int, limit: int) -> tuple[int, bool]:
    """Bytes per DP bucket and whether that is exact (the gcd of the extra costs)."""
    g = math.gcd(*(int(v) for e in extras for v in e)) or 1
    if _dp_width(extras, slack, g) <= limit:
        return g, True
    lo, hi = g + 1, max(slack, g + 1)  # width(hi) <= 2 <= limit
    while lo < hi:  # smallest unit whose table fits: width is non-increasing in unit
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if _dp_width(extras, slack, mid) > limit else (lo, mid)
    return lo, False


def solve_dp(groups: Sequence[Sequence[Option]], budget: int, resolution: Optional[int] = None) -> SearchResult:
    """Exact DP over extra cost (cost above each group's cheapest), in units of the gcd of
    the extra costs. If the table would be wider than `resolution` buckets (default
    MAX_DP_BUCKETS), costs are quantized UP to coarser buckets: the result stays within
    budget but may miss the optimum (method "dp-quantized")."""
    t0 = time.perf_counter()
    limit = MAX_DP_BUCKETS if resolution is None else resolution
    if isinstance(limit, bool) or not isinstance(limit, numbers.Integral) or limit < 2:
        raise ValueError(f"resolution must be an integer >= 2 buckets, got {resolution!r}")
    p = _check(groups, budget)
    if not groups:
        return _result(groups, (), "dp", 0, t0)
    unit, exact = _dp_unit(p.extras, p.slack, limit)
    width = _dp_width(p.extras, p.slack, unit)
    weights = [-(-e // unit) for e in p.extras]  # ceil: quantized costs never under-count
    dtype = np.uint8 if max(len(g) for g in groups) <= 256 else np.uint32
    value = np.zeros(width)  # value[b]: best gain with extra cost <= b buckets
    picks = np.empty((len(groups), width), dtype=dtype)
    for i, (g, w) in enumerate(zip(p.gains, weights)):
        cand = np.full((len(g), width), -np.inf)
        for j in range(len(g)):
            if w[j] < width:
                cand[j, w[j]:] = value[:width - w[j]] + g[j]
        picks[i] = np.argmax(cand, axis=0)  # first best: lowest option index on ties
        value = cand[picks[i], np.arange(width)]
    # smallest capacity reaching the optimum = the cheapest optimal assignment
    b = int(np.argmax(value >= value[-1] - _tie_tol(float(value[-1]))))
    idx = [0] * len(groups)
    for i in range(len(groups) - 1, -1, -1):
        idx[i] = int(picks[i, b])
        b -= int(weights[i][idx[i]])
    return _result(groups, idx, "dp" if exact else f"dp-quantized({unit} B/bucket)", len(groups) * width, t0)


# ---------------------------------------------------------------- greedy


def solve_greedy(groups: Sequence[Sequence[Option]], budget: int) -> SearchResult:
    """Start from each group's cheapest option (highest gain among equally cheap), then
    repeatedly take the upgrade with the best gain per extra byte that still fits."""
    t0 = time.perf_counter()
    p = _check(groups, budget)
    cur = [min(range(len(g)), key=lambda j, e=e, g=g: (e[j], -g[j], j)) for g, e in zip(p.gains, p.extras)]
    spent, steps = 0, 0
    while True:
        best_key, best_move = None, None
        for i, (g, e) in enumerate(zip(p.gains, p.extras)):
            for j in range(len(g)):
                dg, dc = g[j] - g[cur[i]], int(e[j] - e[cur[i]])
                if dg <= 0 or spent + dc > p.slack:
                    continue
                key = (math.inf if dc <= 0 else dg / dc, dg, -i, -j)
                if best_key is None or key > best_key:
                    best_key, best_move = key, (i, j, dc)
        if best_move is None:  # each move raises one group's gain: at most sum(k-1) moves
            return _result(groups, cur, "greedy", steps, t0)
        i, j, dc = best_move
        cur[i], spent, steps = j, spent + dc, steps + 1


# ---------------------------------------------------------------- evolutionary search


def evolutionary_search(groups: Sequence[Sequence[Option]], budget: int, *,
                        fitness: Optional[Callable[[Genome], float]] = None,
                        cost: Optional[Callable[[Genome], int]] = None,
                        population: int = 100, generations: int = 50, mutation_rate: float = 0.1,
                        parent_ratio: float = 0.25, seed: int = 0) -> SearchResult:
    """The paper's evolutionary search over genomes (one option index per group).

    `fitness(genome)` and `cost(genome)` default to the summed gains and costs of the
    options; any callables work (non-additive objectives, cost measured by compiling).
    Each distinct genome is evaluated once (cost, then fitness if within budget);
    `evaluations` counts them. Each generation keeps the best `parent_ratio` share of
    distinct genomes and refills the population by mutation (each gene resampled with
    probability `mutation_rate`) and uniform crossover, rejecting children over budget.
    Deterministic for a given seed. The result reports the fitness and cost callables'
    values for the best genome seen (highest fitness, then lowest cost, then first seen).
    """
    t0 = time.perf_counter()
    if isinstance(population, bool) or not isinstance(population, numbers.Integral) or population < 2:
        raise ValueError(f"population must be an integer >= 2, got {population!r}")
    if isinstance(generations, bool) or not isinstance(generations, numbers.Integral) or generations < 0:
        raise ValueError(f"generations must be an integer >= 0, got {generations!r}")
    if not 0.0 <= mutation_rate <= 1.0:
        raise ValueError(f"mutation_rate must be in [0, 1], got {mutation_rate!r}")
    if not 0.0 < parent_ratio <= 1.0:
        raise ValueError(f"parent_ratio must be in (0, 1], got {parent_ratio!r}")
    additive_cost = cost is None
    p = _check(groups, budget, require_feasible=additive_cost)
    if not groups:
        return _result(groups, (), "evolutionary", 0, t0)
    n_groups = len(groups)
    sizes = np.array([len(g) for g in groups])
    fit = fitness or (lambda gen: float(sum(p.gains[i][j] for i, j in enumerate(gen))))
    cst = cost or (lambda gen: p.min_budget + int(sum(p.extras[i][j] for i, j in enumerate(gen))))
    seen: dict = {}  # genome -> (fitness or None if over budget, cost); insertion order = first seen

    def feasible(genome) -> bool:
        key = tuple(int(v) for v in genome)
        if key not in seen:
            c = int(cst(key))
            seen[key] = (float(fit(key)) if c <= budget else None, c)
        return seen[key][0] is not None

    rng = np.random.default_rng(seed)

    def random_genome():
        if not additive_cost:
            return rng.integers(0, sizes)
        # additive cost: visit groups in random order, pick uniformly among options that
        # still fit (cheapest options reserved for the rest): every sample is feasible
        genome, left = np.array([int(np.argmin(e)) for e in p.extras]), p.slack
        for i in rng.permutation(n_groups):
            fits = np.flatnonzero(p.extras[i] <= left)
            genome[i] = fits[rng.integers(len(fits))]
            left -= int(p.extras[i][genome[i]])
        return genome

    def draw(make) -> Optional[tuple]:
        for _ in range(MAX_TRIES_PER_CHILD):
            genome = make()
            if feasible(genome):
                return tuple(int(v) for v in genome)
        return None

    cheapest = tuple(int(np.argmin(e)) for e in p.extras)
    pop = [cheapest] if feasible(cheapest) else []
    pop += [g for g in (draw(random_genome) for _ in range(population - len(pop))) if g is not None]
    if not pop:
        raise InfeasibleBudget(int(budget), min(c for _, c in seen.values()),
                               "the cheapest candidate the search found")
    n_parents = max(1, int(parent_ratio * population))
    n_mutants = int(round((population - n_parents) * MUTATION_SHARE))
    rank = lambda g: (-seen[g][0], seen[g][1])  # noqa: E731  best fitness, then cheapest
    for _ in range(generations):
        parents = sorted(dict.fromkeys(pop), key=rank)[:n_parents]
        arr = np.array(parents)

        def mutant(arr=arr):  # (bound: each generation's parents)
            child = arr[rng.integers(len(arr))].copy()
            hit = rng.random(n_groups) < mutation_rate
            child[hit] = rng.integers(0, sizes[hit])
            return child

        def crossed(arr=arr):
            a, b = arr[rng.integers(len(arr), size=2)]
            return np.where(rng.random(n_groups) < CROSSOVER_MIX, a, b)

        children = [draw(mutant) for _ in range(n_mutants)]
        children += [draw(crossed) for _ in range(population - n_parents - n_mutants)]
        pop = parents + [c for c in children if c is not None]
    best = min((g for g, (f, _) in seen.items() if f is not None), key=rank)  # min: first on ties
    r = _result(groups, best, "evolutionary", len(seen), t0)
    return SearchResult(choices=r.choices, gain=seen[best][0], cost=seen[best][1], method=r.method,
                        evaluations=len(seen), seconds=time.perf_counter() - t0, indices=best)

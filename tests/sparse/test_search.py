"""Sparse-update search: exact solvers against brute force, baselines bounded by them."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edgetrain.sparse.search import (InfeasibleBudget, Option, SearchResult, evolutionary_search,
                                     solve_dp, solve_exact, solve_greedy)

GAIN_ABS_TOL = 1e-6  # summed float gains of a handful of options agree far closer than this
SOLVERS = (solve_exact, solve_dp, solve_greedy, evolutionary_search)


def brute_force(groups, budget, fitness=None, cost=None):
    """(gain, cost, indices) of the best assignment: max gain, then min cost; None if none fits."""
    best = None
    for idx in itertools.product(*(range(len(g)) for g in groups)):
        c = cost(idx) if cost else sum(g[j].cost for g, j in zip(groups, idx))
        if c > budget:
            continue
        f = fitness(idx) if fitness else sum(g[j].gain for g, j in zip(groups, idx))
        if best is None or f > best[0] + GAIN_ABS_TOL or (abs(f - best[0]) <= GAIN_ABS_TOL and c < best[1]):
            best = (f, c, idx)
    return best


def check_consistent(groups, r: SearchResult, budget):
    assert len(r.choices) == len(groups) == len(r.indices)
    assert r.choices == tuple(g[j].choice for g, j in zip(groups, r.indices))
    assert r.cost == sum(g[j].cost for g, j in zip(groups, r.indices)) <= budget
    assert math.isclose(r.gain, sum(g[j].gain for g, j in zip(groups, r.indices)), abs_tol=GAIN_ABS_TOL)


def make_groups(gain_lists, cost_lists):
    return [[Option((i, j), g, c) for j, (g, c) in enumerate(zip(gs, cs))]
            for i, (gs, cs) in enumerate(zip(gain_lists, cost_lists))]


@st.composite
def instances(draw, integer_gains=False):
    n = draw(st.integers(2, 6))
    sizes = [draw(st.integers(1, 5)) for _ in range(n)]
    gain = st.integers(-3, 12).map(float) if integer_gains else \
        st.floats(-5, 50, allow_nan=False, allow_infinity=False)
    groups = make_groups([[draw(gain) for _ in range(k)] for k in sizes],
                         [[draw(st.integers(0, 1000)) for _ in range(k)] for k in sizes])
    lo = sum(min(o.cost for o in g) for g in groups)
    hi = sum(max(o.cost for o in g) for g in groups)
    budget = draw(st.integers(lo - 100, hi + 100))
    return groups, budget


def realistic(n_groups=50, seed=0):
    """Per layer: train 0, 1/8, 1/4, 1/2, all channels; cost up to 100 KB, sqrt-like gain."""
    rng = np.random.default_rng(seed)
    groups = []
    for i in range(n_groups):
        full, scale = int(rng.integers(1_000, 100_000)), float(rng.uniform(0.05, 2.0))
        groups.append([Option((i, r), 0.0, 0) if r == 0 else
                       Option((i, r), scale * r ** 0.5 * float(1 + rng.normal(0, 0.05)),
                              int(full * r) + int(rng.integers(0, 64)))
                       for r in (0, 1 / 8, 1 / 4, 1 / 2, 1)])
    return groups


FAST_EVO = dict(population=20, generations=8)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(instances())
def test_exact_solvers_match_brute_force_and_baselines_are_bounded(inst):
    groups, budget = inst
    best = brute_force(groups, budget)
    if best is None:
        min_budget = sum(min(o.cost for o in g) for g in groups)
        for solver in SOLVERS:
            with pytest.raises(InfeasibleBudget, match=f"{min_budget} bytes") as e:
                solver(groups, budget)
            assert e.value.min_budget == min_budget
        return
    exact, dp = solve_exact(groups, budget), solve_dp(groups, budget)
    assert exact.method == "milp" and dp.method == "dp"
    for r in (exact, dp):
        check_consistent(groups, r, budget)
        assert math.isclose(r.gain, best[0], abs_tol=GAIN_ABS_TOL)
    for r in (solve_greedy(groups, budget), evolutionary_search(groups, budget, seed=1, **FAST_EVO)):
        check_consistent(groups, r, budget)
        assert r.gain <= exact.gain + GAIN_ABS_TOL


@settings(max_examples=80, deadline=None)
@given(instances(integer_gains=True))
def test_ties_are_broken_by_smaller_cost(inst):
    groups, budget = inst
    best = brute_force(groups, budget)
    if best is None:
        return
    for r in (solve_exact(groups, budget), solve_dp(groups, budget)):
        assert (r.gain, r.cost) == (best[0], best[1])


@settings(max_examples=40, deadline=None)
@given(instances(), st.integers(2, 40))
def test_quantized_dp_stays_within_budget(inst, resolution):
    groups, budget = inst
    if brute_force(groups, budget) is None:
        return
    r = solve_dp(groups, budget, resolution=resolution)
    check_consistent(groups, r, budget)
    assert r.gain <= solve_exact(groups, budget).gain + GAIN_ABS_TOL


def moderate(seed=3):
    rng = np.random.default_rng(seed)
    return make_groups(rng.uniform(0, 10, (10, 5)).round(3).tolist(),
                       rng.integers(0, 1000, (10, 5)).tolist()), 3000


def test_evolutionary_reaches_optimum_and_is_deterministic():
    groups, budget = moderate()
    exact = solve_exact(groups, budget)
    a = evolutionary_search(groups, budget, seed=0)
    assert math.isclose(a.gain, exact.gain, abs_tol=GAIN_ABS_TOL) and a.cost <= budget
    b = evolutionary_search(groups, budget, seed=0)
    assert (a.indices, a.gain, a.cost, a.evaluations) == (b.indices, b.gain, b.cost, b.evaluations)
    c = evolutionary_search(groups, budget, seed=1, generations=5)
    assert c.cost <= budget and c.gain <= exact.gain + GAIN_ABS_TOL


def test_evolutionary_non_additive_fitness_and_cost():
    rng = np.random.default_rng(7)
    gains, costs = rng.uniform(0, 5, (6, 3)), rng.integers(1, 500, (6, 3))
    gains[:, 0], costs[:, 0] = 0.0, 0  # option 0: do not train this layer
    groups = make_groups(gains.tolist(), costs.tolist())
    overhead = 200  # e.g. a per-trained-layer gradient buffer: cost is not a sum of options

    def fitness(idx):  # diminishing returns on the summed gain, plus a per-layer penalty
        s = sum(groups[i][j].gain for i, j in enumerate(idx))
        return math.sqrt(s) - 0.3 * sum(j != 0 for j in idx)

    def cost(idx):
        return sum(groups[i][j].cost for i, j in enumerate(idx)) + overhead * sum(j != 0 for j in idx)

    calls = []
    counted = lambda idx: calls.append(idx) or fitness(idx)  # noqa: E731
    budget = 1500
    best = brute_force(groups, budget, fitness, cost)
    r = evolutionary_search(groups, budget, fitness=counted, cost=cost, seed=0, population=30, generations=20)
    assert math.isclose(r.gain, best[0], abs_tol=GAIN_ABS_TOL)
    assert r.cost == cost(r.indices) <= budget
    assert len(calls) == len(set(calls)) <= r.evaluations  # cached: no genome evaluated twice
    with pytest.raises(InfeasibleBudget, match="bytes"):  # custom cost: nothing fits
        evolutionary_search(groups, 10**9, cost=lambda idx: 10**10, population=4, generations=1)


def test_realistic_instance_solves_exactly():
    groups, budget = realistic(), 128 * 1024
    exact = solve_exact(groups, budget)  # its speed: bench/planner_speed.py
    check_consistent(groups, exact, budget)
    dp = solve_dp(groups, budget)
    assert dp.method == "dp" and math.isclose(dp.gain, exact.gain, abs_tol=GAIN_ABS_TOL)
    assert dp.cost == exact.cost
    for r in (solve_greedy(groups, budget), evolutionary_search(groups, budget, generations=10)):
        check_consistent(groups, r, budget)
        assert r.gain <= exact.gain + GAIN_ABS_TOL


def test_trivial_cases():
    assert solve_exact([], 0).choices == () and solve_dp([], 5).gain == 0.0
    assert evolutionary_search([], 0).cost == 0 and solve_greedy([], 0).choices == ()
    one = [[Option("only", 1.5, 10)]]
    for solver in SOLVERS:
        assert solver(one, 10).choices == ("only",)
        with pytest.raises(InfeasibleBudget, match="10 bytes"):
            solver(one, 9)


@pytest.mark.parametrize("make, message", [
    (lambda: solve_exact([[Option("a", 1.0, 1)], []], 10), "group 1 has no options"),
    (lambda: Option("a", 1.0, -1), "non-negative integer"),
    (lambda: Option("a", 1.0, 1.5), "non-negative integer"),
    (lambda: Option("a", float("nan"), 1), "finite"),
    (lambda: Option("a", float("inf"), 1), "finite"),
    (lambda: solve_dp([[("a", 1.0, 1)]], 10), "expected Option"),
    (lambda: solve_greedy([[Option("a", 1.0, 1)]], 10.5), "budget must be an integer"),
    (lambda: solve_dp([[Option("a", 1.0, 1)]], 10, resolution=1), "resolution"),
    (lambda: evolutionary_search([[Option("a", 1.0, 1)]], 10, population=1), "population"),
    (lambda: evolutionary_search([[Option("a", 1.0, 1)]], 10, mutation_rate=2), "mutation_rate"),
    (lambda: evolutionary_search([[Option("a", 1.0, 1)]], 10, parent_ratio=0), "parent_ratio"),
])
def test_bad_input_is_rejected_at_the_boundary(make, message):
    with pytest.raises(ValueError, match=message):
        make()

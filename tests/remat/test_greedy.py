"""Greedy schedules ("none", "chen", "dtr", the paging greedy, the LP rounding) on synthetic
problems: valid by construction (make_schedule), within the budget, Infeasible with the
smallest RAM below it. The problem builders here are shared with test_milp.py."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from edgetrain.remat import greedy
from edgetrain.remat.plan import Infeasible
from edgetrain.remat.problem import ScheduleProblem, Stage, Unit

DEVICE = SimpleNamespace(name="fake", title="a fake device")  # problem.py only type-hints Device


def build(sizes, inputs, *, needs=None, flops=None, recompute_until=None, holds=None, pageable=None,
          fixed=None, rest=None, page_cost=1.0, page_time=1.0, fixed_ram=1000, stage_energy=1.0) -> ScheduleProblem:
    """A net of len(sizes) units (unit i computed at forward position i from `inputs[i]`)
    and backward stages (default: one per unit in reverse order, reading the unit and its
    inputs; weights updated in place at that stage, so recompute_until is the stage).
    `rest[k]` > 0 gives stage k a second node with that many fixed bytes. Paging costs
    `page_cost` times a default in energy and `page_time` times that in time."""
    n = len(sizes)
    flops = flops or [float(b) for b in sizes]
    needs = needs or [tuple(sorted({n - 1 - k, *inputs[n - 1 - k]})) for k in range(n)]
    S = len(needs)
    recompute_until = recompute_until or ([n - 1 - i for i in range(n)] if S == n else [S - 1] * n)
    holds = holds or {}
    pageable = pageable if pageable is not None else [True] * n
    fixed = fixed or ([sizes[n - 1 - k] for k in range(S)] if S == n else [1] * S)
    rest = rest or [0] * S
    last_forward = [max([i] + [w for w in range(n) if i in inputs[w]]) for i in range(n)]
    direct = [max([k for k in range(S) if i in needs[k]], default=-1) for i in range(n)]
    for u, hs in holds.items():
        direct[u] = max([direct[u]] + [b for _, b in hs])
    last = list(direct)
    for w in range(n - 1, -1, -1):
        for v in inputs[w]:
            last[v] = max(last[v], min(last[w], recompute_until[w]))
    units = tuple(Unit(index=i, name=f"u{i}", nodes=(i,), bytes=sizes[i], time_s=flops[i] * 1e-3,
                       energy_j=flops[i] * 1e-3, page_out_s=(0.5 + sizes[i] * 1e-3) * page_cost * page_time,
                       page_out_j=(0.5 + sizes[i] * 2e-3) * page_cost,
                       page_in_s=(0.5 + sizes[i] * 1e-3) * page_cost * page_time,
                       page_in_j=(0.5 + sizes[i] * 1e-3) * page_cost, inputs=tuple(inputs[i]), produced=i,
                       last_forward=last_forward[i], last_stage=last[i], recompute_until=recompute_until[i],
                       holds=tuple(holds.get(i, ())), pageable=pageable[i])
                  for i in range(n))
    stages, pos = [], n
    for k in range(S):
        nodes = (pos, pos + 1) if rest[k] else (pos,)
        pos += len(nodes)
        stages.append(Stage(index=k, nodes=nodes, needs=tuple(needs[k]), fixed_bytes=fixed[k], rest_bytes=rest[k],
                            time_s=stage_energy, energy_j=stage_energy))
    live = tuple(sum(sizes[u] for u in range(n) if u <= p <= last_forward[u]) for p in range(n))
    plain = max(live)
    for k in range(S):
        plain = max(plain, fixed[k] + sum(sizes[u] for u in range(n) if direct[u] >= k))
        if rest[k]:
            plain = max(plain, rest[k] + sum(sizes[u] for u in range(n) if direct[u] >= k + 1))
    return ScheduleProblem(device=DEVICE, graph=None, units=units, stages=tuple(stages), forward_live=live,
                           fixed_ram=fixed_ram, base_time_s=sum(u.time_s for u in units) + S * stage_energy,
                           base_energy_j=sum(u.energy_j for u in units) + S * stage_energy, activation_bytes=plain)


def chain(n, seed=0, **kw):
    r = random.Random(seed)
    return build([r.randint(10, 100) for _ in range(n)], [() if i == 0 else (i - 1,) for i in range(n)],
                 flops=[r.randint(1, 200) for _ in range(n)], **kw)


def skips(n, seed=0, **kw):
    """A chain with random skip connections (fan-in at 'adds')."""
    r = random.Random(seed)
    ins = [()] + [tuple(sorted({i - 1} | ({r.randrange(0, i - 1)} if i >= 2 and r.random() < 0.4 else set())))
                  for i in range(1, n)]
    return build([r.randint(10, 100) for _ in range(n)], ins, flops=[r.randint(1, 200) for _ in range(n)],
                 rest=[r.choice([0, 0, r.randint(10, 150)]) for _ in range(n)], **kw)


def early_update(n=10, seed=3):
    """Units 2 and 5 read a weight updated at stage 1: they cannot be recomputed later."""
    ruc = [n - 1 - i for i in range(n)]
    ruc[2] = ruc[5] = 1
    return skips(n, seed, recompute_until=ruc)


def with_holds(n=10, seed=4):
    """Unit 3 must stay resident through stages 0..2 (so it is kept), unit 6 through 4..5."""
    return skips(n, seed, holds={3: ((0, 2),), 6: ((4, 5),)})


def random_tiny(seed, n=4, S=4):
    """Tiny random problems for brute force: random DAG, needs, update stages, holds, paging."""
    r = random.Random(seed)
    ins = [tuple(sorted(r.sample(range(i), min(i, r.choice([0, 1, 1, 2]))))) for i in range(n)]
    needs = [tuple(sorted(r.sample(range(n), r.choice([1, 1, 2])))) for _ in range(S)]
    holds = {r.randrange(n): ((r.randrange(S), S - 1),)} if r.random() < 0.3 else {}
    return build([r.randint(5, 60) for _ in range(n)], ins, needs=needs,
                 flops=[r.randint(1, 80) for _ in range(n)],
                 recompute_until=[r.choice([-1, 0, S - 2, S - 1, S - 1]) for _ in range(n)],
                 holds=holds, pageable=[r.random() < 0.7 for _ in range(n)],
                 fixed=[r.randint(1, 40) for _ in range(S)], rest=[r.choice([0, r.randint(1, 60)]) for _ in range(S)],
                 page_cost=r.choice([0.02, 0.2, 1.0]), fixed_ram=100, stage_energy=0.1)


def budgets(problem, fracs=(1.0, 0.8, 0.6, 0.5)):
    """RAM budgets between the lower bound and the plain peak."""
    lb = greedy.ram_lower_bound(problem)
    top = problem.fixed_ram + problem.activation_bytes
    return sorted({max(lb, int(problem.fixed_ram + f * problem.activation_bytes)) for f in fracs if
                   problem.fixed_ram + f * problem.activation_bytes <= top}, reverse=True)


PROBLEMS = [chain(12), chain(30, 1), skips(20, 1), skips(40, 2), early_update(), with_holds()]
IDS = ["chain12", "chain30", "skips20", "skips40", "early-update", "holds"]


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_none_is_the_plain_schedule(problem):
    s = greedy.solve_none(problem, None, None, 1.0)
    assert s.recomputations == s.page_ins == 0 and not s.page_out
    assert s.activation_bytes == problem.activation_bytes
    assert s.energy_j == pytest.approx(problem.base_energy_j)
    # "none" ignores the budget: it never raises
    assert greedy.solve_none(problem, problem.fixed_ram, None, 1.0).peak_bytes == s.peak_bytes


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_greedies_fit_the_budget_or_say_so(problem):
    for ram in budgets(problem):
        for solve in (greedy.solve_dtr, greedy.solve_chen, greedy.solve_page_greedy):
            try:
                s = solve(problem, ram, None, 1.0)  # valid by construction: make_schedule checked it
            except Infeasible as e:
                assert str(e)
                continue
            assert s.peak_bytes <= ram
            if solve is greedy.solve_page_greedy:
                assert s.recomputations == 0
            else:
                assert s.page_ins == 0 and not s.page_out


@pytest.mark.parametrize("problem", PROBLEMS, ids=IDS)
def test_unlimited_ram_costs_nothing_extra(problem):
    for solve in (greedy.solve_dtr, greedy.solve_page_greedy):
        s = solve(problem, None, None, 1.0)
        assert s.energy_j == pytest.approx(problem.base_energy_j)
        assert s.activation_bytes <= problem.activation_bytes


def test_dtr_recomputes_under_pressure_and_saves_memory():
    p = chain(30, 1)
    ram = problem_ram(p, 0.6)
    s = greedy.solve_dtr(p, ram, None, 1.0)
    assert s.recomputations > 0 and s.peak_bytes <= ram
    assert s.energy_j > p.base_energy_j


def problem_ram(p, frac):
    return max(greedy.ram_lower_bound(p), int(p.fixed_ram + frac * p.activation_bytes))


def test_chen_is_budget_independent_and_checkpoints_a_chain():
    p = chain(30, 1)
    s = greedy.solve_chen(p, None, None, 1.0)
    assert s.recomputations > 0
    assert s.activation_bytes < p.activation_bytes
    # ~sqrt(n) segments: a handful of checkpoints kept
    assert 3 <= len(s.keep) <= 12
    with pytest.raises(Infeasible, match="does not depend on the budget"):
        greedy.solve_chen(p, s.peak_bytes - 1, None, 1.0)
    assert greedy.solve_chen(p, s.peak_bytes, None, 1.0).peak_bytes == s.peak_bytes


def test_chen_cuts_segments_only_at_articulation_units():
    p = skips(40, 2)
    order = list(range(40))
    segs = greedy._segments(p, order)
    assert [u for seg in segs for u in seg] == order
    for seg in segs[1:]:  # nothing before a segment is read inside it, except the previous unit
        first = seg[0]
        for w in seg:
            assert all(v >= first - 1 for v in p.units[w].inputs)


def test_below_the_lower_bound_is_infeasible_and_names_it():
    p = skips(20, 1)
    lb = greedy.ram_lower_bound(p)
    for solve in (greedy.solve_dtr, greedy.solve_chen, greedy.solve_page_greedy):
        with pytest.raises(Infeasible, match=f"{lb:,}"):
            solve(p, lb - 1, None, 1.0)


def test_units_updated_early_are_carried_or_kept():
    p = early_update()
    for ram in budgets(p):
        try:
            s = greedy.solve_dtr(p, ram, None, 1.0)
        except Infeasible:
            continue
        for st, rec in enumerate(s.recompute):
            assert all(st <= p.units[u].recompute_until for u in rec)


def test_holds_are_respected():
    p = with_holds()
    for solve in (greedy.solve_dtr, greedy.solve_page_greedy, greedy.solve_chen):
        s = solve(p, None, None, 1.0)
        assert 3 in s.keep and all(3 in s.resident[k] for k in range(3))
        assert all(6 in s.resident[k] for k in (4, 5))


def test_deadline_is_respected_or_infeasible():
    p = chain(30, 1)
    ram = problem_ram(p, 0.6)
    s = greedy.solve_page_greedy(p, ram, None, 1.0)
    assert s.time_s > p.base_time_s
    with pytest.raises(Infeasible, match="deadline"):
        greedy.solve_page_greedy(p, ram, p.base_time_s, 1.0)
    assert greedy.solve_page_greedy(p, ram, s.time_s, 1.0).time_s <= s.time_s


def test_lp_rounding_guided_schedule_is_valid():
    p = skips(20, 1)
    ram = problem_ram(p, 0.6)
    for tau in (0.9, 0.5, 0.1):
        try:
            s = greedy.solve_guided(p, ram, "guided", lambda st, u: 1.0 - 0.03 * u, tau)
        except Infeasible:
            continue
        assert s.peak_bytes <= ram


def assert_greedies_fit(p, rams):
    """dtr, chen and the paging greedy either raise Infeasible or fit each budget."""
    for ram in rams:
        for solve in (greedy.solve_dtr, greedy.solve_chen, greedy.solve_page_greedy):
            try:
                s = solve(p, ram, None, 1.0)
            except Infeasible:
                continue
            assert s.peak_bytes <= ram


def test_tiny_random_problems_never_break_the_greedies():
    for seed in range(60):
        p = random_tiny(seed)
        greedy.solve_none(p, None, None, 1.0)
        assert_greedies_fit(p, budgets(p))


# --- on a compiled program -------------------------------------------------------------

@pytest.fixture(scope="module")
def skip_problem():
    import torch
    from torch import nn

    import edgetrain as et
    from edgetrain.devices import get_device
    from edgetrain.remat.build import build_problem

    class Skip(nn.Module):
        def __init__(self):
            super().__init__()
            self.c1 = nn.Conv2d(3, 8, 3, padding=1)
            self.c2 = nn.Conv2d(8, 8, 3, padding=1)
            self.c3 = nn.Conv2d(8, 8, 3, padding=1)
            self.fc = nn.Linear(8, 5)

        def forward(self, x):
            a = torch.relu(self.c1(x))
            b = torch.relu(self.c2(a)) + a
            c = torch.relu(self.c3(b)) + b
            return self.fc(c.mean((2, 3)))

    torch.manual_seed(0)
    prog = et.compile(Skip().eval(), (torch.randn(4, 3, 16, 16),))
    return build_problem(prog, get_device("a72"))


def test_none_on_a_program_reaches_the_plain_peak(skip_problem):
    p = skip_problem
    s = greedy.solve_none(p, None, None, 1.0)
    assert s.activation_bytes == p.activation_bytes
    assert s.peak_bytes == p.fixed_ram + p.activation_bytes


def test_greedies_on_a_program_fit_their_budgets(skip_problem):
    p = skip_problem
    assert_greedies_fit(p, budgets(p, (0.9, 0.7, 0.5)))

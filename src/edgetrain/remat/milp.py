"""POET's MILP on the compressed problem, solved with HiGHS: per unit and stage, resident
(S), recomputed (R) or paged in (I); per unit, paged out (O). Energy is minimized under the
RAM budget at every forward position and stage and under the deadline. "checkmate" is the
same model without paging (O = I = 0), "paging" the same without recomputation (R = 0).

Reductions (each keeps the optimum):
- K (kept after the forward) is S at stage 0: keeping a unit that is not resident into
  stage 0 only costs forward memory, so an optimal schedule never does.
- No variables past a unit's horizon (the last stage that may read it).
- I only where the unit can be read at that stage (a stage needs it, or a unit it feeds may
  be recomputed there): paging in earlier and carrying it costs the same and more memory.
- Stage memory: at its first node, everything resident, recomputed or paged in; after it
  (stages of several nodes), the units carried into the next stage.
- Forward memory: one row per distinct set of units whose last forward use is behind, with
  the largest plain live bytes over those positions, and only rows not implied by a later
  one (the set only grows, so a later row with live bytes >= implies it).
Paging variables are not dropped by a paging-versus-recompute dominance: whether a unit's
inputs are resident depends on the rest of the schedule, so no such rule keeps optimality.

The search (`_solve`): if keeping everything fits, that is optimal (no extra energy).
Else the LP relaxation gives a bound and, rounded at several thresholds, warm starts; with
the greedy schedules ("dtr", "chen", the paging greedy) the cheapest that fits is the first
incumbent, and it is returned at once when within the gap of the LP bound. Then HiGHS on the
full model for a share of the time (the easy cases end there); then, when recomputation is
allowed, restricted models that recompute a unit only within a few input hops of what a
stage reads (DEPTHS; much smaller, solved to near optimality in seconds on ResNet-18, where
the full model's heuristics find poor schedules), each warm-started from the incumbent; then
the full model again for the rest of the time. The result is the best schedule with its gap
to the best proven bound, on the total energy (base energy included, like `energy_j`).
"""
from __future__ import annotations

import time
from typing import Optional

import numpy as np

from . import greedy
from .plan import Infeasible, Schedule, make_schedule, stage_bytes_budget
from .problem import ScheduleProblem

MIP_REL_GAP = 0.01  # the target: within 1 % of the optimum
THREADS = 2  # the target machine: 2 cores
KIB = 1024.0  # memory rows in KiB keep coefficients near 1..1e6
MIN_HIGHS_S = 0.05  # HiGHS always gets at least this long (a warm start is then still checked)
FIRST_TRY = 0.15  # share of the time limit for the full model before the restricted ones
DEPTHS = (2, 3, 4, 5, 6)  # restricted models: recompute a unit only this close to what a stage reads
DEPTH_SHARE = 0.1  # share of the time limit for each restricted model
PAGING_SHARE, CHECKMATE_SHARE = 0.1, 0.15  # milp: time shares of its paging-only and recompute-only warm starts
INF = float("inf")
ROUND_AT = (0.999, 0.9, 0.7, 0.5, 0.3, 0.1, 0.001)  # thresholds of the LP rounding warm start
RETRIES = 3  # re-solves with a tightened row when rounding the binaries overshoots a limit by a hair


class _Model:
    """Columns and rows of the MILP (rows kept as lists, passed to HiGHS at once)."""

    def __init__(self, problem: ScheduleProblem, budget: Optional[float], deadline: Optional[float],
                 remat: bool, paging: bool, min_ram: bool = False, depth: Optional[int] = None):
        self.p, us, stages = problem, problem.units, problem.stages
        self.f = f = greedy.facts(problem)
        self.lb, self.ub, self.cost = [], [], []
        self.S, self.R, self.I, self.O = {}, {}, {}, {}
        self.rows: list[tuple[list[int], list[float], float, float]] = []
        self.escale = escale = problem.base_energy_j or 1.0
        inf = float("inf")
        readable = [set(st.needs) for st in stages]  # where paging in a unit can pay off
        for u in us:
            for s in range(min(f.horizon[u.index], u.recompute_until) + 1 if remat else 0):
                readable[s] |= set(u.inputs)
        near = None
        if depth is not None:  # the restricted model: recompute only within `depth` of what is read
            S = len(stages)
            near = []
            for s, st in enumerate(stages):
                ring = set(st.needs) | (f.held[s + 1] if s + 1 < S else set())
                ring |= {u.index for u in us if u.recompute_until == s and f.horizon[u.index] > s}
                got = set(ring)
                for _ in range(depth):
                    ring = {v for u in ring for v in us[u].inputs} - got
                    got |= ring
                near.append(got)
        for u in us:
            i = u.index
            for s in range(f.horizon[i] + 1):
                held = i in f.held[s]
                self.S[s, i] = self._col(1.0 if held else 0.0, 1.0, 0.0)
                if remat and s <= u.recompute_until and not held and (near is None or i in near[s]):
                    self.R[s, i] = self._col(0.0, 1.0, u.energy_j / escale)
                if (paging or u.frozen) and u.pageable and i in readable[s] and not held:  # frozen: read again
                    self.I[s, i] = self._col(0.0, 1.0, u.page_in_j / escale)
            if any(k[1] == i for k in self.I):
                self.O[i] = self._col(0.0, 1.0, u.page_out_j / escale)
        self.bcol = self._col(0.0, inf, 1.0) if min_ram else None
        if min_ram:
            self.cost = [0.0] * (len(self.cost) - 1) + [1.0]
        for (s, i), c in self.S.items():
            if s + 1 <= f.horizon[i]:  # carried into s+1 only if materialized at s
                self._row([(self.S[s + 1, i], 1.0), (c, -1.0)] + self._mat(s, i, -1.0), -inf, 0.0)
            need = i in stages[s].needs
            self._row([(c, 1.0)] + self._mat(s, i, 1.0), 1.0 if need else -inf, 1.0)
        for (s, i), r in self.R.items():
            for v in us[i].inputs:
                if (s, v) in self.S:
                    self._row([(r, 1.0), (self.S[s, v], -1.0)] + self._mat(s, v, -1.0), -inf, 0.0)
                else:
                    self.ub[r] = 0.0
        for (_, i), c in self.I.items():
            self._row([(c, 1.0), (self.O[i], -1.0)], -inf, 0.0)
        self._memory_rows(budget)
        if deadline is not None:
            tscale = problem.base_time_s or 1.0
            terms = [(c, us[i].time_s / tscale) for (s, i), c in self.R.items()]
            terms += [(c, us[i].page_in_s / tscale) for (s, i), c in self.I.items()]
            terms += [(c, us[i].page_out_s / tscale) for i, c in self.O.items()]
            self._row(terms, -inf, (deadline - problem.base_time_s) / tscale)

    def _col(self, lo, hi, cost) -> int:
        self.lb.append(lo)
        self.ub.append(hi)
        self.cost.append(cost)
        return len(self.lb) - 1

    def _mat(self, s, i, coef):
        return [(d[s, i], coef) for d in (self.R, self.I) if (s, i) in d]

    def _row(self, terms, lo, hi):
        self.rows.append(([c for c, _ in terms], [v for _, v in terms], lo, hi))

    def _mem_row(self, terms, const, budget):
        if self.bcol is not None:
            self._row(terms + [(self.bcol, -1.0)], -float("inf"), -const / KIB)
        else:
            self._row(terms, -float("inf"), (budget - const) / KIB)

    def _memory_rows(self, budget):
        if budget is None and self.bcol is None:
            return
        p, us = self.p, self.p.units
        kept = sorted((us[i].last_forward, i) for (s, i) in self.S if s == 0)
        groups, k = [], 0  # (number of kept units behind, max live bytes)
        for pos, live in enumerate(p.forward_live):
            while k < len(kept) and kept[k][0] < pos:
                k += 1
            if groups and groups[-1][0] == k:
                groups[-1][1] = max(groups[-1][1], live)
            else:
                groups.append([k, live])
        later = -1
        for k, live in reversed(groups):
            if live > later:
                self._mem_row([(self.S[0, i], us[i].bytes / KIB) for _, i in kept[:k]], live, budget)
            later = max(later, live)
        for s, st in enumerate(p.stages):
            terms = []
            for i in range(len(us)):
                if (s, i) in self.S:
                    terms += [(self.S[s, i], us[i].bytes / KIB)] + self._mat(s, i, us[i].bytes / KIB)
            self._mem_row(terms, st.fixed_bytes, budget)
            if len(st.nodes) > 1:  # after the first node only what is carried into s+1 is live
                carried = [(self.S[s + 1, i], us[i].bytes / KIB) for i in range(len(us)) if (s + 1, i) in self.S]
                self._mem_row(carried, st.rest_bytes, budget)

    def lp(self, highspy):
        lp = highspy.HighsLp()
        n = len(self.lb)
        lp.num_col_, lp.num_row_ = n, len(self.rows)
        lp.col_cost_ = np.asarray(self.cost, dtype=float)
        lp.col_lower_ = np.asarray(self.lb, dtype=float)
        lp.col_upper_ = np.asarray(self.ub, dtype=float)
        lp.row_lower_ = np.asarray([r[2] for r in self.rows], dtype=float)
        lp.row_upper_ = np.asarray([r[3] for r in self.rows], dtype=float)
        start = np.cumsum([0] + [len(r[0]) for r in self.rows])
        lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
        lp.a_matrix_.num_col_, lp.a_matrix_.num_row_ = n, len(self.rows)
        lp.a_matrix_.start_ = start.astype(np.int32)
        lp.a_matrix_.index_ = np.asarray([c for r in self.rows for c in r[0]], dtype=np.int32)
        lp.a_matrix_.value_ = np.asarray([v for r in self.rows for v in r[1]], dtype=float)
        kinds = [highspy.HighsVarType.kInteger] * n
        if self.bcol is not None:
            kinds[self.bcol] = highspy.HighsVarType.kContinuous
        lp.integrality_ = kinds
        if self.bcol is None:  # the base energy (every node once): the gap is on the total energy
            lp.offset_ = self.p.base_energy_j / self.escale
        return lp

    def values_of(self, sched: Schedule) -> Optional[list[float]]:
        """The columns of a schedule, or None if it uses a decision the model lacks."""
        x = [0.0] * len(self.lb)
        for s, res in enumerate(sched.resident):
            for kind, group in ((self.S, res), (self.R, sched.recompute[s]), (self.I, sched.page_in[s])):
                for i in group:
                    if (s, i) not in kind:
                        return None
                    x[kind[s, i]] = 1.0
        for i in sched.page_out:
            if i not in self.O:
                return None
            x[self.O[i]] = 1.0
        return x

    def schedule(self, x, solver, solve_s, gap, status) -> Schedule:
        on = lambda d: {k for k, c in d.items() if x[c] > 0.5}  # noqa: E731
        S_, R_, I_, O_ = on(self.S), on(self.R), on(self.I), on(self.O)
        n = len(self.p.stages)
        return make_schedule(
            self.p, solver, keep={i for s, i in S_ if s == 0}, page_out=O_,
            resident=[{i for t, i in S_ if t == s} for s in range(n)],
            recompute=[[i for t, i in R_ if t == s] for s in range(n)],
            page_in=[[i for t, i in I_ if t == s] for s in range(n)], solve_s=solve_s, gap=gap, status=status)


def _highs(model: _Model, time_limit: float, gap: float, start: Optional[list[float]] = None, first=False):
    """Solve with HiGHS (`first`: stop at the first feasible solution)."""
    import highspy
    h = highspy.Highs()
    if first:
        h.setOptionValue("mip_max_improving_sols", 1)
    for name, value in (("output_flag", False), ("threads", THREADS), ("random_seed", 0),
                        ("mip_rel_gap", gap), ("mip_heuristic_effort", 0.3), ("time_limit", max(MIN_HIGHS_S, time_limit))):
        h.setOptionValue(name, value)
    h.passModel(model.lp(highspy))
    if start is not None:
        sol = highspy.HighsSolution()
        sol.col_value = start
        sol.value_valid = True
        h.setSolution(sol)
    h.run()
    status = h.getModelStatus()
    info = h.getInfo()
    has = info.primal_solution_status == 2  # kSolutionStatusFeasible
    x = list(h.getSolution().col_value) if has else None
    return status == highspy.HighsModelStatus.kOptimal, status == highspy.HighsModelStatus.kInfeasible, x, info


def _relaxation(model: _Model, time_limit: float):
    """The LP relaxation: (infeasible, column values or None, objective: a lower bound)."""
    import highspy
    h = highspy.Highs()
    for name, value in (("output_flag", False), ("threads", THREADS), ("random_seed", 0),
                        ("time_limit", max(MIN_HIGHS_S, time_limit))):
        h.setOptionValue(name, value)
    lp = model.lp(highspy)
    lp.integrality_ = []
    h.passModel(lp)
    h.run()
    status = h.getModelStatus()
    if status != highspy.HighsModelStatus.kOptimal:
        return status == highspy.HighsModelStatus.kInfeasible, None, -INF
    return False, list(h.getSolution().col_value), h.getInfo().objective_function_value


def _roundings(problem, model: _Model, x, remat):
    """Schedules from the LP relaxation `x` rounded at several thresholds (greedy.solve_guided)."""
    weight = lambda s, u: x[model.S[s, u]] if (s, u) in model.S else 0.0  # noqa: E731
    page_out = {u for u, c in model.O.items() if x[c] >= 0.5}
    for tau in ROUND_AT:
        yield lambda problem, ram, deadline, _, tau=tau: greedy.solve_guided(
            problem, ram, "lp-round", weight, tau, page_out, recompute=remat)


def _warm_start(problem, ram, deadline, remat, paging, model=None, x=None):
    """The cheapest greedy or rounded-LP schedule that fits (None if none does)."""
    solvers = []
    if remat:
        solvers += [greedy.solve_dtr, greedy.solve_chen]
    if paging:
        solvers += [greedy.solve_page_greedy]
    if x is not None:
        solvers += list(_roundings(problem, model, x, remat))
    best = None
    for solve in solvers:
        try:
            s = solve(problem, ram, deadline, 0.0)
        except Infeasible:
            continue
        if (ram is None or s.peak_bytes <= ram) and (deadline is None or s.time_s <= deadline) and \
                (remat or not s.recomputations) and (paging or not s.page_in_bytes):
            if best is None or s.energy_j < best.energy_j:
                best = s
    return best


class _Search:
    """The best schedule found so far (within ram and deadline) and the best proven bound."""

    def __init__(self, problem, ram, deadline, solver, t0):
        self.p, self.ram, self.deadline, self.solver, self.t0 = problem, ram, deadline, solver, t0
        self.best: Optional[Schedule] = None
        self.bound = -INF  # J
        self.over = (0, 0.0)  # how far a rounded solver solution overshot (bytes, s)

    def left(self, limit):
        return limit - (time.perf_counter() - self.t0)

    def offer(self, sched: Optional[Schedule]) -> None:
        if sched is None:
            return
        over_ram = sched.peak_bytes - self.ram if self.ram is not None else 0
        over_time = sched.time_s - self.deadline if self.deadline is not None else 0.0
        if over_ram > 0 or over_time > 0:
            self.over = (max(self.over[0], over_ram), max(self.over[1], over_time))
        elif self.best is None or sched.energy_j < self.best.energy_j:
            self.best = sched

    def run(self, model: _Model, limit: float, gap: float, proves: bool, first=False):
        """Solve `model` from the best schedule so far; `proves`: its bound is valid."""
        start = model.values_of(self.best) if self.best is not None else None
        optimal, infeasible, x, info = _highs(model, limit, gap, start, first)
        if x is not None:
            self.offer(model.schedule(x, self.solver, 0.0, 0.0, ""))
        if proves and (x is not None or optimal):
            self.bound = max(self.bound, float(info.mip_dual_bound) * model.escale)
        return optimal, infeasible

    def done(self, mip_rel_gap) -> bool:
        """The best schedule is proven within the gap."""
        return self.best is not None and self.result(mip_rel_gap).status == "optimal"

    def result(self, mip_rel_gap) -> Schedule:
        e = self.best.energy_j
        gap = min(1.0, max(0.0, (e - self.bound) / e)) if e > 0 else 0.0
        return _retag(self.best, self.solver, self.t0, gap, "optimal" if gap <= mip_rel_gap + 1e-12 else "time_limit")


def _solve(problem: ScheduleProblem, ram, deadline, time_limit, solver, remat, paging,
           mip_rel_gap=MIP_REL_GAP) -> Schedule:
    """The full model first (the easy cases end there); if it has not converged, models
    that recompute only near what each stage reads (DEPTHS: smaller, solved much faster)
    improve the incumbent; then the full model again from it, for the rest of the time."""
    t0 = time.perf_counter()
    f = greedy.facts(problem)
    greedy.check_ram(problem, ram, solver, f)
    if deadline is not None and deadline < problem.base_time_s:
        raise Infeasible(f"{solver}: deadline {deadline:.4g} s < {problem.base_time_s:.4g} s, the time of the "
                         f"plain schedule (every node once), which no schedule beats")
    search = _Search(problem, ram, deadline, solver, t0)
    plain = greedy.solve_none(problem)
    search.offer(plain)
    if search.best is not None:  # keeping everything fits: no schedule spends less energy
        search.bound = plain.energy_j
        return search.result(mip_rel_gap)
    budget = stage_bytes_budget(problem, ram)
    full = _Model(problem, budget, deadline, remat, paging)
    infeasible, x, lp_bound = _relaxation(full, time_limit / 4)
    if infeasible:
        raise _why(problem, ram, deadline, solver, remat, paging, search.left(time_limit))
    search.bound = lp_bound * full.escale
    search.offer(_warm_start(problem, ram, deadline, remat, paging, full, x))
    if remat and paging:
        # the paging-only and recompute-only optima are schedules of this model too: starting from
        # the better of them, POET's schedule is never worse than either at the same time limit
        for sub, share in ((False, PAGING_SHARE), (True, CHECKMATE_SHARE)):
            if sub and search.done(mip_rel_gap / 10):  # the gap is on the total energy: loose for
                break  # the extra energy; recompute-only can still beat a paging schedule within it
            try:
                search.offer(_solve(problem, ram, deadline, share * time_limit, solver, sub, not sub, mip_rel_gap))
            except Infeasible:
                pass
    if search.done(mip_rel_gap):
        return search.result(mip_rel_gap)  # the warm start is within the gap of the LP bound
    if search.best is not None:
        optimal, infeasible = search.run(full, min(search.left(time_limit), FIRST_TRY * time_limit), mip_rel_gap,
                                         True)
    else:  # no greedy schedule fits (a deadline, say): let HiGHS find one first
        optimal, infeasible = search.run(full, search.left(time_limit), mip_rel_gap, True, first=True)
    if infeasible and search.best is None:
        raise _why(problem, ram, deadline, solver, remat, paging, search.left(time_limit))
    if not optimal and remat:
        for depth in DEPTHS:
            if search.left(time_limit) <= 0 or search.done(mip_rel_gap):
                break
            sub = _Model(problem, budget, deadline, remat, paging, depth=depth)
            search.run(sub, min(search.left(time_limit), DEPTH_SHARE * time_limit), mip_rel_gap / 10, False)
    for attempt in range(RETRIES):
        if optimal or search.left(time_limit) <= 0 or search.done(mip_rel_gap):
            break
        if attempt:  # rounding the binaries went past a limit by the solver's tolerance: tighten
            full = _Model(problem, None if budget is None else budget - search.over[0],
                          None if deadline is None else deadline - search.over[1], remat, paging)
        search.over = (0, 0.0)
        optimal, _ = search.run(full, search.left(time_limit), mip_rel_gap, True)
        if not (search.over[0] or search.over[1]):
            break
    if search.best is None:
        raise Infeasible(f"{solver}: no schedule found within time_limit={time_limit:g} s (ram={ram}, "
                         f"deadline={deadline}); try a larger time limit")
    return search.result(mip_rel_gap)


def _retag(s: Schedule, solver, t0, gap, status) -> Schedule:
    return make_schedule(s.problem, solver, keep=s.keep, page_out=s.page_out, resident=s.resident,
                         recompute=s.recompute, page_in=s.page_in, solve_s=time.perf_counter() - t0, gap=gap,
                         status=status)


def _why(problem, ram, deadline, solver, remat, paging, time_limit) -> Infeasible:
    """An infeasible (ram, deadline): the error, with the smallest RAM that fits from the same
    model with the budget as the objective (the best found when not proven)."""
    model = _Model(problem, None, deadline, remat, paging, min_ram=True)
    optimal, infeasible, x, info = _highs(model, max(MIN_HIGHS_S, time_limit), 1e-6)
    what = f"{solver}: no schedule fits ram={ram:,} bytes" + (f" and deadline {deadline:.4g} s" if deadline else "")
    if x is None:
        return Infeasible(what)
    lo = problem.fixed_ram + int(np.ceil(float(info.mip_dual_bound) * KIB - 1e-6))
    hi = problem.fixed_ram + int(np.ceil(x[model.bcol] * KIB - 1e-6))
    if optimal:
        return Infeasible(f"{what}; the smallest RAM that fits is {hi:,} bytes", hi)
    return Infeasible(f"{what}; the smallest RAM that fits is between {lo:,} and {hi:,} bytes", hi)


def solve_milp(problem: ScheduleProblem, ram: Optional[int] = None, deadline: Optional[float] = None,
               time_limit: float = 60.0, *, mip_rel_gap: float = MIP_REL_GAP, backend: str = "highs") -> Schedule:
    """POET: recomputation and paging, minimum energy under `ram` and `deadline`."""
    if backend == "cpsat":
        raise ValueError("backend='cpsat' is not available (OR-Tools is not a dependency)")
    if backend != "highs":
        raise ValueError(f"unknown MILP backend {backend!r}: 'highs' or 'cpsat'")
    return _solve(problem, ram, deadline, time_limit, "milp", True, True, mip_rel_gap)


def solve_checkmate(problem: ScheduleProblem, ram: Optional[int] = None, deadline: Optional[float] = None,
                    time_limit: float = 60.0, *, mip_rel_gap: float = MIP_REL_GAP) -> Schedule:
    """Recomputation only (Checkmate's decisions on our problem)."""
    return _solve(problem, ram, deadline, time_limit, "checkmate", True, False, mip_rel_gap)


def solve_paging(problem: ScheduleProblem, ram: Optional[int] = None, deadline: Optional[float] = None,
                 time_limit: float = 60.0, *, mip_rel_gap: float = MIP_REL_GAP) -> Schedule:
    """Paging only: a unit is kept or paged out and back in, never recomputed."""
    return _solve(problem, ram, deadline, time_limit, "paging", False, True, mip_rel_gap)

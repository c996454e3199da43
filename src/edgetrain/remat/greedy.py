"""Greedy schedules: keep everything ("none"), sqrt(n) checkpointing ("chen", Chen et al.
2016), a DTR-style budgeted greedy ("dtr", Kirisame et al. 2021), and a paging-only greedy
(the warm start of the MILP's "paging" variant).

They share one simulation (`_simulate`): walk the stages in order, materialize what a stage
reads (page it in when it was paged out, else recompute it from its inputs, recursively),
then carry what the policy says into the next stage. `_trim` then drops what the result
carries or recomputes for nothing, so every greedy schedule is free of dead work.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Optional

from .plan import HEURISTIC, Infeasible, Schedule, make_schedule, stage_bytes_budget
from .problem import ScheduleProblem

INF = float("inf")


@dataclass(frozen=True)
class Facts:
    """What the solvers derive from a problem once."""

    horizon: tuple[int, ...]  # last stage at which a unit may be materialized (-1: never)
    direct_last: tuple[int, ...]  # last stage that reads it or holds it (-1: none)
    held: tuple[frozenset, ...]  # per stage: units that must be resident into it
    must_keep: frozenset  # units held from stage 0 on: kept after the forward


def facts(problem: ScheduleProblem) -> Facts:
    S = len(problem.stages)
    direct = [-1] * len(problem.units)
    for st in problem.stages:
        for u in st.needs:
            direct[u] = max(direct[u], st.index)
    held = [set() for _ in range(S)]
    must_keep = set()
    for u in problem.units:
        for first, last in u.holds:
            direct[u.index] = max(direct[u.index], last)
            for s in range(max(first, 0), min(last, S - 1) + 1):
                held[s].add(u.index)
            if first <= 0 <= last:
                must_keep.add(u.index)
    horizon = tuple(max(u.last_stage, direct[u.index]) for u in problem.units)
    return Facts(horizon, tuple(direct), tuple(frozenset(h) for h in held), frozenset(must_keep))


def ram_lower_bound(problem: ScheduleProblem, f: Optional[Facts] = None) -> int:
    """A RAM below which no schedule exists: the plain forward's live bytes (plus units that
    must be kept), and each stage's fixed bytes plus the units it reads or holds."""
    f = f or facts(problem)
    us = problem.units
    best = max(problem.forward_live, default=0)
    kept = sorted((us[u].last_forward, us[u].bytes) for u in f.must_keep)
    k, extra = 0, 0
    for p, live in enumerate(problem.forward_live):
        while k < len(kept) and kept[k][0] < p:
            extra += kept[k][1]
            k += 1
        best = max(best, live + extra)
    S = len(problem.stages)
    for st in problem.stages:
        nxt = f.held[st.index + 1] if st.index + 1 < S else frozenset()
        mat = set(st.needs) | f.held[st.index] | nxt
        best = max(best, st.fixed_bytes + sum(us[u].bytes for u in mat))
        if len(st.nodes) > 1:
            best = max(best, st.rest_bytes + sum(us[u].bytes for u in nxt))
    return problem.fixed_ram + best


def check_ram(problem: ScheduleProblem, ram: Optional[int], solver: str, f: Optional[Facts] = None) -> None:
    """Infeasible when `ram` is below the lower bound every schedule needs."""
    if ram is None:
        return
    lb = ram_lower_bound(problem, f)
    if ram < lb:
        raise Infeasible(f"{solver}: ram={ram:,} bytes cannot fit: at least {lb:,} bytes are needed (the plain "
                         f"forward's live bytes, or a stage's fixed bytes plus the units it reads; fixed RAM "
                         f"{problem.fixed_ram:,} included): no schedule fits below {lb:,} bytes")


def check_deadline(sched: Schedule, deadline: Optional[float], solver: str) -> Schedule:
    if deadline is not None and sched.time_s > deadline:
        raise Infeasible(f"{solver}: its schedule takes {sched.time_s:.4g} s > deadline {deadline:.4g} s "
                         f"(the plain schedule takes {sched.problem.base_time_s:.4g} s)")
    return sched


# ---------------------------------------------------------------------------------------
# the shared simulation

class _Stuck(Exception):
    """A unit is needed at a stage where it can neither be recomputed nor paged in."""

    def __init__(self, unit: int, stage: int):
        super().__init__(unit, stage)
        self.unit, self.stage = unit, stage


def _materialize(problem, s, wanted, mat, page_out, recompute=True) -> tuple[list[int], list[int]]:
    """Recompute / page in what `wanted` needs at stage s beyond `mat` (updated in place):
    (recomputed units in topological order, paged-in units)."""
    us = problem.units
    missing, stack = set(), list(wanted)
    while stack:
        x = stack.pop()
        if x in mat or x in missing:
            continue
        missing.add(x)
        if x in page_out:
            continue
        if not recompute or s > us[x].recompute_until:
            raise _Stuck(x, s)
        stack.extend(us[x].inputs)
    rec = [x for x in sorted(missing) if x not in page_out]
    pin = [x for x in sorted(missing) if x in page_out]
    mat |= missing
    return rec, pin


class _TooBig(Exception):
    """A stage cannot fit: recomputing `rec` (what it reads and their missing ancestors)
    takes too much memory at once."""

    def __init__(self, stage: int, rec: list[int], last_mat: dict):
        super().__init__(stage, rec)
        self.stage, self.rec, self.last_mat = stage, rec, last_mat


@dataclass
class _Policy:
    """How a greedy decides. `targets(s, have)`: units to materialize at s beyond the needs;
    `carry(s, mat)`: what of the materialized units to carry into s+1 (None: all of them);
    `budget`: stage bytes to fit by evicting resident units, smallest `score` first."""

    targets: Optional[Callable] = None
    carry: Optional[Callable] = None
    budget: Optional[int] = None
    score: Optional[Callable] = None  # (problem, unit, stage, last_used, resident) -> h
    page: bool = False  # evict by paging out (paging-only) instead of recomputing later


def _simulate(problem, f: Facts, keep, pins, page_out, pol: _Policy, solver):
    """Run the stages; returns (resident, recompute, page_in, page_out). `pins`: unit ->
    (start, end): materialized at stage `start` (-1: kept after the forward) and carried
    into every stage up to `end`."""
    us, S = problem.units, len(problem.stages)
    page_out = set(page_out)
    resident, recompute, page_in = [], [], []
    have = {u for u in keep if f.horizon[u] >= 0}
    last_used = {u: -1 for u in have}
    last_mat: dict = {}  # unit -> last stage it was materialized at (absent: the forward)
    for s, st in enumerate(problem.stages):
        have = {u for u in have if f.horizon[u] >= s}
        required = set(st.needs) | {u for u, (a, b) in pins.items() if a == s and b > s}
        if s + 1 < S:
            required |= f.held[s + 1]
        if pol.targets is not None:
            required |= pol.targets(s, have)
        pinned = {u for u, (a, b) in pins.items() if a < s <= b} | f.held[s]
        prev = problem.stages[s - 1] if s else None
        prev_rest = prev.rest_bytes if prev is not None and len(prev.nodes) > 1 else None
        while True:
            mat = set(have)
            rec, pin = _materialize(problem, s, required, mat, page_out, not pol.page)
            size = st.fixed_bytes + sum(us[u].bytes for u in mat)
            if prev_rest is not None:  # what is carried into s is live after stage s-1's first node
                size = max(size, prev_rest + sum(us[u].bytes for u in have))
            if pol.budget is None or size <= pol.budget:
                break
            used = set(required).union(*(us[w].inputs for w in rec))
            cands = [u for u in have if u not in used and u not in pinned and us[u].bytes > 0
                     and (us[u].pageable if pol.page else us[u].recompute_until >= s or u in page_out)]
            if not cands and rec:
                raise _TooBig(s, rec, last_mat)
            if not cands:
                raise Infeasible(f"{solver}: stage {s} needs {problem.fixed_ram + size:,} bytes with nothing "
                                 f"left to evict (ram {problem.fixed_ram + pol.budget:,})")
            victim = min(cands, key=lambda u: (pol.score(problem, u, s, last_used.get(u, -1), have), u))
            have.discard(victim)
            if pol.page:
                page_out.add(victim)
        resident.append(frozenset(have))
        recompute.append(rec)
        page_in.append(pin)
        for u in required.union(*(us[w].inputs for w in rec)):
            last_used[u] = s
        for u in mat:
            last_mat[u] = s
        carry = mat if pol.carry is None else pol.carry(s, mat)
        have = set(carry) | {u for u, (a, b) in pins.items() if a <= s < b} | (f.held[s + 1] if s + 1 < S else set())
    return resident, recompute, page_in, page_out


def _trim(problem, f: Facts, resident, recompute, page_in, page_out):
    """Drop residents, recomputations and page-ins that nothing uses (one backward pass);
    keep = what is resident into stage 0."""
    us, S = problem.units, len(problem.stages)
    res, rec, pin = [None] * S, [None] * S, [None] * S
    nxt: set = set()
    for s in range(S - 1, -1, -1):
        used = set(problem.stages[s].needs) | f.held[s] | nxt
        kept_rec = []
        for w in sorted(recompute[s], reverse=True):
            if w in used:
                kept_rec.append(w)
                used |= set(us[w].inputs)
        rec[s] = sorted(kept_rec)
        pin[s] = [u for u in page_in[s] if u in used]
        res[s] = frozenset(u for u in resident[s] if u in used)
        nxt = set(res[s])
    paged = {u for p in pin for u in p}
    keep = set(res[0]) if S else set()
    return keep, page_out & paged, res, rec, pin


def _run(problem, solver, choose_keep: Callable, pol: _Policy, keep, t0, page_out=()) -> Schedule:
    """Simulate with the units `choose_keep(keep, pins, page_out)` keeps, pinning units that
    get stuck (needed where they can no longer be recomputed: carried from their last
    recomputable stage, or kept; paged out instead when paging), until it runs."""
    f = facts(problem)
    us = problem.units
    keep = set(keep) | f.must_keep
    pins: dict = {}
    page_out = set(page_out) | {u.index for u in us if u.frozen}  # mapped frozen weights: in their file
    for _ in range(4 * len(us) + 4):
        try:
            k = choose_keep(keep, pins, page_out)
            resident, recompute, page_in, po = _simulate(problem, f, k, pins, page_out, pol, solver)
            break
        except _TooBig as e:  # carry a unit halfway (by bytes) through the recomputation from
            # where it was last materialized (the forward: keep it) instead of evicting it
            todo = [u for u in e.rec if u not in keep]
            if not todo:
                raise Infeasible(f"{solver}: stage {e.stage} cannot fit ram={problem.fixed_ram + pol.budget:,} "
                                 f"bytes") from None
            half, acc = sum(us[u].bytes for u in todo) / 2, 0
            for u in todo:
                acc += us[u].bytes
                if acc >= half:
                    break
            a, b = pins.get(u, (e.stage, e.stage))
            pins[u] = (min(a, e.last_mat.get(u, -1)), max(b, e.stage))
            if pins[u][0] < 0:
                keep.add(u)
        except _Stuck as e:
            u = us[e.unit]
            if pol.page and u.pageable and e.unit not in page_out:
                page_out.add(e.unit)
                continue
            start = -1 if pol.page else min(u.recompute_until, e.stage - 1)
            a, b = pins.get(e.unit, (start, e.stage))
            pins[e.unit] = (min(a, start), max(b, e.stage))
            if pins[e.unit][0] < 0:
                keep.add(e.unit)
    else:  # pragma: no cover - each retry extends a pin, so this is not reached
        raise Infeasible(f"{solver}: could not place every unit")
    keep, po, resident, recompute, page_in = _trim(problem, f, resident, recompute, page_in, po)
    return make_schedule(problem, solver, keep=keep, page_out=po, resident=resident, recompute=recompute,
                         page_in=page_in, solve_s=time.perf_counter() - t0, status=HEURISTIC)


# ---------------------------------------------------------------------------------------
# the solvers

def solve_none(problem: ScheduleProblem, ram: Optional[int] = None, deadline: Optional[float] = None,
               time_limit: float = 60.0) -> Schedule:
    """No rematerialization: every unit a stage reads stays in RAM from the forward until its
    last reader. Ignores `ram` and `deadline` (its peak is the plain schedule's)."""
    t0 = time.perf_counter()
    f = facts(problem)
    keep = {u.index for u in problem.units if f.direct_last[u.index] >= 0}
    resident = [{u for u in keep if f.direct_last[u] >= s} for s in range(len(problem.stages))]
    empty = [()] * len(problem.stages)
    return make_schedule(problem, "none", keep=keep, page_out=(), resident=resident, recompute=empty,
                         page_in=empty, solve_s=time.perf_counter() - t0, status=HEURISTIC)


def _relevant(problem, f: Facts) -> list[int]:
    """Units some stage reads, and the units they are computed from."""
    need = {u for u in range(len(problem.units)) if f.horizon[u] >= 0}
    for u in sorted(need, reverse=True):
        need |= set(problem.units[u].inputs)
    return sorted(need)


def _segments(problem, order: list[int]) -> list[list[int]]:
    """~sqrt(n) consecutive segments of `order`, cut only after articulation units (no
    edge of the unit graph jumps over them, e.g. a residual block's output), so that a
    segment is recomputed from its predecessor's checkpoint alone."""
    n = len(order)
    if not n:
        return []
    want = max(1, round(math.sqrt(n)))
    reach = {u: u for u in order}  # the last unit that reads u
    for w in order:
        for v in problem.units[w].inputs:
            reach[v] = max(reach.get(v, v), w)
    segments, cur, jump = [], [], -1
    for u in order:
        cur.append(u)
        if jump <= u and len(cur) >= n / want / 2:  # nothing before u is read after it
            segments.append(cur)
            cur = []
        jump = max(jump, reach[u])
    if cur:
        segments.append(cur)
    return segments


def solve_chen(problem: ScheduleProblem, ram: Optional[int] = None, deadline: Optional[float] = None,
               time_limit: float = 60.0) -> Schedule:
    """sqrt(n) checkpointing: ~sqrt(n) consecutive segments of the units, the last unit of
    each kept; a stage that reads a freed unit recomputes its segment (from checkpoints and
    resident units), which then stays until its units' last stage. The schedule does not
    depend on the budget: Infeasible when its peak exceeds `ram`."""
    t0 = time.perf_counter()
    f = facts(problem)
    check_ram(problem, ram, "chen", f)
    us = problem.units
    order = _relevant(problem, f)
    segments = _segments(problem, order)
    seg_of = {u: k for k, seg in enumerate(segments) for u in seg}
    checkpoints = {seg[-1] for seg in segments}

    def targets(s, have):
        out = set()
        for u in problem.stages[s].needs:
            if u not in have:
                out |= {v for v in segments[seg_of[u]] if f.horizon[v] >= s and us[v].recompute_until >= s}
        return out

    sched = _run(problem, "chen", lambda keep, pins, page_out: keep, _Policy(targets=targets), checkpoints, t0)
    if ram is not None and sched.peak_bytes > ram:
        raise Infeasible(f"chen: sqrt(n) checkpointing peaks at {sched.peak_bytes:,} bytes ({sched.peak_where}) > "
                         f"ram={ram:,}; its schedule does not depend on the budget")
    return check_deadline(sched, deadline, "chen")


def rebuild_energy(problem, u: int, have, stage: int) -> float:
    """DTR's e*: the energy of recomputing u at `stage` with what is in `have`: u and every
    ancestor that is not there (inf if one of them cannot be recomputed at that stage)."""
    us = problem.units
    seen, stack, total = set(), [u], 0.0
    while stack:
        x = stack.pop()
        if x in seen or (x != u and x in have):
            continue
        seen.add(x)
        if us[x].frozen:  # a mapped frozen weight is read again from the weights file
            total += us[x].page_in_j
            continue
        if stage > us[x].recompute_until:
            return INF
        total += us[x].energy_j
        stack.extend(us[x].inputs)
    return total


def _h(problem, u, s, last_used, have):
    """DTR's heuristic: e* / (bytes * staleness); smaller is evicted first."""
    return rebuild_energy(problem, u, set(have) - {u}, s) / (problem.units[u].bytes * (s - last_used + 1))


def _h_page(problem, u, s, last_used, have):
    unit = problem.units[u]
    return (unit.page_in_j + unit.page_out_j) / (unit.bytes * (s - last_used + 1))


def _forward_evict(problem, f: Facts, keep: set, budget: Optional[int], evictable, cost, solver) -> set:
    """Drop units from `keep` (smallest cost / (bytes * staleness) first) until every forward
    position fits `budget`."""
    if budget is None:
        return keep
    us, B0 = problem.units, problem.forward_end
    keep = set(keep)
    while True:
        kept = sorted(keep, key=lambda u: us[u].last_forward)
        worst, at, k, extra = -1, -1, 0, 0
        for p, live in enumerate(problem.forward_live):
            while k < len(kept) and us[kept[k]].last_forward < p:
                extra += us[kept[k]].bytes
                k += 1
            if live + extra > worst:
                worst, at = live + extra, p
        if worst <= budget:
            return keep
        cands = [u for u in keep if us[u].last_forward < at and evictable(us[u]) and us[u].bytes > 0]
        if not cands:
            raise Infeasible(f"{solver}: forward position {at} needs {problem.fixed_ram + worst:,} bytes with "
                             f"nothing left to drop (ram {problem.fixed_ram + budget:,})")
        victim = min(cands, key=lambda u: (cost(u, keep) / (us[u].bytes * (B0 - us[u].last_forward)), u))
        keep.discard(victim)


def solve_dtr(problem: ScheduleProblem, ram: Optional[int] = None, deadline: Optional[float] = None,
              time_limit: float = 60.0) -> Schedule:
    """DTR-style greedy under the budget, no paging: keep what the forward can hold (dropping
    the smallest cost / (bytes * staleness) first), then per stage recompute what is missing
    and evict resident units by the same score until the stage fits."""
    return _evicting(problem, ram, deadline, page=False)


def solve_page_greedy(problem: ScheduleProblem, ram: Optional[int] = None, deadline: Optional[float] = None,
                      time_limit: float = 60.0) -> Schedule:
    """Paging-only greedy (the warm start of "paging"): like "dtr", but an evicted unit is
    paged out after its first computation and paged in where it is read again."""
    return _evicting(problem, ram, deadline, page=True)


def _evicting(problem: ScheduleProblem, ram: Optional[int], deadline: Optional[float], page: bool) -> Schedule:
    """The greedy of "dtr" (page=False: an evicted unit is recomputed, priced by rebuilding it)
    and of the paging warm start (page=True: paged out and back in, priced by that traffic)."""
    t0 = time.perf_counter()
    name = "paging-greedy" if page else "dtr"
    f = facts(problem)
    check_ram(problem, ram, name, f)
    budget = stage_bytes_budget(problem, ram)
    start = {u.index for u in problem.units if f.direct_last[u.index] >= 0}
    us = problem.units

    def evictable(u):
        return u.pageable if page else u.recompute_until >= 0 or u.frozen

    def cost(u, k):
        return us[u].page_in_j + us[u].page_out_j if page else rebuild_energy(problem, u, k - {u}, f.direct_last[u])

    def choose_keep(keep, pins, page_out):
        fixed = f.must_keep | {u for u, (a, _) in pins.items() if a < 0}
        k = _forward_evict(problem, f, keep, budget, lambda u: u.index not in fixed and evictable(u), cost, name)
        if page:
            page_out |= {u for u in start - k if us[u].pageable}
        return k
    policy = _Policy(budget=budget, score=_h_page, page=True) if page else _Policy(budget=budget, score=_h)
    sched = _run(problem, "paging" if page else "dtr", choose_keep, policy, start, t0)
    return check_deadline(sched, deadline, name)


def solve_guided(problem: ScheduleProblem, ram: Optional[int], solver: str, weight: Callable, tau: float,
                 page_out=(), recompute: bool = True) -> Schedule:
    """Round a fractional schedule (the MILP's LP relaxation): keep u after the forward and
    carry it into stage s when weight(s, u) >= tau; where the budget is exceeded, drop the
    units of smallest weight first; what a stage reads and lacks is paged in (if in
    `page_out`) or recomputed (`recompute`; else it is paged out too)."""
    t0 = time.perf_counter()
    f = facts(problem)
    budget = stage_bytes_budget(problem, ram)
    us = problem.units
    start = {u for u in range(len(us)) if f.horizon[u] >= 0 and weight(0, u) >= tau}

    def choose_keep(keep, pins, po):
        fixed = f.must_keep | {u for u, (a, _) in pins.items() if a < 0}
        ok = (lambda u: u.index not in fixed and (u.recompute_until >= 0 or u.frozen)) if recompute else \
            (lambda u: u.index not in fixed and u.pageable)
        k = _forward_evict(problem, f, keep, budget, ok, lambda u, kk: weight(0, u) * us[u].bytes *
                           (problem.forward_end - us[u].last_forward), solver)
        if not recompute:
            po |= {u for u in keep - k if us[u].pageable}
        return k

    def score(problem, u, s, last_used, have):
        return weight(s, u)

    def carry(s, mat):
        return {u for u in mat if weight(s + 1, u) >= tau}

    pol = _Policy(budget=budget, score=score, carry=carry, page=not recompute)
    return _run(problem, solver, choose_keep, pol, start, t0, page_out)

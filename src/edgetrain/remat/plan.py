"""Schedule: what a solver decided, checked against the problem and priced by its model.

Every solver returns `make_schedule(...)`, which raises ScheduleError for a schedule that
would read a tensor that is not there (the invariant the solvers are tested against) and
computes energy, time and peak memory from `problem` alone, the same way for all solvers.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Optional

from ..config import format_bytes
from .problem import ScheduleProblem

#: the status of a schedule from a rule (chen, dtr, none) rather than a solver with a bound:
#: its gap to the optimum is unknown, so neither "optimal" nor a gap is claimed
HEURISTIC = "heuristic"


class ScheduleError(ValueError):
    """A schedule that cannot run: a tensor read where it is not materialized."""


class Infeasible(ValueError):
    """No schedule fits the RAM budget and the deadline. `smallest_ram`: the smallest RAM (bytes)
    a schedule meets within the deadline, when the solver found it (None: not known)."""

    def __init__(self, message: str, smallest_ram: Optional[int] = None):
        super().__init__(message)
        self.smallest_ram = smallest_ram


class Decision(enum.Enum):
    KEEP = "keep"  # stays in RAM into the stage
    RECOMPUTE = "recompute"  # recomputed at the start of the stage
    PAGE_OUT = "page_out"  # written to storage after its first computation
    PAGE_IN = "page_in"  # read back from storage at the start of the stage
    FREE = "free"  # dropped after its last forward use


@dataclass(frozen=True)
class Schedule:
    """Per unit and stage: kept, recomputed, paged in; per unit: paged out; with the model's
    figures. `peak_bytes` includes `problem.fixed_ram`; `activation_bytes` does not."""

    problem: ScheduleProblem
    solver: str
    keep: frozenset
    page_out: frozenset
    resident: tuple[frozenset, ...]
    recompute: tuple[tuple[int, ...], ...]
    page_in: tuple[tuple[int, ...], ...]
    energy_j: float
    time_s: float
    peak_bytes: int
    activation_bytes: int
    solve_s: float
    gap: float
    status: str  # "optimal" (within the solver's tolerance), "time_limit", or HEURISTIC
    peak_where: str = ""

    @property
    def recomputations(self) -> int:
        return sum(len(r) for r in self.recompute)

    @property
    def page_ins(self) -> int:
        return sum(len(p) for p in self.page_in)

    @property
    def page_in_bytes(self) -> int:
        """Bytes of activations paged in (the page store's; mapped frozen weights: weight_page_in_bytes)."""
        us = self.problem.units
        return sum(us[u].bytes for p in self.page_in for u in p if not us[u].frozen)

    @property
    def page_out_bytes(self) -> int:
        return sum(self.problem.units[u].bytes for u in self.page_out if not self.problem.units[u].frozen)

    @property
    def weight_page_ins(self) -> int:
        """Times a mapped frozen weight is read again from the weights file in the backward."""
        us = self.problem.units
        return sum(1 for p in self.page_in for u in p if us[u].frozen)

    @property
    def weight_page_in_bytes(self) -> int:
        us = self.problem.units
        return sum(us[u].bytes for p in self.page_in for u in p if us[u].frozen)

    def decisions(self) -> list[tuple[int, str, Decision]]:
        """(stage, unit name, decision) for every unit that is not simply dropped: stage -1
        is the forward phase (KEEP past its last forward use, PAGE_OUT, FREE)."""
        us = self.problem.units
        out = []
        for u in us:
            if u.last_stage < 0:
                continue
            out.append((-1, u.name, Decision.KEEP if u.index in self.keep else Decision.FREE))
            if u.index in self.page_out:
                out.append((-1, u.name, Decision.PAGE_OUT))
        for s in range(len(self.resident)):
            out += [(s, us[u].name, Decision.KEEP) for u in sorted(self.resident[s])]
            out += [(s, us[u].name, Decision.PAGE_IN) for u in self.page_in[s]]
            out += [(s, us[u].name, Decision.RECOMPUTE) for u in self.recompute[s]]
        return out

    def summary(self) -> str:
        p = self.problem
        extra_e = self.energy_j / p.base_energy_j - 1 if p.base_energy_j else 0.0
        return (f"{self.solver}: peak {format_bytes(self.peak_bytes)} (activations "
                f"{format_bytes(self.activation_bytes)}), energy {self.energy_j:.4g} J ({extra_e:+.2%}), "
                f"time {self.time_s:.4g} s, {self.recomputations} recomputations, {self.page_ins} page-ins, "
                f"{len(self.page_out)} page-outs; solved in {self.solve_s:.2f} s, {self.quality()}")

    def quality(self) -> str:
        """How good the solver proved this schedule: `gap` is the relative distance of its
        energy to the solver's lower bound; "optimal" means within the solver's tolerance."""
        if self.status == HEURISTIC:
            return "a heuristic (no bound on how far from optimal)"
        if self.status == "optimal":
            return "optimal" if self.gap == 0 else f"within {self.gap:.2%} of optimal (proven, the solver's tolerance)"
        return f"stopped by the {self.status.replace('_', ' ')}: within {self.gap:.2%} of optimal"


def make_schedule(problem: ScheduleProblem, solver: str, *, keep: Iterable[int], page_out: Iterable[int],
                  resident, recompute, page_in, solve_s: float, gap: float = 0.0,
                  status: str = "optimal") -> Schedule:
    """Check a solver's decisions (ScheduleError if one reads a tensor that is not there)
    and price them with the problem's model."""
    S = len(problem.stages)
    keep, page_out = frozenset(keep), frozenset(page_out)
    resident = tuple(frozenset(r) for r in resident)
    recompute = tuple(tuple(sorted(r)) for r in recompute)
    page_in = tuple(tuple(sorted(p)) for p in page_in)
    if not (len(resident) == len(recompute) == len(page_in) == S):
        raise ScheduleError(f"{solver}: resident/recompute/page_in need one entry per stage ({S})")
    check_schedule(problem, keep, page_out, resident, recompute, page_in, solver)
    peak, where = peak_model(problem, keep, resident, recompute, page_in)
    us = problem.units
    time = problem.base_time_s + sum(us[u].page_out_s for u in page_out)
    energy = problem.base_energy_j + sum(us[u].page_out_j for u in page_out)
    for s in range(S):
        time += sum(us[u].time_s for u in recompute[s]) + sum(us[u].page_in_s for u in page_in[s])
        energy += sum(us[u].energy_j for u in recompute[s]) + sum(us[u].page_in_j for u in page_in[s])
    return Schedule(problem, solver, keep, page_out, resident, recompute, page_in, energy_j=energy, time_s=time,
                    peak_bytes=peak, activation_bytes=peak - problem.fixed_ram, solve_s=solve_s, gap=gap,
                    status=status, peak_where=where)


def check_schedule(problem, keep, page_out, resident, recompute, page_in, solver="schedule") -> None:
    us, stages = problem.units, problem.stages
    n = len(us)
    for name, group in (("keep", keep), ("page_out", page_out)):
        bad = [u for u in group if not 0 <= u < n]
        if bad:
            raise ScheduleError(f"{solver}: {name} names unit {bad[0]}, not one of the {n} units")
    bad = [u for u in page_out if not us[u].pageable]
    if bad:
        raise ScheduleError(f"{solver}: unit {us[bad[0]].name} cannot be paged")
    if resident and not resident[0] <= keep:
        u = min(resident[0] - keep)
        raise ScheduleError(f"{solver}: {us[u].name} is resident at stage 0 but was not kept after the forward")
    for u in us:
        for first, last in u.holds:
            if first == 0 and u.index not in keep:
                raise ScheduleError(f"{solver}: {u.name} must be kept (a view of it is alive in the backward)")
            for s in range(max(first, 0), last + 1):
                if u.index not in resident[s]:
                    raise ScheduleError(f"{solver}: {u.name} must stay resident into stage {s} (a view of "
                                        f"its storage is alive there)")
    for s, st in enumerate(stages):
        here = set(resident[s])
        rec, pin = recompute[s], page_in[s]
        if here & set(rec) or here & set(pin) or set(rec) & set(pin):
            raise ScheduleError(f"{solver}: stage {s} keeps, recomputes or pages in one unit twice")
        for u in pin:
            if u not in page_out:
                raise ScheduleError(f"{solver}: stage {s} pages in {us[u].name}, which was never paged out")
        here |= set(pin)
        for u in rec:
            if s > us[u].recompute_until:
                raise ScheduleError(f"{solver}: stage {s} recomputes {us[u].name} after a weight it reads "
                                    f"was updated")
            missing = [i for i in us[u].inputs if i not in here]
            if missing:
                raise ScheduleError(f"{solver}: stage {s} recomputes {us[u].name} without its input "
                                    f"{us[missing[0]].name}")
            here.add(u)
        missing = [u for u in st.needs if u not in here]
        if missing:
            raise ScheduleError(f"{solver}: stage {s} reads {us[missing[0]].name}, which is neither kept, "
                                f"recomputed nor paged in")
        if s + 1 < len(stages) and not resident[s + 1] <= here:
            u = min(resident[s + 1] - here)
            raise ScheduleError(f"{solver}: {us[u].name} is resident at stage {s + 1} but not materialized at "
                                f"stage {s}")


def peak_model(problem, keep, resident, recompute, page_in) -> tuple[int, str]:
    """The model's peak RAM and where it is ("forward position p" or "stage s")."""
    us = problem.units
    best, where = problem.fixed_ram, "nowhere"
    kept_after = sorted((us[u].last_forward, us[u].bytes) for u in keep)
    k, extra = 0, 0
    for p, live in enumerate(problem.forward_live):
        while k < len(kept_after) and kept_after[k][0] < p:
            extra += kept_after[k][1]
            k += 1
        b = problem.fixed_ram + live + extra
        if b > best:
            best, where = b, f"forward position {p}"
    S = len(problem.stages)
    for s, st in enumerate(problem.stages):
        mat = set(resident[s]) | set(recompute[s]) | set(page_in[s])
        b = problem.fixed_ram + st.fixed_bytes + sum(us[u].bytes for u in mat)
        if b > best:
            best, where = b, f"stage {s}"
        if len(st.nodes) > 1:
            on = resident[s + 1] if s + 1 < S else ()
            b = problem.fixed_ram + st.rest_bytes + sum(us[u].bytes for u in on)
            if b > best:
                best, where = b, f"stage {s} after its first node"
    return best, where


def stage_bytes_budget(problem: ScheduleProblem, ram: Optional[int]) -> Optional[int]:
    """The activation bytes a budget of `ram` leaves (None: unlimited)."""
    return None if ram is None else ram - problem.fixed_ram

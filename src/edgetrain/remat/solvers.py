"""The schedule solvers by name, all `(problem, ram, deadline, time_limit) -> Schedule`."""
from __future__ import annotations

from .greedy import solve_chen, solve_dtr, solve_none
from .milp import solve_checkmate, solve_milp, solve_paging

SOLVERS = {
    "milp": solve_milp,  # POET: recomputation and paging, minimum energy (HiGHS)
    "checkmate": solve_checkmate,  # the same MILP, recomputation only
    "paging": solve_paging,  # the same MILP, paging only
    "none": solve_none,  # keep everything (the plain schedule)
    "chen": solve_chen,  # sqrt(n) checkpointing
    "dtr": solve_dtr,  # DTR-style greedy eviction under the budget
}

__all__ = ["SOLVERS"]

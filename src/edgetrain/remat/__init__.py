"""Rematerialization and paging (POET) for compiled training programs: the problem from
the IR (problem.py), its solvers (milp.py, greedy.py), the checked schedule (plan.py) and
its execution (apply.py)."""
from .plan import Decision, Infeasible, Schedule, ScheduleError, make_schedule
from .problem import ScheduleProblem, Stage, Unit
from .solve import SOLVER_NAMES, schedule

__all__ = ["Decision", "Infeasible", "Schedule", "ScheduleError", "ScheduleProblem", "Stage", "Unit",
           "SOLVER_NAMES", "make_schedule", "schedule"]

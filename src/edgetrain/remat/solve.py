"""et.schedule(): a program's rematerialization / paging schedule on a device profile."""
from __future__ import annotations

import math
from typing import Optional, Union

from ..config import parse_bytes
from .build import build_problem
from .plan import Schedule

SOLVER_NAMES = ("milp", "none", "chen", "checkmate", "paging", "dtr")
MILP_SOLVERS = ("milp", "checkmate", "paging")  # those with a gap to a proven bound


def schedule(prog, device="a72", ram: Union[int, str, None] = None, deadline: Optional[float] = None,
             solver: str = "milp", time_limit: float = 60.0, group: bool = False,
             mip_rel_gap: Optional[float] = None, mapped_weights: bool = False) -> Schedule:
    """Decide, per saved tensor and backward stage, to keep it in RAM, recompute it or page
    it out to storage and back, so that the training step fits `ram` bytes (int or "3MB";
    None: unlimited) and `deadline` seconds (None: unlimited) on `device` (a name from
    edgetrain.devices or a Device) at the least energy. `solver`: "milp" (POET's MILP,
    HiGHS), "checkmate" (the same without paging), "paging" (without recomputation),
    "chen" (sqrt(n) checkpoints), "dtr" (greedy eviction) or "none" (plain
    back-propagation: everything kept). The MILP stops after `time_limit` seconds with its
    best schedule and optimality gap. `mip_rel_gap` (MILP solvers only; default
    milp.MIP_REL_GAP, 1 %): the relative gap to the proven bound at which it stops, on the
    total energy (base included), so 1 % of the total may be far more of the extra energy:
    ask for less (say 1e-3) where the extra energy itself matters. `group=True` decides
    cheap elementwise chains as one unit (a smaller problem; see schedule.build).
    `mapped_weights=True`: the program runs as the standalone host binary mapping its weights
    file, so the frozen weights are paged too (remat/weights.py): each is resident only where
    the schedule says (read from the file again, or kept), not counted in RAM all along; the
    binary emitted from `prog.apply(sched)` drops their pages where the schedule says. Run the
    result with `prog.apply(sched)`."""
    from ..devices import get_device

    if solver not in SOLVER_NAMES:
        raise ValueError(f"solver={solver!r}: use one of {', '.join(SOLVER_NAMES)}")
    ram = parse_bytes(ram, "ram")
    if deadline is not None and not (isinstance(deadline, (int, float)) and math.isfinite(deadline)
                                     and deadline > 0):
        raise ValueError(f"deadline must be a positive number of seconds or None, got {deadline!r}")
    if not (isinstance(time_limit, (int, float)) and time_limit > 0):
        raise ValueError(f"time_limit must be a positive number of seconds, got {time_limit!r}")
    if not hasattr(prog, "train_graph"):
        raise TypeError(f"schedule() takes a compiled edgetrain Program, got {type(prog).__name__}")
    kw = {}
    if mip_rel_gap is not None:
        if solver not in MILP_SOLVERS:
            raise ValueError(f"mip_rel_gap is for the MILP solvers ({', '.join(MILP_SOLVERS)}), not {solver!r}")
        if not (isinstance(mip_rel_gap, (int, float)) and 0 <= mip_rel_gap < 1):
            raise ValueError(f"mip_rel_gap must be a number in [0, 1), got {mip_rel_gap!r}")
        kw["mip_rel_gap"] = float(mip_rel_gap)
    problem = build_problem(prog, get_device(device), group=bool(group), mapped_weights=bool(mapped_weights))
    from .solvers import SOLVERS

    return SOLVERS[solver](problem, ram, deadline, float(time_limit), **kw)

"""Charts of schedules: the time x layer decision map (as POET's figure 2) and energy
against the RAM budget for several solvers."""
from __future__ import annotations

import textwrap
from typing import Mapping, Sequence

import numpy as np

from ..remat.plan import Schedule
from .figures import integer_ticks, legend_outside, pyplot, save

#: decision codes of the map, and their colours
_CODES = {"free": 0, "in RAM": 1, "recompute": 2, "page in": 3, "on storage": 4}
_COLOURS = ("#ffffff", "#4c72b0", "#dd8452", "#55a868", "#c7e9c0")


def decision_map(sched: Schedule) -> np.ndarray:
    """(units x stages) codes: 1 in RAM, 2 recomputed there, 3 paged in there, 4 only on
    storage (paged out, not in RAM), 0 neither."""
    p = sched.problem
    m = np.zeros((len(p.units), len(p.stages)), dtype=np.int8)
    for s in range(len(p.stages)):
        for u in sched.page_out:
            m[u, s] = _CODES["on storage"]
        for u in sched.resident[s]:
            m[u, s] = _CODES["in RAM"]
        for u in sched.recompute[s]:
            m[u, s] = _CODES["recompute"]
        for u in sched.page_in[s]:
            m[u, s] = _CODES["page in"]
    return m


def plot_schedule(sched: Schedule, path, title: str = "") -> str:
    """Draw which saved tensor (row, forward order) is in RAM, recomputed, paged in or only
    on storage at each backward stage (column); PNG at `path`."""
    plt = pyplot()
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    m = decision_map(sched)
    used = [u.index for u in sched.problem.units if u.last_stage >= 0]
    m = m[used]
    fig, ax = plt.subplots(figsize=(11, 5.5))
    ax.imshow(m, aspect="auto", interpolation="nearest", cmap=ListedColormap(_COLOURS), vmin=0,
              vmax=len(_COLOURS) - 1, origin="upper")
    ax.set_xlabel("backward stage (time →)")
    ax.set_ylabel("saved tensor (forward order)")
    ax.set_title(textwrap.fill(title or sched.summary(), 130), fontsize=8)
    integer_ticks(ax.xaxis)
    integer_ticks(ax.yaxis)
    ax.set_yticks(ax.get_yticks()[(ax.get_yticks() >= 0) & (ax.get_yticks() < len(used))])
    ax.set_yticklabels([str(used[int(t)]) for t in ax.get_yticks()])
    legend_outside(ax, handles=[Patch(facecolor=c, edgecolor="0.6", label=k) for k, c in zip(_CODES, _COLOURS)
                                if k != "free"])
    return save(fig, path)


def plot_energy_vs_budget(series: Mapping[str, Sequence[tuple[float, float]]], path, title: str,
                          xlabel: str = "RAM budget for activations (fraction of plain back-propagation's peak)",
                          ylabel: str = "energy per step (× plain back-propagation)") -> str:
    """One line per solver: (budget, energy) points; infeasible budgets are simply absent."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    markers = "os^vDx*"
    for k, (name, pts) in enumerate(series.items()):
        pts = sorted(pts)
        if pts:
            ax.plot([a for a, _ in pts], [b for _, b in pts], marker=markers[k % len(markers)], label=name)
    ax.set_xlabel(xlabel, fontsize=8)
    ax.set_ylabel(ylabel, fontsize=8)
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, path)

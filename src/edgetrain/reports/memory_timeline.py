"""The memory timeline of one memory plan: the arena bytes held at each node, the arena's
size and where the peak is (`MemoryReport.plot`)."""
from __future__ import annotations

from .figures import byte_unit, integer_ticks, legend_outside, pyplot, save


def plot_timeline(report, path, format_bytes) -> str:
    """Draw `report` (a memory.MemoryReport) as the arena KB held per node in schedule order,
    with in-place reuse as the planner counts it, under the planned arena size (PNG). The
    live bytes without in-place reuse (what the reference runtime allocates) are a dotted
    line: above the arena where a result overwrites its input. `format_bytes` writes a byte
    count (config.format_bytes: MemoryReport.plot passes it; this module imports nothing of the
    compiler)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(11, 3.5))
    unit, div = byte_unit(max(report.timeline + (report.arena_bytes,)))
    held = [b / div for b in (report.held_timeline or report.timeline)]
    x = range(len(held))
    ax.fill_between(x, held, step="mid", alpha=0.6, label="arena in use (in-place reuse)")
    ax.step(x, [b / div for b in report.timeline], where="mid", color="0.35", lw=0.8, ls=":",
            label="live without in-place reuse\n(reference runtime)")
    ax.axhline(report.arena_bytes / div, color="k", lw=0.8, ls="--", label=f"arena {format_bytes(report.arena_bytes)}")
    if held:
        at = max(x, key=held.__getitem__)
        ax.axvline(at, color="r", lw=0.8, label=f"peak at node {at} ({report.ops[at]})")
    ax.set_xlabel("node (schedule order)")
    ax.set_ylabel(f"arena, {unit}")
    ax.set_ylim(bottom=0)
    integer_ticks(ax.xaxis)
    ax.set_title(f"training memory: peak {format_bytes(report.peak_bytes)} = arena + trained weights "
                 f"{format_bytes(report.trainable_bytes)}", fontsize=9)
    legend_outside(ax)
    return save(fig, path)

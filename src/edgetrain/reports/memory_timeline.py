"""The memory timeline of one memory plan: live activation bytes at each node, the arena
size and the peak (`MemoryReport.plot`)."""
from __future__ import annotations

from .figures import pyplot, save


def plot_timeline(report, path) -> str:
    """Draw `report` (a memory.MemoryReport) as live KB per node in schedule order (PNG)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(10, 3.5))
    kib = [b / 1024 for b in report.timeline]
    ax.fill_between(range(len(kib)), kib, step="mid", alpha=0.6, label="activations + gradients")
    ax.axhline(report.arena_bytes / 1024, color="k", lw=0.8, ls="--", label="arena")
    ax.axvline(report.peak_step, color="r", lw=0.8)
    ax.set_xlabel("node (schedule order)")
    ax.set_ylabel("live KB")
    ax.set_title(f"training memory: peak {report.peak_bytes / 1024:,.1f} KB "
                 f"(trainable weights {report.trainable_bytes / 1024:,.1f} KB)")
    ax.legend(loc="upper left")
    return save(fig, path)

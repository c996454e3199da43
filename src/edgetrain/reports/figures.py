"""What every figure shares: matplotlib without a display, and saving a PNG."""
from __future__ import annotations

#: resolution of every PNG the reports write
DPI = 120


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display: figures are files), imported on
    first use so that nothing else pays for matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path) -> str:
    """Lay out, write `fig` as a PNG at `path`, close it; return the path."""
    plt = pyplot()
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return str(path)


def legend_outside(ax, **kw) -> None:
    """The legend to the right of the axes, where it covers no data."""
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0, fontsize=8, **kw)


def integer_ticks(axis) -> None:
    """Ticks on whole numbers only (layer and node indices)."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True))


def byte_unit(largest: float) -> tuple[str, int]:
    """The unit an axis of byte counts up to `largest` is drawn in, as config.format_bytes
    writes figures (KB = 1024 B): KB below 1 MB, else MB. (Plain numbers: the report modules
    import nothing of the compiler.)"""
    return ("KB", 1024) if largest < 1024 ** 2 else ("MB", 1024 ** 2)

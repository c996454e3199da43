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

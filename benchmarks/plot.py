"""matplotlib, imported only when a plot is drawn (it is the optional ``plot`` extra).

The figures are small on purpose (the report is committed with its plots): a modest
size and resolution, one style for every section.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MISSING = "matplotlib is not installed (pip install 'tensorbridge[plot]')"
_DPI = 80


def pyplot() -> Any | None:
    """``matplotlib.pyplot`` on the non-interactive Agg backend, or None without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def figure(
    plt: Any, rows: int = 1, cols: int = 1, *, width: float = 7.5, height: float = 4.2
) -> Any:
    """A figure and its axes (always a 2-D array of axes)."""
    return plt.subplots(rows, cols, figsize=(width, height), squeeze=False)


def save(plt: Any, fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=_DPI, metadata={"Software": None})
    plt.close(fig)

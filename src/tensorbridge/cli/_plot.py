"""``--plot``: histograms of compare's errors and cast-report's ULPs (matplotlib, Agg).

Each figure draws the worst tensors (at most :data:`PLOTTED`) and returns what it drew
and by which criterion, for the command's output and its ``--json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import MissingExtraError
from ._output import display, num, plural

if TYPE_CHECKING:
    import numpy as np

PLOTTED = 6  # histograms in one figure
_LOST = (
    "overflow_inf",
    "saturated",
    "nan_created",
    "flushed_to_zero",
    "nan_changed",
    "zero_replaced",
    "sign_dropped",
    "imag_discarded",
)


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtraError(
            "--plot needs matplotlib; pip install 'tensorbridge[plot]' (or matplotlib)"
        ) from None
    return plt


def plot_errors(
    a: Mapping[str, Any], b: Mapping[str, Any], result: Any, path: str
) -> dict[str, Any]:
    """Draw the worst tensors' error histograms; returns what was drawn and why."""
    import numpy as np

    plt = _pyplot()
    measured = [k for k, leaf in result.leaves.items() if leaf.max_abs_err is not None]
    # ULPs of different dtypes do not compare; relative errors do
    ranked = sorted(
        measured,
        key=lambda k: (result.leaves[k].mismatches, result.leaves[k].max_rel_err or 0.0),
        reverse=True,
    )[:PLOTTED]
    names = {k: k for k in result.leaves}
    fig, axes = plt.subplots(
        max(1, len(ranked)), 1, figsize=(7, 2.2 * max(1, len(ranked))), squeeze=False
    )
    for ax, key in zip(axes[:, 0], ranked, strict=False):
        name = _leaf_name(key, a)
        x = _wide(a[name]) if name in a else np.zeros(0)
        y = _wide(b[name]) if name in b else np.zeros(0)
        err = np.abs(x - y) if x.shape == y.shape else np.zeros(0)
        err = err[np.isfinite(err)]
        ax.hist(err, bins=60, log=True)
        ax.set_title(
            f"{display(names[key])}: |a - b| (max ulp {num(result.leaves[key].max_ulp)})",
            fontsize=9,
        )
    if not ranked:
        axes[0, 0].text(0.5, 0.5, "no numeric tensors to plot", ha="center")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    left_out = len(measured) - len(ranked)
    criterion = "the most mismatches, then the largest max rel err"
    summary = f"{path}: {plural(len(ranked), 'tensor')} of {len(measured)}, the worst by "
    summary += criterion + (f" ({left_out} left out)" if left_out else "")
    return {
        "file": path,
        "tensors": [display(k) for k in ranked],
        "left_out": left_out,
        "criterion": criterion,
        "summary": summary,
    }


def _wide(x: Any) -> np.ndarray:
    """Values as float64 (complex128 for complex), flat, for plotting differences."""
    from .._tensorfile import row_of
    from ..convert import to_numpy

    wide = "complex128" if row_of(x).category == "complex" else "float64"
    result: np.ndarray = to_numpy(x, dtype=wide).reshape(-1)
    return result


def _leaf_name(path: str, mapping: Mapping[str, Any]) -> str:
    for name in mapping:
        if path in (name, f"[{name!r}]"):
            return name
    return path


def plot_ulps(reports: Mapping[str, Any], path: str, target: str) -> dict[str, Any]:
    """Draw the worst tensors' ULP histograms; returns what was drawn and why, for the output."""
    plt = _pyplot()

    def badness(name: str) -> tuple[int, float, int]:
        r = reports[name]
        return sum(getattr(r, k) for k in _LOST), r.max_rel_err or 0.0, r.subnormal

    worst = sorted(reports, key=badness, reverse=True)[:PLOTTED]  # stable: ties in file order
    left_out = len(reports) - len(worst)
    criterion = (
        "most values lost (overflowed, saturated, flushed to zero, NaN), then the largest "
        "max rel err, then the most subnormals"
    )
    summary = f"{path}: {plural(len(worst), 'tensor')} of {len(reports)}, the worst by {criterion}"
    summary += f" ({left_out} left out)" if left_out else ""
    fig, axes = plt.subplots(len(worst), 1, figsize=(7, 2.2 * len(worst)), squeeze=False)
    for ax, name in zip(axes[:, 0], worst, strict=False):
        hist = reports[name].ulp_histogram
        ax.bar(list(hist.keys()), list(hist.values()))
        # no finite result at all (every value became NaN): matplotlib 3.7 warns on a log scale
        ax.set_yscale("log" if any(hist.values()) else "linear")
        ax.set_title(f"{name} -> {target}: error in target ULPs", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return {
        "file": path,
        "tensors": worst,
        "left_out": left_out,
        "criterion": criterion,
        "summary": summary,
    }

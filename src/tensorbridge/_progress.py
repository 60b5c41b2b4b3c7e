"""Progress bars, and the one estimate that decides whether to draw one.

Every long-running call that takes ``progress=`` (reading, writing, converting,
``compare``, ``cast_report``) and every command-line subcommand asks here. ``True`` or
``False`` is obeyed; ``None`` draws a bar on a terminal when the work is expected to take
:data:`SHOW_AFTER` seconds or more. The estimate counts the work, not only the bytes:
a fixed cost per tensor plus a rate over the bytes, by kind of work (:data:`WORK_RATES`),
so a checkpoint of 12,000 small tensors shows a bar as a large file does, and a small
copy shows none that would flash past. It is rough on purpose: a bar shown for 0.5 s
costs nothing, a silent 5 s looks like a hang. Bars are tqdm's, on stderr, counting bytes.
"""

from __future__ import annotations

import sys
from typing import Any

# How fast work goes on one busy core (the development machine: 2 cores shared by several
# processes): bytes a second, and seconds of fixed cost per tensor.
WORK_RATES = {
    "io": (128 << 20, 1e-4),  # reading, writing, verifying: one pass over the bytes
    "check": (32 << 20, 3e-4),  # stats, compare, cast-report: several passes an element
}
SHOW_AFTER = 1.0


def expected_seconds(nbytes: int, tensors: int = 0, work: str = "io") -> float:
    """A rough estimate of the seconds ``work`` over ``nbytes`` in ``tensors`` tensors takes.

    >>> expected_seconds(0, 12_000) >= SHOW_AFTER
    True
    >>> expected_seconds(1 << 20, 1) < SHOW_AFTER
    True
    """
    per_second, per_tensor = WORK_RATES[work]
    return nbytes / per_second + tensors * per_tensor


def show_progress(progress: bool | None, nbytes: int, tensors: int = 0, work: str = "io") -> bool:
    """Whether to draw a bar: as asked, or (``None``) on a terminal when the work is
    expected to take :data:`SHOW_AFTER` seconds or more."""
    if progress is not None:
        return progress
    return sys.stderr.isatty() and expected_seconds(nbytes, tensors, work) >= SHOW_AFTER


class NoBar:
    def update(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


def progress_bar(
    total: int, desc: str, progress: bool | None, *, tensors: int = 0, work: str = "io"
) -> Any:
    """A byte-counting bar on stderr, or one that draws nothing (:func:`show_progress`
    decides, from ``total`` bytes in ``tensors`` tensors of ``work``)."""
    if not show_progress(progress, total, tensors, work):
        return NoBar()
    try:
        from tqdm.auto import tqdm  # type: ignore[import-untyped]
    except ImportError:  # pragma: no cover - tqdm is a dependency
        return NoBar()
    return tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        desc=desc,
        file=sys.stderr,
        leave=False,
    )

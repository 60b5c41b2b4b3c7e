"""ml_dtypes' casts as tensorbridge runs them: the cast itself, and which widenings are exact.

Where torch has no kernel for a dtype (its sub-byte integers) or no dtype at all (the
ml_dtypes types it lacks), values are cast by NumPy's ``astype``, whose loops for the
ml_dtypes types are ml_dtypes' own (registered with NumPy when ml_dtypes is imported):
round to nearest even, saturation and NaN as each type defines them, integers wrapped
and floats truncated into the sub-byte integers. :func:`astype` is that cast, in C
order, with the warnings NumPy raises for values out of the target's range silenced (the
bits are ``astype``'s either way, as torch's kernels raise no warning for the same casts).

:func:`exact_in` answers which wider dtypes hold every value of a small type exactly,
from the values themselves: the dtype table names them in its refusals.

>>> import ml_dtypes, numpy as np
>>> astype(np.array([200, -9], np.int32), np.dtype(ml_dtypes.int4)).astype(np.int8)
array([-8,  7], dtype=int8)
>>> [d.name for d in exact_in(np.dtype(ml_dtypes.float8_e8m0fnu), [np.float16, np.float32])]
['float32']
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

__all__ = ["astype", "exact_in"]


def astype(a: np.ndarray, dtype: np.dtype[Any]) -> np.ndarray:
    """``a.astype(dtype)`` in C order: ml_dtypes' cast, without NumPy's range warnings.

    ml_dtypes before 0.7 registers no cast between its sub-byte integers and its floats;
    there the values go through float32, which holds every value of a type of at most
    16 bits exactly, so the one rounding is the target's (the result of 0.7's direct
    cast, which ``tests/test_subbyte.py`` checks value by value).
    """
    with np.errstate(all="ignore"):
        try:
            made: np.ndarray = a.astype(dtype, order="C")
        except TypeError:
            if a.dtype.itemsize > 2 or a.dtype.kind == "c" or dtype.itemsize > 2:
                raise
            made = a.astype(np.float32, order="C").astype(dtype, order="C")
    return made


def every_value(dtype: np.dtype[Any]) -> np.ndarray:
    """Every bit pattern of a one-byte type; of a two-part (complex) type, every pattern of
    a part as the real part and as the imaginary part (the other part zero)."""
    if dtype.itemsize == 1:
        return np.arange(256, dtype=np.uint16).astype(np.uint8).view(dtype)
    part = np.dtype(f"u{dtype.itemsize // 2}")
    every = np.arange(1 << (8 * part.itemsize), dtype=np.uint64).astype(part)
    zero = np.zeros_like(every)
    pairs = np.concatenate([np.stack([every, zero], -1), np.stack([zero, every], -1)])
    return np.ascontiguousarray(pairs).view(dtype).reshape(-1)


def exact_in(
    dtype: np.dtype[Any], candidates: Iterable[Any], *, complex_: bool = False
) -> list[np.dtype[Any]]:
    """The candidates that hold every value of ``dtype`` exactly, in the given order.

    Every value of ``dtype`` (:func:`every_value`) is widened to each candidate by
    :func:`astype` and compared with its float64 (complex128 for a ``complex_`` type)
    widening as values: NaN with NaN, the sign of zero included.
    """
    values = every_value(dtype)
    exact = np.dtype(np.complex128 if complex_ else np.float64)
    want = astype(values, exact)
    return [
        np.dtype(c)
        for c in candidates
        if _same_values(astype(astype(values, np.dtype(c)), exact), want)
    ]


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    return all(
        np.array_equal(x, y, equal_nan=True) and np.array_equal(np.signbit(x), np.signbit(y))
        for x, y in ((a.real, b.real), (a.imag, b.imag))
    )

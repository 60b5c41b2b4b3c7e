"""Diagnostics: what a tensor is, how two differ, what a cast would do. Data, never printing.

* :func:`describe` answers "why did that copy?": dtypes on both sides, strides, storage,
  autograd and conj/neg bits, and what :func:`~tensorbridge.to_numpy` /
  :func:`~tensorbridge.to_torch` would do. The verdict is not a second copy of the
  rules: it asks the converters themselves with ``copy=False`` (which builds a view
  or raises :class:`~tensorbridge.CopyRequiredError` before copying anything) and
  reports their reason.
* :func:`compare` measures two tensors, arrays or trees of them (matched by key
  path). ULP distances are counted in the coarser dtype: each value's magnitude is
  cast to it (torch's kernel; ml_dtypes' for a type torch lacks) and its bits read as
  a position on an ordered integer line (sign-magnitude to signed order, so -0 and +0
  coincide); beyond the largest finite value the line continues with the top binade's
  spacing. This is exact for bfloat16, float8, float6 and float4, where NumPy's
  ``assert_array_max_ulp`` fails.
* :func:`cast_report` runs the cast a ``to_numpy(x, dtype=...)`` would run (torch's
  kernel, or ml_dtypes' ``astype`` where torch has no kernels for a dtype or lacks it)
  and counts what happened: overflow, saturation, flush to zero, NaN sign and payload
  changes, errors in units of the target's ULP.
* :func:`stats` summarises values in float64, so a bfloat16 sum does not stall.

A row torch has no kernels for (the sub-byte integers, the ml_dtypes types torch lacks:
int4, float6_e2m3fn, bcomplex32, ...) is read through ml_dtypes: the values ml_dtypes
reads from each byte, widened exactly a chunk at a time.
* :func:`quant_report` says what a quantization scheme does to weights, block by
  block: errors against the unquantized weights, saturated blocks, e8m0 scales at
  their limits, NaN / inf produced (``compare`` / ``cast-report --scheme``).

Everything streams in chunks of about four million values, so a large tensor never
needs several full-size float64 temporaries. Results are small frozen dataclasses;
``to_dict()`` gives plain JSON-ready values (non-finite floats become "inf",
"-inf", "nan").
"""

from ._cast import ULP_BINS as ULP_BINS  # the keys of CastReport.ulp_histogram
from ._cast import CastReport, cast_report
from ._compare import Comparison, compare, default_tolerances
from ._describe import ConversionPlan, Description, describe
from ._quant import BlockError, QuantReport, QuantWeight, quant_report
from ._quant import weight_report as weight_report  # for the command line, not in __all__
from ._stats import Stats, stats

__all__ = [
    "BlockError",
    "CastReport",
    "Comparison",
    "ConversionPlan",
    "Description",
    "QuantReport",
    "QuantWeight",
    "Stats",
    "cast_report",
    "compare",
    "default_tolerances",
    "describe",
    "quant_report",
    "stats",
]

"""The common base of the diagnostics' results: frozen dataclasses that become plain data.

Description, Comparison, Stats and CastReport (and the ConversionPlan inside a
Description) derive from :class:`Record`, whose ``to_dict()`` holds only dicts,
lists, strings, numbers, bools and ``None``: nested records become dicts, tuples
become lists, mapping keys become strings, and the non-finite floats JSON cannot
hold become "inf", "-inf" and "nan". So ``json.dumps(result.to_dict())`` always works.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any


class Record:
    """Shared ``to_dict`` of the result dataclasses."""

    def to_dict(self) -> dict[str, Any]:
        """The fields as plain JSON-ready values (non-finite floats as "inf"/"-inf"/"nan")."""
        return {k: _plain(v) for k, v in vars(self).items()}


def _plain(v: Any) -> Any:
    if isinstance(v, Record):
        return v.to_dict()
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (tuple, list)):
        return [_plain(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if v != v else ("inf" if v > 0 else "-inf")
    return v

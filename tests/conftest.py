"""Shared fixtures: the dtype table as pytest parameters, with readable ids."""

from __future__ import annotations

import pytest

import tensorbridge as tb

ROWS = tb.dtype_table()


@pytest.fixture(params=ROWS, ids=lambda r: r.name)
def row(request: pytest.FixtureRequest) -> tb.DTypeRow:
    """Every row of the dtype table, so a new dtype is tested everywhere at once."""
    return request.param  # type: ignore[no-any-return]

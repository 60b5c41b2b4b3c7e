"""Shared fixtures: the dtype table as pytest parameters, with readable ids, and bit patterns.

``patterns`` gives, for the current ``row``, an array of that row's NumPy dtype whose
bytes are the values worth testing: every bit pattern of an 8- or 16-bit type, and
for wider types an edge-value table (NaN payloads, ±0, ±inf, subnormals, max/min)
plus random bits. Tests compare bytes, never values, so NaN payloads count.
"""

from __future__ import annotations

import zlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

# the hypothesis profile: HYPOTHESIS_PROFILE=ci (.ci/run) or the everyday "dev"
import _budget  # noqa: F401
import tensorbridge as tb

# The rows torch and NumPy both have (the `row` fixture), and the ml_dtypes types torch
# lacks (the `numpy_only_row` fixture).
ROWS = tuple(r for r in tb.dtype_table() if r.in_torch)
NUMPY_ONLY_ROWS = tuple(r for r in tb.dtype_table() if not r.in_torch)

# --- issue 29 §2: what the diagnostics do not hold yet ------------------------------------------
# The bridge (to_numpy / to_torch / trees / describe / plans / DLPack) and the file formats
# handle every row (a format that has no place for one refuses it, naming .npy / .npz,
# and its tests say so); a diagnostic that does not handle a new row yet is named here
# with the rows it lacks, and exactly the tests that need it skip those rows
# (parametrized ones through PENDING_TESTS, loops over the table through `held`). Whoever
# teaches it a row removes the row here; its tests then run for it.
SUBBYTE = frozenset(r.name for r in ROWS if not r.kernels)  # int1 ... uint4
PENDING: dict[str, frozenset[str]] = {}
# (test module, test function) -> the format or diagnostic its row parameter goes through
PENDING_TESTS: dict[tuple[str, str], str] = {}


def pending_reason(what: str, row: str) -> str:
    return f"issue 29 §2: {what} does not hold {row} yet"


def held(what: str, rows: Any = None) -> tuple[tb.DTypeRow, ...]:
    """The rows (by default every row torch has) that ``what`` holds today."""
    return tuple(
        r for r in (ROWS if rows is None else rows) if r.name not in PENDING.get(what, frozenset())
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Skip exactly the parametrizations PENDING_TESTS names, with the reason why."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        row = callspec.params.get("row") if callspec is not None else None
        module = getattr(item, "module", None)
        if not isinstance(row, tb.DTypeRow) or module is None:
            continue
        what = PENDING_TESTS.get((module.__name__, getattr(item, "originalname", "")))
        if what is not None and row.name in PENDING[what]:
            item.add_marker(pytest.mark.skip(reason=pending_reason(what, row.name)))


_F32_EDGES = [
    0x00000000, 0x80000000,  # +0, -0
    0x7F800000, 0xFF800000,  # +inf, -inf
    0x7FC00000, 0xFFC00000,  # quiet NaN, negative quiet NaN
    0x7FC00001, 0x7FFFFFFF,  # quiet NaN payloads
    0x7F800001, 0xFF800001, 0x7FBFFFFF,  # signalling NaNs (+, -, largest payload)
    0x00000001, 0x80000001, 0x007FFFFF,  # smallest / largest subnormal
    0x00800000, 0x7F7FFFFF, 0xFF7FFFFF,  # smallest normal, max, min
    0x3F800000, 0xBF800000,  # ±1
]  # fmt: skip
_F64_EDGES = [
    0x0000000000000000, 0x8000000000000000,
    0x7FF0000000000000, 0xFFF0000000000000,
    0x7FF8000000000000, 0xFFF8000000000000,
    0x7FF8000000000001, 0x7FFFFFFFFFFFFFFF,
    0x7FF0000000000001, 0xFFF0000000000001, 0x7FF7FFFFFFFFFFFF,
    0x0000000000000001, 0x8000000000000001, 0x000FFFFFFFFFFFFF,
    0x0010000000000000, 0x7FEFFFFFFFFFFFFF, 0xFFEFFFFFFFFFFFFF,
    0x3FF0000000000000, 0xBFF0000000000000,
]  # fmt: skip
_F16_EDGES = [
    0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00, 0xFE00, 0x7E01, 0x7FFF,
    0x7C01, 0xFC01, 0x7DFF, 0x0001, 0x8001, 0x03FF, 0x0400, 0x7BFF, 0xFBFF, 0x3C00,
]  # fmt: skip
N_RANDOM = 4096
_BCOMPLEX32 = np.dtype(ml_dtypes.bcomplex32) if hasattr(ml_dtypes, "bcomplex32") else None


def _seed(name: str) -> int:
    return zlib.crc32(name.encode())


def all_patterns_u(itemsize: int) -> np.ndarray:
    """Every bit pattern of an 8- or 16-bit type, as unsigned integers."""
    return np.arange(1 << (8 * itemsize), dtype=np.uint32).astype(f"u{itemsize}")


def make_patterns(row: tb.DTypeRow) -> np.ndarray:
    """Bit patterns worth testing for ``row``, as a fresh 1-D array of ``row.numpy``."""
    size = row.itemsize
    rng = np.random.default_rng(_seed(row.name))
    if row.name == "bool":  # 0 and 1 are the only valid bool bytes in both libraries
        return np.array([0, 1, 1, 0], np.uint8).view(row.numpy)
    if size <= 2:
        return all_patterns_u(size).view(row.numpy)
    random = rng.integers(0, 256, N_RANDOM * size, dtype=np.uint8).view(row.numpy)
    if row.category in ("int", "uint"):
        info = np.iinfo(row.numpy)
        edges = {0, 1, info.max, info.min, info.min + 1, info.max - 1, max(info.min, -1)}
        return np.concatenate([np.array(sorted(edges), row.numpy), random])
    if row.name in ("float32", "float64"):
        table = _F32_EDGES if size == 4 else _F64_EDGES
        return np.concatenate([np.array(table, f"u{size}").view(row.numpy), random])
    # complex: every (real, imag) pair of the component's edge table, then random bits
    half = size // 2
    table = {2: _F16_EDGES, 4: _F32_EDGES, 8: _F64_EDGES}[half]
    if _BCOMPLEX32 is not None and row.numpy == _BCOMPLEX32:
        table = [e >> 16 for e in _F32_EDGES]  # bcomplex32's bfloat16 parts: float32's tops
    comp = np.array(table, f"u{half}")
    pairs = np.stack(np.meshgrid(comp, comp, indexing="ij"), axis=-1).reshape(-1, 2)
    parts = [np.ascontiguousarray(pairs).view(np.uint8).reshape(-1)]
    if half == 2:  # complex32: every float16 pattern as the real part and as the imag part
        every = all_patterns_u(2)
        fixed = np.full_like(every, 0x7E01)
        for re, im in ((every, fixed), (fixed, every)):
            parts.append(np.stack([re, im], axis=-1).view(np.uint8).reshape(-1))
    parts.append(random.view(np.uint8))
    return np.concatenate(parts).view(row.numpy)


@pytest.fixture(params=ROWS, ids=lambda r: r.name)
def row(request: pytest.FixtureRequest) -> tb.DTypeRow:
    """Every row of the dtype table, so a new dtype is tested everywhere at once."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(params=NUMPY_ONLY_ROWS, ids=lambda r: r.name)
def numpy_only_row(request: pytest.FixtureRequest) -> tb.DTypeRow:
    """Every row of an ml_dtypes type torch lacks (float8_e4m3, float6_e2m3fn, bcomplex32...)."""
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def patterns(row: tb.DTypeRow) -> np.ndarray:
    """Bit patterns for ``row`` (see the module docstring), a fresh writable array."""
    return make_patterns(row)


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The bytes of a tensor's values in C order, read through torch alone (no tensorbridge).

    One-byte dtypes are read as uint8 (torch has no copy kernel for int4 and its kin).
    """
    if t.element_size() == 1:
        t = t.view(torch.uint8)
    t = t.detach().cpu().resolve_conj().resolve_neg()
    dense = torch.empty(t.shape, dtype=t.dtype).copy_(t).reshape(-1)  # fresh C-order strides
    return bytes(dense.view(torch.uint8).numpy().tobytes())


def tensor_from_bytes(raw: bytes, row: tb.DTypeRow, shape: Any = None) -> torch.Tensor:
    """A tensor holding ``raw``, built by torch alone (no tensorbridge)."""
    u8 = torch.tensor(np.frombuffer(bytearray(raw), np.uint8))  # torch makes its own copy
    t = u8.view(row.torch)
    return t if shape is None else t.reshape(shape)


def data_address(a: np.ndarray) -> int:
    return int(a.__array_interface__["data"][0])

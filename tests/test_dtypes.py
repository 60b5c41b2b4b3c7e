"""The dtype table: one row per pairing, every lookup derived from it, clear refusals.

Rows are looked up by identity, never by ``dtype.kind``: ml_dtypes reports bfloat16
as ``'V'`` (like a raw void dtype), float8_e5m2 as ``'f'`` and complex32 as ``'c'``.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorbridge as tb
from conftest import NUMPY_ONLY_ROWS, ROWS
from tensorbridge import _versions, dtypes

# The table, in the table's order; a row needs both libraries to know the dtype,
# except the NumPy-only rows (ml_dtypes types torch lacks), which need ml_dtypes alone.
EXPECTED = [
    "bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "float32", "float64", "complex64", "complex128",
    "bfloat16", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
    "float8_e8m0fnu", "complex32",
    "int1", "int2", "int4", "uint1", "uint2", "uint4",
    "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz", "float8_e5m3fnu",
    "float6_e2m3fn", "float6_e3m2fn", "float4_e2m1fn", "bcomplex32",
]  # fmt: skip
NATIVE = EXPECTED[:14]
SUBBYTE = EXPECTED[21:27]  # torch has them, without kernels
NUMPY_ONLY = EXPECTED[27:]


def test_table_holds_every_dtype_both_libraries_know() -> None:
    available = [
        n
        for n in EXPECTED
        if (n in NATIVE or hasattr(ml_dtypes, n)) and (n in NUMPY_ONLY or hasattr(torch, n))
    ]

    assert [r.name for r in tb.dtype_table()] == available
    assert isinstance(tb.dtype_table(), tuple)
    if all(hasattr(ml_dtypes, n) for n in EXPECTED[14:]):  # ml_dtypes 0.7 has every one
        assert len(tb.dtype_table()) == 35


def test_row_attributes_say_what_torch_has() -> None:
    for r in tb.dtype_table():
        assert r.in_torch is (r.name not in NUMPY_ONLY), r
        assert r.kernels is (r.name not in SUBBYTE and r.name not in NUMPY_ONLY), r
        assert r.carried is (r.name not in NATIVE), r
    assert all(r.in_torch for r in ROWS) and not any(r.in_torch for r in NUMPY_ONLY_ROWS)
    assert len(ROWS) + len(NUMPY_ONLY_ROWS) == len(tb.dtype_table())


def test_row_is_frozen(row: tb.DTypeRow) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        row.name = "other"  # type: ignore[misc]
    assert repr(row) == f"DTypeRow({row.name})"


def test_both_sides_of_a_row_have_the_same_width(row: tb.DTypeRow) -> None:
    assert torch.empty(0, dtype=row.torch).element_size() == row.numpy.itemsize == row.itemsize
    if row.carrier is not None:
        assert torch.empty(0, dtype=row.carrier).element_size() == row.itemsize
        assert row.carrier_numpy.itemsize == row.itemsize
        assert row.carrier_numpy == np.dtype(str(row.carrier).removeprefix("torch."))
    else:
        assert row.carrier_numpy == row.numpy


def test_numpy_side_is_numpys_own_or_the_ml_dtypes_type_of_the_same_name(
    row: tb.DTypeRow,
) -> None:
    if row.name in NATIVE:
        assert row.numpy == np.dtype(row.name)
        assert row.carrier is None
    else:
        assert row.numpy == np.dtype(getattr(ml_dtypes, row.name))
        assert row.carrier is not None
    assert row.torch is getattr(torch, row.name)


def test_lookups_agree_both_ways(row: tb.DTypeRow) -> None:
    assert tb.numpy_dtype(row.torch) == row.numpy
    assert tb.torch_dtype(row.numpy) is row.torch
    assert tb.torch_dtype(row.numpy.type) is row.torch  # the scalar type works too
    assert tb.numpy_dtype(row.numpy) == row.numpy
    assert tb.torch_dtype(row.torch) is row.torch
    for spec in (row, row.name, row.name.upper(), str(row.torch), *row.aliases):
        assert tb.resolve_dtype(spec) is row, spec


def test_every_name_and_alias_means_one_row() -> None:
    seen: dict[str, str] = {}
    for r in tb.dtype_table():
        for key in (r.name, *((str(r.torch),) if r.in_torch else ()), *r.aliases):
            assert key not in seen, f"{key!r} names both {seen[key]} and {r.name}"
            seen[key] = r.name


@pytest.mark.parametrize(
    ("alias", "name"),
    [("bf16", "bfloat16"), ("f16", "float16"), ("f32", "float32"), ("f64", "float64")],
)
def test_command_line_aliases(alias: str, name: str) -> None:
    assert tb.resolve_dtype(alias).name == name
    assert tb.torch_dtype(alias) is getattr(torch, name)


def test_safetensors_codes_are_unique() -> None:
    codes = [r.safetensors for r in ROWS if r.safetensors]
    assert len(codes) == len(set(codes))
    assert tb.resolve_dtype("bf16").safetensors == "BF16"


def test_identity_not_kind() -> None:
    # ml_dtypes' kinds are inconsistent; the table must not care.
    bf16 = np.dtype(ml_dtypes.bfloat16)
    assert (bf16.kind, np.dtype(ml_dtypes.float8_e5m2).kind) == ("V", "f")
    assert tb.torch_dtype(bf16) is torch.bfloat16
    assert tb.torch_dtype(ml_dtypes.float8_e5m2) is torch.float8_e5m2

    # a raw void dtype of bfloat16's kind and width is not bfloat16
    with pytest.raises(tb.UnsupportedDtypeError, match=r"raw void dtype \|V2 has no torch dtype"):
        tb.torch_dtype(np.dtype("V2"))
    # nor is a structured dtype of the same width
    with pytest.raises(tb.UnsupportedDtypeError, match=r"structured dtype .* has no torch dtype"):
        tb.torch_dtype(np.dtype([("a", "u1"), ("b", "u1")]))


def test_complex32_kind_c_maps_by_identity() -> None:
    if not hasattr(ml_dtypes, "complex32"):
        pytest.skip(reason="this ml_dtypes has no complex32 (needs >= 0.7)")
    c32 = np.dtype(ml_dtypes.complex32)
    assert c32.kind == "c"
    assert tb.torch_dtype(c32) is torch.complex32
    assert tb.numpy_dtype(torch.complex32) == c32


# --- refusals ----------------------------------------------------------------------------------

TORCH_UNSUPPORTED = [
    ("qint8", "pass dtype=np.float32 to dequantize, or convert tensor.int_repr()"),
    ("quint8", "pass dtype=np.float32 to dequantize"),
    ("qint32", "pass dtype=np.float32 to dequantize"),
    ("quint4x2", "pass dtype=np.float32 to dequantize"),
    ("quint2x4", "pass dtype=np.float32 to dequantize"),
    ("bits8", "pass tensor.view(torch.uint8) for its raw bytes"),
    ("bits16", "pass tensor.view(torch.uint8) for its raw bytes"),
    ("bits1x8", "pass tensor.view(torch.uint8) for its raw bytes"),
    ("bits2x4", "pass tensor.view(torch.uint8) for its raw bytes"),
    ("bits4x2", "pass tensor.view(torch.uint8) for its raw bytes"),
    *[(f"uint{n}", "pass dtype=np.uint8 for its bytes as torch holds them") for n in (3, 5, 6, 7)],
    *[(f"int{n}", "pass dtype=np.int8 for its bytes as torch holds them") for n in (3, 5, 6, 7)],
    ("float4_e2m1fn_x2", "pass dtype=ml_dtypes.float4_e2m1fn to unpack"),
]


@pytest.mark.parametrize(("name", "fix"), TORCH_UNSUPPORTED, ids=[n for n, _ in TORCH_UNSUPPORTED])
def test_torch_dtypes_without_a_numpy_dtype(name: str, fix: str) -> None:
    tdt = getattr(torch, name, None)
    if tdt is None:
        pytest.skip(reason=f"this torch has no torch.{name}")

    with pytest.raises(tb.UnsupportedDtypeError) as info:
        tb.numpy_dtype(tdt)

    msg = str(info.value)
    assert isinstance(info.value, TypeError)
    assert f"torch.{name}" in msg and "has no NumPy dtype" in msg
    assert fix in msg
    with pytest.raises(tb.UnsupportedDtypeError, match="has no NumPy dtype"):
        tb.resolve_dtype(tdt)


def _needs(name: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(not hasattr(ml_dtypes, name), reason=f"this ml_dtypes has no {name}")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("datetime64[ns]", "datetime64[ns] has no torch dtype; pass a.view(np.int64)"),
        (np.timedelta64, "timedelta64 has no torch dtype; pass a.view(np.int64)"),
        (object, "object arrays have no torch dtype"),
        (str, "string dtype <U0 has no torch dtype"),
        (">f4", ">f4 is byte-swapped; pass a.astype(a.dtype.newbyteorder('='))"),
        (
            "float8_e4m3",
            "ml_dtypes float8_e4m3 has no torch dtype; pass dtype=torch.bfloat16, "
            "torch.float16 or torch.float32 (each holds every float8_e4m3 value exactly)",
        ),
        pytest.param(
            getattr(ml_dtypes, "float8_e5m3fnu", None),  # the type object itself
            "ml_dtypes float8_e5m3fnu has no torch dtype; pass dtype=torch.bfloat16 or "
            "torch.float32 (each holds every float8_e5m3fnu value exactly)",
            marks=_needs("float8_e5m3fnu"),
        ),
        pytest.param(
            np.dtype(ml_dtypes.bcomplex32) if hasattr(ml_dtypes, "bcomplex32") else None,
            "ml_dtypes bcomplex32 has no torch dtype; pass dtype=torch.complex64 (each "
            "holds every bcomplex32 value exactly)",
            marks=_needs("bcomplex32"),
        ),
    ],
    ids=str,
)
def test_numpy_dtypes_without_a_torch_dtype(spec: object, message: str) -> None:
    with pytest.raises(tb.UnsupportedDtypeError) as info:
        tb.torch_dtype(spec)

    assert isinstance(info.value, TypeError)
    assert message in str(info.value)


@pytest.mark.parametrize("spec", ["bfloat17", "nope", 3.5, None, object()], ids=repr)
def test_what_is_not_a_dtype(spec: object) -> None:
    with pytest.raises(tb.UnsupportedDtypeError) as info:
        tb.resolve_dtype(spec)

    msg = str(info.value)
    assert msg.startswith(f"{spec!r} is not a dtype; pass a torch dtype, a NumPy dtype or a name")
    assert "known names: " in msg and "bfloat16, bool," in msg


@pytest.mark.parametrize(
    ("cls", "builtin"),
    [
        (tb.UnsupportedDtypeError, TypeError),
        (tb.UnsupportedTensorError, TypeError),
        (tb.NoDataError, TypeError),
        (tb.CopyRequiredError, ValueError),
        (tb.ShapeMismatchError, ValueError),
    ],
    ids=lambda c: c.__name__,
)
def test_errors_inherit_the_builtin_a_caller_expects(cls: type, builtin: type) -> None:
    assert issubclass(cls, tb.TensorBridgeError)
    assert issubclass(cls, builtin)
    assert issubclass(tb.NoDataError, tb.UnsupportedTensorError)


def test_lookup_dicts_are_derived_from_the_table() -> None:
    assert list(dtypes.BY_TORCH.values()) == list(ROWS)
    assert list(dtypes.BY_NUMPY.values()) == list(tb.dtype_table())
    assert set(dtypes.BY_SAFETENSORS.values()) == {r for r in ROWS if r.safetensors}


# What a command that reads a header or copies bytes asks of the table, in an interpreter
# that has not imported ml_dtypes (about 0.8 s) or torch: all of it answered from the rows.
WITHOUT_ML_DTYPES = r"""
import json, sys
import numpy as np
from tensorbridge import dtypes

def loaded():
    return sorted(m for m in ("ml_dtypes", "torch") if m in sys.modules)

bf16 = dtypes.resolve_dtype("bf16")
seen = {
    "names": [r.name for r in dtypes.dtype_table()],
    "bf16": [bf16.name, bf16.itemsize, bf16.category, bf16.carried, bf16.carrier_numpy.name],
    "codes": [dtypes.BY_SAFETENSORS["F8_E4M3"].name, dtypes.BY_NAME["torch.bfloat16"].name],
    "native": [dtypes.resolve_dtype(np.float16).name, dtypes.native_row(np.dtype(">i4")).name],
    "void": dtypes.row_of_numpy(np.dtype("V2")),
    "packed": [(p.name, p.numpy_name) for p in dtypes.PACKED],
    "before": loaded(),
}
seen["numpy"] = str(bf16.numpy)  # the first use of an ml_dtypes row's NumPy side
seen["after"] = loaded()
seen["by_numpy"] = len(dtypes.BY_NUMPY)
print(json.dumps(seen))
"""


def test_the_table_is_built_without_ml_dtypes() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_ML_DTYPES], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["before"] == []
    # the same rows as in this process, which imported ml_dtypes first
    assert seen["names"] == [r.name for r in tb.dtype_table()]
    assert seen["bf16"] == ["bfloat16", 2, "float", True, "int16"]
    assert seen["codes"] == ["float8_e4m3fn", "bfloat16"]
    assert seen["native"] == ["float16", "int32"] and seen["void"] is None
    assert seen["packed"] == [[p.name, p.numpy_name] for p in dtypes.PACKED]
    assert (seen["numpy"], seen["after"]) == ("bfloat16", ["ml_dtypes"])
    assert seen["by_numpy"] == len(tb.dtype_table())


def test_what_a_row_knows_without_ml_dtypes_matches_it() -> None:
    for r in tb.dtype_table():
        assert (r.numpy.name, r.numpy.itemsize) == (r.name, r.itemsize), r
    for p in dtypes.PACKED:
        assert p.numpy == np.dtype(getattr(ml_dtypes, p.numpy_name))


def test_the_rows_ml_dtypes_exports_are_read_from_its_source() -> None:
    source = Path(ml_dtypes.__file__).read_text(encoding="utf-8")
    assert _versions.literal_all(source) == frozenset(ml_dtypes.__all__)
    assert _versions.ml_dtypes_exports() == frozenset(ml_dtypes.__all__)
    assert _versions.literal_all("x = 1") is None  # no list: the module is asked instead
    assert _versions.literal_all("__all__ = names()") is None  # not a literal: never run


def test_a_numpy_dtype_in_hand_is_looked_up_by_identity() -> None:
    bf16 = np.dtype(ml_dtypes.bfloat16)
    assert dtypes.row_of_numpy(bf16) is tb.resolve_dtype("bfloat16")
    assert dtypes.row_of_numpy(np.dtype("V2")) is None
    f4 = np.dtype(ml_dtypes.float4_e2m1fn)
    assert dtypes.packed_of_numpy(f4) is dtypes.PACKED[0]
    assert dtypes.packed_of_numpy(np.dtype(np.uint8)) is None
    assert dtypes.unpacked_target("float4_e2m1fn") is dtypes.PACKED[0]
    assert dtypes.BY_SPEC[ml_dtypes.bfloat16] is dtypes.BY_SPEC[bf16] is tb.resolve_dtype("bf16")

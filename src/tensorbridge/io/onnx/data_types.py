"""ONNX's tensor data types: each ``TensorProto.DataType`` of onnx 1.23, and its storage.

One row per type code (``onnx/onnx.proto``, ``message TensorProto``): its ONNX name,
the NumPy or ml_dtypes type of one value (``onnx.helper.tensor_dtype_to_np_dtype``),
the bits one value takes in ``raw_data``, and the typed field that holds it otherwise
(``onnx.helper.tensor_dtype_to_field``). The storage rules follow ``onnx.proto`` and
``onnx.numpy_helper.to_array``, which is the reference for every bit:

* ``raw_data`` (and external data) holds fixed-width little-endian values; INT4 / UINT4 /
  FLOAT4E2M1 two a byte (the first value in the low nibble), INT2 / UINT2 four a byte
  (``x0 | x1 << 2 | x2 << 4 | x3 << 6``), FLOAT6E2M3 / FLOAT6E3M2 four in three bytes (an
  LSB-first bit stream, the last group zero-padded); a packed tensor takes
  ``ceil(count * bits / 8)`` bytes.
* ``int32_data`` holds one value an entry for the 8- and 16-bit types, their bits as an
  unsigned integer (float16, bfloat16, the float8 types, bool); a packed byte an entry
  for the 4- and 2-bit types; one 6-bit code an entry (bits 0-5) for FLOAT6.
  ``int64_data``, ``uint64_data`` (UINT32 and UINT64), ``float_data`` (FLOAT, and
  COMPLEX64 as real, imaginary pairs) and ``double_data`` (DOUBLE, COMPLEX128) hold the
  rest; STRING's ``string_data`` is listed but not read (no dtype holds it).

A typed entry wider than its value keeps only the low bits, as ``to_array``'s
``astype`` does. :func:`unpack` and :func:`pack` are the packed layouts (one value a
byte on the NumPy side, as ml_dtypes stores them): the one place that knows them,
until ``tensorbridge.packing`` takes them over.

>>> BY_CODE[22].name, BY_CODE[22].bits, raw_nbytes(BY_CODE[22], 3)
('INT4', 4, 2)
>>> unpack(BY_CODE[21], np.array([0x21, 0x03], np.uint8), 3).view(np.uint8).tolist()
[1, 2, 3]
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from ... import packing
from ...errors import FormatError, UnsupportedDtypeError

__all__ = [
    "BY_CODE",
    "BY_NUMPY_NAME",
    "DOUBLE_DATA",
    "FIELD_NAMES",
    "FLOAT_DATA",
    "INT32_DATA",
    "INT64_DATA",
    "STRING",
    "STRING_DATA",
    "TYPED_FIELDS",
    "UINT64_DATA",
    "DataType",
    "decode",
    "entries",
    "pack",
    "raw_nbytes",
    "unpack",
    "varints",
]

# TensorProto's typed fields (onnx.proto) and the wire encoding of their entries
FLOAT_DATA, INT32_DATA, STRING_DATA, INT64_DATA, DOUBLE_DATA, UINT64_DATA = 4, 5, 6, 7, 10, 11
TYPED_FIELDS = {
    FLOAT_DATA: "fixed32",
    INT32_DATA: "varint",
    STRING_DATA: "bytes",
    INT64_DATA: "varint",
    DOUBLE_DATA: "fixed64",
    UINT64_DATA: "varint",
}
FIELD_NAMES = {
    FLOAT_DATA: "float_data",
    INT32_DATA: "int32_data",
    STRING_DATA: "string_data",
    INT64_DATA: "int64_data",
    DOUBLE_DATA: "double_data",
    UINT64_DATA: "uint64_data",
}
STRING = 8


@dataclass(frozen=True)
class DataType:
    """One ``TensorProto.DataType``: its code and name, one value's NumPy type and bits,
    and the typed field holding its values when ``raw_data`` does not."""

    code: int
    name: str  # ONNX's: "FLOAT", "INT4"
    numpy_name: str  # the NumPy / ml_dtypes type of one value: "float32", "int4"
    bits: int  # one value's bits in raw_data
    field: int  # the typed field (FLOAT_DATA, INT32_DATA, ...)

    @property
    def numpy(self) -> np.dtype[Any]:
        """One value's NumPy dtype (ml_dtypes' for the types NumPy lacks).

        Raises:
            UnsupportedDtypeError: STRING, or a type the installed ml_dtypes lacks.
        """
        if self.code == STRING:
            raise UnsupportedDtypeError(
                "ONNX STRING tensors hold text, which no dtype of the table holds; read "
                "them with onnx.numpy_helper.to_array"
            )
        found = getattr(ml_dtypes, self.numpy_name, None)
        if found is None and self.numpy_name not in _NUMPY_OWN:
            raise UnsupportedDtypeError(
                f"ONNX {self.name} needs ml_dtypes' {self.numpy_name}, which the installed "
                f"ml_dtypes {ml_dtypes.__version__} lacks; upgrade ml_dtypes (pip install -U "
                "ml_dtypes)"
            )
        return np.dtype(found if found is not None else self.numpy_name)

    @property
    def packed(self) -> bool:
        """Several values a byte in raw_data (unpacked to one a byte when read)."""
        return self.bits < 8


_NUMPY_OWN = {"bool", "uint8", "int8", "uint16", "int16", "int32", "int64", "float16",
              "float32", "float64", "uint32", "uint64", "complex64", "complex128"}  # fmt: skip

# (code, ONNX name, NumPy / ml_dtypes name, bits, typed field): onnx.proto's DataType enum,
# the NumPy types of onnx.helper.tensor_dtype_to_np_dtype, the fields of tensor_dtype_to_field
_TYPES = (
    (1, "FLOAT", "float32", 32, FLOAT_DATA),
    (2, "UINT8", "uint8", 8, INT32_DATA),
    (3, "INT8", "int8", 8, INT32_DATA),
    (4, "UINT16", "uint16", 16, INT32_DATA),
    (5, "INT16", "int16", 16, INT32_DATA),
    (6, "INT32", "int32", 32, INT32_DATA),
    (7, "INT64", "int64", 64, INT64_DATA),
    (8, "STRING", "object", 0, STRING_DATA),
    (9, "BOOL", "bool", 8, INT32_DATA),
    (10, "FLOAT16", "float16", 16, INT32_DATA),
    (11, "DOUBLE", "float64", 64, DOUBLE_DATA),
    (12, "UINT32", "uint32", 32, UINT64_DATA),
    (13, "UINT64", "uint64", 64, UINT64_DATA),
    (14, "COMPLEX64", "complex64", 64, FLOAT_DATA),
    (15, "COMPLEX128", "complex128", 128, DOUBLE_DATA),
    (16, "BFLOAT16", "bfloat16", 16, INT32_DATA),
    (17, "FLOAT8E4M3FN", "float8_e4m3fn", 8, INT32_DATA),
    (18, "FLOAT8E4M3FNUZ", "float8_e4m3fnuz", 8, INT32_DATA),
    (19, "FLOAT8E5M2", "float8_e5m2", 8, INT32_DATA),
    (20, "FLOAT8E5M2FNUZ", "float8_e5m2fnuz", 8, INT32_DATA),
    (21, "UINT4", "uint4", 4, INT32_DATA),
    (22, "INT4", "int4", 4, INT32_DATA),
    (23, "FLOAT4E2M1", "float4_e2m1fn", 4, INT32_DATA),
    (24, "FLOAT8E8M0", "float8_e8m0fnu", 8, INT32_DATA),
    (25, "UINT2", "uint2", 2, INT32_DATA),
    (26, "INT2", "int2", 2, INT32_DATA),
    (27, "FLOAT6E2M3", "float6_e2m3fn", 6, INT32_DATA),
    (28, "FLOAT6E3M2", "float6_e3m2fn", 6, INT32_DATA),
)
BY_CODE: dict[int, DataType] = {t[0]: DataType(*t) for t in _TYPES}
BY_NUMPY_NAME: dict[str, DataType] = {t.numpy_name: t for t in BY_CODE.values()}


def raw_nbytes(t: DataType, count: int) -> int:
    """The bytes ``count`` values of ``t`` take in ``raw_data``: packed types rounded up."""
    return (count * t.bits + 7) // 8


def entries(t: DataType, count: int) -> int:
    """The typed-field entries ``count`` values of ``t`` take: a packed byte an entry for
    the 4- and 2-bit types, two entries a complex value, else one a value."""
    if t.bits in (4, 2):
        return raw_nbytes(t, count)
    return 2 * count if t.name.startswith("COMPLEX") else count


def unpack(t: DataType, packed: np.ndarray, count: int) -> np.ndarray:
    """``count`` values of packed type ``t`` from their bytes (``raw_data``'s layout), one a
    byte as ml_dtypes holds them: a new flat array of ``t.numpy``, bit-exact.

    ``packed`` holds exactly :func:`raw_nbytes` bytes (the caller checked). The padding
    bits of a last, partial byte (or FLOAT6 group) are ignored, as ``to_array`` does.
    """
    u = np.asarray(packed, np.uint8).reshape(-1)
    return _layout(t).unpack(u, count).view(t.numpy)


def pack(t: DataType, values: np.ndarray) -> np.ndarray:
    """One-a-byte values of packed type ``t`` (any shape) -> ``raw_data``'s bytes (uint8).

    Only each value's low ``t.bits`` bits are stored (ml_dtypes keeps a value in them).
    """
    return _layout(t).pack(np.ascontiguousarray(values).reshape(-1))


def _layout(t: DataType) -> packing.Layout:
    """ONNX's ``raw_data`` packing of a sub-byte type (onnx.proto): the whole tensor one
    LSB-first stream, zero-padded."""
    return {4: packing.ONNX_4BIT, 2: packing.ONNX_2BIT, 6: packing.ONNX_6BIT}[t.bits]


# --- typed fields ------------------------------------------------------------------------------

_BLOCK = 1 << 16  # varint bytes decoded at a time: the temporaries stay a few MB


def varints(data: np.ndarray) -> Iterator[np.ndarray]:
    """The protobuf varints packed in ``data`` (uint8), as uint64, a block at a time.

    Raises:
        FormatError: a varint longer than 10 bytes, or one cut off by the end.
    """
    at, n = 0, len(data)
    while at < n:
        chunk = data[at : at + _BLOCK]
        ends = np.flatnonzero(chunk < 0x80)
        if ends.size == 0 or (at + len(chunk) == n and ends[-1] != len(chunk) - 1):
            raise FormatError("a varint runs past the end of its field (truncated or corrupt)")
        used = int(ends[-1]) + 1
        starts = np.concatenate(([0], ends[:-1] + 1))
        lengths = ends - starts + 1
        if int(lengths.max()) > 10:
            raise FormatError("a varint is longer than 10 bytes (corrupt)")
        if used == ends.size:  # one byte each: the common case of small values
            yield chunk[:used].astype(np.uint64)
        else:
            pos = (np.arange(used) - np.repeat(starts, lengths)).astype(np.uint64)
            bits = (chunk[:used] & 0x7F).astype(np.uint64) << (pos * np.uint64(7))
            yield np.add.reduceat(bits, starts)
        at += used


# the unsigned type a varint entry is cut to (its low bits), by the value's bits
_CUT = {2: np.uint8, 4: np.uint8, 6: np.uint8, 8: np.uint8, 16: np.uint16, 32: np.uint32,
        64: np.uint64}  # fmt: skip


def decode(t: DataType, field: int, payload: np.ndarray, count: int) -> np.ndarray:
    """``count`` values of ``t`` from its typed field's entries, packed in ``payload``
    (uint8, as the wire holds them): a new flat array of ``t.numpy``, bit-exact with
    ``onnx.numpy_helper.to_array``.

    Raises:
        FormatError: the entries are not the number ``count`` values take.
    """
    want = entries(t, count)
    kind = TYPED_FIELDS[field]
    if kind in ("fixed32", "fixed64"):
        width = 4 if kind == "fixed32" else 8
        if len(payload) != want * width:
            raise FormatError(
                f"{FIELD_NAMES[field]} holds {len(payload) // width} entries where {count} "
                f"{t.name} values take {want}"
            )
        values: np.ndarray = np.frombuffer(payload, f"<f{width}").copy()
        return values.view(t.numpy)
    out = np.empty(want, _CUT[t.bits])
    got = 0
    for block in varints(payload):
        if got + len(block) > want:
            got = want + 1
            break
        out[got : got + len(block)] = block.astype(out.dtype)  # the low bits, as astype cuts
        got += len(block)
    if got != want:
        raise FormatError(
            f"{FIELD_NAMES[field]} holds {'more' if got > want else got} entries where "
            f"{count} {t.name} values take {want}"
        )
    if t.bits in (4, 2):
        return unpack(t, out, count)
    return (out & 0x3F if t.bits == 6 else out).view(t.numpy)

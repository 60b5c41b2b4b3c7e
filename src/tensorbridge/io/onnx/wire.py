"""A bounded reader of protobuf's wire format, and the walk of an ONNX ``ModelProto``.

Only the fields tensorbridge reads are decoded (``onnx/onnx.proto``): ``ModelProto``'s
``ir_version`` (1), producer (2, 3), ``graph`` (7), ``opset_import`` (8) and
``metadata_props`` (14); ``GraphProto``'s ``node`` (1), ``initializer`` (5) and
``sparse_initializer`` (15); a ``Constant`` node's ``output`` (2), ``op_type`` (4),
``domain`` (7) and ``attribute`` (5); ``TensorProto``'s fields all (see
:class:`Record`). Every other field is skipped by its length, unread.

The rules that keep a hostile file harmless: every length is checked against the bytes
of the message that holds it before anything is sliced; a varint is at most 10 bytes;
field number 0 and the group wire types (3, 4), which ONNX never uses, are refused; the
nesting is fixed (model, graph, node, attribute, tensor, entry: six levels, no
recursion into subgraphs); nothing is copied but names and short strings. A buffer is
anything indexable by byte (a ``mmap``, ``bytes``): offsets are absolute, so a tensor's
``raw_data`` is a span of the mapped file.

>>> data = bytes([0x08, 0x07, 0x12, 0x02]) + b"pt"
>>> [(f, w, v) for f, w, v, _ in fields(data, 0, len(data))]
[(1, 0, 7), (2, 2, 4)]
>>> sniff(data + bytes([0x3A, 0x00]))
True
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import FormatError
from .data_types import BY_CODE, FLOAT_DATA, INT64_DATA, STRING, TYPED_FIELDS

__all__ = [
    "CONSTANT_KINDS",
    "MAX_DIMS",
    "SPARSE",
    "TENSOR",
    "TEXT",
    "VALUE_FLOAT",
    "VALUE_FLOATS",
    "VALUE_INT",
    "VALUE_INTS",
    "Header",
    "Record",
    "attribute",
    "fields",
    "graph_entries",
    "model_header",
    "pack_span",
    "sniff",
    "sparse_parts",
    "tensor",
    "text",
    "unpack_span",
    "varint",
    "varint_bytes",
]

MAX_DIMS = 64  # NumPy's limit on dimensions (NPY_MAXDIMS); ONNX sets none
MAX_SPAN = 1 << 48  # elements across the nonzero dimensions (256 TiB at one byte each)

# what an entry's span holds: an initializer's TensorProto, a Constant node's attribute
# (value: a TensorProto; value_float(s) / value_int(s): the AttributeProto), a sparse tensor
TENSOR, VALUE_FLOAT, VALUE_FLOATS, VALUE_INT, VALUE_INTS, SPARSE, TEXT = range(7)
CONSTANT_KINDS = {
    "value": TENSOR,
    "value_float": VALUE_FLOAT,
    "value_floats": VALUE_FLOATS,
    "value_int": VALUE_INT,
    "value_ints": VALUE_INTS,
    "sparse_value": SPARSE,
    "value_string": TEXT,
    "value_strings": TEXT,
}


def varint(buf: Any, i: int, end: int) -> tuple[int, int]:
    """The varint at ``buf[i:end]`` and the index after it.

    Raises:
        FormatError: longer than 10 bytes, or cut off at ``end``.
    """
    if i < end and buf[i] < 0x80:  # one byte: most tags, lengths and small values
        return buf[i], i + 1
    value = shift = 0
    while shift < 70:
        if i >= end:
            raise FormatError("a varint runs past the end of its message (truncated or corrupt)")
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value & 0xFFFFFFFFFFFFFFFF, i
        shift += 7
    raise FormatError("a varint is longer than 10 bytes (corrupt)")


def fields(buf: Any, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """Each field of the message ``buf[start:end]``: (number, wire type, value, length).

    A varint field gives its value (length 0); a fixed or length-delimited one the
    absolute index its bytes start at, and their length (checked to lie inside).

    Raises:
        FormatError: field number 0, a group or unknown wire type, or a length past ``end``.
    """
    i = start
    while i < end:
        key, i = varint(buf, i, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise FormatError("a field numbered 0 (not protobuf: corrupt)")
        if wire == 0:
            value, i = varint(buf, i, end)
            yield number, 0, value, 0
            continue
        if wire == 2:
            size, i = varint(buf, i, end)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
        else:
            raise FormatError(f"field {number} has wire type {wire}, which ONNX never uses")
        if size > end - i:
            raise FormatError(
                f"field {number} says {size} bytes but its message has {end - i} left "
                "(truncated or corrupt)"
            )
        yield number, wire, i, size
        i += size


def text(buf: Any, start: int, size: int) -> str:
    """A protobuf ``string`` field's text (bytes that are no UTF-8 kept as surrogates)."""
    return bytes(buf[start : start + size]).decode("utf-8", "surrogateescape")


def _want(number: int, wire: int, expected: int, what: str) -> None:
    if wire != expected:
        raise FormatError(f"{what} (field {number}) has wire type {wire}, not {expected}")


def sniff(head: bytes) -> bool:
    """Whether ``head`` (a file's first bytes) starts an ONNX ``ModelProto``: ``ir_version``
    (field 1) from 1 to 100 first, then another ``ModelProto`` field (3-8), or a
    ``producer_name`` (field 2) of text; Core ML and SavedModel protobufs, whose field 2
    is a message, are not."""
    if head[:1] != b"\x08":
        return False
    try:
        version, i = varint(head, 1, len(head))
    except FormatError:
        return False
    if not 1 <= version <= 100 or i >= len(head):
        return False
    if head[i] in (0x1A, 0x22, 0x28, 0x32, 0x3A, 0x42):  # fields 3-8, each its wire type
        return True
    if head[i] != 0x12:
        return False
    try:
        size, j = varint(head, i + 1, len(head))
    except FormatError:
        return False
    body = head[j : j + min(size, 64)]
    return size > 0 and all(32 <= c < 127 for c in body)


# --- the model and its graph -------------------------------------------------------------------


@dataclass(frozen=True)
class Header:
    """What a ``ModelProto`` says of itself, and where its graph is."""

    ir_version: int
    producer: str
    opsets: dict[str, int]
    metadata: dict[str, str]
    graph: tuple[int, int]  # start, length; (0, 0) when it has none


def model_header(buf: Any, size: int) -> Header:
    """The ``ModelProto`` fields tensorbridge reports, and its graph's span."""
    ir_version, names, opsets, metadata, graph = 0, ["", ""], {}, {}, (0, 0)
    for number, wire, at, n in fields(buf, 0, size):
        if number == 1:
            _want(number, wire, 0, "ir_version")
            ir_version = at
        elif number in (2, 3):
            _want(number, wire, 2, "the producer")
            names[number - 2] = text(buf, at, n)
        elif number == 7:
            _want(number, wire, 2, "graph")
            graph = (at, n)
        elif number == 8:
            _want(number, wire, 2, "opset_import")
            domain, version = "", 0
            for f, w, v, m in fields(buf, at, at + n):
                if f == 1 and w == 2:
                    domain = text(buf, v, m)
                elif f == 2 and w == 0:
                    version = v
            opsets[domain or "ai.onnx"] = version
        elif number == 14:
            _want(number, wire, 2, "metadata_props")
            key, value = _entry(buf, at, n)
            metadata[key] = value
    return Header(ir_version, " ".join(filter(None, names)), opsets, metadata, graph)


def _entry(buf: Any, at: int, n: int) -> tuple[str, str]:
    """A ``StringStringEntryProto``'s key (1) and value (2)."""
    pair = ["", ""]
    for f, w, v, m in fields(buf, at, at + n):
        if f in (1, 2):
            _want(f, w, 2, "a key or value")
            pair[f - 1] = text(buf, v, m)
    return pair[0], pair[1]


def graph_entries(
    buf: Any, start: int, size: int, *, constants: bool, sparse: bool
) -> Iterator[tuple[int, int, int, str]]:
    """The graph's tensors: (kind, start, length, name) of each initializer (``TENSOR``:
    its name is in it, ``""`` here), each sparse initializer (``SPARSE``) when ``sparse``,
    and each ``Constant`` node's value (a kind of :data:`CONSTANT_KINDS`, named by the
    node's output) when ``constants``. Entries not asked for are counted: a final
    ``(-1, constants, sparse, "")`` says how many the graph holds."""
    counted = [0, 0]
    for number, wire, at, n in fields(buf, start, start + size):
        if number == 5:
            _want(number, wire, 2, "initializer")
            yield TENSOR, at, n, ""
        elif number == 15:
            _want(number, wire, 2, "sparse_initializer")
            counted[1] += 1
            if sparse:
                yield SPARSE, at, n, ""
        elif number == 1:
            _want(number, wire, 2, "node")
            found = _constant(buf, at, n, read=constants)
            if found is not None:
                counted[0] += 1
                if constants:
                    yield found
    yield -1, counted[0], counted[1], ""


def _constant(buf: Any, at: int, n: int, *, read: bool) -> tuple[int, int, int, str] | None:
    """A ``Constant`` node's value as an entry (None for any other node); with ``read``
    false only whether it is one (the kind is then -1)."""
    output, op, domain, attributes = None, "", "", []
    for f, w, v, m in fields(buf, at, at + n):
        if f == 2 and w == 2 and output is None:
            output = text(buf, v, m)
        elif f == 4 and w == 2:
            op = text(buf, v, m)
        elif f == 7 and w == 2:
            domain = text(buf, v, m)
        elif f == 5 and w == 2 and read:
            attributes.append((v, m))
    if op != "Constant" or domain not in ("", "ai.onnx"):
        return None
    if not read:
        return (-1, 0, 0, "")
    if output is None or len(attributes) != 1:
        raise FormatError(
            f"a Constant node has {len(attributes)} attributes and "
            f"{'no' if output is None else 'an'} output; ONNX's Constant has one of each"
        )
    v, m = attributes[0]
    name, where = "", (v, m)
    for f, w, a, k in fields(buf, v, v + m):
        if f == 1 and w == 2:
            name = text(buf, a, k)
        elif f in (5, 22) and w == 2:
            where = (a, k)  # value's TensorProto, sparse_value's SparseTensorProto
    kind = CONSTANT_KINDS.get(name)
    if kind is None:
        raise FormatError(f"Constant {output!r} has an attribute {name!r}, which ONNX's lacks")
    return kind, where[0], where[1], output


# --- tensors -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Record:
    """One ``TensorProto`` as the wire says it: shape, type, where its values are.

    ``typed`` is the field number holding typed entries (0: none) in the message
    ``message``, ``entries`` how many it holds; ``other`` the typed fields present that
    are not ``typed``'s (named in refusals).
    """

    name: str
    dims: tuple[int, ...]
    code: int
    message: tuple[int, int]
    raw: tuple[int, int] | None = None
    typed: int = 0
    entries: int = 0
    other: tuple[int, ...] = ()
    external: tuple[tuple[str, str], ...] = ()
    data_location: int = 0
    segment: bool = False
    as_field: int = 0  # the TensorProto field ``typed``'s entries decode as (0: ``typed``)


def tensor(buf: Any, start: int, size: int) -> Record:
    """The ``TensorProto`` at ``buf[start:start + size]``; typed entries counted, not read.

    Raises:
        FormatError: a malformed field, a negative dimension, more than 64 dimensions.
    """
    dims: list[int] = []
    code, name, raw, location, segment = 0, "", None, 0, False
    counts: dict[int, int] = {}
    external = []
    for number, wire, at, n in fields(buf, start, start + size):
        if number == 1:
            dims.extend(_ints(buf, wire, at, n))
            if len(dims) > MAX_DIMS:
                raise FormatError(f"more than {MAX_DIMS} dimensions")
        elif number == 2:
            _want(number, wire, 0, "data_type")
            code = at
        elif number == 3:
            segment = True
        elif number in TYPED_FIELDS:
            kind = TYPED_FIELDS[number]
            counts[number] = counts.get(number, 0) + _entries(buf, kind, number, wire, at, n)
        elif number == 8:
            _want(number, wire, 2, "name")
            name = text(buf, at, n)
        elif number == 9:
            _want(number, wire, 2, "raw_data")
            raw = (at, n)
        elif number == 13:
            _want(number, wire, 2, "external_data")
            external.append(_entry(buf, at, n))
        elif number == 14:
            _want(number, wire, 0, "data_location")
            location = at
    signed = tuple(d - (1 << 64) if d >> 63 else d for d in dims)
    if any(d < 0 for d in signed):
        raise FormatError(f"dims {list(signed)} has a negative dimension")
    _check_span(signed)
    own = BY_CODE[code].field if code in BY_CODE else 0
    other = tuple(f for f in counts if f != own)
    return Record(name, signed, code, (start, size), raw, own * (own in counts),
                  counts.get(own, 0), other, tuple(external), location, segment)  # fmt: skip


def _ints(buf: Any, wire: int, at: int, n: int) -> list[int]:
    """A repeated int64 field's values, one entry (varint) or packed (length-delimited)."""
    if wire == 0:
        return [at]
    if wire != 2:
        raise FormatError(f"an integer list has wire type {wire}")
    out, i = [], at
    while i < at + n:
        value, i = varint(buf, i, at + n)
        out.append(value)
        if len(out) > MAX_DIMS:
            raise FormatError(f"more than {MAX_DIMS} dimensions")
    return out


def _entries(buf: Any, kind: str, number: int, wire: int, at: int, n: int) -> int:
    """The entries one occurrence of a repeated field holds (packed or one), whose
    entries are ``kind`` ("varint", "fixed32", "fixed64" or "bytes")."""
    if wire != 2 or kind == "bytes":  # one entry (a string is one entry a field)
        expected = {"varint": 0, "fixed32": 5, "fixed64": 1, "bytes": 2}[kind]
        _want(number, wire, expected, f"repeated field {number}")
        return 1
    if kind in ("fixed32", "fixed64"):
        width = 4 if kind == "fixed32" else 8
        if n % width:
            raise FormatError(
                f"packed field {number} holds {n} bytes, no whole {width}-byte entries"
            )
        return n // width
    got, step = 0, 1 << 20  # a count of the bytes that end a varint
    for i in range(at, at + n, step):
        piece = np.frombuffer(buf, np.uint8, min(step, at + n - i), i)
        got += int(np.count_nonzero(piece < 0x80))
    if n and buf[at + n - 1] >= 0x80:
        raise FormatError(f"packed field {number} ends inside a varint (truncated or corrupt)")
    return got


# a Constant's value_float(s) / value_int(s): the AttributeProto field, its entries' wire
# kind, the TensorProto field they decode as, and the data type (FLOAT, INT64)
_ATTRIBUTE_VALUES = {
    VALUE_FLOAT: (2, "fixed32", FLOAT_DATA, 1),
    VALUE_FLOATS: (7, "fixed32", FLOAT_DATA, 1),
    VALUE_INT: (3, "varint", INT64_DATA, 7),
    VALUE_INTS: (8, "varint", INT64_DATA, 7),
}


def attribute(buf: Any, kind: int, start: int, size: int, name: str) -> Record:
    """A ``Constant``'s value_float(s) / value_int(s) / value_string(s) (the
    ``AttributeProto`` at ``buf[start:start + size]``) as a record named ``name``."""
    if kind == TEXT:
        return Record(name, (), STRING, (start, size))  # listed, refused when read
    number, entry, as_field, code = _ATTRIBUTE_VALUES[kind]
    count = sum(
        _entries(buf, entry, number, w, v, m)
        for f, w, v, m in fields(buf, start, start + size)
        if f == number
    )
    dims = () if kind in (VALUE_FLOAT, VALUE_INT) else (count,)
    return Record(name, dims, code, (start, size), typed=number, entries=count,
                  as_field=as_field)  # fmt: skip


def varint_bytes(value: int) -> bytes:
    """A varint's bytes (an unpacked entry, put back into a packed run)."""
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def unpack_span(packed: int) -> tuple[int, int, int]:
    """(kind, start, length) from :func:`pack_span`'s one integer."""
    return packed & 7, packed >> 34, (packed >> 3) & ((1 << 31) - 1)


def pack_span(kind: int, start: int, length: int) -> int:
    """An entry's kind and span as one integer: the reader keeps one a tensor, so a header
    of a million tiny initializers costs tens of bytes each, not hundreds."""
    return (start << 34) | (length << 3) | kind


def sparse_parts(buf: Any, start: int, size: int) -> tuple[Record, Record, tuple[int, ...]]:
    """A ``SparseTensorProto``'s ``values`` (1) and ``indices`` (2) and its dense ``dims`` (3).

    Raises:
        FormatError: a part missing or malformed.
    """
    parts: dict[int, Record] = {}
    dims: list[int] = []
    for number, wire, at, n in fields(buf, start, start + size):
        if number in (1, 2):
            _want(number, wire, 2, "values or indices")
            parts[number] = tensor(buf, at, n)
        elif number == 3:
            dims.extend(_ints(buf, wire, at, n))
    if 1 not in parts or 2 not in parts:
        raise FormatError("a sparse tensor without its values or its indices")
    if any(d >> 63 for d in dims):
        raise FormatError(f"a sparse tensor's dims {dims} has a negative dimension")
    _check_span(dims)
    return parts[1], parts[2], tuple(dims)


def _check_span(dims: tuple[int, ...] | list[int]) -> None:
    """Refuse dimensions whose nonzero product no array can span: NumPy refuses such a
    shape even when another dimension is zero (``[0, 2**62]``). Without a zero, the
    sizes checked against the stored bytes refuse such dims, naming both."""
    if 0 not in dims:
        return
    span = 1
    for d in dims:
        span *= d or 1
        if span > MAX_SPAN:
            raise FormatError(
                f"dims {list(dims)} span more than 2**48 elements, which no array can hold "
                "(a zero dimension does not excuse it); the file is corrupt"
            )

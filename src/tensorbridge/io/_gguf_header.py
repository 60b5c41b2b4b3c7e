"""Reading a GGUF header without trusting it, and writing one: the values, the entries.

A GGUF file (llama.cpp's ``gguf.cpp`` and the ``gguf`` package are the reference) is,
all little-endian:

* ``b"GGUF"``, a u32 version (2 or 3), a u64 tensor count, a u64 key-value count;
* the key-value pairs: a key (u64 length + UTF-8 bytes), a u32 value type, the value
  (a fixed-size number, a string, or an array: u32 item type, u64 count, the items);
* per tensor: its name (a string), a u32 ``n_dims`` (at most 4), ``n_dims`` u64
  dimensions **innermost first** (ggml's ``ne[0]`` is the row length: a PyTorch
  ``[out, in]`` weight is stored as ``[in, out]``), a u32 ggml type and a u64 offset
  relative to the data section;
* padding to ``general.alignment`` (a u32 key, 32 when absent), then the data section,
  each tensor at an offset that is a multiple of the alignment.

:func:`parse` checks every field before anything is allocated from it: counts against
the bytes left (every entry takes a minimum number of bytes), string and array lengths
against the file, value and ggml types against the known ones, ``n_dims``, the
product of the dimensions against ``INT64_MAX`` (ggml's limit), the row length
against the type's block size, the alignment (a power of two) and each tensor's offset
(aligned, inside the file, not overlapping another). Every fault raises
:class:`~tensorbridge.errors.FormatError` naming the file, the entry and what is
wrong. Shapes come out in PyTorch order (reversed).
"""

from __future__ import annotations

import itertools
import json
import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import FormatError
from ..quant.ggml import BY_CODE, GgmlType

MAGIC = b"GGUF"
VERSION = 3  # what the writer writes; the reader takes 2 and 3 (the same layout)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS
ALIGNMENT_KEY = "general.alignment"
ARCHITECTURE_KEY = "general.architecture"
# llama.cpp's gguf-split: shard NAME-00002-of-00003.gguf holds split.no = 1 (UINT16),
# split.count = 3 (UINT16) and split.tensors.count (INT32, over the whole set)
SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS = "split.no", "split.count", "split.tensors.count"
SPLIT_KEYS = (SPLIT_NO, SPLIT_COUNT, SPLIT_TENSORS)


# --- key-value types --------------------------------------------------------------------------

# GGUF value type code -> (name, struct format or None); 8 STRING and 9 ARRAY are not fixed-size
VALUE_TYPES: dict[int, tuple[str, str | None]] = {
    0: ("UINT8", "<B"),
    1: ("INT8", "<b"),
    2: ("UINT16", "<H"),
    3: ("INT16", "<h"),
    4: ("UINT32", "<I"),
    5: ("INT32", "<i"),
    6: ("FLOAT32", "<f"),
    7: ("BOOL", "<?"),
    8: ("STRING", None),
    9: ("ARRAY", None),
    10: ("UINT64", "<Q"),
    11: ("INT64", "<q"),
    12: ("FLOAT64", "<d"),
}
STRING, ARRAY = 8, 9
VALUE_CODE = {name: code for code, (name, _) in VALUE_TYPES.items()}
NUMPY_OF: dict[int, Any] = {  # numeric value types as NumPy scalar types
    0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32,
    6: np.float32, 10: np.uint64, 11: np.int64, 12: np.float64,
}  # fmt: skip
CODE_OF_NUMPY = {np.dtype(t): c for c, t in NUMPY_OF.items()} | {np.dtype(np.bool_): 7}


class Value:
    """One key's value as stored: its GGUF type, and for arrays the items' type.

    An array's items are turned into Python values only when first asked for: a
    tokenizer's 150,000 strings cost nothing until someone reads them.
    """

    __slots__ = ("_load", "_value", "item_type", "type")

    def __init__(
        self,
        type: int,
        value: Any = None,
        item_type: int | None = None,
        load: Callable[[], Any] | None = None,
    ) -> None:
        self.type, self.item_type, self._value, self._load = type, item_type, value, load

    @property
    def value(self) -> Any:
        """int, float, bool, str, or a list of them."""
        if self._load is not None:
            self._value, self._load = self._load(), None
        return self._value

    @property
    def type_name(self) -> str:
        """``"UINT32"``, ``"ARRAY[STRING]"``: what ``GGUFFile.metadata_types`` shows."""
        name = VALUE_TYPES[self.type][0]
        if self.item_type is None:
            return name
        return f"{name}[{VALUE_TYPES[self.item_type][0]}]"

    def as_text(self) -> str:
        """The value as ``metadata`` shows it: strings as they are, lists as JSON."""
        value = self.value
        if isinstance(value, str):
            return value
        if isinstance(value, list):
            return json.dumps(value, ensure_ascii=False)
        return str(value)

    def typed(self) -> Any:
        """The value with its exact type: NumPy scalars for numbers (a GGUF save keeps them)."""
        if self.type in NUMPY_OF:
            return NUMPY_OF[self.type](self.value)
        return self.value


@dataclass(frozen=True)
class TensorEntry:
    """One tensor's header entry, checked: its type, PyTorch-order shape and bytes."""

    name: str
    type: GgmlType
    shape: tuple[int, ...]  # PyTorch order: the reverse of the file's dimensions
    begin: int  # absolute offset in the file
    nbytes: int


@dataclass(frozen=True)
class Header:
    version: int
    alignment: int
    data_start: int
    values: dict[str, Value]
    tensors: dict[str, TensorEntry]


_MIN_KV = 8 + 4 + 1  # an empty key, a type, a one-byte value
_MIN_TENSOR = 8 + 4 + 4 + 8  # an empty name, n_dims 0, a type, an offset
_INT64_MAX = 2**63 - 1


class _Cursor:
    """Bounds-checked little-endian reads from a buffer, naming the file in every error."""

    def __init__(self, buf: Any, where: str) -> None:
        self.buf, self.size, self.pos, self.where = buf, len(buf), 0, where

    def fail(self, what: str) -> FormatError:
        return FormatError(f"{self.where}: {what}; the file is truncated or corrupt")

    def need(self, n: int, what: str) -> None:
        if n < 0 or self.pos + n > self.size:
            raise self.fail(
                f"{what} needs {n} bytes at byte {self.pos} but the file has {self.size}"
            )

    def unpack(self, fmt: str, n: int, what: str) -> Any:
        self.need(n, what)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += n
        return value

    def u32(self, what: str) -> int:
        return int(self.unpack("<I", 4, what))

    def u64(self, what: str) -> int:
        return int(self.unpack("<Q", 8, what))

    def string(self, what: str) -> str:
        n = self.u64(f"{what}'s length")
        self.need(n, f"{what} ({n} bytes)")
        raw = bytes(self.buf[self.pos : self.pos + n])
        self.pos += n
        # surrogateescape: a token that is not valid UTF-8 survives, bit for bit, a save
        return raw.decode("utf-8", "surrogateescape")

    def value(self, vtype: int, what: str) -> Any:
        if vtype == STRING:
            return self.string(what)
        fmt = VALUE_TYPES[vtype][1]
        assert fmt is not None
        return self.unpack(fmt, struct.calcsize(fmt), what)

    def array(self, what: str) -> Value:
        item = self.u32(f"{what}'s item type")
        count = self.u64(f"{what}'s length")
        if item == ARRAY:
            raise self.fail(f"{what} is an array of arrays, which GGUF readers do not accept")
        if item not in VALUE_TYPES:
            raise self.fail(f"{what} has items of unknown value type {item}")
        fmt = VALUE_TYPES[item][1]
        size = 8 if fmt is None else struct.calcsize(fmt)  # a string takes 8 bytes at least
        if count > (self.size - self.pos) // size:
            raise self.fail(
                f"{what} claims {count} items of {VALUE_TYPES[item][0]} but only "
                f"{self.size - self.pos} bytes are left"
            )
        if fmt is not None:
            view = np.frombuffer(self.buf, np.dtype(fmt), count, self.pos)
            self.pos += count * size
            as_bool = item == VALUE_CODE["BOOL"]
            return Value(ARRAY, None, item, lambda: _items(view, as_bool))
        start = self.pos
        self.pos = _skip_strings(self.buf, start, count, self.size)
        if self.pos > self.size:
            raise self.fail(f"{what}'s {count} strings run past the end of the file")
        return Value(ARRAY, None, item, lambda: _strings(self.buf, start, count))


_U64 = struct.Struct("<Q").unpack_from
_SPAN = 1 << 16  # bytes a window of strings holds beyond its estimate
_MAX_WINDOW = 1 << 16  # bytes a window holds at most: its arrays stay small


def _skip_strings(buf: Any, pos: int, count: int, size: int) -> int:
    """Where ``count`` length-prefixed strings from ``pos`` end (past ``size``: truncated).

    Only the lengths are read, never the text, and mostly by NumPy: a tokenizer's
    150,000 strings cost a few milliseconds, not a Python step each (see :func:`_walk`).
    Windows of at most ``_MAX_WINDOW`` bytes are walked until ``count`` strings are
    passed, so time is linear in the bytes walked and memory fixed, whatever the
    strings hold (5M empty strings, a 40 MB array, take about a second).
    """
    done = 0
    while done < count:
        if pos + 8 > size:
            return size + 1
        span = min(size - pos, _SPAN + 16 * (count - done), _MAX_WINDOW)  # ~16 bytes a token
        got, end = _walk(np.frombuffer(buf, np.uint8, span, pos), count - done)
        done, pos = done + got, pos + end
    return pos


def _walk(w: np.ndarray, most: int) -> tuple[int, int]:
    """How many strings (at most ``most``, at least one) follow one another from the
    start of ``w``, and where the last ends (relative to ``w``; past its end when a
    string runs out of the window).

    A string shorter than 256 bytes starts with a u64 whose seven high bytes are zero:
    every such position in the window is a candidate, its successor the candidate at
    its end. The chain of successors is followed from the true start only (a candidate
    inside some string's text, such as a NUL-padded token, is never on it). Runs of
    candidates each ending where the next begins are taken at once (a tokenizer's
    tokens are one run), and so are empty strings (as many as a run of zeros holds).
    Where runs stay short (candidates inside strings' text everywhere, as 7-byte
    strings of zeros make), the rest of the window is walked string by string with a
    plain read each: linear, about 0.2 µs a string. A start that is no candidate (a
    long string) is passed with one plain read.
    """
    n = w.size
    if n < 8:  # the window holds less than one length
        return 1, n + 1
    zero = w == 0
    r2 = zero[:-1] & zero[1:]
    r4 = r2[:-2] & r2[2:]
    r7 = r4[:-3] & r4[3:]  # r7[i]: bytes i..i+6 are zero
    starts = np.flatnonzero(r7[1:])  # bytes start+1..start+7 zero
    ends = starts + 8 + w[starts]
    m = starts.size
    run_ends = np.flatnonzero(ends[:-1] != starts[1:])  # where a chain of candidates breaks
    nonzero = np.flatnonzero(w)
    runs = 0
    done = at = 0
    while done < most and at + 8 <= n:
        i = int(np.searchsorted(starts, at))
        if i == m or starts[i] != at:  # a long string: one plain step
            at += 8 + int.from_bytes(w[at : at + 8].tobytes(), "little")
            done += 1
            continue
        if ends[i] > n:  # runs out of the window
            break
        if runs < 64 and w[at] == 0:  # empty strings: as many as the zeros from here hold
            runs += 1
            b = int(np.searchsorted(nonzero, at))
            k = min(((int(nonzero[b]) if b < nonzero.size else n) - at) // 8, most - done)
            done += k
            at += 8 * k
            continue
        if runs < 64:  # a run at a time
            runs += 1
            b = int(np.searchsorted(run_ends, i))
            last = min(int(run_ends[b]) if b < run_ends.size else m - 1, i + most - done - 1)
            if ends[last] > n:  # keep the strings wholly inside the window
                last = i + int(np.searchsorted(ends[i : last + 1], n, "right")) - 1
            done += last - i + 1
            at = int(ends[last])
            continue
        # short runs (candidates inside strings' text everywhere): string by string, a
        # plain read each, which is linear and costs what the runs would and no more
        view = w.data
        while done < most and at + 8 <= n:
            end = at + 8 + _U64(view, at)[0]
            if end > n:
                break
            done, at = done + 1, end
        break
    if done == 0:  # the first string runs out of the window: read its length plainly
        at = 8 + int.from_bytes(w[:8].tobytes(), "little")
        done = 1
    return done, at


def _items(view: np.ndarray, as_bool: bool) -> list[Any]:
    items: list[Any] = view.tolist()
    return [bool(v) for v in items] if as_bool else items


def _strings(buf: Any, pos: int, count: int) -> list[str]:
    out = []
    for _ in range(count):
        n = _U64(buf, pos)[0]
        out.append(bytes(buf[pos + 8 : pos + 8 + n]).decode("utf-8", "surrogateescape"))
        pos += 8 + n
    return out


def parse(buf: Any, path: Path) -> Header:
    """Parse and check the header of the GGUF file whose bytes are ``buf``.

    One function in the order of the bytes (magic, version, counts, key/values, tensor
    infos, alignment, data offset), each field checked against the bytes present as it
    is read: long because the format is read in one pass.
    """
    cur = _Cursor(buf, repr(str(path)))
    cur.need(4, "the magic")
    if bytes(buf[:4]) != MAGIC:
        raise FormatError(f"{cur.where} does not start with the GGUF magic; it is no GGUF file")
    cur.pos = 4
    version = cur.u32("the version")
    if version & 0xFFFF == 0 and version:
        raise FormatError(
            f"{cur.where} is a big-endian GGUF file; tensorbridge reads little-endian GGUF "
            "only (convert it with llama.cpp's gguf tools on a big-endian host)"
        )
    if version not in (2, 3):
        raise FormatError(
            f"{cur.where} is GGUF version {version}; tensorbridge reads versions 2 and 3 "
            "(re-convert the model with a current llama.cpp)"
        )
    n_tensors = cur.u64("the tensor count")
    n_kv = cur.u64("the key-value count")
    left = cur.size - cur.pos
    if n_kv > left // _MIN_KV or n_tensors > (left - n_kv * _MIN_KV) // _MIN_TENSOR:
        raise cur.fail(
            f"the header claims {n_tensors} tensors and {n_kv} key-value pairs, more than "
            f"the file's {cur.size} bytes can hold"
        )
    values: dict[str, Value] = {}
    for i in range(n_kv):
        key = cur.string(f"key {i}")
        vtype = cur.u32(f"key {key!r}'s value type")
        if vtype not in VALUE_TYPES:
            raise cur.fail(f"key {key!r} has unknown value type {vtype}")
        if key in values:
            raise cur.fail(f"key {key!r} appears twice")
        if vtype == ARRAY:
            values[key] = cur.array(f"key {key!r}")
        else:
            values[key] = Value(vtype, cur.value(vtype, f"key {key!r}'s value"))
    alignment = DEFAULT_ALIGNMENT
    if ALIGNMENT_KEY in values:
        v = values[ALIGNMENT_KEY]
        if v.type != VALUE_CODE["UINT32"] or v.value <= 0 or v.value & (v.value - 1):
            raise cur.fail(
                f"{ALIGNMENT_KEY} is {v.value!r} ({v.type_name}); it must be a UINT32 power of two"
            )
        alignment = v.value
    raw: list[tuple[str, GgmlType, tuple[int, ...], int]] = []
    seen: set[str] = set()
    for i in range(n_tensors):
        name = cur.string(f"tensor {i}'s name")
        if name in seen:
            raise cur.fail(f"tensor {name!r} appears twice")
        seen.add(name)
        n_dims = cur.u32(f"tensor {name!r}'s n_dims")
        if n_dims > MAX_DIMS:
            raise cur.fail(f"tensor {name!r} has {n_dims} dimensions; GGUF allows {MAX_DIMS}")
        dims = [cur.u64(f"tensor {name!r}'s dimension {d}") for d in range(n_dims)]
        code = cur.u32(f"tensor {name!r}'s type")
        gtype = BY_CODE.get(code)
        if gtype is None:
            raise cur.fail(f"tensor {name!r} has ggml type {code}, which is unknown or removed")
        offset = cur.u64(f"tensor {name!r}'s offset")
        raw.append((name, gtype, tuple(reversed(dims)), offset))
    data_start = -(-cur.pos // alignment) * alignment
    tensors = {}
    for name, gtype, shape, offset in raw:
        count = math.prod(shape)
        if count > _INT64_MAX:
            raise cur.fail(f"tensor {name!r} has shape {list(shape)}: more than 2**63 elements")
        # an empty shape's other dimensions too: NumPy cannot make [0, 2**62] (no file holds
        # a tensor of 2**48 elements, 256 TiB at the smallest type)
        if math.prod(d for d in shape if d) > 1 << 48:
            raise cur.fail(
                f"tensor {name!r} has shape {list(shape)}: dimensions of more than 2**48 elements"
            )
        row = shape[-1] if shape else 1
        if row % gtype.block_size:
            raise cur.fail(
                f"tensor {name!r} is {gtype.name} with rows of {row} values, not a multiple "
                f"of its block of {gtype.block_size}"
            )
        nbytes = count // gtype.block_size * gtype.type_size
        if offset % alignment:
            raise cur.fail(f"tensor {name!r}'s offset {offset} is not a multiple of {alignment}")
        begin = data_start + offset
        if begin + nbytes > cur.size:
            raise cur.fail(
                f"tensor {name!r} ({gtype.name}, shape {list(shape)}) takes bytes "
                f"{begin}..{begin + nbytes}, past the end of the file's {cur.size} bytes"
            )
        tensors[name] = TensorEntry(name, gtype, shape, begin, nbytes)
    spans = sorted((e.begin, e.begin + e.nbytes, e.name) for e in tensors.values() if e.nbytes)
    for (_, end, a), (begin, _, b) in itertools.pairwise(spans):
        if begin < end:
            raise cur.fail(f"tensors {a!r} and {b!r} overlap")
    return Header(version, alignment, data_start, values, tensors)


# --- writing ----------------------------------------------------------------------------------


def encode_value(key: str, value: Any) -> bytes:
    """A value's type code and bytes; NumPy scalars and 1-d arrays keep their own type.

    Python values get the type llama.cpp reads its keys as (it refuses a key of
    another type): ``str`` STRING, ``bool`` BOOL, an ``int`` UINT32 when it is not
    negative (counts, token ids), else INT32 (64-bit types when it does not fit),
    ``float`` FLOAT32 (rounded, as the ``gguf`` package does); a list is an ARRAY of
    STRING, BOOL, INT32 (``token_type``) or FLOAT32 (``scores``). Any other type:
    pass a NumPy scalar or array (``np.int32(-1)``, ``np.float64(1e-5)``).
    """
    vtype, body = _encode(key, value, top=True)
    return struct.pack("<I", vtype) + body


def _string(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogateescape")
    return struct.pack("<Q", len(raw)) + raw


def _encode(key: str, value: Any, top: bool) -> tuple[int, bytes]:
    if isinstance(value, (bool, np.bool_)):
        return 7, struct.pack("<?", bool(value))
    if isinstance(value, str):
        return STRING, _string(value)
    if isinstance(value, np.generic) and value.dtype in CODE_OF_NUMPY:
        code = CODE_OF_NUMPY[value.dtype]
        return code, value.astype(value.dtype.newbyteorder("<")).tobytes()
    if isinstance(value, int):
        code = _int_code([value], key, (4, 10) if value >= 0 else (5, 11))
        return code, np.array(value, NUMPY_OF[code]).tobytes()
    if isinstance(value, float):
        return 6, np.array(value, np.float32).tobytes()
    if top and isinstance(value, np.ndarray) and value.ndim == 1:
        if value.dtype not in CODE_OF_NUMPY:
            raise _bad(key, value)
        code = CODE_OF_NUMPY[value.dtype]
        data = value.astype(value.dtype.newbyteorder("<")).tobytes()
        return ARRAY, struct.pack("<IQ", code, value.size) + data
    if top and isinstance(value, (list, tuple)):
        items = list(value)
        if all(isinstance(v, str) for v in items):
            body = b"".join(_string(v) for v in items)
            return ARRAY, struct.pack("<IQ", STRING, len(items)) + body
        if all(isinstance(v, (bool, np.bool_)) for v in items):
            return ARRAY, struct.pack("<IQ", 7, len(items)) + np.array(items, np.bool_).tobytes()
        if all(isinstance(v, int) and not isinstance(v, bool) for v in items):
            code = _int_code(items, key, (5, 11, 10))
        elif all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in items):
            code = 6
        else:
            raise _bad(key, value)
        data = np.array(items, NUMPY_OF[code]).tobytes()
        return ARRAY, struct.pack("<IQ", code, len(items)) + data
    raise _bad(key, value)


def _int_code(values: list[int], key: str, codes: tuple[int, ...]) -> int:
    """The first of ``codes`` (value types) whose range holds every value."""
    lo, hi = min(values, default=0), max(values, default=0)
    for code in codes:
        info = np.iinfo(NUMPY_OF[code])
        if info.min <= lo and hi <= info.max:
            return code
    raise ValueError(f"metadata {key!r}: {lo if lo < 0 else hi} does not fit 64 bits")


def _bad(key: str, value: Any) -> TypeError:
    return TypeError(
        f"metadata {key!r}: {type(value).__qualname__} is no GGUF value; pass a str, bool, "
        "int, float, a NumPy scalar, or a flat list (or 1-d array) of one of them"
    )

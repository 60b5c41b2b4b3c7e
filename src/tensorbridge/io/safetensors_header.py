"""Reading a safetensors header without trusting it: parse it, then check every field.

The header (an 8-byte little-endian length ``N``, then ``N`` bytes of JSON) is all a
reader has to go on before it maps the data, so :func:`parse` checks the whole of
it first: the length against the file and ``MAX_HEADER``; strict JSON (no duplicate
keys, no NaN or Infinity, no nesting deeper than Python's recursion limit);
string-to-string ``__metadata__``; for each tensor a known dtype code and a shape of
at most ``MAX_RANK`` non-negative integers whose size is the byte count its
``data_offsets`` give; and offsets that tile the data section
exactly, with no gap and no overlap. A shard index (``*.safetensors.index.json``)
gets the same strictness from :func:`read_index`. Every fault raises
:class:`~tensorbridge.errors.FormatError` naming the file, the tensor and what is
wrong. The codes known are the dtype table's plus ``F4``, which is no table row.
``F6_E2M3`` and ``F6_E3M2`` are refused with a message of their own
(:func:`no_bit_order`): safetensors defines their size, not their bit order.

Writing goes through :func:`encode`, the one place a header is laid out the way the
official writer does it (tensors ordered by ``LAYOUT_RANK`` then name, compact JSON,
spaces to an 8-byte boundary).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from .._filemap import read_small
from .._packed import PACKED_ROWS
from .._tensorfile import keeping
from .._versions import NUMPY_MAXDIMS
from ..dtypes import BY_SAFETENSORS, DTypeRow
from ..errors import FormatError

MAX_HEADER = 100_000_000  # the official reader's limit on the JSON header
MAX_RANK = NUMPY_MAXDIMS  # no array of a higher rank can be made (32 on NumPy 1.x)
MAX_BYTES = (1 << 63) - 1  # NumPy and torch index bytes with int64: no array spans more

# The official writer orders tensors by its dtype enum, largest first, then by name. A new
# code goes here at its place in that order (safetensors' src/tensor.rs, enum Dtype).
LAYOUT_ORDER = (
    "U64", "I64", "F64", "C64", "F32", "U32", "I32", "BF16", "F16", "U16", "I16",
    "F8_E5M2FNUZ", "F8_E4M3FNUZ", "F8_E8M0", "F8_E4M3", "F8_E5M2", "I8", "U8", "F4", "BOOL",
)  # fmt: skip
LAYOUT_RANK = {code: i for i, code in enumerate(LAYOUT_ORDER)}


_BY_CODE: dict[str, DTypeRow] = {
    **BY_SAFETENSORS,
    **{r.safetensors: r for r in PACKED_ROWS if r.safetensors},
}
# safetensors' 6-bit codes and the rows they would be. safetensors' own source defines only
# their size (``Dtype::bitsize()`` is 6, and ``validate`` wants a tensor's bytes to be
# n*6/8 exactly, else ``MisalignedSlice``: safetensors/src/tensor.rs at 24b0b28), not how
# four values share three bytes, and no binding unpacks them (bindings/python/py_src/
# safetensors/*.py): tensorbridge invents no bit order, so it reads and writes neither.
F6_CODES = {"F6_E2M3": "float6_e2m3fn", "F6_E3M2": "float6_e3m2fn"}
_F6_BY_ROW = {name: code for code, name in F6_CODES.items()}


def no_bit_order(code: str) -> str:
    """The refusal of a float6 code (``F6_E2M3`` / ``F6_E3M2``), reading or writing.

    >>> no_bit_order("F6_E2M3")[:49]
    'safetensors defines no bit order for F6_E2M3 (its'
    """
    return (
        f"safetensors defines no bit order for {code} (its source gives only the size, 6 bits "
        f"a value), so tensorbridge neither reads nor writes it; keep {F6_CODES[code]} in "
        ".npy, .npz or Zarr, which store one value a byte"
    )


def unheld(row: DTypeRow) -> str:
    """Why no safetensors code holds ``row``, and the fix: every safetensors writer's refusal.

    >>> from tensorbridge import resolve_dtype
    >>> unheld(resolve_dtype("int4"))
    'int4 has no safetensors dtype code; save it to .npy or .npz, which keep int4 as it is'
    """
    code = _F6_BY_ROW.get(row.name)
    if code is not None:
        return no_bit_order(code)
    if not row.kernels:  # a sub-byte integer or a type only NumPy has
        fix = keeping(row)
    elif row.category == "complex":
        fix = (
            "pass torch.view_as_real(x) (NumPy: a[..., None].view(a.real.dtype)) to store "
            "the real and imaginary parts losslessly"
        )
    else:
        fix = "pass float_dtype= or convert it to a dtype safetensors has"
    return f"{row.name} has no safetensors dtype code; {fix}"


def bit_width(row: DTypeRow) -> int:
    packed = PACKED_ROWS.get(row)
    return packed.bits if packed is not None else 8 * row.itemsize


@dataclass(frozen=True)
class Entry:
    row: DTypeRow
    shape: tuple[int, ...]
    begin: int  # absolute offset in the file
    nbytes: int


class _ReadAt(Protocol):
    """An open file that reads ``n`` bytes at ``offset`` (the reader's ``_Shard``)."""

    def read(self, n: int, offset: int) -> bytes: ...


def encode(
    entries: list[tuple[str, str, tuple[int, ...], int]],
    metadata: dict[str, str],
    size: int | None = None,
) -> bytes:
    """The 8-byte length, the compact JSON and the padding, exactly as the official writer.

    ``entries`` are ``(name, dtype code, shape, nbytes)`` in file order (the caller
    sorts them by ``(LAYOUT_RANK[code], name)``); their data offsets follow one
    another from 0. ``size`` pads the JSON with spaces to that many bytes instead of
    to the next multiple of 8 (a header whose metadata is filled in later).

    >>> encode([("w", "BF16", (2,), 4)], {"format": "pt"})[8:].rstrip()
    b'{"__metadata__":{"format":"pt"},"w":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}}'
    """
    obj: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, code, shape, nbytes in entries:
        obj[name] = {"dtype": code, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if size is None:
        text += b" " * (-len(text) % 8)
    elif len(text) > size:
        raise ValueError(f"the header needs {len(text)} bytes, over the {size} reserved")
    else:
        text += b" " * (size - len(text))
    return len(text).to_bytes(8, "little") + text


def short(x: Any, limit: int = 60) -> str:
    r = repr(x)
    return r if len(r) <= limit else r[: limit - 3] + "..."


def parse(path: Path, f: _ReadAt, size: int) -> tuple[dict[str, Entry], dict[str, str]]:
    """Read and check the header; the entries in file order, and the metadata."""
    if size < 8:
        raise FormatError(
            f"{path}: the file is {size} bytes, shorter than the 8-byte header length that "
            "starts a safetensors file; it is truncated or not safetensors"
        )
    n = int.from_bytes(f.read(8, 0), "little")
    if n > MAX_HEADER:
        raise FormatError(
            f"{path}: the header claims {n:,} bytes, over the {MAX_HEADER:,}-byte limit; the "
            "file is corrupt or not safetensors"
        )
    if n > size - 8:
        raise FormatError(
            f"{path}: the header claims {n:,} bytes but only {size - 8:,} follow the length; "
            "the file is truncated or not safetensors"
        )
    raw = f.read(n, 8)
    try:
        obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique, parse_constant=_no_nan)
    except UnicodeDecodeError as e:
        raise FormatError(f"{path}: the header is not UTF-8 (byte {e.start}); corrupt") from None
    except (ValueError, RecursionError) as e:
        raise FormatError(f"{path}: the header is not valid JSON ({short(str(e), 120)})") from None
    if not isinstance(obj, dict):
        raise FormatError(f"{path}: the header is a JSON {type(obj).__name__}, not an object")
    metadata = _check_metadata(path, obj.pop("__metadata__", None))
    data_len = size - 8 - n
    entries = sorted(
        ((name, *_check_entry(path, name, spec, data_len)) for name, spec in obj.items()),
        key=lambda e: (e[2], e[3]),
    )
    cursor, prev = 0, None
    for name, _, begin, end, _ in entries:
        if begin != cursor:
            what = (
                f"overlaps tensor {short(prev)} (which ends at {cursor})"
                if begin < cursor
                else f"leaves bytes {cursor}..{begin} unused"
            )
            raise FormatError(
                f"{path}: tensor {short(name)}: data_offsets [{begin}, {end}] {what}; "
                "tensors must tile the data section exactly"
            )
        cursor, prev = end, name
    if cursor != data_len:
        raise FormatError(
            f"{path}: {data_len - cursor} bytes after the last tensor belong to no tensor "
            f"(data section {data_len} bytes, tensors end at {cursor}); corrupt file"
        )
    start = 8 + n
    return {
        name: Entry(row, shape, start + begin, end - begin)
        for name, row, begin, end, shape in entries
    }, metadata


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(f"duplicate key {short(key)}")
            seen.add(key)
    return out


def _no_nan(word: str) -> Any:
    raise ValueError(f"{word} is not JSON")


def _check_metadata(path: Path, meta: Any) -> dict[str, str]:
    if meta is None:  # the official reader accepts null
        return {}
    if not isinstance(meta, dict):
        raise FormatError(f"{path}: __metadata__ is a JSON {type(meta).__name__}, not an object")
    for k, v in meta.items():
        if not isinstance(v, str):
            raise FormatError(
                f"{path}: __metadata__[{short(k)}] is {short(v)}; metadata values must be strings"
            )
    return meta


def _check_entry(
    path: Path, name: str, spec: Any, data_len: int
) -> tuple[DTypeRow, int, int, tuple[int, ...]]:
    where = f"{path}: tensor {short(name)}"
    if not isinstance(spec, dict):
        raise FormatError(f"{where}: the entry is {short(spec)}, not an object")
    code = spec.get("dtype")
    row = _BY_CODE.get(code) if isinstance(code, str) else None
    if code in F6_CODES:
        raise FormatError(f"{where}: {no_bit_order(code)}")
    if row is None:
        raise FormatError(
            f"{where}: unknown dtype {short(code)}; tensorbridge reads {', '.join(_BY_CODE)}"
        )
    shape = spec.get("shape")
    if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
        raise FormatError(f"{where}: shape {short(shape)} is not a list of non-negative integers")
    if len(shape) > MAX_RANK:
        raise FormatError(
            f"{where}: shape has {len(shape)} dimensions, over the {MAX_RANK} an array can "
            "have; corrupt file"
        )
    offsets = spec.get("data_offsets")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(type(o) is int for o in offsets)
        and 0 <= offsets[0] <= offsets[1]
    ):
        raise FormatError(
            f"{where}: data_offsets {short(offsets)} is not [begin, end] with 0 <= begin <= end"
        )
    begin, end = offsets
    if end > data_len:
        raise FormatError(
            f"{where}: data_offsets [{begin}, {end}] run past the {data_len}-byte data section; "
            "the file is truncated or corrupt"
        )
    bits = bit_width(row)
    count = _count(shape, cap=1 << 64)
    if count is not None and count * bits % 8:
        raise FormatError(
            f"{where}: {code} shape {short(shape)} has an odd number of 4-bit "
            "values, which do not fill whole bytes"
        )
    if count is None or count * bits // 8 != end - begin:
        need = "more bytes than the file holds" if count is None else f"{count * bits // 8} bytes"
        raise FormatError(
            f"{where}: {code} with shape {short(shape)} needs {need}, but data_offsets "
            f"[{begin}, {end}] hold {end - begin}"
        )
    if count == 0 and math.prod(d for d in shape if d) * max(bits, 8) // 8 > MAX_BYTES:
        raise FormatError(
            f"{where}: shape {short(shape)} has dimensions whose product passes the "
            f"{MAX_BYTES:,} bytes an array can span (a zero dimension does not excuse it); "
            "corrupt file"
        )
    return row, begin, end, tuple(shape)


def _count(shape: list[int], cap: int) -> int | None:
    """The number of elements, or None past ``cap`` (never builds a huge integer)."""
    if 0 in shape:
        return 0
    count = 1
    for d in shape:
        count *= d
        if count > cap:
            return None
    return count


def read_index(path: Path) -> dict[str, str]:
    raw = read_small(path, MAX_HEADER, "shard index")
    try:
        obj = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique, parse_constant=_no_nan)
    except (ValueError, RecursionError) as e:
        raise FormatError(f"{path}: the index is not valid JSON ({short(str(e), 120)})") from None
    weight_map = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(weight_map, dict):
        raise FormatError(f'{path}: the index has no "weight_map" object of names to files')
    for name, file in weight_map.items():
        if (
            not isinstance(file, str)
            or Path(file).name != file
            or file in ("", ".", "..")
            or "\x00" in file
            or len(file.encode("utf-8", "surrogatepass")) > 255  # no filesystem's name is longer
        ):
            raise FormatError(
                f"{path}: weight_map[{short(name)}] = {short(file)} is not a file name in the "
                "index's directory"
            )
        if file.endswith(".json"):  # an index naming an index (itself) would recurse
            raise FormatError(
                f"{path}: weight_map[{short(name)}] = {short(file)} names an index, not a "
                "shard; the index is corrupt"
            )
    return weight_map

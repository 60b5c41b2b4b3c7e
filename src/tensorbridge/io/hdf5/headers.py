"""Attribute messages read from an object header without HDF5: variable-length strings' lengths.

HDF5 allocates and zeroes a variable-length string's whole declared length (up to 4 GiB)
before it reads the string from the global heap and finds the length false
(``H5Tconv_vlen.c``: the conversion buffer is sized by the element's length), so 16 bytes
of a damaged attribute can cost gigabytes. Before an attribute of variable-length strings
is read, :func:`attribute_lengths` finds each element's declared length in the object
header itself, so that a length past the file is refused unread.

It parses only what it needs, after the HDF5 file format specification (version 3,
"Disk Format: Level 2A"): object headers version 1 (a 16-byte prefix, then messages of
8 bytes of header each, continuation blocks of the same) and version 2 (``OHDR``, its
flags and optional fields, messages of 4 or 6 bytes of header; continuation chunks
``OCHK``); continuation messages (type 0x10); attribute messages (type 0x0C, versions
1 to 3); their datatype's class (variable-length: 9) and dataspace's element count.
Attributes kept elsewhere (dense storage: an attribute info message, 0x15, naming a
fractal heap) or in shared messages cannot be walked here: the answer is then None.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable

__all__ = ["Layout", "attribute_lengths"]

_VLEN = 9
_CONTINUATION, _ATTRIBUTE, _ATTRIBUTE_INFO = 0x10, 0x0C, 0x15
_MAX_BLOCKS = 256  # header chunks walked, at most
_MAX_BYTES = 4 << 20  # header bytes read, at most

Read = Callable[[int, int], bytes]  # (position in the HDF5 file, length) -> bytes


class Layout:
    """The file's addressing: where addresses start, how wide offsets and lengths are."""

    def __init__(self, base: int, offsets: int, lengths: int) -> None:
        self.base, self.offsets, self.lengths = base, offsets, lengths


class _Damaged(Exception):
    """The header cannot be walked: the answer is None."""


def attribute_lengths(read: Read, layout: Layout, address: int) -> dict[str, int] | None:
    """For each attribute of the object whose header is at ``address``: the largest
    declared length of its variable-length elements (0 for other types), by name.

    None when the header cannot be walked here (dense or shared attributes, an unknown
    version, damage): the caller then reads no variable-length attribute of the object.
    """
    try:
        return _walk(read, layout, layout.base + address)
    except (_Damaged, struct.error, IndexError, ValueError, OverflowError):
        return None


def _walk(read: Read, layout: Layout, at: int) -> dict[str, int]:
    head = read(at, 16)
    if head[:4] == b"OHDR":
        blocks, v2 = [_v2_prefix(read, at)], True
    elif head[:1] == b"\x01":
        size = int.from_bytes(head[8:12], "little")
        blocks, v2 = [(at + 16, size)], False
        attribute_order = False
    else:
        raise _Damaged
    if v2:
        attribute_order = bool(head[5] & 0x04)  # messages carry a creation order
    out: dict[str, int] = {}
    seen = 0
    while blocks:
        start, size = blocks.pop(0)
        seen += size
        if seen > _MAX_BYTES or len(blocks) > _MAX_BLOCKS:
            raise _Damaged
        data = read(start, size)
        if len(data) != size:
            raise _Damaged
        for kind, flags, body in _messages(data, v2, attribute_order):
            if kind == _CONTINUATION:
                where = layout.base + int.from_bytes(body[: layout.offsets], "little")
                length = int.from_bytes(
                    body[layout.offsets : layout.offsets + layout.lengths], "little"
                )
                blocks.append((where + 4, length - 8) if v2 else (where, length))
            elif kind == _ATTRIBUTE_INFO and _dense(body, layout):
                raise _Damaged
            elif kind == _ATTRIBUTE:
                if flags & 0x02:  # a shared message: the attribute lies elsewhere
                    raise _Damaged
                name, longest = _attribute(body, layout)
                out[name] = longest
    return out


def _v2_prefix(read: Read, at: int) -> tuple[int, int]:
    """Where a version 2 header's first chunk of messages is, and its length."""
    head = read(at, 6 + 16 + 4 + 8)
    if head[4] != 2:
        raise _Damaged
    flags = head[5]
    pos = 6 + (16 if flags & 0x20 else 0) + (4 if flags & 0x10 else 0)
    width = 1 << (flags & 0x03)
    size = int.from_bytes(head[pos : pos + width], "little")
    return at + pos + width, size


def _messages(data: bytes, v2: bool, ordered: bool) -> list[tuple[int, int, bytes]]:
    out = []
    pos = 0
    header = (4 + (2 if ordered else 0)) if v2 else 8
    while pos + header <= len(data):
        if v2:
            kind, size, flags = (
                data[pos],
                int.from_bytes(data[pos + 1 : pos + 3], "little"),
                data[pos + 3],
            )
        else:
            kind, size = struct.unpack_from("<HH", data, pos)
            flags = data[pos + 4]
        body = data[pos + header : pos + header + size]
        if len(body) != size:
            raise _Damaged
        out.append((kind, flags, body))
        pos += header + size
    return out


def _dense(body: bytes, layout: Layout) -> bool:
    """Whether an attribute info message names a fractal heap (attributes stored densely)."""
    at = 2 + (2 if body[1] & 0x01 else 0)
    heap = body[at : at + layout.offsets]
    return len(heap) == layout.offsets and heap != b"\xff" * layout.offsets


def _attribute(body: bytes, layout: Layout) -> tuple[str, int]:
    """An attribute message's name and its variable-length elements' largest length."""
    version, flags = body[0], body[1]
    if version not in (1, 2, 3) or (version > 1 and flags & 0x03):
        raise _Damaged  # a shared datatype or dataspace: described elsewhere
    name_size, type_size, space_size = struct.unpack_from("<HHH", body, 2)
    pos = 8 if version < 3 else 9

    def take(n: int) -> bytes:
        nonlocal pos
        part = body[pos : pos + n]
        pos += (n + 7) // 8 * 8 if version == 1 else n
        return part

    name = take(name_size).split(b"\x00", 1)[0].decode("utf-8", "surrogateescape")
    dtype, space = take(type_size), take(space_size)
    if len(dtype) < 8 or dtype[0] & 0x0F != _VLEN:
        return name, 0
    element = 4 + layout.offsets + 4  # a sequence's length, then its global heap id
    count = _elements(space, layout)
    data = body[pos : pos + count * element]
    if len(data) != count * element:
        raise _Damaged
    longest = max(
        (int.from_bytes(data[i : i + 4], "little") for i in range(0, len(data), element)), default=0
    )
    return name, longest


def _elements(space: bytes, layout: Layout) -> int:
    """A dataspace message's element count (a scalar's is 1, a null one's 0)."""
    version, rank = space[0], space[1]
    if version == 1:
        at, kind = 8, 1 if rank else 0
    elif version == 2:
        at, kind = 4, space[3]
    else:
        raise _Damaged
    if kind == 2:
        return 0
    width = layout.lengths
    dims = [
        int.from_bytes(space[at + i * width : at + (i + 1) * width], "little") for i in range(rank)
    ]
    return math.prod(dims)

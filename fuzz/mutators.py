"""Structure-aware mutations of valid files, driven by a ``random.Random``.

Each mutator takes a valid input and a random source and returns a damaged input.
Driven by ``hypothesis`` (``st.randoms()``) in the test suite and by a seeded
``random.Random`` (or atheris' seed) by hand, they aim at the places readers go
wrong: truncation at a structural boundary, bit flips, length fields set to
0 / 2**31 / 2**64-1, offsets that overlap, run past the end or overflow, shapes
whose product overflows, ranks in the thousands, dtype names that do not exist,
duplicate JSON keys, deeply nested or huge JSON, non-UTF-8 text, zip members that
lie about their sizes, zip bombs, zip records of any archive inside a file (a
``.distcp``) with methods zipfile lacks, encryption, bad CRCs and UTF-8 flags on
names that are not, and names (JSON keys, pickled strings) with a NUL, a lone
surrogate, a path separator or ``..``.

>>> import random
>>> len(mutate(b"0123456789", random.Random(0))) >= 0
True
"""

from __future__ import annotations

import functools
import io
import json
import random
import re
import struct
import warnings
import zipfile
import zlib
from collections.abc import Callable
from typing import Any

__all__ = ["HOSTILE_NAMES", "INTERESTING", "bomb_archive", "boundaries", "mutate"]

INTERESTING = (
    0, 1, 2, 7, 8, 255, 256, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
    1 << 32, (1 << 53) + 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 1, 100_000_000, 100_000_001,
)  # fmt: skip
_BAD_DTYPES = ("F128", "", "f4", "<f4", "|V0", "<V99999999999", "O", "U8", "float99", "Q99_K", 7)


def _interesting(rng: random.Random) -> int:
    n = rng.choice(INTERESTING)
    return -n if rng.random() < 0.1 else n


def boundaries(data: bytes) -> list[int]:
    """Offsets where a structure starts or ends: where truncation hurts most."""
    out = {0, 1, 4, 6, 8, 9, 10, 16, 24, len(data) - 1, len(data)}
    if len(data) >= 8:
        n = int.from_bytes(data[:8], "little")
        if 8 + n <= len(data):  # safetensors: the header and the data section's offsets
            out.update((8 + n - 1, 8 + n, 8 + n + 1))
            try:
                header = json.loads(data[8 : 8 + n])
                for spec in header.values():
                    if isinstance(spec, dict) and "data_offsets" in spec:
                        out.update(8 + n + o for o in spec["data_offsets"] if type(o) is int)
            except (ValueError, TypeError, AttributeError, RecursionError):
                pass
    for magic in (b"PK\x03\x04", b"PK\x01\x02", b"PK\x05\x06", b"\n", b"}", b"{", b"."):
        out.update(m.start() for m in re.finditer(re.escape(magic), data[: 1 << 16]))
    return sorted(p for p in out if 0 <= p <= len(data))


# ------------------------------------------------------------------- byte level


def _truncate(data: bytes, rng: random.Random) -> bytes:
    cut = rng.choice(boundaries(data)) + rng.choice((-1, 0, 0, 1))
    return data[: max(0, cut)]


def _flip(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return b"\x00"
    b = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        i = rng.randrange(len(b))
        b[i] ^= 1 << rng.randrange(8)
    return bytes(b)


def _set_bytes(data: bytes, rng: random.Random) -> bytes:
    if not data:
        return bytes([rng.randrange(256)])
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b)


def _splice_int(data: bytes, rng: random.Random) -> bytes:
    """An interesting integer written over a field: a length, a count, an offset."""
    if len(data) < 8:
        return data + struct.pack("<Q", _interesting(rng) % (1 << 64))
    width = rng.choice((1, 2, 4, 8))
    limit = min(len(data) - width, 4096)
    i = rng.randrange(0, limit + 1)
    if rng.random() < 0.5:
        i -= i % width  # aligned fields are the common case
    value = _interesting(rng) % (1 << (8 * width))
    return data[:i] + value.to_bytes(width, "little") + data[i + width :]


def _length_prefix(data: bytes, rng: random.Random) -> bytes:
    """The leading 8-byte length (safetensors, GGUF's counts after the magic) set to extremes."""
    at = rng.choice((0, 8, 16))
    value = rng.choice(((1 << 64) - 1, 1 << 63, 100_000_001, 0, len(data), len(data) - 7))
    return data[:at] + (value % (1 << 64)).to_bytes(8, "little") + data[at + 8 :]


def _insert_delete(data: bytes, rng: random.Random) -> bytes:
    i = rng.randrange(len(data) + 1)
    if rng.random() < 0.5:
        return data[:i] + rng.randbytes(rng.randint(1, 16)) + data[i:]
    return data[:i] + data[i + rng.randint(1, 16) :]


# ------------------------------------------------------------------- JSON


def _json_span(data: bytes) -> tuple[int, int] | None:
    """Where a JSON object sits: a safetensors header, or the whole input."""
    if len(data) > 8 and data[8:9] == b"{":
        n = int.from_bytes(data[:8], "little")
        if 8 + n <= len(data):
            return 8, 8 + n
    start = data.find(b"{")
    if start < 0 or start > 2:
        return None
    return start, len(data)


def _nodes(obj: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _nodes(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _nodes(v, (*path, i))
    return out


def _bad_value(rng: random.Random, old: Any) -> Any:
    choices: list[Callable[[], Any]] = [
        lambda: _interesting(rng),
        lambda: rng.choice(_BAD_DTYPES),
        lambda: [_interesting(rng) for _ in range(rng.randint(0, 4))],
        lambda: [rng.choice((2**32, 2**62, 65536))] * rng.randint(2, 5),  # product overflows
        lambda: [1] * rng.choice((64, 1000, 5000)),  # a rank in the thousands
        lambda: [[1, 2], [3]],
        lambda: None,
        lambda: {"x": old},
        lambda: 1.5,
        lambda: 1e308,
        lambda: "x" * rng.choice((0, 1, 1000)),
        lambda: True,
        lambda: -1,
        lambda: [0, 0],
    ]
    if isinstance(old, list) and old and all(type(x) is int for x in old):
        choices += [
            lambda: [x + rng.choice((-1, 1, 8, -8)) for x in old],
            lambda: [*old, 1],
            lambda: old[:-1],
            lambda: list(reversed(old)),
        ]
    return rng.choice(choices)()


def _set_at(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return obj


def _json_tree(data: bytes, rng: random.Random) -> bytes:
    """Parse the JSON, change one node (a field, a shape, an offset, a dtype), write it back."""
    span = _json_span(data)
    if span is None:
        return _splice_int(data, rng)
    a, b = span
    if b - a > 1 << 14:  # already grown large by another mutation: walking it costs much
        return _splice_int(data, rng)
    try:
        obj = json.loads(data[a:b])
    except ValueError:
        return _set_bytes(data, rng)
    for _ in range(rng.randint(1, 3)):
        nodes = _nodes(obj)
        path = rng.choice(nodes)
        if rng.random() < 0.15 and path and isinstance(obj, dict):
            parent = obj
            for key in path[:-1]:
                parent = parent[key]
            del parent[path[-1]]
            continue
        old = obj
        for key in path:
            old = old[key]
        obj = _set_at(obj, path, _bad_value(rng, old))
    text = json.dumps(obj).encode()
    return _reframe(data, a, b, text)


def _reframe(data: bytes, a: int, b: int, text: bytes) -> bytes:
    """Put ``text`` where data[a:b] was, keeping a safetensors length prefix honest."""
    if a == 8:
        pad = (-len(text)) % 8
        text += b" " * pad
        return len(text).to_bytes(8, "little") + text + data[b:]
    return data[:a] + text


@functools.cache
def _many_entries(n: int) -> bytes:
    return b", ".join(b'"k%d": %d' % (i, i) for i in range(n))


def _json_text(data: bytes, rng: random.Random) -> bytes:
    """Textual JSON damage: duplicate keys, deep nesting, huge documents, non-UTF-8 bytes."""
    span = _json_span(data)
    if span is None:
        return _flip(data, rng)
    a, b = span
    text = data[a:b]
    kind = rng.randrange(6)
    if kind == 0:  # the first key again, with another value
        m = re.search(rb'"([^"\\]*)"\s*:', text)
        if m:
            text = text[:1] + m.group(0) + b"1, " + text[1:]
    elif kind == 1:  # nesting past any recursion limit
        depth = rng.choice((100, 1000, 100_000))
        text = text[:1] + b'"deep": ' + b"[" * depth + b"]" * depth + b", " + text[1:]
    elif kind == 2:  # a huge number of entries
        text = text[:1] + _many_entries(rng.choice((1000, 50_000))) + b", " + text[1:]
    elif kind == 3:  # bytes that are not UTF-8
        i = rng.randrange(len(text)) if text else 0
        text = text[:i] + rng.choice((b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x00")) + text[i:]
    elif kind == 4:  # numbers JSON does not have, or too many digits
        text = re.sub(
            rb"\d+",
            lambda m: rng.choice((b"NaN", b"Infinity", b"9" * 5000, b"-0", b"1e999")),
            text,
            count=1,
        )
    else:  # a key that is no string after all
        text = text.replace(b'"', b"", 2)
    return _reframe(data, a, b, text)


# ------------------------------------------------------------------- zip


def _is_zip(data: bytes) -> bool:
    return data[:4] == b"PK\x03\x04"


def _zip_members(data: bytes) -> list[tuple[zipfile.ZipInfo, bytes]] | None:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as zf:
            return [(i, zf.read(i)) for i in zf.infolist()]
    except Exception:
        return None


def _zip_rebuild(members: list[tuple[zipfile.ZipInfo, bytes]], compress: bool) -> bytes:
    buf = io.BytesIO()
    method = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(buf, "w", method) as zf:
        for info, body in members:
            zf.writestr(info.filename, body, compress_type=method)
    return buf.getvalue()


def _zip_structure(data: bytes, rng: random.Random) -> bytes:
    """Mutate a member's contents (recursively), lie about sizes, or add a bomb."""
    members = _zip_members(data)
    if members is None:
        return _splice_int(data, rng)
    kind = rng.randrange(6)
    if kind <= 1 and members:  # a member's own structure, then a consistent archive
        i = rng.randrange(len(members))
        info, body = members[i]
        members[i] = (info, mutate(body, rng, depth=1))
        return _zip_rebuild(members, compress=rng.random() < 0.3)
    if kind == 2:  # sizes that lie, in the local header or the central directory
        b = bytearray(data)
        sig = rng.choice((b"PK\x03\x04", b"PK\x01\x02"))
        hits = [m.start() for m in re.finditer(re.escape(sig), data)]
        if hits:
            at = rng.choice(hits)
            field = rng.choice((18, 22) if sig == b"PK\x03\x04" else (20, 24))
            value = _interesting(rng) % (1 << 32)
            b[at + field : at + field + 4] = value.to_bytes(4, "little")
        return bytes(b)
    if kind == 3 and members:  # a zip bomb: a small member that inflates to 100 MB
        info, body = rng.choice(members)
        bomb = _bomb()
        at = data.find(b"PK\x03\x04")
        out = _zip_rebuild([(info, body[:64])], compress=True)
        member = out.find(info.filename.encode()) + len(info.filename.encode())
        return (
            out[:member] + bomb if at >= 0 and rng.random() < 0.5 else bomb_archive(info.filename)
        )
    if kind == 4 and members:  # the same name twice
        members.append(rng.choice(members))
        return _zip_rebuild(members, compress=False)
    # the end-of-central-directory record's counts and offsets
    b = bytearray(data)
    at = data.rfind(b"PK\x05\x06")
    if at >= 0:
        field = rng.choice((8, 10, 12, 16, 20))
        width = 2 if field in (8, 10, 20) else 4
        value = _interesting(rng) % (1 << (8 * width))
        b[at + field : at + field + width] = value.to_bytes(width, "little")
    return bytes(b)


_BOMB: list[bytes] = []


def _bomb() -> bytes:
    if not _BOMB:
        c = zlib.compressobj(9, zlib.DEFLATED, -15)
        _BOMB.append(c.compress(b"\x00" * (100 << 20)) + c.flush())
    return _BOMB[0]


def bomb_archive(name: str) -> bytes:
    """A zip whose one member's header says 100 bytes but inflates to 100 MB."""
    raw = _bomb()
    npy_head = b"\x93NUMPY\x01\x00v\x00{'descr': '|u1', 'fortran_order': False, 'shape': (100,), }"
    npy_head = npy_head.ljust(6 + 2 + 2 + 0x76 - 1) + b"\n"
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    body = c.compress(npy_head) + c.flush(zlib.Z_FULL_FLUSH) + raw
    crc, usize = 0, len(npy_head) + 100
    fname = name.encode()
    local = struct.pack(
        "<4sHHHHHIIIHH", b"PK\x03\x04", 20, 0, 8, 0, 0, crc, len(body), usize, len(fname), 0
    )
    central = struct.pack(
        "<4sHHHHHHIIIHHHHHII",
        b"PK\x01\x02",
        20,
        20,
        0,
        8,
        0,
        0,
        crc,
        len(body),
        usize,
        len(fname),
        0,
        0,
        0,
        0,
        0,
        0,
    )
    cd_at = len(local) + len(fname) + len(body)
    end = struct.pack("<4sHHHHIIH", b"PK\x05\x06", 0, 0, 1, 1, len(central) + len(fname), cd_at, 0)
    return local + fname + body + central + fname + end


def _zip_records(data: bytes, rng: random.Random) -> bytes:
    """Damage zip records wherever they are (a ``.distcp`` holds many zips back to back):
    a compression method zipfile lacks, the encryption or UTF-8 flag, a CRC, a header
    offset, or a central directory whose size ends inside a record (zip64's too)."""
    b = bytearray(data)
    central = [m.start() for m in re.finditer(rb"PK\x01\x02", data)]
    ends = [m.start() for m in re.finditer(rb"PK\x05\x06|PK\x06\x06", data)]
    kind = rng.randrange(6)
    if kind == 5 and ends:
        at = rng.choice(ends)
        if data[at + 2 : at + 4] == b"\x06\x06":  # zip64: the directory's size, 8 bytes
            struct.pack_into("<Q", b, at + 40, rng.choice((0, 1, 20, 45)))
        else:
            struct.pack_into("<I", b, at + 12, rng.choice((0, 1, 20, 45)))
        return bytes(b)
    if not central:
        return _flip(data, rng)
    at = rng.choice(central)
    if at + 46 > len(b):
        return _flip(data, rng)
    if kind == 0:  # methods zipfile cannot read: implode, deflate64, PKWARE, unknown
        struct.pack_into("<H", b, at + 10, rng.choice((1, 6, 9, 14, 19, 97, 98, 99, 0xFFFF)))
    elif kind == 1:  # encrypted (bit 0), strong encryption (bit 6), a patched member (bit 5)
        flags = struct.unpack_from("<H", b, at + 8)[0]
        struct.pack_into("<H", b, at + 8, flags | rng.choice((0x1, 0x20, 0x40, 0x41)))
    elif kind == 2:  # "the name is UTF-8", and a byte of it that is not
        flags = struct.unpack_from("<H", b, at + 8)[0]
        struct.pack_into("<H", b, at + 8, flags | 0x800)
        n = struct.unpack_from("<H", b, at + 28)[0]
        if n and at + 46 + n <= len(b):
            b[at + 46 + rng.randrange(n)] = rng.choice((0x80, 0xC0, 0xFF))
    elif kind == 3:  # a CRC that does not match
        struct.pack_into("<I", b, at + 16, rng.getrandbits(32))
    else:  # the local header's offset: before the archive, inside another record, far away
        struct.pack_into("<I", b, at + 42, _interesting(rng) % (1 << 32))
    return bytes(b)


# ------------------------------------------------------------------- names

# names that must never become paths, or that no format stores faithfully
HOSTILE_NAMES = (
    "", ".", "..", "...", "a\x00b", "\x00", "\ud800", "x\udcff", "../x", "../../etc/passwd",
    "/etc/passwd", "a/b", "a\\b", "..\\x", "C:x", "__metadata__", "__x", "A", "w" * 300,
)  # fmt: skip


def _json_names(data: bytes, rng: random.Random) -> bytes:
    """A JSON object key or string value (a tensor name, a shard file, an array name)
    replaced by a hostile name: a NUL, a lone surrogate, a separator, ``..``."""
    span = _json_span(data)
    if span is None:
        return _flip(data, rng)
    a, b = span
    try:
        obj = json.loads(data[a:b])
    except (ValueError, RecursionError):
        return _flip(data, rng)
    paths = [p for p in _nodes(obj) if p and isinstance(p[-1], str)]
    if not paths:
        return _flip(data, rng)
    path = rng.choice(paths)
    parent = obj
    for key in path[:-1]:
        parent = parent[key]
    name = rng.choice(HOSTILE_NAMES)
    if rng.random() < 0.5 and isinstance(parent, dict):  # the key
        parent[name] = parent.pop(path[-1])
    elif isinstance(parent, dict) and isinstance(parent[path[-1]], str):  # a string value
        parent[path[-1]] = name
    else:
        parent[path[-1]] = [name]
    return _reframe(data, a, b, json.dumps(obj).encode())


def _pickle_names(data: bytes, rng: random.Random) -> bytes:
    """A string of a pickle (a state-dict key, a ``.distcp`` file name, a storage key)
    replaced by a hostile name, encoded as pickle encodes it (surrogates passed)."""
    starts = [m.start() for m in re.finditer(rb"\x80[\x02-\x05]", data[: 1 << 16])] or [0]
    texts = [
        m
        for s in starts
        for m in re.finditer(rb"\x8c(.)|X(....)", data[s : s + (1 << 16)], re.DOTALL)
    ]
    if not texts:
        return _flip(data, rng)
    m = rng.choice(texts)
    size = m.group(1)[0] if m.group(1) is not None else struct.unpack("<I", m.group(2))[0]
    at = data.find(m.group(0))
    end = at + m.end() - m.start() + size
    if end > len(data):
        return _flip(data, rng)
    enc = rng.choice(HOSTILE_NAMES).encode("utf-8", "surrogatepass")
    repl = b"\x8c" + bytes([len(enc)]) if len(enc) < 256 else b"X" + struct.pack("<I", len(enc))
    return data[:at] + repl + enc + data[end:]


# ------------------------------------------------------------------- pickle


def _pickle_ints(data: bytes, rng: random.Random) -> bytes:
    """An integer argument of a pickle opcode (a storage size, a shape, an offset) changed."""
    import pickletools

    # legacy torch.save files are several pickles in a row: the magic, the system
    # info, the object (its storages' sizes), the storage keys
    starts = [m.start() for m in re.finditer(rb"\x80[\x02-\x05]", data[: 1 << 16])] or [0]
    start = rng.choice(starts)
    try:
        ops = [
            (op, arg, start + pos)
            for op, arg, pos in pickletools.genops(data[start:])
            if pos is not None
        ]
    except Exception:
        return _splice_int(data, rng)
    sized = {
        "BININT": 4,
        "BININT1": 1,
        "BININT2": 2,
        "LONG1": None,
        "BINUNICODE": None,
        "SHORT_BINUNICODE": None,
    }
    picks = [(op, arg, pos) for op, arg, pos in ops if op.name in sized and pos is not None]
    if not picks:
        return _flip(data, rng)
    op, arg, pos = rng.choice(picks)
    if op.name in ("BINUNICODE", "SHORT_BINUNICODE"):
        new = rng.choice(
            ("", "F128", "torch", "cuda:0", "\udcff", "a" * 300, "builtins", "eval", str(arg) * 2)
        )
        enc = new.encode("utf-8", "surrogatepass")
        if len(enc) < 256:
            repl = b"\x8c" + bytes([len(enc)]) + enc
        else:
            repl = b"X" + struct.pack("<I", len(enc)) + enc
        old_len = (2 if op.name == "SHORT_BINUNICODE" else 5) + len(
            str(arg).encode("utf-8", "surrogatepass")
        )
        return data[:pos] + repl + data[pos + old_len :]
    value = _interesting(rng)
    if op.name == "LONG1":
        n = data[pos + 1]
        body = value.to_bytes(max(1, (value.bit_length() + 8) // 8), "little", signed=True)
        return data[:pos] + b"\x8a" + bytes([len(body)]) + body + data[pos + 2 + n :]
    body = value.to_bytes(9, "little", signed=True)
    repl = b"\x8a" + bytes([len(body)]) + body  # LONG1 in place of a small int
    width = sized[op.name] or 0
    return data[:pos] + repl + data[pos + 1 + width :]


def _global(name: str) -> bytes:
    module, _, attr = name.rpartition(".")
    return b"c" + module.encode() + b"\n" + attr.encode() + b"\n"


# globals a hostile pickle aims at: the machine's table, its refusals, and placeholders
_GLOBALS = (
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_parameter", "torch._tensor._rebuild_from_type_v2",
    "collections.OrderedDict", "torch.Size", "torch.device", "builtins.set",
    "builtins.frozenset", "builtins.complex", "builtins.bytearray", "_codecs.encode",
    "copyreg._reconstructor", "torch.serialization._get_layout", "torch.float32",
    "torch.FloatStorage", "torch.UntypedStorage", "torch.Tensor", "pathlib.PosixPath",
    "builtins.eval", "builtins.getattr", "os.system", "argparse.Namespace",
    "torch.nn.modules.linear.Linear", "torch._utils._rebuild_sparse_tensor",
)  # fmt: skip


def _snippet(rng: random.Random) -> bytes:
    """A few opcodes a hostile pickle would insert: a call, a BUILD, a size, nesting, memo."""
    arg = rng.choice(
        (b"K\x01", b"\x8a\x05\x00\x00\x00\x00\x01", b"X\x04\x00\x00\x00name", b")", b"N",
         b"(K\x02K\x03t", b"}X\x04\x00\x00\x00nameX\x01\x00\x00\x00/s")
    )  # fmt: skip
    g = _global(rng.choice(_GLOBALS))
    n = rng.choice((2, 300, 5000))
    return rng.choice(
        (
            g + arg + b"\x85R",  # REDUCE of a global with one argument
            g + arg + b"\x85\x81",  # NEWOBJ
            g + b"N" + arg + b"\x86b",  # BUILD on the global itself
            g + arg + arg + b"s",  # SETITEM on it
            g + arg + b"a",  # APPEND to it
            b"(" + arg + b"i" + g[1:],  # INST
            b"b",  # BUILD on whatever is below
            b"(" * n + b"l" * n,  # nesting
            b"(" * n + b"t" * n,
            b"\x8d" + struct.pack("<Q", 1 << rng.choice((20, 40, 62))),  # lengths past the end
            b"\x96" + struct.pack("<Q", 1 << 40),
            b"r" + struct.pack("<I", rng.getrandbits(32)),  # memo far away
            b"j" + struct.pack("<I", rng.getrandbits(32)),
            b"\x82\x01",  # the extension registry
        )
    )


def _pickle_opcodes(data: bytes, rng: random.Random) -> bytes:
    """Hostile opcodes inserted at an opcode boundary, or a call's opcode swapped."""
    import pickletools

    starts = [m.start() for m in re.finditer(rb"\x80[\x02-\x05]", data[: 1 << 16])] or [0]
    start = rng.choice(starts)
    try:
        ops = [
            (op, start + pos) for op, _, pos in pickletools.genops(data[start:]) if pos is not None
        ]
    except Exception:
        ops = []
    if not ops:
        return _flip(data, rng)
    op, pos = rng.choice(ops)
    if op.name in ("REDUCE", "NEWOBJ", "BUILD") and rng.random() < 0.3:
        swap = rng.choice((b"R", b"\x81", b"b", b"\x92"))
        return data[:pos] + swap + data[pos + 1 :]
    return data[:pos] + _snippet(rng) + data[pos:]


# ------------------------------------------------------------------- entry point

_BYTE_LEVEL = (_truncate, _flip, _set_bytes, _splice_int, _length_prefix, _insert_delete)


def mutate(data: bytes, rng: random.Random, depth: int = 0) -> bytes:
    """One structure-aware mutation of ``data`` chosen by ``rng``."""
    choices: list[Callable[[bytes, random.Random], bytes]] = list(_BYTE_LEVEL)
    if _json_span(data) is not None:
        choices += [_json_tree] * 4 + [_json_text] * 2
    if _is_zip(data) and depth == 0:
        choices += [_zip_structure] * 5
    if data.find(b"PK\x01\x02") >= 0:  # a zip, or zips inside (a .distcp, a .pt)
        choices += [_zip_records] * 3
    if _json_span(data) is not None:
        choices += [_json_names]
    if data.find(b"\x80\x02") >= 0 or data[:1] == b"\x80":
        choices += [_pickle_names] * 2
    if data[:1] == b"\x80" or (depth and data.find(b"\x80\x02") >= 0):
        choices += [_pickle_ints] * 4 + [_pickle_opcodes] * 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicates it is asked for
        try:
            out = rng.choice(choices)(data, rng)
        except RecursionError:  # a previous mutation nested the JSON past parsing
            out = _truncate(data, rng)
    if rng.random() < 0.2:
        out = rng.choice(_BYTE_LEVEL)(out, rng)
    return out

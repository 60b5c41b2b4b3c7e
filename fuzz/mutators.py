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
names that are not, names (JSON keys, pickled strings) with a NUL, a lone surrogate,
a path separator or ``..``, and opcode-level pickle damage (``_pickle_opcodes``: every
global of the pickle machine's table and unknown ones called, built on and filled,
placeholders where keys, sizes and storage keys were, nesting past the limits).

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


# ------------------------------------------------------------------- pickle opcodes

# globals a hostile pickle names: the pickle machine's table (read from it when it can be
# imported), tensor classes, refused modules, values that are not constructors, unknown ones
_GLOBALS = (
    "collections.OrderedDict", "torch.Size", "torch.device", "torch.serialization._get_layout",
    "builtins.set", "builtins.frozenset", "builtins.complex", "builtins.bytearray",
    "builtins.bytes", "_codecs.encode", "copyreg._reconstructor",
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3",
    "torch._utils._rebuild_parameter", "torch._utils._rebuild_parameter_with_state",
    "torch._tensor._rebuild_from_type_v2", "torch._utils._rebuild_tensor",
    "torch._utils._rebuild_sparse_tensor", "torch.Tensor", "torch.nn.parameter.Parameter",
    "torch.float32", "torch.qint8", "torch.complex32", "torch.strided", "torch.FloatStorage",
    "torch.UntypedStorage", "torch.QInt8Storage", "builtins.eval", "builtins.getattr",
    "builtins.object", "os.system", "pathlib.PosixPath", "pathlib.PurePath", "os.environ",
    "argparse.Namespace", "omegaconf.listconfig.ListConfig", "m.C", "__main__.Config",
    "torch.nn.modules.linear.Linear", "numpy.core.multiarray._reconstruct",
)  # fmt: skip
_VALUE_OPS = frozenset((
    "BININT", "BININT1", "BININT2", "LONG1", "LONG4", "BINUNICODE", "SHORT_BINUNICODE", "NONE",
    "NEWTRUE", "NEWFALSE", "BINGET", "LONG_BINGET", "EMPTY_TUPLE", "EMPTY_DICT", "EMPTY_LIST",
    "BINFLOAT", "INT", "LONG", "STRING",
))  # fmt: skip
# instructions without an argument that a stream may have instead of another
_BARE_OPS = b"bR\x81suae\x90\x85\x86\x8702(.ld\x91\x941t\x92oQ"


def _globals() -> list[str]:
    try:
        from tensorbridge.io import pickle_machine
    except ImportError:  # the machine moved: the static list alone
        return list(_GLOBALS)
    return sorted({*_GLOBALS, *pickle_machine.TABLE})


def _op_str(text: str) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) < 256:
        return b"\x8c" + bytes([len(raw)]) + raw
    return b"X" + struct.pack("<I", len(raw)) + raw


def _op_int(n: int) -> bytes:
    if 0 <= n < 256:
        return b"K" + bytes([n])
    if -(2**31) <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    body = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    if len(body) < 256:
        return b"\x8a" + bytes([len(body)]) + body
    return b"\x8b" + struct.pack("<i", len(body)) + body


def _op_global(rng: random.Random) -> bytes:
    module, _, name = rng.choice(_globals()).rpartition(".")
    if rng.random() < 0.5:
        return b"c" + module.encode() + b"\n" + name.encode() + b"\n"
    return _op_str(module) + _op_str(name) + b"\x93"  # STACK_GLOBAL


def _op_value(rng: random.Random, depth: int = 0) -> bytes:
    """Instructions that push exactly one value: plain, hostile, or built by a global."""
    kind = rng.randrange(16 if depth < 3 else 6)
    if kind == 0:  # an int of 4,300 digits or more is one Python will not print
        huge = 7 << rng.choice((14_400, 20_000))
        return _op_int(_interesting(rng) if rng.random() < 0.9 else huge)
    if kind == 1:
        return _op_str(
            rng.choice(("", "0", "storage", "cpu", "x" * 300, "\udcff", "a.b", "_metadata"))
        )
    if kind == 2:
        # EXT1: the extension registry, which no checkpoint uses
        return rng.choice((b"N", b"\x88", b"\x89", b")", b"}", b"]", b"\x8f", b"\x82\x01"))
    if kind == 3:  # a memo entry that may hold anything, or nothing
        return rng.choice(
            (
                b"h" + bytes([rng.randrange(8)]),
                b"j" + struct.pack("<I", _interesting(rng) % (1 << 32)),
            )
        )
    if kind == 4:  # a size, a stride
        return b"(" + b"".join(_op_int(_interesting(rng)) for _ in range(rng.randint(0, 4))) + b"t"
    if kind == 5:  # a length field that lies
        op = rng.choice((b"X", b"\x8d", b"\x8e", b"\x96", b"B", b"T", b"\x8b"))
        width = 8 if op in (b"\x8d", b"\x8e", b"\x96") else 4
        return op + (_interesting(rng) % (1 << (8 * width))).to_bytes(width, "little") + b"ab"
    if kind == 6:
        return _op_global(rng)
    args = b"(" + b"".join(_op_value(rng, depth + 1) for _ in range(rng.randint(0, 3)))
    if kind == 7:  # REDUCE
        return _op_global(rng) + args + b"tR"
    if kind == 8:  # NEWOBJ / NEWOBJ_EX
        ex = (
            b"}" + _op_str("k") + _op_value(rng, depth + 1) + b"s\x92"
            if rng.random() < 0.5
            else b"\x81"
        )
        return _op_global(rng) + args + b"t" + ex
    if kind == 9:  # INST
        module, _, name = rng.choice(_globals()).rpartition(".")
        return args + b"i" + module.encode() + b"\n" + name.encode() + b"\n"
    if kind == 10:  # OBJ
        return b"(" + _op_global(rng) + args[1:] + b"o"
    if kind == 11:  # BUILD on a global or on what a global built
        target = _op_global(rng) + (b")R" if rng.random() < 0.5 else b"")
        return (
            target
            + rng.choice((b"}", b"N}\x86"))
            + _op_str("name")
            + _op_value(rng, depth + 1)
            + b"sb"
        )
    if kind == 12:  # SETITEM(S) / APPEND(S) / ADDITEMS on a global or a value
        target = rng.choice((_op_global(rng), _op_value(rng, depth + 1)))
        item = _op_value(rng, depth + 1)
        return target + rng.choice(
            (
                item + item + b"s",
                b"(" + item + item + b"u",
                item + b"a",
                b"(" + item + b"e",
                b"(" + item + b"\x90",
            )
        )
    if kind == 13:  # nesting around a boundary or far past it
        n = rng.choice((10, 199, 200, 201, 1000, 20_000))
        return rng.choice(
            (b"]" * n + b"a" * (n - 1), b"N" + b"\x85" * n, b"(" * n + b"N" + b"t" * n)
        )
    if kind == 14:  # a storage's persistent id, then a tensor rebuilt on it
        key = rng.choice(("0", "1", "../data.pkl", ""))
        stype = rng.choice(("FloatStorage", "UntypedStorage", "DoubleStorage", "QInt8Storage"))
        pid = b"(" + _op_str("storage") + b"ctorch\n" + stype.encode() + b"\n" + _op_str(key)
        pid += _op_str("cpu") + _op_int(rng.choice((4, 16, 0, _interesting(rng)))) + b"tQ"
        fn = rng.choice((b"_rebuild_tensor_v2", b"_rebuild_tensor_v3"))
        size = (
            _op_value(rng, 3)
            if rng.random() < 0.3
            else b"(" + _op_int(rng.choice((4, 2, 0, 1 << 62))) + b"t"
        )
        tail = b"\x89N" + (b"ctorch\nfloat32\n" if fn.endswith(b"v3") else b"")
        return (
            b"ctorch._utils\n"
            + fn
            + b"\n("
            + pid
            + _op_int(rng.choice((0, 1, 3)))
            + size
            + size
            + tail
            + b"tR"
        )
    # a shared container referenced many times (a DAG)
    return b"]q\x07" + b"0](h\x07h\x07eq\x07" * rng.choice((2, 20, 40))


def _pickle_spans(data: bytes) -> list[tuple[int, int]]:
    """Where each pickle of a stream lies: one for data.pkl, five in a legacy file."""
    import pickletools

    spans: list[tuple[int, int]] = []
    start = 0
    while start < len(data) and len(spans) < 6:
        end = None
        try:
            for op, _, pos in pickletools.genops(data[start:]):
                if op.name == "STOP" and pos is not None:
                    end = start + pos + 1
        except Exception:
            break
        if end is None:
            break
        spans.append((start, end))
        start = end
    return spans


def _mutate_pickle(pkl: bytes, rng: random.Random) -> bytes:
    import pickletools

    try:
        ops = [(op, pos) for op, _, pos in pickletools.genops(pkl) if pos is not None]
    except Exception:
        return _flip(pkl, rng)
    if len(ops) < 2:
        return pkl
    ends = [pos for _, pos in ops[1:]] + [len(pkl)]
    mode = rng.randrange(4)
    if mode == 0:  # a value that goes on and off the stack (balanced)
        at = ops[rng.randrange(1, len(ops))][1]
        return pkl[:at] + _op_value(rng) + b"0" + pkl[at:]
    if mode == 1:  # a value in place of one the stream had (a key, a size, a storage key)
        slots = [k for k, (op, _) in enumerate(ops) if op.name in _VALUE_OPS]
        if slots:
            k = rng.choice(slots)
            return pkl[: ops[k][1]] + _op_value(rng) + pkl[ends[k] :]
    if mode == 2:  # one instruction turned into another
        k = rng.randrange(1, len(ops))
        if ends[k] - ops[k][1] == 1:
            new = bytes([rng.choice(_BARE_OPS)])
            return pkl[: ops[k][1]] + new + pkl[ends[k] :]
    # the object wrapped: handed to a global, built on, or nested
    body = pkl[ops[1][1] : ops[-1][1]] if ops[0][0].name == "PROTO" else pkl[: ops[-1][1]]
    head = pkl[: ops[1][1]] if ops[0][0].name == "PROTO" else b""
    wrap = rng.randrange(3)
    if wrap == 0:
        return head + _op_global(rng) + b"(" + body + b"tR."
    if wrap == 1:
        return head + body + rng.choice((b"}", b"N}\x86")) + _op_str("x") + _op_value(rng) + b"sb."
    return head + b"(" + body + _op_value(rng) + b"l."  # a list of it and another value


def _pickle_opcodes(data: bytes, rng: random.Random) -> bytes:
    """Opcode-level damage to a torch.save file's pickle (zip era: data.pkl; legacy: any of
    its five pickles, mostly the object): hostile globals called (REDUCE, NEWOBJ(_EX), INST,
    OBJ), built on (BUILD) or filled (SETITEM(S), APPEND(S), ADDITEMS), placeholders and
    lying lengths where keys, sizes and storage keys were, nesting past the limits, shared
    containers, memo indices that hold anything."""
    if _is_zip(data):
        members = _zip_members(data)
        if members is None:
            return _splice_int(data, rng)
        pkls = [k for k, (info, _) in enumerate(members) if info.filename.endswith("data.pkl")]
        if not pkls:
            return _splice_int(data, rng)
        k = rng.choice(pkls)
        members[k] = (members[k][0], _mutate_pickle(members[k][1], rng))
        return _zip_rebuild(members, compress=False)
    spans = _pickle_spans(data)
    if not spans:
        return _mutate_pickle(data, rng)
    start, end = spans[3] if len(spans) >= 4 and rng.random() < 0.7 else rng.choice(spans)
    return data[:start] + _mutate_pickle(data[start:end], rng) + data[end:]


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
        choices += [_pickle_ints] * 4 + [_pickle_opcodes] * 6
    elif _is_zip(data) and depth == 0 and b"data.pkl" in data:
        choices += [_pickle_opcodes] * 8
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns about the duplicates it is asked for
        try:
            out = rng.choice(choices)(data, rng)
        except RecursionError:  # a previous mutation nested the JSON past parsing
            out = _truncate(data, rng)
    if rng.random() < 0.2:
        out = rng.choice(_BYTE_LEVEL)(out, rng)
    return out

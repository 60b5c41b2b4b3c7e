"""What a file holds, told from its first bytes rather than its name, and where a directory's
checkpoint is.

Files are renamed, mislabelled and published under conventional names (``.bin`` for a
torch archive, ``.pt`` for anything), so every reader is chosen by content:

=================  ===================================================================
kind               how it is recognised
=================  ===================================================================
``safetensors``    an 8-byte little-endian length, then ``{`` (the JSON header)
``npy``            the ``\\x93NUMPY`` magic
``npz``            a zip archive whose members are all ``.npy``
``pt``             a zip archive with a ``data.pkl`` (``torch.save`` since torch 1.6)
``pt-legacy``      a pickle that starts with torch's legacy magic number (before 1.6)
``torchscript``    a zip archive with ``constants.pkl`` or ``code/`` (``torch.jit.save``)
``gguf``           the ``GGUF`` magic
``hdf5``           the HDF5 signature ``\\x89HDF\\r\\n\\x1a\\n`` at 0 or after a user block
                   (512, 1024, ...), or a zip archive holding ``model.weights.h5`` (a
                   Keras ``.keras`` archive: its weights are read)
``pickle``         any other pickle
``index``          JSON: a shard index (``*.safetensors.index.json``, ``*.bin.index.json``)
``zarr``           a directory whose ``zarr.json`` is a Zarr v3 group or array
``npy-dir``        a directory of ``NAME.npy`` files and no checkpoint file another
                   format looks for (what ``convert --format npy`` writes)
(a row's kind)     its ``sniff`` hook claims the first ``SNIFF_BYTES`` bytes: a format
                   without a fixed magic (ONNX's protobuf ``ModelProto``)
``dcp``            a pickle of ``torch.distributed.checkpoint``'s ``Metadata`` (a DCP
                   directory's ``.metadata``; the directory and its ``*.distcp`` files
                   resolve to it), recognised from the class name, never unpickled here
=================  ===================================================================

Model files of other toolkits are recognised too, so that a refusal says what the file
is (:data:`FOREIGN`); none of them is read:

=================  ===================================================================
``tflite``         a FlatBuffer whose file identifier (bytes 4-8) is ``TFL3``
``coreml``         a protobuf starting with field 1 and a nested message (``.mlmodel``)
``mlpackage``      a directory with ``Manifest.json`` and ``Data/com.apple.CoreML``
``savedmodel``     a directory with ``saved_model.pb``, or that protobuf itself
=================  ===================================================================

A fixed magic (``npy``'s, GGUF's, HDF5's), the further offsets it may sit at, a sniff
hook and the zip members that make an archive a format's are the format's own, read from
its row in ``tensorbridge.io._formats``; the structural rules above are this module's. Which
format reads a kind, what it is called in messages, and which names a directory is
searched for come from those rows too.

>>> import os, tempfile, numpy as np
>>> p = os.path.join(tempfile.mkdtemp(), "weights.npz")
>>> with open(p, "wb") as f:  # an .npy named .npz
...     np.save(f, np.arange(3))
>>> detect(p)
'npy'
"""

from __future__ import annotations

import os
import struct
import zipfile
import zlib
from pathlib import Path

from .._files import open_regular
from ..errors import FormatError, UncommittedCheckpointError
from ._formats import FORMATS, INDEX_SUFFIX, SNIFF_BYTES, Format, by_kind, by_suffix, version

__all__ = [
    "FOREIGN",
    "INDEX_SUFFIX",
    "ZIP_ERRORS",
    "describe",
    "detect",
    "directory_search",
    "is_legacy_pt",
    "kind_by_suffix",
    "mismatch_note",
    "resolve",
]

# torch.save's legacy format pickles this number first (torch/serialization.py, MAGIC_NUMBER)
_LEGACY_MAGIC = (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
# what zipfile and zlib raise for a garbled archive (NotImplementedError: a nonsense
# version or compression field; struct.error: a record cut short)
ZIP_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, ValueError, OverflowError,
              struct.error, NotImplementedError)  # fmt: skip
_PROTO = 0x80  # pickle's PROTO opcode: every pickle of protocol 2 or later starts with it


def is_legacy_pt(head: bytes) -> bool:
    """Whether ``head`` (a file's first 23 bytes or more) starts a legacy torch.save file:
    PROTO 2-5, a FRAME (protocol 4 and later), then LONG1 of torch's magic number."""
    if len(head) < 2 or head[0] != _PROTO or not 2 <= head[1] <= 5:
        return False
    at = 11 if head[2:3] == b"\x95" else 2
    return head[at : at + 2] == b"\x8a\x0a" and head[at + 2 : at + 12] == _LEGACY_MAGIC


# kinds no format's description covers: refused, or read by the shard-index reader
# model files of other toolkits: recognised so that a refusal names them, never read
FOREIGN = {
    "tflite": "a TensorFlow Lite model",
    "coreml": "a Core ML model (.mlmodel)",
    "mlpackage": "a Core ML package (.mlpackage)",
    "savedmodel": "a TensorFlow SavedModel",
}
_KIND_DESCRIPTION = {
    **FOREIGN,
    "pt-legacy": "a legacy (pre-1.6) torch.save file",
    "torchscript": "a TorchScript archive",
    "pickle": "a plain pickle",
    "index": "a JSON shard index",
    "zip": "a zip archive",
    "unknown": "a file of unknown format",
}


def describe(kind: str) -> str:
    """What a file of ``kind`` is, for messages: ``'a .npz archive'``."""
    fmt = by_kind(kind)
    return _KIND_DESCRIPTION.get(kind) or (fmt.description if fmt else kind)


def kind_by_suffix(path: Path) -> str:
    """The kind ``path``'s suffix names (``"index"`` for ``.json``), else ``"unknown"``."""
    fmt = by_suffix(path.suffix)
    if fmt is not None:
        return fmt.kinds[0]
    return "index" if path.suffix.lower() == ".json" else "unknown"


def detect(path: str | os.PathLike[str]) -> str:
    """The kind of file at ``path`` (see the module docstring), from its first bytes."""
    if os.path.isdir(path):
        return _directory_kind(Path(path)) or "unknown"
    with open_regular(path) as f:  # a FIFO or device is refused, never waited on
        head = f.read(24)
        size = os.fstat(f.fileno()).st_size
    for fmt in FORMATS:
        if fmt.magic and head.startswith(fmt.magic):
            return fmt.kinds[0]
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return _zip_kind(path)
    # before pickle: a header length of 128 + 256k also starts with the PROTO byte
    if len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= size - 8:
        return "safetensors"
    if len(head) >= 2 and head[0] == _PROTO and 2 <= head[1] <= 5:
        if is_legacy_pt(head):
            return "pt-legacy"
        return "dcp" if _is_dcp_metadata(path) else "pickle"
    later = _magic_later(path, size)
    if later is not None:
        return later
    if head.lstrip()[:1] == b"{":
        return "index"
    return _sniffed(path) or _foreign_kind(path, head) or "unknown"


def _sniffed(path: str | os.PathLike[str]) -> str | None:
    """The kind of the first row whose ``sniff`` hook claims the file's first bytes."""
    sniffing = [f for f in FORMATS if f.sniff]
    if not sniffing:
        return None
    with open_regular(path) as f:
        head = f.read(SNIFF_BYTES)
    return next((f.kinds[0] for f in sniffing if f.recognises(head)), None)


def _magic_later(path: str | os.PathLike[str], size: int) -> str | None:
    """The kind of the first row whose magic sits at one of its further offsets (HDF5's
    superblock after a user block), or None."""
    rows = [f for f in FORMATS if f.magic and f.magic_offsets]
    if not rows:
        return None
    with open_regular(path) as f:
        for fmt in rows:
            for at in fmt.magic_offsets:
                if at + len(fmt.magic) > size:
                    break
                f.seek(at)
                if f.read(len(fmt.magic)) == fmt.magic:
                    return fmt.kinds[0]
    return None


def _foreign_kind(path: str | os.PathLike[str], head: bytes) -> str | None:
    """Another toolkit's model file (see :data:`FOREIGN`), from its first bytes, or None."""
    if head[4:8] == b"TFL3":
        return "tflite"
    if head[:1] != b"\x08":  # protobuf field 1 as a varint: Core ML, SavedModel (ONNX: sniffed)
        return None
    with open(path, "rb") as f:
        data = f.read(4096)
    version, i = _varint(data, 1)
    if version is None or not 1 <= version <= 100 or i >= len(data) or data[i] != 0x12:
        return None
    size, j = _varint(data, i + 1)
    if size is None or size == 0:
        return None
    body = data[j : j + min(size, 64)]
    if body[:1] == b"\x0a":  # field 2 a message: Core ML's description, SavedModel's graph
        return "savedmodel" if Path(path).suffix.lower() == ".pb" else "coreml"
    return None


def _varint(data: bytes, i: int) -> tuple[int | None, int]:
    """The protobuf varint at ``data[i:]`` and the index after it (None: not one)."""
    value = 0
    for shift in range(0, 64, 7):
        if i >= len(data):
            return None, i
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, i
    return None, i


def _directory_kind(path: Path) -> str | None:
    """The kind of a directory that is itself the checkpoint (a Zarr v3 group or array, or
    a directory whose best-ranked files are one entry each, ``NAME.npy``), or another
    toolkit's model directory (refused by name), or None."""
    from .zarr import store_kind  # reads one small JSON file; zarr itself is not needed

    if store_kind(path) is not None:
        return "zarr"
    if (path / "saved_model.pb").is_file() or (path / "saved_model.pbtxt").is_file():
        return "savedmodel"
    if (path / "Manifest.json").is_file() and (path / "Data" / "com.apple.CoreML").is_dir():
        return "mlpackage"
    for fmt, pattern in directory_search():
        if any(p.is_file() for p in path.glob(pattern)):
            return fmt.kinds[0] if fmt.file_per_entry else None
    return None


_DCP_CLASS = b"torch.distributed.checkpoint.metadata"


def _is_dcp_metadata(path: str | os.PathLike[str]) -> bool:
    """A pickle whose first global is DCP's ``Metadata`` class (read, not unpickled)."""
    with open_regular(path) as f:
        head = f.read(96)
    return _DCP_CLASS in head and b"Metadata" in head


def _zip_kind(path: str | os.PathLike[str]) -> str:
    try:
        with open_regular(path) as f, zipfile.ZipFile(f) as zf:
            names = zf.namelist()
    except (*ZIP_ERRORS, OSError):
        return "zip"
    if any(n.endswith("/constants.pkl") or "/code/" in n for n in names):
        return "torchscript"
    if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        return "pt"
    if all(n.endswith((".npy", "/")) for n in names):
        return "npz"
    members = set(names)
    for fmt in FORMATS:  # a format whose file an archive holds (a .keras: HDF5 weights)
        if members.intersection(fmt.zip_members):
            return fmt.kinds[0]
    return "zip"


def mismatch_note(path: Path, kind: str) -> str:
    """A one-line note when the suffix says one format and the bytes another, else ``""``."""
    named, fmt = kind_by_suffix(path), by_kind(kind)
    if named == "unknown" or fmt is None or by_kind(named) is fmt:
        return ""
    return (
        f"{path.name} is {describe(kind)}, not {describe(named)}; read it as such "
        f"(rename it to {path.stem}{fmt.suffixes[0]})"
    )


_SEARCH: dict[int, tuple[tuple[Format, str], ...]] = {}


def directory_search() -> tuple[tuple[Format, str], ...]:
    """The (format, pattern) pairs a directory is searched for, best first: safetensors over
    pickles, as transformers, model files over a loose .npz, a directory of .npy files last."""
    at = version()
    if at not in _SEARCH:
        _SEARCH.clear()
        _SEARCH[at] = tuple(
            (f, p)
            # stable: table order within a rank
            for f in sorted(FORMATS, key=lambda f: f.directory_rank)
            for p in f.in_directory
        )
    return _SEARCH[at]


def resolve(path: Path, patterns: tuple[str, ...] | None = None) -> Path:
    """The file to read for ``path``: itself, its shard index, or a directory's checkpoint.

    A directory gives the one file matching the first of ``patterns`` (by default
    every registered format's, :func:`directory_search`) that any file matches (an
    index before the shards it names). ``model.safetensors`` or ``pytorch_model.bin``
    that was saved sharded, so only its index exists, gives that index.

    A directory that is itself a store (Zarr), or whose files are one entry each (a
    directory of ``NAME.npy`` files), gives itself.

    Raises:
        FormatError: a directory holding several candidates of the same rank.
        UncommittedCheckpointError: a directory holding none, but a save's staging
            directory (a save that is running, or died before its commit), or DCP
            .distcp files without their .metadata.
        FileNotFoundError: a directory holding none.
    """
    if patterns is None:
        patterns = tuple(p for _, p in directory_search())
    if path.suffix.lower() == ".distcp" and (path.parent / ".metadata").is_file():
        return path.parent / ".metadata"  # one file of a DCP checkpoint: the checkpoint
    if not path.is_dir():
        index = path.with_name(path.name + INDEX_SUFFIX)
        if not path.exists() and index.exists():
            return index
        if not path.exists():
            _refuse_uncommitted(path)  # a store whose first save is running or died
        return path
    kind = _directory_kind(path)
    store = by_kind(kind) if kind is not None else None
    if store is not None and set(store.in_directory) <= set(patterns):
        return path  # the directory is the store (or its files are the checkpoint's entries)
    if kind is not None and store is None:
        return path  # another toolkit's model directory: opening it says what it is
    if os.path.lexists(path / "zarr.json") and not (path / "zarr.json").is_file():
        return path  # a FIFO, a device, a link out: the Zarr reader says which, unread
    if (path / "zarr.json").is_file():  # a store whose own document is damaged
        raise FormatError(
            f"{path}: its zarr.json is no Zarr v3 group or array document (not JSON, or "
            "without zarr_format 3 and a node_type); the store is corrupt"
        )
    for pattern in patterns:
        # not only regular files: a FIFO or a device there is refused by its reader
        found = sorted(p for p in path.glob(pattern) if p.exists() and not p.is_dir())
        if not pattern.endswith(INDEX_SUFFIX) and found:
            whole = [p for p in found if not _is_shard_name(p.name)]
            if not whole:  # shards without their index: never read one as the checkpoint
                if pattern == "*.gguf" and _one_split_set(found):
                    return found[0]  # a GGUF split set has no index: it opens from its first shard
                raise UncommittedCheckpointError(
                    f"{path} holds shards ({', '.join(p.name for p in found[:3])}) but no "
                    "index naming them: a save interrupted before its commit, or an "
                    "incomplete download; save (or download) again, or pass one shard's path"
                )
            found = whole
        if len(found) == 1:
            return found[0]
        if found:
            raise FormatError(
                f"{path} holds {len(found)} files matching {pattern} "
                f"({', '.join(p.name for p in found[:5])}); pass the one to open"
            )
    _refuse_uncommitted(path)
    shards = sorted(path.glob("*.distcp"))
    if shards:  # torch's FileSystemWriter writes .metadata last: its commit
        raise UncommittedCheckpointError(
            f"{path} holds {len(shards)} .distcp files but no .metadata: a "
            "torch.distributed.checkpoint save still running or killed before its commit; "
            "wait for it to finish or save again"
        )
    wanted = ", ".join(patterns)
    raise FileNotFoundError(f"{path} holds no checkpoint file or index ({wanted})")


def _refuse_uncommitted(path: Path) -> None:
    """Raise :class:`UncommittedCheckpointError` when a save into ``path`` never committed."""
    from .._commit import pending

    staged = pending(path)
    if staged:
        raise UncommittedCheckpointError(
            f"{path} holds no committed checkpoint: {staged[0].name} is a save that is still "
            "running or died before its commit; wait for it to finish or save again"
        )


def _one_split_set(found: list[Path]) -> bool:
    """Whether sorted ``found`` are shards ``NAME-0000i-of-0000N`` of one set, from the first."""
    if not all(_is_shard_name(p.name) for p in found):
        return False
    parts = [p.name.rsplit(".", 1)[0].rsplit("-", 3) for p in found]
    return len({(q[0], q[3]) for q in parts}) == 1 and int(parts[0][1]) == 1


def _is_shard_name(name: str) -> bool:
    stem = name.rsplit(".", 1)[0]
    parts = stem.rsplit("-", 3)
    return len(parts) == 4 and parts[2] == "of" and parts[1].isdigit() and parts[3].isdigit()

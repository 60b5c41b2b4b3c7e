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
``pickle``         any other pickle
``index``          JSON: a shard index (``*.safetensors.index.json``, ``*.bin.index.json``)
=================  ===================================================================

>>> import os, tempfile, numpy as np
>>> p = os.path.join(tempfile.mkdtemp(), "weights.npz")
>>> np.save(p, np.arange(3))  # np.save keeps the name it was given: an .npy named .npz
>>> detect(p)
'npy'
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

from ..errors import FormatError

__all__ = ["DESCRIPTION", "SUFFIX_KIND", "detect", "mismatch_note", "resolve"]

# torch.save's legacy format pickles this number first (torch/serialization.py, MAGIC_NUMBER)
_LEGACY_MAGIC = (0x1950A86A20F9469CFC6C).to_bytes(10, "little")
_PROTO = 0x80  # pickle's PROTO opcode: every pickle of protocol 2 or later starts with it

SUFFIX_KIND = {
    ".safetensors": "safetensors",
    ".npy": "npy",
    ".npz": "npz",
    ".pt": "pt",
    ".pth": "pt",
    ".bin": "pt",
    ".json": "index",
}

DESCRIPTION = {
    "safetensors": "a safetensors file",
    "npy": "a .npy file",
    "npz": "a .npz archive",
    "pt": "a torch zip archive",
    "pt-legacy": "a legacy (pre-1.6) torch.save file",
    "torchscript": "a TorchScript archive",
    "gguf": "a GGUF file",
    "pickle": "a plain pickle",
    "index": "a JSON shard index",
    "zip": "a zip archive",
    "unknown": "a file of unknown format",
}

_RENAME = {"safetensors": ".safetensors", "npy": ".npy", "npz": ".npz", "pt": ".pt"}


def detect(path: str | os.PathLike[str]) -> str:
    """The kind of file at ``path`` (see the module docstring), from its first bytes."""
    with open(path, "rb") as f:
        head = f.read(16)
        size = os.fstat(f.fileno()).st_size
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith(b"GGUF"):
        return "gguf"
    if head.startswith((b"PK\x03\x04", b"PK\x05\x06")):
        return _zip_kind(path)
    # before pickle: a header length of 128 + 256k also starts with the PROTO byte
    if len(head) >= 9 and head[8:9] == b"{" and int.from_bytes(head[:8], "little") <= size - 8:
        return "safetensors"
    if head[:1] == bytes([_PROTO]) and 2 <= head[1] <= 5:
        return "pt-legacy" if head[2:4] == b"\x8a\x0a" and head[4:14] == _LEGACY_MAGIC else "pickle"
    if head.lstrip()[:1] == b"{":
        return "index"
    return "unknown"


def _zip_kind(path: str | os.PathLike[str]) -> str:
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
    except (zipfile.BadZipFile, OSError, ValueError, EOFError):
        return "zip"
    if any(n.endswith("/constants.pkl") or "/code/" in n for n in names):
        return "torchscript"
    if any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        return "pt"
    if all(n.endswith((".npy", "/")) for n in names):
        return "npz"
    return "zip"


def mismatch_note(path: Path, kind: str) -> str:
    """A one-line note when the suffix says one format and the bytes another, else ``""``."""
    named = SUFFIX_KIND.get(path.suffix.lower())
    family = "pt" if kind == "pt-legacy" else kind
    if named is None or named == family or (kind not in _RENAME and kind != "pt-legacy"):
        return ""
    return (
        f"{path.name} is {DESCRIPTION[kind]}, not {DESCRIPTION[named]}; read it as such "
        f"(rename it to {path.stem}{_RENAME[family]})"
    )


# patterns a directory is searched for, best first: safetensors over pickles, as transformers
_DIRECTORY_PATTERNS = (
    "*.safetensors.index.json",
    "*.safetensors",
    "*.bin.index.json",
    "*.bin",
    "*.pt",
    "*.pth",
)
INDEX_SUFFIX = ".index.json"


def resolve(path: Path, patterns: tuple[str, ...] = _DIRECTORY_PATTERNS) -> Path:
    """The file to read for ``path``: itself, its shard index, or a directory's checkpoint.

    A directory gives the one file matching the first of ``patterns`` that any file
    matches (an index before the shards it names). ``model.safetensors`` or
    ``pytorch_model.bin`` that was saved sharded, so only its index exists, gives that
    index.

    Raises:
        FormatError: a directory holding several candidates of the same rank.
        FileNotFoundError: a directory holding none.
    """
    if not path.is_dir():
        index = path.with_name(path.name + INDEX_SUFFIX)
        if not path.exists() and index.exists():
            return index
        return path
    for pattern in patterns:
        found = sorted(p for p in path.glob(pattern) if p.is_file())
        if pattern.endswith((".bin", ".safetensors")):  # shards without their index
            found = [p for p in found if not _is_shard_name(p.name)] or found
        if len(found) == 1:
            return found[0]
        if found:
            raise FormatError(
                f"{path} holds {len(found)} files matching {pattern} "
                f"({', '.join(p.name for p in found[:5])}); pass the one to open"
            )
    wanted = ", ".join(patterns)
    raise FileNotFoundError(f"{path} holds no checkpoint file or index ({wanted})")


def _is_shard_name(name: str) -> bool:
    stem = name.rsplit(".", 1)[0]
    parts = stem.rsplit("-", 3)
    return len(parts) == 4 and parts[2] == "of" and parts[1].isdigit() and parts[3].isdigit()

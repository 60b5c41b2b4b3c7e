"""What each file format can do, in one table that every caller asks instead of testing suffixes.

A :class:`Format` names a format's module and reader, the suffixes it is saved under,
the kinds of content :mod:`tensorbridge.io._detect` recognises as it, and what it can
hold: one bare array, many named arrays, metadata, shards; whether reads map the file.
``tb.open`` picks the reader by content, ``tb.save`` the writer by suffix, and the
command line words its messages ("a .npy file holds one array", "convert to
.safetensors or .pt to keep it") from these rows, so adding a format is one module
plus one row of :data:`FORMATS`.

Every format module's ``save`` has one signature::

    save(tensors, path, *, float_dtype=None, metadata=None, progress=None, **options)

``tensors`` is a flat mapping of names to tensors or arrays (``many_arrays``) or one
tensor or array (``single_array``); a format that keeps no metadata raises when
``metadata`` is not empty; ``options`` are the format's own keyword-only options
(``chunk_bytes``, ``max_shard_size``). The module-level writers replace an existing
file; ``tb.save`` is the entry point that refuses to unless asked. Reading goes
through the row's reader class rather than the module's ``open``, which may look at
the name (``safetensors.open`` resolves directories, ``npy.open`` hands ``.npz``
paths on): a file is read as what its bytes are, whatever it is called.

This module imports nothing heavy: a format's module is imported when its reader or
writer is first used.

>>> by_suffix(".NPZ").name, by_kind("pt-legacy").name
('npz', 'pt')
>>> [f.suffixes[0] for f in FORMATS if f.metadata]
['.safetensors', '.pt', '.gguf', '.zarr']
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import FormatError

if TYPE_CHECKING:
    from ._common import TensorFile

__all__ = [
    "DIRECTORY_FORMAT",
    "FORMATS",
    "INDEX_SUFFIX",
    "Format",
    "by_kind",
    "by_name",
    "by_suffix",
    "listing",
]

INDEX_SUFFIX = ".index.json"  # NAME.safetensors.index.json: a sharded checkpoint's index


@dataclass(frozen=True, repr=False)
class Format:
    """One file format: where its code is, how it is recognised, and what it can hold.

    >>> f = by_name("npy")
    >>> f.single_array, f.many_arrays, f.metadata, f.reader.__name__
    (True, False, False, 'NpyFile')
    """

    name: str
    module: str  # the module with the reader class and ``save``
    reader_name: str  # its TensorFile subclass: opens one file of the format, whatever its name
    description: str  # "a .npy file": what notes and messages call such a file
    suffixes: tuple[str, ...]  # lower case; the first is the one a mislabelled file is told
    kinds: tuple[str, ...]  # the content kinds (``_detect.detect``) read by this format
    single_array: bool = False  # a file may be one bare array (``load`` returns it alone)
    many_arrays: bool = True  # a file may hold named arrays
    metadata: bool = False  # ``save(metadata=...)`` is kept beside the arrays
    text_metadata: bool = False  # ... as strings only (``tb.save`` passes ``str(value)``)
    metadata_mark: str | None = None  # a metadata key the format's writers set for themselves
    metadata_with_tensors: bool = False  # metadata keys share one namespace with tensor names
    required_metadata: tuple[str, ...] = ()  # keys ``save`` refuses to write a file without
    sharding: bool = False  # ``max_shard_size=`` splits a save into shards and an index
    memory_map: bool = False  # reads are zero-copy views of the mapped file
    raw_dtype: bool = False  # reads take ``dtype=`` to name raw-byte data (np.save's ml_dtypes)
    writes: bool = True  # ``save`` writes it (False: read-only)
    magic: bytes = b""  # the first bytes that identify it, where a fixed magic does
    in_directory: tuple[str, ...] = ()  # names a checkpoint directory is searched for, best first
    directory_rank: int = 0  # directories are searched by rank, then table order: models first
    directory: bool = False  # a store is a directory (Zarr), recognised by its contents
    # the directory holding ``in_directory``'s files is the checkpoint, one entry a file
    file_per_entry: bool = False
    extra: str | None = None  # the pip extra that installs its library (``tensorbridge[zarr]``)
    chunked: bool = False  # tensors stored as boxes of a global tensor (assembled when saved)
    deferred: bool = False  # ``save`` takes values computed as they are written (``Deferred``)
    links: bool = False  # the reader opens other files its file names: it takes follow_links=
    nested: bool = False  # ``save`` keeps a tree's nesting and plain values (else: dotted names)
    npy_members: bool = False  # ``save`` takes ``npy.NpyBytes``: copies a .npy torch cannot hold
    keeps: str = ""  # what a conversion to it keeps, for ``convert --help``

    def __repr__(self) -> str:
        return f"<Format {self.name}>"

    @property
    def reader(self) -> Callable[..., TensorFile]:
        """The format's :class:`~tensorbridge.io.TensorFile` subclass (imports its module)."""
        cls: Callable[..., TensorFile] = getattr(self._module(), self.reader_name)
        return cls

    @property
    def save(self) -> Callable[..., None]:
        """The module's ``save`` (the signature in this module's docstring)."""
        if not self.writes:
            raise FormatError(
                f"tensorbridge reads {self.description} but does not write one; save to "
                f"{listing(lambda f: f.writes, ' or ')}"
            )
        fn: Callable[..., None] = self._module().save
        return fn

    def _module(self) -> Any:
        return importlib.import_module(self.module)


# In order of preference: a directory is searched for the first row's files first, and
# messages list formats in this order.
FORMATS: tuple[Format, ...] = (
    Format(
        "safetensors",
        "tensorbridge.io.safetensors",
        "SafetensorsFile",
        "a safetensors file",
        suffixes=(".safetensors",),
        kinds=("safetensors",),
        metadata=True,
        text_metadata=True,
        metadata_mark="format",
        sharding=True,
        memory_map=True,
        deferred=True,
        in_directory=("*.safetensors" + INDEX_SUFFIX, "*.safetensors"),
        keeps="tensors by dotted name; metadata as text; shards with an index",
    ),
    Format(
        "npy",
        "tensorbridge.io.npy",
        "NpyFile",
        "a .npy file",
        suffixes=(".npy",),
        kinds=("npy",),
        single_array=True,
        many_arrays=False,
        memory_map=True,
        raw_dtype=True,
        magic=b"\x93NUMPY",
        npy_members=True,
        keeps="one array; no metadata",
    ),
    Format(
        "npz",
        "tensorbridge.io.npz",
        "NpzFile",
        "a .npz archive",
        suffixes=(".npz",),
        kinds=("npz",),
        memory_map=True,
        raw_dtype=True,
        in_directory=("*.npz",),
        directory_rank=1,
        npy_members=True,
        keeps="arrays by dotted name; no metadata; from a NumPy source, members torch cannot "
        "hold (float128, strings) copied unchanged",
    ),
    Format(
        "pt",
        "tensorbridge.io.pt",
        "PtFile",
        "a torch zip archive",
        suffixes=(".pt", ".pth", ".bin"),
        kinds=("pt", "pt-legacy"),
        single_array=True,
        metadata=True,
        metadata_with_tensors=True,
        memory_map=True,
        in_directory=("*.bin" + INDEX_SUFFIX, "*.bin", "*.pt", "*.pth"),
        nested=True,
        keeps="a .pt source's nesting and plain values, as torch.load gives them; from "
        "other sources, tensors by dotted name with the metadata beside them",
    ),
    Format(
        "gguf",
        "tensorbridge.io.gguf",
        "GGUFFile",
        "a GGUF file",
        suffixes=(".gguf",),
        kinds=("gguf",),
        metadata=True,
        required_metadata=("general.architecture",),
        memory_map=True,
        magic=b"GGUF",
        in_directory=("*.gguf",),
        links=True,
        keeps="tensors by name; typed metadata (general.architecture required)",
    ),
    Format(
        "zarr",
        "tensorbridge.io.zarr",
        "ZarrFile",
        "a Zarr v3 store",
        suffixes=(".zarr",),
        kinds=("zarr",),
        metadata=True,
        directory=True,
        extra="zarr",
        links=True,
        keeps="one array per tensor; metadata as attributes",
    ),
    Format(
        "dcp",
        "tensorbridge.io.dcp",
        "DcpFile",
        "a torch.distributed.checkpoint directory",
        suffixes=(".distcp",),
        kinds=("dcp",),
        memory_map=True,
        writes=False,
        in_directory=(".metadata",),
        chunked=True,
        links=True,
    ),
    Format(  # what ``convert dcp/ out/ --format npy`` writes
        "npy-dir",
        "tensorbridge.io.npy",
        "NpyDirectory",
        "a directory of .npy files",
        suffixes=(),
        kinds=("npy-dir",),
        memory_map=True,
        raw_dtype=True,
        writes=False,
        in_directory=("*.npy",),
        directory_rank=2,
        directory=True,
        file_per_entry=True,
    ),
)

# what a directory destination gets: model.safetensors in it
DIRECTORY_FORMAT = FORMATS[0]

_BY_SUFFIX = {s: f for f in FORMATS for s in f.suffixes}
_BY_KIND = {k: f for f in FORMATS for k in f.kinds}
_BY_NAME = {f.name: f for f in FORMATS}


def by_suffix(suffix: str) -> Format | None:
    """The format a file suffix names (any case), or None."""
    return _BY_SUFFIX.get(suffix.lower())


def by_kind(kind: str) -> Format | None:
    """The format that reads content of ``kind`` (see :mod:`tensorbridge.io._detect`), or None."""
    return _BY_KIND.get(kind)


def by_name(name: str) -> Format:
    """The format called ``name`` ("safetensors", "npy", "npz", "pt", "gguf", "zarr", "dcp",
    "npy-dir")."""
    return _BY_NAME[name]


def listing(has: Callable[[Format], bool], sep: str = " / ") -> str:
    """The usual suffixes of the writable formats that ``has`` a capability, for messages.

    >>> listing(lambda f: f.metadata, " or ")
    '.safetensors or .pt or .gguf or .zarr'
    """
    return sep.join(f.suffixes[0] for f in FORMATS if f.writes and has(f))

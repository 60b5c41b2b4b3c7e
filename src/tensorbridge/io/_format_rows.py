"""A format's row and the built-in rows: what :mod:`tensorbridge.io._formats` registers.

A :class:`Format` row names a format's module and reader, its suffixes, the content
kinds :mod:`tensorbridge.io._detect` recognises as it (by a fixed ``magic``, at offset 0
or a ``magic_offsets`` one; a ``sniff`` hook given the first :data:`SNIFF_BYTES` bytes; a
zip archive's ``zip_members``), and what it can do. Its module provides each capability
under a fixed name (see "Adding a file format" in ``docs/dev/design.md``). The rows are
plain data and this module imports nothing heavy: the entry points of
``tensorbridge.formats`` name them through :mod:`tensorbridge.io._formats`, which
re-exports every name here and keeps the table. A row asks the table (``listing``, for a
message) through a string import, as it imports its format's module.

>>> HDF5.suffixes, ONNX.sniff
(('.h5', '.hdf5'), 'tensorbridge.io.onnx.wire:sniff')
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._entry_points import load_object
from ..errors import FormatError
from ._assembly import Layout, StoreLayout

if TYPE_CHECKING:
    from .._tensorfile import TensorFile
    from ..dtypes import DTypeRow

__all__ = [
    "BUILTIN",
    "DCP",
    "DIRECTORY_FORMAT",
    "GGUF",
    "HDF5",
    "INDEX_SUFFIX",
    "NPY",
    "NPY_DIR",
    "NPZ",
    "ONNX",
    "PT",
    "SAFETENSORS",
    "SNIFF_BYTES",
    "ZARR",
    "Format",
]

INDEX_SUFFIX = ".index.json"  # NAME.safetensors.index.json: a sharded checkpoint's index
SNIFF_BYTES = 4096  # what a row's sniff hook is given: the file's first bytes (all of a shorter)


@dataclass(frozen=True, repr=False)
class Format:
    """One file format: where its code is, how it is recognised, and what it can do.

    A capability stated here is provided by the module ``module`` under a fixed name:
    ``writes`` by ``save``, ``typed_metadata`` by ``metadata_value(value, type_name)``,
    ``required_metadata`` by ``check_metadata(metadata, target, fix)``, ``assembles``
    by ``assembly(entries, target, *, metadata, max_shard_size, index)``.

    >>> f = NPY
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
    typed_metadata: bool = False  # values carry a type (``--metadata KEY:TYPE=VALUE``)
    metadata_mark: str | None = None  # a metadata key the format's writers set for themselves
    metadata_with_tensors: bool = False  # metadata keys share one namespace with tensor names
    required_metadata: tuple[str, ...] = ()  # keys ``save`` refuses to write a file without
    sharding: bool = False  # ``max_shard_size=`` splits a save into shards and an index
    memory_map: bool = False  # reads are zero-copy views of the mapped file
    raw_dtype: bool = False  # reads take ``dtype=`` to name raw-byte data (np.save's ml_dtypes)
    dequantizes: bool = False  # the reader takes ``dequantize=``: its tensors name their types
    writes: bool = True  # ``save`` writes it (False: read-only)
    save_options: tuple[str, ...] = ()  # the keyword options ``save`` takes beyond the common
    cli_options: tuple[tuple[str, str, str], ...] = ()  # (option, METAVAR, help): --option
    quantizes: str = ""  # what ``save(quantize=...)`` writes ("" : it takes no quantize=)
    quantized: bool = False  # quantization schemes' published layouts are written in it
    magic: bytes = b""  # the first bytes that identify it, where a fixed magic does
    sniff: str = ""  # else "module:function", a ``(head: bytes) -> bool`` told SNIFF_BYTES
    # further offsets ``magic`` may begin at, tried when the first bytes are no format's
    magic_offsets: tuple[int, ...] = ()
    zip_members: tuple[str, ...] = ()  # a zip archive holding one is read as it (the member)
    in_directory: tuple[str, ...] = ()  # names a checkpoint directory is searched for, best first
    directory_rank: int = 0  # directories are searched by rank, then table order: models first
    directory: bool = False  # a store is a directory (Zarr), recognised by its contents
    # the directory holding ``in_directory``'s files is the checkpoint, one entry a file
    file_per_entry: bool = False
    loose_suffixes: tuple[str, ...] = ()  # read as it only when the bytes are no other format's
    explains: tuple[str, ...] = ()  # content kinds its reader explains in a file named like it
    called: str = ""  # what a file named like it is told it is not, where not ``description``
    extra: str | None = None  # the pip extra that installs its library (``tensorbridge[zarr]``)
    chunked: bool = False  # tensors stored as boxes of a global tensor (assembled when saved)
    assembles: bool = False  # a chunked checkpoint converts to it (``assembly``)
    deferred: bool = False  # ``save`` takes values computed as they are written (``Deferred``)
    links: bool = False  # the reader opens other files its file names: it takes follow_links=
    nested: bool = False  # ``save`` keeps a tree's nesting and plain values (else: dotted names)
    npy_members: bool = False  # ``save`` takes ``npy.NpyBytes``: copies a .npy torch cannot hold
    # ``save`` takes a carried dtype's stored integers (``StoredBits``): copies need no ml_dtypes
    stored_bits: bool = False
    keeps: str = ""  # what a conversion to it keeps, for ``convert --help``
    order: int = 100  # its place in the table (then registration order): messages, directories

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
            table = importlib.import_module("tensorbridge.io._formats")  # above this module
            writers: str = table.listing(lambda f: f.writes, " or ")
            raise FormatError(
                f"tensorbridge reads {self.description} but does not write one; save to {writers}"
            )
        fn: Callable[..., None] = self._module().save
        return fn

    def recognises(self, head: bytes) -> bool:
        """Whether the row's ``sniff`` hook claims a file that starts with ``head``."""
        return bool(self.sniff) and bool(load_object(self.sniff)(head))

    def metadata_value(self, value: Any, type_name: str) -> Any:
        """``value`` as the format's metadata type ``type_name`` (``typed_metadata`` rows)."""
        return self._provided("metadata_value", self.typed_metadata)(value, type_name)

    def check_metadata(self, metadata: Mapping[str, Any], target: Any, fix: str) -> None:
        """Refuse ``metadata`` that lacks a ``required_metadata`` key, before a save starts;
        ``fix`` ends the message (a command line names its own option)."""
        if self.required_metadata:
            self._provided("check_metadata", True)(metadata, target, fix=fix)

    def assembly(
        self,
        entries: list[tuple[str, DTypeRow, tuple[int, ...]]],
        target: Path,
        *,
        metadata: Mapping[str, Any] | None,
        max_shard_size: int | str | None,
        index: bool,
    ) -> Layout | StoreLayout:
        """Where a chunked checkpoint's tensors ``entries`` go in ``target`` (``assembles``)."""
        fn = self._provided("assembly", self.assembles)
        plan: Layout | StoreLayout = fn(
            entries, target, metadata=metadata, max_shard_size=max_shard_size, index=index
        )
        return plan

    def _provided(self, name: str, stated: bool) -> Callable[..., Any]:
        if not stated:
            raise FormatError(f"{self.description} has no {name}; its row does not state it")
        fn: Callable[..., Any] = getattr(self._module(), name)
        return fn

    def _module(self) -> Any:
        return importlib.import_module(self.module)


# --- the built-in rows, registered through their entry points (pyproject.toml) ------------------

# directories are searched by directory_rank, then this order; messages list formats in it
SAFETENSORS = Format(
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
    stored_bits=True,
    save_options=("max_shard_size", "index", "chunk_bytes"),
    quantized=True,
    assembles=True,
    in_directory=("*.safetensors" + INDEX_SUFFIX, "*.safetensors"),
    keeps="tensors by dotted name; metadata as text; shards with an index",
    order=10,
)
NPY = Format(
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
    stored_bits=True,
    save_options=("chunk_bytes",),
    assembles=True,  # a directory of NAME.npy files (``format="npy"``)
    keeps="one array, of any dtype of the table; no metadata",
    order=20,
)
NPZ = Format(
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
    stored_bits=True,
    save_options=("chunk_bytes",),
    keeps="arrays by dotted name, of any dtype of the table (int4, float6, ...); no "
    "metadata; from a NumPy source, members torch cannot hold (float128, strings) copied "
    "unchanged",
    order=30,
)
PT = Format(
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
    loose_suffixes=(".ckpt",),
    explains=("pickle",),  # a plain pickle named .pt: its reader says what it holds
    called="a torch.save archive",
    keeps="a .pt source's nesting and plain values, as torch.load gives them; from "
    "other sources, tensors by dotted name with the metadata beside them",
    order=40,
)
GGUF = Format(
    "gguf",
    "tensorbridge.io.gguf",
    "GGUFFile",
    "a GGUF file",
    suffixes=(".gguf",),
    kinds=("gguf",),
    metadata=True,
    typed_metadata=True,
    required_metadata=("general.architecture",),
    memory_map=True,
    dequantizes=True,
    save_options=("quantize", "chunk_bytes"),
    quantizes="GGUF's Q8_0 blocks",
    magic=b"GGUF",
    in_directory=("*.gguf",),
    links=True,
    keeps="tensors by name; typed metadata (general.architecture required)",
    order=50,
)
ZARR = Format(
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
    assembles=True,
    save_options=("chunk_bytes", "max_chunk_bytes"),
    keeps="one array per tensor; metadata as attributes",
    order=60,
)
DCP = Format(
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
    order=70,
)
NPY_DIR = Format(  # what ``convert dcp/ out/ --format npy`` writes
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
    order=80,
)
HDF5 = Format(
    "hdf5",
    "tensorbridge.io.hdf5",
    "HDF5File",
    "an HDF5 file",
    suffixes=(".h5", ".hdf5"),
    kinds=("hdf5",),
    metadata=True,
    memory_map=True,
    raw_dtype=True,
    magic=b"\x89HDF\r\n\x1a\n",
    magic_offsets=tuple(512 << k for k in range(40)),  # after a user block: 512, 1024, ...
    zip_members=("model.weights.h5",),  # a Keras .keras archive: its weights
    loose_suffixes=(".keras",),
    extra="hdf5",
    save_options=("chunk_bytes",),
    keeps="tensors by name ('/' makes groups); metadata as attributes",
    order=65,
)
ONNX = Format(
    "onnx",
    "tensorbridge.io.onnx",
    "OnnxFile",
    "an ONNX model",
    suffixes=(".onnx",),
    kinds=("onnx",),
    metadata=True,
    text_metadata=True,
    memory_map=True,
    sniff="tensorbridge.io.onnx.wire:sniff",  # a protobuf: no magic
    save_options=("into", "name_map", "chunk_bytes"),
    cli_options=(
        ("into", "MODEL", "an ONNX model whose initializers the tensors replace, by name"),
        ("name_map", "JSON", 'a JSON file {"tensor": "initializer"} for renamed weights'),
    ),
    extra="onnx",  # to write; reading needs no onnx package
    links=True,  # its external data files
    in_directory=("*.onnx",),
    directory_rank=1,
    keeps="initializers by name (--into MODEL: its weights replaced); metadata as text; "
    "weights as external data in DST.data",
    order=90,
)
BUILTIN = (SAFETENSORS, NPY, NPZ, PT, GGUF, ZARR, HDF5, DCP, NPY_DIR, ONNX)

# what a directory destination gets: model.safetensors in it
DIRECTORY_FORMAT = SAFETENSORS

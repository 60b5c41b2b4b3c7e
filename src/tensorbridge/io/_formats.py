"""The registry of file formats: one table that every caller asks instead of testing names.

A :class:`Format` row names a format's module and reader, the suffixes it is saved under,
the kinds of content :mod:`tensorbridge.io._detect` recognises as it, and what it can
do: hold one bare array or many named ones, metadata (typed or text), shards; map its
reads; dequantize on read; take ``quantize=``; write values computed as they are
written; be what a chunked (DCP) checkpoint converts to. A capability the row states
is provided by the format's module under a fixed name (see "Adding a format" in
``docs/dev/design.md``). ``tb.open`` picks the reader by content, ``tb.save`` the
writer by suffix, and the command line words its messages ("a .npy file holds one
array", "convert to .safetensors or .pt to keep it") from these rows.

**Registration.** Every format, the built-in ones included, is registered through the
entry point group ``tensorbridge.formats``: each entry point names a :class:`Format`
row (``npz = "tensorbridge.io._formats:NPZ"``), in a module that imports nothing
heavy. The group is read once, on the first question asked of the table; a format's
own module is imported when its reader or writer is first used. Built-in rows whose
entry points the installed metadata lacks (a source checkout on ``PYTHONPATH``, an
install from before the group existed) are registered directly, so the table is the
same either way. Code registers a row with :func:`register_format` and takes it back
with :func:`unregister_format`.

Every format module's ``save`` has one signature::

    save(tensors, path, *, float_dtype=None, metadata=None, progress=None, **options)

``tensors`` is a flat mapping of names to tensors or arrays (``many_arrays``) or one
tensor or array (``single_array``); a format that keeps no metadata raises when
``metadata`` is not empty; ``options`` are the format's own keyword-only options
(``save_options``). The module-level writers replace an existing file; ``tb.save`` is
the entry point that refuses to unless asked. Reading goes through the row's reader
class rather than the module's ``open``, which may look at the name
(``safetensors.open`` resolves directories): a file is read as what its bytes are,
whatever it is called.

>>> by_suffix(".NPZ").name, by_kind("pt-legacy").name
('npz', 'pt')
>>> [f.suffixes[0] for f in FORMATS if f.metadata]
['.safetensors', '.pt', '.gguf', '.zarr']
"""

from __future__ import annotations

import importlib
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from .._entry_points import group_entry_points, load_object
from ..errors import FormatError, InvalidArgumentError
from ._assembly import Layout, PlannedFile, StoreLayout

if TYPE_CHECKING:
    from .._tensorfile import TensorFile
    from ..dtypes import DTypeRow

__all__ = [
    "DIRECTORY_FORMAT",
    "ENTRY_POINT_GROUP",
    "FORMATS",
    "INDEX_SUFFIX",
    "Format",
    "Layout",
    "PlannedFile",
    "StoreLayout",
    "by_kind",
    "by_name",
    "by_suffix",
    "entry_files",
    "listing",
    "named_by",
    "register_format",
    "unregister_format",
    "version",
]

INDEX_SUFFIX = ".index.json"  # NAME.safetensors.index.json: a sharded checkpoint's index
ENTRY_POINT_GROUP = "tensorbridge.formats"


@dataclass(frozen=True, repr=False)
class Format:
    """One file format: where its code is, how it is recognised, and what it can do.

    A capability stated here is provided by the module ``module`` under a fixed name:
    ``writes`` by ``save``, ``typed_metadata`` by ``metadata_value(value, type_name)``,
    ``required_metadata`` by ``check_metadata(metadata, target, fix)``, ``assembles``
    by ``assembly(entries, target, *, metadata, max_shard_size, index)``.

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
    quantizes: str = ""  # what ``save(quantize=...)`` writes ("" : it takes no quantize=)
    quantized: bool = False  # quantization schemes' published layouts are written in it
    magic: bytes = b""  # the first bytes that identify it, where a fixed magic does
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
            raise FormatError(
                f"tensorbridge reads {self.description} but does not write one; save to "
                f"{listing(lambda f: f.writes, ' or ')}"
            )
        fn: Callable[..., None] = self._module().save
        return fn

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
BUILTIN = (SAFETENSORS, NPY, NPZ, PT, GGUF, ZARR, DCP, NPY_DIR)

# what a directory destination gets: model.safetensors in it
DIRECTORY_FORMAT = SAFETENSORS


# --- the registry ---------------------------------------------------------------------------

_rows: list[Format] = []  # registered, in table order
_origin: dict[str, str] = {}  # name -> the distribution whose entry point registered it
_BY_SUFFIX: dict[str, Format] = {}
_BY_KIND: dict[str, Format] = {}
_BY_NAME: dict[str, Format] = {}
_state = {"discovered": False, "discovering": False, "version": 0}
_lock = threading.RLock()


class _Table(Sequence[Format]):
    """:data:`FORMATS`: the registered rows, in table order, read when first asked."""

    @overload
    def __getitem__(self, i: int) -> Format: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Format]: ...
    def __getitem__(self, i: int | slice) -> Format | Sequence[Format]:
        return _table()[i]

    def __len__(self) -> int:
        return len(_table())

    def __iter__(self) -> Iterator[Format]:
        return iter(_table())

    def __repr__(self) -> str:
        return f"FORMATS{_table()!r}"


FORMATS: Sequence[Format] = _Table()


def _table() -> tuple[Format, ...]:
    _discover()
    return tuple(_rows)


def version() -> int:
    """A number that changes whenever a format is registered or unregistered (for caches)."""
    _discover()
    return _state["version"]


def _discover() -> None:
    """Register the formats the entry point group names, once; built-ins the metadata lacks
    directly. A third-party entry point that fails to load is skipped with a warning."""
    if _state["discovered"]:
        return
    with _lock:
        if _state["discovered"] or _state["discovering"]:  # done, or a row module asking
            return
        _state["discovering"] = True
        try:
            _load_entry_points()
        finally:
            _state["discovering"] = False
            _state["discovered"] = True


def _load_entry_points() -> None:
    """Register the rows the group names: ours first, then the built-ins the metadata
    lacks, then a third party's (one that fails to load or clashes: a warning)."""
    ours: list[tuple[Format, str]] = []
    theirs: list[tuple[Format, str]] = []
    for name, value, dist in sorted(group_entry_points(ENTRY_POINT_GROUP)):
        try:
            fmt = load_object(value)
        except Exception as e:
            if dist != "tensorbridge":  # our own rows are registered below regardless
                warnings.warn(
                    f"the {ENTRY_POINT_GROUP} entry point {name!r} of {dist} failed to "
                    f"load ({type(e).__name__}: {e}); its format is not available",
                    RuntimeWarning,
                    stacklevel=2,
                )
            continue
        (ours if any(fmt is b for b in BUILTIN) else theirs).append((fmt, dist))
    for fmt, dist in ours:
        if fmt.name not in _BY_NAME:
            _add(fmt, dist)
    for fmt in BUILTIN:  # stale or absent metadata: the same table all the same
        if fmt.name not in _BY_NAME:
            _add(fmt, "direct")
    for fmt, dist in theirs:
        try:
            _add(fmt, dist)
        except (InvalidArgumentError, TypeError) as e:
            warnings.warn(
                f"the {ENTRY_POINT_GROUP} entry point of {dist} is not registered: {e}",
                RuntimeWarning,
                stacklevel=2,
            )


def _rediscover() -> None:
    """Forget every registration and read the entry point group again (for tests)."""
    with _lock:
        _rows.clear()
        _origin.clear()
        _reindex()
        _state["discovered"] = False
    _discover()


def register_format(fmt: Format) -> Format:
    """Add ``fmt`` to the table, so that ``tb.open``, ``tb.save`` and the command line
    read and write it; returns it. :func:`unregister_format` takes it back.

    A package registers its formats for every program through the entry point group
    ``tensorbridge.formats`` instead (see the module docstring).

    Raises:
        InvalidArgumentError: a name, suffix or content kind that a registered format has.
    """
    _discover()
    with _lock:
        _add(fmt, "register_format")
    return fmt


def unregister_format(fmt: Format | str) -> None:
    """Take a registered format (a row or its name) out of the table.

    Raises:
        InvalidArgumentError: no format of that name is registered.
    """
    _discover()
    name = fmt if isinstance(fmt, str) else fmt.name
    with _lock:
        row = _BY_NAME.get(name)
        if row is None or (not isinstance(fmt, str) and row is not fmt):
            raise InvalidArgumentError(
                f"no format {name!r} is registered (registered: {', '.join(_BY_NAME)}); pass "
                "the row register_format returned, or its name"
            )
        _rows.remove(row)
        _origin.pop(name, None)
        _reindex()


def _add(fmt: Format, origin: str) -> None:
    if not isinstance(fmt, Format):
        raise TypeError(
            f"a format registration takes a tensorbridge.io.Format row, not "
            f"{type(fmt).__qualname__}"
        )
    taken = (
        [f"the name {fmt.name!r}"] * (fmt.name in _BY_NAME)
        + [f"the suffix {s!r}" for s in fmt.suffixes if s.lower() in _BY_SUFFIX]
        + [f"the content kind {k!r}" for k in fmt.kinds if k in _BY_KIND]
    )
    if taken:
        raise InvalidArgumentError(
            f"cannot register {fmt!r}: a registered format has {', '.join(taken)}; "
            "unregister it first, or choose others"
        )
    if not fmt.kinds or not (fmt.single_array or fmt.many_arrays):
        raise InvalidArgumentError(
            f"cannot register {fmt!r}: a row needs a content kind and single_array or many_arrays"
        )
    at = sum(1 for f in _rows if f.order <= fmt.order)  # after its equals: registration order
    _rows.insert(at, fmt)
    _origin[fmt.name] = origin
    _reindex()


def _reindex() -> None:
    """The lookups, rebuilt in place (their objects stay the ones imported elsewhere)."""
    for index, pairs in (
        (_BY_SUFFIX, ((s.lower(), f) for f in _rows for s in f.suffixes)),
        (_BY_KIND, ((k, f) for f in _rows for k in f.kinds)),
        (_BY_NAME, ((f.name, f) for f in _rows)),
    ):
        index.clear()
        index.update(pairs)
    _state["version"] += 1


def by_suffix(suffix: str) -> Format | None:
    """The format a file suffix names (any case), or None."""
    _discover()
    return _BY_SUFFIX.get(suffix.lower())


def by_kind(kind: str) -> Format | None:
    """The format that reads content of ``kind`` (see :mod:`tensorbridge.io._detect`), or None."""
    _discover()
    return _BY_KIND.get(kind)


def by_name(name: str) -> Format:
    """The format called ``name`` ("safetensors", "npy", "npz", "pt", "gguf", "zarr", "dcp",
    "npy-dir", or a registered one's)."""
    _discover()
    return _BY_NAME[name]


def named_by(path: Path) -> Format | None:
    """The format ``path``'s suffix names, loose suffixes (``.ckpt``) included, or None."""
    fmt = by_suffix(path.suffix)
    if fmt is not None:
        return fmt
    return next((f for f in _table() if path.suffix.lower() in f.loose_suffixes), None)


def entry_files(name: str | None) -> Format | None:
    """The single-array format whose files a chunked conversion's ``format=name`` writes,
    one per tensor, into a directory (``"npy"``); None for the default layout.

    >>> entry_files("npy"), entry_files(None)
    (<Format npy>, None)

    Raises:
        FormatError: ``name`` is neither the directory format nor such a format.
    """
    if name is None or name == DIRECTORY_FORMAT.name:
        return None
    _discover()
    fmt = _BY_NAME.get(name)
    if fmt is None or not (fmt.assembles and fmt.single_array and not fmt.many_arrays):
        each = [f for f in _table() if f.assembles and f.single_array and not f.many_arrays]
        raise FormatError(
            f"format={name!r}: a DCP checkpoint converts to {DIRECTORY_FORMAT.name!r} (a "
            f"directory or a NAME{DIRECTORY_FORMAT.suffixes[0]} path) or "
            + " or ".join(f"{f.name!r} (a directory of {f.suffixes[0]} files)" for f in each)
        )
    return fmt


def listing(has: Callable[[Format], bool], sep: str = " / ") -> str:
    """The usual suffixes of the writable formats that ``has`` a capability, for messages.

    >>> listing(lambda f: f.metadata, " or ")
    '.safetensors or .pt or .gguf or .zarr'
    """
    return sep.join(f.suffixes[0] for f in FORMATS if f.writes and has(f))

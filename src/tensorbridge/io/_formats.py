"""The registry of file formats: one table that every caller asks instead of testing names.

A :class:`Format` row names a format's module and reader, its suffixes, the content
kinds :mod:`tensorbridge.io._detect` recognises as it (by a fixed ``magic``, at offset 0
or a ``magic_offsets`` one; a ``sniff`` hook given the first :data:`SNIFF_BYTES` bytes; a
zip archive's ``zip_members``), and what it can do: one bare array or many, metadata
(typed or text), shards, mapped reads, dequantizing, ``quantize=`` and options of its own
(``cli_options``: ``convert --into``), values computed as written, being what a DCP
checkpoint converts to (the rows and :class:`Format` live in
:mod:`tensorbridge.io._format_rows`, re-exported here). Its module provides each
capability under a fixed name, with one ``save(tensors, path, *, float_dtype=None,
metadata=None, progress=None, **options)`` (see "Adding a file format" in
``docs/dev/design.md``). ``tb.open`` picks the reader by
content (the row's reader class, never the module's ``open``), ``tb.save`` the writer by
suffix, and the command line words its messages from these rows.

**Registration.** Every format, the built-in ones included, is registered through the
entry point group ``tensorbridge.formats``, each naming a row in a module that imports
nothing heavy (``npz = "tensorbridge.io._formats:NPZ"``). The group is read on the first
question asked of the table; built-in rows the installed metadata lacks (a checkout on
``PYTHONPATH``) are registered directly. :func:`register_format` and
:func:`unregister_format` add and take back a row from code.

>>> by_suffix(".NPZ").name, by_kind("pt-legacy").name
('npz', 'pt')
>>> [f.suffixes[0] for f in FORMATS if f.metadata]
['.safetensors', '.pt', '.gguf', '.zarr', '.h5', '.onnx']
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import overload

from .._entry_points import group_entry_points, load_object
from ..errors import FormatError, InvalidArgumentError
from ._assembly import Layout as Layout
from ._assembly import PlannedFile as PlannedFile
from ._assembly import StoreLayout as StoreLayout
from ._format_rows import BUILTIN as BUILTIN
from ._format_rows import DCP as DCP
from ._format_rows import DIRECTORY_FORMAT as DIRECTORY_FORMAT
from ._format_rows import GGUF as GGUF
from ._format_rows import HDF5 as HDF5
from ._format_rows import INDEX_SUFFIX as INDEX_SUFFIX
from ._format_rows import NPY as NPY
from ._format_rows import NPY_DIR as NPY_DIR
from ._format_rows import NPZ as NPZ
from ._format_rows import ONNX as ONNX
from ._format_rows import PT as PT
from ._format_rows import SAFETENSORS as SAFETENSORS
from ._format_rows import SNIFF_BYTES as SNIFF_BYTES
from ._format_rows import ZARR as ZARR
from ._format_rows import Format as Format

__all__ = [
    "DIRECTORY_FORMAT",
    "ENTRY_POINT_GROUP",
    "FORMATS",
    "INDEX_SUFFIX",
    "SNIFF_BYTES",
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

ENTRY_POINT_GROUP = "tensorbridge.formats"


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
    """The format called ``name`` ("safetensors", "npy", "npz", "pt", "gguf", "zarr",
    "hdf5", "dcp", "npy-dir", "onnx", or a registered one's)."""
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
    '.safetensors or .pt or .gguf or .zarr or .h5 or .onnx'
    """
    return sep.join(f.suffixes[0] for f in FORMATS if f.writes and has(f))

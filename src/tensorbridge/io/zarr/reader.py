"""Reading Zarr v3 stores: :class:`ZarrFile`, confined to the store and bounded.

A store's arrays are read whole into memory when asked for, through a read-only zarr
store that reads only regular files inside the store (:func:`_confined_store`), and
never more than the chunk files can account for (:data:`MAX_FILL_BYTES`,
:data:`MAX_FILL_CHUNKS`); a store replaced since it was opened is refused. The layout
is described in :mod:`tensorbridge.io.zarr`.
"""

from __future__ import annotations

import functools
import json
import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..._commit import require_committed
from ..._filemap import check_same_version, identity
from ..._files import Links, physical_memory, read_regular
from ..._tensorfile import TensorFile
from ...dtypes import DTypeRow
from ...errors import FormatError, UnsupportedDtypeError
from .._common import loader
from .store import GROUP_FILE, MAX_NODE_JSON, RESERVED, require_zarr, store_kind

if TYPE_CHECKING:
    import zarr as zarr_module

__all__ = ["MAX_FILL_BYTES", "MAX_FILL_CHUNKS", "ZarrFile", "load", "open"]

MAX_FILL_BYTES = 64 << 20  # what a read may make up from fill_value beyond the chunk files
MAX_FILL_CHUNKS = 1024  # absent chunks a read may fill (zarr looks up each one)


class ZarrFile(TensorFile):
    """A Zarr v3 store: its arrays by name, read whole into memory when asked.

    A group gives its arrays (in the order tensorbridge saved them, else by name) and
    its attributes as metadata; a bare array is one entry named after its directory.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_fill_bytes: int | None = MAX_FILL_BYTES,
        follow_links: bool = False,
    ) -> None:
        super().__init__()
        zarr = require_zarr()
        p = Path(path)
        self.path = p
        self.max_fill_bytes = max_fill_bytes
        self.follow_links = follow_links
        where = repr(str(p))
        links = Links.of(p, follow=follow_links)
        try:  # the version opened: a save replaces the store's zarr.json with the store
            self._version = identity(os.stat(p / GROUP_FILE))
        except OSError:
            self._version = (0, 0, 0, 0)
        kind = store_kind(p)
        if kind is None:
            if os.path.lexists(p / GROUP_FILE):  # a FIFO, a device, a link out: say which
                links.read(p / GROUP_FILE, MAX_NODE_JSON, GROUP_FILE)
            require_committed(p, GROUP_FILE, "Zarr store")  # raises: uncommitted, or missing
            raise FormatError(f"{where}: its {GROUP_FILE} is no Zarr v3 group or array")
        store = _confined_store(p, links)
        self._arrays: dict[str, Any] = {}
        self._values: dict[str, Any] = {}
        self._saved: dict[str, Any] = {}
        try:
            if kind == "array":
                self.single = True
                self._arrays[p.name.removesuffix(".zarr") or "x"] = zarr.open_array(
                    store, mode="r", zarr_format=3
                )
                return
            group = zarr.open_group(store, mode="r", zarr_format=3)
            attrs = dict(group.attrs)
            saved = attrs.pop(RESERVED, None)
            order = saved.get("keys") if isinstance(saved, dict) else None
            names = (
                list(order)
                if isinstance(order, list) and all(isinstance(n, str) for n in order)
                else sorted(group.array_keys())
            )
            for name in names:
                if "\x00" in name or any(len(part.encode()) > 255 for part in name.split("/")):
                    raise FormatError(  # checked first: such a name is no path at all
                        f"{where}: the group lists the array {name[:80]!r}, which is no "
                        "valid file name; its zarr.json is corrupt"
                    )
                node = group[name]
                if not isinstance(node, zarr.Array):
                    raise FormatError(
                        f"{where}: {name!r} is a Zarr group, not an array; tensorbridge "
                        "reads a group of arrays (open the subgroup's directory itself)"
                    )
                self._arrays[name] = node
        except FormatError:
            raise
        except (KeyError, ValueError, TypeError, RecursionError, ArithmeticError) as err:
            raise FormatError(f"{where}: not a readable Zarr v3 store: {err}") from None
        self._values = attrs
        self._saved = saved if isinstance(saved, dict) else {}
        self._check_version()  # the documents read are all of the version opened
        self.metadata = {k: v if isinstance(v, str) else json.dumps(v) for k, v in attrs.items()}

    def keys(self) -> list[str]:
        return list(self._arrays)

    def plain_values(self) -> dict[str, Any]:
        return dict(self._values)

    def saved_attributes(self) -> dict[str, Any]:
        """What tensorbridge recorded for itself in the group (the tensors' order, ...)."""
        return dict(self._saved)

    def _get(self, name: str) -> Any:
        if name not in self._arrays:
            raise KeyError(f"{name!r} is not in this file; its keys are {self.keys()[:10]}")
        return self._arrays[name]

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        from ...dtypes import resolve_dtype

        array = self._get(name)
        try:
            row = resolve_dtype(array.dtype.newbyteorder("="))
        except UnsupportedDtypeError:
            raise UnsupportedDtypeError(
                f"{str(self.path)!r}: array {name!r} holds {array.dtype}, which has no torch "
                "counterpart; read it with zarr directly"
            ) from None
        return row, tuple(int(n) for n in array.shape)

    def array(self, name: str) -> zarr_module.Array[Any]:
        """The zarr array itself, for reading regions (``f.array(name)[0:10]``).

        It reads the store's chunk files as they are when read: unlike ``f[name]``, it
        cannot tell whether another save replaced the store since it was opened.
        """
        array: zarr_module.Array[Any] = self._get(name)
        return array

    def _check_version(self) -> None:
        """Refuse to read on once the store was replaced since it was opened.

        A store is a directory of chunk files, read when asked for: they cannot all be
        held open. A save replaces the group's ``zarr.json`` (with the whole store, or
        last), so a read followed by this check that passes read the version opened.
        """
        check_same_version(self.path / GROUP_FILE, self._version, repr(str(self.path)))

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        a = self._owned(name)
        a.flags.writeable = copy_on_write
        return a

    def _owned(self, name: str) -> np.ndarray:
        self.info(name)  # refuses what has no row before reading anything
        # zarr fills absent chunks with fill_value (a store written with
        # write_empty_chunks=False has none for a zero tensor), so the declared shape,
        # not the chunk files, sets what a read allocates: refuse what no read could hold
        nbytes = self.nbytes(name)
        if nbytes > physical_memory():
            raise FormatError(
                f"{str(self.path)!r}: array {name!r} declares {nbytes:,} bytes, more than "
                "this machine's memory; its zarr.json is corrupt (or read it in regions "
                "with f.array(name)[...])"
            )
        self._check_fill(name, nbytes)
        self._check_version()
        try:
            out: np.ndarray = np.asarray(self._get(name)[...])
        except FormatError:  # a chunk that is a FIFO, a device, a link out of the store
            raise
        except (ValueError, TypeError, KeyError, IndexError, ArithmeticError) as err:
            self._check_version()  # a store replaced while read is no corrupt one
            # zarr's codecs and indexers say so (a chunk of 0 elements divides by zero)
            raise FormatError(
                f"{str(self.path)!r}: array {name!r}: its chunks do not match its zarr.json "
                f"({err}); the store is corrupt"
            ) from None
        self._check_version()  # chunks of a store replaced meanwhile may be in ``out``
        if not out.dtype.isnative:
            out = out.astype(out.dtype.newbyteorder("="))
        return out

    def _check_fill(self, name: str, nbytes: int) -> None:
        """Refuse a read that zarr would mostly make up from ``fill_value``.

        An absent chunk reads as ``fill_value``, so a ``zarr.json`` declaring a large
        shape over few chunk files makes a read allocate far more than the store
        holds, and a fine chunk grid makes zarr look up each absent chunk (about
        0.3 ms apiece: a few bytes of JSON can ask for millions). zarr's own writers
        skip chunks equal to the fill value by default (``write_empty_chunks=False``),
        so a sparse store can be genuine; tensorbridge writes every chunk. The bytes
        the chunk files can account for (each file at most one chunk, or one shard)
        may be exceeded by ``max_fill_bytes``, and their count by
        ``MAX_FILL_CHUNKS``, no more.
        """
        limit = self.max_fill_bytes
        if limit is None:
            return
        array = self._get(name)
        outer = array.shards or array.chunks
        grid = math.prod(-(-n // max(c, 1)) for n, c in zip(array.shape, outer, strict=True))
        if nbytes <= limit and grid <= MAX_FILL_CHUNKS:
            return
        chunk_bytes = max(1, math.prod(outer) * array.dtype.itemsize)
        root = self.path if getattr(self, "single", False) else self.path / name
        files = 0
        for _, _, names in os.walk(root):
            files += sum(1 for f in names if f != GROUP_FILE)
            if nbytes - files * chunk_bytes <= limit and grid - files <= MAX_FILL_CHUNKS:
                return
        sparse = (
            "if the store is sparse by design (zarr's write_empty_chunks=False), read it "
            "with tensorbridge.io.zarr.open(path, max_fill_bytes=None), else its zarr.json "
            "is corrupt"
        )
        if grid - files > MAX_FILL_CHUNKS:
            raise FormatError(
                f"{str(self.path)!r}: array {name!r} declares {grid:,} chunks but the store "
                f"holds {files:,} chunk file{'s' if files != 1 else ''}: zarr would look up "
                f"each absent one; {sparse}"
            )
        raise FormatError(
            f"{str(self.path)!r}: array {name!r} declares {nbytes:,} bytes but its chunk "
            f"files hold at most {files * chunk_bytes:,}: zarr would fill the rest with its "
            f"fill_value; {sparse}"
        )


def _confined_store(path: Path, links: Links) -> Any:
    """A read-only zarr store of ``path`` that reads only regular files inside it.

    zarr's ``LocalStore`` reads a key with ``Path.read_bytes()``: a chunk or a
    ``zarr.json`` that is ``/dev/zero`` is read until memory runs out, a FIFO hangs
    the read, a link is followed anywhere. This store reads each key through
    :class:`~tensorbridge._files.Links` (a regular file, confined to the store
    unless links are followed) and by the bytes it holds.
    """
    return _store_class()(path, links)


@functools.cache
def _store_class() -> Any:
    import asyncio

    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage import LocalStore

    def read(links: Links, path: Path, byte_range: Any) -> bytes | None:
        try:
            f = links.open(path)
        except (FileNotFoundError, NotADirectoryError):
            return None  # an absent chunk: zarr fills it with the fill value
        with f:
            size = os.fstat(f.fileno()).st_size
            if byte_range is None:
                limit = MAX_NODE_JSON if path.name == GROUP_FILE else size
                return read_regular(f, path, limit, f"Zarr {path.name} ({size:,} bytes)")
            if isinstance(byte_range, RangeByteRequest):
                start, n = byte_range.start, byte_range.end - byte_range.start
            elif isinstance(byte_range, OffsetByteRequest):
                start, n = byte_range.offset, size - byte_range.offset
            elif isinstance(byte_range, SuffixByteRequest):
                start = max(0, size - byte_range.suffix)
                n = size - start
            else:  # pragma: no cover - zarr's three kinds of request
                raise FormatError(f"{path}: an unknown byte range {byte_range!r}")
            f.seek(max(0, start))
            return f.read(max(0, min(n, size - start)))

    class ConfinedStore(LocalStore):
        def __init__(self, root: Path, links: Links) -> None:
            super().__init__(root, read_only=True)
            self.links = links

        def with_read_only(self, read_only: bool = False) -> Any:
            return type(self)(self.root, self.links)

        async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
            prototype = prototype or default_buffer_prototype()
            if not self._is_open:
                await self._open()
            data = await asyncio.to_thread(read, self.links, self.root / key, byte_range)
            return None if data is None else prototype.buffer.from_bytes(data)

        async def get_partial_values(self, prototype: Any, key_ranges: Any) -> list[Any]:
            return [await self.get(key, prototype, r) for key, r in key_ranges]

    return ConfinedStore


def open(
    path: str | os.PathLike[str],
    *,
    max_fill_bytes: int | None = MAX_FILL_BYTES,
    follow_links: bool = False,
) -> TensorFile:
    """Open a Zarr v3 store (a group of arrays, or one array) lazily.

    Reading an array whose chunk files account for less than its declared size by
    more than ``max_fill_bytes`` (zarr fills absent chunks with the fill value) raises
    :class:`~tensorbridge.errors.FormatError`; ``max_fill_bytes=None`` reads sparse
    stores (zarr skips chunks equal to the fill value by default) whatever they
    declare. A ``zarr.json`` or chunk that is a link leading out of the store raises
    :class:`~tensorbridge.errors.LinkError` unless ``follow_links=True``.

    >>> import os, tempfile, numpy as np
    >>> p = os.path.join(tempfile.mkdtemp(), "s.zarr")
    >>> save({"a": np.arange(3)}, p)
    >>> with open(p) as f:
    ...     f.keys(), f.info("a")[1]
    (['a'], (3,))

    Raises:
        UncommittedCheckpointError: a save into ``path`` never committed.
        FormatError: ``path`` is no Zarr v3 store.
    """
    return ZarrFile(path, max_fill_bytes=max_fill_bytes, follow_links=follow_links)


load = loader(
    open,
    """Read a Zarr store: a dict of its arrays (or tensors) by name.

    Arrays are read into memory (chunks are files); with ``mmap=True`` NumPy results
    are read-only, as every format's are.
    """,
)

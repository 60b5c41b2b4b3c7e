"""Reading HDF5 files: :class:`HDF5File` (datasets mapped where stored plainly, else read
through h5py, every size checked against the bytes the file holds).

The format and what reading promises are in :mod:`tensorbridge.io.hdf5`; which table row
an HDF5 datatype holds is decided in :mod:`.datatypes`. The file is opened once: h5py
reads it through that descriptor (its file-object driver), the zero-copy views map it,
so one handle reads one version of the file, and a ``.keras`` archive's weights are
read in place, as a window of the archive.
"""

from __future__ import annotations

import contextlib
import json
import math
import mmap
import os
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..._filemap import check_unchanged, open_reader, read_at
from ..._files import physical_memory
from ..._tensorfile import TensorFile
from ...dtypes import DTypeLike, DTypeRow, resolve_dtype
from ...errors import FormatError, TensorBridgeError, UnsupportedDtypeError
from .._common import loader
from .._detect import ZIP_ERRORS
from .._format_rows import HDF5 as ROW
from .datatypes import MARKER, Stored, plain_type, require_h5py, stored_type
from .headers import attribute_lengths
from .source import DEFLATE_RATIO, open_source

__all__ = ["DEFLATE_RATIO", "FILTERS", "MAX_DEPTH", "MAX_FILL_BYTES", "HDF5File", "load", "open"]

MAX_FILL_BYTES = 4 << 20  # what a read may make up (fill values) beyond the stored bytes
MAX_DEPTH = 256  # groups nested deeper are refused (a walk of a corrupt file ends)
# HDF5's own filters (deflate, shuffle, fletcher32, szip, nbit, scaleoffset) and h5py's
# lzf; any other id names a plugin HDF5 would load from its plugin path to run it
FILTERS = frozenset({1, 2, 3, 4, 5, 6, 32000})
_MAX_ATTRIBUTE = 16 << 20  # one attribute's bytes, read as metadata
_MAX_MARKER = 64  # a dtype attribute longer than this names no type


@dataclass(frozen=True)
class _Entry:
    """What a dataset is, from its header: its type, shape and where its bytes are."""

    stored: Stored
    shape: tuple[int, ...]
    offset: int | None  # contiguous, unfiltered, allocated: its bytes in the window
    storage: int  # the bytes the file allocates for it (chunks as stored)
    filtered: bool

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.stored.row.itemsize


class HDF5File(TensorFile):
    """An HDF5 file: every dataset under its path (``group/sub/name``), attributes as metadata.

    A contiguous, uncompressed dataset is a read-only view of the mapped file
    (torch: copy-on-write); a chunked, compressed or compact one is read through h5py
    into new memory. Opening reads the superblock alone; the names are listed, and
    each dataset's header read, when first asked for.
    """

    _text: dict[str, str] | None = None  # the attributes as text, made when first asked for

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dtype: DTypeLike | None = None,
        max_fill_bytes: int | None = MAX_FILL_BYTES,
    ) -> None:
        super().__init__()
        h5py = require_h5py()
        self.path = Path(path)
        self._where = repr(str(self.path))
        self._raw = _raw_row(dtype)
        self.max_fill_bytes = max_fill_bytes
        self._fd, self._file_size = open_reader(self.path)
        self._open: list[Any] = []  # what close() releases: h5py's file, an archive
        # closed with this object, or at exit while the file object h5py reads is alive
        # (h5py's file-object driver crashes the interpreter's teardown otherwise)
        self._closer = weakref.finalize(self, _release, self._open, self._fd)
        self._maps: dict[bool, Any] = {}
        self._lengths: dict[int, dict[str, int] | None] = {}  # header address -> attributes'
        self._names: dict[str, bytes] | None = None  # name -> its path in the file, walked
        self._groups: list[tuple[str, bytes]] = []  # the groups walked, the root first
        self._entries: dict[str, _Entry] = {}
        self._meta: dict[str, Any] | None = None  # the attributes, typed
        try:
            source = open_source(self._fd, self._file_size, self._where, ROW.zip_members)
            self._open.append(source.archive)
            self._read, self._layout = source.file.raw, source.file.layout
            self._where, self._start, self._size = source.where, source.start, source.size
            with self._errors():
                self._h5 = h5py.File(source.file, "r")
            self._open.insert(0, self._h5)
        except BaseException:
            self.close()
            raise

    @contextlib.contextmanager
    def _errors(self, what: str = "") -> Iterator[None]:
        """h5py's and HDF5's errors on a damaged file become :class:`FormatError`."""
        try:
            yield
        except TensorBridgeError:
            raise
        except (OSError, ValueError, KeyError, RuntimeError, TypeError, IndexError,
                OverflowError, SystemError, RecursionError, *ZIP_ERRORS) as err:  # fmt: skip
            raise FormatError(
                f"{self._where}{what}: HDF5 cannot read it ({str(err) or type(err).__name__}); "
                "the file is truncated or corrupt"
            ) from None

    # --- names ------------------------------------------------------------------------------

    def keys(self) -> list[str]:
        return list(self._walk())

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self._lookup(name) is not None

    def _walk(self) -> dict[str, bytes]:
        """Every dataset reached through hard links, in each group's order (creation order
        where the group tracks it, else by name); soft and external links are not followed."""
        if self._names is not None:
            return self._names
        h5py = require_h5py()
        h5g, h5l, h5o = h5py.h5g, h5py.h5l, h5py.h5o
        names: dict[str, bytes] = {}
        first: dict[int, str] = {}  # a dataset's address -> its first name (ties)
        skipped: list[str] = []
        groups = [("", b"/")]
        with self._errors():
            root = h5g.open(self._h5.id, b"/")  # a group: the file's id has no link order
            seen = {h5o.get_info(root).addr}
            stack = [(b"", root, iter(_children(root)))]
            while stack:
                prefix, gid, children = stack[-1]
                child = next(children, None)
                if child is None:
                    stack.pop()
                    continue
                link, kind = child
                path = prefix + link
                name = path.decode("utf-8", "surrogateescape")
                if kind != h5l.TYPE_HARD:
                    skipped.append(name)
                    continue
                obj = h5o.get_info(gid, link)
                if obj.type == h5o.TYPE_DATASET:
                    names[name] = path
                    tied = first.setdefault(obj.addr, name)
                    if tied != name:
                        self.aliases[name] = tied
                elif obj.type == h5o.TYPE_GROUP and obj.addr not in seen:
                    seen.add(obj.addr)
                    groups.append((name, path))
                    if len(stack) >= MAX_DEPTH:
                        raise FormatError(f"{self._where}: groups nest deeper than {MAX_DEPTH}")
                    sub = h5g.open(gid, link)
                    stack.append((path + b"/", sub, iter(_children(sub))))
        if skipped:
            self.notes.append(
                f"{self.filename}: {len(skipped)} soft or external link(s) not followed "
                f"({', '.join(skipped[:3])}); their targets are read under their own names"
            )
        self._names, self._groups = names, groups
        return names

    def _lookup(self, name: str) -> bytes | None:
        """``name``'s path in the file when it names a dataset through hard links only."""
        if self._names is not None:
            return self._names.get(name)
        h5py = require_h5py()
        path = name.encode("utf-8", "surrogateescape")
        parts = path.split(b"/")
        if not all(parts) or b"." in parts:
            return None
        with self._errors():
            gid = self._h5.id
            for i, part in enumerate(parts):
                links = gid.links
                if not links.exists(part) or links.get_info(part).type != h5py.h5l.TYPE_HARD:
                    return None
                kind = h5py.h5o.get_info(gid, part).type
                if i == len(parts) - 1:
                    return path if kind == h5py.h5o.TYPE_DATASET else None
                if kind != h5py.h5o.TYPE_GROUP:
                    return None
                gid = h5py.h5g.open(gid, part)
        return None

    def _dataset(self, name: str) -> Any:
        path = self._lookup(name)
        if path is None:
            raise KeyError(f"{name!r} is not in this file; its keys are {self.keys()[:10]}")
        with self._errors(f", dataset {name!r}"):
            return require_h5py().h5d.open(self._h5.id, path)

    # --- a dataset's header -----------------------------------------------------------------

    def _entry(self, name: str) -> _Entry:
        cached = self._entries.get(name)
        if cached is not None:
            return cached
        h5py = require_h5py()
        h5d, h5t = h5py.h5d, h5py.h5t
        where = f"{self._where}: dataset {name!r}"
        dsid = self._dataset(name)
        with self._errors(f", dataset {name!r}"):
            tid = dsid.get_type()
            marker = self._marker(h5py.Dataset(dsid)) if tid.get_class() == h5t.OPAQUE else None
            dcpl = dsid.get_create_plist()
            layout = dcpl.get_layout()
            external = dcpl.get_external_count() if layout == h5d.CONTIGUOUS else 0
            space = dsid.get_space()
            null = space.get_simple_extent_type() == h5py.h5s.NULL
            shape = None if null else tuple(int(n) for n in space.shape)
            n = dcpl.get_nfilters() if layout == h5d.CHUNKED else 0
            filters = [int(dcpl.get_filter(i)[0]) for i in range(n)]
            filtered = bool(filters)
            storage = int(dsid.get_storage_size())
            offset = dsid.get_offset() if layout == h5d.CONTIGUOUS and not external else None
        if layout == getattr(h5d, "VIRTUAL", 3) or external:
            raise UnsupportedDtypeError(
                f"{where} keeps its data in other files (a virtual dataset or external "
                "storage); tensorbridge reads only the file opened: read it with h5py"
            )
        plugins = [f for f in filters if f not in FILTERS]
        if plugins:
            raise UnsupportedDtypeError(
                f"{where} is compressed by HDF5 filter {plugins[0]}, a plugin library the "
                "file would choose to run; read it with h5py where that plugin is installed"
            )
        if shape is None:
            raise UnsupportedDtypeError(f"{where} has a null dataspace: it holds no array")
        stored = stored_type(tid, marker, self._raw, where)
        entry = _Entry(stored, shape, None if offset is None else int(offset), storage, filtered)
        if entry.offset is not None and entry.storage == entry.nbytes > 0:
            end = entry.offset + entry.nbytes
            if entry.offset < 0 or end > self._size:
                raise FormatError(
                    f"{where}: its bytes {entry.offset}..{end} lie outside the file's "
                    f"{self._size} bytes; the file is truncated or corrupt"
                )
        self._entries[name] = entry
        return entry

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        e = self._entry(name)
        return e.stored.row, e.shape

    def layout(self, name: str) -> dict[str, Any]:
        """How ``name`` is stored: ``{"mapped": ..., "offset": ..., "storage": ...,
        "filtered": ..., "big_endian": ...}`` (``mapped``: read as a view of the file)."""
        e = self._entry(name)
        return {
            "mapped": self._mappable(e),
            "offset": e.offset,
            "storage": e.storage,
            "filtered": e.filtered,
            "big_endian": e.stored.big_endian,
        }

    def _mappable(self, e: _Entry) -> bool:
        return (
            self._start is not None
            and e.offset is not None
            and e.storage == e.nbytes
            and e.stored.view_dtype is not None
        )

    # --- the data ---------------------------------------------------------------------------

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        e = self._entry(name)
        if e.nbytes == 0:
            out = np.empty(e.shape, e.stored.row.numpy)
            out.flags.writeable = copy_on_write
            return out
        if not self._mappable(e):
            out = self._owned(name)
            out.flags.writeable = copy_on_write
            return out
        assert e.offset is not None and self._start is not None and e.stored.view_dtype is not None
        buf = self._map(copy_on_write)
        count = math.prod(e.shape)
        a = np.frombuffer(buf, e.stored.view_dtype, count, self._start + e.offset)
        return a.reshape(e.shape)

    def _owned(self, name: str) -> np.ndarray:
        e = self._entry(name)
        if e.nbytes == 0:
            return super()._owned(name)
        if self._mappable(e):  # read straight in: no page of the map touched
            assert e.offset is not None and self._start is not None
            assert e.stored.view_dtype is not None
            if not self._closer.alive:
                raise ValueError(f"{self._where} is closed; open it again")
            check_unchanged(self._fd, self._file_size, self._where)
            out = np.empty(e.shape, e.stored.view_dtype)
            read_at(self._fd, out, self._start + e.offset, self._where)
            return out
        self._check_fill(name, e)
        buf = np.empty(e.shape, np.dtype((np.void, e.stored.row.itemsize)))
        h5s = require_h5py().h5s
        dsid = self._dataset(name)
        with self._errors(f", dataset {name!r}"):
            dsid.read(h5s.ALL, h5s.ALL, buf, mtype=dsid.get_type())
        if e.stored.big_endian and e.stored.unit > 1:  # each number's bytes swapped in place
            buf.reshape(-1).view(f"u{e.stored.unit}").byteswap(inplace=True)
        return buf.view(e.stored.row.numpy)

    def _check_fill(self, name: str, e: _Entry) -> None:
        """Refuse a read whose size the stored bytes cannot account for.

        HDF5 makes up unwritten data from the fill value (a dataset created and never
        written allocates nothing), so a few header bytes can declare any size: a read
        may exceed what its stored bytes hold (times :data:`DEFLATE_RATIO` when filtered,
        never more than the file) by ``max_fill_bytes``, no more.
        """
        stored = min(e.storage, self._size) * (DEFLATE_RATIO if e.filtered else 1)
        limit = self.max_fill_bytes
        if e.nbytes > physical_memory() or (limit is not None and e.nbytes > stored + limit):
            raise FormatError(
                f"{self._where}: dataset {name!r} declares {e.nbytes:,} bytes but stores "
                f"{e.storage:,}: HDF5 would make up the rest from its fill value; if it is "
                "sparse by design, open it with tensorbridge.io.hdf5.open(path, "
                "max_fill_bytes=None), else the file is corrupt"
            )

    def _map(self, copy_on_write: bool) -> Any:
        if not self._closer.alive:
            raise ValueError(f"{self._where} is closed; open it again")
        check_unchanged(self._fd, self._file_size, self._where)
        mm = self._maps.get(copy_on_write)
        if mm is None:
            access = mmap.ACCESS_COPY if copy_on_write else mmap.ACCESS_READ
            mm = self._maps[copy_on_write] = mmap.mmap(self._fd, 0, access=access)
        return mm

    # --- attributes -------------------------------------------------------------------------

    @property
    def metadata(self) -> dict[str, str]:
        """Every attribute as text (JSON for non-strings): the root's by name, another
        object's as ``path@name`` (``layers/dense/vars@name``); read when first asked for."""
        if self._text is None:
            self._text = {
                k: v if isinstance(v, str) else _text(v) for k, v in self._attributes().items()
            }
        return self._text

    @metadata.setter
    def metadata(self, value: dict[str, str]) -> None:
        self._text = value or None  # TensorFile.__init__'s {}: read when first asked for

    def plain_values(self) -> dict[str, Any]:
        """Every attribute typed: str, bool, int, float, lists of them (arrays)."""
        return dict(self._attributes())

    def _attributes(self) -> dict[str, Any]:
        if self._meta is not None:
            return self._meta
        out: dict[str, Any] = {}
        unread: list[str] = []
        datasets = self._walk()
        with self._errors():
            for name, path in [*self._groups, *datasets.items()]:
                obj = self._h5[path]
                marked = name in datasets and self._is_marked(name)
                for key in obj.attrs:
                    if marked and key == MARKER:  # the type's name, not metadata
                        continue
                    # h5py gives a name that is no UTF-8 as bytes
                    text = key if isinstance(key, str) else key.decode("utf-8", "surrogateescape")
                    what = f"{name}@{text}" if name else text
                    if self._readable(obj, key, self._size):
                        out[what] = self._attribute(obj, key, name)
                    else:
                        unread.append(what)
        if unread:
            self.notes.append(
                f"{self.filename}: {len(unread)} attribute(s) of variable-length sequences, "
                "references or times, or of strings whose stated lengths pass the file, not "
                f"read as metadata ({', '.join(unread[:3])})"
            )
        self._meta = out
        return out

    def _is_marked(self, name: str) -> bool:
        try:
            return self._entry(name).stored.marked
        except UnsupportedDtypeError:
            return False

    def _marker(self, ds: Any) -> str | None:
        """The dataset's :data:`MARKER` attribute when it is one short string, else None."""
        if MARKER not in ds.attrs:
            return None
        aid = ds.attrs.get_id(MARKER)
        if aid.shape not in ((), (1,)) or aid.get_type().get_class() != require_h5py().h5t.STRING:
            return None
        if not self._readable(ds, MARKER, _MAX_MARKER):
            return None
        value = _plain(ds.attrs[MARKER])
        value = value[0] if isinstance(value, list) else value
        return value if isinstance(value, str) and len(value) <= _MAX_MARKER else None

    def _readable(self, obj: Any, key: str, longest: int) -> bool:
        """Whether h5py may read attribute ``key`` of ``obj``: a plain type, and, for
        variable-length strings, every length its object header states at most ``longest``
        (HDF5 allocates a stated length before it reads: :mod:`.headers`)."""
        tid = obj.attrs.get_id(key).get_type()
        if not plain_type(tid):
            return False
        if tid.get_class() != require_h5py().h5t.STRING or not tid.is_variable_str():
            return True
        addr = require_h5py().h5o.get_info(obj.id).addr
        if addr not in self._lengths:
            self._lengths[addr] = attribute_lengths(self._read, self._layout, addr)
        lengths = self._lengths[addr]
        text = key if isinstance(key, str) else key.decode("utf-8", "surrogateescape")
        return lengths is not None and lengths.get(text, longest + 1) <= longest

    def _attribute(self, obj: Any, key: str, name: str) -> Any:
        aid = obj.attrs.get_id(key)
        declared = math.prod(aid.shape or ()) * aid.dtype.itemsize
        if declared > max(_MAX_ATTRIBUTE, 2 * aid.get_storage_size()):
            raise FormatError(
                f"{self._where}: attribute {key!r} of {name or '/'} declares {declared:,} "
                f"bytes but stores {aid.get_storage_size():,}; the file is corrupt"
            )
        return _plain(obj.attrs[key])

    # --- closing ----------------------------------------------------------------------------

    def close(self) -> None:
        """Release the file; arrays already handed out keep their mapping alive."""
        self._maps.clear()
        self._closer()

    def __enter__(self) -> HDF5File:
        return self

    def __repr__(self) -> str:
        return f"<HDF5File {self._where}>"


def _release(opened: list[Any], fd: int) -> None:
    """Close h5py's file (before the file object it reads), an archive, the descriptor."""
    for obj in opened:
        if obj is not None:
            with contextlib.suppress(Exception):
                obj.close()
    os.close(fd)


def _children(gid: Any) -> list[tuple[bytes, int]]:
    """A group's links (name, link type) in its order: creation order where it is tracked."""
    h5py = require_h5py()
    tracked = gid.get_create_plist().get_link_creation_order() & h5py.h5p.CRT_ORDER_TRACKED
    index = h5py.h5.INDEX_CRT_ORDER if tracked else h5py.h5.INDEX_NAME
    out: list[tuple[bytes, int]] = []
    gid.links.iterate(lambda n, i: out.append((n, i.type)), info=True, idx_type=index)
    return out


def _plain(value: Any) -> Any:
    """An attribute's value as plain Python: str, bool, int, float, lists; bytes decoded."""
    if isinstance(value, require_h5py().Empty):  # a null dataspace: no value
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    if isinstance(value, np.ndarray):
        if value.dtype.kind == "V":  # opaque or compound values: their bytes
            return value.tobytes().hex()
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return _plain(value.item())
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    return str(value)


def _text(value: Any) -> str:
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return str(value)


def _raw_row(dtype: DTypeLike | None) -> DTypeRow | None:
    """The row ``dtype=`` names for opaque data without a marker (None: not given)."""
    if dtype is None:
        return None
    row = resolve_dtype(dtype)
    if not row.carried:
        raise UnsupportedDtypeError(
            f"dtype={dtype!r} names the type of opaque HDF5 data (bytes h5py writes for an "
            "ml_dtypes array), so it is bfloat16, a float8 type or complex32; to cast values "
            "pass float_dtype="
        )
    return row


def open(
    path: str | os.PathLike[str],
    *,
    dtype: DTypeLike | None = None,
    max_fill_bytes: int | None = MAX_FILL_BYTES,
) -> HDF5File:
    """Open an HDF5 file (``.h5``, ``.hdf5``, Keras ``.weights.h5``) or a ``.keras``
    archive's weights lazily.

    ``dtype`` names the type of opaque datasets without a ``dtype`` attribute (what
    h5py writes for an ml_dtypes array). A read that HDF5 would mostly make up from
    the fill value (more than ``max_fill_bytes`` beyond the stored bytes) raises
    :class:`~tensorbridge.errors.FormatError`; ``max_fill_bytes=None`` reads it.

    >>> import os, tempfile, numpy as np
    >>> from tensorbridge.io.hdf5 import save
    >>> p = os.path.join(tempfile.mkdtemp(), "w.h5")
    >>> save({"enc/w": np.arange(6, dtype=np.int16).reshape(2, 3)}, p)
    >>> with open(p) as f:
    ...     f.keys(), f["enc/w"].tolist(), f.layout("enc/w")["mapped"]
    (['enc/w'], [[0, 1, 2], [3, 4, 5]], True)

    Raises:
        FormatError: the file is no readable HDF5 file (truncated, corrupt).
        MissingExtraError: h5py is not installed.
    """
    return HDF5File(path, dtype=dtype, max_fill_bytes=max_fill_bytes)


load = loader(
    open,
    """Every dataset (or ``keys``) of an HDF5 file, by path.

    With ``mmap=True`` NumPy results of contiguous datasets are read-only views of the
    mapped file and torch results copy-on-write; other datasets are read into memory.
    """,
)

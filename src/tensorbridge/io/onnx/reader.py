"""Reading ONNX models: :class:`OnnxFile`, the initializers of a mapped ``ModelProto``.

The format and what reading promises are in :mod:`tensorbridge.io.onnx`; the wire
format and the model's walk are :mod:`.wire`'s, the data types and their storage
:mod:`.data_types`'. This module holds the reader: the model file mapped, every entry
checked when the file is opened (sizes against the bytes present, external files
confined to the model's directory), values handed out as views of the maps where the
bytes are the values, and decoded into new memory where they are not (typed fields,
packed types).
"""

from __future__ import annotations

import math
import mmap as _mmap
import os
import weakref
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from ..._filemap import array_at, check_unchanged, read_at
from ..._files import Links, open_regular
from ..._packed import PSEUDO_ROWS
from ..._tensorfile import TensorFile, cast_target
from ...dtypes import BY_NUMPY, PACKED_BY_NUMPY, DeviceLike, DTypeLike, DTypeRow, explain_numpy
from ...errors import FormatError, InvalidArgumentError, LinkError, UnsupportedDtypeError
from .._common import loader
from . import wire
from .data_types import BY_CODE, STRING, DataType, decode, raw_nbytes
from .data_types import entries as typed_entries
from .data_types import unpack as _unpack

__all__ = ["MAX_MODEL_BYTES", "OnnxFile", "load", "open", "row_of_type"]

_RECENT = 1024  # records kept parsed: a whole read of a model of as many parses each once
# protobuf refuses to parse or serialize a message of 2 GiB or more (INT_MAX bytes)
MAX_MODEL_BYTES = (1 << 31) - 1
EXTERNAL = 1  # TensorProto.DataLocation.EXTERNAL


def _category(t: DataType) -> Any:
    return "uint" if t.name.startswith("UINT") else "int" if t.name.startswith("INT") else "float"


def row_of_type(t: DataType) -> DTypeRow:
    """The dtype row an ONNX type reads as: the table's (INT4 ... FLOAT6 included); a row
    of the type alone where the installed ml_dtypes has the type but the table no row."""
    dt = t.numpy
    row = BY_NUMPY.get(dt)
    if row is not None:
        return row
    packed = PACKED_BY_NUMPY.get(dt)
    if packed is not None and packed in PSEUDO_ROWS:
        return PSEUDO_ROWS[packed]
    if t.code not in _UNTABLED:
        _UNTABLED[t.code] = DTypeRow(t.numpy_name, dt.itemsize, None, _category(t), carried=True)
    return _UNTABLED[t.code]


_UNTABLED: dict[int, DTypeRow] = {}


class OnnxFile(TensorFile):
    """An ONNX model's initializers, read from the mapped file; nothing loaded until asked.

    ``[name]`` is a read-only NumPy view of the model file (``raw_data``) or of its
    external data file where the stored bytes are the values; typed fields and packed
    types (INT4 ... FLOAT6, one value a byte) are decoded into new memory.
    ``.get(name, framework="torch")`` gives a copy-on-write tensor over the map.

    Attributes:
        metadata: the model's ``metadata_props``.
        ir_version: the ONNX IR version; opsets: ``{domain: version}``; producer: the
            producer's name and version.
        constants / sparse: whether ``Constant`` nodes' values / sparse initializers are
            read (``open(..., constants=True, sparse=True)``).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        follow_links: bool = False,
        constants: bool = False,
        sparse: bool = False,
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.follow_links, self.constants, self.sparse = follow_links, constants, sparse
        self._where = repr(str(self.path))
        with open_regular(self.path) as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                raise FormatError(f"{self._where} is empty; it is no ONNX model")
            if size > MAX_MODEL_BYTES:
                raise FormatError(
                    f"{self._where} is {size:,} bytes, over protobuf's 2 GiB limit on a "
                    "message, so no ONNX tool can parse it; a model this large keeps its "
                    "weights as external data (onnx.save_model(..., save_as_external_data=True))"
                )
            self._map = _mmap.mmap(fh.fileno(), 0, access=_mmap.ACCESS_READ)
            self._fd = os.dup(fh.fileno())  # for the copy-on-write map, if torch asks
        self._fds = [self._fd]
        self._close = weakref.finalize(self, _close_all, self._fds)
        self._cow: _mmap.mmap | None = None
        self._links = Links.of(self.path, follow=follow_links)
        self._files: dict[str, tuple[Path, int]] = {}  # location -> confined path, size
        self._maps: dict[tuple[str, bool], Any] = {}  # (location, cow) -> its map
        self._descriptors: dict[str, int] = {}  # location -> its open file
        self._recent: dict[str, wire.Record] = {}  # the records last parsed, oldest first
        try:
            self._read_header(size)
        except BaseException:
            self._close()
            raise

    def _read_header(self, size: int) -> None:
        try:
            header = wire.model_header(self._map, size)
        except FormatError as e:
            raise FormatError(f"{self._where}: the ModelProto is malformed: {e}") from None
        self.ir_version, self.producer = header.ir_version, header.producer
        self.opsets, self.metadata = header.opsets, dict(header.metadata)
        self._entries: dict[str, int] = {}
        start, length = header.graph
        found = wire.graph_entries(
            self._map, start, length, constants=self.constants, sparse=self.sparse
        )
        while True:
            try:
                kind, at, n, name = next(found)
            except StopIteration:
                break
            except FormatError as e:
                raise FormatError(f"{self._where}: its graph is malformed: {e}") from None
            if kind < 0:
                self._note_unread(at, n)
                continue
            try:
                if kind == wire.TENSOR and not name:  # an initializer: its own name
                    record = wire.tensor(self._map, at, n)
                    self._add(record.name, kind, at, n)
                    self._check_record(record, repr(record.name))
                    self._remember(record.name, record)
                    continue
                if kind == wire.SPARSE and not name:
                    name = wire.sparse_parts(self._map, at, n)[0].name
                self._add(name, kind, at, n)
                self._check(name)
            except FormatError as e:
                if str(e).startswith(self._where):
                    raise
                what = "an initializer" if kind == wire.TENSOR else f"graph tensor {name!r}"
                raise FormatError(f"{self._where}: {what} is malformed: {e}") from None

    def _add(self, name: str, kind: int, at: int, n: int) -> None:
        if not name:
            raise FormatError(f"{self._where}: an initializer has no name; the graph is corrupt")
        if name in self._entries:
            raise FormatError(
                f"{self._where}: two graph tensors are named {name!r}; ONNX names each value "
                "once (the model is corrupt)"
            )
        self._entries[name] = wire.pack_span(kind, at, n)

    def _note_unread(self, constants: int, sparse: int) -> None:
        unread = []
        if constants and not self.constants:
            unread.append(f"{constants} Constant node{'s' * (constants > 1)}' values")
        if sparse and not self.sparse:
            unread.append(f"{sparse} sparse initializer{'s' * (sparse > 1)}")
        if unread:
            self.notes.append(
                f"{self.path.name} also holds {' and '.join(unread)}, not read; open it with "
                "tensorbridge.io.onnx.open(path, constants=True, sparse=True) to read them"
            )

    # --- the entries ---------------------------------------------------------------------

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def record(self, name: str) -> wire.Record:
        """``name``'s ``TensorProto`` as stored (a sparse tensor: its values')."""
        rec = self._recent.get(name)
        if rec is None:  # parsed again when asked again, but for the last few: memory bounded
            rec = self._remember(name, self._record(name))
        return rec

    def _remember(self, name: str, rec: wire.Record) -> wire.Record:
        self._recent[name] = rec
        if len(self._recent) > _RECENT:
            del self._recent[next(iter(self._recent))]
        return rec

    def _record(self, name: str) -> wire.Record:
        kind, at, n = self._span(name)
        if kind == wire.TENSOR:
            rec = wire.tensor(self._map, at, n)
        elif kind == wire.SPARSE:
            rec = wire.sparse_parts(self._map, at, n)[0]
        else:
            return wire.attribute(self._map, kind, at, n, name)
        return rec if rec.name == name else replace(rec, name=name)  # a Constant's output

    def _span(self, name: str) -> tuple[int, int, int]:
        try:
            return wire.unpack_span(self._entries[name])
        except KeyError:
            keys = self.keys()[:10]
            raise KeyError(f"{name!r} is not in {self.path}; its keys are {keys}") from None

    def data_type(self, name: str) -> str:
        """The ONNX data type ``name`` is stored as: ``"FLOAT"``, ``"INT4"``, ``"FLOAT6E2M3"``."""
        code = self.record(name).code
        return BY_CODE[code].name if code in BY_CODE else f"type {code}"

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        """The dtype row and shape ``name`` reads as (a sparse tensor: its dense shape).

        Raises:
            UnsupportedDtypeError: a STRING tensor, a data type onnx 1.23 does not
                define, or one stored in segments.
        """
        kind, at, n = self._span(name)
        rec = self.record(name)
        t = self._type(rec)
        dims = wire.sparse_parts(self._map, at, n)[2] if kind == wire.SPARSE else rec.dims
        return row_of_type(t), dims

    def _type(self, rec: wire.Record) -> DataType:
        t = BY_CODE.get(rec.code)
        where = f"{self._where}: tensor {rec.name!r}"
        if t is None:
            raise UnsupportedDtypeError(
                f"{where} has data type {rec.code}, which onnx 1.23 does not define; read it "
                "with the onnx release that wrote it"
            )
        if rec.segment:
            raise UnsupportedDtypeError(
                f"{where} is stored in segments (TensorProto.segment), which ONNX's own "
                "numpy_helper does not read either; save the model again without them"
            )
        try:
            t.numpy  # noqa: B018 - STRING, or a type the installed ml_dtypes lacks
        except UnsupportedDtypeError as e:
            raise UnsupportedDtypeError(f"{where} is {t.name}: {e}") from None
        return t

    # --- checks, once when opened ---------------------------------------------------------

    def _check(self, name: str) -> None:
        """Every size of ``name`` against the bytes present, before anything is allocated."""
        kind, at, n = self._span(name)
        if kind == wire.SPARSE:
            values, indices, _ = wire.sparse_parts(self._map, at, n)
            for part in (values, indices):
                self._check_record(part, f"{name!r}'s {'values' if part is values else 'indices'}")
            return
        self._check_record(self.record(name), repr(name))

    def _check_record(self, rec: wire.Record, shown: str) -> None:
        t = BY_CODE.get(rec.code)
        if t is None or t.code == STRING or rec.segment:
            return  # listed, and refused when read (info says why)
        count = math.prod(rec.dims)
        where = f"{self._where}: tensor {shown}"
        if rec.data_location == EXTERNAL:
            self._external(rec, raw_nbytes(t, count), where)
        elif rec.data_location != 0:
            raise FormatError(f"{where} has data_location {rec.data_location}, neither 0 nor 1")
        elif rec.raw is not None:
            if rec.raw[1] != raw_nbytes(t, count):
                raise FormatError(
                    f"{where}: raw_data holds {rec.raw[1]:,} bytes but dims {list(rec.dims)} of "
                    f"{t.name} take {raw_nbytes(t, count):,}; the model is corrupt"
                )
        elif rec.typed:
            want = typed_entries(t, count)
            if rec.entries != want:
                raise FormatError(
                    f"{where}: its typed field holds {rec.entries:,} entries but dims "
                    f"{list(rec.dims)} of {t.name} take {want:,}; the model is corrupt"
                )
        elif rec.other:
            raise FormatError(
                f"{where} is {t.name} but keeps its values in field {rec.other[0]}; ONNX puts "
                f"{t.name} values in field {t.field} (the model is corrupt)"
            )
        elif count:
            raise FormatError(f"{where} has dims {list(rec.dims)} but holds no values")

    def _external(self, rec: wire.Record, nbytes: int, where: str) -> tuple[str, int]:
        """The confined location and offset of an external tensor's ``nbytes`` bytes.

        Raises:
            FormatError: no location, one escaping the model's directory (``..``, an
                absolute path), offset / length that are no numbers or lie past the file.
            LinkError: a link out of the model's directory (unless ``follow_links``).
        """
        info = dict(rec.external)
        location = info.get("location", "")
        parts = location.replace("\\", "/").split("/")
        if not location or location.startswith(("/", "\\")) or ":" in parts[0] or "\0" in location:
            raise FormatError(
                f"{where}: external data location {location!r} is not a path relative to the "
                "model's directory; ONNX external data lies beside the model"
            )
        if ".." in parts:
            raise FormatError(
                f"{where}: external data location {location!r} leads out of the model's "
                "directory; tensorbridge reads external data inside it only"
            )
        numbers = {}
        for key in ("offset", "length"):
            text = info.get(key)
            if text is not None and not (text.isascii() and text.isdigit()):
                raise FormatError(f"{where}: external data {key} {text!r} is no number")
            numbers[key] = None if text is None else int(text)
        offset = numbers["offset"] or 0
        if location not in self._files:
            path = self.path.parent / location
            try:
                real = self._links.check(path)
            except LinkError as e:
                raise LinkError(f"{where}: its external data {e}") from None
            try:
                self._files[location] = (path, os.stat(real).st_size)
            except OSError as e:
                raise FormatError(
                    f"{where}: its external data file {location!r} cannot be read "
                    f"({e.strerror}); keep it beside the model"
                ) from None
        size = self._files[location][1]
        length = numbers["length"]
        if length is not None and length != nbytes:
            raise FormatError(
                f"{where}: external data length {length:,} but its dims take {nbytes:,} bytes"
            )
        if offset + nbytes > size or (length is None and size - offset != nbytes):
            raise FormatError(
                f"{where}: external data {location!r} bytes {offset:,}..{offset + nbytes:,} "
                f"do not match the file's {size:,} bytes; the file is truncated or not this "
                "model's"
            )
        return location, offset

    # --- values ---------------------------------------------------------------------------

    def _source(self, rec: wire.Record, nbytes: int, cow: bool) -> tuple[Any, int]:
        """The buffer and offset holding ``rec``'s stored bytes (the model's map or an
        external file's), checked unchanged since opened."""
        if rec.data_location == EXTERNAL:
            location, offset = self._external(rec, nbytes, f"{self._where}: tensor {rec.name!r}")
            return self._external_map(location, cow), offset
        assert rec.raw is not None
        if self._close.alive:
            check_unchanged(self._fd, len(self._map), self.path)
        return (self._cow_map() if cow else self._map), rec.raw[0]

    def _external_map(self, location: str, cow: bool) -> Any:
        path, size = self._files[location]
        if (location, cow) not in self._maps:
            if not self._close.alive:
                raise ValueError(f"{self.path} is closed; open it again")
            fd = self._descriptors.get(location)
            if fd is None:
                fd = self._descriptors[location] = self._links.open_fd(path)
                self._fds.append(fd)
            if os.fstat(fd).st_size != size:
                raise FormatError(f"{path} changed size since {self.path.name} was opened")
            access = _mmap.ACCESS_COPY if cow else _mmap.ACCESS_READ
            self._maps[location, cow] = _mmap.mmap(fd, 0, access=access) if size else b""
        return self._maps[location, cow]

    def _cow_map(self) -> _mmap.mmap:
        if self._cow is None:
            if not self._close.alive:
                raise ValueError(f"{self.path} is closed; open it again")
            self._cow = _mmap.mmap(self._fd, 0, access=_mmap.ACCESS_COPY)
        return self._cow

    def raw(self, name: str) -> np.ndarray:
        """``name``'s stored bytes, untouched (packed types packed), as a read-only
        ``uint8`` view of the model file or its external data file.

        Raises:
            InvalidArgumentError: its values are in a typed field, not stored as bytes.
        """
        rec = self.record(name)
        t = self._type(rec)
        if rec.data_location != EXTERNAL and rec.raw is None:
            raise InvalidArgumentError(
                f"tensor {name!r} keeps its values in a typed field, not as bytes; read its "
                f"values with [{name!r}]"
            )
        nbytes = raw_nbytes(t, math.prod(rec.dims))
        buf, begin = self._source(rec, nbytes, False)
        return np.frombuffer(buf, np.uint8, nbytes, begin) if nbytes else np.empty(0, np.uint8)

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        kind, at, n = self._span(name)
        if kind == wire.SPARSE:
            values = self._dense(name, at, n)
        else:
            rec = self.record(name)
            t, count = self._type(rec), math.prod(rec.dims)
            if rec.data_location == EXTERNAL or rec.raw is not None:
                nbytes = raw_nbytes(t, count)
                buf, begin = self._source(rec, nbytes, copy_on_write and not t.packed)
                if not t.packed:
                    return array_at(buf, begin, rec.dims, row_of_type(t), name=name)
                stored = np.frombuffer(buf, np.uint8, nbytes, begin)
                values = _unpack(t, stored, count).reshape(rec.dims)
            else:
                values = self._typed(rec, t, count).reshape(rec.dims)
        if not copy_on_write:  # new memory, read-only like the views
            values.flags.writeable = False
        return values

    def _owned(self, name: str) -> np.ndarray:
        rec = self.record(name)
        t = self._type(rec)
        stored = rec.data_location == EXTERNAL or rec.raw is not None
        if not stored or t.packed or self._span(name)[0] == wire.SPARSE:
            return self._array(name, copy_on_write=True)  # already new memory
        nbytes = raw_nbytes(t, math.prod(rec.dims))
        self._source(rec, nbytes, False)  # checks the file and opens it
        fd, at = self._descriptor(rec, nbytes)
        out = np.empty(nbytes, np.uint8)  # read straight in: no pages of the map touched
        read_at(fd, out, at, f"{self._where}: tensor {name!r}: its data file")
        row = row_of_type(t)
        return out.view(row.carrier_numpy).view(row.numpy).reshape(rec.dims)

    def _descriptor(self, rec: wire.Record, nbytes: int) -> tuple[int, int]:
        """The descriptor of the file holding ``rec``'s bytes, and their offset."""
        if rec.data_location != EXTERNAL:
            assert rec.raw is not None
            return self._fd, rec.raw[0]
        location, offset = self._external(rec, nbytes, f"{self._where}: tensor {rec.name!r}")
        return self._descriptors[location], offset

    def _typed(self, rec: wire.Record, t: DataType, count: int) -> np.ndarray:
        """The values of a typed field (each occurrence's entries, in order): new memory."""
        if not rec.typed:
            return np.empty(count, t.numpy)  # no values and none wanted (checked)
        start, size = rec.message
        pieces: list[Any] = []
        for f, w, v, m in wire.fields(self._map, start, start + size):
            if f != rec.typed:
                continue
            if w == 0:
                pieces.append(wire.varint_bytes(v))
            else:
                pieces.append(self._map[v : v + m])
        payload = np.frombuffer(b"".join(pieces), np.uint8)
        try:
            return decode(t, rec.as_field or rec.typed, payload, count)
        except FormatError as e:
            raise FormatError(f"{self._where}: tensor {rec.name!r}: {e}") from None

    def _dense(self, name: str, at: int, n: int) -> np.ndarray:
        """A sparse initializer as its dense array (zeros but at its indices): new memory."""
        values_rec, indices_rec, dims = wire.sparse_parts(self._map, at, n)
        values = self._part(values_rec)
        indices = self._part(indices_rec)
        where = f"{self._where}: sparse tensor {name!r}"
        nnz, total = values.size, math.prod(dims)
        if values_rec.dims != (nnz,) or indices.dtype != np.int64:
            raise FormatError(f"{where}: values must be 1-D and indices INT64, as ONNX says")
        if indices.shape == (nnz, len(dims)) and dims:
            linear = np.ravel_multi_index(tuple(indices.T), dims, mode="clip")
            bad = bool((indices < 0).any() or (indices >= np.array(dims)).any())
        elif indices.shape == (nnz,):
            linear, bad = indices, bool(((indices < 0) | (indices >= total)).any())
        else:
            raise FormatError(f"{where}: indices of shape {indices.shape} fit no {nnz} values")
        if bad:
            raise FormatError(f"{where}: an index lies outside its dims {list(dims)}")
        out = np.zeros(total, values.dtype)
        out[linear] = values
        return out.reshape(dims)

    def _part(self, rec: wire.Record) -> np.ndarray:
        t, count = self._type(rec), math.prod(rec.dims)
        if rec.data_location == EXTERNAL or rec.raw is not None:
            nbytes = raw_nbytes(t, count)
            buf, begin = self._source(rec, nbytes, False)
            stored = np.frombuffer(buf, np.uint8, nbytes, begin)
            if t.packed:
                return _unpack(t, stored, count).reshape(rec.dims)
            return stored.view(t.numpy).reshape(rec.dims)
        return self._typed(rec, t, count).reshape(rec.dims)

    def get(
        self,
        name: str,
        *,
        framework: str = "numpy",
        mmap: bool = True,
        device: DeviceLike | None = None,
        float_dtype: DTypeLike | None = None,
    ) -> Any:
        """One tensor as a NumPy array (read-only when ``mmap``) or a torch tensor.

        Types torch lacks (FLOAT6, FLOAT8E4M3 ..., the table's NumPy-only rows) come as
        their ml_dtypes arrays and are refused for torch (``float_dtype=`` widens them
        exactly), but FLOAT4E2M1, which comes packed as ``torch.float4_e2m1fn_x2`` where the
        last dimension is even.
        """
        row, shape = self.info(name)
        if (BY_NUMPY.get(row.numpy) is row and row.in_torch) or framework not in (
            "numpy",
            "torch",
        ):
            return super().get(
                name, framework=framework, mmap=mmap, device=device, float_dtype=float_dtype
            )
        values = self._array(name, copy_on_write=False) if mmap else self._owned(name)
        dst = cast_target(row, float_dtype)
        if dst is not row:  # float4 / float6 values are exact in float32
            from ...convert import to_numpy, to_torch

            wide = values.astype(np.float32)
            if framework == "torch":
                return to_torch(wide, dtype=dst, device=device)
            return to_numpy(wide, dtype=dst)
        if framework == "numpy":
            return values
        packed = PACKED_BY_NUMPY.get(row.numpy)
        if packed is not None and shape and shape[-1] % packed.per_byte == 0:
            from ...convert import to_torch

            return to_torch(values, dtype=packed.torch, device=device)
        raise UnsupportedDtypeError(
            f"{self._where}: tensor {name!r} is {self.data_type(name)}: "
            f"{explain_numpy(row.numpy)}; framework='numpy' gives its {row.name} values"
        )

    def close(self) -> None:
        """Release the files; arrays already handed out keep their own mapping alive."""
        self._close()

    def __enter__(self) -> OnnxFile:
        return self

    def __repr__(self) -> str:
        return f"<OnnxFile {str(self.path)!r}: {len(self._entries)} tensors>"


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        os.close(fd)
    fds.clear()


def open(
    path: str | os.PathLike[str],
    *,
    follow_links: bool = False,
    constants: bool = False,
    sparse: bool = False,
) -> OnnxFile:
    """Open an ONNX model: its initializers checked, their values read when asked for.

    ``constants=True`` adds every ``Constant`` node's value under its output's name,
    ``sparse=True`` every sparse initializer as its dense array (which may be far larger
    than the file: it is asked for, never read by default). An external data file that
    is a link out of the model's directory is refused unless ``follow_links=True``.

    >>> import os, tempfile, numpy as np
    >>> from tensorbridge.io.onnx import save
    >>> p = os.path.join(tempfile.mkdtemp(), "w.onnx")
    >>> save({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, p)
    >>> with open(p) as f:
    ...     f.keys(), f.data_type("w"), f["w"].shape
    (['w'], 'FLOAT', (2, 3))
    """
    return OnnxFile(path, follow_links=follow_links, constants=constants, sparse=sparse)


load = loader(open, """Every initializer (or ``keys``) of an ONNX model.""")

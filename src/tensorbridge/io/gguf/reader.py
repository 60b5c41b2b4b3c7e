"""Reading GGUF files: :class:`GGUFFile` (a checked header, tensors mapped when asked for).

The format and what reading promises are in :mod:`tensorbridge.io.gguf`; the header is
parsed and checked by :mod:`tensorbridge.io._gguf_header`, and quantized tensors are
dequantized by :func:`tensorbridge.quant.ggml.dequantize_blocks`. This module holds the
reader alone (a split set of files read as one included), apart from the writer, which
shares nothing with it but the header's constants.
"""

from __future__ import annotations

import math
import mmap as _mmap
import os
import re
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from ..._filemap import array_at, check_unchanged
from ..._files import Links, open_regular
from ..._tensorfile import TensorFile
from ...dtypes import DTypeLike, DTypeRow, resolve_dtype
from ...errors import FormatError, UnsupportedDtypeError
from ...quant.ggml import dequantize_blocks, float_row
from .._common import loader
from .._gguf_header import SPLIT_COUNT, SPLIT_KEYS, SPLIT_NO, SPLIT_TENSORS, TensorEntry, parse

__all__ = ["GGUFFile", "load", "open"]


class GGUFFile(TensorFile):
    """A checked GGUF file; tensors are mapped when asked for, in PyTorch order.

    ``[name]`` is a read-only NumPy view of the mapped file for plain types;
    ``.get(name, framework="torch")`` a copy-on-write tensor over it. Quantized
    tensors raise unless the file was opened with ``dequantize=`` (then they read as
    values of that dtype, in new memory); :meth:`raw` gives their blocks.

    Attributes:
        metadata: every key-value pair as text (lists as JSON).
        metadata_types: each key's GGUF value type (``"UINT32"``, ``"ARRAY[STRING]"``).
        version: the GGUF version (2 or 3); alignment: the data alignment.
        dequantize: the dtype quantized tensors are read as, or ``None``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        dequantize: DTypeLike | None = None,
        split: bool = True,
        follow_links: bool = False,
    ):
        super().__init__()
        self.path = Path(path)
        self.follow_links = follow_links  # the other files of a split set may be links out
        self.dequantize = None if dequantize is None else float_row(dequantize)
        with open_regular(self.path) as fh:
            size = os.fstat(fh.fileno()).st_size
            if size == 0:
                raise FormatError(f"{str(self.path)!r} is empty; it is no GGUF file")
            self._map = _mmap.mmap(fh.fileno(), 0, access=_mmap.ACCESS_READ)
            self._cow: _mmap.mmap | None = None
            self._fd = os.dup(fh.fileno())  # for the copy-on-write map, if torch asks
        self._close = weakref.finalize(self, os.close, self._fd)  # quiet if never closed
        try:
            header = parse(self._map, self.path)
        except BaseException:
            self._close()
            raise
        self.version, self.alignment = header.version, header.alignment
        self._values = header.values
        self._entries: dict[str, TensorEntry] = header.tensors
        self._metadata: dict[str, str] | None = None  # made from _values when first read
        self.metadata_types = {k: v.type_name for k, v in self._values.items()}
        self.paths = [self.path]  # every file of a split set, in order
        self._owner: dict[str, GGUFFile] = {}  # tensors held by another file of the set
        self._shards: list[GGUFFile] = []
        if split and SPLIT_COUNT in self._values and self._split_int(SPLIT_COUNT) > 1:
            try:
                self._open_set()
            except BaseException:
                self.close()
                raise
        quantized: dict[str, int] = {}
        for e in self._entries.values():
            if e.type.quantized:
                quantized[e.type.name] = quantized.get(e.type.name, 0) + 1
        if quantized:
            kinds = ", ".join(f"{n} {t}" for t, n in sorted(quantized.items()))
            how = (
                f"read as {self.dequantize.name} (dequantized)"
                if self.dequantize
                else "read with dequantize='bf16' (or 'f32', 'f16'), or as blocks with raw()"
            )
            self.notes.append(f"{self.path.name} holds quantized tensors ({kinds}); {how}")

    def _split_int(self, key: str) -> int:
        v = self._values.get(key)
        if v is None or not isinstance(v.value, int) or isinstance(v.value, bool):
            raise FormatError(
                f"{str(self.path)!r} is part of a split GGUF set but its {key} is "
                f"{'missing' if v is None else v.type_name}; the file is corrupt or not "
                "written by llama.cpp's gguf-split (re-split the model)"
            )
        return int(v.value)

    def _open_set(self) -> None:
        """Open every file of the split set this one belongs to (llama.cpp's gguf-split:
        ``NAME-00001-of-00003.gguf``, the keys ``split.no`` (from 0), ``split.count`` and
        ``split.tensors.count`` in each; the first holds the model's metadata) and merge
        their tensors in shard order. A missing or inconsistent shard is refused."""
        count, no = self._split_int(SPLIT_COUNT), self._split_int(SPLIT_NO)
        total = self._split_int(SPLIT_TENSORS)
        m = re.fullmatch(r"(.*)-(\d{5})-of-(\d{5})\.gguf", self.path.name, re.IGNORECASE)
        if m is None or int(m.group(2)) != no + 1 or int(m.group(3)) != count:
            raise FormatError(
                f"{str(self.path)!r} is shard {no + 1} of {count} (split.no, split.count) but "
                f"is not named NAME-{no + 1:05d}-of-{count:05d}.gguf as llama.cpp's gguf-split "
                "names a set; rename the shards so the others can be found"
            )
        files: list[GGUFFile] = []
        for i in range(count):
            if i == no:
                files.append(self)
                continue
            p = self.path.with_name(f"{m.group(1)}-{i + 1:05d}-of-{count:05d}.gguf")
            if not p.exists():
                raise FormatError(
                    f"{str(p)!r}, shard {i + 1} of {count} of the split GGUF set "
                    f"{self.path.name} belongs to, is missing; put every shard in one directory"
                )
            Links.of(self.path, follow=self.follow_links).check(p)
            other = GGUFFile(p, dequantize=self.dequantize, split=False)
            self._shards.append(other)
            said = {k: other._split_int(k) for k in (SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS)}
            if said != {SPLIT_COUNT: count, SPLIT_NO: i, SPLIT_TENSORS: total}:
                raise FormatError(
                    f"{str(p)!r} says it is shard {said[SPLIT_NO] + 1} of {said[SPLIT_COUNT]} "
                    f"with {said[SPLIT_TENSORS]} tensors in all, but {self.path.name} makes it "
                    f"shard {i + 1} of {count} with {total}; the set is mixed from two splits"
                )
            files.append(other)
        entries: dict[str, TensorEntry] = {}
        for f in files:
            for name, e in f._entries.items():
                if name in entries:
                    raise FormatError(
                        f"tensor {name!r} is in two shards of {self.path.name}'s split set "
                        f"({f.path.name} and another); the set is corrupt, split it again"
                    )
                entries[name] = e
                if f is not self:
                    self._owner[name] = f
        if len(entries) != total:
            raise FormatError(
                f"the split GGUF set of {self.path.name} holds {len(entries)} tensors but "
                f"split.tensors.count says {total}; a shard is truncated or from another split"
            )
        self._entries = entries
        self.paths = [f.path for f in files]
        # the model's metadata is the first shard's; the split.* keys describe the files
        self._values = {k: v for k, v in files[0]._values.items() if k not in SPLIT_KEYS}
        self.metadata_types = {k: v.type_name for k, v in self._values.items()}
        self.notes.append(f"{self.path.name} is one of a split set: {count} files read as one")

    @property
    def metadata(self) -> dict[str, str]:
        """Every key-value pair as text (lists as JSON), made when first asked for."""
        if self._metadata is None:
            self._metadata = {k: v.as_text() for k, v in self._values.items()}
        return self._metadata

    @metadata.setter
    def metadata(self, value: dict[str, str]) -> None:
        self._metadata = value

    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def entry(self, name: str) -> TensorEntry:
        """``name``'s checked header entry: ggml type, PyTorch-order shape, offset, bytes."""
        try:
            return self._entries[name]
        except KeyError:
            keys = self.keys()[:10]
            raise KeyError(f"{name!r} is not in {self.path}; its keys are {keys}") from None

    def ggml_type(self, name: str) -> str:
        """The ggml type ``name`` is stored as: ``"BF16"``, ``"Q4_K"``, ``"MXFP4"``."""
        return self.entry(name).type.name

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        """The dtype row and PyTorch-order shape of ``name`` (as dequantized, if asked)."""
        e = self.entry(name)
        if e.type.plain is not None:
            return resolve_dtype(e.type.plain), e.shape
        if self.dequantize is None:
            raise UnsupportedDtypeError(
                f"{str(self.path)!r}: tensor {name!r} is {e.type.name}, ggml's block-quantized "
                f"type ({e.type.block_size} values in {e.type.type_size} bytes), not a plain "
                "array; open it with dequantize='bf16' (or 'f32', 'f16'; command line: "
                f"--dequantize bf16) for its values, or read its blocks with raw({name!r})"
            )
        return self.dequantize, e.shape

    def nbytes(self, name: str) -> int:
        """The bytes ``name`` takes as read: stored, or dequantized when asked."""
        e = self.entry(name)
        if e.type.quantized and self.dequantize is not None:
            return math.prod(e.shape) * self.dequantize.itemsize
        return e.nbytes

    def raw(self, name: str) -> np.ndarray:
        """``name``'s stored bytes, untouched, as a read-only ``uint8`` view of the map.

        Shaped ``(*shape[:-1], blocks a row, block bytes)`` for quantized types; a
        plain type's bytes are ``(*shape[:-1], shape[-1] * itemsize)``.
        """
        e = self.entry(name)
        if name in self._owner:
            return self._owner[name].raw(name)
        flat = np.frombuffer(self._map, np.uint8, e.nbytes, e.begin) if e.nbytes else None
        width = e.shape[-1] if e.shape else 1
        lead = e.shape[:-1]
        if e.type.quantized:
            shape: tuple[int, ...] = (*lead, width // e.type.block_size, e.type.type_size)
        else:
            shape = (*lead, width * e.type.type_size)
        return np.empty(shape, np.uint8) if flat is None else flat.reshape(shape)

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        e = self.entry(name)
        if name in self._owner:
            return self._owner[name]._array(name, copy_on_write=copy_on_write)
        if e.type.plain is None:
            row, shape = self.info(name)  # raises unless dequantize= was given
            values = dequantize_blocks(self.raw(name), e.type.name, shape, row)
            # new, writable memory; numpy refuses to set WRITEABLE again on a torch-owned
            # view even when it already is, so only ever clear it
            if not copy_on_write:
                values.flags.writeable = False
            return values
        if self._close.alive:
            check_unchanged(self._fd, len(self._map), self.path)
        buf = self._cow_map() if copy_on_write and e.nbytes else self._map
        return array_at(buf, e.begin, e.shape, resolve_dtype(e.type.plain), name=name)

    def _owned(self, name: str) -> np.ndarray:
        e = self.entry(name)
        if e.type.plain is None:
            return self._array(name, copy_on_write=True)  # already new memory
        return super()._owned(name)

    def _cow_map(self) -> _mmap.mmap:
        if self._cow is None:
            if not self._close.alive:
                raise ValueError(f"{self.path} is closed; open it again")
            self._cow = _mmap.mmap(self._fd, 0, access=_mmap.ACCESS_COPY)
            if len(self._cow) != len(self._map):
                raise FormatError(f"{self.path} changed size since it was opened; open it again")
        return self._cow

    def plain_values(self) -> dict[str, Any]:
        """The key-value pairs typed: str, bool, NumPy scalars of the stored type, lists."""
        return {k: v.typed() for k, v in self._values.items()}

    def close(self) -> None:
        """Release the file(s); arrays already handed out keep their own mapping alive."""
        for f in self._shards:
            f.close()
        self._close()

    def __enter__(self) -> GGUFFile:
        return self

    def __repr__(self) -> str:
        files = f" in {len(self.paths)} files" if len(self.paths) > 1 else ""
        return f"<GGUFFile {str(self.path)!r}: {len(self._entries)} tensors{files}>"


def open(
    path: str | os.PathLike[str],
    *,
    dequantize: DTypeLike | None = None,
    follow_links: bool = False,
) -> GGUFFile:
    """Open a GGUF file: its header is read and checked, tensors mapped when asked for.

    The other files of a split set are looked for beside it; one that is a link out of
    its directory is refused unless ``follow_links=True``.

    >>> import os, tempfile, numpy as np
    >>> p = os.path.join(tempfile.mkdtemp(), "m.gguf")
    >>> save({"w": np.zeros((4, 32))}, p, metadata={"general.architecture": "x"},
    ...      quantize="q8_0")
    >>> with open(p) as f:
    ...     f.ggml_type("w"), f.raw("w").shape
    ('Q8_0', (4, 1, 34))
    """
    return GGUFFile(path, dequantize=dequantize, follow_links=follow_links)


load = loader(
    open,
    """Every tensor (or ``keys``) of a GGUF file; quantized ones need ``dequantize=``.""",
)

"""Reading one safetensors file: the validated, memory-mapped :class:`SafetensorsFile`.

A file's header is read and checked (through :mod:`tensorbridge.io._safetensors_header`)
before anything else is touched; tensors are mapped only when asked for: ``[name]`` is a
read-only NumPy view of the file, a torch tensor a copy-on-write one, ``mmap=False``
new memory. :func:`tensorbridge.io.safetensors.open` opens one (or a sharded
checkpoint's index, as a :class:`~tensorbridge.io.sharded.ShardedFile` of them);
the format and the writer are in :mod:`tensorbridge.io.safetensors`, which re-exports
:class:`SafetensorsFile`.
"""

from __future__ import annotations

import errno
import mmap as _mmap
import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import (
    DeviceLike,
    DTypeLike,
    DTypeRow,
)
from ..errors import (
    FormatError,
    InvalidArgumentError,
    TensorBridgeError,
    UnsupportedDtypeError,
)
from ._common import (
    TensorFile,
    array_at,
    cast_target,
    check_unchanged,
)
from ._files import open_fd
from ._safetensors_header import MAX_HEADER as MAX_HEADER  # the limit on a header's JSON
from ._safetensors_header import (
    PACKED_ROWS,
    Entry,
    parse,
)

if TYPE_CHECKING:
    pass


__all__ = ["SafetensorsFile"]


class _Shard:
    """One validated safetensors file, held open so that its header and data stay one file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = open_fd(path)  # a regular file, opened without blocking
        # a plain descriptor closed on collection: dropping an unclosed file stays quiet
        self._close = weakref.finalize(self, os.close, self.fd)
        try:
            self.size = os.fstat(self.fd).st_size
            self.entries, self.metadata = parse(path, self, self.size)
        except BaseException:
            self._close()
            raise
        self._maps: dict[bool, _mmap.mmap] = {}

    def buffer(self, copy_on_write: bool) -> _mmap.mmap:
        mm = self._maps.get(copy_on_write)
        if mm is not None:
            check_unchanged(self.fd, self.size, self.path)
        else:
            self._check_open()
            access = _mmap.ACCESS_COPY if copy_on_write else _mmap.ACCESS_READ
            try:
                mm = _mmap.mmap(self.fd, 0, access=access)
            except OSError as err:
                if err.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                raise TensorBridgeError(
                    f"{self.path}: cannot map one more file, the process is out of file "
                    "descriptors (each map holds one: arrays still referenced keep theirs); "
                    "read with mmap=False, keep fewer arrays at once, or raise ulimit -n"
                ) from None
            if len(mm) != self.size:
                raise FormatError(f"{self.path} changed size since it was opened; open it again")
            self._maps[copy_on_write] = mm
        return mm

    def read_into(self, out: memoryview, offset: int) -> None:
        """Fill ``out`` from ``offset``, without moving a shared file position."""
        self._check_open()
        done = 0
        while done < len(out):
            if hasattr(os, "preadv"):
                n = os.preadv(self.fd, [out[done:]], offset + done)
            else:  # pragma: no cover - Windows
                os.lseek(self.fd, offset + done, os.SEEK_SET)
                data = os.read(self.fd, len(out) - done)
                out[done : done + len(data)] = data
                n = len(data)
            if n == 0:
                raise FormatError(f"{self.path} ended early: it shrank since it was opened")
            done += n

    def read(self, n: int, offset: int) -> bytes:
        out = bytearray(n)
        self.read_into(memoryview(out), offset)
        return bytes(out)

    def _check_open(self) -> None:
        if not self._close.alive:
            raise ValueError(f"{self.path} is closed; open it again")

    def close(self) -> None:
        self._maps.clear()  # arrays handed out keep their own reference to a map
        self._close()


class SafetensorsFile(TensorFile):
    """A validated safetensors file; tensors are read when asked for.

    ``[name]`` is a read-only NumPy view of the memory-mapped file (writing raises);
    ``.get(name, framework="torch")`` is a copy-on-write tensor over it;
    ``mmap=False`` reads into new memory. ``keys()`` come in file order (shard by
    shard); ``metadata`` is the (first) file's ``__metadata__``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self.path = Path(path)
        shard = _Shard(self.path)
        self._shards: list[_Shard] = [shard]
        self._where: dict[str, tuple[_Shard, Entry]] = {
            k: (shard, e) for k, e in shard.entries.items()
        }
        self.metadata = dict(shard.metadata)
        self._restore_ties(self._where)

    def keys(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where

    def _lookup(self, name: str) -> tuple[_Shard, Entry]:
        try:
            return self._where[name]
        except KeyError:
            keys = self.keys()[:10]
            raise KeyError(f"{name!r} is not in {self.path}; its keys are {keys}") from None

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        """The stored dtype row (F4: ``float4_e2m1fn``) and the header's shape of ``name``."""
        _, e = self._lookup(name)
        return e.row, e.shape

    def _bytes(self, name: str, *, copy_on_write: bool | None) -> np.ndarray:
        """``name``'s raw bytes: a view of a map, or new memory when ``copy_on_write`` is None."""
        shard, e = self._lookup(name)
        if copy_on_write is None:
            out = np.empty(e.nbytes, np.uint8)
            shard.read_into(out.data, e.begin)
            return out
        if e.nbytes == 0:
            return np.empty(0, np.uint8)
        return np.frombuffer(shard.buffer(copy_on_write), np.uint8, e.nbytes, e.begin)

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        shard, e = self._lookup(name)
        packing = PACKED_ROWS.get(e.row)
        if packing is not None:
            values: np.ndarray = packing.unpack(self._bytes(name, copy_on_write=False))
            return values.reshape(e.shape)
        return array_at(shard.buffer(copy_on_write), e.begin, e.shape, e.row, name=name)

    def _owned(self, name: str) -> np.ndarray:
        _, e = self._lookup(name)
        raw = self._bytes(name, copy_on_write=None)
        packing = PACKED_ROWS.get(e.row)
        if packing is not None:
            unpacked: np.ndarray = packing.unpack(raw)
            return unpacked.reshape(e.shape)
        return raw.view(e.row.carrier_numpy).view(e.row.numpy).reshape(e.shape)

    def get(
        self,
        name: str,
        *,
        framework: str = "numpy",
        mmap: bool = True,
        device: DeviceLike | None = None,
        float_dtype: DTypeLike | None = None,
    ) -> Any:
        """One tensor: a NumPy array (read-only view when ``mmap``) or a torch tensor (COW).

        F4 tensors come as ml_dtypes ``float4_e2m1fn`` arrays (one value a byte, new
        memory) or torch ``float4_e2m1fn_x2`` tensors (packed, zero-copy).
        """
        _, e = self._lookup(name)
        packing = PACKED_ROWS.get(e.row)
        if packing is None:
            return super().get(
                name, framework=framework, mmap=mmap, device=device, float_dtype=float_dtype
            )
        if framework not in ("numpy", "torch"):
            raise InvalidArgumentError(
                f"framework={framework!r} is not supported; pass 'numpy' or 'torch'"
            )
        as_torch = framework == "torch"
        dst = cast_target(e.row, float_dtype)
        if dst is not e.row:  # float4 values are exact in float32; torch's kernel does the rest
            from ..convert import to_numpy, to_torch

            values = self._array(name, copy_on_write=False).astype(np.float32)
            if as_torch:
                return to_torch(values, dtype=dst, device=device)
            return to_numpy(values, dtype=dst)
        if not as_torch:
            return self._owned(name) if not mmap else self._array(name, copy_on_write=False)
        k = packing.per_byte
        if not e.shape or e.shape[-1] % k:
            pairs = "pairs values along an even" if k == 2 else f"packs {k} values a byte along a"
            raise UnsupportedDtypeError(
                f"{self.path}: tensor {name!r} is {e.row.safetensors} with shape "
                f"{list(e.shape)}; torch's {packing.name} {pairs} last dimension; pass "
                f"framework='numpy' for ml_dtypes.{packing.numpy} values"
            )
        import torch

        from ..convert import to_torch

        raw = self._bytes(name, copy_on_write=True if mmap else None)
        packed = torch.from_numpy(raw).view(packing.torch)
        t = packed.reshape(*e.shape[:-1], e.shape[-1] // k)
        return t if device is None else to_torch(t, device=device)

    def close(self) -> None:
        """Close the files; arrays and tensors already handed out stay valid."""
        for shard in self._shards:
            shard.close()

    def __enter__(self) -> SafetensorsFile:
        return self

    def __repr__(self) -> str:
        return f"<SafetensorsFile {str(self.path)!r}: {len(self._where)} tensors>"

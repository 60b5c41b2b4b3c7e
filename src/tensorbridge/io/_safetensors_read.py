"""One open safetensors file: the validated header, the descriptor and its memory maps.

:class:`Shard` parses and checks a file's header (through
:mod:`tensorbridge.io.safetensors_header`) before anything else is read, keeps the
file open so that header and data stay one file, and maps it (read-only, or
copy-on-write) or reads ranges of it without moving a shared file position.
:class:`tensorbridge.io.safetensors.SafetensorsFile` reads each of its files, a
sharded checkpoint's shards included, through one.
"""

from __future__ import annotations

import errno
import mmap as _mmap
import os
import weakref
from pathlib import Path

from .._filemap import check_unchanged, read_at
from .._files import open_fd
from ..errors import (
    FormatError,
    TensorBridgeError,
)
from .safetensors_header import (
    parse,
)


class Shard:
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
        read_at(self.fd, out, offset, self.path)

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

"""Machinery every file format shares: atomic writes, streamed data, mappings, progress.

* :func:`atomic_write` — a temporary file in the target directory, fsync, rename:
  an interrupted save leaves the previous file or nothing, never a truncated file
  under the final name.
* :func:`iter_bytes` — a tensor's or array's values as bytes in C order, at most
  about one chunk at a time, cast on the way when asked (torch's kernel into one
  reused buffer), releasing the pages of a read-only memory-mapped source once they
  are written, so peak memory stays near one chunk whatever the size.
* :func:`map_file` / :func:`array_at` — zero-copy views of a file's bytes:
  read-only (a write raises) or copy-on-write (writes stay in private pages).
* :func:`progress_bar` — tqdm on stderr when it is a terminal, or when asked.
"""

from __future__ import annotations

import abc
import contextlib
import errno
import inspect
import io
import mmap
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import numpy as np

from .._plan import numpy_row, run_numpy
from .._progress import SHOW_AFTER as SHOW_AFTER  # the formats' progress, re-exported
from .._progress import WORK_RATES as WORK_RATES
from .._progress import NoBar
from .._progress import expected_seconds as expected_seconds
from .._progress import progress_bar as progress_bar
from .._torch_checks import is_tensor
from .._versions import byte_bounds
from ..dtypes import DeviceLike, DTypeLike, DTypeRow, resolve_dtype
from ..errors import DestinationError, FormatError, InvalidArgumentError, UnsupportedDtypeError
from ._files import Links, open_fd, open_regular, read_limited
from ._locks import Claim, alive, commit_lock, is_claim_name, remove_dead_claims
from ._pipeline import STREAM_CHUNK, Task, pipelined

if TYPE_CHECKING:
    import torch

DEFAULT_CHUNK = 64 << 20
_PAGE = mmap.PAGESIZE


# --- writing ----------------------------------------------------------------------------------


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
    """Open a temporary file beside ``path``; on success fsync it and rename it into place.

    Missing parent directories are created (like ``save_pretrained``). A write that
    fails (disk full, file size limit, no permission, a directory in the way) raises
    :class:`~tensorbridge.errors.DestinationError` naming ``path`` and leaves the
    previous file, or none, under that name.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> with atomic_write(os.path.join(d, "x.bin")) as f:
    ...     _ = f.write(b"abc")
    >>> os.listdir(d)
    ['x.bin']
    """
    with StagedFiles() as staged:
        with staged.write(path) as f:
            yield f
        staged.commit()


class StagedFiles:
    """Files written to temporaries beside their final names, then renamed into place together.

    A multi-file save (shards and their index) writes every file with :meth:`write`
    (temporary, fsync) while the previous files stay untouched, then :meth:`commit`
    renames them all; an exception or a kill before the commit leaves the previous
    files as they were. Leaving the ``with`` block without a commit removes the
    temporaries.

    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> with StagedFiles() as staged:
    ...     for name in ("a.bin", "b.bin"):
    ...         with staged.write(os.path.join(d, name)) as f:
    ...             _ = f.write(b"abc")
    ...     before = sorted(n for n in os.listdir(d) if not n.startswith("."))
    ...     staged.commit()
    >>> before, sorted(os.listdir(d))
    ([], ['a.bin', 'b.bin'])
    """

    def __init__(self) -> None:
        self.temps: dict[Path, str] = {}  # final path -> its written, fsynced temporary
        self.claims: dict[Path, Claim] = {}  # directory -> this save's claim on it

    def claim(self, directory: Path) -> Claim:
        """This save's claim on ``directory`` (made on first use): its temporaries there
        carry the claim's token, and no other save removes them while it is held."""
        claim = self.claims.get(directory)
        if claim is None:
            claim = self.claims[directory] = Claim(directory)
        return claim

    @contextlib.contextmanager
    def write(self, path: str | os.PathLike[str]) -> Iterator[BinaryIO]:
        """A temporary file beside ``path``, fsynced when the block ends without an error."""
        target = Path(path)
        with destination_errors(target, only_destination=True):
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_dir():
                raise IsADirectoryError(errno.EISDIR, "Is a directory")
            tmp = str(self.claim(target.parent).temp(target))
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            fd = os.open(
                tmp, flags | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0), 0o600
            )
        try:
            with destination_errors(target, tmp):
                umask = os.umask(0)
                os.umask(umask)
                os.fchmod(fd, 0o666 & ~umask)
                with os.fdopen(fd, "wb") as f:
                    yield f
                    f.flush()
                    os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self.temps[target] = tmp

    def commit(self) -> None:
        """Rename every written file into place, then make the renames durable.

        The renames run under each directory's commit lock (:func:`commit_lock`), so a
        concurrent save's commit never interleaves with them: the last commit wins.
        """
        directories = {p.parent for p in self.temps}
        with contextlib.ExitStack() as locks:
            for directory in sorted(directories):
                locks.enter_context(commit_lock(directory))
            for target, tmp in list(self.temps.items()):
                with destination_errors(target, tmp):
                    os.replace(tmp, target)
                del self.temps[target]
                remove_temps(target)
            for directory in directories:
                fsync_dir(directory)
        self.release()

    def discard(self) -> None:
        """Remove the temporaries not yet committed, and give up the claims."""
        for tmp in self.temps.values():
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        self.temps.clear()
        self.release()

    def release(self) -> None:
        """Give up this save's claims (once its temporaries are committed or removed)."""
        for claim in self.claims.values():
            claim.release()
        self.claims.clear()

    def __enter__(self) -> StagedFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.discard()


TEMP_SUFFIX = ".tmp"  # a temporary's name: ".NAME.<random>.tmp" beside NAME


def remove_temps(target: Path) -> None:
    """Remove the temporaries that killed saves of ``target`` left beside it.

    Called once a save of ``target`` has renamed its own file into place: a save
    killed before its rename leaves a hidden ``.NAME.<8 random>.tmp`` that no reader
    looks at but that holds the disk space of a whole file. A temporary whose save
    is still running (its claim is held: :mod:`tensorbridge.io._locks`) is kept.
    """
    pattern = re.compile(re.escape(f".{target.name}.") + r"([a-z0-9_]{8})" + re.escape(TEMP_SUFFIX))
    claims = []
    with contextlib.suppress(OSError), os.scandir(target.parent) as entries:
        for entry in entries:
            m = pattern.fullmatch(entry.name)
            if m and entry.is_file(follow_symlinks=False) and not alive(target.parent, m[1]):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
            elif is_claim_name(entry.name):
                claims.append(Path(entry.path))
    remove_dead_claims(claims)  # after the temporaries: a claim goes once they are gone


_NO_SPACE = {errno.ENOSPC, errno.EFBIG, getattr(errno, "EDQUOT", errno.ENOSPC)}


@contextlib.contextmanager
def destination_errors(
    target: Path, tmp: str | None = None, *, only_destination: bool = False
) -> Iterator[None]:
    """Turn an ``OSError`` while writing ``target`` into a :class:`DestinationError`.

    Only errors of the destination itself (no file name, ``target``, its temporary
    ``tmp``, or a file inside ``target`` when it is a directory store) are turned:
    an error reading a source passes through. The temporary's name means nothing
    to the user, so the message names ``target`` and the fix. ``only_destination``:
    the block touches nothing but the destination (creating its directory and
    temporary), so every error is the destination's.
    """
    try:
        yield
    except DestinationError:
        raise
    except OSError as err:
        name = None if err.filename is None else os.fspath(err.filename)
        inside = name is not None and (
            name.startswith(os.path.join(target, ""))  # a store
            or _staged_beside(name, target)
        )
        ours = only_destination or name in (None, tmp, str(target)) or inside
        if err.errno is None or not ours:
            raise
        blocking = _file_above(target) if err.errno in (errno.EEXIST, errno.ENOTDIR) else None
        if blocking is not None:  # mkdir says EEXIST one level down, ENOTDIR deeper: one message
            raise DestinationError(
                errno.ENOTDIR,
                f"cannot write {target}: {blocking} is a file, not a directory; a file stands "
                "where a directory is needed; save to another path",
            ) from None
        if err.errno == errno.ENOENT and tmp is not None and name == tmp:
            raise DestinationError(
                err.errno,
                f"cannot write {target}: its temporary file was removed while this save was "
                "writing it (by another program cleaning the directory); nothing of this "
                "save was kept; save again",
            ) from None
        if err.errno in _NO_SPACE:
            fix = "free space (or raise the file size limit) or save to another disk"
        elif err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            fix = "make the directory writable or save to another path"
        elif err.errno == errno.EISDIR:
            fix = "a directory has that name; remove it or save to another path"
        elif err.errno in (errno.ENOTDIR, errno.EEXIST):  # mkdir under a file
            fix = "a file stands where a directory is needed; save to another path"
        else:
            fix = "check the destination or save to another path"
        raise DestinationError(err.errno, f"cannot write {target}: {err.strerror}; {fix}") from None


def _file_above(target: Path) -> Path | None:
    """The nearest existing ancestor of ``target`` when it is not a directory, else None."""
    for parent in Path(target).parents:
        if parent.exists() or parent.is_symlink():
            return None if parent.is_dir() else parent
    return None


STAGING_PREFIX = ".tensorbridge-tmp-"  # a multi-file save's staging directory


def _staged_beside(name: str, target: Path) -> bool:
    """Whether ``name`` lies in the staging directory a store ``target`` is built in."""
    where = os.path.abspath(target)
    staged = re.escape(os.path.join(os.path.dirname(where), STAGING_PREFIX))
    pattern = staged + r"[0-9a-f]{32}\." + re.escape(os.path.basename(where))
    return re.match(pattern + r"(/|$)", os.path.abspath(name)) is not None


def fsync_dir(directory: Path) -> None:
    """Make a directory's entries (creations, renames, removals) durable."""
    with contextlib.suppress(OSError):  # some filesystems refuse fsync on a directory
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def read_small(path: Path, limit: int, what: str, links: Links | None = None) -> bytes:
    """A small regular file's bytes (an index, a metadata pickle), refused past ``limit``.

    The buffer grows with the bytes actually read, never with the limit or a claimed
    size (:func:`~tensorbridge.io._files.read_limited`); ``links``: ``path`` is a file a
    checkpoint names, confined to it.

    Raises:
        FormatError: the file is over ``limit`` bytes, or no regular file.
        LinkError: a link out of the checkpoint ``links`` confines.
    """
    if links is not None:
        return links.read(path, limit, what)
    return read_limited(path, limit, what)


def row_of(x: Any) -> DTypeRow:
    """The table row of a tensor's or array's dtype (byte-swapped arrays: their native row)."""
    if is_tensor(x):
        return resolve_dtype(x.dtype)
    return numpy_row(x)


def cast_target(src: DTypeRow, float_dtype: Any) -> DTypeRow:
    """``float_dtype`` applies to floating-point values only; everything else keeps its dtype."""
    if float_dtype is None or not src.is_floating:
        return src
    dst = resolve_dtype(float_dtype)
    if not dst.is_floating:
        raise UnsupportedDtypeError(
            f"float_dtype={dst.name} is not a floating-point dtype; pass a float dtype such "
            "as 'bfloat16' (integer tensors keep their dtype)"
        )
    return dst


def iter_bytes(
    x: Any, dst: DTypeRow | None = None, chunk_bytes: int = DEFAULT_CHUNK
) -> Iterator[memoryview]:
    """Yield ``x``'s values as ``dst`` bytes in C order, about ``chunk_bytes`` at a time.

    ``x`` is a tensor (any device) or an array (memory-mapped ones included). A
    yielded view is only valid until the next one is requested: the cast buffer is
    reused.
    """
    src = row_of(x)
    dst = dst or src
    if is_tensor(x):
        if x.device.type != "cpu":
            yield from _iter_device(x, src, dst, chunk_bytes)
            return
        from ..convert import to_numpy

        a = to_numpy(x)
    else:
        a = np.asarray(x)
    if a.size == 0:
        return
    per_elem = max(src.itemsize, dst.itemsize)
    step = max(1, chunk_bytes // per_elem)
    if dst is not src:
        from .. import _memory as mem  # a cast: torch's kernel

    release = releaser(a)
    buf: np.ndarray | None = None
    if a.flags.c_contiguous:
        flat = a.reshape(-1)
        pieces: Iterator[np.ndarray] = (flat[i : i + step] for i in range(0, flat.size, step))
    else:
        rows = max(1, step // max(1, a[0].size if a.ndim else 1))
        pieces = (a[i : i + rows] for i in range(0, a.shape[0], rows))
    for piece in pieces:
        if dst is src and piece.flags.c_contiguous and piece.dtype.isnative:
            yield piece.view(src.carrier_numpy).reshape(-1).view(np.uint8).data
        else:
            if buf is None:
                buf = np.empty(min(step, a.size) if a.flags.c_contiguous else piece.size, dst.numpy)
            out = buf[: piece.size].reshape(piece.shape)
            if dst is src:
                np.copyto(out, piece)
            else:
                native = piece if piece.dtype.isnative else piece.astype(src.numpy)
                mem.as_tensor(out, dst).copy_(mem.reader(native, src))
            yield out.reshape(-1).view(dst.carrier_numpy).view(np.uint8).data
        release(piece)


def _iter_device(
    t: torch.Tensor, src: DTypeRow, dst: DTypeRow, chunk_bytes: int
) -> Iterator[memoryview]:
    from ..convert import to_numpy

    flat = t.reshape(-1)
    step = max(1, chunk_bytes // max(src.itemsize, dst.itemsize))
    for i in range(0, flat.numel(), step):
        piece = flat[i : i + step].to(dst.torch).cpu()
        yield to_numpy(piece).view(dst.carrier_numpy).view(np.uint8).data


def _shared_map(a: np.ndarray) -> mmap.mmap | None:
    """The memory map behind ``a`` if dropping its pages loses nothing (not copy-on-write).

    ``np.memmap`` records its mode; a read-only ``memoryview`` of an ``mmap`` (what
    tensorbridge's own readers hand out) can only come from an ``ACCESS_READ`` map.
    """
    base: Any = a
    while base is not None:
        cand = getattr(base, "_mmap", None)
        if isinstance(cand, mmap.mmap):
            return cand if getattr(base, "mode", "c") in ("r", "r+", "w+") else None
        if isinstance(base, memoryview):
            return base.obj if isinstance(base.obj, mmap.mmap) and base.readonly else None
        base = getattr(base, "base", None)
    return None


def releaser(a: np.ndarray) -> Any:
    """For a shared (not copy-on-write) memory map, drop pages from RSS once written.

    ``release(piece)`` drops the whole pages inside the span of ``piece`` (any view of
    ``a``, strided ones included); for an array that is no such map it does nothing.
    """
    mm = _shared_map(a)
    if mm is None:
        return lambda piece: None
    start = np.frombuffer(mm, np.uint8).__array_interface__["data"][0]
    size = len(mm)

    def release(piece: np.ndarray) -> None:
        if piece.size == 0:
            return
        low, high = byte_bounds(piece)
        addr = low - start
        lo = max(0, addr // _PAGE * _PAGE)
        hi = min(size, high - start)
        if 0 <= lo < hi:
            with contextlib.suppress(OSError, ValueError):
                mm.madvise(mmap.MADV_DONTNEED, lo, hi - lo)

    return release


class Deferred(abc.ABC):
    """A tensor computed piece by piece while it is written (a dequantized weight).

    A writer that streams (safetensors) asks for :attr:`shape` and :attr:`row` to
    write the header, then pulls the values' bytes in C order, so memory holds a few
    pieces, not the tensor: from :meth:`tasks` where a subclass gives them (computed
    ahead by worker threads while the writer writes, across tensors: see
    :mod:`tensorbridge.io._pipeline`), else from :meth:`chunks`.
    """

    shape: tuple[int, ...]
    row: DTypeRow

    def tasks(self, chunk_bytes: int) -> Iterator[Task] | None:
        """The values as tasks, each filling a :class:`~tensorbridge.io._pipeline.Slot`
        with about ``chunk_bytes`` of the next bytes and returning them; independent of
        one another (they run in parallel). None: this value only has :meth:`chunks`."""
        return None

    def chunks(self, chunk_bytes: int) -> Iterator[memoryview]:
        """The values as ``row`` bytes in C order, a piece at a time; each chunk may be a
        reused buffer, valid until the next one is pulled (write it, don't keep it)."""
        tasks = self.tasks(min(chunk_bytes, STREAM_CHUNK))
        if tasks is None:  # pragma: no cover - a subclass gives one or the other
            raise NotImplementedError(f"{type(self).__qualname__} defines neither tasks nor chunks")
        for _, view in pipelined((None, t) for t in tasks):
            yield view


# --- reading ----------------------------------------------------------------------------------


def map_file(path: str | os.PathLike[str], *, copy_on_write: bool = False) -> mmap.mmap | bytes:
    """Map a whole file read-only (or copy-on-write); empty files give ``b""``."""
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        access = mmap.ACCESS_COPY if copy_on_write else mmap.ACCESS_READ
        return mmap.mmap(f.fileno(), 0, access=access)


class FileReader(io.RawIOBase):
    """A read-only, seekable file over an open descriptor, with a position of its own.

    Readers keep the descriptor of the file they opened and read through it (``pread``)
    instead of opening the path again: a path that another save has since replaced
    atomically names a new file, the descriptor still the one opened (one handle, one
    version). Several readers may share one descriptor. Closing this object leaves the
    descriptor open.
    """

    def __init__(self, fd: int, size: int) -> None:
        super().__init__()
        self.fd, self.size, self.pos = fd, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + pos)
        return self.pos

    def tell(self) -> int:
        return self.pos

    def readinto(self, b: Any) -> int:
        view = memoryview(b).cast("B")
        if hasattr(os, "preadv"):
            n = os.preadv(self.fd, [view], self.pos)
        else:  # pragma: no cover - Windows
            data = os.pread(self.fd, len(view), self.pos)
            n = len(data)
            view[:n] = data
        self.pos += n
        return n


def open_reader(path: str | os.PathLike[str]) -> tuple[int, int]:
    """A read-only descriptor of ``path`` (closed on exec), a regular file (see
    :func:`~tensorbridge.io._files.open_fd`: a FIFO or device is refused unopened), and
    the file's size."""
    fd = open_fd(path)
    try:
        return fd, os.fstat(fd).st_size
    except BaseException:
        os.close(fd)
        raise


def identity(st: os.stat_result) -> tuple[int, int, int, int]:
    """What tells one version of a file from another: device, inode, size, modification time."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def check_same_version(
    path: str | os.PathLike[str], opened: tuple[int, ...], where: object
) -> None:
    """Refuse to go on reading a checkpoint whose file ``path`` is no longer the one opened.

    For files a reader must open by path after the checkpoint was opened (a Zarr
    store's chunks): ``opened`` is :func:`identity` of ``path`` when it was.

    Raises:
        FormatError: ``path`` was replaced (another save committed) or removed.
    """
    try:
        now = identity(os.stat(path))
    except OSError:
        now = None
    if now != opened:
        raise FormatError(
            f"{where} was replaced since it was opened (another save committed a new "
            "version); this handle reads only the version it opened: open it again"
        )


def check_unchanged(file: int | str | os.PathLike[str], size: int, where: object) -> None:
    """Refuse to hand out a view of a mapped file whose size changed since it was opened.

    Touching a mapped page past the end of a file that another process truncated
    raises SIGBUS, which kills the interpreter; this ``fstat`` (or ``stat`` of the
    path) before each view turns the common case into a :class:`FormatError`. A
    truncation that races a read already in progress can still SIGBUS: no check
    can close that window (see docs/dev/robustness.md).

    ``file`` is a descriptor of the mapped file or its path.
    """
    now = os.fstat(file).st_size if isinstance(file, int) else os.stat(file).st_size
    if now != size:
        raise FormatError(
            f"{where} changed size since it was opened ({size} -> {now} bytes): another "
            "process is writing it; open it again once that write is complete"
        )


def array_at(
    buf: Any, offset: int, shape: tuple[int, ...], row: DTypeRow, *, name: str = "?"
) -> np.ndarray:
    """A zero-copy array of ``shape`` and ``row``'s dtype at ``offset`` of ``buf``."""
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    nbytes = count * row.itemsize
    if offset < 0 or offset + nbytes > len(buf):
        raise FormatError(
            f"tensor {name!r}: bytes {offset}..{offset + nbytes} lie outside the file's "
            f"{len(buf)} bytes; the file is truncated or corrupt"
        )
    if count == 0:
        try:
            return np.empty(shape, row.numpy)
        except ValueError:  # a zero beside dimensions whose product NumPy cannot index
            raise FormatError(
                f"tensor {name!r}: the shape {list(shape)} has no elements but dimensions "
                "too large to index; the file is corrupt"
            ) from None
    return (
        np.frombuffer(buf, dtype=row.carrier_numpy, count=count, offset=offset)
        .view(row.numpy)
        .reshape(shape)
    )


# --- the reader every format returns from open() ---------------------------------------------


class TensorFile(abc.ABC):
    """A lazily read tensor file: ``keys()``, ``[name]``, ``metadata``; nothing read until asked.

    Formats subclass it and implement :meth:`keys`, :meth:`info` and :meth:`_array`
    (the stored array: a zero-copy view where the format allows it, read-only, or
    copy-on-write when asked). ``[name]`` returns that NumPy array; :meth:`get`
    converts it the way ``tb.load`` does.
    """

    metadata: dict[str, str]
    notes: list[str]  # what a user should know about how the file was read (shown by the CLI)
    aliases: dict[str, str]  # a tied name -> the stored name it shares (written once)
    single: bool = False  # one bare array (.npy, a .pt of one tensor): load returns it alone
    follow_links: bool = False  # opened with follow_links=True: files it names may lie anywhere

    def __init__(self) -> None:
        self.metadata = {}
        self.notes = []
        self.aliases = {}

    @abc.abstractmethod
    def keys(self) -> list[str]:
        """The entries' names, in file order."""

    @abc.abstractmethod
    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        """The stored dtype row and shape of ``name``, without reading its data."""

    @abc.abstractmethod
    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        """The stored array: a read-only view, or copy-on-write when asked, where possible."""

    def _restore_ties(self, where: dict[str, Any]) -> None:
        """Tied names, saved once and recorded in metadata as ``{name: kept}`` (safetensors'
        ``save_model`` convention), become aliases of ``kept`` in the name table ``where``."""
        for name, kept in list(self.metadata.items()):
            if kept in where and (name not in where or name in self.aliases):
                where.setdefault(name, where[kept])
                self.aliases[name] = kept
                del self.metadata[name]

    def plain_values(self) -> dict[str, Any]:
        """The file's non-tensor values, as typed as the format keeps them (strings by default)."""
        return dict(self.metadata)

    def structure(self) -> Any:
        """The nesting the entries were stored in, or None where the file records none.

        A skeleton (:func:`tensorbridge.io._keys.skeleton`): the stored containers, each
        leaf a ``Leaf`` naming its entry in :meth:`keys` (a tensor) or
        :meth:`plain_values` (any other value). A writer that keeps nesting (``.pt``)
        rebuilds the tree from it; every other reader keeps flat names (None).
        """
        return None

    def unsupported(self) -> dict[str, str]:
        """Entries that cannot be read as tensors (strings, objects), with the reason for each.

        They are listed by :meth:`keys` like every other entry; reading one raises.
        """
        out = {}
        for name in self.keys():
            try:
                self.info(name)
            except UnsupportedDtypeError as err:
                out[name] = str(err)
        return out

    def stream_value(self, name: str) -> Any:
        """``name`` as a writer takes it, nothing read yet: the stored array, mapped read-only.

        A file whose values are computed (a dequantized checkpoint) gives a
        :class:`Deferred` that writers able to stream compute as they write.
        """
        return self._array(name, copy_on_write=False)

    def _owned(self, name: str) -> np.ndarray:
        """The stored array in new, writable memory; formats may read the file straight into it."""
        return np.array(self._array(name, copy_on_write=False), copy=True)

    def __getitem__(self, name: str) -> Any:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def get(
        self,
        name: str,
        *,
        framework: str = "numpy",
        mmap: bool = True,
        device: DeviceLike | None = None,
        float_dtype: DTypeLike | None = None,
    ) -> Any:
        """One entry as a NumPy array (read-only when ``mmap``) or a torch tensor.

        One rule, whatever the storage (plain or compressed, byte-swapped, empty): with
        ``mmap=True`` NumPy results are read-only, and torch results are writable
        (copy-on-write where the file is mapped: a write never reaches the file);
        ``mmap=False`` gives ordinary owned, writable memory.
        """
        if name not in self:
            raise KeyError(f"{name!r} is not in this file; its keys are {self.keys()[:10]}")
        if framework not in ("numpy", "torch"):
            raise InvalidArgumentError(
                f"framework={framework!r} is not supported; pass 'numpy' or 'torch'"
            )
        as_torch = framework == "torch"
        copy: bool | None = None
        if mmap:
            a = self._array(name, copy_on_write=as_torch)
        elif float_dtype is None or not self.info(name)[0].is_floating:
            a = self._owned(name)  # one copy, straight from the file
        else:
            a = self._array(name, copy_on_write=False)  # the cast makes the only copy
            copy = True
        dst = cast_target(row_of(a), float_dtype)
        if as_torch:
            from ..convert import to_torch

            return to_torch(a, dtype=dst, device=device, copy=copy)
        return run_numpy(a, dst, copy, mmap)  # to_numpy's plan for an array, without torch

    def read(self, keys: Any = None, **options: Any) -> Any:
        """Every entry (or ``keys``) converted by :meth:`get`: what ``tb.load`` returns.

        A file that holds one bare array (``single``: a ``.npy``, a ``.pt`` of one
        tensor) gives that array itself; any other file a dict by name. Every key is
        checked before anything is read.
        """
        names = self.keys() if keys is None else [keys] if isinstance(keys, str) else list(keys)
        if self.single and names != self.keys():
            raise KeyError(
                f"this file holds one array, {self.keys()[0]!r}; pass keys=None or "
                f"keys={self.keys()}"
            )
        if keys is None:
            unsupported = self.unsupported()
            if unsupported and self.single:  # no other entry to read instead
                raise UnsupportedDtypeError(next(iter(unsupported.values())))
            if unsupported:
                first, reason = next(iter(unsupported.items()))
                more = f" (and {len(unsupported) - 1} more)" if len(unsupported) > 1 else ""
                raise UnsupportedDtypeError(
                    f"{reason}{more}; read the other entries with keys= (command line: "
                    f"--exclude {first}, or --skip-unsupported)"
                )
        missing = [n for n in names if n not in self]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise KeyError(
                f"{missing[0]!r}{more} is not in this file; its keys are {self.keys()[:10]}"
            )
        bar = NoBar()
        if options.get("mmap") is False:  # a real read of every byte: worth a bar if long
            total = sum(self.nbytes(n) for n in names)
            bar = progress_bar(
                total,
                f"loading {self.filename}",
                options.pop("progress", None),
                tensors=len(names),
            )
        out = {}
        try:
            for n in names:
                out[n] = self.get(n, **options)
                bar.update(self.nbytes(n))
        finally:
            bar.close()
        return out[names[0]] if self.single else out

    def nbytes(self, name: str) -> int:
        """The stored size of ``name`` in bytes, from the header alone."""
        row, shape = self.info(name)
        count = 1
        for n in shape:
            count *= n
        return count * row.itemsize

    @property
    def filename(self) -> str:
        """The file's name, for messages and progress bars."""
        path = getattr(self, "path", None) or getattr(self, "_path", None)
        return os.path.basename(str(path)) if path is not None else type(self).__name__

    def close(self) -> None:  # noqa: B027 - a format with nothing to release keeps this
        """Release the file; arrays already handed out stay valid."""

    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def loader(open_: Callable[..., TensorFile], doc: str | None) -> Callable[..., Any]:
    """The ``load`` of a module whose ``open`` is ``open_``: one function for every format.

    ``load(path, *, framework, mmap, device, float_dtype, keys, **options)`` opens the
    file with ``open_(path, **options)`` (the keyword options ``open_`` takes: ``dtype``,
    ``dequantize``, ``follow_links``, ...) and returns :meth:`TensorFile.read`'s result.
    Its signature, module and docstring (``doc``, whose examples run as the module's
    doctests) are ``open_``'s module's own.

    >>> import inspect
    >>> from tensorbridge.io import npz
    >>> list(inspect.signature(npz.load).parameters)
    ['path', 'framework', 'mmap', 'device', 'float_dtype', 'keys', 'dtype']
    """
    common = inspect.signature(_read_options).parameters.values()
    opening = [
        p
        for p in inspect.signature(open_).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    ]
    accepted = {p.name for p in opening}

    def load(
        path: str | os.PathLike[str],
        *,
        framework: str = "numpy",
        mmap: bool = True,
        device: DeviceLike | None = None,
        float_dtype: DTypeLike | None = None,
        keys: Any = None,
        **options: Any,
    ) -> Any:
        unknown = sorted(set(options) - accepted)
        if unknown:
            raise TypeError(f"load() got an unexpected keyword argument {unknown[0]!r}")
        return load_with(
            open_,
            path,
            framework=framework,
            mmap=mmap,
            device=device,
            float_dtype=float_dtype,
            keys=keys,
            **options,
        )

    load.__module__ = open_.__module__
    load.__doc__ = doc
    load.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [*common, *opening], return_annotation="Any"
    )
    return load


def load_with(
    open_: Callable[..., TensorFile],
    path: str | os.PathLike[str],
    *,
    framework: str = "numpy",
    mmap: bool = True,
    device: DeviceLike | None = None,
    float_dtype: DTypeLike | None = None,
    keys: Any = None,
    **options: Any,
) -> Any:
    """What every ``load`` does: ``open_(path, **options)``, then every entry (or ``keys``)
    as :meth:`TensorFile.read` gives them, the file closed after."""
    with open_(path, **options) as f:
        return f.read(keys, framework=framework, mmap=mmap, device=device, float_dtype=float_dtype)


def _read_options(
    path: str | os.PathLike[str],
    *,
    framework: str = "numpy",
    mmap: bool = True,
    device: DeviceLike | None = None,
    float_dtype: DTypeLike | None = None,
    keys: Any = None,
) -> None:
    """The parameters every ``load`` has (:func:`loader` builds the signature from them)."""

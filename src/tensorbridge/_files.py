"""Opening the files a reader is given: regular files only, reads bounded, links confined.

Every reader opens its files here, so three promises hold for every format:

* :func:`open_regular` opens a path without blocking (``O_NONBLOCK``: a FIFO with no
  writer would otherwise hang the open), checks the opened descriptor (``fstat``,
  never a ``stat`` of the path before the open, which a swap could defeat) and refuses
  anything but a regular file: a FIFO, a character or block device (``/dev/zero``
  reads forever while its ``st_size`` says 0), a socket, a directory.
* :func:`read_limited` reads a small file (JSON, a metadata pickle) by the bytes it
  actually gets, at most ``limit`` of them: the size ``fstat`` reports is never
  trusted alone (a file may grow while it is read).
* :class:`Links` confines the files a checkpoint names (shards, Zarr chunks, a DCP
  ``.distcp``, a ``config.json``) to the checkpoint's directory: one whose real path
  (every link resolved) lies outside is refused with :class:`~tensorbridge.errors.LinkError`
  unless the caller passed ``follow_links=True`` (command line: ``--follow-links``).
  The path the caller gave is their own choice and may be a link. Inside a Hugging Face
  cache (``models--org--name/snapshots/<rev>/<file>``, each file a link to
  ``../../blobs/<hash>``, as ``huggingface_hub`` downloads), the confining directory is
  that cache repository, so its links are followed by default.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from .errors import FormatError, LinkError

__all__ = ["Links", "open_regular", "physical_memory", "read_limited", "read_regular"]

_FLAGS = os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)  # a terminal device never becomes ours by opening it

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _kind(mode: int) -> str:
    return next((what for test, what in _KINDS if test(mode)), "no regular file")


def _special(path: str | os.PathLike[str], kind: str) -> FormatError:
    return FormatError(
        f"{os.fspath(path)} is {kind}, not a regular file; tensorbridge reads tensors from "
        "regular files only (copy the data into a file and pass that)"
    )


def open_fd(
    path: str | os.PathLike[str], *, nofollow: bool = False, name: str | None = None
) -> int:
    """A descriptor of ``path`` opened read-only, refused unless it is a regular file.

    The open never blocks (a FIFO without a writer opens at once with ``O_NONBLOCK``,
    which is then cleared); the type is taken from the opened descriptor. ``nofollow``:
    the last component may not be a link (its real path was checked already). ``name``:
    what messages call the file (default ``path``).

    Raises:
        FormatError: a FIFO, device, socket or directory.
        FileNotFoundError / PermissionError: as ``open`` raises them.
    """
    shown = name or os.fspath(path)
    flags = _FLAGS | _NONBLOCK | _NOCTTY | (getattr(os, "O_NOFOLLOW", 0) if nofollow else 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ENXIO:  # a socket (or a FIFO opened for writing): no file
            raise _special(shown, "a socket") from None
        if err.errno == errno.EISDIR:
            raise _special(shown, "a directory") from None
        if err.errno == errno.ELOOP and nofollow:
            raise LinkError(f"{shown} became a link while it was opened; open it again") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise _special(shown, _kind(mode))
        if _NONBLOCK:
            os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_regular(path: str | os.PathLike[str], *, nofollow: bool = False) -> BinaryIO:
    """``open(path, "rb")`` for regular files only (see :func:`open_fd`).

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with open(os.path.join(d, "a.bin"), "wb") as f:
    ...     _ = f.write(b"abc")
    >>> with open_regular(os.path.join(d, "a.bin")) as f:
    ...     f.read()
    b'abc'
    >>> os.mkfifo(os.path.join(d, "pipe"))
    >>> open_regular(os.path.join(d, "pipe"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tensorbridge.errors.FormatError: .../pipe is a FIFO (named pipe), not a regular file; ...
    """
    return os.fdopen(open_fd(path, nofollow=nofollow), "rb")


def read_regular(f: BinaryIO, path: str | os.PathLike[str], limit: int, what: str) -> bytes:
    """The rest of ``f`` (opened by :func:`open_regular`), at most ``limit`` bytes.

    The buffer grows with the bytes actually read, never with ``limit`` or a size
    ``fstat`` claims: ``limit + 1`` bytes are asked for in pieces, and getting them
    refuses the file.

    Raises:
        FormatError: more than ``limit`` bytes.
    """
    size = os.fstat(f.fileno()).st_size
    want = min(size, limit) + 1  # one more than the file holds: EOF is seen, not assumed
    parts = []
    got = 0
    while got <= limit:
        piece = f.read(min(max(want - got, 1 << 16), limit + 1 - got))
        if not piece:
            break
        parts.append(piece)
        got += len(piece)
    if got > limit:
        raise FormatError(f"{os.fspath(path)}: over {limit:,} bytes, the limit of any {what}")
    return b"".join(parts)


def read_limited(
    path: str | os.PathLike[str], limit: int, what: str, *, nofollow: bool = False
) -> bytes:
    """A small regular file's bytes, refused past ``limit`` bytes (see :func:`read_regular`).

    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "c.json")
    >>> with open(p, "w") as f:
    ...     _ = f.write("{}")
    >>> read_limited(p, 2, "config")
    b'{}'
    >>> read_limited(p, 1, "config")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tensorbridge.errors.FormatError: .../c.json: over 1 bytes, the limit of any config
    """
    with open_regular(path, nofollow=nofollow) as f:
        return read_regular(f, path, limit, what)


# --- links ------------------------------------------------------------------------------------

_HF_REPO_PREFIXES = ("models--", "datasets--", "spaces--")  # huggingface_hub's repo folders


def _hf_repository(root: Path) -> Path | None:
    """The Hugging Face cache repository (``models--org--name``) ``root`` is a snapshot in."""
    for parent in root.parents:
        if (
            parent.name.startswith(_HF_REPO_PREFIXES)
            and root.is_relative_to(parent / "snapshots")
            and (parent / "blobs").is_dir()
        ):
            return parent
    return None


@dataclass(frozen=True)
class Links:
    """Where the files a checkpoint names may lead: its directory, unless links are followed.

    ``root`` is the checkpoint's directory (every link in it resolved: the caller chose
    the path), ``area`` where files it names may really lie (``root``, or the Hugging
    Face cache repository holding it). With ``follow`` every link is followed.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> os.symlink("/etc/hostname", os.path.join(d, "shard.safetensors"))
    >>> Links.of(d).check(os.path.join(d, "shard.safetensors"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tensorbridge.errors.LinkError: .../shard.safetensors is a link to /etc/hostname, outside ...
    >>> Links.of(d, follow=True).check(os.path.join(d, "shard.safetensors"))
    PosixPath('/etc/hostname')
    """

    root: Path
    area: Path
    follow: bool = False

    @classmethod
    def of(cls, checkpoint: str | os.PathLike[str], *, follow: bool = False) -> Links:
        """The confinement of the checkpoint at ``checkpoint``: a directory, or a file in one."""
        p = Path(os.path.abspath(checkpoint))
        root = Path(os.path.realpath(p if p.is_dir() else p.parent))
        return cls(root, _hf_repository(root) or root, follow)

    def check(self, path: str | os.PathLike[str]) -> Path:
        """The real path of ``path``, a file the checkpoint names, refused if outside.

        Raises:
            LinkError: ``path`` (or a directory on its way) is a link leading outside
                the checkpoint's directory, and links are not followed.
        """
        real = Path(os.path.realpath(path))
        if self.follow or real.is_relative_to(self.area):
            return real
        where = "Hugging Face cache repository" if self.area != self.root else "directory"
        raise LinkError(
            f"{os.fspath(path)} is a link to {real}, outside the checkpoint's {where} "
            f"{self.area}; links out of a checkpoint are not followed: pass follow_links=True "
            "(command line: --follow-links) if you trust where it leads"
        )

    def open_fd(self, path: str | os.PathLike[str]) -> int:
        """:func:`open_fd` of a file the checkpoint names, once :meth:`check` passes."""
        real = self.check(path)
        shown = os.fspath(path)
        if str(real) != os.path.abspath(path):
            shown += f" (a link to {real})"
        return open_fd(real, nofollow=True, name=shown)

    def open(self, path: str | os.PathLike[str]) -> BinaryIO:
        """:func:`open_regular` of a file the checkpoint names, once :meth:`check` passes."""
        return os.fdopen(self.open_fd(path), "rb")

    def read(self, path: str | os.PathLike[str], limit: int, what: str) -> bytes:
        """:func:`read_limited` of a file the checkpoint names, once :meth:`check` passes."""
        with self.open(path) as f:
            return read_regular(f, path, limit, what)


def physical_memory() -> int:
    """This machine's RAM in bytes (no limit where the platform does not say): the bound a
    reader checks a declared size against before it allocates."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62

"""Atomic writes: a file is replaced whole or not at all, and a failed write says why.

* :func:`atomic_write` — a temporary file in the target directory, fsync, rename:
  an interrupted save leaves the previous file or nothing, never a truncated file
  under the final name.
* :class:`StagedFiles` — several files written to temporaries, then renamed into
  place together (shards and their index).
* :func:`destination_errors` — an ``OSError`` of the destination becomes a
  :class:`~tensorbridge.errors.DestinationError` naming the path and the fix.
* :func:`fsync_dir`, :func:`fsync_file`, :func:`fsync_tree` — the one home of
  making written files and directory entries durable (the multi-file commit of
  :mod:`tensorbridge._commit` uses them too).

Every layer that writes files uses this module: the formats of :mod:`tensorbridge.io`,
the quantized writers, the DCP writers and :mod:`tensorbridge.checkpoint`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from ._locks import Claim, alive, commit_lock, is_claim_name, remove_dead_claims
from .errors import DestinationError


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], *, readable: bool = False) -> Iterator[BinaryIO]:
    """Open a temporary file beside ``path``; on success fsync it and rename it into place.

    ``readable=True`` opens it for reading too, for a writer whose library reads back
    what it wrote (HDF5's, through h5py's file-object driver).

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
        with staged.write(path, readable=readable) as f:
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
    def write(self, path: str | os.PathLike[str], *, readable: bool = False) -> Iterator[BinaryIO]:
        """A temporary file beside ``path`` (open for reading too when ``readable``), fsynced
        when the block ends without an error."""
        target = Path(path)
        with destination_errors(target, only_destination=True):
            target.parent.mkdir(parents=True, exist_ok=True)
            if target.is_dir():
                raise IsADirectoryError(errno.EISDIR, "Is a directory")
            tmp = str(self.claim(target.parent).temp(target))
            access = os.O_RDWR if readable else os.O_WRONLY
            flags = access | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
            fd = os.open(
                tmp, flags | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0), 0o600
            )
        try:
            with destination_errors(target, tmp):
                umask = os.umask(0)
                os.umask(umask)
                os.fchmod(fd, 0o666 & ~umask)
                with os.fdopen(fd, "w+b" if readable else "wb") as f:
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
    is still running (its claim is held: :mod:`tensorbridge._locks`) is kept.
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


def fsync_file(path: str | os.PathLike[str]) -> None:
    """Make a written file's bytes durable (by path: the writer's descriptor is closed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(path: Path) -> None:
    """fsync a file, or every file and directory under a directory."""
    if path.is_dir():
        for root, _, files in os.walk(path):
            for name in files:
                fsync_file(Path(root) / name)
            fsync_dir(Path(root))
    else:
        fsync_file(path)

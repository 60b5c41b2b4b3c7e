"""Advisory locks that keep concurrent saves to one destination apart.

Two saves may write one destination at the same time (two processes, two threads).
Each writes its new files under hidden names, in parallel; what they must never do
is interleave their commits or delete each other's files. Two kinds of lock, both
``flock`` (per open file, so threads of one process exclude each other too; released
by the kernel when a process dies, so a killed save never blocks the next one):

* A save's **claim** on a directory: ``DIR/.tensorbridge-save-<token>.lock``,
  created and locked before the save's first temporary in ``DIR`` and held until
  the save has committed or removed all of them. Its temporaries carry the token
  (``.NAME.<token>.tmp``; staging directories ``.tensorbridge-tmp-<token>``), and
  cleanup asks :func:`alive` before it removes one: a running save holds its claim,
  a killed one's can be taken, and what it left behind is removed.
* A directory's **commit lock**: ``DIR/.tensorbridge.lock``, held by one save at a
  time while it renames its files into place and cleans up (never while it writes),
  so two commits never interleave and the last to commit wins, whole.

A lock file is removed by its holder before it lets go; one that a killed process
left is taken over, and removed, by the next save. Where ``fcntl`` is missing
(Windows) both are no-ops: an open file cannot be deleted there anyway.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> claim = Claim(d)
>>> alive(d, claim.token), claim.release(), alive(d, claim.token)
(True, None, False)
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

COMMIT_LOCK = ".tensorbridge.lock"  # a directory's commit lock
CLAIM_PREFIX, CLAIM_SUFFIX = ".tensorbridge-save-", ".lock"
CLAIM_NAME = re.compile(re.escape(CLAIM_PREFIX) + r"([0-9a-z_]+)" + re.escape(CLAIM_SUFFIX))
_FLAGS = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def is_lock_name(name: str) -> bool:
    """Whether ``name`` is a lock file of this module (readers and cleanups skip them)."""
    return name == COMMIT_LOCK or CLAIM_NAME.fullmatch(name) is not None


def _same(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (not removed, not replaced)."""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:
        return False
    mine = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (mine.st_dev, mine.st_ino)


class Claim:
    """One save's claim on the temporaries it writes in ``directory``.

    ``token`` (default: 8 random characters) names the claim and goes into the names
    of the save's temporaries. :meth:`release` once they are committed or removed.
    """

    def __init__(self, directory: str | os.PathLike[str], token: str | None = None) -> None:
        self.directory = Path(directory)
        self.token = token or secrets.token_hex(4)
        self.path = self.directory / f"{CLAIM_PREFIX}{self.token}{CLAIM_SUFFIX}"
        self._fd: int | None = None
        if fcntl is None:  # pragma: no cover - Windows
            return
        for attempt in range(1000):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL | _FLAGS, 0o644)
            except FileExistsError:
                if token is None:  # a random token that is taken: draw another
                    self.token = secrets.token_hex(4)
                    self.path = self.directory / f"{CLAIM_PREFIX}{self.token}{CLAIM_SUFFIX}"
                else:  # a cleanup is removing a dead claim of that name: let it finish
                    time.sleep(0.001 * min(attempt + 1, 20))
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if _same(fd, self.path):
                    self._fd = fd
                    self._closer = weakref.finalize(self, os.close, fd)
                    return
            except BlockingIOError:
                pass  # a cleanup took it for a dead claim between the create and the lock
            except BaseException:
                os.close(fd)
                raise
            os.close(fd)
        raise FileExistsError(f"cannot claim {self.path}: it is held by another save")

    def temp(self, target: Path) -> Path:
        """This save's temporary beside ``target``: ``.NAME.<token>.tmp`` (in this claim's
        directory)."""
        return self.directory / f".{target.name}.{self.token}.tmp"

    def release(self) -> None:
        """Give up the claim (its temporaries committed or removed); the lock file goes."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                with contextlib.suppress(OSError):
                    if _same(fd, self.path):
                        os.unlink(self.path)
            finally:
                self._closer()  # the lock goes with the descriptor, whatever happened


def alive(directory: str | os.PathLike[str], token: str) -> bool:
    """Whether the save ``token`` that wrote into ``directory`` is still running.

    False for a save that was killed (its claim is free) or finished (no claim), so
    what it left behind may be removed; without ``fcntl`` always False.
    """
    if fcntl is None:  # pragma: no cover - Windows
        return False
    path = Path(directory) / f"{CLAIM_PREFIX}{token}{CLAIM_SUFFIX}"
    try:
        fd = os.open(path, os.O_RDONLY | _FLAGS)
    except FileNotFoundError:
        return False
    except OSError:
        return True  # not a file this module made (a link): leave its temporaries alone
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def is_claim_name(name: str) -> bool:
    """Whether ``name`` is a save's claim file."""
    return CLAIM_NAME.fullmatch(name) is not None


def remove_dead_claims(where: str | os.PathLike[str] | list[Path]) -> None:
    """Remove the claim files that killed saves left in the directory ``where`` (or the
    claim files listed)."""
    if fcntl is None:  # pragma: no cover - Windows
        return
    paths: list[Path] = []
    if isinstance(where, list):
        paths = where
    else:
        with contextlib.suppress(OSError), os.scandir(where) as entries:
            paths = [Path(e.path) for e in entries if is_claim_name(e.name)]
    for path in paths:
        _remove_if_free(path)


def _remove_if_free(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | _FLAGS)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _same(fd, path):
            os.unlink(path)
    except OSError:
        pass  # held: a live save's claim
    finally:
        os.close(fd)


_HELD: dict[tuple[int, str], list[int]] = {}  # (thread, lock path) -> [descriptor, depth]


@contextlib.contextmanager
def commit_lock(directory: str | os.PathLike[str]) -> Iterator[None]:
    """Hold ``directory``'s commit lock for the block (re-entrant within one thread).

    Waits while another save commits into ``directory``. The directory must exist.
    """
    if fcntl is None:  # pragma: no cover - Windows
        yield
        return
    path = Path(os.path.abspath(directory)) / COMMIT_LOCK
    key = (threading.get_ident(), str(path))
    held = _HELD.get(key)
    if held is not None:
        held[1] += 1
        try:
            yield
        finally:
            held[1] -= 1
        return
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | _FLAGS, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if _same(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # its holder removed it as it let go: lock the one there now
    _HELD[key] = [fd, 1]
    try:
        yield
    finally:
        del _HELD[key]
        try:
            with contextlib.suppress(OSError):
                os.unlink(path)
        finally:
            os.close(fd)  # the lock goes with the descriptor, whatever happened

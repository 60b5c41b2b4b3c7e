"""The atomic multi-rank commit: a checkpoint is either complete under its final names or absent.

Every writer in this package (one file per shard, one directory per array) follows
the same protocol, so a reader can tell a finished checkpoint from a save that
died half way:

1. **Begin** (the coordinator, before any rank writes: DCP's ``prepare_global_plan``).
   A fresh save id names a staging directory inside the destination,
   ``DIR/.tensorbridge-tmp-<save id>/``; :func:`begin` creates it (and ``DIR``). The
   id travels to every rank in the plans' ``storage_data``, so ranks on other hosts
   of a shared filesystem write into the same place.
2. **Write** (every rank: ``write_data``). Ranks write only inside the staging
   directory, under the entries' final names, fsync what they wrote, and report it
   in their ``WriteResult``s. Nothing under the final names changes.
3. **Publish** (the coordinator: ``finish``, which DCP calls only after gathering a
   successful result from every rank; a rank that raised or died means no
   ``finish``). :func:`publish` fsyncs the staged entries, removes the previous
   index (so no old index ever names new files), renames each staged entry into
   ``DIR``, fsyncs ``DIR``, then writes the index **last**: a temporary file, fsync,
   rename, fsync of the directory. Then it removes the staged directories of this
   and of earlier, abandoned saves, and the previous save's entries that the new one
   does not use.
4. **Read.** The index is the commit record. :func:`require_committed` returns it,
   or raises :class:`~tensorbridge.errors.UncommittedCheckpointError` when there is
   none but a staging directory is present (a save that is running or was killed).

At every instant ``DIR`` holds the previous checkpoint complete, no index at all, or
the new checkpoint complete. A killed save leaves its staging directory behind (DCP
gives a writer no hook on failure); the next successful save into ``DIR`` removes it.

>>> import tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> staging = begin(d, new_save_id())
>>> _ = (staging / "part-1.bin").write_bytes(b"abc")
>>> publish(d, staging, ["part-1.bin"], "index.json", b"{}")
>>> sorted(p.name for p in d.iterdir()), require_committed(d, "index.json").name
(['index.json', 'part-1.bin'], 'index.json')
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path

from ..errors import UncommittedCheckpointError
from ..io._common import atomic_write, fsync_dir

STAGING_PREFIX = ".tensorbridge-tmp-"


def new_save_id() -> str:
    """A fresh id for one save: unique across processes and hosts."""
    return uuid.uuid4().hex


def staging_dir(dest: str | os.PathLike[str], save_id: str) -> Path:
    """Where the save ``save_id`` stages its entries: ``dest/.tensorbridge-tmp-<save_id>``."""
    return Path(dest) / f"{STAGING_PREFIX}{save_id}"


def begin(dest: str | os.PathLike[str], save_id: str) -> Path:
    """Create ``dest`` (if needed) and the save's staging directory; return the latter."""
    staging = staging_dir(dest, save_id)
    staging.mkdir(parents=True)
    fsync_dir(Path(dest))
    return staging


def fsync_tree(path: Path) -> None:
    """fsync a file, or every file and directory under a directory."""
    if path.is_dir():
        for root, _, files in os.walk(path):
            for name in files:
                fsync_file(Path(root) / name)
            fsync_dir(Path(root))
    else:
        fsync_file(path)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish(
    dest: str | os.PathLike[str],
    staging: Path,
    names: Iterable[str],
    index_name: str,
    index: bytes,
    stale: Iterable[str] = (),
) -> None:
    """Move the staged entries ``names`` into ``dest``, then write the index last.

    ``names`` are paths relative to ``staging`` (files or directories) and land at
    the same relative path in ``dest``; an existing entry of that name is replaced.
    ``stale`` names entries of a previous save to remove once the new one is
    committed (those in ``names`` are kept).
    """
    dest = Path(dest)
    names = list(names)
    for name in names:
        fsync_tree(staging / name)
    old_index = dest / index_name
    if old_index.exists():
        old_index.unlink()
        fsync_dir(dest)
    trash = staging / ".replaced"
    parents = {dest}
    for i, name in enumerate(names):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_dir() and not target.is_symlink():
            trash.mkdir(exist_ok=True)  # a directory cannot be renamed over a full one
            os.replace(target, trash / str(i))
        os.replace(staging / name, target)
        parents.add(target.parent)
    for directory in parents:
        fsync_dir(directory)
    with atomic_write(old_index) as f:  # fsyncs the file, renames, fsyncs dest
        f.write(index)
    keep = set(names) | {index_name}
    for name in stale:
        if name not in keep:
            remove(dest / name)
    for leftover in dest.glob(STAGING_PREFIX + "*"):
        remove(leftover)
    fsync_dir(dest)


def remove(path: Path) -> None:
    """Delete a file or a directory tree; a missing one is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def abandon(staging: Path) -> None:
    """Delete a staging directory whose save will not be committed."""
    remove(staging)


def pending(dest: str | os.PathLike[str]) -> list[Path]:
    """The staging directories in ``dest``: saves running now, or killed before their commit."""
    d = Path(dest)
    return sorted(d.glob(STAGING_PREFIX + "*")) if d.is_dir() else []


def require_committed(
    dest: str | os.PathLike[str], index_name: str, what: str = "checkpoint"
) -> Path:
    """The committed index ``dest / index_name``, or an error saying why there is none.

    Raises:
        UncommittedCheckpointError: no index, but a staging directory (a save still
            running, or one that died before its commit).
        FileNotFoundError: no index and no sign of a save.
    """
    d = Path(dest)
    index = d / index_name
    if index.is_file():
        return index
    staged = pending(d)
    if staged:
        raise UncommittedCheckpointError(
            f"{d} holds no committed {what}: {staged[0].name} is a save that is still "
            f"running or died before writing {index_name}; wait for it to finish or save again"
        )
    raise FileNotFoundError(f"{d} holds no {what}: there is no {index_name}")

"""The atomic commit of a multi-file checkpoint: readers see the previous one or the new one.

Every multi-file writer of tensorbridge commits through this module, so that at every
instant the destination reads as the previous checkpoint, complete, or the new one,
complete: never a missing index, never an index naming a missing, partial or foreign
file. Two shapes of checkpoint, two protocols:

**Files named by an index** (sharded safetensors: ``tb.save(max_shard_size=...)``,
``convert``, ``tb.SafetensorsWriter``, a converted DCP checkpoint), in a directory
that may hold other files (a ``config.json``): :func:`commit_files`.

1. Every new file is written and fsynced under a hidden name,
   ``.NAME.<8 random>.tmp`` beside its final name ``NAME`` (the DCP writer's ranks
   write inside a staging directory, ``DIR/.tensorbridge-tmp-<save id>/``, moved to
   those names first). Nothing a reader looks at has changed.
2. The index is replaced atomically (temporary, fsync, rename) by one whose
   ``weight_map`` names the hidden files: **the new checkpoint is committed**.
3. Each file gets its final name as a second hard link (``os.link`` to a temporary,
   renamed over ``NAME``): a final name may be the previous checkpoint's file, which
   no index names any more. The directory is fsynced.
4. The index is replaced atomically by the final one, naming the final names.
5. The hidden names, the previous checkpoint's files the new index does not name,
   and what killed saves left behind are removed.

Where ``os.link`` fails (a filesystem without hard links: ``EPERM``, ``EXDEV``,
``ENOTSUP``, ``EMLINK``), step 3 copies instead, one file at a time: the file is
copied to a temporary beside its final name, fsynced and renamed over it, the index
is replaced by one naming that final name, and only then is the hidden file
removed. Every instant still has a complete index; the cost is a second write of
each file, and disk for one more file at a time.

**A directory that is wholly the checkpoint** (a Zarr store: ``tb.save(...,
"m.zarr")``, ``tb.ZarrWriter``, a DCP conversion to Zarr): :func:`begin_store` and
:func:`publish_store`. The new store is built complete, group ``zarr.json``
included, in a sibling staging directory ``.tensorbridge-tmp-<save id>.NAME`` (its
path travels to every DCP rank in the plans' ``storage_data``), then exchanged with
the destination in one ``renameat2(RENAME_EXCHANGE)`` (Linux 3.15+, glibc 2.28+),
or renamed into place when there was none; the previous store, now under the
staging name, is removed. Where the exchange is unavailable (another OS, or a
filesystem that refuses it), or the destination holds a directory that is not one
of the store's arrays, the arrays are renamed into the destination one by one, the
previous group ``zarr.json`` removed first and the new one written last (a kill in
between leaves no index, as above).

A killed save leaves hidden temporaries and staging directories behind (DCP gives a
writer no hook on failure); readers ignore them and the next successful save into
the same destination removes them.

**Concurrent saves** to one destination write in parallel but commit one at a time:
every commit above runs under the destination's commit lock (:mod:`tensorbridge._locks`; the
directory holding the index for files named by an index, the store's parent
directory for a store), and works out what it replaces (the previous checkpoint's
files) under that lock, so the last save to commit wins, whole. Each save holds a
claim on its temporaries and staging directory while it runs; cleanup removes only
those whose save is gone (killed), never a running save's.

>>> import json, tempfile, pathlib
>>> d = pathlib.Path(tempfile.mkdtemp())
>>> staging = begin(d, new_save_id())
>>> _ = (staging / "part-1.bin").write_bytes(b"abc")
>>> index = json.dumps({"weight_map": {"x": "part-1.bin"}}).encode()
>>> commit_files(d, {"part-1.bin": staging / "part-1.bin"}, "index.json", index)
>>> sorted(p.name for p in d.iterdir()), require_committed(d, "index.json").name
(['index.json', 'part-1.bin'], 'index.json')
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import os
import re
import secrets
import shutil
import uuid
import weakref
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ._atomic import STAGING_PREFIX as STAGING_PREFIX  # staging directories' names
from ._atomic import TEMP_SUFFIX, atomic_write, fsync_dir, fsync_file, fsync_tree
from ._locks import Claim, alive, commit_lock, is_lock_name, remove_dead_claims
from .errors import DestinationError, UncommittedCheckpointError

NO_LINKS = {errno.EPERM, errno.EXDEV, errno.EMLINK, errno.ENOTSUP, errno.EOPNOTSUPP}
TEMP_NAME = re.compile(r"\.(.+)\.([a-z0-9_]{8})" + re.escape(TEMP_SUFFIX))
_CLAIMS: dict[Path, Claim] = {}  # a running save's staging directory -> its claim


def new_save_id() -> str:
    """A fresh id for one save: unique across processes and hosts."""
    return uuid.uuid4().hex


def staging_dir(dest: str | os.PathLike[str], save_id: str) -> Path:
    """Where the save ``save_id`` stages its entries: ``dest/.tensorbridge-tmp-<save_id>``."""
    return Path(dest) / f"{STAGING_PREFIX}{save_id}"


def begin(dest: str | os.PathLike[str], save_id: str, owner: object = None) -> Path:
    """Create ``dest`` (if needed) and the save's staging directory; return the latter.

    The save's claim on it is held until :func:`commit_files` or :func:`abandon`, or
    until ``owner`` (the writer object) is collected: a save that failed without
    either (DCP gives a writer no hook on failure) is then a dead one, cleaned by the
    next save.
    """
    staging = staging_dir(dest, save_id)
    Path(dest).mkdir(parents=True, exist_ok=True)
    _claim(staging, save_id, owner)
    try:
        staging.mkdir()
        fsync_dir(Path(dest))
    except BaseException:
        abandon(staging)
        raise
    return staging


def _claim(staging: Path, save_id: str, owner: object = None) -> None:
    """Claim ``staging`` (not yet created) for this save: no cleanup removes it meanwhile."""
    _CLAIMS[staging.absolute()] = Claim(staging.parent, save_id)
    if owner is not None:
        weakref.finalize(owner, _release, staging.absolute())


def _release(staging: Path) -> None:
    claim = _CLAIMS.pop(staging.absolute(), None)
    if claim is not None:
        claim.release()


def _live(staging: Path) -> bool:
    """Whether the save that made the staging directory ``staging`` is running."""
    token = staging.name.removeprefix(STAGING_PREFIX).split(".", 1)[0]
    return alive(staging.parent, token)


def temp_name(name: str) -> str:
    """A fresh hidden name beside ``name``: ``.NAME.<8 random>.tmp``, as atomic writes use."""
    return f".{name}.{secrets.token_hex(4)}{TEMP_SUFFIX}"


def final_name(name: str) -> str | None:
    """The name a hidden temporary ``.NAME.<8 random>.tmp`` stands in for, else ``None``."""
    m = TEMP_NAME.fullmatch(name)
    return m.group(1) if m else None


# --- files named by an index ------------------------------------------------------------------


def commit_files(
    dest: str | os.PathLike[str],
    staged: Mapping[str, Path],
    index_name: str,
    index: bytes,
    stale: Iterable[str] | Callable[[], Iterable[str]] = (),
) -> None:
    """Commit the written files ``staged`` (final name -> where it lies) and their ``index``.

    ``index`` is the final index: a JSON document whose ``weight_map`` maps names
    to the files' final names (the Hugging Face layout). ``staged`` files lie
    anywhere inside ``dest`` (hidden temporaries beside their final names, or a
    staging directory); they are fsynced here. ``stale`` names files of the previous
    checkpoint to remove once the new one is committed (those in ``staged`` are
    kept); a function giving them is called under the commit lock, so it sees what
    a concurrent save committed. The protocol is the module's: the new checkpoint is
    committed by the first index swap, under hidden names, before any final name
    changes.
    """
    dest = Path(dest)
    try:
        with commit_lock(dest):
            names = list(stale() if callable(stale) else stale)
            _commit_files(dest, staged, index_name, index, names)
    finally:
        for staging in {p.parent for p in staged.values()} - {dest}:
            if staging.name.startswith(STAGING_PREFIX):
                abandon(staging)  # emptied by the commit, or never to be committed


def _commit_files(
    dest: Path, staged: Mapping[str, Path], index_name: str, index: bytes, stale: list[str]
) -> None:
    hidden: dict[str, str] = {}
    try:
        for name, path in staged.items():
            try:
                fsync_file(path)
            except FileNotFoundError:
                raise DestinationError(
                    errno.ENOENT,
                    f"cannot write {dest}: this save's file {path.name} was removed while it "
                    "was being written (by another program cleaning the directory); nothing "
                    "of this save was kept; save again",
                ) from None
            if path.parent == dest and final_name(path.name) == name:
                hidden[name] = path.name
            else:  # from a staging directory: the same filesystem, a rename
                hidden[name] = temp_name(name)
                os.replace(path, dest / hidden[name])
        fsync_dir(dest)
        first = next(iter(hidden), None)
        links = first is None or _can_link(dest / hidden[first], dest / temp_name(first))
    except BaseException:
        for h in hidden.values():
            with contextlib.suppress(OSError):
                os.unlink(dest / h)
        raise
    if not links:
        _commit_by_copies(dest, hidden, index_name, index)
    else:
        with atomic_write(dest / index_name) as f:  # the commit: the new files, hidden names
            f.write(_renamed(index, hidden))
        for name, h in hidden.items():
            tmp = dest / temp_name(name)
            os.link(dest / h, tmp)
            os.replace(tmp, dest / name)
        fsync_dir(dest)
        with atomic_write(dest / index_name) as f:
            f.write(index)
        for h in hidden.values():
            os.unlink(dest / h)
    _clean(dest, [*staged, index_name], stale)


def _can_link(path: Path, probe: Path) -> bool:
    """Whether the filesystem holding ``path`` makes hard links (a ``probe`` link, removed)."""
    try:
        os.link(path, probe)
    except OSError as err:
        if err.errno in NO_LINKS:
            return False
        raise
    os.unlink(probe)
    return True


def _commit_by_copies(dest: Path, hidden: dict[str, str], index_name: str, index: bytes) -> None:
    """The protocol without hard links: each hidden file copied to its final name, the
    index moved over to that name before the hidden file goes (no instant without one)."""
    names = dict(hidden)
    with atomic_write(dest / index_name) as f:  # the commit: the new files, hidden names
        f.write(_renamed(index, names))
    for name, h in hidden.items():
        tmp = dest / temp_name(name)
        try:
            shutil.copyfile(dest / h, tmp)
            fsync_file(tmp)
            os.replace(tmp, dest / name)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_dir(dest)
        names[name] = name
        with atomic_write(dest / index_name) as f:
            f.write(_renamed(index, names))
        os.unlink(dest / h)


def _renamed(index: bytes, names: Mapping[str, str]) -> bytes:
    """``index`` with each file of its ``weight_map`` replaced by ``names[file]``."""
    doc: dict[str, Any] = json.loads(index)
    doc["weight_map"] = {k: names.get(v, v) for k, v in doc["weight_map"].items()}
    return json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False).encode() + b"\n"


def _clean(dest: Path, keep: list[str], stale: Iterable[str]) -> None:
    """After a commit: the previous save's files, and every save's leftovers, removed."""
    kept = set(keep)
    for name in stale:
        if name not in kept:
            remove(dest / name)
    stale_names = set(stale)
    for entry in os.scandir(dest):
        m = TEMP_NAME.fullmatch(entry.name)
        if m and (m[1] in kept or m[1] in stale_names) and not alive(dest, m[2]):
            remove(Path(entry.path))
    remove_leftovers(dest)


def remove_leftovers(dest: Path) -> None:
    """Remove what killed saves into ``dest`` left: staging directories and claims."""
    for leftover in pending(dest):
        if not _live(leftover):
            remove(leftover)
    remove_dead_claims(dest)
    remove_dead_claims(dest.absolute().parent)
    fsync_dir(dest)


# --- a directory that is wholly the checkpoint ------------------------------------------------


def store_staging_dir(dest: str | os.PathLike[str], save_id: str) -> Path:
    """Where the save ``save_id`` builds the store ``dest``: a hidden sibling of it."""
    d = Path(dest).absolute()
    return d.parent / f"{STAGING_PREFIX}{save_id}.{d.name}"


def begin_store(dest: str | os.PathLike[str], save_id: str, owner: object = None) -> Path:
    """Create the sibling staging directory of the store ``dest``; return it.

    The save's claim on it is held until :func:`publish_store` or :func:`abandon`, or
    until ``owner`` is collected (as :func:`begin`).
    """
    staging = store_staging_dir(dest, save_id)
    staging.parent.mkdir(parents=True, exist_ok=True)
    _claim(staging, save_id, owner)
    try:
        staging.mkdir()
        fsync_dir(staging.parent)
    except BaseException:
        abandon(staging)
        raise
    return staging


def publish_store(
    dest: str | os.PathLike[str],
    staging: Path,
    names: Iterable[str],
    index_name: str,
    index: bytes,
    stale: Iterable[str] = (),
) -> None:
    """Swap the store built in ``staging`` (its entries ``names``) with ``dest``.

    ``index`` (the group's ``zarr.json``) is written into ``staging`` first, so the
    staged store is complete before it appears. ``stale`` names the previous
    store's arrays, used by the fallback only (the swap drops them with the rest of
    the previous store). Files in ``dest`` that are not part of the store (a
    ``README``) are carried over as hard links.
    """
    dest = Path(dest).absolute()
    names = list(names)
    with atomic_write(staging / index_name) as f:
        f.write(index)
    fsync_tree(staging)
    with commit_lock(dest.parent):
        stale = [*stale, *_stores(dest, index_name)]  # as it is now: another save may have won
        if not dest.exists():
            os.rename(staging, dest)  # nothing to exchange with
            fsync_dir(dest.parent)
        elif dest.is_symlink() or not (
            _carry(dest, staging, [*stale, index_name]) and exchange(staging, dest)
        ):
            (staging / index_name).unlink()
            publish(dest, staging, names, index_name, index, stale)
        else:
            fsync_dir(dest.parent)
            remove(staging)  # the previous store
        _release(staging)
        remove_leftovers(dest)
        fsync_dir(dest.parent)


def _stores(dest: Path, index_name: str) -> list[str]:
    """The entries of the store ``dest`` that hold their own ``index_name`` (its arrays)."""
    with contextlib.suppress(OSError):
        return [e.name for e in os.scandir(dest) if os.path.isfile(Path(e.path) / index_name)]
    return []


def _carry(dest: Path, staging: Path, store: list[str]) -> bool:
    """Hard-link ``dest``'s files that are no part of its store into ``staging``.

    False where that is impossible: a foreign directory, or no hard links.
    """
    inside = set(pending(dest))
    for entry in os.scandir(dest):
        path = Path(entry.path)
        if entry.name in store or path in inside or final_name(entry.name) is not None:
            continue
        if is_lock_name(entry.name):
            continue
        if entry.is_dir(follow_symlinks=False) or (staging / entry.name).exists():
            return False
        try:
            os.link(path, staging / entry.name, follow_symlinks=False)
        except OSError as err:
            if err.errno in NO_LINKS:
                return False
            raise
    return True


def exchange(a: Path, b: Path) -> bool:
    """Swap the directory entries ``a`` and ``b`` atomically; False where the system can't.

    Linux's ``renameat2(RENAME_EXCHANGE)`` through glibc (2.28 or later). Other
    systems, an older glibc or a filesystem that refuses the flag give False.
    """
    fn = _renameat2()
    if fn is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    if fn(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(b))


_RENAMEAT2: list[Any] = []


def _renameat2() -> Any:
    """glibc's ``renameat2``, or ``None`` where there is none."""
    if not _RENAMEAT2:
        fn = None
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
            fn = libc.renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p]
            fn.argtypes += [ctypes.c_uint]
            fn.restype = ctypes.c_int
        _RENAMEAT2.append(fn)
    return _RENAMEAT2[0]


# --- the fallback, and reading --------------------------------------------------------------


def publish(
    dest: str | os.PathLike[str],
    staging: Path,
    names: Iterable[str],
    index_name: str,
    index: bytes,
    stale: Iterable[str] = (),
) -> None:
    """Move the staged entries ``names`` into ``dest``, then write the index last.

    The fallback of :func:`publish_store`: a kill during the renames leaves ``dest``
    with no index. ``names`` are paths relative to ``staging`` (files or
    directories) and land at the same relative path in ``dest``; an existing entry
    of that name is replaced. ``stale`` names entries of a previous save to remove
    once the new one is committed (those in ``names`` are kept).
    """
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    with commit_lock(dest.absolute().parent):
        _publish(dest, staging, list(names), index_name, index, stale)


def _publish(
    dest: Path, staging: Path, names: list[str], index_name: str, index: bytes, stale: Iterable[str]
) -> None:
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
    abandon(staging)
    remove_leftovers(dest)


def remove(path: Path) -> None:
    """Delete a file or a directory tree; a missing one is fine."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def abandon(staging: Path) -> None:
    """Delete a staging directory (its save committed, or will not be) and give up its claim."""
    try:
        remove(staging)
    finally:
        _release(staging)


def pending(dest: str | os.PathLike[str]) -> list[Path]:
    """The staging directories of saves into ``dest`` running now, or killed before their commit.

    Those inside ``dest`` (:func:`begin`) and those beside it (:func:`begin_store`).
    """
    d = Path(dest)
    inside = sorted(d.glob(STAGING_PREFIX + "*")) if d.is_dir() else []
    a = d.absolute()
    beside = re.compile(re.escape(STAGING_PREFIX) + "[0-9a-f]{32}" + re.escape("." + a.name))
    with contextlib.suppress(OSError):
        inside += sorted(p for p in a.parent.iterdir() if beside.fullmatch(p.name))
    return inside


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

"""What a format's ``assembly`` returns: the plan of a chunked checkpoint's conversion.

A row of :mod:`tensorbridge.io._formats` that ``assembles`` provides
``assembly(entries, target, ...)``, which lays a chunked (DCP) checkpoint's tensors out
in the destination before any byte is read: a :class:`Layout` of byte files
(:class:`PlannedFile` s, each tensor at an offset) or a :class:`StoreLayout` of a staged
store's arrays. :mod:`tensorbridge.io.assemble` carries the plan out. They are plain
records, apart from the registry, so that the format modules and the registry share
them; :mod:`tensorbridge.io._formats` re-exports them.

>>> PlannedFile(Path("m.safetensors"), b"", 8).size
8
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Layout", "PlannedFile", "StoreLayout"]


@dataclass(frozen=True)
class PlannedFile:
    """A file a chunked conversion preallocates: its final path, header bytes and size."""

    path: Path
    header: bytes
    size: int


@dataclass(frozen=True)
class Layout:
    """A conversion into byte files: each tensor's bytes at an offset of a planned file.

    ``directory`` is where the files are committed; ``index`` (a file name and its
    bytes) is committed with them, last, and ``replaces`` names the files of an earlier
    save that the commit removes; ``after`` runs once unindexed files are in place.
    """

    directory: Path
    files: tuple[PlannedFile, ...]
    placements: tuple[tuple[str, Path, int, int], ...]  # (tensor, file, offset, bytes)
    index: tuple[str, bytes] | None = None
    replaces: Callable[[], list[str]] | None = None
    after: Callable[[], None] | None = None
    creates: bool = False  # the directory is made by this save (removed if it fails)


@dataclass(frozen=True)
class StoreLayout:
    """A conversion into a staged store: each tensor an array ``region_module.open_region``
    opens for writing, published (or abandoned) as a whole."""

    region_module: str
    placements: tuple[tuple[str, str, int], ...]  # (tensor, array path, bytes)
    publish: Callable[[], None]
    abandon: Callable[[], None]
    written: tuple[Path, ...] = field(default=())

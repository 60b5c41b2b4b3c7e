"""Where a save goes: the format, the file it writes and every file it may replace.

:func:`destination` reads a path as ``tb.save`` does (its suffix names the format; a
directory means ``model.safetensors`` inside; ``NAME.safetensors.index.json`` shards),
and :meth:`Destination.check` holds the rules a save there must meet (shards, metadata,
quantized layouts, an existing file), so that ``tb.save``, a DCP conversion,
:func:`tensorbridge.quantize_checkpoint` and the command line check a destination the
same way, before they read anything. Its messages name the Python arguments; the
command line says them as its options.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import DestinationExistsError, FormatError, InvalidArgumentError
from ._formats import DIRECTORY_FORMAT, FORMATS, INDEX_SUFFIX, Format, by_suffix, listing

__all__ = ["Destination", "destination"]


@dataclass(frozen=True)
class Destination:
    """Where a save goes: the format, the file it writes, and every file it may replace.

    >>> import tempfile
    >>> d = destination(tempfile.mkdtemp() + "/")
    >>> d.format.name, d.path.name, d.sharded
    ('safetensors', 'model.safetensors', False)
    """

    format: Format
    path: Path
    sharded: bool  # shards and an index, as a NAME.safetensors.index.json destination asks

    @property
    def index(self) -> Path:
        """The shard index a sharded save of :attr:`path` writes beside it."""
        return self.path.with_name(self.path.name + INDEX_SUFFIX)

    def existing(self) -> list[Path]:
        """The files already there that this save would replace."""
        if not self.format.sharding:
            return [self.path] if self.path.exists() else []
        found = [p for p in (self.path, self.index) if p.exists()]
        suffix = self.path.suffix
        stem = self.path.name[: -len(suffix)] if suffix else self.path.name
        if self.path.parent.is_dir():
            found += sorted(self.path.parent.glob(f"{stem}-?????-of-?????{suffix}"))
        return found

    def written(self) -> Path:
        """What a save wrote: the shard index when the save was sharded, else the file."""
        return self.index if not self.path.exists() and self.index.exists() else self.path

    def check(
        self,
        *,
        overwrite: bool = False,
        max_shard_size: int | str | None = None,
        metadata: Mapping[str, Any] | None = None,
        quantize: Any = None,
        scheme: str | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        """Refuse a save this destination cannot take, before anything is read: the one
        place of the rules ``tb.save``, a DCP conversion, ``quantize_checkpoint`` and
        ``convert`` share. The save's arguments, each checked only when given:

        * ``max_shard_size``: the format shards;
        * ``metadata`` (the keys given): the format has a place for metadata;
        * ``quantize``: the format's ``save`` takes ``quantize=`` (GGUF's Q8_0);
        * ``scheme``: weights quantized in a scheme's published layout, which the
          format holds (``quantized``);
        * ``options`` (a format's own save options, e.g. ONNX's ``into``): the format's
          ``save`` takes each;
        * and last, the files the save would replace exist only with ``overwrite``.

        >>> import tempfile
        >>> d = destination(tempfile.mkdtemp() + "/w.npz")
        >>> d.check(max_shard_size="5GB")
        Traceback (most recent call last):
          ...
        tensorbridge.errors.InvalidArgumentError: max_shard_size= needs a .safetensors ...

        Raises:
            InvalidArgumentError: an argument the format cannot take.
            DestinationExistsError: files the save would replace exist and ``overwrite``
                is false.
        """
        fmt, suffix = self.format, repr(self.path.suffix.lower())
        if max_shard_size is not None and not fmt.sharding:
            shards = listing(lambda f: f.sharding, " or ")
            raise InvalidArgumentError(
                f"max_shard_size= needs a {shards} destination (or a directory); {suffix} "
                f"files are not sharded (save to a {shards} path or a directory)"
            )
        if metadata and not fmt.metadata:
            raise InvalidArgumentError(
                f"{suffix} files have no place for metadata; save to "
                f"{listing(lambda f: f.metadata, ' or ')} to keep it, or leave out metadata= "
                f"({', '.join(map(str, list(metadata)[:5]))})"
            )
        if quantize is not None and "quantize" not in fmt.save_options:
            quantizing = [f for f in FORMATS if "quantize" in f.save_options]
            raise InvalidArgumentError(
                f"quantize= writes {' or '.join(f.quantizes for f in quantizing)}; {suffix} "
                f"files hold plain tensors (save to a "
                f"{listing(lambda f: 'quantize' in f.save_options, ' or ')} path, or leave out "
                "quantize=)"
            )
        if scheme is not None and not fmt.quantized:
            raise InvalidArgumentError(
                f"scheme={scheme!r}: tensorbridge writes the schemes' published safetensors "
                f"layouts, not {self.path}; pass a {listing(lambda f: f.quantized, ' or ')} "
                "path or a directory"
            )
        own = [k for k, v in (options or {}).items() if v is not None]
        theirs = [k for k in fmt.save_options if k not in ("quantize", "max_shard_size", "index")]
        unknown = [k for k in own if k not in theirs]
        if unknown:
            raise InvalidArgumentError(
                f"options={{{unknown[0]!r}: ...}}: {suffix} files take "
                f"{', '.join(map(repr, theirs)) or 'no options'}; leave it out or save to "
                f"{listing(lambda f: unknown[0] in f.save_options, ' or ') or 'another format'}"
            )
        found = self.existing()
        if found and not overwrite:
            more = f" (and {len(found) - 1} more files of that checkpoint)" if found[1:] else ""
            raise DestinationExistsError(
                f"{found[0]} exists{more}; pass overwrite=True (command line: --overwrite) to "
                "replace it"
            )


def destination(path: str | os.PathLike[str]) -> Destination:
    """How :func:`save` reads ``path``: a format by suffix, a directory, or a shard index.

    Raises:
        FormatError: a suffix that is no format tensorbridge writes (a ``.json`` other than
            ``NAME.safetensors.index.json`` included), or no suffix on a path that is not a
            directory.
    """
    text = os.fspath(path)
    p = Path(text)
    fmt = by_suffix(p.suffix)
    if fmt is not None and fmt.directory and fmt.writes:  # a store is a directory
        return Destination(fmt, p, sharded=False)
    if p.is_dir() or text.endswith(("/", os.sep)):
        return Destination(DIRECTORY_FORMAT, p / f"model{DIRECTORY_FORMAT.suffixes[0]}", False)
    name = p.name.lower()
    if name.endswith(INDEX_SUFFIX):
        fmt = by_suffix(Path(name.removesuffix(INDEX_SUFFIX)).suffix)
        if fmt is not None and fmt.sharding and len(name) > len(fmt.suffixes[0] + INDEX_SUFFIX):
            return Destination(fmt, p.with_name(p.name[: -len(INDEX_SUFFIX)]), sharded=True)
    fmt = by_suffix(p.suffix)
    writable = sorted(s for f in FORMATS if f.writes for s in f.suffixes)
    formats = ", ".join(writable)
    if fmt is not None and fmt.writes:
        return Destination(fmt, p, sharded=False)
    if fmt is not None:  # a format tensorbridge reads only
        raise FormatError(
            f"{text}: tensorbridge reads {fmt.description} but does not write one; use {formats}"
        )
    if p.suffix.lower() == ".json":
        sharded = next(f.suffixes[0] for f in FORMATS if f.sharding)
        raise FormatError(
            f"{text}: a .json destination holds no tensors; write NAME{sharded}, or "
            f"NAME{sharded}{INDEX_SUFFIX} for a sharded checkpoint in that directory"
        )
    if not p.suffix:
        raise FormatError(
            f"{text} has no format suffix and is not a directory; end it with / for a "
            f"directory (model{DIRECTORY_FORMAT.suffixes[0]} inside), or add one of {formats}"
        )
    raise FormatError(f"{text}: cannot tell the format from the suffix {p.suffix!r}; use {formats}")

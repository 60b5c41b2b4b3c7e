"""Conversion between files: what ``tb.save`` of an opened file writes, and what it carries.

An opened file is saved as its tensors (mapped, or computed while written), the members
a destination can hold but torch cannot (:func:`carried_members`), its metadata where
the destination has a place for it (:func:`carried_metadata`), its nesting where the
destination keeps one (:func:`nested_values`); a chunked checkpoint (DCP) is assembled
window by window into a destination's layout.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from concurrent.futures import Executor
from pathlib import Path
from typing import Any, Literal

from .._keys import rebuild
from .._tensorfile import Deferred, TensorFile
from ..dtypes import DTypeLike
from ..errors import (
    DestinationExistsError,
    FormatError,
    InvalidArgumentError,
    TensorBridgeError,
    UnsupportedDtypeError,
)
from . import npy
from ._formats import DIRECTORY_FORMAT, FORMATS, Format, entry_files, listing
from .destinations import destination


def file_values(
    f: TensorFile, fmt: Format, metadata: Mapping[str, Any] | None, keep: bool = True
) -> tuple[Any, Mapping[str, Any] | None]:
    """An opened file's tensors as ``save`` writes them (mapped, or computed while written),
    and the metadata to keep: the file's own (:func:`carried_metadata`) unless given, or
    none (``keep`` false). A format that keeps nesting gets the file's tree."""
    names = f.keys()
    carried = carried_members(f, fmt, names)  # NumPy to NumPy: float128, strings as they are
    unsupported = {n: why for n, why in f.unsupported().items() if n not in carried}
    if unsupported:
        first, reason = next(iter(unsupported.items()))
        raise UnsupportedDtypeError(
            f"{reason}; save the other entries: {{n: f[n] for n in f.keys() if n != {first!r}}}"
        )
    tree = nested_values(f, names, plain=keep and metadata is None) if fmt.nested else None
    if tree is not None:
        return tree, metadata
    if metadata is None and keep:
        metadata, dropped = carried_metadata(f, fmt, names)
        if dropped:
            warnings.warn(
                f"{fmt.description}s have no place for metadata; {f.filename}'s "
                f"{', '.join(dropped[:5])} are not saved (save to "
                f"{metadata_homes(dropped, names)} to keep them, or pass metadata=False)",
                stacklevel=3,
            )
    if fmt.single_array and not fmt.many_arrays and len(names) == 1:
        return carried.get(names[0]) or copied_value(f, names[0], fmt), metadata or None
    values: dict[str, Any] = {}
    for name in names:
        if name in carried:
            values[name] = carried[name]
            continue
        bits = f.stored_bits(name) if fmt.stored_bits else None
        value = bits if bits is not None else f.stream_value(name)
        values[name] = value if fmt.deferred or not isinstance(value, Deferred) else f[name]
    return values, metadata or None


def copied_value(f: TensorFile, name: str, fmt: Format) -> Any:
    """``f[name]`` as a copy to a ``fmt`` file takes it: a carried dtype's stored integers
    (:class:`~tensorbridge._tensorfile.StoredBits`) where ``fmt`` states ``stored_bits``
    and ``f`` maps them, so that copying bfloat16 or float8 between such files never
    imports ml_dtypes; else the array."""
    bits = f.stored_bits(name) if fmt.stored_bits else None
    return bits if bits is not None else f[name]


# the values of safetensors' "format" mark: the framework that wrote the file
WRITER_MARKS = ("pt", "np", "tf", "flax", "mlx")


def carried_members(
    f: TensorFile, fmt: Format, names: list[str], *, skip_refused: bool = False
) -> dict[str, Any]:
    """The entries of ``names`` that torch cannot hold, as their ``.npy`` bytes, where both
    ``f`` and ``fmt`` are NumPy formats (``npy.NpyBytes``: copied unchanged, never read).

    ``skip_refused``: an entry that cannot be copied either is left out (it stays in
    ``f.unsupported()``) instead of raising.

    Raises:
        UnsupportedDtypeError: an object array (a pickle): never read, never copied.
    """
    if not (fmt.npy_members and isinstance(f, npy.NpyEntries)):
        return {}
    out = {}
    for name in f.unsupported():
        if name in names:
            try:
                out[name] = f.npy_bytes(name)
            except UnsupportedDtypeError:
                if not skip_refused:
                    raise
    return out


def carried_metadata(
    src: TensorFile, fmt: Format, names: list[str], fix: str = "pass metadata=False"
) -> tuple[dict[str, Any], list[str]]:
    """The source's metadata as a ``fmt`` file can hold it, and the keys it cannot.

    A mark another format's writer sets for itself (safetensors' ``format: pt``) is
    not the user's metadata and is not carried. ``fix`` ends the refusal of metadata
    that ``fmt`` cannot hold: how to leave it out, in the caller's words.
    """
    values = src.plain_values()
    marks = {f.metadata_mark for f in FORMATS} - {fmt.metadata_mark, None}
    values = {k: v for k, v in values.items() if not (k in marks and v in WRITER_MARKS)}
    if not fmt.metadata:
        return {}, sorted(values)
    clash = [k for k in values if k in names]
    if fmt.metadata_with_tensors and clash:
        raise TensorBridgeError(
            f"metadata key {clash[0]!r} of {src.filename} is also a tensor's name; "
            f"{fmt.description} cannot hold both: write {metadata_homes(clash, names)}, "
            f"or {fix} to leave the metadata out"
        )
    return values, []


def metadata_homes(keys: list[str], names: list[str]) -> str:
    """The suffixes of the formats that can keep metadata ``keys`` beside tensors ``names``.

    >>> metadata_homes(["epoch"], ["w"])
    '.safetensors or .pt or .gguf or .zarr or .h5 or .onnx'
    >>> metadata_homes(["w"], ["w"])
    '.safetensors or .gguf or .zarr or .h5 or .onnx'
    """
    clash = any(k in names for k in keys)
    return listing(lambda f: f.metadata and not (clash and f.metadata_with_tensors), " or ")


def nested_values(f: TensorFile, names: list[str], *, plain: bool = True) -> Any:
    """``f``'s entries ``names`` (and its plain values, unless ``plain`` is false) in the
    nesting the file stored them in, or None where it records none (a flat file).

    Each tensor is the mapped array ``f[name]``, read when written. Leaving out some of
    a list's items raises (the rest would be renumbered): see :func:`_keys.rebuild`.
    """
    skel = f.structure()
    if skel is None:
        return None
    values: dict[str, Any] = {n: f[n] for n in names}
    if plain:
        values.update(f.plain_values())
    return rebuild(skel, values, where=f.filename)


DEFAULT_SHARD_SIZE = "5GB"  # a chunked checkpoint saved to a directory: transformers' default


def save_chunked(
    f: TensorFile,
    path: str | os.PathLike[str],
    *,
    float_dtype: DTypeLike | None,
    metadata: Mapping[str, Any] | Literal[False] | None,
    max_shard_size: int | str | None,
    overwrite: bool,
    progress: bool | None,
    format: str | None,
    executor: Executor | None,
) -> None:
    """``tb.save`` of an opened chunked (DCP) checkpoint: see :func:`save`."""
    from . import assemble
    from .dcp import DcpFile  # the one chunked reader assemble.save reads

    assert isinstance(f, DcpFile)
    text = os.fspath(path)
    entries = entry_files(format)  # format="npy": a directory of NAME.npy files
    if entries is not None:
        if max_shard_size is not None or metadata:
            raise InvalidArgumentError(
                f"a directory of {entries.suffixes[0]} files has no shards and no metadata; "
                "leave out max_shard_size= and metadata=, or save to a directory for "
                f"{DIRECTORY_FORMAT.name}"
            )
        target = Path(text)
        if target.exists() and not target.is_dir():
            raise FormatError(
                f"{text} is a file; format={format!r} writes a directory of "
                f"{entries.suffixes[0]} files"
            )
        skipped = f.unsupported()
        names = [n for n in f if n not in skipped]
        found = [
            target / f"{n}{entries.suffixes[0]}"
            for n in names
            if (target / f"{n}{entries.suffixes[0]}").exists()
        ]
        if found and not overwrite:
            raise DestinationExistsError(
                f"{found[0]} exists; pass overwrite=True (command line: --overwrite) to replace it"
            )
        assemble.save(
            f, target, fmt=entries, float_dtype=float_dtype, executor=executor, progress=progress
        )
        return
    dst = destination(path)
    fmt = dst.format
    if not fmt.assembles:
        raise FormatError(
            f"{text}: a DCP checkpoint converts to {assembly_destinations()}, not {fmt.description}"
        )
    dst.check(overwrite=overwrite, max_shard_size=max_shard_size)
    options: dict[str, Any] = {}
    if fmt.sharding:
        is_dir = Path(text).is_dir() or text.endswith(("/", os.sep))
        if is_dir and max_shard_size is None:
            max_shard_size = DEFAULT_SHARD_SIZE
        options = {"max_shard_size": max_shard_size, "index": dst.sharded or is_dir}
    carried = f.plain_values() if metadata is not False else {}
    if fmt.text_metadata:
        meta = {str(k): str(v) for k, v in carried.items()}
        meta.update({str(k): str(v) for k, v in (metadata or {}).items()})
    else:
        meta = {**carried, **(metadata or {})}
    assemble.save(
        f,
        dst.path,
        fmt=fmt,
        float_dtype=float_dtype,
        metadata=meta,
        executor=executor,
        progress=progress,
        **options,
    )


def assembly_destinations() -> str:
    """What a chunked checkpoint converts to, in words (from the rows that assemble)."""
    targets = [f for f in FORMATS if f.assembles]
    words = [f"a directory (sharded {DIRECTORY_FORMAT.name})"]
    words += [
        f"a NAME{f.suffixes[0]} {'store' if f.directory else 'file'}"
        for f in targets
        if f.many_arrays
    ]
    words += [
        f"a directory of {f.suffixes[0]} files (format={f.name!r})"
        for f in targets
        if not f.many_arrays
    ]
    return ", ".join(words[:-1]) + ", or " + words[-1]

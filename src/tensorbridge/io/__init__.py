"""File formats: ``open`` / ``load`` read by content, ``save`` writes by the path's suffix.

=====================================  =========================================
what                                   module
=====================================  =========================================
safetensors                            :mod:`tensorbridge.io.safetensors`
``.npy``                               :mod:`tensorbridge.io.npy`
``.npz``                               :mod:`tensorbridge.io.npz`
``torch.save`` archives (``.pt``,      :mod:`tensorbridge.io.pt` (read by the
``.pth``, ``.bin``; zip and legacy)    pickle machine, :mod:`tensorbridge.io.
                                       pickle_machine`: never runs a pickle)
``torch.distributed.checkpoint``       :mod:`tensorbridge.io.dcp` (read only; saved
directories (``.metadata`` +           elsewhere in flat memory by
``*.distcp``)                          :mod:`tensorbridge.io.assemble`)
Zarr v3 stores (``.zarr``, a           :mod:`tensorbridge.io.zarr` (needs
directory: one array per tensor)       ``pip install tensorbridge[zarr]``)
a shard index (``*.index.json``) and   :mod:`tensorbridge.io.sharded`
its shards, or a directory holding one
GGUF (llama.cpp's ``.gguf``)           :mod:`tensorbridge.io.gguf`
=====================================  =========================================

**Reading** looks at a file's first bytes (:mod:`tensorbridge.io._detect`), not its
name: a torch archive named ``.safetensors`` or an ``.npy`` named ``.npz`` is read as
what it is, with a note in the reader's ``notes`` (the command line prints it). A
TorchScript archive and a plain pickle are refused, each with its own message (a
pickled ``nn.Module`` gives its state dict). A directory opens its checkpoint: a
safetensors index, one ``.safetensors`` file, a ``.bin`` index, one ``.bin`` /
``.pt`` / ``.pth`` file, one ``.gguf`` file, in that order of preference (as
``transformers`` prefers safetensors).

**Writing** follows the destination's suffix. ``NAME.zarr`` is a Zarr store (a
directory). Any other directory (an existing one, or a path ending in ``/``) means
``model.safetensors`` in it; ``NAME.safetensors.index.json`` means a
sharded checkpoint with that index; any other suffix that is no format is an error. An
existing destination is replaced only with ``overwrite=True``.

Every format module has the same verbs and one ``save`` signature, and says what it can
hold (one array or many, metadata, shards) in its row of ``tensorbridge.io._formats``;
this module and the command line ask those rows instead of testing suffixes, so a new
format is one new module and one row.
"""

from __future__ import annotations

import importlib
import os
import warnings
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .._files import Links
from .._keys import flatten, is_container, rebuild
from .._tensorfile import Deferred, TensorFile
from .._torch_checks import is_module, is_tensor
from ..dtypes import DeviceLike, DTypeLike
from ..errors import (
    DestinationExistsError,
    FormatError,
    InvalidArgumentError,
    TensorBridgeError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)
from . import gguf, npy, npz, safetensors, zarr  # noqa: F401 - tb.io.<format> without an import
from ._common import load_with
from ._detect import FOREIGN, describe, kind_by_suffix, mismatch_note

# The detection and the registry the command line asks (not in __all__): other packages
# import these names from here, never io's private modules.
from ._detect import detect as detect
from ._detect import resolve as resolve
from ._formats import DIRECTORY_FORMAT as DIRECTORY_FORMAT
from ._formats import FORMATS as FORMATS
from ._formats import INDEX_SUFFIX as INDEX_SUFFIX
from ._formats import Format, by_suffix, named_by, register_format, unregister_format
from ._formats import by_kind as by_kind
from ._formats import entry_files as entry_files
from ._formats import listing as listing
from .sharded import ShardedFile

if TYPE_CHECKING:
    import torch

    from . import dcp, pt  # noqa: F401 - loaded on first use by __getattr__ below
    from .pickle_machine import Opaque


def __getattr__(name: str) -> Any:
    """The torch formats' modules, which import torch, loaded when first used (PEP 562):
    reading and writing the NumPy formats does not import torch."""
    if name in ("dcp", "pt"):
        value = importlib.import_module(f".{name}", __name__)
    elif name == "Opaque":
        value = importlib.import_module(".pickle_machine", __name__).Opaque
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


__all__ = [
    "Destination",
    "Format",
    "Opaque",
    "carried_members",
    "carried_metadata",
    "destination",
    "load",
    "metadata_homes",
    "nested_values",
    "open",
    "register_format",
    "save",
    "unregister_format",
]


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

    def check_overwrite(self, overwrite: bool) -> None:
        """Raise :class:`DestinationExistsError` if the save would replace files unasked."""
        found = self.existing()
        if found and not overwrite:
            more = (
                f" (and {len(found) - 1} more files of that checkpoint)" if len(found) > 1 else ""
            )
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


def _reader(
    path: Path,
    dtype: DTypeLike | None = None,
    dequantize: DTypeLike | None = None,
    follow_links: bool = False,
) -> TensorFile:
    """Open ``path`` with the reader its first bytes call for (the suffix's when unrecognised).

    Files that ``path`` names (shards, chunks) are confined to its directory unless
    ``follow_links`` (see :class:`~tensorbridge._files.Links`).
    """
    kind = detect(path)
    where = repr(str(path))
    named = named_by(path)  # the format the name claims, loose suffixes (.ckpt) included
    if named is not None and (kind == "unknown" or kind in named.explains):
        kind = named.kinds[0]  # its reader says what the first bytes look like instead
    elif kind == "unknown":  # let the suffix's reader say precisely what is wrong
        kind = kind_by_suffix(path)
    fmt = by_kind(kind)
    if fmt is None and kind != "index":
        refusal = _refusal(kind, where)
        if named is not None and named.explains and kind in FOREIGN:  # say it is none
            refusal = refusal.replace(
                f"{where} is ", f"{where} is not {named.called or named.description}: it is ", 1
            )
        raise FormatError(refusal)
    if dtype is not None and not (fmt is None or fmt.raw_dtype):
        raise InvalidArgumentError(
            f"dtype= names the type of raw bytes np.save wrote from ml_dtypes arrays "
            f"({listing(lambda f: f.raw_dtype)}); {where} is {describe(kind)}: to cast "
            "values pass float_dtype= (command line: --float-dtype)"
        )
    if dequantize is not None and (fmt is None or not fmt.dequantizes):
        readers = ", ".join(f.description for f in FORMATS if f.dequantizes)
        raise InvalidArgumentError(
            f"dequantize= is read here for {readers} only; {where} is {describe(kind)} "
            "(open it with tb.open(path, dequantize=...))"
        )
    f: TensorFile
    options: dict[str, Any] = {"follow_links": follow_links} if fmt and fmt.links else {}
    if fmt is None:  # a shard index: each shard by its own reader
        links = Links.of(path, follow=follow_links)
        f = ShardedFile(path, lambda shard: _reader(shard, dtype, None, follow_links), links)
    elif dequantize is not None:
        f = fmt.reader(path, dequantize=dequantize, **options)
    elif fmt.raw_dtype:
        f = fmt.reader(path, dtype=dtype, **options)
    else:
        f = fmt.reader(path, **options)
    f.follow_links = follow_links
    note = mismatch_note(path, kind)
    if note:
        f.notes.insert(0, note)
    return f


def _refusal(kind: str, where: str) -> str:
    """Why a file of ``kind``, which no format reads, is refused, and what to do instead."""
    readable = ", ".join(describe(k) for f in FORMATS for k in f.kinds)
    if kind in FOREIGN:
        return (
            f"{where} is {FOREIGN[kind]}, a format tensorbridge does not read; it reads "
            f"{readable} and shard indexes"
        )
    from .pt import TORCHSCRIPT_MESSAGE

    return {
        "torchscript": TORCHSCRIPT_MESSAGE.format(where=where),
        "pickle": f"{where} is a plain pickle, not a torch.save archive; tensorbridge never "
        "runs a pickle (torch.save archives are read by its own pickle machine)",
        "zip": f"{where} is a zip archive that is neither a .npz (only .npy members) nor a "
        "torch.save archive (a data.pkl member)",
    }.get(
        kind,
        f"{where}: the first bytes match no format tensorbridge reads ({readable}, a shard index)",
    )


def _tensors(obj: Any, where: str, plain: bool = False) -> dict[str, Any]:
    """A flat ``{name: tensor | array}`` from a state dict, a module, or nested containers.

    Names follow the file layer's one rule (``tensorbridge._keys``): keys and list
    indices joined with ``.``. ``plain``: other leaves are left for the format to judge
    (``.pt`` keeps plain values among the tensors).
    """
    if is_module(obj):
        obj = obj.state_dict()
    if not isinstance(obj, Mapping):
        raise UnsupportedTensorError(
            f"expected a mapping of names to tensors or arrays, got {type(obj).__qualname__}; "
            "pass a state dict, e.g. {'weight': tensor}"
        )
    flat = flatten(obj, where=where)
    for name, value in flat.items():
        if isinstance(value, np.generic):
            flat[name] = np.asarray(value)
        elif is_tensor(value):
            _refuse_quantized(value, f"at {name!r}: ")
        elif not plain and not isinstance(value, (np.ndarray, Deferred, npy.NpyBytes)):
            raise UnsupportedTensorError(
                f"at {name!r}: {type(value).__qualname__} is not a tensor or array; file "
                "formats store tensors only (put other values in metadata=)"
            )
    return flat


def _refuse_quantized(value: torch.Tensor, at: str) -> None:
    """A quantized tensor subclass (torchao's ``MXTensor``, ...) is not saved as its storage."""
    import torch

    from .. import _quantized as quantized

    if type(value) is torch.Tensor:
        return
    kind = quantized.kind_of(value)
    if kind is not None:
        error = quantized.refusal(value, kind, "save")
        raise type(error)(f"{at}{error}")


def save(
    obj: Any,
    path: str | os.PathLike[str],
    *,
    float_dtype: DTypeLike | None = None,
    metadata: Mapping[str, Any] | Literal[False] | None = None,
    max_shard_size: int | str | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    quantize: Any = None,
    format: str | None = None,
    executor: Executor | None = None,
) -> None:
    """Save tensors or arrays to ``path``, streamed chunk by chunk, atomically.

    ``obj`` is a state dict (or module, or nested mapping; nested names are joined
    with ``.``, list items by index) of tensors/arrays; for ``.npy``, a single tensor
    or array. A ``.pt`` file keeps the nesting instead, and plain values (numbers,
    strings) among the tensors, as ``torch.save`` does: ``torch.load`` gives the tree
    back. ``float_dtype`` casts floating-point values only, on the way. bf16, fp8
    and complex32 keep their dtype in every format.
    ``path`` is read by :func:`destination`: a directory means ``model.safetensors`` in
    it, ``NAME.safetensors.index.json`` a sharded checkpoint. An existing file is
    replaced only with ``overwrite=True``: the default refuses, so a checkpoint (or
    the very file being converted) is never replaced by surprise.

    ``metadata`` goes to safetensors' ``__metadata__`` (strings) or beside the
    tensors of a ``.pt`` file (plain values), or into a GGUF file's key-value pairs
    (typed; ``general.architecture`` required); ``.npy`` / ``.npz`` have no place for
    it. ``quantize="q8_0"`` writes a GGUF file's floating-point matrices as Q8_0
    blocks (see :func:`tensorbridge.io.gguf.save`).

    >>> import tempfile, os, torch, tensorbridge as tb
    >>> p = os.path.join(tempfile.mkdtemp(), "w.safetensors")
    >>> tb.save({"w": torch.ones(2, dtype=torch.bfloat16)}, p)
    >>> tb.load(p)["w"].dtype
    dtype(bfloat16)
    >>> tb.save({"w": torch.zeros(2)}, p, overwrite=True)  # replaces it

    ``obj`` may also be an opened file (``tb.open(path)``): its tensors are written as
    they are read, mapped, and a dequantizing open (``tb.open(qdir,
    dequantize="bf16")``) computes each weight while a safetensors file is written,
    in bounded memory, as ``tensorbridge convert --dequantize`` does. The file's own
    metadata goes along where the format has a place for it (a warning names what
    one without leaves out); ``metadata=`` replaces it, ``metadata=False`` leaves it
    out. A ``.pt`` file opened and saved to ``.pt`` keeps its nesting and plain values
    (its metadata: ``metadata=False`` leaves them out).

    ``obj`` may also be an opened DCP checkpoint (``tb.open(dcp_dir)``): its tensors
    are assembled window by window into their place in the output, in flat memory
    (:mod:`tensorbridge.io.assemble`). A directory ``path`` then gets the sharded
    Hugging Face layout (``model-0000i-of-0000N.safetensors`` and the index;
    ``max_shard_size`` defaults to ``"5GB"``); ``format="npy"`` makes ``path`` a
    directory of ``NAME.npy`` files. Plain values (``step``, learning rates) go to
    the safetensors metadata; values that are neither are left out (listed by the
    checkpoint's ``unsupported()``). ``executor`` (any
    :class:`concurrent.futures.Executor`: a process pool, a ``dask.distributed``
    client's ``get_executor()``) runs the per-tensor tasks; the output is
    byte-identical to the serial default.

    Raises:
        DestinationExistsError: ``path`` (or a file of its sharded checkpoint) exists and
            ``overwrite`` is false.
        FormatError: a destination whose suffix is no format.
    """
    if isinstance(obj, TensorFile) and getattr(obj, "chunked", False):
        _save_chunked(
            obj,
            path,
            float_dtype=float_dtype,
            metadata=metadata,
            max_shard_size=max_shard_size,
            overwrite=overwrite,
            progress=progress,
            format=format,
            executor=executor,
        )
        return
    if executor is not None or format is not None:
        raise InvalidArgumentError(
            "executor= and format= apply to saving an opened chunked checkpoint "
            "(tb.save(tb.open(dcp_dir), path)); other saves take neither"
        )
    dst = destination(path)
    dst.check_overwrite(overwrite)
    fmt = dst.format
    keep = metadata is not False  # False: leave an opened file's metadata out
    given = None if metadata is False else metadata
    suffix = dst.path.suffix.lower()
    if max_shard_size is not None and not fmt.sharding:
        sharding = [f for f in FORMATS if f.sharding]
        raise InvalidArgumentError(
            f"max_shard_size= needs the {' or '.join(f.name for f in sharding)} format; "
            f"{suffix!r} files are not sharded (save to a "
            f"{listing(lambda f: f.sharding, ' or ')} path or a directory)"
        )
    if given and not fmt.metadata:
        raise InvalidArgumentError(
            f"{suffix!r} files have no place for metadata; save to "
            f"{listing(lambda f: f.metadata, ' or ')} to keep it, or leave out metadata= "
            f"({', '.join(map(str, list(given)[:5]))})"
        )
    options: dict[str, Any] = {}
    if fmt.sharding:
        options.update(max_shard_size=max_shard_size, index=dst.sharded)
    if quantize is not None:
        if "quantize" not in fmt.save_options:
            quantizing = [f for f in FORMATS if "quantize" in f.save_options]
            raise InvalidArgumentError(
                f"quantize= writes {' or '.join(f.quantizes for f in quantizing)}; {suffix!r} "
                f"files hold plain tensors (save to a "
                f"{listing(lambda f: 'quantize' in f.save_options, ' or ')} path, or leave out "
                "quantize=)"
            )
        options.update(quantize=quantize)
    if isinstance(obj, TensorFile):
        obj, given = _file_values(obj, fmt, given, keep)
    if given is not None and fmt.text_metadata:  # the file's own metadata too
        given = {str(k): str(v) for k, v in given.items()}
    single = fmt.single_array and (
        not fmt.many_arrays or isinstance(obj, np.ndarray) or is_tensor(obj)
    )
    if single and is_tensor(obj):
        _refuse_quantized(obj, "")
    if is_module(obj):
        obj = obj.state_dict()
    where = repr(str(dst.path))
    nested = fmt.nested and is_container(obj)
    if nested:
        _tensors(obj, where, plain=True)  # one name a leaf, as a reader flattens it
    fmt.save(
        obj if single or nested else _tensors(obj, where),
        dst.path,
        float_dtype=float_dtype,
        metadata=given,
        progress=progress,
        **options,
    )


def _file_values(
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
        return carried.get(names[0]) or f[names[0]], metadata or None
    values: dict[str, Any] = {}
    for name in names:
        if name in carried:
            values[name] = carried[name]
            continue
        value = f.stream_value(name)
        values[name] = value if fmt.deferred or not isinstance(value, Deferred) else f[name]
    return values, metadata or None


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

    >>> metadata_homes(["epoch"], ["w"]), metadata_homes(["w"], ["w"])
    ('.safetensors or .pt or .gguf or .zarr', '.safetensors or .gguf or .zarr')
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


def _save_chunked(
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
            f"{text}: a DCP checkpoint converts to {_assembly_destinations()}, not "
            f"{fmt.description}"
        )
    dst.check_overwrite(overwrite)
    if max_shard_size is not None and not fmt.sharding:
        raise InvalidArgumentError(f"{fmt.description} has no shards; leave out max_shard_size=")
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


def _assembly_destinations() -> str:
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


def load(
    path: str | os.PathLike[str],
    *,
    framework: str = "numpy",
    mmap: bool = True,
    device: DeviceLike | None = None,
    float_dtype: DTypeLike | None = None,
    keys: Any = None,
    dtype: DTypeLike | None = None,
    dequantize: DTypeLike | None = None,
    scheme: str | None = None,
    follow_links: bool = False,
) -> Any:
    """Load a file's tensors as NumPy arrays (default) or torch tensors.

    With ``mmap=True`` NumPy results are read-only (views of the mapped file where the
    format allows; a write raises, never reaches the file) and torch results writable
    (copy-on-write where mapped); ``mmap=False`` gives ordinary owned memory. ``keys``
    selects a subset. ``dtype`` names the type of raw-byte ``.npy`` / ``.npz`` members
    that ``np.save`` wrote from ml_dtypes arrays (``|V2`` for bfloat16).
    ``dequantize`` (``"bf16"``, ``"f16"``, ``"f32"``) reads a quantized checkpoint as
    the unquantized model (see :func:`open`): a GGUF file's block-quantized tensors, or
    a safetensors checkpoint's codes and scales (``scheme=`` names the scheme when no
    config beside it does). ``follow_links=True`` follows links that lead out of the
    checkpoint's directory (see :func:`open`).
    """
    # written out (not ``loader(open, ...)``) so that the API reference reads its signature
    return load_with(
        open,
        path,
        framework=framework,
        mmap=mmap,
        device=device,
        float_dtype=float_dtype,
        keys=keys,
        dtype=dtype,
        dequantize=dequantize,
        scheme=scheme,
        follow_links=follow_links,
    )


def open(
    path: str | os.PathLike[str],
    *,
    dtype: DTypeLike | None = None,
    dequantize: DTypeLike | None = None,
    scheme: str | None = None,
    follow_links: bool = False,
) -> TensorFile:
    """Open a file, shard index or checkpoint directory lazily; nothing is read until asked.

    ``.keys()``, ``[name]``, ``.metadata``, ``.notes`` (how it was read, when that is
    worth knowing).

    ``dequantize="bf16"`` (or ``"f16"``, ``"f32"``) reads a quantized checkpoint as
    the unquantized model: its names and shapes, each quantized weight computed
    when read (code x scale in float32, rounded once), other tensors as stored,
    activation scales left out. The scheme comes from ``scheme=``, else the config
    beside the checkpoint (``config.json``'s ``quantization_config``,
    ``hf_quant_config.json``), else unambiguous tensor names; anything else raises
    :class:`~tensorbridge.QuantizationError`.

    Only regular files are read (a FIFO, a device such as ``/dev/zero``, a socket or a
    directory where a file belongs raises :class:`~tensorbridge.FormatError`). ``path``
    itself may be a link; a file it names (a shard, a Zarr chunk, a DCP ``.distcp``, a
    ``config.json``, the file a directory holds) that is a link leading out of the
    checkpoint's directory raises :class:`~tensorbridge.LinkError` unless
    ``follow_links=True``. Links that stay inside are followed, and so are those of a
    Hugging Face cache snapshot into its repository's ``blobs``.

    >>> import tempfile, os, numpy as np, tensorbridge as tb
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npz")
    >>> tb.save({"x": np.arange(3)}, p)
    >>> with tb.open(p) as f:
    ...     f.keys(), f["x"].tolist()
    (['x'], [0, 1, 2])
    """
    given = Path(path)
    resolved = resolve(given)
    if resolved != given:  # a directory's file (or a .distcp's .metadata): the checkpoint's
        Links.of(given, follow=follow_links).check(resolved)
    own = by_kind(detect(resolved))
    if own is not None and own.dequantizes:  # its tensors name their own block types
        if scheme is not None:
            raise InvalidArgumentError(
                "scheme= names the scheme of a safetensors checkpoint; "
                f"{own.description}'s tensors name their own types: leave out scheme="
            )
        return _reader(resolved, dtype, dequantize, follow_links)
    f = _reader(resolved, dtype, None, follow_links)
    if dequantize is None:
        if scheme is not None:
            f.close()
            raise InvalidArgumentError(
                "scheme= says how to dequantize; pass dequantize='bf16' with it"
            )
        return f
    from .._open import dequantized  # above io and quant: only when asked for

    return dequantized(f, dequantize, scheme=scheme)

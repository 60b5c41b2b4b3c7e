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
pickled ``nn.Module`` gives its state dict). A directory opens its checkpoint: a safetensors index, one
``.safetensors`` file, a ``.bin`` index, one ``.bin`` / ``.pt`` / ``.pth`` file, one
``.gguf`` file, in that order of preference (as ``transformers`` prefers safetensors).

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

import os
import warnings
from collections.abc import Mapping
from concurrent.futures import Executor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .. import _quantized as quantized
from ..dtypes import DeviceLike, DTypeLike
from ..errors import (
    DestinationExistsError,
    FormatError,
    InvalidArgumentError,
    TensorBridgeError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)
from . import dcp, gguf, npy, npz, pt, safetensors, zarr  # noqa: F401 - tb.io.<format> without an import
from ._common import Deferred, TensorFile
from ._detect import describe, detect, kind_by_suffix, mismatch_note, resolve
from ._formats import DIRECTORY_FORMAT, FORMATS, INDEX_SUFFIX, Format, by_kind, by_suffix, listing
from ._keys import flatten
from .pickle_machine import Opaque
from .sharded import ShardedFile

__all__ = ["Destination", "Opaque", "carried_metadata", "destination", "load", "open", "save"]


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
    path: Path, dtype: DTypeLike | None = None, dequantize: DTypeLike | None = None
) -> TensorFile:
    """Open ``path`` with the reader its first bytes call for (the suffix's when unrecognised)."""
    kind = detect(path)
    where = repr(str(path))
    torch_save = by_kind("pt")
    torch_named = torch_save is not None and path.suffix.lower() in (*torch_save.suffixes, ".ckpt")
    if kind in ("unknown", "pickle") and torch_named:
        kind = "pt"  # its reader says what the first bytes look like instead
    elif kind == "unknown":  # let the suffix's reader say precisely what is wrong
        kind = kind_by_suffix(path)
    fmt = by_kind(kind)
    if fmt is None and kind != "index":
        raise FormatError(_refusal(kind, where))
    if dtype is not None and not (fmt is None or fmt.raw_dtype):
        raise InvalidArgumentError(
            f"dtype= names the type of raw bytes np.save wrote from ml_dtypes arrays "
            f"({listing(lambda f: f.raw_dtype)}); {where} is {describe(kind)}: to cast "
            "values pass float_dtype= (command line: --float-dtype)"
        )
    if dequantize is not None and (fmt is None or fmt.name != "gguf"):
        raise InvalidArgumentError(
            f"dequantize= is read here for GGUF files only; {where} is {describe(kind)} "
            "(open it with tb.open(path, dequantize=...))"
        )
    f: TensorFile
    if fmt is None:  # a shard index: each shard by its own reader
        f = ShardedFile(path, lambda shard: _reader(shard, dtype))
    elif dequantize is not None:
        f = fmt.reader(path, dequantize=dequantize)
    elif fmt.raw_dtype:
        f = fmt.reader(path, dtype=dtype)
    else:
        f = fmt.reader(path)
    note = mismatch_note(path, kind)
    if note:
        f.notes.insert(0, note)
    return f


def _refusal(kind: str, where: str) -> str:
    """Why a file of ``kind``, which no format reads, is refused, and what to do instead."""
    readable = ", ".join(f.description for f in FORMATS)
    return {
        "torchscript": pt.TORCHSCRIPT_MESSAGE.format(where=where),
        "pickle": f"{where} is a plain pickle, not a torch.save archive; tensorbridge never "
        "runs a pickle (torch.save archives are read by its own pickle machine)",
        "zip": f"{where} is a zip archive that is neither a .npz (only .npy members) nor a "
        "torch.save archive (a data.pkl member)",
    }.get(
        kind,
        f"{where}: the first bytes match no format tensorbridge reads ({readable}, a shard index)",
    )


def _tensors(obj: Any, where: str) -> dict[str, Any]:
    """A flat ``{name: tensor | array}`` from a state dict, a module, or nested containers.

    Names follow the file layer's one rule (``tensorbridge.io._keys``): keys and list
    indices joined with ``.``.
    """
    if isinstance(obj, torch.nn.Module):
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
        elif type(value) is not torch.Tensor and isinstance(value, torch.Tensor):
            _refuse_quantized(value, f"at {name!r}: ")
        elif not isinstance(value, (torch.Tensor, np.ndarray, Deferred)):
            raise UnsupportedTensorError(
                f"at {name!r}: {type(value).__qualname__} is not a tensor or array; file "
                "formats store tensors only (put other values in metadata=)"
            )
    return flat


def _refuse_quantized(value: torch.Tensor, at: str) -> None:
    """A quantized tensor subclass (torchao's ``MXTensor``, ...) is not saved as its storage."""
    kind = quantized.kind_of(value)
    if kind is not None:
        error = quantized.refusal(value, kind, "save")
        raise type(error)(f"{at}{error}")


def save(
    obj: Any,
    path: str | os.PathLike[str],
    *,
    float_dtype: DTypeLike | None = None,
    metadata: Mapping[str, Any] | None = None,
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
    or array. ``float_dtype`` casts floating-point values only, on the way. bf16, fp8
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
    one without leaves out); ``metadata=`` replaces it.

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
    suffix = dst.path.suffix.lower()
    if max_shard_size is not None and not fmt.sharding:
        sharding = [f for f in FORMATS if f.sharding]
        raise InvalidArgumentError(
            f"max_shard_size= needs the {' or '.join(f.name for f in sharding)} format; "
            f"{suffix!r} files are not sharded (save to a "
            f"{listing(lambda f: f.sharding, ' or ')} path or a directory)"
        )
    if metadata and not fmt.metadata:
        raise InvalidArgumentError(
            f"{suffix!r} files have no place for metadata; save to "
            f"{listing(lambda f: f.metadata, ' or ')} to keep it, or leave out metadata= "
            f"({', '.join(map(str, list(metadata)[:5]))})"
        )
    if metadata is not None and fmt.text_metadata:
        metadata = {str(k): str(v) for k, v in metadata.items()}
    options: dict[str, Any] = {}
    if fmt.sharding:
        options.update(max_shard_size=max_shard_size, index=dst.sharded)
    if quantize is not None:
        if fmt.name != "gguf":
            raise InvalidArgumentError(
                f"quantize= writes GGUF's Q8_0 blocks; {suffix!r} files hold plain tensors "
                "(save to a .gguf path, or leave out quantize=)"
            )
        options.update(quantize=quantize)
    if isinstance(obj, TensorFile):
        obj, metadata = _file_values(obj, fmt, metadata)
    single = fmt.single_array and (
        not fmt.many_arrays or isinstance(obj, (torch.Tensor, np.ndarray))
    )
    if single and type(obj) is not torch.Tensor and isinstance(obj, torch.Tensor):
        _refuse_quantized(obj, "")
    fmt.save(
        obj if single else _tensors(obj, repr(str(dst.path))),
        dst.path,
        float_dtype=float_dtype,
        metadata=metadata,
        progress=progress,
        **options,
    )


def _file_values(
    f: TensorFile, fmt: Format, metadata: Mapping[str, Any] | None
) -> tuple[Any, Mapping[str, Any] | None]:
    """An opened file's tensors as ``save`` writes them (mapped, or computed while written),
    and the metadata to keep: the file's own (:func:`carried_metadata`) unless given."""
    unsupported = f.unsupported()
    if unsupported:
        first, reason = next(iter(unsupported.items()))
        raise UnsupportedDtypeError(
            f"{reason}; save the other entries: {{n: f[n] for n in f.keys() if n != {first!r}}}"
        )
    names = f.keys()
    if metadata is None:
        metadata, dropped = carried_metadata(f, fmt, names)
        if dropped:
            warnings.warn(
                f"{fmt.description}s have no place for metadata; {f.filename}'s "
                f"{', '.join(dropped[:5])} are not saved (save to "
                f"{listing(lambda g: g.metadata, ' or ')} to keep them)",
                stacklevel=3,
            )
    if fmt.single_array and not fmt.many_arrays and len(names) == 1:
        return f[names[0]], metadata or None
    values: dict[str, Any] = {}
    for name in names:
        value = f.stream_value(name)
        values[name] = value if fmt.deferred or not isinstance(value, Deferred) else f[name]
    return values, metadata or None


# the values of safetensors' "format" mark: the framework that wrote the file
WRITER_MARKS = ("pt", "np", "tf", "flax", "mlx")


def carried_metadata(
    src: TensorFile, fmt: Format, names: list[str]
) -> tuple[dict[str, Any], list[str]]:
    """The source's metadata as a ``fmt`` file can hold it, and the keys it cannot.

    A mark another format's writer sets for itself (safetensors' ``format: pt``) is
    not the user's metadata and is not carried.
    """
    values = src.plain_values()
    marks = {f.metadata_mark for f in FORMATS} - {fmt.metadata_mark, None}
    values = {k: v for k, v in values.items() if not (k in marks and v in WRITER_MARKS)}
    if not fmt.metadata:
        return {}, sorted(values)
    clash = [k for k in values if k in names]
    if fmt.metadata_with_tensors and clash:
        apart = (f for f in FORMATS if f.metadata and not f.metadata_with_tensors)
        raise TensorBridgeError(
            f"metadata key {clash[0]!r} of {src.filename} is also a tensor's name; "
            f"{fmt.description} cannot hold both: write {next(apart).suffixes[0]}"
        )
    return values, []


DEFAULT_SHARD_SIZE = "5GB"  # a chunked checkpoint saved to a directory: transformers' default


def _save_chunked(
    f: TensorFile,
    path: str | os.PathLike[str],
    *,
    float_dtype: DTypeLike | None,
    metadata: Mapping[str, Any] | None,
    max_shard_size: int | str | None,
    overwrite: bool,
    progress: bool | None,
    format: str | None,
    executor: Executor | None,
) -> None:
    """``tb.save`` of an opened chunked (DCP) checkpoint: see :func:`save`."""
    from . import assemble
    from .dcp import DcpFile

    assert isinstance(f, DcpFile)
    text = os.fspath(path)
    if format == "npy":
        if max_shard_size is not None or metadata:
            raise InvalidArgumentError(
                "a directory of .npy files has no shards and no metadata; leave out "
                "max_shard_size= and metadata=, or save to a directory for safetensors"
            )
        target = Path(text)
        if target.exists() and not target.is_dir():
            raise FormatError(f"{text} is a file; format='npy' writes a directory of .npy files")
        skipped = f.unsupported()
        names = [n for n in f if n not in skipped]
        found = [target / f"{n}.npy" for n in names if (target / f"{n}.npy").exists()]
        if found and not overwrite:
            raise DestinationExistsError(
                f"{found[0]} exists; pass overwrite=True (command line: --overwrite) to replace it"
            )
        assemble.save(
            f, target, fmt="npy", float_dtype=float_dtype, executor=executor, progress=progress
        )
        return
    if format not in (None, "safetensors"):
        raise FormatError(
            f"format={format!r}: a DCP checkpoint converts to 'safetensors' (a directory or a "
            "NAME.safetensors path) or 'npy' (a directory of .npy files)"
        )
    dst = destination(path)
    if dst.format.name == "zarr":
        dst.check_overwrite(overwrite)
        if max_shard_size is not None:
            raise InvalidArgumentError("a Zarr store has no shards; leave out max_shard_size=")
        assemble.save(
            f,
            dst.path,
            fmt="zarr",
            float_dtype=float_dtype,
            metadata={**f.plain_values(), **(metadata or {})},
            executor=executor,
            progress=progress,
        )
        return
    if dst.format.name != "safetensors":
        raise FormatError(
            f"{text}: a DCP checkpoint converts to a directory (sharded safetensors), a "
            "NAME.safetensors file, a NAME.zarr store, or a directory of .npy files "
            "(format='npy'), not "
            f"{dst.format.description}"
        )
    dst.check_overwrite(overwrite)
    is_dir = Path(text).is_dir() or text.endswith(("/", os.sep))
    if is_dir and max_shard_size is None:
        max_shard_size = DEFAULT_SHARD_SIZE
    meta = {str(k): str(v) for k, v in f.plain_values().items()}
    meta.update({str(k): str(v) for k, v in (metadata or {}).items()})
    assemble.save(
        f,
        dst.path,
        fmt="safetensors",
        float_dtype=float_dtype,
        metadata=meta,
        max_shard_size=max_shard_size,
        index=dst.sharded or is_dir,
        executor=executor,
        progress=progress,
    )


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
    config beside it does).
    """
    with open(path, dtype=dtype, dequantize=dequantize, scheme=scheme) as f:
        return f.read(keys, framework=framework, mmap=mmap, device=device, float_dtype=float_dtype)


def open(
    path: str | os.PathLike[str],
    *,
    dtype: DTypeLike | None = None,
    dequantize: DTypeLike | None = None,
    scheme: str | None = None,
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

    >>> import tempfile, os, numpy as np, tensorbridge as tb
    >>> p = os.path.join(tempfile.mkdtemp(), "a.npz")
    >>> tb.save({"x": np.arange(3)}, p)
    >>> with tb.open(p) as f:
    ...     f.keys(), f["x"].tolist()
    (['x'], [0, 1, 2])
    """
    resolved = resolve(Path(path))
    if detect(resolved) == "gguf":  # its tensors name their own block types
        if scheme is not None:
            raise InvalidArgumentError(
                "scheme= names the scheme of a safetensors checkpoint; a GGUF file's "
                "tensors name their own types: leave out scheme="
            )
        return _reader(resolved, dtype, dequantize)
    f = _reader(resolved, dtype)
    if dequantize is None:
        if scheme is not None:
            f.close()
            raise InvalidArgumentError(
                "scheme= says how to dequantize; pass dequantize='bf16' with it"
            )
        return f
    from ..quant.api import DequantizedFile

    try:
        return DequantizedFile(f, dequantize, scheme=scheme)
    except BaseException:
        f.close()
        raise

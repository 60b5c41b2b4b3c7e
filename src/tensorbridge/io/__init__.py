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
HDF5 (``.h5``, ``.hdf5``; Keras        :mod:`tensorbridge.io.hdf5` (needs
``.weights.h5`` and ``.keras``)        ``pip install tensorbridge[hdf5]``)
ONNX models' initializers (``.onnx``;  :mod:`tensorbridge.io.onnx` (writing needs
external data beside it)               ``pip install tensorbridge[onnx]``)
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
from collections.abc import Mapping
from concurrent.futures import Executor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from .._files import Links
from .._keys import flatten, is_container
from .._tensorfile import Deferred, StoredBits, TensorFile
from .._torch_checks import is_module, is_tensor
from ..dtypes import DeviceLike, DTypeLike
from ..errors import (
    FormatError,
    InvalidArgumentError,
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
from ._formats import Format, named_by, register_format, unregister_format
from ._formats import by_kind as by_kind
from ._formats import entry_files as entry_files
from ._formats import listing as listing
from .conversion import WRITER_MARKS as WRITER_MARKS
from .conversion import (
    carried_members,
    carried_metadata,
    copied_value,
    file_values,
    metadata_homes,
    nested_values,
    save_chunked,
)
from .destinations import Destination, destination
from .sharded import ShardedFile

if TYPE_CHECKING:
    import torch

    from . import dcp, pt  # noqa: F401 - loaded on first use by __getattr__ below
    from .pickle_machine import Opaque


def __getattr__(name: str) -> Any:
    """The torch formats' modules, which import torch, and any registered format's module
    named ``tensorbridge.io.<its name>`` (``tb.io.onnx``), loaded when first used (PEP 562):
    reading and writing the NumPy formats does not import torch."""
    own = {f.name: f.module for f in FORMATS}.get(name)
    if name in ("dcp", "pt") or own == f"{__name__}.{name}":
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
    "copied_value",
    "destination",
    "load",
    "metadata_homes",
    "nested_values",
    "open",
    "register_format",
    "save",
    "unregister_format",
]


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
            f"dtype= names the type of raw bytes an ml_dtypes array was saved as "
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
    note = mismatch_note(path, kind)
    try:
        if fmt is None:  # a shard index: each shard by its own reader
            links = Links.of(path, follow=follow_links)
            f = ShardedFile(path, lambda shard: _reader(shard, dtype, None, follow_links), links)
        elif dequantize is not None:
            f = fmt.reader(path, dequantize=dequantize, **options)
        elif fmt.raw_dtype:
            f = fmt.reader(path, dtype=dtype, **options)
        else:
            f = fmt.reader(path, **options)
    except FormatError as e:
        if named is None or fmt is None or fmt is named:
            raise
        raise type(e)(
            f"{e} ({path.name} was read as {describe(kind)}, as its first bytes say, not as "
            f"{named.called or named.description})"
        ) from None
    f.follow_links = follow_links
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
        elif not plain and not isinstance(value, (np.ndarray, Deferred, StoredBits, npy.NpyBytes)):
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
    options: Mapping[str, Any] | None = None,
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
    blocks (see :func:`tensorbridge.io.gguf.save`). ``options`` are the destination
    format's own save options (its row's ``save_options``): ``{"into": "model.onnx"}``
    writes that ONNX model with its initializers replaced by the tensors
    (:func:`tensorbridge.io.onnx.save`).

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
        if options:
            raise InvalidArgumentError(
                "options= are a format's own save options; a chunked checkpoint's save "
                "takes none (convert it to the format first, then save with them)"
            )
        save_chunked(
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
    given = None if metadata is False else metadata
    dst.check(
        overwrite=overwrite,
        max_shard_size=max_shard_size,
        metadata=given,
        quantize=quantize,
        options=options,
    )
    fmt = dst.format
    keep = metadata is not False  # False: leave an opened file's metadata out
    kwargs: dict[str, Any] = {k: v for k, v in (options or {}).items() if v is not None}
    if fmt.sharding:
        kwargs.update(max_shard_size=max_shard_size, index=dst.sharded)
    if quantize is not None:
        kwargs.update(quantize=quantize)
    if isinstance(obj, TensorFile):
        obj, given = file_values(obj, fmt, given, keep)
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
        **kwargs,
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
    block_size: tuple[int, int] | None = None,
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
    a safetensors checkpoint's codes and scales (``scheme=`` names the scheme and
    ``block_size=`` fp8-block's block when no config beside it does).
    ``follow_links=True`` follows links that lead out of the checkpoint's directory
    (see :func:`open`).
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
        block_size=block_size,
        follow_links=follow_links,
    )


def open(
    path: str | os.PathLike[str],
    *,
    dtype: DTypeLike | None = None,
    dequantize: DTypeLike | None = None,
    scheme: str | None = None,
    block_size: tuple[int, int] | None = None,
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
    :class:`~tensorbridge.QuantizationError`. ``block_size=(128, 128)`` gives
    fp8-block's block when no config does (it is never guessed from the scales).

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
    how = "scheme=" if scheme is not None else "block_size=" if block_size else None
    if own is not None and own.dequantizes:  # its tensors name their own block types
        if how:
            raise InvalidArgumentError(
                f"{how} says how to read a safetensors checkpoint's codes and scales; "
                f"{own.description}'s tensors name their own types: leave out {how}"
            )
        return _reader(resolved, dtype, dequantize, follow_links)
    if dequantize is None and how:
        raise InvalidArgumentError(f"{how} says how to dequantize; pass dequantize='bf16' with it")
    f = _reader(resolved, dtype, None, follow_links)
    if dequantize is None:
        return f
    from .._open import dequantized  # above io and quant: only when asked for

    return dequantized(f, dequantize, scheme=scheme, block_size=block_size)

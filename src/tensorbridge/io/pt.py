"""``.pt`` / ``.pth`` / ``.bin``: torch.save archives, read without running their pickle.

**Reading** goes through ``torch.load(path, weights_only=True, mmap=True,
map_location="cpu")`` and nothing else: torch's restricted unpickler builds tensors,
containers and plain values and refuses every other global, so a file can never make
tensorbridge import or call anything. A refusal becomes :class:`~tensorbridge.FormatError`;
a pickled whole ``nn.Module`` and a TorchScript archive each get a message of their own.
Legacy (pre-1.6) files, a pickle stream rather than a zip, go through the same restricted
unpickler without ``mmap`` (the format cannot be mapped): their tensors are read into
memory, and the reader's ``notes`` say so.
Storages are memory-mapped copy-on-write by torch; NumPy results are read-only views of
them, torch results writable tensors whose writes never reach the file (the entries of
one opened file share that private mapping, so tied weights stay tied).

**Keys.** A state dict's nesting is flattened with ``.`` (``{"model": {"w": t}}`` ->
``"model.w"``; list and tuple items by their index, ``"layers.0"``): the file layer's
one naming rule (``tensorbridge.io._keys``), by which ``tb.save`` flattens too.
Non-tensor leaves (an epoch number, a learning rate, a ``torch.Size``) go to
``.metadata`` under the same dotted key as ``str(value)``; they are never tensors. A
file holding a single tensor has one key, the file's stem, and ``load`` returns that
tensor/array itself (like ``.npy``).

**Writing** converts every value with :func:`tensorbridge.to_torch` (bfloat16 arrays
become bfloat16 tensors), casts floating values when ``float_dtype`` asks, moves them to
the CPU, and hands them to ``torch.save`` inside an atomic write. ``torch.save`` needs
every tensor in memory at once, so unlike ``.npy`` and ``.safetensors`` a cast save holds
the whole cast model. Tensors passed as they are keep their shared storage (tied weights
stay tied), and a view saves its whole storage, as ``torch.save`` always does.
"""

from __future__ import annotations

import builtins
import io
import os
import pickle
import re
import struct
import zipfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any, NamedTuple, cast

import numpy as np
import torch

from .._versions import quiet_sparse_validation
from ..convert import to_numpy, to_torch
from ..dtypes import DeviceLike, DTypeLike, DTypeRow, resolve_dtype
from ..errors import FormatError, TensorBridgeError, UnsupportedTensorError
from ._common import TensorFile, atomic_write, cast_target, check_unchanged, progress_bar, row_of
from ._detect import detect
from ._keys import NameRules, flatten, is_container, no_nul, valid_unicode

__all__ = ["PtFile", "load", "open", "save"]


_LEGACY_NOTE = (
    "legacy torch.save format (before torch 1.6): read into memory with weights_only=True, "
    "not memory-mapped"
)


@quiet_sparse_validation()  # torch 2.15 warns that it validates sparse entries; we want that
def _torch_load(path: Path) -> tuple[Any, bool]:
    """The archive's object through the restricted unpickler, and whether it is mapped."""
    where = repr(str(path))
    _check_members(path)
    try:
        if path.name.lower().endswith(".safetensors"):
            # torch.load hands any path named so to the safetensors library; a file object
            # keeps it on its own reader (without a map: torch maps only paths)
            with builtins.open(path, "rb") as f:
                return torch.load(f, weights_only=True, map_location="cpu"), False
        try:
            return torch.load(path, weights_only=True, mmap=True, map_location="cpu"), True
        except RuntimeError as err:
            if "mmap can only be used" not in str(err):
                raise
        # the legacy (pre-1.6) format has no zip to map; weights_only still guards it. It
        # is read into memory anyway, and from a BytesIO a string or storage length the
        # file lies about reads what is there: a file's read(n) allocates n bytes first
        data = io.BytesIO(path.read_bytes())
        return torch.load(data, weights_only=True, map_location="cpu"), False
    except pickle.UnpicklingError as err:
        text = str(err)
        glob = re.search(r"GLOBAL ([\w.]+)", text)
        name = glob.group(1) if glob else ""
        if name.startswith("torch.nn.modules.") or name.endswith("Module"):
            raise FormatError(
                f"{where} holds a pickled {name} (a whole nn.Module), not a state dict; where "
                "its code is available, re-save it with torch.save(model.state_dict(), path)"
            ) from None
        raise FormatError(
            f"{where} contains non-tensor objects that only a full unpickle could build"
            f"{f' (the global {name})' if name else ''}; tensorbridge never unpickles "
            "arbitrary data. If you trust the file, load it with torch.load(path, "
            "weights_only=False) and pass the tensors to tb.save"
        ) from None
    except RuntimeError as err:
        msg = str(err)
        if "TorchScript" in msg:
            raise FormatError(TORCHSCRIPT_MESSAGE.format(where=where)) from None
        raise FormatError(
            f"{where} is not a readable torch.save archive: {msg.splitlines()[0]}"
        ) from None
    except (
        EOFError, ValueError, KeyError, IndexError, TypeError, AttributeError,
        struct.error, OverflowError,  # a legacy file's record cut short, a size out of range
        AssertionError,  # torch's legacy loader asserts on a storage key it never saw
    ) as err:  # fmt: skip
        raise FormatError(f"{where} is a corrupt torch.save archive: {err}") from None


DEFLATE_MAX_RATIO = 1032  # deflate cannot expand data more than this


def _check_members(path: Path) -> None:
    """Refuse a zip whose members claim sizes they cannot hold, before torch reads it.

    torch's zip reader trusts a member's declared size: a 1 KB file whose ``version``
    member claims 2 GiB kept it busy for 40 s. Legacy (non-zip) files pass through.
    """
    with builtins.open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":
            return
        try:
            infos = zipfile.ZipFile(f).infolist()
        except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError) as err:
            raise FormatError(f"{str(path)!r} is not a readable zip archive ({err})") from None
        size = f.seek(0, os.SEEK_END)
    for info in infos:
        stored = info.compress_type == zipfile.ZIP_STORED
        limit = info.compress_size if stored else info.compress_size * DEFLATE_MAX_RATIO + 1024
        # a zip64 record's offset wraps to a negative one in zipfile; torch seeks there
        outside = info.header_offset < 0 or info.header_offset + info.compress_size > size
        if outside or info.file_size > limit:
            raise FormatError(
                f"{str(path)!r}: member {info.filename!r} claims {info.file_size:,} bytes "
                f"from {info.compress_size:,} stored at offset {info.header_offset:,} of a "
                f"{size:,}-byte file; the archive is corrupt"
            )


# How far a copy may exceed the file (a tensor's values may repeat, by zero strides, but a
# hostile file must not make a reader allocate gigabytes from a few bytes).
COPY_MARGIN = 64 << 20

TORCHSCRIPT_MESSAGE = (
    "{where} is a TorchScript archive (torch.jit.save): it holds a program, not a state "
    "dict; if you trust it, torch.jit.load(path).state_dict() gives its weights"
)


class _Entries(NamedTuple):
    tensors: dict[str, torch.Tensor]
    values: dict[str, Any]  # the plain (non-tensor) leaves, as unpickled
    single: bool  # the archive is one tensor
    mapped: bool  # zip format, memory-mapped (False: legacy, read into memory)


def _entries(path: Path) -> _Entries:
    """The archive's tensors and plain values by dotted key."""
    obj, mapped = _torch_load(path)
    flat = flatten(obj, where=repr(str(path))) if is_container(obj) else {path.stem: obj}
    tensors = {k: v for k, v in flat.items() if isinstance(v, torch.Tensor)}
    values = {k: v for k, v in flat.items() if not isinstance(v, torch.Tensor)}
    return _Entries(tensors, values, isinstance(obj, torch.Tensor), mapped)


class PtFile(TensorFile):
    """A torch.save archive: its tensors by dotted key, its other values in ``metadata``.

    ``metadata`` holds the plain values as strings (like safetensors metadata);
    :meth:`plain_values` gives them as they were unpickled (ints stay ints).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self._path = Path(path)
        self._where = repr(str(self._path))
        self._size = os.stat(self._path).st_size
        entries = _entries(self._path)
        self._tensors, self._values, self.single = entries.tensors, entries.values, entries.single
        self.metadata = {k: str(v) for k, v in self._values.items()}
        self.mapped = entries.mapped
        if not self.mapped:
            legacy = detect(self._path) == "pt-legacy"
            note = _LEGACY_NOTE if legacy else "read into memory, not memory-mapped"
            self.notes.append(f"{self._path.name}: {note}")
        self._writable: dict[str, torch.Tensor] | None = None

    def plain_values(self) -> dict[str, Any]:
        return dict(self._values)

    def keys(self) -> list[str]:
        return list(self._tensors)

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        t = self._tensor(name, self._tensors)
        return resolve_dtype(t.dtype), tuple(t.shape)

    def _tensor(self, name: str, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        if name not in tensors:
            raise KeyError(f"{name!r} is not in this file; its keys are {self.keys()[:10]}")
        t = tensors[name]
        if t.layout is not torch.strided or t.is_nested:
            raise UnsupportedTensorError(
                f"{self._where}: {name!r} is a {t.layout} tensor; tensorbridge's file readers "
                "give dense arrays (torch.load(path, weights_only=True) returns it as it is)"
            )
        return t

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        if self.mapped:
            check_unchanged(self._path, self._size, self._where)
        self._check_copy_size(name, self._tensor(name, self._tensors))
        if not copy_on_write:
            view: np.ndarray = to_numpy(self._tensor(name, self._tensors), readonly=True)
            return view
        if not self.mapped:  # legacy: the tensors are in memory; torch results get a copy
            copied: np.ndarray = to_numpy(self._tensor(name, self._tensors), copy=True)
            return copied
        if self._writable is None:  # a second private mapping that only torch results use
            self._writable = _entries(self._path).tensors
        writable: np.ndarray = to_numpy(self._tensor(name, self._writable))
        return writable

    def _check_copy_size(self, name: str, t: torch.Tensor) -> None:
        """Refuse values that repeat (overlapping strides) to far more than the file holds.

        Every consumer of an entry copies it sooner or later (a cast, a torch result,
        ``mmap=False``, a conversion), so a hostile file of a few bytes must not be able
        to claim gigabytes through a zero stride; a view alone would be safe, but is
        refused too, so that every way of reading the entry agrees.
        """
        need = t.numel() * t.element_size()
        if need > self._size + COPY_MARGIN and need > t.untyped_storage().nbytes():
            raise FormatError(
                f"{self._where}: {name!r} has shape {list(t.shape)} and strides "
                f"{list(t.stride())} over a storage of {t.untyped_storage().nbytes()} bytes: "
                f"its values take {need} bytes, far more than the file's {self._size}; if "
                "you trust the file, read it with torch.load(path, weights_only=True)"
            )

    def close(self) -> None:
        self._writable = None  # handed-out arrays keep their mapping alive


def open(path: str | os.PathLike[str]) -> PtFile:  # the verb every format has
    """Open a torch.save archive with ``weights_only=True`` and ``mmap=True``.

    >>> import os, tempfile, torch
    >>> p = os.path.join(tempfile.mkdtemp(), "m.pt")
    >>> torch.save({"model": {"w": torch.ones(2)}, "epoch": 3}, p)
    >>> with open(p) as f:
    ...     f.keys(), f.metadata, f["model.w"].flags.writeable
    (['model.w'], {'epoch': '3'}, False)

    Raises:
        FormatError: not a zip-format torch.save archive, or one holding objects that
            only a full unpickle could build.
    """
    return PtFile(path)


def load(
    path: str | os.PathLike[str],
    *,
    framework: str = "numpy",
    mmap: bool = True,
    device: DeviceLike | None = None,
    float_dtype: DTypeLike | None = None,
    keys: Iterable[str] | None = None,
) -> Any:
    """A dict of the archive's tensors by dotted key (the tensor itself for a single-tensor file).

    >>> import os, tempfile, torch
    >>> p = os.path.join(tempfile.mkdtemp(), "w.pt")
    >>> torch.save({"w": torch.ones(2, dtype=torch.bfloat16)}, p)
    >>> load(p)["w"].dtype
    dtype(bfloat16)

    Args:
        framework: ``"numpy"`` (read-only views with ``mmap``) or ``"torch"``.
        mmap: ``False`` copies into owned memory.
        device: where torch results go.
        float_dtype: cast floating-point values (only) to this dtype.
        keys: the dotted keys to read.
    """
    with open(path) as f:
        return f.read(keys, framework=framework, mmap=mmap, device=device, float_dtype=float_dtype)


# keys are pickled str (any text survives); the rules of tensorbridge.io._keys that apply
NAMES = NameRules((no_nul, valid_unicode))


def save(
    tensors: Any,
    path: str | os.PathLike[str],
    *,
    float_dtype: DTypeLike | None = None,
    metadata: Mapping[str, Any] | None = None,
    progress: bool | None = None,
) -> None:
    """Write a tensor, or a mapping of names to tensors/arrays, with ``torch.save``, atomically.

    The signature every format's ``save`` has (:mod:`tensorbridge.io._formats`); this
    format has no options of its own.

    ``metadata`` (plain values: str, int, float, bool, None) is stored beside the
    tensors under its own keys, as a training checkpoint stores its ``epoch``; reading
    the file back gives them in ``metadata`` again.

    >>> import os, tempfile, ml_dtypes, numpy as np, torch
    >>> p = os.path.join(tempfile.mkdtemp(), "w.pt")
    >>> save({"w": np.ones(2, ml_dtypes.bfloat16)}, p)
    >>> torch.load(p, weights_only=True)["w"].dtype
    torch.bfloat16

    Args:
        tensors: a tensor or array, or a flat mapping of string keys to them.
        float_dtype: cast floating-point values (only) to this dtype.
        progress: show a progress bar (``None``: when stderr is a terminal).

    Raises:
        UnsupportedDtypeError / UnsupportedTensorError: a value with no torch counterpart
            (the message names its key).
        InvalidNameError: a key :data:`NAMES` refuses (a NUL, a lone surrogate).
    """
    path = Path(path)
    if isinstance(tensors, Mapping):
        NAMES.check(tensors, repr(str(path)))
        data: Any = {}
        for key, value in tensors.items():
            if not isinstance(key, str):
                raise UnsupportedTensorError(f"{str(path)!r}: keys are strings, got {key!r}")
            try:
                data[key] = _as_saved(value, float_dtype)
            except TensorBridgeError as err:
                raise type(err)(f"at {key!r}: {err}") from None
        saved = list(data.values())
        for key, value in (metadata or {}).items():
            if key in data:
                raise UnsupportedTensorError(
                    f"{str(path)!r}: metadata key {key!r} is also a tensor's name; rename one"
                )
            data[key] = (
                value if isinstance(value, (str, int, float, bool, type(None))) else str(value)
            )
    else:
        if metadata:
            raise UnsupportedTensorError(
                f"{str(path)!r}: a file of one bare tensor has no place for metadata; pass a "
                "mapping such as {'weight': tensor}"
            )
        data = _as_saved(tensors, float_dtype)
        saved = [data]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}
    bar = progress_bar(sum(storages.values()), f"saving {path.name}", progress)
    try:
        with atomic_write(path) as f:
            counted = _Counted(f, bar)
            try:
                torch.save(data, cast("IO[bytes]", counted))
            except RuntimeError:
                if counted.error is not None:  # disk full, file size limit: say so
                    raise counted.error from None
                raise
    finally:
        bar.close()


def _as_saved(x: Any, float_dtype: Any) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        if not isinstance(x, (np.ndarray, np.generic)):
            raise UnsupportedTensorError(
                f"{type(x).__qualname__} is not a tensor or array; .pt files written by "
                "tensorbridge hold tensors only"
            )
        dst = cast_target(row_of(np.asarray(x)), float_dtype)
        return to_torch(x, dtype=dst)
    if x.layout is not torch.strided or x.is_nested:
        raise UnsupportedTensorError(
            f"a {x.layout} tensor is not saved by tensorbridge; pass x.to_dense()"
        )
    dst = cast_target(row_of(x), float_dtype)
    return x.detach().to(device="cpu", dtype=dst.torch)


class _Counted:
    """A write-only file that advances a progress bar by the bytes written."""

    def __init__(self, f: Any, bar: Any) -> None:
        self._f, self._bar = f, bar
        self.error: OSError | None = None

    def write(self, b: Any) -> int:
        try:
            n: int = self._f.write(b)
        except OSError as err:  # torch's writer reports only "unexpected pos": keep the cause
            self.error = err
            raise
        self._bar.update(n)
        return n

    def flush(self) -> None:
        self._f.flush()

"""``.pt`` / ``.pth`` / ``.bin`` / ``.ckpt``: torch.save archives, read without running them.

**Reading** never calls torch's unpickler: :mod:`tensorbridge.io.torch_archive` finds
the pickle and the storages of either era (zip since torch 1.6, the legacy pickle
stream before), and :mod:`tensorbridge.io.pickle_machine` interprets the pickle with
its fixed table. Tensors come only from ``torch._utils._rebuild_tensor_v2`` /
``_v3`` / ``_rebuild_parameter`` over storages present in the file, every view
checked against its storage's bytes; any other global becomes an inert
:class:`~tensorbridge.io.pickle_machine.Opaque` placeholder (a call of a function of
``builtins``, ``os``, ``torch`` ... is refused). Nothing from the file is imported,
called, or allowed to change the process.

**Entries.** A state dict's nesting is flattened with ``.`` (``{"model": {"w": t}}`` ->
``"model.w"``; list and tuple items by their index, ``"layers.0"``): the file layer's
one naming rule (``tensorbridge._keys``), by which ``tb.save`` flattens too.
A pickled ``nn.Module`` (a placeholder whose state has ``_parameters``, ``_buffers``
and ``_modules``) gives its parameters and persistent buffers under their
``state_dict`` names (``"0.weight"``, ``"model.encoder.layers.0.linear1.bias"``),
read from that state alone. Any other placeholder (an ``argparse.Namespace``, a
dataclass config, a tensor subclass, a sparse or quantized tensor) is a key that
:meth:`~PtFile.unsupported` names with its global; its plain fields and tensors are
flattened beneath it. Plain leaves (an epoch number, a learning rate, a
``torch.Size``) go to ``.metadata`` under the same dotted key as ``str(value)``; a set
holding a tensor or a placeholder is listed as unsupported. A
file holding a single tensor has one key, the file's stem, and ``load`` returns that
tensor/array itself (like ``.npy``).

**Memory.** A zip-era file is mapped once: NumPy results are read-only views of the
map, torch results writable copy-on-write views of a second, private map of the same
opened file (the entries of one opened file share it, so tied weights stay tied and a
write never reaches the file). A legacy file's storages are read into memory (that
format cannot be mapped), and the reader's ``notes`` say so. The file is opened once:
replacing it under the same name later changes nothing an opened reader gives. A
tensor whose strides repeat its storage's values (a zero stride) is read as long as the
bytes it takes beyond its storage, summed over every such entry of the file (each once),
stay within the file's size plus ``COPY_MARGIN`` (64 MiB); past that the file is
refused when opened, before anything is read.

**Writing** keeps the nesting it is given (``tb.save`` passes a tree as it is, and a
``.pt`` source converted to ``.pt`` is rebuilt from the reader's :meth:`structure`, so
``torch.load`` of the output gives the source's nesting and plain values back). It
converts every tensor with :func:`tensorbridge.to_torch` (bfloat16 arrays
become bfloat16 tensors), casts floating values when ``float_dtype`` asks, moves them to
the CPU, and hands them to ``torch.save`` inside an atomic write. ``torch.save`` needs
every tensor in memory at once, so unlike ``.npy`` and ``.safetensors`` a cast save holds
the whole cast model. Tensors passed as they are keep their shared storage (tied weights
stay tied), and a view saves its whole storage, as ``torch.save`` always does. torch's
sub-byte integers (``torch.save`` cannot pickle them) and the types only NumPy has are
refused before anything is written, naming ``.npy`` / ``.npz``; a file whose pickle
rebuilds a sub-byte tensor (``torch.load`` reads one) is read like any other.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any, cast

import numpy as np
import torch

from .._atomic import atomic_write
from .._filemap import check_unchanged
from .._keys import NameRules, flatten, is_container, no_nul, skeleton, valid_unicode
from .._progress import progress_bar
from .._tensorfile import TensorFile, cast_target, keeping, row_of
from ..convert import to_torch
from ..dtypes import DTypeLike, DTypeRow, exact_widenings, resolve_dtype
from ..errors import (
    FormatError,
    TensorBridgeError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)
from ._common import loader
from .pickle_machine import DICTS, Opaque, TensorRef, itemsize
from .torch_archive import TORCHSCRIPT_MESSAGE, Archive, open_archive

__all__ = ["Opaque", "PtFile", "load", "open", "save"]

__all__ += ["TORCHSCRIPT_MESSAGE"]

_LEGACY_NOTE = (
    "legacy torch.save format (before torch 1.6): its storages were read into memory, "
    "not memory-mapped"
)

# How far copies may exceed the file (a tensor's values may repeat, by zero strides, but a
# hostile file must not make a reader allocate gigabytes from a few bytes): one entry's
# values, and the bytes all of a file's entries repeat beyond their storages (each entry
# counted once), may take at most the file's size plus this.
COPY_MARGIN = 64 << 20


def _plain(obj: Any) -> bool:
    """Whether a set's elements are plain values all the way down (no tensor, placeholder)."""
    todo = [obj]
    while todo:
        x = todo.pop()
        t = type(x)
        if t is tuple or t is frozenset or t is set:
            todo.extend(x)
        elif t is TensorRef or t is Opaque:
            return False
    return True


class _Entries:
    """A torch.save object's entries by dotted key: tensors, plain values, placeholders."""

    def __init__(self, where: str, stem: str) -> None:
        self.where, self.stem = where, stem
        self.order: list[str] = []
        self.tensors: dict[str, TensorRef] = {}
        self.values: dict[str, Any] = {}
        self.skipped: dict[str, str] = {}
        self.modules: list[str] = []
        self.inside = 0  # how many modules the walk is inside

    def add(self, key: str, kind: dict[str, Any], value: Any) -> None:
        if key in self.tensors or key in self.values or key in self.skipped:
            raise FormatError(f"{self.where}: two entries flatten to the key {key!r}; rename one")
        if kind is not self.values:
            self.order.append(key)
        kind[key] = value

    def walk(self, obj: Any, key: str, *, plain: bool = True) -> None:
        """Flatten ``obj`` under ``key`` (depth is bounded by the pickle machine)."""
        t = type(obj)
        if t is TensorRef:
            self.add(key, self.tensors, obj)
        elif t in DICTS or t is list or t is tuple:
            items = obj.items() if t in DICTS else enumerate(obj)
            for k, v in items:
                self.walk(v, f"{key}.{k}" if key else str(k), plain=plain)
        elif t is Opaque:
            self.opaque(obj, key, plain)
        elif (t is set or t is frozenset) and not _plain(obj):
            why = (
                f"a {t.__name__} holding a tensor or a placeholder; a {t.__name__} has no "
                "keys to name them by, so it is neither entries nor a plain value"
            )
            self.add(key or self.stem, self.skipped, why)
        elif plain:
            self.add(key, self.values, obj)

    def opaque(self, obj: Opaque, key: str, plain: bool) -> None:
        state = obj.state
        if type(state) is tuple and len(state) == 2 and type(state[0]) in DICTS:
            state = state[0]  # (__dict__, __slots__ values)
        if type(state) in DICTS and all(
            type(state.get(k)) in DICTS for k in ("_parameters", "_buffers", "_modules")
        ):
            self.module(obj.name, state, key)
            return
        key = key or self.stem  # the whole file is this one object
        if obj.name.startswith("torch._utils._rebuild_"):
            kind = obj.name.removeprefix("torch._utils._rebuild_")
            why = (
                f"a {kind.replace('_', ' ')} (torch._utils._rebuild_{kind}); tensorbridge's "
                "file readers give dense tensors, and read this one's other entries"
            )
            self.add(key, self.skipped, why)
            return
        if obj.args and type(obj.args[0]) is TensorRef:
            why = f"a tensor of the subclass {obj.name}, whose values need its code"
            self.add(key, self.skipped, why)
            return
        if obj.args is None:
            why = f"the global {obj.name} itself (a class or function, never imported)"
        else:
            why = (
                f"a {obj.name} object: a placeholder, never imported or called; its tensors "
                "and plain fields are entries under its name"
            )
        self.add(key, self.skipped, why)
        if type(state) in DICTS:
            for k, v in state.items():
                self.walk(v, f"{key}.{k}", plain=plain)
        elif state is not None:
            self.walk(state, f"{key}.state", plain=plain)
        for k, v in obj.items:
            self.walk(v, f"{key}.{k}", plain=plain)
        for i, v in enumerate(obj.listitems):
            self.walk(v, f"{key}.{i}", plain=plain)
        if obj.args:
            self.walk(obj.args, f"{key}.args", plain=False)  # its tensors only

    def module(self, name: str, state: dict[str, Any], key: str) -> None:
        """A pickled ``nn.Module``: its parameters and persistent buffers, by state_dict name."""
        if not self.inside:
            self.modules.append(f"{key or 'the file'} ({name})")
        self.inside += 1
        prefix = f"{key}." if key else ""
        found = state.get("_non_persistent_buffers_set")
        hidden = found if isinstance(found, (set, frozenset)) else frozenset()
        for k, v in state["_parameters"].items():
            if v is not None:
                self.walk(v, f"{prefix}{k}", plain=False)
        for k, v in state["_buffers"].items():
            if v is not None and k not in hidden:
                self.walk(v, f"{prefix}{k}", plain=False)
        for k, v in state["_modules"].items():
            if v is not None:
                self.walk(v, f"{prefix}{k}", plain=False)
        self.inside -= 1


def _check_repeats(where: str, tensors: dict[str, TensorRef], size: int) -> None:
    """Refuse a file whose entries repeat their storages' values (overlapping strides) by
    more than its size plus COPY_MARGIN in all: each entry's bytes beyond its storage,
    counted once per entry, summed over the file (checked on opening, before any read;
    an entry over the bound by itself is left to be refused when it is read)."""
    total = 0
    for name, t in tensors.items():
        count = 1
        for n in t.shape:
            count *= n
        width = itemsize(t.dtype)
        if count * width > size + COPY_MARGIN:
            continue  # refused by itself when read (_check_copy_size); the others read
        total += max(0, (count - t.storage_numel) * width)
        if total > size + COPY_MARGIN:
            raise FormatError(
                f"{where}: {name!r} repeats its storage's values (shape {list(t.shape)}, "
                f"strides {list(t.stride)}); with the file's other such entries they take "
                f"{total:,} bytes beyond their storages, over the file's {size:,} plus "
                f"{COPY_MARGIN:,} a file may repeat in all; no checkpoint does (torch.load(path, "
                "weights_only=True, mmap=True) reads it as views)"
            )


class PtFile(TensorFile):
    """A torch.save archive: its tensors by dotted key, its other values in ``metadata``.

    ``metadata`` holds the plain values as strings (like safetensors metadata);
    :meth:`plain_values` gives them as they were unpickled (ints stay ints).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__()
        self._path = Path(path)
        self._where = repr(str(self._path))
        self._archive: Archive | None = open_archive(self._path, self._where)
        try:
            obj = self._archive.obj
            entries = _Entries(self._where, self._path.stem)
            top = type(obj) in DICTS or type(obj) in (list, tuple, Opaque)
            entries.walk(obj, "" if top else self._path.stem)
        except BaseException:
            self._archive.close()
            raise
        self._size = self._archive.size
        self._order, self._tensors = entries.order, entries.tensors
        self._values, self._skipped = entries.values, entries.skipped
        _check_repeats(self._where, self._tensors, self._size)
        self.single = type(obj) is TensorRef
        self._structure = skeleton(obj) if is_container(obj) else None
        self.metadata = {k: str(v) for k, v in self._values.items()}
        self.mapped = not self._archive.legacy
        if self._archive.legacy:
            self.notes.append(f"{self._path.name}: {_LEGACY_NOTE}")
        if entries.modules:
            self.notes.append(
                f"{self._path.name}: pickled nn.Module(s) {', '.join(entries.modules[:3])}: "
                "their parameters and buffers are read under their state_dict names; the "
                "modules themselves are never built"
            )
        if self._skipped:
            first = ", ".join(list(self._skipped)[:3])
            count = f"{len(self._skipped)} entr{'y is' if len(self._skipped) == 1 else 'ies are'}"
            self.notes.append(
                f"{self._path.name}: {count} "
                f"neither tensors nor plain values ({first}); they are listed as unsupported "
                "and never unpickled"
            )

    def plain_values(self) -> dict[str, Any]:
        return dict(self._values)

    def structure(self) -> Any:
        return self._structure

    def keys(self) -> list[str]:
        return list(self._order)

    def __contains__(self, name: object) -> bool:
        return name in self._tensors or name in self._skipped

    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        if name in self._skipped:
            raise UnsupportedDtypeError(f"{self._where}: {name!r} is {self._skipped[name]}")
        t = self._ref(name)
        try:
            row = resolve_dtype(t.dtype)
        except TensorBridgeError as err:
            raise UnsupportedDtypeError(f"{self._where}: {name!r}: {err}") from None
        return row, t.shape

    def _ref(self, name: str) -> TensorRef:
        if name not in self._tensors:
            raise KeyError(f"{name!r} is not in this file; its keys are {self.keys()[:10]}")
        return self._tensors[name]

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        row, shape = self.info(name)
        t = self._ref(name)
        archive = self._archive
        if archive is None:
            raise FormatError(f"{self._where} is closed; open it again to read {name!r}")
        self._check_copy_size(name, t, row)
        if 0 in shape:
            return np.empty(shape, row.numpy)
        if self.mapped:
            check_unchanged(archive.fd, self._size, self._where)
        writable = copy_on_write and self.mapped
        raw = archive.storage(t.storage, writable=writable)
        flat = raw.view(row.carrier_numpy)
        it = row.itemsize
        view = np.lib.stride_tricks.as_strided(  # on the carrier: ml_dtypes have no typestr
            flat[t.offset :],
            shape=shape,
            strides=tuple(s * it for s in t.stride),
            writeable=writable,
        ).view(row.numpy)
        if copy_on_write and not self.mapped:  # legacy: the storages are shared, read-only
            return np.array(view, copy=True)
        return view

    def _check_copy_size(self, name: str, t: TensorRef, row: DTypeRow) -> None:
        """Refuse values that repeat (overlapping strides) to far more than the file holds.

        Every consumer of an entry copies it sooner or later (a cast, a torch result,
        ``mmap=False``, a conversion), so a hostile file of a few bytes must not be able
        to claim gigabytes through a zero stride; a view alone would be safe, but is
        refused too, so that every way of reading the entry agrees.
        """
        count = 1
        for n in t.shape:
            count *= n
        need = count * row.itemsize
        stored = t.storage_numel * row.itemsize
        if need > self._size + COPY_MARGIN and need > stored:
            raise FormatError(
                f"{self._where}: {name!r} has shape {list(t.shape)} and strides "
                f"{list(t.stride)} over a storage of {stored} bytes: its values take "
                f"{need} bytes, far more than the file's {self._size}; read a slice of it "
                "with torch.load(path, weights_only=True, mmap=True) instead"
            )

    def close(self) -> None:
        if self._archive is not None:  # handed-out arrays keep their mapping alive
            self._archive.close()
            self._archive = None


def open(path: str | os.PathLike[str]) -> PtFile:  # the verb every format has
    """Open a torch.save archive (either era) through the pickle machine, memory-mapped.

    >>> import os, tempfile, torch
    >>> p = os.path.join(tempfile.mkdtemp(), "m.pt")
    >>> torch.save({"model": {"w": torch.ones(2)}, "epoch": 3}, p)
    >>> with open(p) as f:
    ...     f.keys(), f.metadata, f["model.w"].flags.writeable
    (['model.w'], {'epoch': '3'}, False)

    Raises:
        FormatError: not a torch.save archive (the message shows its first bytes), a
            TorchScript archive, or a corrupt or hostile one (a global the pickle machine
            refuses, a view outside its storage, a storage missing or of the wrong size).
    """
    return PtFile(path)


load = loader(
    open,
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
    """,
)


# Leaves other than tensors that ``torch.load(weights_only=True)`` rebuilds (torch 2.13's
# allowlist), so a nested checkpoint tensorbridge writes is one torch and tensorbridge read.
PLAIN_VALUES = (str, int, float, bool, type(None), bytes, complex, torch.Size, torch.dtype,
                torch.device)  # fmt: skip

# keys are pickled str (any text survives); the rules of tensorbridge._keys that apply
NAMES = NameRules((no_nul, valid_unicode))


def save(
    tensors: Any,
    path: str | os.PathLike[str],
    *,
    float_dtype: DTypeLike | None = None,
    metadata: Mapping[str, Any] | None = None,
    progress: bool | None = None,
) -> None:
    """Write a tensor, or a tree of tensors/arrays and plain values, with ``torch.save``.

    The signature every format's ``save`` has (:mod:`tensorbridge.io._formats`); this
    format has no options of its own. Written atomically.

    ``tensors`` may nest (dicts, ``OrderedDict``, lists, tuples, as a training
    checkpoint does: ``{"model": {...}, "optimizer": {...}, "epoch": 3}``): the file
    keeps that nesting, and ``torch.load`` gives it back. Leaves are tensors, arrays,
    or plain values torch's ``weights_only`` loader rebuilds (:data:`PLAIN_VALUES`:
    numbers, strings, bytes, ``None``, ``torch.Size``, dtypes, devices); keys are
    strings, numbers or tuples of them.

    ``metadata`` (plain values: str, int, float, bool, None) is stored beside the
    tensors at the top level, as a training checkpoint stores its ``epoch``; reading
    the file back gives them in ``metadata`` again.

    >>> import os, tempfile, ml_dtypes, numpy as np, torch
    >>> p = os.path.join(tempfile.mkdtemp(), "w.pt")
    >>> save({"model": {"w": np.ones(2, ml_dtypes.bfloat16)}, "step": 7}, p)
    >>> ckpt = torch.load(p, weights_only=True)
    >>> ckpt["model"]["w"].dtype, ckpt["step"]
    (torch.bfloat16, 7)

    Args:
        tensors: a tensor or array, or a tree (mapping, list, tuple) of them.
        float_dtype: cast floating-point values (only) to this dtype.
        progress: show a progress bar (``None``: when stderr is a terminal).

    Raises:
        UnsupportedDtypeError / UnsupportedTensorError: a value with no torch counterpart,
            or a leaf that is neither a tensor nor a plain value (the message names its key).
        InvalidNameError: a key :data:`NAMES` refuses (a NUL, a lone surrogate).
    """
    path = Path(path)
    where = repr(str(path))
    saved: list[torch.Tensor] = []
    if is_container(tensors):
        NAMES.check(flatten(tensors, where=where), where)
        data: Any = _saved_tree(tensors, float_dtype, "", where, saved)
        for key, value in (metadata or {}).items():
            if not isinstance(data, dict):
                raise UnsupportedTensorError(
                    f"{where}: a file whose top level is a {type(data).__name__} has no "
                    "place for metadata; pass a mapping, or leave out metadata="
                )
            if key in data and not isinstance(data[key], PLAIN_VALUES):  # a plain value: replaced
                raise UnsupportedTensorError(
                    f"{where}: metadata key {key!r} is also a tensor's name; rename one"
                )
            data[key] = value if isinstance(value, PLAIN_VALUES) else str(value)
    else:
        if metadata:
            raise UnsupportedTensorError(
                f"{where}: a file of one bare tensor has no place for metadata; pass a "
                "mapping such as {'weight': tensor}"
            )
        data = _as_saved(tensors, float_dtype)
        saved = [data]
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in saved}
    bar = progress_bar(
        sum(storages.values()), f"saving {path.name}", progress, tensors=len(storages)
    )
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


def _saved_tree(obj: Any, float_dtype: Any, key: str, where: str, saved: list[torch.Tensor]) -> Any:
    """``obj`` as ``torch.save`` gets it: containers rebuilt, tensors converted, plain
    values kept; every tensor also appended to ``saved``."""
    if is_container(obj):
        if isinstance(obj, Mapping):
            out: Any = OrderedDict() if type(obj) is OrderedDict else {}
            if type(obj) is OrderedDict:
                out.__dict__.update(obj.__dict__)  # state_dict()'s _metadata (versions)
            for k, v in obj.items():
                if not _plain_key(k):
                    raise UnsupportedTensorError(
                        f"{where}: at {key or 'the top level'!r}, the key {k!r} is a "
                        f"{type(k).__qualname__}; keys are strings, numbers or tuples of them"
                    )
                out[k] = _saved_tree(v, float_dtype, f"{key}.{k}" if key else str(k), where, saved)
            return out
        items = [
            _saved_tree(v, float_dtype, f"{key}.{i}" if key else str(i), where, saved)
            for i, v in enumerate(obj)
        ]
        return items if type(obj) is list else tuple(items)
    if isinstance(obj, (torch.Tensor, np.ndarray, np.generic)):
        try:
            t = _as_saved(obj, float_dtype)
        except TensorBridgeError as err:
            raise type(err)(f"at {key!r}: {err}") from None
        saved.append(t)
        return t
    if isinstance(obj, PLAIN_VALUES):
        return obj
    raise UnsupportedTensorError(
        f"at {key!r}: {type(obj).__qualname__} is not a tensor, an array or a plain value "
        "(numbers, strings, None, torch.Size); a .pt file tensorbridge writes loads with "
        "torch.load(weights_only=True), so it holds no other objects"
    )


def _plain_key(k: Any) -> bool:
    if type(k) is tuple:
        return all(_plain_key(x) for x in k)
    return isinstance(k, (str, int, float, bool, type(None), bytes))


def _as_saved(x: Any, float_dtype: Any) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        if not isinstance(x, (np.ndarray, np.generic)):
            raise UnsupportedTensorError(
                f"{type(x).__qualname__} is not a tensor or array; .pt files written by "
                "tensorbridge hold tensors only"
            )
        dst = _picklable(cast_target(row_of(np.asarray(x)), float_dtype))
        return to_torch(x, dtype=dst)
    if x.layout is not torch.strided or x.is_nested:
        raise UnsupportedTensorError(
            f"a {x.layout} tensor is not saved by tensorbridge; pass x.to_dense()"
        )
    dst = _picklable(cast_target(row_of(x), float_dtype))
    return x.detach().to(device="cpu", dtype=dst.torch)


def _picklable(row: DTypeRow) -> DTypeRow:
    """``row``, or the refusal of a dtype ``torch.save`` cannot write.

    torch pickles a dtype's storage by the legacy name its ``_dtype_to_storage_type_map``
    gives, or as an untyped storage for the dtypes of ``_new_dtypes`` (torch/storage.py);
    the sub-byte integers are in neither, so ``torch.save`` raises "dtype torch.int4 is
    not recognized" (``torch.load`` reads such a tensor, and so does :class:`PtFile`).
    The NumPy-only rows have no torch dtype at all.
    """
    if not row.in_torch:
        widen = exact_widenings(row) if row.is_floating else ()
        cast = ""
        if widen:
            cast = f", or pass float_dtype=torch.{widen[0].name}, which holds its values"
        raise UnsupportedDtypeError(
            f"ml_dtypes {row.name} has no torch dtype, so a .pt file cannot hold it; "
            f"{keeping(row)}{cast}"
        )
    if not row.kernels:
        raise UnsupportedDtypeError(
            f"torch.save cannot write torch.{row.name} (it raises 'dtype torch.{row.name} is "
            f"not recognized'); {keeping(row)}"
        )
    return row


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

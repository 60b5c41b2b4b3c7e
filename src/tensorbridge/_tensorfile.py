"""The lazily read tensor file every format's ``open`` returns, and values computed while written.

* :class:`TensorFile` — ``keys()``, ``[name]``, ``metadata``; nothing read until
  asked. Formats subclass it; :meth:`TensorFile.stored_array` is the stored array, which
  other layers (a dequantizing view of a checkpoint) read without converting.
* :class:`Deferred` — a tensor computed piece by piece while a streaming writer
  writes it (a dequantized weight), through the pipeline of
  :mod:`tensorbridge._pipeline`.
* :class:`StoredBits` — a stored array of a carried dtype (bfloat16, float8, ...) as
  its carrier's integers, for a writer that copies the bytes: a copy between files
  then needs no ml_dtypes (about 0.8 s to import), as it needs no torch.
* :func:`row_of` / :func:`cast_target` — the dtype row of a value, and the row a
  ``float_dtype=`` option casts it to; :func:`keeping` — the fix a format that cannot
  hold a row names.
"""

from __future__ import annotations

import abc
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._pipeline import STREAM_CHUNK, Task, pipelined
from ._plan import numpy_row, run_numpy
from ._progress import NoBar, progress_bar
from ._torch_checks import is_tensor
from .dtypes import DeviceLike, DTypeLike, DTypeRow, resolve_dtype
from .errors import InvalidArgumentError, NoDataError, UnsupportedDtypeError, UnsupportedTensorError


@dataclass(frozen=True, eq=False)
class StoredBits:
    """A stored array of a carried row as its carrier's integers (bfloat16 as ``int16``):
    the file's bytes, their dtype not yet made.

    :meth:`TensorFile.stored_bits` gives it where a format maps such an array; a writer
    whose format row states ``stored_bits`` takes it as a value, writes ``row``'s header
    and copies ``bits``' bytes, which are the values' bytes. :meth:`array` gives the
    values (importing ml_dtypes). Not a tuple: a tree of values holds it as one leaf.
    """

    bits: np.ndarray  # the carrier's integers, in the stored shape (C order)
    row: DTypeRow  # a carried row: what the bits are

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.bits.shape)

    def array(self) -> np.ndarray:
        """The values: the same memory viewed as the row's NumPy dtype."""
        return self.bits.view(self.row.numpy)


def row_of(x: Any) -> DTypeRow:
    """The table row of a tensor's or array's dtype (byte-swapped arrays: their native row)."""
    if is_tensor(x):
        return resolve_dtype(x.dtype)
    if isinstance(x, StoredBits):
        return x.row
    return numpy_row(x)


def check_dense(t: Any) -> None:
    """Refuse a tensor whose bytes a writer cannot store as they are: a sparse or other
    non-strided layout, or a meta tensor (no data)."""
    import torch  # a tensor exists: torch is loaded

    if t.layout is not torch.strided:
        raise UnsupportedTensorError(
            f"a {t.layout} tensor has no dense bytes to store; pass x.to_dense()"
        )
    if t.device.type == "meta":
        raise NoDataError("a meta tensor holds no data; materialise it first")


def keeping(row: DTypeRow) -> str:
    """The fix every writer that cannot hold ``row`` names: the formats that keep every row.

    ``.npy`` and ``.npz`` keep each row of the table bit for bit (the convention of
    :mod:`tensorbridge.io.npy`), so a refusal can always name them.

    >>> keeping(resolve_dtype("int4"))
    'save it to .npy or .npz, which keep int4 as it is'
    """
    return f"save it to .npy or .npz, which keep {row.name} as it is"


def cast_target(src: DTypeRow, float_dtype: Any) -> DTypeRow:
    """``float_dtype`` applies to floating-point values only; everything else keeps its dtype."""
    if float_dtype is None or not src.is_floating:
        return src
    dst = resolve_dtype(float_dtype)
    if not dst.is_floating:
        raise UnsupportedDtypeError(
            f"float_dtype={dst.name} is not a floating-point dtype; pass a float dtype such "
            "as 'bfloat16' (integer tensors keep their dtype)"
        )
    return dst


class Deferred(abc.ABC):
    """A tensor computed piece by piece while it is written (a dequantized weight).

    A writer that streams (safetensors) asks for :attr:`shape` and :attr:`row` to
    write the header, then pulls the values' bytes in C order, so memory holds a few
    pieces, not the tensor: from :meth:`tasks` where a subclass gives them (computed
    ahead by worker threads while the writer writes, across tensors: see
    :mod:`tensorbridge._pipeline`), else from :meth:`chunks`.
    """

    shape: tuple[int, ...]
    row: DTypeRow

    def tasks(self, chunk_bytes: int) -> Iterator[Task] | None:
        """The values as tasks, each filling a :class:`~tensorbridge._pipeline.Slot`
        with about ``chunk_bytes`` of the next bytes and returning them; independent of
        one another (they run in parallel). None: this value only has :meth:`chunks`."""
        return None

    def chunks(self, chunk_bytes: int) -> Iterator[memoryview]:
        """The values as ``row`` bytes in C order, a piece at a time; each chunk may be a
        reused buffer, valid until the next one is pulled (write it, don't keep it)."""
        tasks = self.tasks(min(chunk_bytes, STREAM_CHUNK))
        if tasks is None:  # pragma: no cover - a subclass gives one or the other
            raise NotImplementedError(f"{type(self).__qualname__} defines neither tasks nor chunks")
        for _, view in pipelined((None, t) for t in tasks):
            yield view


class TensorFile(abc.ABC):
    """A lazily read tensor file: ``keys()``, ``[name]``, ``metadata``; nothing read until asked.

    Formats subclass it and implement :meth:`keys`, :meth:`info` and :meth:`_array`
    (the stored array: a zero-copy view where the format allows it, read-only, or
    copy-on-write when asked). ``[name]`` returns that NumPy array; :meth:`get`
    converts it the way ``tb.load`` does.
    """

    metadata: dict[str, str]
    notes: list[str]  # what a user should know about how the file was read (shown by the CLI)
    aliases: dict[str, str]  # a tied name -> the stored name it shares (written once)
    single: bool = False  # one bare array (.npy, a .pt of one tensor): load returns it alone
    follow_links: bool = False  # opened with follow_links=True: files it names may lie anywhere

    def __init__(self) -> None:
        self.metadata = {}
        self.notes = []
        self.aliases = {}

    @abc.abstractmethod
    def keys(self) -> list[str]:
        """The entries' names, in file order."""

    @abc.abstractmethod
    def info(self, name: str) -> tuple[DTypeRow, tuple[int, ...]]:
        """The stored dtype row and shape of ``name``, without reading its data."""

    @abc.abstractmethod
    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        """The stored array: a read-only view, or copy-on-write when asked, where possible."""

    def stored_array(self, name: str, *, copy_on_write: bool = False) -> np.ndarray:
        """The stored array of ``name``, nothing converted: the hook other layers read through.

        A read-only zero-copy view where the format allows it (``copy_on_write=True``:
        writes stay in private pages), else the array read from the file. A view over
        a file (a dequantizing checkpoint reader) builds its values from these.

        >>> import numpy as np, tempfile, os
        >>> from tensorbridge.io import npz
        >>> path = os.path.join(tempfile.mkdtemp(), "a.npz")
        >>> npz.save({"w": np.arange(3, dtype=np.int16)}, path)
        >>> with npz.open(path) as f:
        ...     f.stored_array("w").tolist()
        [0, 1, 2]
        """
        return self._array(name, copy_on_write=copy_on_write)

    def _restore_ties(self, where: dict[str, Any]) -> None:
        """Tied names, saved once and recorded in metadata as ``{name: kept}`` (safetensors'
        ``save_model`` convention), become aliases of ``kept`` in the name table ``where``."""
        for name, kept in list(self.metadata.items()):
            if kept in where and (name not in where or name in self.aliases):
                where.setdefault(name, where[kept])
                self.aliases[name] = kept
                del self.metadata[name]

    def plain_values(self) -> dict[str, Any]:
        """The file's non-tensor values, as typed as the format keeps them (strings by default)."""
        return dict(self.metadata)

    def structure(self) -> Any:
        """The nesting the entries were stored in, or None where the file records none.

        A skeleton (:func:`tensorbridge._keys.skeleton`): the stored containers, each
        leaf a ``Leaf`` naming its entry in :meth:`keys` (a tensor) or
        :meth:`plain_values` (any other value). A writer that keeps nesting (``.pt``)
        rebuilds the tree from it; every other reader keeps flat names (None).
        """
        return None

    def unsupported(self) -> dict[str, str]:
        """Entries that cannot be read as tensors (strings, objects), with the reason for each.

        They are listed by :meth:`keys` like every other entry; reading one raises.
        """
        out = {}
        for name in self.keys():
            try:
                self.info(name)
            except UnsupportedDtypeError as err:
                out[name] = str(err)
        return out

    def stored_bits(self, name: str) -> StoredBits | None:
        """``name``'s stored array as :class:`StoredBits` where its dtype is carried and
        the format maps it so (safetensors); None elsewhere (read ``[name]``)."""
        return None

    def stream_value(self, name: str) -> Any:
        """``name`` as a writer takes it, nothing read yet: the stored array, mapped read-only.

        A file whose values are computed (a dequantized checkpoint) gives a
        :class:`Deferred` that writers able to stream compute as they write.
        """
        return self._array(name, copy_on_write=False)

    def _owned(self, name: str) -> np.ndarray:
        """The stored array in new, writable memory; formats may read the file straight into it."""
        return np.array(self._array(name, copy_on_write=False), copy=True)

    def __getitem__(self, name: str) -> Any:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())

    def get(
        self,
        name: str,
        *,
        framework: str = "numpy",
        mmap: bool = True,
        device: DeviceLike | None = None,
        float_dtype: DTypeLike | None = None,
    ) -> Any:
        """One entry as a NumPy array (read-only when ``mmap``) or a torch tensor.

        One rule, whatever the storage (plain or compressed, byte-swapped, empty): with
        ``mmap=True`` NumPy results are read-only, and torch results are writable
        (copy-on-write where the file is mapped: a write never reaches the file);
        ``mmap=False`` gives ordinary owned, writable memory.
        """
        if name not in self:
            raise KeyError(f"{name!r} is not in this file; its keys are {self.keys()[:10]}")
        if framework not in ("numpy", "torch"):
            raise InvalidArgumentError(
                f"framework={framework!r} is not supported; pass 'numpy' or 'torch'"
            )
        as_torch = framework == "torch"
        copy: bool | None = None
        if mmap:
            a = self._array(name, copy_on_write=as_torch)
        elif float_dtype is None or not self.info(name)[0].is_floating:
            a = self._owned(name)  # one copy, straight from the file
        else:
            a = self._array(name, copy_on_write=False)  # the cast makes the only copy
            copy = True
        dst = cast_target(row_of(a), float_dtype)
        if as_torch:
            from .convert import to_torch

            return to_torch(a, dtype=dst, device=device, copy=copy)
        return run_numpy(a, dst, copy, mmap)  # to_numpy's plan for an array, without torch

    def read(self, keys: Any = None, **options: Any) -> Any:
        """Every entry (or ``keys``) converted by :meth:`get`: what ``tb.load`` returns.

        A file that holds one bare array (``single``: a ``.npy``, a ``.pt`` of one
        tensor) gives that array itself; any other file a dict by name. Every key is
        checked before anything is read.
        """
        names = self.keys() if keys is None else [keys] if isinstance(keys, str) else list(keys)
        if self.single and names != self.keys():
            raise KeyError(
                f"this file holds one array, {self.keys()[0]!r}; pass keys=None or "
                f"keys={self.keys()}"
            )
        if keys is None:
            unsupported = self.unsupported()
            if unsupported and self.single:  # no other entry to read instead
                raise UnsupportedDtypeError(next(iter(unsupported.values())))
            if unsupported:
                first, reason = next(iter(unsupported.items()))
                more = f" (and {len(unsupported) - 1} more)" if len(unsupported) > 1 else ""
                raise UnsupportedDtypeError(
                    f"{reason}{more}; read the other entries with keys= (command line: "
                    f"--exclude {first}, or --skip-unsupported)"
                )
        missing = [n for n in names if n not in self]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise KeyError(
                f"{missing[0]!r}{more} is not in this file; its keys are {self.keys()[:10]}"
            )
        bar = NoBar()
        if options.get("mmap") is False:  # a real read of every byte: worth a bar if long
            total = sum(self.nbytes(n) for n in names)
            bar = progress_bar(
                total,
                f"loading {self.filename}",
                options.pop("progress", None),
                tensors=len(names),
            )
        out = {}
        try:
            for n in names:
                out[n] = self.get(n, **options)
                bar.update(self.nbytes(n))
        finally:
            bar.close()
        return out[names[0]] if self.single else out

    def nbytes(self, name: str) -> int:
        """The stored size of ``name`` in bytes, from the header alone."""
        row, shape = self.info(name)
        count = 1
        for n in shape:
            count *= n
        return count * row.itemsize

    @property
    def filename(self) -> str:
        """The file's name, for messages and progress bars."""
        path = getattr(self, "path", None) or getattr(self, "_path", None)
        return os.path.basename(str(path)) if path is not None else type(self).__name__

    def close(self) -> None:  # noqa: B027 - a format with nothing to release keeps this
        """Release the file; arrays already handed out stay valid."""

    def __enter__(self) -> TensorFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The pickle machine: an opcode interpreter that builds values, never runs a file's code.

Every pickle tensorbridge reads (a ``torch.save`` archive's ``data.pkl``, a legacy
torch file's records, a DCP ``.metadata`` and its items) goes through :func:`unpickle`,
written here rather than borrowed from :mod:`pickle`: it is an interpreter of the
protocol 0-5 opcodes over bytes in memory, with no import, no attribute lookup on a
module, and no call of anything a file names. Its promises:

* **A fixed table.** ``GLOBAL`` / ``STACK_GLOBAL`` resolve a name against
  :data:`TABLE` (value constructors written here, each checking its arguments:
  ``collections.OrderedDict`` (its plain attributes, a state dict's ``_metadata``,
  kept), ``torch.Size``, ``set``, ``frozenset``,
  ``complex``, ``bytearray`` of bytes, ``_codecs.encode`` of latin-1 text, torch
  dtypes and layouts by name, storage types, and the ``torch._utils`` rebuild
  functions of dense tensors, which give a :class:`TensorRef`) and nothing else.
* **Placeholders.** Any other global becomes an :class:`Opaque` (the dotted name; a
  call or ``NEWOBJ`` gives one holding the arguments, ``BUILD`` / ``SETITEMS`` /
  ``APPENDS`` record state and items in it), when the caller allows it; for DCP
  metadata, only the names the caller lists. Globals of :data:`REFUSED` modules
  (``builtins``, ``os``, ``sys``, ``subprocess``, ``importlib``, ``torch`` outside
  its ``nn`` and ``optim`` classes, ...) are never placeholders: naming one to call,
  or leaving it in the result, is a :class:`~tensorbridge.errors.FormatError`.
* **Nothing outside is changed.** ``BUILD``, ``SETITEM(S)``, ``APPEND(S)`` and
  ``ADDITEMS`` apply only to containers and placeholders this run created; aimed at
  anything else (a class, a dtype, a tuple) they are a ``FormatError``.
* **Bounded.** Every length is checked against the bytes left before anything is
  allocated; tuples nest at most :data:`MAX_DEPTH` deep while the stream runs (their
  hashes recurse) and every result is walked once, iteratively, for its depth and for
  a container that holds itself, shared references counted each time (text, bytes and
  integers by length); the memo grows by at most one entry per opcode; a work budget
  (:data:`WORK_PER_BYTE` units a byte plus :data:`WORK_BASE`) pays for containers made
  and for table calls by the size of their arguments, so time and memory are linear in
  the input.
* **Plain results.** ``str``, ``int``, ``float``, ``bool``, ``None``, ``bytes``,
  ``complex``, tuples, lists, dicts, sets, ``torch.Size``, ``torch.dtype``,
  :class:`TensorRef` and :class:`Opaque`; never an object whose methods came from
  the file.
"""

from __future__ import annotations

import re
import struct
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from ..errors import FormatError

__all__ = [
    "DICTS",
    "MAX_DEPTH",
    "REFUSED",
    "TABLE",
    "Opaque",
    "StorageRef",
    "StorageType",
    "TensorRef",
    "unpickle",
]

DICTS = (dict, OrderedDict)  # the mappings the machine builds: test with type(x) in DICTS
MAX_DEPTH = 200  # containers nested deeper than this are no checkpoint's
MAX_RANK = 64  # NumPy's limit on dimensions
WORK_PER_BYTE = 16  # the work budget: units (about a byte of memory each) per pickle byte ...
WORK_BASE = 1 << 20  # ... plus this, for any pickle
MAX_LONG_BYTES = 1024  # a LONG4 integer wider than this (2,466 digits) is no checkpoint's


@dataclass(frozen=True, eq=False)
class Opaque:
    """An object of a class the pickle machine does not build: its name and data, inert.

    ``name`` is the dotted global (``"argparse.Namespace"``); ``args`` the arguments it
    was called with (``None``: the global itself, never called); ``state`` what
    ``BUILD`` gave it (an object's ``__dict__``, usually a dict); ``items`` /
    ``listitems`` what ``SETITEMS`` / ``APPENDS`` added (a dict or list subclass).
    Nothing of it is ever imported or called.

    >>> import pickle, argparse
    >>> o = unpickle(pickle.dumps(argparse.Namespace(lr=0.1), protocol=2))
    >>> o.name, o.state
    ('argparse.Namespace', {'lr': 0.1})
    """

    name: str
    args: tuple[Any, ...] | None = None
    state: Any = None
    items: list[tuple[Any, Any]] = field(default_factory=list)
    listitems: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<Opaque {self.name}>"


@dataclass(frozen=True, eq=False)
class StorageType:
    """``torch.FloatStorage`` and friends in a persistent id: the dtype (``None``: untyped)."""

    name: str
    dtype: torch.dtype | None


@dataclass(frozen=True, eq=False)
class StorageRef:
    """A storage a persistent id named, checked by the archive reader: ``numel`` elements of
    ``dtype`` (``None``: untyped, counted in bytes) under the archive's key ``key``."""

    key: str
    dtype: torch.dtype | None
    numel: int


@dataclass(frozen=True, eq=False)
class TensorRef:
    """A dense tensor a rebuild function describes, checked against its storage.

    Every element it reaches (``offset + sum((n - 1) * s)``) lies inside the
    storage's ``storage_numel`` elements of ``dtype``.
    """

    storage: StorageRef
    dtype: torch.dtype
    storage_numel: int  # in elements of dtype
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]


class _Global:
    """A table constructor or a refused global, named by the stream: a token, never callable."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _fail(what: str) -> FormatError:
    return FormatError(what)


# --- the table ---------------------------------------------------------------------------------


def _ints(x: Any, what: str) -> tuple[int, ...]:
    if type(x) not in (tuple, list, torch.Size) or len(x) > MAX_RANK:
        raise _fail(f"{what} is not a tuple of at most {MAX_RANK} integers")
    for v in x:
        if type(v) is not int or not 0 <= v < 1 << 62:
            raise _fail(f"{what} holds {type(v).__name__} {v!r:.40}, not a size")
    return tuple(x)


def itemsize(dtype: torch.dtype) -> int:
    """Bytes per element of ``dtype`` (sub-byte packed dtypes count their carrier byte).

    ``torch.dtype.itemsize``: nothing is allocated, so no dtype makes torch warn.
    """
    return int(dtype.itemsize)


def _tensor(storage: Any, offset: Any, size: Any, stride: Any, dtype: Any) -> TensorRef:
    if not isinstance(storage, StorageRef):
        raise _fail("a tensor is rebuilt from something other than a storage in the file")
    if not isinstance(dtype, torch.dtype):
        raise _fail("a tensor is rebuilt without a dtype")
    shape, strides = _ints(size, "a tensor's size"), _ints(stride, "a tensor's stride")
    if type(offset) is not int or not 0 <= offset < 1 << 62:
        raise _fail("a tensor's storage offset is not a non-negative integer")
    if len(shape) != len(strides):
        raise _fail(f"a tensor's size {list(shape)} and stride {list(strides)} differ in rank")
    numel = storage.numel
    if storage.dtype is None:  # an untyped storage counts bytes
        width = itemsize(dtype)
        if numel % width:
            raise _fail(f"an untyped storage of {numel} bytes holds no whole {dtype} values")
        numel //= width
    elif storage.dtype != dtype:
        raise _fail(f"a {dtype} tensor is rebuilt on a {storage.dtype} storage")
    count = 1
    for n in shape:  # an empty tensor's other dimensions still count (NumPy's limit)
        count *= max(n, 1)
    if 0 in shape and count * itemsize(dtype) >= 1 << 62:
        raise _fail(
            f"a tensor of size {list(shape)} would take over 2**62 bytes, more than NumPy can index"
        )
    if 0 not in shape:
        last = offset + sum((n - 1) * s for n, s in zip(shape, strides, strict=True))
        if last >= numel:
            raise _fail(
                f"a tensor of size {list(shape)}, stride {list(strides)} at offset {offset} "
                f"reaches element {last} of a storage of {numel}"
            )
    return TensorRef(storage, dtype, numel, offset, shape, strides)


def _rebuild_v2(args: tuple[Any, ...]) -> TensorRef:
    # torch/_utils.py: _rebuild_tensor_v2(storage, storage_offset, size, stride,
    # requires_grad, backward_hooks, metadata=None)
    if not 4 <= len(args) <= 7:
        raise _fail(f"_rebuild_tensor_v2 given {len(args)} arguments")
    storage = args[0]
    dtype = storage.dtype if isinstance(storage, StorageRef) else None
    return _tensor(storage, args[1], args[2], args[3], dtype)


def _rebuild_v3(args: tuple[Any, ...]) -> TensorRef:
    # _rebuild_tensor_v3(storage, storage_offset, size, stride, requires_grad,
    # backward_hooks, dtype, metadata=None)
    if not 7 <= len(args) <= 8:
        raise _fail(f"_rebuild_tensor_v3 given {len(args)} arguments")
    return _tensor(args[0], args[1], args[2], args[3], args[6])


def _rebuild_parameter(args: tuple[Any, ...]) -> TensorRef:
    # _rebuild_parameter(data, requires_grad, backward_hooks) and
    # _rebuild_parameter_with_state(data, requires_grad, backward_hooks, state)
    if not 3 <= len(args) <= 4 or not isinstance(args[0], TensorRef):
        raise _fail("a parameter is rebuilt from something other than a tensor")
    return args[0]


def _rebuild_from_type(args: tuple[Any, ...]) -> Any:
    # torch/_tensor.py: _rebuild_from_type_v2(func, new_type, args, state): a tensor
    # subclass, or a tensor with attributes; plain tensors and parameters only
    if len(args) != 4 or not isinstance(args[0], _Global) or type(args[2]) is not tuple:
        raise _fail("_rebuild_from_type_v2 given arguments it never takes")
    build = TABLE.get(args[0].name)
    if build is None or args[0].name not in _TENSOR_BUILDERS:
        raise _fail(f"_rebuild_from_type_v2 of {args[0].name}, which builds no tensor")
    tensor = build(args[2])
    kind = args[1]
    if isinstance(kind, (_Global, Opaque)) and kind.name in _PLAIN_TENSOR_TYPES:
        return tensor
    name = kind.name if isinstance(kind, (_Global, Opaque)) else type(kind).__name__
    return Opaque(name, (tensor,), args[3])


def _ordered_dict(args: tuple[Any, ...]) -> OrderedDict[Any, Any]:
    if args == ():
        return OrderedDict()
    if len(args) == 1 and type(args[0]) is list:
        out: OrderedDict[Any, Any] = OrderedDict()
        for pair in args[0]:
            if type(pair) not in (tuple, list) or len(pair) != 2:
                raise _fail("OrderedDict given something other than key-value pairs")
            out[pair[0]] = pair[1]
        return out
    raise _fail("OrderedDict given arguments it never takes")


def _attributes(state: dict[Any, Any]) -> bool:
    """Whether ``state`` may become an OrderedDict's attributes: plain names (no dunder),
    plain values (text, numbers, None, and dicts, lists and tuples of them)."""
    if not all(type(k) is str and k.isidentifier() and not k.startswith("__") for k in state):
        return False
    todo, seen = list(state.values()), 0
    while todo:
        x = todo.pop()
        seen += 1
        if seen > 1 << 20:
            return False
        t = type(x)
        if t is dict or t is OrderedDict:
            todo.extend(x.keys())
            todo.extend(x.values())
        elif t is list or t is tuple:
            todo.extend(x)
        elif t not in (str, int, float, bool, type(None)):
            return False
    return True


def _size(args: tuple[Any, ...]) -> torch.Size:
    if len(args) != 1:
        raise _fail("torch.Size given arguments it never takes")
    return torch.Size(_ints(args[0], "torch.Size"))


def _device(args: tuple[Any, ...]) -> str:
    # torch.device("cuda:0") or torch.device("cuda", 0): kept as its name, "cuda:0"
    name = args[0] if args and type(args[0]) is str else None
    if len(args) == 2 and type(args[1]) is int and 0 <= args[1] < 1 << 16:
        name = f"{name}:{args[1]}"
    elif len(args) != 1:
        name = None
    if name is None or not re.fullmatch(r"[a-z_]{1,32}(:[0-9]{1,5})?", name):
        raise _fail("torch.device given arguments other than a device's name")
    return name


def _layout(args: tuple[Any, ...]) -> str:
    # torch/serialization.py: _get_layout("torch.strided")
    if len(args) != 1 or args[0] not in _LAYOUT_NAMES:
        raise _fail("torch.serialization._get_layout given no layout's name")
    result: str = args[0]
    return result


def _set(args: tuple[Any, ...]) -> set[Any]:
    if args == ():
        return set()
    if len(args) == 1 and type(args[0]) in (list, tuple):
        return set(args[0])
    raise _fail("set given arguments it never takes")


def _frozenset(args: tuple[Any, ...]) -> frozenset[Any]:
    return frozenset(_set(args))


def _complex(args: tuple[Any, ...]) -> complex:
    if not 1 <= len(args) <= 2 or not all(type(v) in (int, float) for v in args):
        raise _fail("complex given arguments other than two numbers")
    return complex(*args)


def _bytearray(args: tuple[Any, ...]) -> bytes:
    # bytearray(n) allocates n zero bytes: a size bomb; only bytes the file holds
    if args == ():
        return b""
    if len(args) == 1 and type(args[0]) is bytes:
        return args[0]
    if len(args) == 2 and type(args[0]) is str and args[1] in ("latin1", "latin-1"):
        return _encode(args)
    raise _fail("bytearray given something other than bytes the file holds")


def _bytes(args: tuple[Any, ...]) -> bytes:
    if args == ():
        return b""
    return _bytearray(args)


def _encode(args: tuple[Any, ...]) -> bytes:
    # protocol 2 pickles bytes as _codecs.encode(text, "latin1")
    if len(args) != 2 or type(args[0]) is not str or args[1] not in ("latin1", "latin-1"):
        raise _fail("_codecs.encode given arguments other than text and 'latin1'")
    try:
        return args[0].encode("latin-1")
    except UnicodeEncodeError:
        raise _fail("_codecs.encode of text that is not latin-1") from None


def _reconstructor(args: tuple[Any, ...]) -> Opaque:
    # protocols 0 and 1 pickle an object as copyreg._reconstructor(cls, object, None)
    if (
        len(args) != 3
        or not isinstance(args[0], Opaque)
        or args[0].args is not None
        or refused(args[0].name)
    ):
        raise _fail("copyreg._reconstructor given arguments it never takes")
    return Opaque(args[0].name, ())


_TENSOR_BUILDERS = {
    "torch._utils._rebuild_tensor_v2": _rebuild_v2,
    "torch._utils._rebuild_tensor_v3": _rebuild_v3,
    "torch._utils._rebuild_parameter": _rebuild_parameter,
    "torch._utils._rebuild_parameter_with_state": _rebuild_parameter,
}
_PLAIN_TENSOR_TYPES = {"torch.Tensor", "torch._tensor.Tensor", "torch.nn.parameter.Parameter"}

TABLE: dict[str, Callable[[tuple[Any, ...]], Any]] = {
    **_TENSOR_BUILDERS,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type,
    "collections.OrderedDict": _ordered_dict,
    "torch.Size": _size,
    "torch.device": _device,
    "torch.serialization._get_layout": _layout,
    "builtins.set": _set,
    "builtins.frozenset": _frozenset,
    "builtins.complex": _complex,
    "builtins.bytearray": _bytearray,
    "builtins.bytes": _bytes,
    "_codecs.encode": _encode,
    "copyreg._reconstructor": _reconstructor,
}
"""The value constructors: a global's dotted name -> a function of its checked arguments."""

# the storage classes torch.save names in persistent ids (torch/storage.py's legacy names)
_STORAGE_DTYPES = {
    "DoubleStorage": torch.float64,
    "FloatStorage": torch.float32,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
    "ComplexDoubleStorage": torch.complex128,
    "ComplexFloatStorage": torch.complex64,
    # quantized tensors' storages: known, so the file reads; their tensors (rebuilt by
    # torch._utils._rebuild_qtensor, a placeholder) are listed as unsupported
    "QInt8Storage": torch.qint8,
    "QUInt8Storage": torch.quint8,
    "QInt32Storage": torch.qint32,
    "QUInt4x2Storage": torch.quint4x2,
    "QUInt2x4Storage": torch.quint2x4,
}


def _constants() -> dict[str, Any]:
    """Globals that name a value, not a constructor: dtypes, layouts, storage types."""
    out: dict[str, Any] = {}
    for name, value in vars(torch).items():  # vars(): no lazy-import __getattr__ runs
        if isinstance(value, torch.dtype):
            out[f"torch.{name}"] = value
        elif isinstance(value, torch.layout):
            out[f"torch.{name}"] = f"torch.{name}"
    for name, dtype in _STORAGE_DTYPES.items():
        out[f"torch.{name}"] = StorageType(name, dtype)
    for name in ("torch.UntypedStorage", "torch.storage.UntypedStorage"):
        out[name] = StorageType("UntypedStorage", None)
    return out


CONSTANTS = _constants()
_LAYOUT_NAMES = {k for k, v in CONSTANTS.items() if v == k}

# modules whose globals no checkpoint holds as data: a call of one (or one left in the
# result) is refused, never made a placeholder
REFUSED = (
    "builtins", "os", "posix", "nt", "sys", "subprocess", "importlib", "functools",
    "operator", "codecs", "_codecs", "io", "_io", "pickle", "_pickle", "copyreg", "runpy",
    "types", "shutil", "socket", "ctypes", "marshal", "code", "inspect", "pty", "signal",
    "multiprocessing", "threading", "asyncio", "webbrowser", "pdb", "gc", "weakref",
    "torch", "pathlib", "posixpath", "ntpath", "tempfile", "glob", "zipimport", "pkgutil",
)  # fmt: skip
# torch classes a pickled module or optimizer is made of: placeholders, like user classes
_TORCH_DATA = (
    "torch.nn.modules.",
    "torch.optim.",
    "torch.nn.utils.",
    "torch.distributed.",
    "torch._utils._rebuild_",  # sparse, quantized, nested tensors: reported, never built
)

_RENAMED = {"__builtin__": "builtins", "copy_reg": "copyreg"}  # Python 2's module names


def refused(name: str) -> bool:
    """Whether the dotted global ``name`` lies in a module no placeholder may stand for."""
    if name.startswith(_TORCH_DATA):
        return False
    return any(name == m or name.startswith(m + ".") for m in REFUSED)


_ESCAPES = {b"\\": b"\\", b"'": b"'", b'"': b'"', b"a": b"\a", b"b": b"\b", b"f": b"\f",
            b"n": b"\n", b"r": b"\r", b"t": b"\t", b"v": b"\v", b"\n": b""}  # fmt: skip
_ESCAPE = re.compile(rb"\\(x[0-9a-fA-F]{2}|[0-7]{1,3}|[\s\S]?)")


def _unescape(text: bytes) -> bytes:
    """A protocol-0 STRING's escapes, as Python 2 wrote them (``codecs.escape_decode``
    without its warning: an unknown escape such as ``\\q`` stays as it is)."""

    def one(m: re.Match[bytes]) -> bytes:
        e = m.group(1)
        if e in (b"", b"x"):
            raise FormatError("a STRING instruction with an unfinished escape")
        if len(e) == 3 and e[:1] == b"x":
            return bytes([int(e[1:], 16)])
        if e[:1] in b"01234567" and e[:1]:
            return bytes([int(e, 8) & 0xFF])
        if e not in _ESCAPES:
            return b"\\" + e
        return _ESCAPES[e]

    return _ESCAPE.sub(one, text)


# --- the interpreter ---------------------------------------------------------------------------

_MARK = object()


def unpickle(
    data: bytes,
    *,
    persistent_load: Callable[[Any], Any] | None = None,
    placeholders: bool | frozenset[str] = True,
    start: int = 0,
) -> Any:
    """The value a pickle in ``data`` describes, built by the table and placeholders only.

    Args:
        data: the pickle (bytes in memory: every length is checked against them).
        persistent_load: given each persistent id (a plain tuple), returns the value it
            stands for (a :class:`StorageRef`); ``None``: a persistent id is refused.
        placeholders: ``True``: a global outside the table and :data:`REFUSED` becomes an
            :class:`Opaque`; a set of dotted names: only those do; ``False``: none.
        start: where the pickle starts in ``data``.

    Returns:
        The value. :func:`unpickle_at` also gives where the pickle ended.

    Raises:
        FormatError: anything else: a global refused, an instruction aimed at an object
            the run did not create, a length past the end, nesting too deep, a malformed
            stream.
    """
    return unpickle_at(
        data, persistent_load=persistent_load, placeholders=placeholders, start=start
    )[0]


def unpickle_at(
    data: bytes,
    *,
    persistent_load: Callable[[Any], Any] | None = None,
    placeholders: bool | frozenset[str] = True,
    start: int = 0,
) -> tuple[Any, int]:
    """:func:`unpickle`, and the offset just past the pickle's ``STOP``."""
    try:
        value, end = _run(data, start, persistent_load, placeholders)
    except FormatError:
        raise
    except IndexError:
        raise FormatError("the pickle is malformed (it takes from an empty stack)") from None
    except (
        KeyError, TypeError, ValueError, struct.error, OverflowError, UnicodeDecodeError,
        RecursionError, AttributeError,
    ) as err:  # fmt: skip
        raise FormatError(f"the pickle is malformed ({type(err).__name__}: {err})") from None
    _check_result(value, 16 * (end - start) + 4096)
    return value, end


def _run(
    data: bytes,
    start: int,
    persistent_load: Callable[[Any], Any] | None,
    placeholders: bool | frozenset[str],
) -> tuple[Any, int]:
    end, pos = len(data), start
    stack: list[Any] = []
    metastack: list[list[Any]] = []
    memo: dict[int, Any] = {}
    depth: dict[int, int] = {}  # id(tuple or frozenset) -> nesting, for hashing's sake
    keep: list[Any] = []  # keeps those ids alive for the run
    unpack = struct.unpack_from
    budget = WORK_PER_BYTE * (end - pos) + WORK_BASE
    work = 0

    def charge(n: int) -> None:
        """Count work the stream's bytes do not pay for one by one: a container made (its
        size in bytes), a constructor's argument read (8 a value, 1 a character)."""
        nonlocal work
        work += n
        if work > budget:
            raise FormatError(
                f"the pickle asks for over {budget:,} units of work ({WORK_PER_BYTE} per byte "
                f"of its {end - start:,} plus {WORK_BASE:,}; a unit is about a byte of memory "
                "made or read): no checkpoint does"
            )

    def take(n: int) -> int:
        nonlocal pos
        if n < 0 or n > end - pos:
            raise FormatError(
                f"the pickle claims {n:,} bytes at offset {pos:,} where {end - pos:,} remain"
            )
        at = pos
        pos += n
        return at

    def line() -> bytes:
        nonlocal pos
        nl = data.find(b"\n", pos)
        if nl < 0:
            raise FormatError("the pickle ends inside a text instruction")
        out = bytes(data[pos:nl])
        pos = nl + 1
        return out

    def pop_mark() -> list[Any]:
        nonlocal stack
        items = stack
        stack = metastack.pop()
        return items

    def frozen(t: Any, items: Any) -> Any:
        """Record how deep a tuple or frozenset nests: hashing one recurses in C."""
        d = 0
        for x in items:
            if type(x) is tuple or type(x) is frozenset:
                d = max(d, depth.get(id(x), 0))
        if d >= MAX_DEPTH:
            raise FormatError(f"tuples nested over {MAX_DEPTH} deep; no checkpoint is")
        if d:
            depth[id(t)] = d + 1
            keep.append(t)
        return t

    def resolve(module: str, name: str) -> Any:
        if type(module) is not str or type(name) is not str:
            raise FormatError("STACK_GLOBAL given something other than two strings")
        module = _RENAMED.get(module, module)
        dotted = f"{module}.{name}"
        if dotted in CONSTANTS:
            return CONSTANTS[dotted]
        if dotted in TABLE:
            return _Global(dotted)
        if placeholders is True:  # a refused one is refused when called, not when named
            return Opaque(dotted)
        if isinstance(placeholders, frozenset) and dotted in placeholders:
            return Opaque(dotted)
        if refused(dotted) or dotted in _PLAIN_TENSOR_TYPES:
            return _Global(dotted)  # refused when called or left in the result
        raise FormatError(f"the global {dotted} is not one this file may hold")

    def call(fn: Any, args: Any, how: str) -> Any:
        if type(args) is not tuple:
            raise FormatError(f"{how} given arguments that are not a tuple")
        if isinstance(fn, _Global):
            build = TABLE.get(fn.name)
            if build is None:
                raise FormatError(f"the file calls {fn.name}, which tensorbridge never calls")
            charge(64 + sum(8 * len(a) if type(a) in (list, tuple) else len(a) if type(a) in
                            (str, bytes) else 8 for a in args))  # fmt: skip
            return build(args)
        if isinstance(fn, Opaque):
            listed = isinstance(placeholders, frozenset) and fn.name in placeholders
            if refused(fn.name) and not listed:
                raise FormatError(f"the file calls {fn.name}, which tensorbridge never calls")
            return Opaque(fn.name, args)
        raise FormatError(f"{how} of a {type(fn).__name__}, which is not a global")

    def build(obj: Any, state: Any) -> None:
        if isinstance(obj, Opaque) and obj.args is None:
            raise FormatError(f"BUILD aimed at {obj.name} itself, a class the file names")
        if isinstance(obj, Opaque):
            object.__setattr__(obj, "state", state)
        elif type(obj) is OrderedDict and type(state) is dict and _attributes(state):
            obj.__dict__.update(state)  # a state dict's _metadata: module versions
        elif type(obj) in DICTS or isinstance(obj, TensorRef):
            # a dict's or a tensor's attributes: not data, dropped
            if state is not None and type(state) not in (dict, tuple):
                raise FormatError(f"BUILD of a {type(obj).__name__} with a {type(state).__name__}")
        else:
            raise FormatError(
                f"BUILD aimed at a {type(obj).__name__} (only objects the file built may be)"
            )

    def setitems(target: Any, items: list[Any]) -> None:
        if len(items) % 2:
            raise FormatError("SETITEMS given an odd number of items")
        if type(target) in DICTS:
            for i in range(0, len(items), 2):
                target[items[i]] = items[i + 1]
        elif isinstance(target, Opaque) and target.args is not None:
            target.items.extend(zip(items[::2], items[1::2], strict=True))
        else:
            raise FormatError(f"SETITEM aimed at a {type(target).__name__}")

    def appends(target: Any, items: list[Any]) -> None:
        if type(target) is list:
            target.extend(items)
        elif isinstance(target, Opaque) and target.args is not None:
            target.listitems.extend(items)
        else:
            raise FormatError(f"APPEND aimed at a {type(target).__name__}")

    while True:
        if pos >= end:
            raise FormatError("the pickle ends before its STOP instruction")
        op = data[pos]
        pos += 1
        if op == 0x71:  # BINPUT
            memo[data[take(1)]] = stack[-1]
        elif op == 0x68:  # BINGET
            stack.append(memo[data[take(1)]])
        elif op == 0x58:  # BINUNICODE
            (n,) = unpack("<I", data, take(4))
            at = take(n)
            stack.append(str(data[at : at + n], "utf-8", "surrogatepass"))
        elif op == 0x8C:  # SHORT_BINUNICODE
            n = data[take(1)]
            at = take(n)
            stack.append(str(data[at : at + n], "utf-8", "surrogatepass"))
        elif op == 0x94:  # MEMOIZE
            memo[len(memo)] = stack[-1]
        elif op == 0x28:  # MARK
            charge(64)
            metastack.append(stack)
            stack = []
        elif op == 0x4B:  # BININT1
            stack.append(data[take(1)])
        elif op == 0x74:  # TUPLE
            items = pop_mark()
            stack.append(frozen(tuple(items), items))
        elif op == 0x85:  # TUPLE1
            stack[-1] = frozen((stack[-1],), stack[-1:])
        elif op == 0x86:  # TUPLE2
            t = (stack[-2], stack[-1])
            del stack[-2:]
            stack.append(frozen(t, t))
        elif op == 0x87:  # TUPLE3
            t3 = (stack[-3], stack[-2], stack[-1])
            del stack[-3:]
            stack.append(frozen(t3, t3))
        elif op == 0x29:  # EMPTY_TUPLE
            stack.append(())
        elif op == 0x52:  # REDUCE
            args = stack.pop()
            stack[-1] = call(stack[-1], args, "REDUCE")
        elif op == 0x81:  # NEWOBJ
            args = stack.pop()
            stack[-1] = call(stack[-1], args, "NEWOBJ")
        elif op == 0x92:  # NEWOBJ_EX
            kwargs = stack.pop()
            args = stack.pop()
            cls = stack[-1]
            if not isinstance(cls, Opaque) or type(kwargs) is not dict or refused(cls.name):
                raise FormatError("NEWOBJ_EX of something that is no placeholder class")
            stack[-1] = Opaque(cls.name, args if type(args) is tuple else (args,), kwargs=kwargs)
        elif op == 0x88:  # NEWTRUE
            stack.append(True)
        elif op == 0x89:  # NEWFALSE
            stack.append(False)
        elif op == 0x4E:  # NONE
            stack.append(None)
        elif op == 0x51:  # BINPERSID
            pid = stack.pop()
            if persistent_load is None:
                raise FormatError("a persistent id where none belongs")
            stack.append(persistent_load(pid))
        elif op == 0x50:  # PERSID
            pid = line().decode("ascii")
            if persistent_load is None:
                raise FormatError("a persistent id where none belongs")
            stack.append(persistent_load(pid))
        elif op == 0x75:  # SETITEMS
            items = pop_mark()
            setitems(stack[-1], items)
        elif op == 0x73:  # SETITEM
            value = stack.pop()
            key = stack.pop()
            setitems(stack[-1], [key, value])
        elif op == 0x7D:  # EMPTY_DICT
            charge(64)
            stack.append({})
        elif op == 0x5D:  # EMPTY_LIST
            charge(56)
            stack.append([])
        elif op == 0x61:  # APPEND
            value = stack.pop()
            appends(stack[-1], [value])
        elif op == 0x65:  # APPENDS
            items = pop_mark()
            appends(stack[-1], items)
        elif op == 0x62:  # BUILD
            state = stack.pop()
            build(stack[-1], state)
        elif op == 0x63:  # GLOBAL
            module = line().decode("utf-8")
            name = line().decode("utf-8")
            stack.append(resolve(module, name))
        elif op == 0x93:  # STACK_GLOBAL
            name = stack.pop()
            module = stack.pop()
            stack.append(resolve(module, name))
        elif op == 0x72:  # LONG_BINPUT
            (i,) = unpack("<I", data, take(4))
            memo[i] = stack[-1]
        elif op == 0x6A:  # LONG_BINGET
            (i,) = unpack("<I", data, take(4))
            stack.append(memo[i])
        elif op == 0x4D:  # BININT2
            (i,) = unpack("<H", data, take(2))
            stack.append(i)
        elif op == 0x4A:  # BININT
            (i,) = unpack("<i", data, take(4))
            stack.append(i)
        elif op == 0x8A:  # LONG1
            n = data[take(1)]
            at = take(n)
            stack.append(int.from_bytes(data[at : at + n], "little", signed=True))
        elif op == 0x8B:  # LONG4
            (n,) = unpack("<i", data, take(4))
            at = take(n)  # the bytes must be there; then their width is checked
            if n > MAX_LONG_BYTES:
                raise FormatError(
                    f"an integer of {n:,} bytes (LONG4); tensorbridge reads integers of at most "
                    f"{MAX_LONG_BYTES:,} bytes, and no checkpoint holds a wider one"
                )
            stack.append(int.from_bytes(data[at : at + n], "little", signed=True))
        elif op == 0x47:  # BINFLOAT
            (x,) = unpack(">d", data, take(8))
            stack.append(x)
        elif op == 0x8D:  # BINUNICODE8
            (n,) = unpack("<Q", data, take(8))
            at = take(n)
            stack.append(str(data[at : at + n], "utf-8", "surrogatepass"))
        elif op in (0x42, 0x43, 0x8E, 0x96):  # BINBYTES, SHORT_BINBYTES, BINBYTES8, BYTEARRAY8
            fmt = {0x42: "<I", 0x43: "<B", 0x8E: "<Q", 0x96: "<Q"}[op]
            (n,) = unpack(fmt, data, take(struct.calcsize(fmt)))
            at = take(n)
            stack.append(bytes(data[at : at + n]))
        elif op in (0x54, 0x55):  # BINSTRING, SHORT_BINSTRING (Python 2 str: utf-8, as torch)
            fmt = "<i" if op == 0x54 else "<B"
            (n,) = unpack(fmt, data, take(struct.calcsize(fmt)))
            at = take(n)
            stack.append(str(data[at : at + n], "utf-8"))
        elif op == 0x95:  # FRAME: the bytes are all here already
            (n,) = unpack("<Q", data, take(8))
            if n > end - pos:
                raise FormatError(f"a pickle frame claims {n:,} bytes where {end - pos:,} remain")
        elif op == 0x80:  # PROTO
            if data[take(1)] > 5:
                raise FormatError(f"pickle protocol {data[pos - 1]} is newer than any known")
        elif op == 0x8F:  # EMPTY_SET
            charge(216)
            stack.append(set())
        elif op == 0x90:  # ADDITEMS
            items = pop_mark()
            if type(stack[-1]) is not set:
                raise FormatError(f"ADDITEMS aimed at a {type(stack[-1]).__name__}")
            stack[-1].update(items)
        elif op == 0x91:  # FROZENSET
            items = pop_mark()
            stack.append(frozen(frozenset(items), items))
        elif op == 0x2E:  # STOP
            if len(stack) != 1 or metastack:
                raise FormatError("the pickle stops with other than one value on its stack")
            return stack[0], pos
        elif op == 0x30:  # POP
            if stack:
                stack.pop()
            else:
                pop_mark()
        elif op == 0x31:  # POP_MARK
            pop_mark()
        elif op == 0x32:  # DUP
            stack.append(stack[-1])
        elif op == 0x49:  # INT (protocol 0; "01" / "00" are True / False)
            text = line()
            stack.append(True if text == b"01" else False if text == b"00" else int(text))
        elif op == 0x4C:  # LONG (protocol 0)
            stack.append(int(line().rstrip(b"L")))
        elif op == 0x46:  # FLOAT (protocol 0)
            stack.append(float(line()))
        elif op == 0x53:  # STRING (protocol 0: a quoted, escaped Python 2 str)
            text = line().rstrip()
            if len(text) < 2 or text[0] != text[-1] or text[:1] not in (b"'", b'"'):
                raise FormatError("a STRING instruction without quotes")
            stack.append(str(_unescape(text[1:-1]), "utf-8"))
        elif op == 0x56:  # UNICODE (protocol 0)
            stack.append(str(line(), "raw-unicode-escape"))
        elif op == 0x67:  # GET
            stack.append(memo[int(line())])
        elif op == 0x70:  # PUT
            i = int(line())
            if i < 0:
                raise FormatError("a negative memo index")
            memo[i] = stack[-1]
        elif op == 0x64:  # DICT
            items = pop_mark()
            d: dict[Any, Any] = {}
            setitems(d, items)
            stack.append(d)
        elif op == 0x6C:  # LIST
            items = pop_mark()
            stack.append(items)
        elif op == 0x69:  # INST
            module = line().decode("utf-8")
            name = line().decode("utf-8")
            args = tuple(pop_mark())
            stack.append(call(resolve(module, name), frozen(args, args), "INST"))
        elif op == 0x6F:  # OBJ
            items = pop_mark()
            if not items:
                raise FormatError("OBJ without a class")
            args = tuple(items[1:])
            stack.append(call(items[0], frozen(args, args), "OBJ"))
        else:
            known = {0x82: "EXT1", 0x83: "EXT2", 0x84: "EXT4", 0x97: "NEXT_BUFFER",
                     0x98: "READONLY_BUFFER"}  # fmt: skip
            what = known.get(op, f"the unknown opcode 0x{op:02x}")
            raise FormatError(
                f"the pickle uses {what} at offset {pos - 1}, which no checkpoint does"
            )


def _children(obj: Any) -> Any:
    t = type(obj)
    if t is list or t is tuple or t is set or t is frozenset:
        return obj
    if t is dict or t is OrderedDict:
        kids = [x for kv in obj.items() for x in kv]
        return [*kids, obj.__dict__] if t is OrderedDict and obj.__dict__ else kids
    if t is Opaque:
        return [obj.args, obj.state, obj.kwargs, obj.items, obj.listitems]
    return ()


def _check_result(root: Any, budget: int) -> None:
    """Walk the result once, iteratively: no token left, no cycle, at most MAX_DEPTH deep,
    and at most ``budget`` values when shared references are counted each time and text,
    bytes and integers by their length (a walk of the result as a tree, as flattening and
    rendering metadata do, must stay linear in the input)."""
    if isinstance(root, _Global):
        raise FormatError(f"the file holds the global {root.name} itself; no checkpoint does")
    size: dict[int, int] = {}  # id -> values beneath, counted as a tree
    active: set[int] = set()
    stack: list[tuple[Any, Any, int]] = [(root, iter(_children(root)), 1)]
    active.add(id(root))
    while stack:
        obj, it, total = stack[-1]
        for child in it:
            if isinstance(child, _Global):
                raise FormatError(
                    f"the file holds the global {child.name} itself; no checkpoint does"
                )
            kids = _children(child)
            if not kids:
                t = type(child)  # text and bytes by length: a reader renders each reference
                total += (
                    1 + len(child) if t is str or t is bytes
                    else 1 + child.bit_length() // 8 if t is int else 1
                )  # fmt: skip
                if total > budget:
                    raise FormatError(
                        f"the pickle's shared references expand to over {budget:,} values "
                        "(text and bytes counted by length); no checkpoint's do"
                    )
                continue
            done = size.get(id(child))
            if done is not None:
                total += done
                if total > budget:
                    raise FormatError(
                        f"the pickle's shared references expand to over {budget:,} values; "
                        "no checkpoint's do"
                    )
                continue
            if id(child) in active:
                raise FormatError("a container holds itself; no checkpoint does")
            if len(stack) >= MAX_DEPTH:
                raise FormatError(f"containers nested over {MAX_DEPTH} deep; no checkpoint is")
            stack[-1] = (obj, it, total)
            active.add(id(child))
            stack.append((child, iter(kids), 1))
            break
        else:
            stack.pop()
            active.discard(id(obj))
            size[id(obj)] = total
            if stack:
                parent, pit, ptotal = stack[-1]
                stack[-1] = (parent, pit, ptotal + total)

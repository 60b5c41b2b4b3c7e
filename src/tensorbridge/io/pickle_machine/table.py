"""The pickle machine's table: the globals a pickle may name, and what each one builds.

:data:`TABLE` maps a global's dotted name to a value constructor written here (or, for
torch's sizes, devices, layouts and tensors, in :mod:`.rebuilds`) that checks its
arguments; :data:`REFUSED` lists the modules whose globals are never even made
placeholders (:func:`refused`). Anything else a pickle names becomes an
:class:`~.values.Opaque` when the caller allows it. The interpreter
(:mod:`.interpreter`) resolves every global against this table and calls nothing else.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from .rebuilds import PLAIN_TENSOR_TYPES, TENSOR_BUILDERS, torch_device, torch_layout, torch_size
from .values import Global, Opaque, fail

__all__ = ["REFUSED", "RENAMED", "TABLE", "plain_attributes", "refused"]


def _rebuild_from_type(args: tuple[Any, ...]) -> Any:
    # torch/_tensor.py: _rebuild_from_type_v2(func, new_type, args, state): a tensor
    # subclass, or a tensor with attributes; plain tensors and parameters only
    if len(args) != 4 or not isinstance(args[0], Global) or type(args[2]) is not tuple:
        raise fail("_rebuild_from_type_v2 given arguments it never takes")
    build = TABLE.get(args[0].name)
    if build is None or args[0].name not in TENSOR_BUILDERS:
        raise fail(f"_rebuild_from_type_v2 of {args[0].name}, which builds no tensor")
    tensor = build(args[2])
    kind = args[1]
    if isinstance(kind, (Global, Opaque)) and kind.name in PLAIN_TENSOR_TYPES:
        return tensor
    name = kind.name if isinstance(kind, (Global, Opaque)) else type(kind).__name__
    return Opaque(name, (tensor,), args[3])


def _ordered_dict(args: tuple[Any, ...]) -> OrderedDict[Any, Any]:
    if args == ():
        return OrderedDict()
    if len(args) == 1 and type(args[0]) is list:
        out: OrderedDict[Any, Any] = OrderedDict()
        for pair in args[0]:
            if type(pair) not in (tuple, list) or len(pair) != 2:
                raise fail("OrderedDict given something other than key-value pairs")
            out[pair[0]] = pair[1]
        return out
    raise fail("OrderedDict given arguments it never takes")


def plain_attributes(state: dict[Any, Any]) -> bool:
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


def _set(args: tuple[Any, ...]) -> set[Any]:
    if args == ():
        return set()
    if len(args) == 1 and type(args[0]) in (list, tuple):
        return set(args[0])
    raise fail("set given arguments it never takes")


def _frozenset(args: tuple[Any, ...]) -> frozenset[Any]:
    return frozenset(_set(args))


def _complex(args: tuple[Any, ...]) -> complex:
    if not 1 <= len(args) <= 2 or not all(type(v) in (int, float) for v in args):
        raise fail("complex given arguments other than two numbers")
    return complex(*args)


def _bytearray(args: tuple[Any, ...]) -> bytes:
    # bytearray(n) allocates n zero bytes: a size bomb; only bytes the file holds
    if args == ():
        return b""
    if len(args) == 1 and type(args[0]) is bytes:
        return args[0]
    if len(args) == 2 and type(args[0]) is str and args[1] in ("latin1", "latin-1"):
        return _encode(args)
    raise fail("bytearray given something other than bytes the file holds")


def _bytes(args: tuple[Any, ...]) -> bytes:
    if args == ():
        return b""
    return _bytearray(args)


def _encode(args: tuple[Any, ...]) -> bytes:
    # protocol 2 pickles bytes as _codecs.encode(text, "latin1")
    if len(args) != 2 or type(args[0]) is not str or args[1] not in ("latin1", "latin-1"):
        raise fail("_codecs.encode given arguments other than text and 'latin1'")
    try:
        return args[0].encode("latin-1")
    except UnicodeEncodeError:
        raise fail("_codecs.encode of text that is not latin-1") from None


def _reconstructor(args: tuple[Any, ...]) -> Opaque:
    # protocols 0 and 1 pickle an object as copyreg._reconstructor(cls, object, None)
    if (
        len(args) != 3
        or not isinstance(args[0], Opaque)
        or args[0].args is not None
        or refused(args[0].name)
    ):
        raise fail("copyreg._reconstructor given arguments it never takes")
    return Opaque(args[0].name, ())


TABLE: dict[str, Callable[[tuple[Any, ...]], Any]] = {
    **TENSOR_BUILDERS,
    "torch._tensor._rebuild_from_type_v2": _rebuild_from_type,
    "collections.OrderedDict": _ordered_dict,
    "torch.Size": torch_size,
    "torch.device": torch_device,
    "torch.serialization._get_layout": torch_layout,
    "builtins.set": _set,
    "builtins.frozenset": _frozenset,
    "builtins.complex": _complex,
    "builtins.bytearray": _bytearray,
    "builtins.bytes": _bytes,
    "_codecs.encode": _encode,
    "copyreg._reconstructor": _reconstructor,
}
"""The value constructors: a global's dotted name -> a function of its checked arguments."""


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

RENAMED = {"__builtin__": "builtins", "copy_reg": "copyreg"}  # Python 2's module names


def refused(name: str) -> bool:
    """Whether the dotted global ``name`` lies in a module no placeholder may stand for."""
    if name.startswith(_TORCH_DATA):
        return False
    return any(name == m or name.startswith(m + ".") for m in REFUSED)

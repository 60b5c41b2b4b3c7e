"""How the tree functions flatten a structure, and name a leaf: the key-path convention.

Flattening is optree's, in the package's own ``"tensorbridge"`` namespace, where each
dataclass type met is registered on first sight (invisible to other optree users); a
leaf's key path repr's mapping keys, keeps sequence indices as ints and writes
namedtuple and dataclass fields as ``.name``. :mod:`tensorbridge.tree` uses it to
flatten and to put the failing leaf's path in an error; ``describe`` / ``compare``
name leaves by :func:`flatten_with_paths`.

>>> with_path(ValueError("bad"), flatten({"w": [1, 2]})[1], 1)
ValueError("at ['w'][1]: bad")
"""

from __future__ import annotations

import contextlib
import copy as _copy
import dataclasses
import threading
from collections.abc import Hashable, Iterable
from typing import Any

import numpy as np
import optree
import torch

_NAMESPACE = "tensorbridge"
_NEVER_DATACLASS = frozenset({torch.Tensor, np.ndarray, int, float, str, bytes, bool})


# --- flattening, dataclasses and key paths ----------------------------------------------------

_registered: set[type] = set()
_register_lock = threading.Lock()


def flatten(tree: Any) -> tuple[list[Any], optree.PyTreeSpec]:
    while True:
        leaves, spec = optree.tree_flatten(tree, namespace=_NAMESPACE)
        # Each leaf type once (a class leaf's type is its metaclass, never a dataclass).
        fresh = {
            cls
            for cls in set(map(type, leaves)) - _NEVER_DATACLASS
            if dataclasses.is_dataclass(cls)
        }
        if not fresh or fresh <= _registered:
            return leaves, spec
        for cls in fresh:
            _register_dataclass(cls)


def flatten_with_paths(tree: Any) -> dict[str, Any]:
    """Every leaf of ``tree`` by its key path: the package's one key-path convention.

    Mapping keys are repr'd, sequence indices are ints, namedtuple and dataclass fields
    are ``.name``; the flattening is the tree functions' own (optree, dataclasses too).

    >>> flatten_with_paths({"enc": [1, 2], "lr": 0.1})
    {"['enc'][0]": 1, "['enc'][1]": 2, "['lr']": 0.1}
    """
    leaves, spec = flatten(tree)
    return {a.codify(""): leaf for a, leaf in zip(spec.accessors(), leaves, strict=True)}


class _Instance:
    """A dataclass node's original object (optree wants hashable metadata: this is, by id)."""

    __slots__ = ("names", "obj")

    def __init__(self, obj: Any, names: tuple[str, ...]) -> None:
        self.obj = obj
        self.names = names


def _flatten_dataclass(obj: Any) -> tuple[list[Any], _Instance, tuple[str, ...]]:
    names = tuple(f.name for f in dataclasses.fields(obj) if hasattr(obj, f.name))
    return [getattr(obj, n) for n in names], _Instance(obj, names), names


def _unflatten_dataclass(meta: Hashable | None, children: Iterable[Any]) -> Any:
    assert isinstance(meta, _Instance)
    # A shallow copy with the fields replaced: no __init__ / __post_init__ runs again,
    # init=False fields and frozen or slotted classes are handled alike.
    new = _copy.copy(meta.obj)
    for name, value in zip(meta.names, children, strict=True):
        object.__setattr__(new, name, value)
    return new


def _register_dataclass(cls: type) -> None:
    with _register_lock:
        if cls in _registered:
            return
        # ValueError: registered in our namespace already (by an earlier import of this module)
        with contextlib.suppress(ValueError):
            optree.register_pytree_node(
                cls,
                _flatten_dataclass,
                _unflatten_dataclass,
                path_entry_type=optree.DataclassEntry,
                namespace=_NAMESPACE,
            )
        _registered.add(cls)


def _key_path(spec: optree.PyTreeSpec, index: int) -> str:
    return spec.accessors()[index].codify("")


def with_path(error: Exception, spec: optree.PyTreeSpec, index: int | None) -> Exception:
    """The same kind of exception, its message prefixed with the failing leaf's key path."""
    if index is None:
        return error
    path = _key_path(spec, index)
    if not path:  # the tree is a single leaf
        return error
    try:
        located = type(error)(f"at {path}: {error}")
    except Exception:
        return error  # an exception class that wants more than a message
    return located.with_traceback(error.__traceback__)

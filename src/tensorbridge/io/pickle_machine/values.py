"""The values the pickle machine builds: inert records, never objects of a file's classes.

Besides plain Python values, a pickle read by :func:`~tensorbridge.io.pickle_machine.unpickle`
gives these: an :class:`Opaque` for an object of a class the machine does not build (its
name and data, nothing of it imported or called), and :class:`StorageType`,
:class:`StorageRef` and :class:`TensorRef` for torch's storages and dense tensors
(described and checked, never allocated); while the stream runs, a :class:`Global` is
the token of a global the table names. They sit below the table and the interpreter,
which both make them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch

from ...errors import FormatError

__all__ = [
    "DICTS",
    "Global",
    "Opaque",
    "StorageRef",
    "StorageType",
    "TensorRef",
    "fail",
]

DICTS = (dict, OrderedDict)  # the mappings the machine builds: test with type(x) in DICTS


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


class Global:
    """A table constructor or a refused global, named by the stream: a token, never callable."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def fail(what: str) -> FormatError:
    return FormatError(what)

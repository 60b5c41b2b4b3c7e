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

The package: :mod:`.values` (what the machine builds), :mod:`.rebuilds` (torch's dtypes,
storages and dense tensors), :mod:`.table` (the globals a pickle may name) and
:mod:`.interpreter` (the opcodes, the limits).

>>> import pickle
>>> unpickle(pickle.dumps({"lr": 0.1, "betas": (0.9, 0.999)}))
{'lr': 0.1, 'betas': (0.9, 0.999)}
>>> class Evil:
...     def __reduce__(self):
...         return (print, ("hacked",))
>>> unpickle(pickle.dumps(Evil()))
Traceback (most recent call last):
...
tensorbridge.errors.FormatError: the file calls builtins.print, which tensorbridge never calls
"""

from __future__ import annotations

from .interpreter import MAX_DEPTH, unpickle
from .interpreter import unpickle_at as unpickle_at
from .rebuilds import CONSTANTS as CONSTANTS
from .rebuilds import itemsize as itemsize
from .table import REFUSED, TABLE
from .table import refused as refused
from .values import DICTS, Opaque, StorageRef, StorageType, TensorRef

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

"""One naming rule for a file's entries: nested containers flattened to dotted names.

A state dict nests (``{"encoder": {"layers": [{"w": t}]}}``); a file holds flat names.
Every place in the file layer that meets nesting — ``tb.save`` on the way in, the
``.pt`` reader on the way out — names entries by this one rule, torch's
``state_dict`` convention: mapping keys (as ``str``) and list or tuple indices joined
with ``.``, so the leaf above is ``"encoder.layers.0.w"``. Only plain lists and
tuples are walked: a ``torch.Size`` or a named tuple is a leaf. Two leaves that would
get the same name (``{"a.b": x, "a": {"b": y}}``) raise instead of one silently
replacing the other.

>>> flatten({"model": {"w": 1, "layers": [2, 3]}, "epoch": 7}, where="ckpt")
{'model.w': 1, 'model.layers.0': 2, 'model.layers.1': 3, 'epoch': 7}

Dotted names alone cannot be unflattened exactly (``"a.0"`` may be a list item, an
int key or a string key, and ``{"a.b": x}`` holds no nesting at all), so a reader that
meets nesting also keeps its **skeleton**: the containers as they were (``dict``,
``OrderedDict`` with its attributes, ``list``, ``tuple``; keys as they were, of any
type), each leaf replaced by a :class:`Leaf` carrying its dotted name. :func:`rebuild`
puts values back into a skeleton, so a tree survives a round trip through flat names
exactly, without parsing one:

>>> tree = {"a.b": 1, "layers": [{"w": 2}], 3: (4,)}
>>> rebuild(skeleton(tree), flatten(tree, where="t"), where="t") == tree
True
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import FormatError, InvalidArgumentError

__all__ = ["Leaf", "flatten", "is_container", "rebuild", "skeleton"]


def is_container(obj: Any) -> bool:
    """Whether :func:`flatten` walks into ``obj`` (a mapping, a plain list or tuple)."""
    return isinstance(obj, Mapping) or type(obj) in (list, tuple)


def flatten(tree: Any, *, where: str) -> dict[str, Any]:
    """Every leaf of ``tree`` by dotted name, in the order the containers give them.

    ``where`` starts the message of the error (the file, or what is being saved).

    Raises:
        FormatError: two leaves flatten to one name.
    """
    out: dict[str, Any] = {}
    _walk(tree, "", out, where)
    return out


def _walk(obj: Any, key: str, out: dict[str, Any], where: str) -> None:
    if is_container(obj):
        items = obj.items() if isinstance(obj, Mapping) else enumerate(obj)
        for k, v in items:
            _walk(v, f"{key}.{k}" if key else str(k), out, where)
        return
    if key in out:
        raise FormatError(f"{where}: two entries flatten to the key {key!r}; rename one")
    out[key] = obj


@dataclass(frozen=True)
class Leaf:
    """A leaf's place in a :func:`skeleton`: its dotted name, as :func:`flatten` gives it."""

    name: str


def skeleton(tree: Any) -> Any:
    """``tree``'s containers with each leaf replaced by ``Leaf(dotted name)``.

    A mapping other than ``dict`` / ``OrderedDict`` becomes a ``dict``; an
    ``OrderedDict``'s attributes (``state_dict()``'s ``_metadata``) are kept, copied.

    >>> skeleton({"m": [1, {"w": 2}], 0: "x"})
    {'m': [Leaf(name='m.0'), {'w': Leaf(name='m.1.w')}], 0: Leaf(name='0')}
    """
    return _skeleton(tree, "")


def _skeleton(obj: Any, key: str) -> Any:
    if not is_container(obj):
        return Leaf(key)
    if isinstance(obj, Mapping):
        node: dict[Any, Any] = OrderedDict() if type(obj) is OrderedDict else {}
        if type(obj) is OrderedDict:
            node.__dict__.update(copy.deepcopy(obj.__dict__))
        for k, v in obj.items():
            node[k] = _skeleton(v, f"{key}.{k}" if key else str(k))
        return node
    items = [_skeleton(v, f"{key}.{i}" if key else str(i)) for i, v in enumerate(obj)]
    return items if type(obj) is list else tuple(items)


_LEFT_OUT = object()


def rebuild(skel: Any, values: Mapping[str, Any], *, where: str) -> Any:
    """The tree ``skel`` describes, each ``Leaf`` replaced by ``values[leaf.name]``.

    A leaf missing from ``values`` is left out, and so is a container all of whose
    leaves are (an empty one stays). Leaving out some items of a list or tuple would
    renumber the others, so that raises.

    Raises:
        InvalidArgumentError: some, not all, of a list's or tuple's items left out.
    """
    out = _rebuild(skel, values, "", where)
    return {} if out is _LEFT_OUT else out


def _rebuild(node: Any, values: Mapping[str, Any], key: str, where: str) -> Any:
    if isinstance(node, Leaf):
        return values.get(node.name, _LEFT_OUT)
    if isinstance(node, Mapping):
        out: dict[Any, Any] = OrderedDict() if type(node) is OrderedDict else {}
        if type(node) is OrderedDict:
            out.__dict__.update(copy.deepcopy(node.__dict__))
        for k, v in node.items():
            got = _rebuild(v, values, f"{key}.{k}" if key else str(k), where)
            if got is not _LEFT_OUT:
                out[k] = got
        return _LEFT_OUT if node and not out else out
    items = [
        _rebuild(v, values, f"{key}.{i}" if key else str(i), where) for i, v in enumerate(node)
    ]
    kept = [v for v in items if v is not _LEFT_OUT]
    if node and not kept:
        return _LEFT_OUT
    if len(kept) != len(items):
        first = next(i for i, v in enumerate(items) if v is _LEFT_OUT)
        name = f"{key}.{first}" if key else str(first)
        raise InvalidArgumentError(
            f"{where}: {key or 'the top level'} is a list, and leaving out its item {name!r} "
            "would renumber the items after it; keep all of its items or none"
        )
    return kept if type(node) is list else tuple(kept)

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
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import FormatError

__all__ = ["flatten", "is_container"]


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

"""Tensor names: nested containers flattened to dotted names, and the rules a writer holds names to.

**Flattening.** A state dict nests (``{"encoder": {"layers": [{"w": t}]}}``); a file
holds flat names. Every place in the file layer that meets nesting — ``tb.save`` on
the way in, the ``.pt`` reader on the way out — names entries by this one rule,
torch's ``state_dict`` convention: mapping keys (as ``str``) and list or tuple indices
joined with ``.``, so the leaf above is ``"encoder.layers.0.w"``. Only plain lists and
tuples are walked: a ``torch.Size`` or a named tuple is a leaf. Two leaves that would
get the same name (``{"a.b": x, "a": {"b": y}}``) raise instead of one silently
replacing the other.

**Names a writer can store.** A writer refuses, before it creates anything, a name it
cannot store faithfully, with :class:`~tensorbridge.errors.InvalidNameError` naming the
tensor and the rule. Each rule is one function here (``name -> why it is broken, or
None``); each format's writer states which apply in a :class:`NameRules` of its own
(``NAMES`` in its module), together with the normalisation under which two names
would become one (a case-insensitive filesystem for formats whose names become files).

===============================  ====================================================
rule                             why
===============================  ====================================================
:func:`no_nul`                   C strings, zip member names and file names end at a
                                 NUL: ``w\\x00a`` and ``w\\x00b`` both become ``w``
:func:`valid_unicode`            a lone surrogate has no UTF-8 encoding
:func:`not_empty`                no file or member can be called ``""``
:func:`inside_container`         an absolute path or a ``..`` component, as a zip
                                 member or file name, points outside the container
:func:`forward_slashes`          ``\\`` separates paths on Windows and in unzip tools
:func:`one_file_name`            a name that becomes one file: no ``/`` or ``\\``, not
                                 only periods (``.``, ``..``)
:func:`reserved_name`,           names the format keeps for itself (safetensors'
:func:`reserved_prefix`          ``__metadata__``, Zarr's ``__`` prefix)
:func:`at_most_bytes`            a length limit (llama.cpp's 63-byte GGUF names)
:func:`case_insensitive`         a normalisation: names equal after NFC and case
                                 folding are one file on macOS and Windows
:func:`npy_stem`                 a normalisation: ``np.load`` reads the key ``a.npy``
                                 of a ``.npz`` as the member of the key ``a``
===============================  ====================================================

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
>>> NameRules((no_nul,)).check(["w\\x00a"], "'out.npz'")
Traceback (most recent call last):
    ...
tensorbridge.errors.InvalidNameError: 'out.npz': cannot store the tensor 'w\\x00a': ...
"""

from __future__ import annotations

import copy
import re
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import FormatError, InvalidArgumentError, InvalidNameError, UnsupportedTensorError

__all__ = [
    "Leaf",
    "NameRules",
    "Rule",
    "at_most_bytes",
    "broken",
    "case_insensitive",
    "flatten",
    "forward_slashes",
    "inside_container",
    "is_container",
    "mapping_of",
    "no_nul",
    "not_empty",
    "npy_stem",
    "one_file_name",
    "rebuild",
    "reserved_name",
    "reserved_prefix",
    "skeleton",
    "valid_unicode",
]


def mapping_of(tensors: Any, where: str, holds: str = "named tensors") -> Mapping[Any, Any]:
    """``tensors`` when it is a mapping of names to values: what every writer takes.

    >>> mapping_of([1], "'w.safetensors'")
    Traceback (most recent call last):
    ...
    tensorbridge.errors.UnsupportedTensorError: 'w.safetensors' holds named tensors; pass a \
mapping such as model.state_dict() or {'x': array}, not a list

    Raises:
        UnsupportedTensorError: anything else (a list, a single tensor), naming what the
            file (``where``) ``holds``.
    """
    if not isinstance(tensors, Mapping):
        raise UnsupportedTensorError(
            f"{where} holds {holds}; pass a mapping such as model.state_dict() or "
            f"{{'x': array}}, not a {type(tensors).__qualname__}"
        )
    return tensors


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


# --- the rules: each takes a name and says why it breaks the rule, or None --------------------

Rule = Callable[[str], "str | None"]


def no_nul(name: str) -> str | None:
    """A NUL ends a name in C strings, zip members and file names: two names could become one."""
    if "\x00" in name:
        return (
            "it holds a NUL character, where C readers, zip members and file names end "
            "the name (two such names become one)"
        )
    return None


def valid_unicode(name: str) -> str | None:
    """A lone surrogate (``'\\udc80'``, what ``os.fsdecode`` makes of bad bytes) is no text."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "it is not valid Unicode (a lone surrogate, which UTF-8 cannot encode)"
    return None


def not_empty(name: str) -> str | None:
    """An empty name names no file and no member."""
    return "it is empty" if not name else None


_DRIVE = re.compile(r"[A-Za-z]:")


def inside_container(name: str) -> str | None:
    """A name that becomes a path (a zip member, a file) must stay inside its container."""
    if name.startswith(("/", "\\")) or _DRIVE.match(name):
        return "it is an absolute path, which would point outside the archive or directory"
    if ".." in re.split(r"[/\\]", name):
        return "it has a '..' component, which would point outside the archive or directory"
    return None


def forward_slashes(name: str) -> str | None:
    """Zip member names separate with ``/`` only (APPNOTE 4.4.17); ``\\`` is one on Windows."""
    if "\\" in name:
        return "it holds a '\\', which Windows and unzip tools read as a path separator"
    return None


def one_file_name(name: str) -> str | None:
    """A name that becomes one file or directory: no separator, not only periods."""
    if "/" in name or "\\" in name:
        return "it holds a path separator ('/' or '\\'), so it is no single file name"
    if name and not name.strip("."):
        return "it is only periods, which name a directory itself or its parent"
    return None


def reserved_name(reserved: str, owner: str) -> Rule:
    """The format keeps the name ``reserved`` for itself (``owner`` says for what)."""

    def rule(name: str) -> str | None:
        return f"{reserved!r} is reserved for {owner}" if name == reserved else None

    rule.__name__ = f"reserved_name({reserved!r})"
    return rule


def reserved_prefix(prefix: str, owner: str) -> Rule:
    """The format keeps names starting with ``prefix`` for itself."""

    def rule(name: str) -> str | None:
        return (
            f"names starting with {prefix!r} are reserved by {owner}"
            if name.startswith(prefix)
            else None
        )

    rule.__name__ = f"reserved_prefix({prefix!r})"
    return rule


def at_most_bytes(limit: int, owner: str) -> Rule:
    """A name of at most ``limit`` bytes in UTF-8 (``owner`` says whose limit it is)."""

    def rule(name: str) -> str | None:
        size = len(name.encode("utf-8", "surrogatepass"))
        if size > limit:
            return f"it is {size} bytes in UTF-8 and {owner} takes at most {limit}"
        return None

    rule.__name__ = f"at_most_bytes({limit})"
    return rule


def broken(name: str, rules: Iterable[Rule]) -> str | None:
    """Why ``name`` breaks the first of ``rules`` it breaks, or None (readers use it for
    names from a file that become paths)."""
    for rule in rules:
        why = rule(name)
        if why is not None:
            return why
    return None


def case_insensitive(name: str) -> str:
    """A name as a case-insensitive filesystem (macOS, Windows) compares it: NFC, case-folded."""
    return unicodedata.normalize("NFC", name).casefold()


def npy_stem(name: str) -> str:
    """A ``.npz`` key without its trailing ``.npy`` s: ``np.load`` looks a key ``K`` up as
    the member ``K`` first, then ``K.npy``, so the key ``a.npy`` reads the member of the key
    ``a``. Names with one stem may collide (strictly: only those one ``.npy`` apart)."""
    while name.endswith(".npy"):
        name = name[: -len(".npy")]
    return name


# --- a format's rules --------------------------------------------------------------------------


@dataclass(frozen=True)
class NameRules:
    """The rules one format's writer holds names to, and when two names are one.

    ``same`` maps a name to what the format (or the filesystem under it) makes of
    it; two names with the same image collide. ``same_means`` says, for the message,
    why they would be one.
    """

    rules: tuple[Rule, ...]
    same: Callable[[str], str] | None = None
    same_means: str = ""

    def check(self, names: Iterable[Any], where: str) -> None:
        """Refuse the first name that breaks a rule, or two names that collide.

        Names that are not ``str`` are left to the writer's own type check.

        Raises:
            InvalidNameError: naming the tensor (or both tensors) and the rule.
        """
        seen: dict[str, str] = {}
        for name in names:
            if not isinstance(name, str):
                continue
            why = broken(name, self.rules)
            if why is not None:
                raise InvalidNameError(
                    f"{where}: cannot store the tensor {name!r}: {why}; rename the tensor"
                )
            if self.same is not None:
                image = self.same(name)
                other = seen.setdefault(image, name)
                if other != name:
                    raise InvalidNameError(
                        f"{where}: the tensors {other!r} and {name!r} {self.same_means}; "
                        "rename one of them"
                    )

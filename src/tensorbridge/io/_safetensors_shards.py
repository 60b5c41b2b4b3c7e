"""A sharded safetensors checkpoint's files: the shard size limit, the index, stale shards.

Hugging Face's layout: ``model-00001-of-00002.safetensors`` and the others, plus
``model.safetensors.index.json`` mapping each tensor to its shard. :func:`parse_size`
reads ``max_shard_size``; :func:`index_json` writes the index;
:func:`stale_files` / :func:`remove_stale` find and drop what an earlier save of the
same name left that the new one replaces. :mod:`tensorbridge.io.safetensors` uses them
(and re-exports :func:`parse_size` and :func:`remove_stale`).

>>> parse_size("2GiB"), parse_size("5GB")
(2147483648, 5000000000)
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path

from .._atomic import fsync_dir, remove_temps
from .._commit import final_name
from ..errors import (
    InvalidArgumentError,
)
from ._detect import INDEX_SUFFIX

_UNITS = {
    "": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40,
}  # fmt: skip


def parse_size(size: int | str | None) -> int | None:
    """``max_shard_size`` in bytes: an int, or "5GB" (10**9, as Hugging Face) / "2GiB" (2**30)."""
    if size is None:
        return None
    value: int | None = None
    if isinstance(size, int) and not isinstance(size, bool):
        value = size
    elif isinstance(size, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([A-Za-z]*)\s*", size)
        if m and m.group(2).upper() in _UNITS:
            value = int(Fraction(m.group(1)) * _UNITS[m.group(2).upper()])
    if value is None or value <= 0:
        raise InvalidArgumentError(
            f"max_shard_size={size!r} is not a positive size; pass bytes (an int) or a string "
            "such as '5GB' (10**9 bytes), '500MB' or '2GiB' (2**30 bytes)"
        )
    return value


def index_json(weight_map: dict[str, str], total: int) -> bytes:
    doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
    return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode("utf-8")


def stale_files(target: Path) -> list[str]:
    """The files a sharded save of ``target`` replaces: its shards (named, or left hidden
    by a killed save) and the single file ``target``."""
    stem = re.escape(target.name.removesuffix(".safetensors"))
    shard = re.compile(stem + r"-\d{5}-of-\d{5}\.safetensors")
    names = {final_name(p.name) or p.name for p in target.parent.iterdir()}
    return [n for n in sorted(names) if shard.fullmatch(n)] + [target.name]


def remove_stale(target: Path) -> None:
    """Once ``target`` is saved as one file: drop the previous sharded save of that name.

    The index goes first (a directory holding it reads as the previous checkpoint,
    without it as ``target``), so it never names a shard already removed.
    """
    index = target.parent / (target.name + INDEX_SUFFIX)
    if index.exists():
        index.unlink()
        fsync_dir(target.parent)
    remove_temps(index)
    for name in stale_files(target)[:-1]:
        (target.parent / name).unlink(missing_ok=True)
        remove_temps(target.parent / name)

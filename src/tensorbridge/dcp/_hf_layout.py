"""Where every byte of a Hugging Face checkpoint goes, decided once from DCP's global plan.

The coordinator sees every rank's write items (names, global shapes, dtypes, the
chunk each rank holds) before anything is written, which is all a safetensors
header needs. :func:`plan_layout` assigns tensors to files (greedy in state-dict
order up to ``max_shard_size``, a larger tensor alone in its file), orders each
file the way the official writer does (``LAYOUT_RANK``, then name) and fixes every
tensor's absolute byte range. Ranks then only need a :class:`Placement` per tensor
to write their chunks (:func:`block_runs` turns a chunk into file ranges).

Non-tensor entries (``step``, hyper-parameters) become header ``__metadata__``
strings, as JSON text, when they are simple values (:func:`simple_value`);
anything else is listed, with the reason, under ``tensorbridge.skipped``, never
pickled. Their values are only known once the ranks have looked them up, after the
header's size must be fixed, so a file whose checkpoint has such entries reserves
room for them in its header (spaces after the JSON, as the padding rule already
allows): up to ``VALUE_LIMIT`` bytes a value. Without them the header is exactly
the official writer's.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

from .._packed import PSEUDO_ROWS
from ..dtypes import PACKED_BY_TORCH, resolve_dtype
from ..errors import UnsupportedDtypeError, UnsupportedTensorError
from ..io.safetensors_header import LAYOUT_RANK, encode, unheld

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
OBJECTS_KEY = "tensorbridge.objects"  # JSON list: the metadata keys that are DCP entries
SKIPPED_KEY = "tensorbridge.skipped"  # JSON object: entry -> why it was not saved
VALUE_LIMIT = 512  # bytes of one value's JSON string in the header
REASON_LIMIT = 160


@dataclass(frozen=True)
class TensorSpec:
    """One tensor: its name, dtype code and shapes, in torch's and the header's terms."""

    name: str
    code: str
    shape: tuple[int, ...]  # torch's global shape
    header_shape: tuple[int, ...]  # F4 counts values, two a byte
    itemsize: int  # bytes per torch element

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.itemsize


@dataclass(frozen=True)
class Placement:
    """Where a tensor's bytes start in which file, and its row-major geometry."""

    file: str
    begin: int  # absolute offset of the tensor's first byte in the file
    shape: tuple[int, ...]
    itemsize: int


@dataclass(frozen=True)
class FilePlan:
    """One output file: its tensors in file order and the bytes reserved for its header JSON."""

    name: str
    tensors: tuple[TensorSpec, ...]
    header_size: int  # the JSON and its padding, a multiple of 8

    @property
    def data_start(self) -> int:
        return 8 + self.header_size

    @property
    def size(self) -> int:
        return self.data_start + sum(t.nbytes for t in self.tensors)

    def entries(self) -> list[tuple[str, str, tuple[int, ...], int]]:
        return [(t.name, t.code, t.header_shape, t.nbytes) for t in self.tensors]

    def header(self, metadata: dict[str, str]) -> bytes:
        """The header bytes with ``metadata``, exactly ``data_start`` long."""
        return encode(self.entries(), metadata, self.header_size)


@dataclass(frozen=True)
class Layout:
    """The whole checkpoint: its files, the non-tensor entries, and where each tensor goes."""

    files: tuple[FilePlan, ...]
    objects: tuple[str, ...]

    def placements(self) -> dict[str, Placement]:
        out = {}
        for f in self.files:
            at = f.data_start
            for t in f.tensors:
                out[t.name] = Placement(f.name, at, t.shape, t.itemsize)
                at += t.nbytes
        return out

    def index(self) -> bytes:
        """``model.safetensors.index.json``: ``metadata.total_size`` and ``weight_map``."""
        weight_map = {t.name: f.name for f in self.files for t in f.tensors}
        total = sum(t.nbytes for f in self.files for t in f.tensors)
        doc = {"metadata": {"total_size": total}, "weight_map": weight_map}
        return (json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()


def spec_of(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> TensorSpec:
    """The header entry of a tensor, or the error that says why safetensors cannot hold it."""
    packed = PACKED_BY_TORCH.get(dtype)
    if packed is not None and packed in PSEUDO_ROWS:
        if not shape:
            raise UnsupportedTensorError(
                f"tensor {name!r}: a 0-d {packed.name} tensor has no last dimension to count "
                f"its {packed.per_byte} values a byte in; save x.reshape(1)"
            )
        code = PSEUDO_ROWS[packed].safetensors or ""
        header_shape = (*shape[:-1], shape[-1] * packed.per_byte)
        return TensorSpec(name, code, shape, header_shape, 1)
    row = resolve_dtype(dtype)
    if row.safetensors is None:
        raise UnsupportedDtypeError(f"tensor {name!r}: {unheld(row)}")
    return TensorSpec(name, row.safetensors, shape, shape, row.itemsize)


def plan_layout(
    tensors: list[TensorSpec], objects: list[str], max_shard_size: int | None
) -> Layout:
    """Files ``model-0000i-of-0000N.safetensors``, filled greedily in the order given."""
    groups: list[list[TensorSpec]] = []
    size = 0
    for t in tensors:
        if not groups or (max_shard_size is not None and size + t.nbytes > max_shard_size):
            groups.append([])
            size = 0
        groups[-1].append(t)
        size += t.nbytes
    groups = groups or [[]]
    files = []
    for i, group in enumerate(groups, 1):
        ordered = tuple(sorted(group, key=lambda t: (LAYOUT_RANK.get(t.code, 0), t.name)))
        name = f"model-{i:05d}-of-{len(groups):05d}.safetensors"
        files.append(FilePlan(name, ordered, _header_room(ordered, objects)))
    return Layout(tuple(files), tuple(objects))


def _header_room(tensors: tuple[TensorSpec, ...], objects: list[str]) -> int:
    entries = [(t.name, t.code, t.header_shape, t.nbytes) for t in tensors]
    if not objects:
        return len(encode(entries, {"format": "pt"})) - 8
    base = len(encode(entries, file_metadata({}, {}, objects))) - 8
    for name in objects:
        quoted = len(json.dumps(name, ensure_ascii=False).encode())
        base += 3 * quoted + VALUE_LIMIT + 2 * REASON_LIMIT + 16
    base += len(json.dumps(SKIPPED_KEY)) + 8
    return base + (-base % 8)


def file_metadata(
    values: dict[str, str], skipped: dict[str, str], objects: list[str]
) -> dict[str, str]:
    """Every header's ``__metadata__``: ``format``, the saved values, what was skipped and why."""
    meta = {"format": "pt", **values}
    if objects:
        meta[OBJECTS_KEY] = json.dumps(sorted(values), ensure_ascii=False)
    if skipped:
        meta[SKIPPED_KEY] = json.dumps(skipped, ensure_ascii=False, sort_keys=True)
    return dict(sorted(meta.items()))


def simple_value(name: str, obj: Any) -> tuple[str | None, str]:
    """``obj`` as JSON text for the header, or ``(None, why not)``; never a pickle.

    >>> simple_value("step", 7), simple_value("betas", (0.9, 0.99))[1][:30]
    (('7', ''), 'a tuple is not a simple value ')
    """
    text, reason = _as_json(name, obj)
    # ASCII and short: the header's room for it was reserved before the value was known
    return text, reason.encode("ascii", "backslashreplace").decode()[:REASON_LIMIT]


def _as_json(name: str, obj: Any) -> tuple[str | None, str]:
    if name == "format" or name.startswith("tensorbridge."):
        return None, f"{name!r} is a reserved metadata key; rename the entry"
    if not _is_simple(obj, 0):
        return None, (
            f"a {type(obj).__qualname__} is not a simple value (bool, int, float, str, None, "
            "or lists and str-keyed dicts of those) and would need pickle"
        )
    try:
        text = json.dumps(obj, ensure_ascii=False, allow_nan=False)
    except ValueError:
        return None, "it holds NaN or infinity, which JSON cannot hold"
    if len(json.dumps(text, ensure_ascii=False).encode()) > VALUE_LIMIT:
        return None, f"its JSON is over the {VALUE_LIMIT}-byte limit for header metadata"
    return text, ""


def _is_simple(obj: Any, depth: int) -> bool:
    if depth > 16:
        return False
    if obj is None or type(obj) in (bool, int, float, str):
        return True
    if type(obj) is list:
        return all(_is_simple(v, depth + 1) for v in obj)
    if type(obj) is dict:
        return all(type(k) is str and _is_simple(v, depth + 1) for k, v in obj.items())
    return False


def strides(shape: tuple[int, ...]) -> list[int]:
    """Row-major strides, in elements."""
    out = [1] * len(shape)
    for d in range(len(shape) - 2, -1, -1):
        out[d] = out[d + 1] * shape[d + 1]
    return out


@dataclass(frozen=True)
class Block:
    """Runs of one chunk that lie at one stride in the file: ``count`` runs of ``run`` bytes.

    ``start`` is the file offset of the first run, ``step`` the distance between runs
    (bytes); ``index`` selects the chunk's part that fills them: the leading indices
    (into the chunk) and the range ``[lo, hi)`` along the next dimension.
    """

    start: int
    step: int
    count: int
    run: int
    index: tuple[int, ...]
    lo: int
    hi: int

    @property
    def whole(self) -> bool:
        """The chunk is one run (``lo == hi == 0``): write its bytes in order."""
        return self.hi == 0


def block_runs(
    at: Placement, offsets: tuple[int, ...], sizes: tuple[int, ...], window: int
) -> Iterator[Block]:
    """The file ranges of the chunk ``offsets`` / ``sizes``, grouped into evenly spaced blocks.

    A chunk is contiguous in the file from its last dimension that is not whole: a
    row-sharded chunk is one run (``index == ()``, ``lo == hi == 0``), a
    column-sharded one a run a row. Blocks span at most ``window`` bytes of the file
    (or one run, if longer).

    >>> at = Placement("f", 100, (4, 6), 2)
    >>> [(b.start, b.step, b.count, b.run) for b in block_runs(at, (1, 2), (2, 3), 1 << 20)]
    [(116, 12, 2, 6)]
    """
    shape, b = at.shape, at.itemsize
    if 0 in sizes:
        return
    k = next((d for d in range(len(shape) - 1, -1, -1) if sizes[d] != shape[d]), -1)
    st = strides(shape)
    base = at.begin + b * sum(o * s for o, s in zip(offsets, st, strict=True))
    if k <= 0:  # whole tensor, or rows of it: one range
        n = math.prod(sizes) * b
        yield Block(base, n, 1, n, (), 0, 0)
        return
    run = sizes[k] * st[k] * b
    step = st[k - 1] * b
    per = max(1, window // step)
    outer = sizes[: k - 1]
    for idx in _ndindex(outer):
        first = base + b * sum(i * s for i, s in zip(idx, st[: len(idx)], strict=True))
        for lo in range(0, sizes[k - 1], per):
            hi = min(sizes[k - 1], lo + per)
            yield Block(first + lo * step, step, hi - lo, run, idx, lo, hi)


def _ndindex(shape: tuple[int, ...]) -> Iterator[tuple[int, ...]]:
    if not shape:
        yield ()
        return
    for i in range(shape[0]):
        for rest in _ndindex(shape[1:]):
            yield (i, *rest)

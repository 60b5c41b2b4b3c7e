"""Writing ONNX models: :func:`save` and :func:`replace_weights` (weights as external data).

The format and what writing promises are in :mod:`tensorbridge.io.onnx`. A save checks
every tensor first (its ONNX type, and with ``into=`` the initializer it replaces: name,
type, shape), lays the values out (:func:`layout`), builds the ``ModelProto`` with the
``onnx`` package, then streams the values into ``NAME.onnx.data`` and writes the model,
both committed together (:class:`tensorbridge._atomic.StagedFiles`).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np

from ..._atomic import StagedFiles
from ..._chunks import DEFAULT_CHUNK, iter_bytes, write_counted
from ..._files import read_limited
from ..._keys import mapping_of
from ..._progress import progress_bar
from ..._tensorfile import TensorFile, cast_target, check_dense, row_of
from ..._torch_checks import is_tensor
from ...dtypes import DTypeLike, resolve_dtype
from ...errors import (
    FormatError,
    InvalidArgumentError,
    MissingExtraError,
    ShapeMismatchError,
    UnsupportedDtypeError,
    UnsupportedTensorError,
)
from .data_types import BY_CODE, BY_NUMPY_NAME, DataType, pack, raw_nbytes
from .reader import EXTERNAL, OnnxFile

if TYPE_CHECKING:
    import torch

__all__ = ["ALIGN_OVER", "INLINE_UNDER", "PAGE", "Weights", "layout", "replace_weights", "save"]

# onnx.save_model's size_threshold: smaller tensors stay in the model's raw_data
INLINE_UNDER = 1024
# onnx.proto: external data offsets "SHOULD be multiples 4096 (page size) to enable mmap";
# ONNX Runtime and onnx_ir align tensors over 1 MiB so (align_threshold), pack the rest
PAGE, ALIGN_OVER = 4096, 1 << 20
_ELEMENT = 16  # smaller tensors start at a multiple of the widest element (complex128)

Weights = Mapping[str, "torch.Tensor | np.ndarray"]
_FLOATS = ("FLOAT", "BFLOAT", "DOUBLE")  # the ONNX types --float-dtype casts


def require_onnx() -> Any:
    """The ``onnx`` package, or the error naming the extra that installs it."""
    try:
        import onnx
    except ImportError as err:
        raise MissingExtraError(
            f"writing ONNX models needs the onnx package ({err}); pip install tensorbridge[onnx]"
        ) from None
    return onnx


@dataclass
class _Item:
    """One initializer written: its proto, type, shape and where its bytes come from."""

    name: str
    proto: Any  # the onnx.TensorProto, updated in place
    type: DataType
    shape: tuple[int, ...]
    nbytes: int
    value: Any = None  # a tensor or array (None: the template's stored bytes)
    stored: np.ndarray | None = None  # the template's bytes, kept as they are
    offset: int = -1  # in the data file; -1: inline raw_data


def save(
    tensors: Weights,
    path: str | os.PathLike[str],
    *,
    float_dtype: DTypeLike | None = None,
    metadata: Mapping[str, Any] | None = None,
    progress: bool | None = None,
    into: str | os.PathLike[str] | None = None,
    name_map: Mapping[str, str] | str | os.PathLike[str] | None = None,
    chunk_bytes: int = DEFAULT_CHUNK,
) -> None:
    """Write tensors as an ONNX model's initializers: the weights of ``into``, replaced,
    or a model of initializers alone. Streamed and atomic.

    >>> import os, tempfile, numpy as np
    >>> d = tempfile.mkdtemp()
    >>> save({"w": np.zeros((512, 4), np.float32)}, os.path.join(d, "m.onnx"))
    >>> sorted(os.listdir(d))
    ['m.onnx', 'm.onnx.data']

    Args:
        tensors: names to tensors or arrays of any type ONNX has (float4, int4 ...
            float6 as ml_dtypes arrays, one value a byte; torch ``float4_e2m1fn_x2``).
        path: the model to write; tensors of 1024 bytes or more go to ``PATH.data``
            beside it, each at an aligned offset (:func:`layout`).
        float_dtype: cast floating-point values to this dtype first.
        metadata: the model's ``metadata_props`` (text), added to ``into``'s.
        progress: show a progress bar (``None``: when stderr is a terminal).
        into: an ONNX model whose initializers ``tensors`` replace, matched by name;
            the rest of the model (its graph, other initializers) is kept.
        name_map: ``{tensor name: initializer name}`` for tensors named otherwise in
            ``into`` (or a JSON file of that object).
        chunk_bytes: about how many bytes to hold at once when casting.

    Raises:
        KeyError: a tensor (after ``name_map``) names no initializer of ``into``.
        UnsupportedDtypeError: a dtype ONNX has no type for, or not the initializer's.
        ShapeMismatchError: a shape not the initializer's.
        MissingExtraError: the onnx package is not installed.
    """
    onnx = require_onnx()
    target = Path(path)
    mapping_of(tensors, repr(str(target)))
    template = None if into is None else OnnxFile(into)
    try:
        if template is None:
            model = onnx.helper.make_model(
                onnx.helper.make_graph([], target.stem or "weights", [], []),
                producer_name="tensorbridge",
            )
            items = [_new(onnx, model, n, v, float_dtype, target) for n, v in tensors.items()]
        else:
            model = onnx.load(str(into), load_external_data=False)
            items = _replaced(onnx, model, template, tensors, float_dtype, _names(name_map))
        for key, value in (metadata or {}).items():
            _set_metadata(model, str(key), str(value))
        data_path = target.with_name(target.name + ".data")
        end = layout(items)
        for it in items:
            _place(onnx, it, data_path.name)
        try:
            serialized = model.SerializeToString()
        except ValueError as e:  # protobuf's 2 GiB limit on one message
            raise FormatError(
                f"{target}: the model's protobuf is over 2 GiB ({e}); move more of it to "
                "external data"
            ) from None
        _write(target, data_path, items, serialized, end, progress, chunk_bytes)
    finally:
        if template is not None:
            template.close()


def replace_weights(
    model: str | os.PathLike[str],
    weights: Weights | TensorFile | str | os.PathLike[str],
    out: str | os.PathLike[str],
    *,
    name_map: Mapping[str, str] | str | os.PathLike[str] | None = None,
    float_dtype: DTypeLike | None = None,
    progress: bool | None = None,
) -> list[str]:
    """Put new weights into an exported ONNX model, without exporting again.

    ``weights`` is a state dict, an opened file or the path of any file tensorbridge
    reads; each tensor replaces the initializer of its name (``name_map``: ``{weight
    name: initializer name}`` for renamed ones), after ``float_dtype`` casts floating
    values; the type and shape must be the initializer's. ``out`` gets the model with
    its weights as external data (``OUT.data``); ``out`` may be ``model`` itself.
    Returns the initializers replaced; the others keep their values.

    >>> import os, tempfile, numpy as np
    >>> d = tempfile.mkdtemp()
    >>> save({"w": np.zeros(3, np.float32), "b": np.ones(1, np.int64)}, d + "/m.onnx")
    >>> new = {"w": np.arange(3, dtype=np.float32)}
    >>> replace_weights(d + "/m.onnx", new, d + "/n.onnx")
    ['w']
    >>> from tensorbridge.io.onnx import load
    >>> load(d + "/n.onnx")["w"].tolist()
    [0.0, 1.0, 2.0]
    """
    if isinstance(weights, (str, os.PathLike)):
        from .. import open as open_any  # any format tensorbridge reads

        with open_any(weights) as f:
            return replace_weights(model, f, out, name_map=name_map, float_dtype=float_dtype,
                                   progress=progress)  # fmt: skip
    if isinstance(weights, TensorFile):
        weights = {n: weights.stream_value(n) for n in weights}
    save(weights, out, float_dtype=float_dtype, progress=progress, into=model, name_map=name_map)
    mapping = _names(name_map)
    return [mapping.get(n, n) for n in weights]


def _names(name_map: Mapping[str, str] | str | os.PathLike[str] | None) -> dict[str, str]:
    """``name_map`` as a dict: given, or read from a JSON file of one object of strings."""
    if name_map is None:
        return {}
    if isinstance(name_map, Mapping):
        return {str(k): str(v) for k, v in name_map.items()}
    text = read_limited(name_map, 64 << 20, "name map")
    try:
        loaded = json.loads(text)
    except ValueError as e:
        raise InvalidArgumentError(f"name map {os.fspath(name_map)!r} is no JSON ({e})") from None
    if not isinstance(loaded, dict) or not all(isinstance(v, str) for v in loaded.values()):
        raise InvalidArgumentError(
            f"name map {os.fspath(name_map)!r} must be one JSON object of "
            '{"weight name": "initializer name"} strings'
        )
    return loaded


# --- what each tensor is ---------------------------------------------------------------------


def _typed(name: str, value: Any, float_dtype: Any, where: Path) -> tuple[DataType, Any]:
    """The ONNX type ``value`` is written as (after ``float_dtype``), and the value to write:
    a tensor or array of a table row, or a one-a-byte ml_dtypes array of a packed type."""
    try:
        if is_tensor(value):
            check_dense(value)
            import torch

            if value.dtype == getattr(torch, "float4_e2m1fn_x2", None):
                from ...convert import to_numpy  # unpacked: one float4 a byte, as ONNX's type

                value = to_numpy(value.detach().cpu(), dtype=ml_dtypes.float4_e2m1fn)
        elif not isinstance(value, np.ndarray) or isinstance(value, np.ma.MaskedArray):
            raise UnsupportedTensorError(
                f"the value is a {type(value).__qualname__}; ONNX initializers are written from "
                "torch.Tensor or np.ndarray values (pass torch.as_tensor(x))"
            )
        own = BY_NUMPY_NAME.get(value.dtype.name) if isinstance(value, np.ndarray) else None
        if own is not None and own.packed:  # int4 ... float6: no row of the table (yet)
            if float_dtype is None or own.name.startswith(("INT", "UINT")):
                return own, value
            value = value.astype(np.float32)  # float4 / float6 values are exact in float32
        dst = cast_target(row_of(value), float_dtype)
        t = BY_NUMPY_NAME.get(dst.numpy.name)
        if t is None or t.packed:
            raise UnsupportedDtypeError(
                f"ONNX has no data type for {dst.name}; pass float_dtype= for floats "
                "(complex32: cast it to complex64)"
            )
        return t, value if dst is row_of(value) else _Cast(value, dst)
    except (TypeError, ValueError) as e:
        raise type(e)(f"cannot save tensor {name!r} to {where}: {e}") from e


@dataclass
class _Cast:
    """A value cast to ``row`` as its bytes are written (``float_dtype``)."""

    value: Any
    row: Any

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)


def _new(onnx: Any, model: Any, name: Any, value: Any, float_dtype: Any, where: Path) -> _Item:
    if not isinstance(name, str) or not name:
        raise TypeError(f"an initializer's name must be a non-empty str, got {name!r}")
    t, value = _typed(name, value, float_dtype, where)
    shape = tuple(int(d) for d in value.shape)
    proto = model.graph.initializer.add()
    proto.name, proto.data_type = name, t.code
    proto.dims.extend(shape)
    return _Item(name, proto, t, shape, raw_nbytes(t, math.prod(shape)), value)


def _replaced(
    onnx: Any,
    model: Any,
    template: OnnxFile,
    tensors: Weights,
    float_dtype: Any,
    name_map: dict[str, str],
) -> list[_Item]:
    """The items of ``template``'s initializers: those ``tensors`` name replaced (checked
    against each initializer), every other one stored externally carried over."""
    wanted = {name_map.get(n, n): n for n in tensors}
    unknown = [n for n in name_map if n not in tensors]
    if unknown:
        raise KeyError(f"name_map names {unknown[0]!r}, which is not among the weights given")
    protos = {p.name: p for p in model.graph.initializer}
    missing = [w for w, n in wanted.items() if w not in protos]
    if missing:
        source = wanted[missing[0]]
        raise KeyError(
            f"weight {source!r} names no initializer of {template.path.name} (it has "
            f"{', '.join(list(protos)[:5])}{' ...' if len(protos) > 5 else ''}); map it with "
            f"name_map={{{source!r}: INITIALIZER}}, or leave it out (command line: --exclude)"
        )
    items = []
    for init, proto in protos.items():
        if init in wanted:
            items.append(_checked(template, init, wanted[init], proto, tensors, float_dtype))
        elif proto.data_location == EXTERNAL:  # its bytes move into the new data file
            t = BY_CODE[proto.data_type]
            shape = tuple(proto.dims)
            stored = template.raw(init)
            items.append(_Item(init, proto, t, shape, len(stored), stored=stored))
    for proto in _attribute_tensors(model.graph):
        if proto.data_location == EXTERNAL:
            raise UnsupportedTensorError(
                f"{template.path.name} keeps a node attribute's tensor ({proto.name or 'unnamed'}) "
                "as external data, which tensorbridge does not carry over; save it with "
                "onnx.save_model(..., convert_attribute=False) first"
            )
    return items


def _checked(
    template: OnnxFile, init: str, source: str, proto: Any, tensors: Weights, float_dtype: Any
) -> _Item:
    """The item replacing initializer ``init`` with weight ``source``: type and shape its."""
    where = Path(template.path)
    t, value = _typed(source, tensors[source], float_dtype, where)
    shape = tuple(int(d) for d in value.shape)
    said = f"weight {source!r}" + (f" (initializer {init!r})" if source != init else "")
    if t.code != proto.data_type:
        theirs = BY_CODE.get(proto.data_type)
        wanted = resolve_dtype(theirs.numpy) if theirs is not None and not theirs.packed else None
        fix = (
            f"pass float_dtype={wanted.name!r} (command line: --float-dtype {wanted.name})"
            if wanted is not None and wanted.is_floating and t.name.startswith(_FLOATS)
            else "convert the weight to the model's type first"
        )
        stored = theirs.name if theirs else f"type {proto.data_type}"
        raise UnsupportedDtypeError(f"{said} is {t.name} but {where.name} stores {stored}; {fix}")
    if shape != tuple(proto.dims):
        raise ShapeMismatchError(
            f"{said} has shape {list(shape)} but {where.name}'s initializer has "
            f"{list(proto.dims)}; export the model again for a new shape"
        )
    return _Item(init, proto, t, shape, raw_nbytes(t, math.prod(shape)), value)


def _attribute_tensors(graph: Any) -> Iterator[Any]:
    """The tensors of the graph's node attributes, subgraphs' included."""
    for node in graph.node:
        for a in node.attribute:
            if a.HasField("t"):
                yield a.t
            yield from a.tensors
            for g in ([a.g] if a.HasField("g") else []) + list(a.graphs):
                yield from g.initializer
                yield from _attribute_tensors(g)


def _set_metadata(model: Any, key: str, value: str) -> None:
    for entry in model.metadata_props:
        if entry.key == key:
            entry.value = value
            return
    entry = model.metadata_props.add()
    entry.key, entry.value = key, value


# --- layout and writing ----------------------------------------------------------------------


def layout(items: list[Any]) -> int:
    """Each item's offset in the data file (``-1``: inline ``raw_data``, under
    :data:`INLINE_UNDER` bytes); returns the data file's size.

    Tensors over :data:`ALIGN_OVER` start on a :data:`PAGE` boundary (``onnx.proto``'s
    advice for memory mapping; ONNX Runtime's and onnx_ir's threshold), the others at
    a multiple of 16 bytes, so that every element is aligned.

    >>> from types import SimpleNamespace as S
    >>> its = [S(nbytes=n, offset=0) for n in (100, 5000, 2 << 20, 3000)]
    >>> layout(its), [i.offset for i in its]
    (2108344, [-1, 0, 8192, 2105344])
    """
    end = 0
    for it in items:
        if it.nbytes < INLINE_UNDER:
            it.offset = -1
            continue
        align = PAGE if it.nbytes > ALIGN_OVER else _ELEMENT
        it.offset = -(-end // align) * align
        end = it.offset + it.nbytes
    return end


def _place(onnx: Any, it: _Item, location: str) -> None:
    """Set ``it``'s proto to hold its bytes where :func:`layout` put them."""
    p = it.proto
    for field in ("raw_data", "float_data", "int32_data", "string_data", "int64_data",
                  "double_data", "uint64_data", "external_data", "segment"):  # fmt: skip
        p.ClearField(field)
    p.ClearField("data_location")
    if it.offset < 0:
        p.raw_data = b"".join(bytes(c) for c in _chunks(it, DEFAULT_CHUNK))
        return
    p.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", location), ("offset", it.offset), ("length", it.nbytes)):
        entry = p.external_data.add()
        entry.key, entry.value = key, str(value)


def _chunks(it: _Item, chunk_bytes: int) -> Iterator[Any]:
    """``it``'s bytes as ONNX stores them, about ``chunk_bytes`` at a time."""
    if it.stored is not None:
        for i in range(0, len(it.stored), chunk_bytes):
            yield it.stored[i : i + chunk_bytes].data
        return
    if it.type.packed:  # one value a byte -> packed; whole groups of values a chunk
        flat = np.ascontiguousarray(it.value).reshape(-1)
        step = max(8, chunk_bytes // 8 * 8)
        for i in range(0, flat.size, step):
            yield pack(it.type, flat[i : i + step]).data
        return
    value = it.value
    if isinstance(value, _Cast):
        yield from iter_bytes(value.value, value.row, chunk_bytes)
    else:
        yield from iter_bytes(value, None, chunk_bytes)


def _write(
    target: Path,
    data_path: Path,
    items: list[_Item],
    serialized: bytes,
    end: int,
    progress: bool | None,
    chunk_bytes: int,
) -> None:
    external = [it for it in items if it.offset >= 0]
    bar = progress_bar(end, f"saving {target.name}", progress, tensors=len(external))
    try:
        with StagedFiles() as staged:
            if external:
                with staged.write(data_path) as f:
                    at = 0
                    for it in sorted(external, key=lambda it: it.offset):
                        f.write(bytes(it.offset - at))
                        chunks = _chunks(it, chunk_bytes)
                        write_counted(f, chunks, it.name, it.nbytes, bar, "its type and shape take")
                        at = it.offset + it.nbytes
            with staged.write(target) as f:
                f.write(serialized)
            staged.commit()
    finally:
        bar.close()

"""Whole checkpoints quantized and dequantized, with the config a loader reads:
``tb.quantize_checkpoint`` and ``tb.dequantize_checkpoint``.

This module sits above both ``io`` (it reads and saves files) and ``quant`` (the
schemes' layouts and kernels), which import neither it nor each other's upper layers.

:func:`quantize_checkpoint` reads a checkpoint (a file, shard index or directory) and
writes it as a safetensors checkpoint whose weights are quantized in the scheme's
published layout (which weights, and how they are stored: :mod:`tensorbridge.quant.write`).
Each weight is quantized a slice of rows at a time as the writer pulls it, so memory
holds one slice; everything else is copied bit for bit. The source's ``config.json``
goes beside the output with the ``quantization_config`` a loader (transformers,
vLLM, compressed-tensors) reads the layout from. ``verify=True`` re-reads the output:
each quantized weight must be :func:`tensorbridge.quantize`'s, bit for bit, and every
other tensor the source's. ``tensorbridge convert --quantize`` is this call.

:func:`dequantize_checkpoint` is the way back: a checkpoint of codes and scales (or a
GGUF file's blocks) written as the unquantized model, each weight computed while the
writer writes, with the source's ``config.json`` beside it without its
``quantization_config`` (:func:`copy_config`), so that a loader reads a plain model.
``tensorbridge convert --dequantize`` is this call.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from ._tensorfile import TensorFile
from .dtypes import DTypeLike
from .errors import InvalidArgumentError, QuantizationError, UnsupportedDtypeError

if TYPE_CHECKING:
    from .quant.detect import Plan

__all__ = [
    "DequantizedCheckpoint",
    "QuantizedCheckpoint",
    "copy_config",
    "dequantize_checkpoint",
    "quantize_checkpoint",
]


@dataclass(frozen=True)
class QuantizedCheckpoint:
    """What :func:`quantize_checkpoint` wrote.

    Attributes:
        scheme: the scheme's canonical name (``"mxfp4"``).
        path: the file written, or the shard index of a sharded checkpoint.
        quantized: the weights quantized, by their name in the source.
        left_unquantized: weights a default toolkit would quantize but that were left
            as stored, with why (an ``ignore`` pattern, rows that do not fit the blocks).
        tensors: the stored tensors written (codes and scales counted apart).
        bytes_in: the bytes of the source's tensors read (tied tensors once).
        bytes_out: the bytes of the files written.
        config: the ``config.json`` written beside the output, or None (the source has
            none beside it, or an existing one was kept: ``config_kept``): then nothing
            says how the output is quantized, and a reader passes ``scheme=``.
        config_kept: an existing ``config.json`` beside the output that was left as it
            was (``overwrite=False``).
        caveat: what the written config cannot say (mxfp8 with e5m2 elements), or None.
        problems: with ``verify=True``, every difference found (empty: bit-exact);
            None when not verified.
    """

    scheme: str
    path: str
    quantized: tuple[str, ...]
    left_unquantized: Mapping[str, str]
    tensors: int
    bytes_in: int
    bytes_out: int
    config: str | None = None
    config_kept: str | None = None
    caveat: str | None = None
    problems: tuple[str, ...] | None = None

    @property
    def verified(self) -> bool | None:
        """True when verified bit-exact, False when verified with problems, else None."""
        return None if self.problems is None else not self.problems


def quantize_checkpoint(
    src: str | os.PathLike[str] | TensorFile,
    dst: str | os.PathLike[str],
    scheme: str,
    *,
    layout: str | None = None,
    element: str | None = None,
    block_size: tuple[int, int] | None = None,
    ignore: Sequence[str] = (),
    names: Sequence[str] | None = None,
    metadata: Mapping[str, Any] | Literal[False] | None = None,
    max_shard_size: int | str | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    verify: bool = False,
) -> QuantizedCheckpoint:
    """Write checkpoint ``src`` to ``dst`` with its weights quantized in ``scheme``'s layout.

    The 2-D and larger floating-point weights are quantized, except embeddings,
    ``lm_head``, norms and names matching an ``ignore`` glob; biases, norms and
    integer tensors are copied as stored. ``dst`` is a ``.safetensors`` path, a
    directory (``model.safetensors`` in it) or a ``NAME.safetensors.index.json``.

    >>> import os, tempfile, torch, tensorbridge as tb
    >>> d = tempfile.mkdtemp()
    >>> tb.save({"l.weight": torch.randn(8, 64), "l.bias": torch.zeros(8)},
    ...         os.path.join(d, "w.safetensors"))
    >>> src, dst = os.path.join(d, "w.safetensors"), os.path.join(d, "q.safetensors")
    >>> out = tb.quantize_checkpoint(src, dst, "mxfp4", verify=True)
    >>> out.quantized, out.verified
    (('l.weight',), True)
    >>> sorted(tb.load(out.path))
    ['l.bias', 'l.weight_packed', 'l.weight_scale']

    Args:
        src: the checkpoint to read (a path, or an open file: ``tb.open(path)``).
        dst: where to write it.
        scheme: ``fp8-block``, ``mxfp8``, ``mxfp4``, ``nvfp4-modelopt`` or
            ``nvfp4-compressed-tensors``.
        layout: ``"gpt-oss"`` with mxfp4: openai/gpt-oss's expert ``_blocks`` /
            ``_scales`` (default: the scheme's published layout).
        element: mxfp8's fp8 element type, ``"e4m3"`` (default) or ``"e5m2"``.
        block_size: fp8-block's ``(rows, cols)`` block (default ``(128, 128)``).
        ignore: globs of weights to leave unquantized.
        names: the tensors of ``src`` to write (default: all of them).
        metadata: the safetensors metadata (default: the source's; False: none).
        max_shard_size: shard the output (``"5GB"``).
        overwrite: replace ``dst`` (and a ``config.json`` beside it) if it exists.
        progress: show a progress bar (None: on a terminal, for long writes).
        verify: re-read the output and check it bit for bit.

    Raises:
        QuantizationError: a scheme tensorbridge does not write, options that do not
            fit it, a source already quantized, or no weight to quantize.
        DestinationExistsError: ``dst`` exists and ``overwrite`` is false.
    """
    from .io import carried_metadata, destination, save
    from .quant.write import (
        config_caveat,
        quantized_parts,
        skip_reason,
        unconverted_modules,
        writable,
    )

    scheme = writable(scheme, layout, element, block_size)
    target = destination(dst)
    target.check(
        overwrite=overwrite,
        max_shard_size=max_shard_size,
        metadata=metadata or None,
        scheme=scheme,
    )
    with _opened(src) as f:
        where = os.fspath(src) if not isinstance(src, TensorFile) else str(_path(f))
        if names is None:
            unsupported = f.unsupported()
            if unsupported:
                first, reason = next(iter(unsupported.items()))
                raise UnsupportedDtypeError(
                    f"{reason}; pass names= without {first!r} to quantize the rest"
                )
        selected = list(f.keys() if names is None else names)
        if _plan(f, None, None).quantized:
            raise QuantizationError(
                f"{where} is already quantized; dequantize it first (tb.open(src, "
                "dequantize='bf16'), then tb.save)"
            )
        kw: dict[str, Any] = {"layout": layout, "element": element}
        values: dict[str, Any] = {}
        quantized: list[str] = []
        left: dict[str, str] = {}
        taken = set(selected)
        for n in selected:
            row, shape = f.info(n)
            why = skip_reason(n, row, shape, scheme, ignore, layout=layout)
            if why is not None:
                values[n] = f[n]
                if not why.startswith("not a "):
                    left[n] = why
                continue
            load = functools.partial(f.get, n, framework="torch")  # mapped, not copied
            parts = quantized_parts(n, load, shape, scheme, block_size, **kw)
            clash = [k for k in parts if k != n and k in taken]
            if clash:
                raise QuantizationError(
                    f"{n} quantizes into {clash[0]}, which {where} already holds; exclude one "
                    f"of them (leave '{clash[0]}' out of names=)"
                )
            values.update(parts)
            quantized.append(n)
        if not quantized:
            what = (
                "3-D float ...experts.gate_up_proj / down_proj tensors"
                if layout == "gpt-oss"
                else "2-D+ float weights, not embeddings, lm_head or norms"
            )
            raise QuantizationError(
                f"no weight of {where} is one {scheme} quantizes ({what}); nothing to quantize"
            )
        ignored = unconverted_modules(list(left), quantized, layout=layout)
        if metadata is None:
            meta: Mapping[str, Any] = carried_metadata(f, target.format, selected)[0]
        else:
            meta = metadata or {}
        save(
            values,
            dst,
            metadata=meta or None,
            max_shard_size=max_shard_size,
            progress=progress,
            overwrite=True,  # checked above, before anything was read
        )
        config, kept = _write_config(f, target.path, scheme, block_size, ignored, layout, overwrite)
        written = target.written()
        problems = None
        if verify:
            problems = _verify(
                f, selected, str(written), scheme, block_size, quantized, kw, progress
            )
        return QuantizedCheckpoint(
            scheme=scheme,
            path=str(written),
            quantized=tuple(quantized),
            left_unquantized=left,
            tensors=len(values),
            bytes_in=sum(f.nbytes(n) for n in selected if n not in f.aliases),
            bytes_out=sum(p.stat().st_size for p in target.existing()),
            config=config,
            config_kept=kept,
            caveat=config_caveat(scheme, element),
            problems=problems,
        )


@dataclass(frozen=True)
class DequantizedCheckpoint:
    """What :func:`dequantize_checkpoint` wrote.

    Attributes:
        path: the file written, or the shard index of a sharded checkpoint.
        dtype: the weights' dtype (``"bfloat16"``).
        plan: what was decided: the schemes, each weight's stored parts, the
            activation scales left out (``None`` for a GGUF file, whose reader
            dequantizes its blocks itself).
        tensors: the tensors written.
        bytes_in: the bytes of the tensors read, as dequantized (tied tensors once).
        bytes_out: the bytes of the files written.
        config: the ``config.json`` written beside the output (the source's, without
            its ``quantization_config``), or None.
        problems: with ``verify=True``, every difference found (empty: bit-exact);
            None when not verified.
    """

    path: str
    dtype: str
    plan: Plan | None
    tensors: int
    bytes_in: int
    bytes_out: int
    config: str | None = None
    problems: tuple[str, ...] | None = None

    @property
    def dequantized(self) -> tuple[str, ...]:
        """The weights computed from codes and scales, by their unquantized names."""
        return tuple(g.name for g in self.plan.groups) if self.plan is not None else ()

    @property
    def dropped(self) -> tuple[str, ...]:
        """Stored tensors left out (activation scales: they describe no weight)."""
        return self.plan.dropped if self.plan is not None else ()

    @property
    def verified(self) -> bool | None:
        """True when verified bit-exact, False when verified with problems, else None."""
        return None if self.problems is None else not self.problems


def dequantize_checkpoint(
    src: str | os.PathLike[str] | TensorFile,
    dst: str | os.PathLike[str],
    dtype: DTypeLike,
    *,
    scheme: str | None = None,
    block_size: tuple[int, int] | None = None,
    names: Sequence[str] | None = None,
    metadata: Mapping[str, Any] | Literal[False] | None = None,
    max_shard_size: int | str | None = None,
    overwrite: bool = False,
    progress: bool | None = None,
    verify: bool = False,
) -> DequantizedCheckpoint:
    """Write quantized checkpoint ``src`` to ``dst`` as the unquantized model, in ``dtype``.

    Each quantized weight is computed (code x scale in float32, rounded once) a few
    block rows at a time while the writer writes, so memory holds a few chunks whatever
    the model's size; other tensors are copied bit for bit and activation scales left
    out. The scheme comes from ``scheme=``, else the config beside ``src``, else
    unambiguous tensor names (as ``tb.open(src, dequantize=dtype)``); a GGUF file's
    blocks are dequantized by its reader. ``dst`` is any path ``tb.save`` takes; the
    ``config.json`` beside ``src`` goes beside it without its ``quantization_config``.

    >>> import os, tempfile, torch, tensorbridge as tb
    >>> d = tempfile.mkdtemp()
    >>> q = tb.quantize(torch.randn(8, 64), "mxfp8", name="l.weight")
    >>> tb.save({**q, "l.bias": torch.zeros(8)}, os.path.join(d, "q.safetensors"))
    >>> out = tb.dequantize_checkpoint(os.path.join(d, "q.safetensors"),
    ...                                os.path.join(d, "w.safetensors"), "bf16", verify=True)
    >>> out.dequantized, out.verified
    (('l.weight',), True)
    >>> sorted(tb.load(out.path))
    ['l.bias', 'l.weight']

    Args:
        src: the checkpoint to read (a path, or an open file: ``tb.open(path)``, read
            here through its scheme, or ``tb.open(path, dequantize=dtype)``, as it is).
        dst: where to write it.
        dtype: the weights' dtype: ``"bf16"``, ``"f16"`` or ``"f32"``.
        scheme: the scheme, when no config beside ``src`` says it (``"fp8-block"``).
        block_size: fp8-block's ``(rows, cols)`` block, when no config gives it.
        names: the tensors to write, by their unquantized names (default: all).
        metadata: the output's metadata (default: the source's; False: none).
        max_shard_size: shard the output (``"5GB"``).
        overwrite: replace ``dst`` (and a ``config.json`` beside it) if it exists.
        progress: show a progress bar (None: on a terminal, for long writes).
        verify: re-read the output and check it bit for bit against the weights
            computed again.

    Raises:
        QuantizationError: the scheme cannot be decided, or the parts do not fit it.
        DestinationExistsError: ``dst`` exists and ``overwrite`` is false.
        InvalidArgumentError: an argument the destination cannot take.
    """
    from .io import destination, save
    from .quant.api import DequantizedFile

    target = destination(dst)
    target.check(overwrite=overwrite, max_shard_size=max_shard_size, metadata=metadata or None)
    with _dequantizing(src, dtype, scheme, block_size) as f:
        if names is None:  # stored entries no reader can give (strings, GGUF blocks unasked)
            unsupported = (f.src if isinstance(f, DequantizedFile) else f).unsupported()
            if unsupported:
                first, reason = next(iter(unsupported.items()))
                raise UnsupportedDtypeError(
                    f"{reason}; pass names= without {first!r} to dequantize the rest"
                )
        selected = list(f.keys() if names is None else names)
        missing = [n for n in selected if n not in f]
        if missing:
            raise InvalidArgumentError(
                f"{missing[0]!r} is not a tensor of {f.filename} as dequantized; pass names= "
                f"from its keys ({', '.join(f.keys()[:5])}{', ...' if len(f) > 5 else ''})"
            )
        values, meta = _dequantized_values(f, selected, target.format, metadata)
        save(
            values,
            dst,
            metadata=meta or None,
            max_shard_size=max_shard_size,
            progress=progress,
            overwrite=True,  # checked above, before anything was read
        )
        plan: Plan | None = getattr(f, "plan", None)
        source = getattr(f, "path", None)
        written = target.written()
        config = None
        if plan is not None and source is not None:
            config = copy_config(source, target.path, overwrite=overwrite)
        problems = None
        if verify:
            from .io.verify import verify as verify_file

            problems = verify_file(f, str(written), names=selected, progress=progress).problems
        return DequantizedCheckpoint(
            path=str(written),
            dtype=_dtype_name(dtype),
            plan=plan,
            tensors=len(selected),
            bytes_in=sum(f.nbytes(n) for n in selected if n not in f.aliases),
            bytes_out=sum(p.stat().st_size for p in target.existing()),
            config=config,
            problems=problems,
        )


@contextlib.contextmanager
def _dequantizing(
    src: str | os.PathLike[str] | TensorFile,
    dtype: DTypeLike,
    scheme: str | None,
    block_size: tuple[int, int] | None,
) -> Iterator[TensorFile]:
    """``src`` read as the unquantized model: opened (and closed) here when it is a path
    (``tb.open(src, dequantize=dtype, ...)``); an open file read through its scheme,
    unless it is one already (``tb.open(path, dequantize=...)``)."""
    from .quant.api import DequantizedFile

    if not isinstance(src, TensorFile):
        from .io import open as open_file

        with open_file(src, dequantize=dtype, scheme=scheme, block_size=block_size) as f:
            yield f
        return
    if isinstance(src, DequantizedFile):
        if scheme is not None or block_size is not None:  # decided when it was opened
            raise InvalidArgumentError(
                f"{src.filename} is opened dequantizing already; pass scheme= and "
                "block_size= to tb.open, or give dequantize_checkpoint the path"
            )
        yield src
        return
    yield DequantizedFile(src, dtype, scheme=scheme, block_size=block_size)  # src stays open


def _dequantized_values(
    f: TensorFile, names: list[str], fmt: Any, metadata: Any
) -> tuple[Any, Mapping[str, Any] | None]:
    """What the save writes: each weight computed as written (a format that streams
    computed values), else read when written; and the metadata (the source's unless
    given, ``False``: none)."""
    from .io import carried_metadata, listing

    if metadata is None:
        meta: Mapping[str, Any] | None = carried_metadata(f, fmt, names)[0]
    else:
        meta = metadata or None
    if not fmt.many_arrays:
        if len(names) != 1:
            raise InvalidArgumentError(
                f"a {fmt.suffixes[0]} file holds one array but {len(names)} tensors were "
                f"selected; pass names=[one of them], or write "
                f"{listing(lambda g: g.many_arrays, ' or ')}"
            )
        return f[names[0]], None
    if fmt.deferred:
        return {n: f.stream_value(n) for n in names}, meta
    return {n: f[n] for n in names}, meta


def _dtype_name(dtype: DTypeLike) -> str:
    from .dtypes import resolve_dtype

    return resolve_dtype(dtype).name


@contextlib.contextmanager
def _opened(src: str | os.PathLike[str] | TensorFile) -> Iterator[TensorFile]:
    """``src`` as an open file: opened (and closed) here when it is a path."""
    if isinstance(src, TensorFile):
        yield src
        return
    from .io import open as open_file

    with open_file(src) as f:
        yield f


def _path(f: TensorFile) -> Any:
    return getattr(f, "path", None) or f.filename


def _plan(f: TensorFile, scheme: str | None, block_size: Any) -> Any:
    """The quantization plan of an open file (``scheme`` / ``block_size`` applied)."""
    from .quant.detect import plan, read_config

    index = {n: f.info(n) for n in f if n not in f.unsupported()}
    opts = {"block_size": block_size} if block_size is not None else {}
    return plan(
        index, read_config(getattr(f, "path", None), follow_links=f.follow_links), scheme, opts
    )


def _write_config(
    src: TensorFile,
    dst: os.PathLike[str],
    scheme: str,
    block_size: tuple[int, int] | None,
    ignored: list[str],
    layout: str | None,
    overwrite: bool,
) -> tuple[str | None, str | None]:
    """A quantized checkpoint's config.json: the source's, with its ``quantization_config``
    (written only when the source directory has a config.json). Returns the path written
    and the path of an existing config.json kept (``overwrite`` false)."""
    from ._atomic import atomic_write
    from .quant.write import quantization_config

    source = getattr(src, "path", None)
    if source is None:
        return None, None
    here = source if os.path.isdir(source) else os.path.dirname(os.path.abspath(source))
    there = os.path.dirname(os.path.abspath(dst))
    config = os.path.join(here, "config.json")
    target = os.path.join(there, "config.json")
    if os.path.abspath(here) == there or not os.path.isfile(config):
        return None, None
    if os.path.exists(target) and not overwrite:
        return None, target
    with open(config, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        return None, None
    data["quantization_config"] = quantization_config(scheme, block_size, ignored, layout=layout)
    with atomic_write(target) as out:
        out.write((json.dumps(data, indent=2) + "\n").encode("utf-8"))
    return target, None


def copy_config(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], *, overwrite: bool = False
) -> str | None:
    """Copy the ``config.json`` beside checkpoint file ``src`` to beside ``dst``, without
    its ``quantization_config``: the config of ``src`` dequantized to ``dst``.

    Nothing is written when ``src`` has no config.json beside it, when both are in one
    directory, or when one exists beside ``dst`` (unless ``overwrite``). Returns the
    path written, or None.

    >>> import json, os, tempfile
    >>> a, b = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> with open(os.path.join(a, "config.json"), "w") as f:
    ...     json.dump({"model_type": "llama", "quantization_config": {}}, f)
    >>> src, dst = os.path.join(a, "q.safetensors"), os.path.join(b, "w.safetensors")
    >>> path = copy_config(src, dst)
    >>> with open(path) as f:
    ...     json.load(f)
    {'model_type': 'llama'}
    """
    from ._atomic import atomic_write

    here = os.path.dirname(os.path.abspath(src))
    there = os.path.dirname(os.path.abspath(dst))
    config = os.path.join(here, "config.json")
    target = os.path.join(there, "config.json")
    if here == there or not os.path.isfile(config) or (os.path.exists(target) and not overwrite):
        return None
    with open(config, encoding="utf-8") as f:
        data = json.load(f)
    if isinstance(data, dict):
        data.pop("quantization_config", None)
    with atomic_write(target) as out:
        out.write((json.dumps(data, indent=2) + "\n").encode("utf-8"))
    return target


def _verify(
    src: TensorFile,
    names: list[str],
    written: str,
    scheme: str,
    block_size: tuple[int, int] | None,
    quantized: list[str],
    kw: Mapping[str, Any],
    progress: bool | None,
) -> tuple[str, ...]:
    """The output re-read: the same quantized weights as tb.quantize's, bit for bit, under
    the same scheme, and every other tensor equal to the source."""
    import numpy as np

    from .io import open as open_file
    from .io.verify import bits, verify
    from .quant.api import quantize
    from .quant.registry import SCHEMES

    kept = [n for n in names if n not in quantized]
    problems = list(verify(src, written, names=kept, progress=progress).problems) if kept else []
    with open_file(written) as f:
        # what was written, whether or not a config.json beside the output says it
        taken = SCHEMES[scheme].takes_block_size
        p = _plan(f, scheme, block_size or ((128, 128) if taken else None))
        found = {g.name for g in p.groups}
        problems += [
            f"{n}: not read back as a {scheme} weight" for n in quantized if n not in found
        ]
        for n in quantized:
            want = quantize(
                np.asarray(src[n]),
                scheme,
                name=n,
                block_size=block_size,
                layout=kw["layout"] or SCHEMES[scheme].published_layout,
                element=kw["element"],
            )
            for k, v in want.items():
                if k not in f or not np.array_equal(bits(v), bits(f[k])):
                    problems.append(f"{k}: differs from tb.quantize({n})")
    return tuple(problems)

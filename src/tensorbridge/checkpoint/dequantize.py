"""``tb.dequantize_checkpoint``: a quantized checkpoint written as the unquantized
model, with the source's config beside it without its ``quantization_config`` (see
the package)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from .._tensorfile import TensorFile
from ..dtypes import DTypeLike, resolve_dtype
from ..errors import InvalidArgumentError
from .config import copy_config
from .sources import refuse_unsupported

if TYPE_CHECKING:
    from ..quant.detect import Plan

__all__ = ["DequantizedCheckpoint", "dequantize_checkpoint"]


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
    >>> src, dst = os.path.join(d, "q.safetensors"), os.path.join(d, "w.safetensors")
    >>> out = tb.dequantize_checkpoint(src, dst, "bf16", verify=True)
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
    from ..io import destination, save
    from ..quant.api import DequantizedFile

    target = destination(dst)
    target.check(overwrite=overwrite, max_shard_size=max_shard_size, metadata=metadata or None)
    with _dequantizing(src, dtype, scheme, block_size) as f:
        if names is None:  # what the stored file cannot give, not only what it dequantizes
            refuse_unsupported(f.src if isinstance(f, DequantizedFile) else f, "dequantize")
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
            from ..io.verify import verify as verify_file

            problems = verify_file(f, str(written), names=selected, progress=progress).problems
        return DequantizedCheckpoint(
            path=str(written),
            dtype=resolve_dtype(dtype).name,
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
    from ..quant.api import DequantizedFile

    if not isinstance(src, TensorFile):
        from ..io import open as open_file

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
    from ..io import carried_metadata, listing

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

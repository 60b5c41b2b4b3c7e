"""``tb.quantize_checkpoint``: a checkpoint written with its weights quantized in a
scheme's published layout, and the config a loader reads (see the package)."""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from .._tensorfile import TensorFile
from ..errors import QuantizationError
from .config import write_quantized_config
from .sources import opened, path_of, refuse_unsupported

__all__ = ["QuantizedCheckpoint", "quantize_checkpoint"]


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
    from ..io import carried_metadata, destination, save
    from ..quant.write import config_caveat, unconverted_modules, writable

    scheme = writable(scheme, layout, element, block_size)
    target = destination(dst)
    target.check(
        overwrite=overwrite,
        max_shard_size=max_shard_size,
        metadata=metadata or None,
        scheme=scheme,
    )
    with opened(src) as f:
        where = os.fspath(src) if not isinstance(src, TensorFile) else str(path_of(f))
        if names is None:
            refuse_unsupported(f, "quantize")
        selected = list(f.keys() if names is None else names)
        if _plan(f, None, None).quantized:
            raise QuantizationError(
                f"{where} is already quantized; dequantize it first (tb.open(src, "
                "dequantize='bf16'), then tb.save)"
            )
        kw: dict[str, Any] = {"layout": layout, "element": element}
        values, quantized, left = _quantized_values(
            f, selected, where, scheme, ignore, block_size, kw
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
        config, kept = write_quantized_config(
            f, target.path, scheme, block_size, ignored, layout, overwrite
        )
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


def _quantized_values(
    f: TensorFile,
    selected: list[str],
    where: str,
    scheme: str,
    ignore: Sequence[str],
    block_size: tuple[int, int] | None,
    kw: Mapping[str, Any],
) -> tuple[dict[str, Any], list[str], dict[str, str]]:
    """What :func:`quantize_checkpoint` writes of ``selected``: each weight ``scheme``
    quantizes as its stored parts (computed a slice at a time as the writer pulls them,
    from the mapped weight), every other tensor as stored; the weights quantized, and
    those a toolkit would quantize but that are left as stored, with why."""
    from ..quant.write import quantized_parts, skip_reason

    layout = kw["layout"]
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
    return values, quantized, left


def _plan(f: TensorFile, scheme: str | None, block_size: Any) -> Any:
    """The quantization plan of an open file (``scheme`` / ``block_size`` applied)."""
    from ..quant.detect import plan, read_config

    index = {n: f.info(n) for n in f if n not in f.unsupported()}
    opts = {"block_size": block_size} if block_size is not None else {}
    return plan(
        index, read_config(getattr(f, "path", None), follow_links=f.follow_links), scheme, opts
    )


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

    from ..io import open as open_file
    from ..io.verify import bits, verify
    from ..quant.api import quantize
    from ..quant.registry import SCHEMES

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

"""Quantized tensor subclasses (torchao's ``MXTensor``, ``NVFP4Tensor``, ``Float8Tensor``, ...).

Such a tensor is a *wrapper*: its dtype and shape describe the values it stands for
(``float32 [8, 64]``) while the values live in inner tensors, codes and scales, that
its ``__tensor_flatten__`` names (``qdata``, ``scale``, ...). Its own storage is not
its values, so nothing here reads it. It is recognised generically, without importing
torchao: a ``torch.Tensor`` subclass whose ``__tensor_flatten__`` names inner tensors,
one of which differs from the outer tensor in dtype or shape. (DTensors and nested
tensors are handled before this; a wrapper whose inner tensors hold its values as
they are, such as torch's ``TwoTensor``, is not quantized and stays refused.)

What a subclass is, and how it dequantizes, is its :class:`Kind`, decided once per
kind of value (the plans are cached by it):

* torchao's ``MXTensor`` (fp8 or fp4 elements, 32-element blocks, plain scales),
  ``NVFP4Tensor`` (16-element blocks, plain scales, none or one per-tensor scale) and
  ``Float8Tensor`` (per tensor or per row) dequantize with tensorbridge's own kernels
  (the scheme whose ``from_subclass`` reads it, from
  :mod:`tensorbridge.quant.registry`, which loads the kernels and nothing of
  :mod:`tensorbridge.io`): bit-identical to the subclass's own
  ``dequantize(torch.float32)``, which ``tests/test_torchao.py`` checks;
* any other subclass (swizzled scales, other block sizes, per-expert scales, int4 /
  int8 / intx, ...) through its own ``dequantize(torch.float32)`` (``dequantize()``
  where it takes no dtype), checked to give a plain tensor of the outer shape.

Either way the float32 values are then rounded once to the requested dtype.

>>> import torch
>>> kind_of(torch.zeros(2)) is None
True
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch

from . import _dtensor as dtensor
from . import _memory as mem
from .dtypes import resolve_dtype
from .errors import QuantizedTensorError, UnsupportedTensorError

__all__ = [
    "Kind",
    "dequantize",
    "flatten",
    "kind_of",
    "parts_text",
    "refusal",
    "undequantizable",
]

_FP4X2 = getattr(torch, "float4_e2m1fn_x2", None)


@dataclass(frozen=True)
class Kind:
    """What a quantized subclass is made of and how it dequantizes (hashable: a plan key).

    Attributes:
        cls: the subclass.
        dtype: its outer dtype (the values it stands for).
        parts: the inner tensors' names and dtypes, in ``__tensor_flatten__``'s order.
        scheme: the :mod:`tensorbridge.quant` scheme whose kernel dequantizes it
            (``"mxfp8"``, ``"mxfp4"``, ``"nvfp4-modelopt"``, ``"fp8"``), or ``None``.
        call: without a scheme, how the subclass's own method is called: ``"float32"``
            (``dequantize(torch.float32)``), ``"own"`` (``dequantize()``) or ``""``
            (it has none).
    """

    cls: type
    dtype: torch.dtype
    parts: tuple[tuple[str, torch.dtype], ...]
    scheme: str | None
    call: str

    @property
    def name(self) -> str:
        return self.cls.__name__

    @property
    def route(self) -> str:
        """How it dequantizes, in words (for ``describe`` and the docs)."""
        if self.scheme is not None:
            return f"tensorbridge's {self.scheme} kernel, in float32"
        if self.call == "float32":
            return f"its own {self.name}.dequantize(torch.float32)"
        if self.call == "own":
            return f"its own {self.name}.dequantize() (in its dtype, then float32)"
        return "nothing: it has no dequantize()"


def flatten(x: Any) -> tuple[list[tuple[str, torch.Tensor]], dict[str, Any]] | None:
    """``x``'s inner tensors by name and its other metadata, from ``__tensor_flatten__``.

    ``None`` when ``x`` is not a wrapper subclass that names inner tensors.
    """
    cls = type(x)
    if cls is torch.Tensor or cls in mem.PLAIN_SUBCLASSES or not isinstance(x, torch.Tensor):
        return None
    flat = getattr(cls, "__tensor_flatten__", None)
    if flat is None or x.is_nested or dtensor.is_dtensor(x):
        return None
    try:
        names, ctx = flat(x)
    except Exception:  # a subclass whose flatten wants a tracing context: not ours to read
        return None
    inner: list[tuple[str, torch.Tensor]] = []
    for n in names:
        t = getattr(x, n, None)
        if not isinstance(t, torch.Tensor):
            return None
        inner.append((str(n), t))
    if not inner:
        return None
    attributes = dict(ctx) if isinstance(ctx, dict) else {"ctx": ctx}
    return inner, attributes


def kind_of(x: Any) -> Kind | None:
    """The :class:`Kind` of a quantized subclass, or ``None`` for anything else."""
    found = flatten(x)
    if found is None:
        return None
    inner, attributes = found
    shape = tuple(x.shape)
    if all(t.dtype == x.dtype and tuple(t.shape) == shape for _, t in inner):
        return None  # the inner tensors are the values themselves: not quantized
    parts = tuple((n, t.dtype) for n, t in inner)
    scheme = _scheme(x, dict(inner), attributes)
    call = ""
    if scheme is None:
        method = getattr(x, "dequantize", None)
        if callable(method):
            call = "float32" if _takes_dtype(method) else "own"
    return Kind(type(x), x.dtype, parts, scheme, call)


def _takes_dtype(method: Any) -> bool:
    try:
        params = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params
    )


def _scheme(x: Any, inner: dict[str, torch.Tensor], attrs: dict[str, Any]) -> str | None:
    """The tensorbridge scheme that dequantizes ``x`` bit-exactly, when there is one: the
    first whose :meth:`~tensorbridge.quant.base.Scheme.from_subclass` reads it."""
    if not type(x).__module__.startswith("torchao."):
        return None
    from .quant.registry import SCHEMES  # the kernels only: nothing of io

    return next((s.name for s in SCHEMES.values() if s.from_subclass(x, inner, attrs)), None)


def parts_text(x: Any) -> str:
    """``qdata (float8_e4m3fn [8, 64]) and scale (float8_e8m0fnu [8, 2])``."""
    found = flatten(x)
    if found is None:  # pragma: no cover - only called for quantized subclasses
        return "inner tensors"
    said = [
        f"{n} ({str(t.dtype).removeprefix('torch.')} [{', '.join(map(str, t.shape))}])"
        for n, t in found[0]
    ]
    return said[0] if len(said) == 1 else ", ".join(said[:-1]) + " and " + said[-1]


def refusal(x: Any, kind: Kind, where: str) -> QuantizedTensorError:
    """The error for converting (``to_numpy`` / ``to_torch``) or saving a quantized subclass."""
    values = str(kind.dtype).removeprefix("torch.")
    said = f"{kind.name} holds {parts_text(x)}, not {values} values"
    if where == "save":
        return QuantizedTensorError(
            f"{said}; save tb.tree_to_torch(tensors, float_dtype=torch.bfloat16) to store "
            "them dequantized"
        )
    dtype = "np.float32" if where == "to_numpy" else "torch.float32"
    tree = "tree_to_numpy" if where == "to_numpy" else "tree_to_torch"
    return QuantizedTensorError(
        f"{said}; pass dtype={dtype} to dequantize it, or take its parts with "
        f"tb.{tree}(..., keep_quantized=True)"
    )


def undequantizable(x: Any, kind: Kind) -> QuantizedTensorError:
    """The error for a quantized subclass that has no ``dequantize()`` and no scheme."""
    return QuantizedTensorError(
        f"{kind.name} holds {parts_text(x)} and has no dequantize() to turn them into "
        "values; take its parts with tb.tree_to_numpy(..., keep_quantized=True)"
    )


def dequantize(x: Any, kind: Kind) -> torch.Tensor:
    """``x``'s values in float32: on the host by a tensorbridge kernel, else where ``x`` is."""
    if kind.scheme is not None:
        return _by_scheme(x, kind.scheme)
    if not kind.call:
        raise undequantizable(x, kind)
    with torch.no_grad():
        made = x.dequantize(torch.float32) if kind.call == "float32" else x.dequantize()
    if (
        type(made) is not torch.Tensor
        or tuple(made.shape) != tuple(x.shape)
        or not made.is_floating_point()
    ):
        raise UnsupportedTensorError(
            f"{kind.name}.dequantize() gave {type(made).__name__} "
            f"{getattr(made, 'dtype', '')} {tuple(getattr(made, 'shape', ()))} for a tensor "
            f"of shape {tuple(x.shape)}; take its parts with keep_quantized=True instead"
        )
    return made.to(torch.float32)


def _by_scheme(x: Any, scheme: str) -> torch.Tensor:
    from .quant.registry import SCHEMES

    s = SCHEMES[scheme]
    found = flatten(x)
    parts = s.from_subclass(x, dict(found[0]), found[1]) if found is not None else None
    if parts is None:  # pragma: no cover - its Kind was decided from the same parts
        raise AssertionError(f"{scheme} no longer reads {type(x).__name__}")
    host = {}
    for role, t in parts.items():
        t = t.detach()
        if t.dtype == _FP4X2:
            t = t.view(torch.uint8)  # two codes a byte, as the scheme reads them
        host[role] = t.cpu()
    index = {role: (resolve_dtype(t.dtype), tuple(t.shape)) for role, t in host.items()}
    group = s.make_group(type(x).__name__, {r: r for r in host}, index, {})
    return s.dequantize(host, group, torch.float32)

"""fp8 per-tensor and per-channel: compressed-tensors, FBGEMM and ModelOpt FP8 layouts.

Stored: ``NAME`` as ``F8_E4M3`` (or ``F8_E5M2``) ``[*lead, rows, cols]`` and
``NAME_scale`` — one value (per-tensor: ``[]``, ``[1]``) or one a row (per-channel:
``[*lead, rows, 1]`` or ``[*lead, rows]``), multiplied. compressed-tensors writes it
for ``format: "float-quantized"``, FBGEMM (``quant_method: "fbgemm_fp8"``) per
channel, ModelOpt (``quant_algo: "FP8"``) per tensor; transformers' ``quant_method:
"fp8"`` without a block size names the scale ``NAME_scale_inv``. Activation scales
(``input_scale``, ``k_scale``, ``v_scale``) mean nothing to a dequantized weight: they
are dropped and listed.

Numerics: ``float32(code) * float32(scale)``, rounded once to the requested dtype
(compressed-tensors multiplies in the scale's own dtype: with a bf16 scale its result
can differ by one bf16 ulp).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ..dtypes import DTypeRow
from ..errors import QuantizationError
from .base import (
    ACTIVATION_SCALES,
    FP8_MAX,
    Config,
    Group,
    Index,
    Scheme,
    fold_factor,
    fp8_to_f32_shifted,
    require,
    row_pieces,
    scale_partner,
    shape_text,
    torchao_parts,
)

if TYPE_CHECKING:
    import torch

__all__ = ["ACTIVATION_SCALES", "FP8Scaled", "activation_scales"]

_CODES = ("float8_e4m3fn", "float8_e5m2")
_SCALES = ("float32", "bfloat16", "float16")


def activation_scales(weight: str, index: Index) -> tuple[str, ...]:
    """The activation scales stored beside ``weight`` (``a.b.weight`` -> ``a.b.input_scale``)."""
    prefix = weight.rsplit(".", 1)[0] + "." if "." in weight else ""
    return tuple(prefix + s for s in ACTIVATION_SCALES if prefix + s in index)


class FP8Scaled(Scheme):
    name = "fp8"
    summary = (
        "fp8 weights with a per-tensor or per-channel scale (compressed-tensors "
        "float-quantized, FBGEMM, ModelOpt FP8: NAME + NAME_scale)."
    )
    numerics = "code x scale in float32 (exact), rounded once to the requested dtype."
    stray_dtypes = _CODES
    part_suffixes = ("weight_scale", "_scale_inv")
    suffixes: ClassVar[Mapping[str, Mapping[str, str]]] = {"": {"codes": "", "scale": "_scale"}}

    def from_subclass(
        self, x: torch.Tensor, inner: Mapping[str, torch.Tensor], attributes: Mapping[str, Any]
    ) -> dict[str, torch.Tensor] | None:
        """torchao's ``Float8Tensor`` scaled per tensor or per row."""
        import torch  # a subclass exists: torch is loaded

        found = torchao_parts(x, inner)
        if found is None or type(x).__name__ != "Float8Tensor" or set(inner) != {"qdata", "scale"}:
            return None
        qdata, scale = found
        lead = tuple(qdata.shape[:-1])
        per_row = tuple(scale.shape) in (lead, (*lead, 1))
        rows = list(attributes.get("block_size") or ()) == [*([1] * len(lead)), qdata.shape[-1]]
        fp8 = qdata.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
        if fp8 and (scale.numel() == 1 or (per_row and rows)):
            return {"codes": qdata, "scale": scale}
        return None

    def code_max(self, codes: DTypeRow) -> float | None:
        return FP8_MAX.get(codes.name)

    def claims(self, config: Config) -> bool:
        m = config.method
        return (
            m == "fbgemm_fp8"
            or (m == "fp8" and config.data.get("weight_block_size") is None)
            or (
                m == "compressed-tensors"
                and bool(config.formats & {"float-quantized", "naive-quantized"})
            )
            or (m == "modelopt" and config.algo == "FP8")
        )

    def from_names(self, index: Index, options: Mapping[str, Any]) -> list[Group]:
        """fp8 codes beside a floating-point ``NAME_scale`` (an e8m0 scale is MXFP8's, a
        ``U8`` one undecided: :class:`~tensorbridge.quant.mx.MX` says which)."""
        groups = []
        for name, (row, _) in index.items():
            found = scale_partner(name, index)
            if found is None or row.name in ("float8_e8m0fnu", "uint8"):
                continue
            weight, codes = found
            if index[codes][0].name in _CODES:
                parts = {"codes": codes, "scale": name}
                groups.append(self.make_group(weight, parts, index, options))
        return groups

    def detect(
        self, index: Index, config: Config | None, options: Mapping[str, Any]
    ) -> list[Group]:
        groups = []
        for name, (row, _) in index.items():
            if row.name not in _CODES:
                continue
            scale = next((name + s for s in ("_scale", "_scale_inv") if name + s in index), None)
            if scale is None:
                raise QuantizationError(
                    f"{name} is {row.name} but has no {name}_scale beside it; the checkpoint "
                    "is incomplete, or not per-tensor / per-channel fp8 (pass scheme=)"
                )
            groups.append(self.make_group(name, {"codes": name, "scale": scale}, index, options))
        return groups

    def make_group(
        self, name: str, parts: Mapping[str, str], index: Index, options: Mapping[str, Any]
    ) -> Group:
        codes, scale = parts["codes"], parts["scale"]
        (crow, cshape), (srow, sshape) = index[codes], index[scale]
        require(
            crow.name in _CODES, f"{codes} is {crow.name}; fp8 weights are float8_e4m3fn / e5m2"
        )
        if srow.name == "uint8":
            raise QuantizationError(
                f"{scale} is uint8: e8m0 exponents (MXFP8) or integer codes cannot be told "
                "apart; pass scheme='mxfp8' if they are e8m0 scales"
            )
        require(srow.name in _SCALES, f"{scale} is {srow.name}; fp8 scales are {_SCALES}")
        count = 1
        for d in sshape:
            count *= d
        lead = tuple(cshape[:-1])
        if count == 1:
            kind = "tensor"
        elif tuple(sshape) in (lead, (*lead, 1)):
            kind = "channel"
        else:
            raise QuantizationError(
                f"{scale} {shape_text(sshape)} does not tile {codes} {shape_text(cshape)} per "
                f"tensor ([1]) or per channel ({shape_text((*lead, 1))}); a block-wise checkpoint "
                "needs weight_block_size in config.json (scheme='fp8-block', block_size=)"
            )
        return Group(
            name, self.name, dict(parts), tuple(cshape), {"granularity": kind},
            activation_scales(codes, index),
        )  # fmt: skip

    def pieces(self, group: Group, parts: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        shape = group.shape
        if len(shape) < 2:
            yield dict(parts)
            return
        *lead, rows, cols = shape
        per_tensor = group.options["granularity"] == "tensor"
        scale = parts["scale"] if per_tensor else parts["scale"].reshape(*lead, rows)
        for idx, r0, r1 in row_pieces(tuple(lead), rows, cols, 1):
            at = (*idx, slice(r0, r1))
            yield {"codes": parts["codes"][at], "scale": scale if per_tensor else scale[at]}

    def block_index(self, group: Group, flat: torch.Tensor) -> torch.Tensor:
        import torch

        if group.options["granularity"] == "tensor" or len(group.shape) < 1:
            return torch.zeros_like(flat)
        return flat // group.shape[-1]  # one scale a row (output channel)

    def kernel(self, parts: Mapping[str, torch.Tensor], group: Group) -> torch.Tensor:
        import torch

        w, factor = fp8_to_f32_shifted(parts["codes"])
        s = fold_factor(w, factor, parts["scale"].to(torch.float32))
        if group.options["granularity"] == "tensor":
            return w.mul_(s.reshape(()))
        return w.mul_(s.reshape(*w.shape[:-1], 1))

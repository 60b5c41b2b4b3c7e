"""MXFP8 and MXFP4: the OCP Microscaling formats (32-element blocks, e8m0 scales).

Two layouts:

* **ocp** (torchao's ``MXTensor`` parts, compressed-tensors' ``mxfp8-quantized`` /
  ``mxfp4-pack-quantized``): codes ``NAME`` (MXFP8: ``F8_E4M3`` / ``F8_E5M2``
  ``[*lead, K]``) or ``NAME`` / ``..._packed`` (MXFP4: ``U8`` ``[*lead, K / 2]``, two
  e2m1 codes a byte, element ``2j`` in the low nibble; or ``F4`` ``[*lead, K]``),
  and ``NAME_scale`` ``[*lead, K / 32]``: ``F8_E8M0``, or ``U8`` holding the same
  exponent bytes (``2 ** (byte - 127)``; 255 is NaN) when the config says MX.
* **gpt-oss** (``quant_method: "mxfp4"``, openai/gpt-oss-20b / -120b):
  ``...experts.gate_up_proj_blocks`` ``U8 [E, out, G, 16]`` and ``..._scales``
  ``U8 [E, out, G]``. The unquantized model loads ``...experts.gate_up_proj`` as
  ``[E, in, out]`` with ``in = G * 32``: the dequantized blocks are transposed. The
  down projection is square (2880 x 2880), so a missing transpose keeps the shape
  and silently scrambles the weights.

A ``U8`` scale is only ever read as e8m0 when a config or ``scheme=`` says MX: read
as integers it makes weights about 2**127 times too large.

Numerics: ``code * 2**(e - 127)`` in float32 (exact unless it falls below
float32's subnormals), rounded once to the requested dtype: bit-identical to
transformers' gpt-oss dequantization (an ``ldexp`` in bf16) and to torchao's
``MXTensor.dequantize`` for bf16 and float32.
Quantizing follows torchao's ``to_mx`` with its default FLOOR scale (the OCP
spec's): the shared exponent is ``floor(log2(amax)) - emax(element)``; elements are
divided by the scale, clamped, and rounded to nearest even.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from ..dtypes import DTypeRow, resolve_dtype
from ..errors import QuantizationError
from . import base
from .base import (
    FP8_MAX,
    Config,
    Group,
    Index,
    Scheme,
    compressed_tensors_config,
    e8m0_to_f32,
    fp4_codes_to_f32,
    fp4_encode,
    fp8_to_f32,
    require,
    scale_partner,
    shape_text,
    torchao_parts,
)
from .fp8_scaled import activation_scales

if TYPE_CHECKING:
    import torch

__all__ = ["ELEMENTS", "GPT_OSS_NOT_CONVERTED", "MX", "element_name"]

BLOCK = 32
# element type -> (exponent of its largest power of two, its largest value)
_ELEMENT = {
    "float8_e4m3fn": (8, 448.0),
    "float8_e5m2": (15, 57344.0),
    "fp4": (2, 6.0),
}
_FORMAT = {"mxfp8": "mxfp8-quantized", "mxfp4": "mxfp4-pack-quantized"}
# openai/gpt-oss-20b's config.json: what its MXFP4 loader leaves unquantized
GPT_OSS_NOT_CONVERTED = (
    "model.layers.*.self_attn",
    "model.layers.*.mlp.router",
    "model.embed_tokens",
    "lm_head",
)
# MXFP8's element types by the names a caller may give (OCP's short names, torch's)
ELEMENTS = {
    "e4m3": "float8_e4m3fn",
    "float8_e4m3fn": "float8_e4m3fn",
    "e5m2": "float8_e5m2",
    "float8_e5m2": "float8_e5m2",
}


def element_name(scheme: str, element: Any) -> str:
    """The element type ``element`` names for ``scheme`` (``"fp4"`` for mxfp4), or
    QuantizationError: MXFP8 takes e4m3 (the default) or e5m2, MXFP4 only fp4.

    >>> element_name("mxfp8", "e5m2"), element_name("mxfp8", None)
    ('float8_e5m2', 'float8_e4m3fn')
    """
    given = None if element is None else str(element).removeprefix("torch.")
    if scheme == "mxfp4":
        require(
            given in (None, "fp4", "float4_e2m1fn", "e2m1"),
            f"element={given!r}: mxfp4's elements are fp4 e2m1; the element type is "
            "mxfp8's choice (quantize with 'mxfp8' and element='e5m2', or leave element out)",
        )
        return "fp4"
    name = ELEMENTS.get(given or "e4m3")
    require(
        name is not None,
        f"element={given!r}: mxfp8's elements are 'e4m3' (float8_e4m3fn, the default) or "
        "'e5m2' (float8_e5m2); pass one of those",
    )
    return str(name)


class MX(Scheme):
    """MXFP8 (``element="fp8"``) or MXFP4 (``element="fp4"``)."""

    writes = True
    numerics = (
        "code x 2**(e - 127) in float32 (exact unless below float32's subnormals), "
        "rounded once to the requested dtype."
    )
    part_suffixes = ("_scales", "_blocks", "_packed", "weight_scale")
    # convert writes llm-compressor's layout: e8m0 exponents stored as U8
    published_layout = "compressed-tensors"
    row_block = BLOCK
    e8m0_scales = True

    def __init__(self, name: str) -> None:
        self.name = name  # type: ignore[misc]
        self.fp4 = name == "mxfp4"
        own = {"codes": "", "scale": "_scale"}
        if self.fp4:
            self.suffixes = {  # type: ignore[misc]
                "": own,
                "gpt-oss": {"codes": "_blocks", "scale": "_scales"},
                "compressed-tensors": {"codes": "_packed", "scale": "_scale"},
            }
            self.other_layouts = ("gpt-oss",)  # type: ignore[misc]
        else:
            self.suffixes = {"": own, "compressed-tensors": own}  # type: ignore[misc]
            self.elements = ELEMENTS  # type: ignore[misc]
        self.summary = (  # type: ignore[misc]
            "OCP MX: fp4 e2m1 codes two a byte with one e8m0 scale per 32 elements "
            "(torchao MXTensor, compressed-tensors mxfp4-pack-quantized, gpt-oss "
            "NAME_blocks / NAME_scales)."
            if self.fp4
            else "OCP MX: fp8 codes with one e8m0 scale per 32 elements (torchao MXTensor, "
            "compressed-tensors mxfp8-quantized)."
        )

    def claims(self, config: Config) -> bool:
        if self.fp4 and config.method == "mxfp4":
            return True
        return config.method == "compressed-tensors" and _FORMAT[self.name] in config.formats

    def from_subclass(
        self, x: torch.Tensor, inner: Mapping[str, torch.Tensor], attributes: Mapping[str, Any]
    ) -> dict[str, torch.Tensor] | None:
        """torchao's ``MXTensor`` with 32-element blocks and plain (unswizzled) scales."""
        import torch  # a subclass exists: torch is loaded

        fp4x2 = getattr(torch, "float4_e2m1fn_x2", None)
        found = torchao_parts(x, inner)
        if found is None or type(x).__name__ != "MXTensor":
            return None
        if attributes.get("block_size") != BLOCK or attributes.get("is_swizzled_scales"):
            return None
        qdata, scale = found
        elem = attributes.get("elem_dtype")
        if self.fp4:
            fits = elem is not None and elem == fp4x2 and qdata.dtype in (torch.uint8, fp4x2)
        else:
            fits = elem in (torch.float8_e4m3fn, torch.float8_e5m2) and qdata.dtype == elem
        return {"codes": qdata, "scale": scale} if fits else None

    def code_max(self, codes: DTypeRow) -> float | None:
        if self.fp4:
            return 6.0 if codes.name in ("uint8", "float4_e2m1fn") else None
        return FP8_MAX.get(codes.name)

    def stored(
        self,
        name: str,
        shape: tuple[int, ...],
        *,
        block_size: tuple[int, int] | None = None,
        layout: str | None = None,
        element: str | None = None,
    ) -> dict[str, tuple[str, DTypeRow, tuple[int, ...]]]:
        """MX in ``layout`` (compressed-tensors: U8 exponents; gpt-oss: blocks).

        >>> mx = MX("mxfp4")
        >>> {k: (r, row.name, s) for k, (r, row, s) in mx.stored("w", (8, 64)).items()}
        {'w_packed': ('codes', 'uint8', (8, 32)), 'w_scale': ('scale', 'uint8', (8, 2))}
        """
        layout = self.published_layout if layout is None else layout
        names = self.role_suffixes(layout)
        u8 = resolve_dtype("uint8")
        if layout == "gpt-oss":  # [E, in, out] -> blocks [E, out, in / 32, 16]
            *experts, k_in, out = shape
            groups = (*experts, out, k_in // BLOCK)
            return {
                name + names["codes"]: ("codes", u8, (*groups, BLOCK // 2)),
                name + names["scale"]: ("scale", u8, groups),
            }
        *lead, k = shape
        # the scheme's own layout keeps F8_E8M0 scales; compressed-tensors U8 exponents
        e8m0 = resolve_dtype("float8_e8m0fnu") if layout == "ocp" else u8
        scale = ("scale", e8m0, (*lead, k // BLOCK))
        if self.fp4:
            codes = ("codes", u8, (*lead, k // 2))
        else:
            codes = ("codes", resolve_dtype(element_name(self.name, element)), shape)
        return {name + names["codes"]: codes, name + names["scale"]: scale}

    def written_config(
        self, block_size: tuple[int, int] | None, ignored: list[str], layout: str | None
    ) -> dict[str, Any]:
        """compressed-tensors' ``mxfp8-quantized`` / ``mxfp4-pack-quantized``; gpt-oss:
        transformers' ``Mxfp4Config``, as openai/gpt-oss-20b has it."""
        if layout == "gpt-oss":
            extra = [m for m in ignored if m not in GPT_OSS_NOT_CONVERTED]
            return {
                "modules_to_not_convert": [*GPT_OSS_NOT_CONVERTED, *extra],
                "quant_method": "mxfp4",
            }
        bits = 4 if self.fp4 else 8
        return compressed_tensors_config(_FORMAT[self.name], bits, BLOCK, "group", ignored)

    def config_caveat(self, element: str | None) -> str | None:
        if not self.fp4 and element_name(self.name, element) == "float8_e5m2":
            return (
                "compressed-tensors' config has no field for the element type and means "
                "e4m3; the codes are F8_E5M2 in the safetensors header, which "
                "compressed-tensors' decompressor and tensorbridge read, but a reader that "
                "assumes e4m3 gets wrong weights"
            )
        return None

    def detect(
        self, index: Index, config: Config | None, options: Mapping[str, Any]
    ) -> list[Group]:
        groups = []
        for name in index:
            if self.fp4 and name.endswith("_blocks"):
                base = name[: -len("_blocks")]
                require(
                    base + "_scales" in index,
                    f"{name} has no {base}_scales beside it; the checkpoint is incomplete",
                )
                parts = {"codes": name, "scale": base + "_scales"}
                groups.append(self.make_group(base, parts, index, {**options, "layout": "gpt-oss"}))
            elif name.endswith("_scale") and not name.endswith(("input_scale", "output_scale")):
                base = name[: -len("_scale")]
                codes = base + "_packed" if base + "_packed" in index else base
                if codes not in index:
                    continue
                parts = {"codes": codes, "scale": name}
                groups.append(self.make_group(base, parts, index, {**options, "layout": "ocp"}))
        return groups

    def from_names(self, index: Index, options: Mapping[str, Any]) -> list[Group]:
        """An ``F8_E8M0`` ``NAME_scale`` beside this scheme's codes (fp8; mxfp4: ``U8`` or
        ``F4``), and mxfp4's gpt-oss ``NAME_blocks`` / ``NAME_scales``. A ``U8`` scale
        is refused: e8m0 exponents or integer codes, the names cannot say which."""
        codes_dtypes = ("uint8", "float4_e2m1fn") if self.fp4 else ("float8_e4m3fn", "float8_e5m2")
        groups = []
        for name, (row, _) in index.items():
            weight = name[: -len("_blocks")]
            if self.fp4 and name.endswith("_blocks") and weight + "_scales" in index:
                parts = {"codes": name, "scale": weight + "_scales"}
                groups.append(self.make_group(weight, parts, index, {"layout": "gpt-oss"}))
            found = scale_partner(name, index)
            if found is None:
                continue
            weight, codes = found
            if row.name == "uint8":
                raise QuantizationError(
                    f"{name} is U8: it could hold e8m0 exponents (MX) or integer codes, and read "
                    f"the wrong way {codes} is off by up to 2**127; put the checkpoint's "
                    "config.json beside it or pass scheme='mxfp8' / scheme='mxfp4'"
                )
            if row.name == "float8_e8m0fnu" and index[codes][0].name in codes_dtypes:
                parts = {"codes": codes, "scale": name}
                groups.append(self.make_group(weight, parts, index, {"layout": "ocp"}))
        return groups

    def make_group(
        self, name: str, parts: Mapping[str, str], index: Index, options: Mapping[str, Any]
    ) -> Group:
        codes, scale = parts["codes"], parts["scale"]
        (crow, cshape), (srow, sshape) = index[codes], index[scale]
        require(
            srow.name in ("float8_e8m0fnu", "uint8"),
            f"{scale} is {srow.name}; {self.name} scales are e8m0 (F8_E8M0, or U8 exponent bytes)",
        )
        layout = options.get("layout", "ocp")
        packed = crow.name == "uint8"
        if self.fp4:
            require(
                crow.name in ("uint8", "float4_e2m1fn"),
                f"{codes} is {crow.name}; mxfp4 codes are U8 (two a byte) or F4",
            )
        else:
            require(
                crow.name in ("float8_e4m3fn", "float8_e5m2"),
                f"{codes} is {crow.name}; mxfp8 codes are float8_e4m3fn or float8_e5m2",
            )
        if layout == "gpt-oss":
            require(
                self.fp4 and packed and len(cshape) >= 3 and cshape[-1] == BLOCK // 2,
                f"{codes} {shape_text(cshape)} is not gpt-oss MXFP4 blocks ([E, out, G, 16] U8)",
            )
            if tuple(sshape) != tuple(cshape[:-1]):
                raise QuantizationError(
                    f"{scale} {shape_text(sshape)} does not match {codes} "
                    f"{shape_text(cshape)}: gpt-oss keeps one scale per 16-byte block "
                    f"({shape_text(cshape[:-1])}); the checkpoint is corrupt"
                )
            *lead, out, groups, _ = cshape
            shape = (*lead, groups * BLOCK, out)  # the model's [E, in, out]
            return Group(name, self.name, dict(parts), shape, {"layout": layout, "packed": True})
        require(len(cshape) >= 1, f"{codes} is a scalar; {self.name} codes have a last axis")
        k = cshape[-1] * (2 if self.fp4 and packed else 1)
        want = (*cshape[:-1], k // BLOCK)
        if k % BLOCK or tuple(sshape) != want:
            raise QuantizationError(
                f"{scale} {shape_text(sshape)} does not tile {codes} {shape_text(cshape)} "
                f"({k} values a row) in 32-element blocks (that needs {shape_text(want)}"
                f"{'' if k % BLOCK == 0 else ', and a row length divisible by 32'}); "
                "the checkpoint is corrupt or not MX"
            )
        return Group(
            name,
            self.name,
            dict(parts),
            (*cshape[:-1], k),
            {"layout": layout, "packed": packed},
            activation_scales(codes, index),
        )

    def pieces(self, group: Group, parts: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        codes, scale = parts["codes"], parts["scale"]
        if group.options["layout"] == "gpt-oss":
            *lead, groups, out = (*group.shape[:-2], group.shape[-2] // BLOCK, group.shape[-1])
            per = max(1, base.PIECE_ELEMENTS // (BLOCK * out))
            for e in np.ndindex(*lead):
                for g0 in range(0, groups, per):
                    key = (*e, slice(None), slice(g0, min(groups, g0 + per)))
                    yield {"codes": codes[key], "scale": scale[key]}
            return
        k = group.shape[-1]
        rows = 1
        for d in group.shape[:-1]:
            rows *= d
        c2, s2 = codes.reshape(rows, -1), scale.reshape(rows, -1)
        per = max(1, base.PIECE_ELEMENTS // max(1, k))
        for r0 in range(0, rows, per):
            yield {"codes": c2[r0 : r0 + per], "scale": s2[r0 : r0 + per]}

    def block_index(self, group: Group, flat: torch.Tensor) -> torch.Tensor:
        if group.options["layout"] != "gpt-oss":
            return flat // BLOCK
        # output [*lead, in, out], scales [*lead, out, in / 32]: the transpose of the blocks
        k, out = group.shape[-2:]
        lead, rest = flat // (k * out), flat % (k * out)
        return (lead * out + rest % out) * (k // BLOCK) + rest // out // BLOCK

    def kernel(self, parts: Mapping[str, torch.Tensor], group: Group) -> torch.Tensor:
        codes, scale = parts["codes"], e8m0_to_f32(parts["scale"])
        fp4 = self.fp4
        values = fp4_codes_to_f32(codes, group.options["packed"]) if fp4 else fp8_to_f32(codes)
        if group.options["layout"] == "gpt-oss":  # [out, gn, 16] bytes -> [gn * 32, out]
            out_rows, gn = scale.shape
            v = values.reshape(out_rows, gn, BLOCK).mul_(scale[..., None])
            return v.reshape(out_rows, gn * BLOCK).t().contiguous()
        blocks = values.reshape(*scale.shape, BLOCK).mul_(scale[..., None])
        return blocks.reshape(values.shape)

    def quantize(self, x: torch.Tensor, **options: Any) -> dict[str, torch.Tensor]:
        """torchao's ``to_mx`` (FLOOR scale): codes and ``float8_e8m0fnu`` scales.

        ``element`` picks MXFP8's element type (``float8_e4m3fn``, the default, or
        ``float8_e5m2``); ``layout="gpt-oss"`` takes an ``[E, in, out]`` weight and
        gives gpt-oss blocks ``[E, out, G, 16]`` and ``uint8`` scales ``[E, out, G]``;
        ``layout="compressed-tensors"`` gives the scales as ``uint8`` exponents
        (compressed-tensors reads them as integers: ``decompress_mx_scale``).
        """
        import torch

        layout = options.get("layout", "ocp")
        xf = x.detach().to(torch.float32).cpu()
        if layout == "gpt-oss":
            require(self.fp4 and xf.ndim >= 2, "layout='gpt-oss' is mxfp4 of [E, in, out] weights")
            xf = xf.transpose(-1, -2)
        xf = xf.contiguous()
        k = xf.shape[-1] if xf.ndim else 0
        require(
            xf.ndim >= 1 and k % BLOCK == 0,
            f"{self.name} quantizes rows of a multiple of 32 values; got shape "
            f"{shape_text(tuple(xf.shape))} (pad the last axis)",
        )
        element = element_name(self.name, options.get("element"))
        emax, max_pos = _ELEMENT[element]
        blocks = xf.reshape(*xf.shape[:-1], k // BLOCK, BLOCK)
        max_abs = blocks.abs().amax(dim=-1, keepdim=True)
        exp = ((max_abs.view(torch.int32) >> 23) & 0xFF) - 127 - emax
        biased = (exp.clamp(-127, 128) + 127).to(torch.uint8)
        biased = torch.where(torch.isnan(max_abs), torch.full_like(biased, 255), biased)
        scale = (biased.to(torch.int32) << 23).view(torch.float32)
        scale = torch.clamp(scale, min=torch.finfo(torch.float32).tiny)
        # gpt-oss and compressed-tensors store the e8m0 exponents as U8
        as_bytes = layout in ("gpt-oss", "compressed-tensors")
        if options.get("scales_only"):
            scales_only = biased.squeeze(-1)
            return {"scale": scales_only if as_bytes else scales_only.view(torch.float8_e8m0fnu)}
        scaled = blocks / scale
        if self.fp4:
            out = fp4_encode(scaled.reshape(xf.shape), packed=True)
        else:
            dt = getattr(torch, element)
            out = torch.clamp(scaled, -max_pos, max_pos).to(dt).reshape(xf.shape)
        scales = biased.squeeze(-1)
        if layout == "gpt-oss":
            return {
                "codes": out.reshape(*out.shape[:-1], k // BLOCK, BLOCK // 2),
                "scale": scales,
            }
        return {"codes": out, "scale": scales if as_bytes else scales.view(torch.float8_e8m0fnu)}

"""NVFP4: fp4 e2m1 codes, one fp8 e4m3 scale per 16 elements, one float32 global scale.

Two toolkits write it with different names and *reciprocal* global scales, so the
convention comes from the config, never from the tensors:

* **ModelOpt** (NVIDIA TensorRT Model Optimizer; ``hf_quant_config.json`` with
  ``quant_algo: "NVFP4"``, or ``config.json`` ``quant_method: "modelopt"``, e.g.
  nvidia/Llama-3.1-8B-Instruct-FP4): ``NAME`` ``U8 [out, in / 2]``, ``NAME_scale``
  ``F8_E4M3 [out, in / 16]``, ``NAME_scale_2`` ``F32 []``; value =
  ``code * (scale * scale_2)``. ``input_scale`` is dropped and listed.
* **compressed-tensors** (``format: "nvfp4-pack-quantized"``, llm-compressor's
  NVFP4 exports): ``..._packed`` ``U8 [out, in / 2]``, ``..._scale``
  ``F8_E4M3 [out, in / 16]``, ``..._global_scale`` ``F32 [1]``; value =
  ``code * (scale / global_scale)``. ``input_global_scale`` is dropped and listed.

Element ``2j`` sits in the low nibble of byte ``j`` in both.

Numerics: the block's scale (``scale * scale_2``, or ``scale / global_scale``) is
formed in float32 as each toolkit forms it (one float32 rounding), the product with
the code is exact, and the result is rounded once to the requested dtype.
Quantizing follows torchao's ``nvfp4_quantize`` with a per-tensor scale
``amax / (448 * 6)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ..dtypes import DTypeRow, resolve_dtype
from ..errors import QuantizationError
from . import base
from .base import (
    ACTIVATION_SCALES,
    Config,
    Group,
    Index,
    Scheme,
    compressed_tensors_config,
    fp4_codes_to_f32,
    fp4_encode,
    require,
    scale_partner,
    shape_text,
    torchao_parts,
)
from .fp8_scaled import activation_scales

if TYPE_CHECKING:
    import torch

__all__ = ["NVFP4"]

BLOCK = 16
_F4_MAX, _E4M3_MAX = 6.0, 448.0
_NAMES = {  # convention -> (codes suffix, global-scale suffix)
    "modelopt": ("", "_scale_2"),
    "compressed-tensors": ("_packed", "_global_scale"),
}


class NVFP4(Scheme):
    """NVFP4 in one toolkit's convention (``"modelopt"`` or ``"compressed-tensors"``)."""

    writes = True
    row_block = BLOCK
    per_tensor_amax = True
    ambiguous: ClassVar[Mapping[str, str]] = {
        "nvfp4": "scheme='nvfp4' does not say whose convention: ModelOpt multiplies by "
        "weight_scale_2, compressed-tensors divides by weight_global_scale; pass "
        "scheme='nvfp4-modelopt' or scheme='nvfp4-compressed-tensors'"
    }

    def __init__(self, convention: str) -> None:
        self.convention = convention
        self.name = f"nvfp4-{convention}"  # type: ignore[misc]
        codes, glob = _NAMES[convention]
        self.aliases = ("nvfp4-ct",) if convention == "compressed-tensors" else ()  # type: ignore[misc]
        self.part_suffixes = (*((codes,) if codes else ()), glob, "weight_scale")  # type: ignore[misc]
        self.suffixes = {  # type: ignore[misc]
            "": {"codes": codes, "scale": "_scale", "global_scale": glob}
        }
        op = "x (scale x scale_2)" if convention == "modelopt" else "x (scale / global_scale)"
        self.summary = (  # type: ignore[misc]
            f"fp4 codes (NAME{codes}, U8 two a byte), fp8 e4m3 scale per 16 (NAME_scale), "
            f"float32 NAME{glob}; value = code {op}."
        )
        self.numerics = (  # type: ignore[misc]
            "the block scale in float32 as the toolkit forms it, x code (exact), rounded "
            "once to the requested dtype."
        )

    def claims(self, config: Config) -> bool:
        if self.convention == "modelopt":
            return config.method == "modelopt" and config.algo == "NVFP4"
        return config.method == "compressed-tensors" and "nvfp4-pack-quantized" in config.formats

    def from_subclass(
        self, x: torch.Tensor, inner: Mapping[str, torch.Tensor], attributes: Mapping[str, Any]
    ) -> dict[str, torch.Tensor] | None:
        """torchao's ``NVFP4Tensor`` (16-element blocks, plain scales, none or one
        per-tensor scale, which multiplies: ModelOpt's convention)."""
        import torch  # a subclass exists: torch is loaded

        fp4x2 = getattr(torch, "float4_e2m1fn_x2", None)
        found = torchao_parts(x, inner)
        if found is None or type(x).__name__ != "NVFP4Tensor" or self.convention != "modelopt":
            return None
        qdata, scale = found
        glob = inner.get("per_tensor_scale")
        if (
            attributes.get("block_size") != BLOCK
            or attributes.get("is_swizzled_scales")
            or qdata.dtype not in (torch.uint8, fp4x2)
            or (glob is not None and glob.numel() != 1)
        ):
            return None
        one = torch.ones((), dtype=torch.float32)
        return {
            "codes": qdata,
            "scale": scale,
            "global_scale": one if glob is None else glob.reshape(()),
        }

    def code_max(self, codes: DTypeRow) -> float | None:
        return 6.0 if codes.name in ("uint8", "float4_e2m1fn") else None

    def stored(
        self,
        name: str,
        shape: tuple[int, ...],
        *,
        block_size: tuple[int, int] | None = None,
        layout: str | None = None,
        element: str | None = None,
    ) -> dict[str, tuple[str, DTypeRow, tuple[int, ...]]]:
        names = self.role_suffixes(layout)
        *lead, k = shape
        u8, e4m3, f32 = (resolve_dtype(n) for n in ("uint8", "float8_e4m3fn", "float32"))
        return {
            name + names["codes"]: ("codes", u8, (*lead, k // 2)),
            name + names["scale"]: ("scale", e4m3, (*lead, k // BLOCK)),
            name + names["global_scale"]: (
                "global_scale",
                f32,
                () if self.convention == "modelopt" else (1,),
            ),
        }

    def written_config(
        self, block_size: tuple[int, int] | None, ignored: list[str], layout: str | None
    ) -> dict[str, Any]:
        """ModelOpt's ``quant_algo: "NVFP4"``; compressed-tensors' ``nvfp4-pack-quantized``."""
        if self.convention == "modelopt":
            return {
                "quant_method": "modelopt",
                "quant_algo": "NVFP4",
                "group_size": BLOCK,
                "ignore": ignored,
            }
        return compressed_tensors_config("nvfp4-pack-quantized", 4, BLOCK, "tensor_group", ignored)

    def from_names(self, index: Index, options: Mapping[str, Any]) -> list[Group]:
        """None: names never say whose convention (the global scales are reciprocal), so
        a global scale, or fp4 codes beside an ``F8_E4M3`` block scale, is refused."""
        for name, (row, _) in index.items():
            if name.endswith(("_scale_2", "_global_scale")) and not name.endswith(
                ACTIVATION_SCALES
            ):
                raise QuantizationError(
                    f"{name} looks like an NVFP4 global scale, but no config says whose "
                    "convention (ModelOpt multiplies, compressed-tensors divides by the "
                    "reciprocal): put config.json / hf_quant_config.json beside the checkpoint "
                    "or pass scheme='nvfp4-modelopt' or scheme='nvfp4-compressed-tensors'"
                )
            found = scale_partner(name, index)
            if found is None or row.name != "float8_e4m3fn":
                continue
            codes = found[1]
            if index[codes][0].name in ("uint8", "float4_e2m1fn"):
                raise QuantizationError(
                    f"{codes} with fp8 block scales {name} looks like NVFP4, whose convention "
                    "is never guessed; put the config beside the checkpoint or pass "
                    "scheme='nvfp4-modelopt' or scheme='nvfp4-compressed-tensors'"
                )
        return []

    def detect(
        self, index: Index, config: Config | None, options: Mapping[str, Any]
    ) -> list[Group]:
        codes_suffix, glob_suffix = _NAMES[self.convention]
        groups = []
        for name, (row, _) in index.items():
            if not name.endswith("_scale") or row.name != "float8_e4m3fn":
                continue
            base = name[: -len("_scale")]
            codes = base + codes_suffix
            if codes not in index:
                continue
            glob = base + glob_suffix
            if glob not in index:
                other = (
                    base
                    + _NAMES["modelopt" if self.convention != "modelopt" else "compressed-tensors"][
                        1
                    ]
                )
                hint = (
                    f" ({other} is there: the config says {self.convention} but the names are the "
                    "other toolkit's; pass the matching scheme=)"
                    if other in index
                    else ""
                )
                raise QuantizationError(
                    f"{codes} has block scales {name} but no global scale {glob}{hint}; without "
                    "it every value is off by a constant factor: the checkpoint is incomplete"
                )
            parts = {"codes": codes, "scale": name, "global_scale": glob}
            groups.append(self.make_group(base, parts, index, options))
        return groups

    def make_group(
        self, name: str, parts: Mapping[str, str], index: Index, options: Mapping[str, Any]
    ) -> Group:
        codes, scale = parts["codes"], parts["scale"]
        if "global_scale" not in parts:
            what = "weight_scale_2" if self.convention == "modelopt" else "weight_global_scale"
            raise QuantizationError(
                f"{codes} has no global scale; pass global_scale= (NVFP4 needs the float32 {what})"
            )
        (crow, cshape), (srow, sshape) = index[codes], index[scale]
        grow, gshape = index[parts["global_scale"]]
        require(
            crow.name in ("uint8", "float4_e2m1fn"),
            f"{codes} is {crow.name}; NVFP4 codes are U8 (two a byte) or F4",
        )
        require(
            srow.name == "float8_e4m3fn", f"{scale} is {srow.name}; NVFP4 block scales are F8_E4M3"
        )
        require(
            grow.name in ("float32", "bfloat16", "float16") and _count(gshape) == 1,
            f"{parts['global_scale']} is {grow.name} {shape_text(gshape)}; NVFP4's global scale "
            "is one float32",
        )
        packed = crow.name == "uint8"
        require(len(cshape) >= 1, f"{codes} is a scalar; NVFP4 codes have a last axis")
        k = cshape[-1] * (2 if packed else 1)
        want = (*cshape[:-1], k // BLOCK)
        if k % BLOCK or tuple(sshape) != want:
            raise QuantizationError(
                f"{scale} {shape_text(sshape)} does not tile {codes} {shape_text(cshape)} "
                f"({k} values a row) in 16-element blocks (that needs {shape_text(want)}); "
                "the export is broken (a swizzled or padded scale layout?)"
            )
        return Group(
            name,
            self.name,
            dict(parts),
            (*cshape[:-1], k),
            {"packed": packed},
            activation_scales(codes, index),
        )

    def pieces(self, group: Group, parts: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        k = group.shape[-1]
        rows = _count(group.shape[:-1])
        c2, s2 = parts["codes"].reshape(rows, -1), parts["scale"].reshape(rows, -1)
        per = max(1, base.PIECE_ELEMENTS // max(1, k))
        for r0 in range(0, rows, per):
            yield {
                "codes": c2[r0 : r0 + per],
                "scale": s2[r0 : r0 + per],
                "global_scale": parts["global_scale"],
            }

    def block_index(self, group: Group, flat: torch.Tensor) -> torch.Tensor:
        return flat // BLOCK

    def kernel(self, parts: Mapping[str, torch.Tensor], group: Group) -> torch.Tensor:
        import torch

        values = fp4_codes_to_f32(parts["codes"], group.options["packed"])
        s = parts["scale"].to(torch.float32)
        g = parts["global_scale"].to(torch.float32).reshape(())
        block = s * g if self.convention == "modelopt" else s / g
        return values.reshape(*s.shape, BLOCK).mul_(block[..., None]).reshape(values.shape)

    def quantize(self, x: torch.Tensor, **options: Any) -> dict[str, torch.Tensor]:
        """torchao's ``nvfp4_quantize`` with ``per_tensor_scale = amax / (448 * 6)``.

        ``amax`` (the whole weight's largest magnitude) lets a weight be quantized a
        slice of rows at a time with the global scale of the whole.

        Returns packed ``uint8`` codes, ``float8_e4m3fn`` block scales and the global
        scale in this convention (ModelOpt: ``scale_2 = amax / 2688``;
        compressed-tensors: ``global_scale = 2688 / amax``, its reciprocal).
        """
        import torch

        xf = x.detach().to(torch.float32).cpu().contiguous()
        require(
            xf.ndim >= 1 and xf.shape[-1] % BLOCK == 0,
            f"NVFP4 quantizes rows of a multiple of 16 values; got {shape_text(tuple(xf.shape))}",
        )
        amax = options.get("amax")
        amax = xf.abs().amax() if amax is None else torch.as_tensor(amax, dtype=torch.float32)
        per_tensor = amax / (_E4M3_MAX * _F4_MAX)
        blocks = xf.reshape(-1, xf.shape[-1] // BLOCK, BLOCK)
        block_scale = blocks.abs().amax(dim=-1) / _F4_MAX
        scaled_block = block_scale / per_tensor
        eps = torch.finfo(torch.float8_e4m3fn).tiny
        fp8 = torch.clamp(scaled_block, min=eps, max=_E4M3_MAX).to(torch.float8_e4m3fn)
        glob = per_tensor if self.convention == "modelopt" else 1.0 / per_tensor
        gshape = () if self.convention == "modelopt" else (1,)
        scale = fp8.reshape(*xf.shape[:-1], -1)
        global_scale = glob.reshape(gshape).to(torch.float32)
        if options.get("scales_only"):
            return {"scale": scale, "global_scale": global_scale}
        reciprocal = (1.0 / per_tensor) / fp8.to(torch.float32)
        scaled = torch.clamp(blocks * reciprocal[..., None], -_F4_MAX, _F4_MAX)
        packed = fp4_encode(scaled.reshape(xf.shape), packed=True)
        return {"codes": packed, "scale": scale, "global_scale": global_scale}


def _count(shape: Any) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n

"""compressed-tensors ``pack-quantized``: signed int4 / int8 codes packed in int32.

Stored (llm-compressor's W4A16 / W8A16 exports, e.g. RedHatAI/...-quantized.w4a16;
``quant_method: "compressed-tensors"``, ``format: "pack-quantized"``):
``P.weight_packed`` ``I32 [out, in * bits / 32]`` (element ``i`` at bits
``[i * bits, (i + 1) * bits)``, stored as ``code + 2**(bits - 1)``), ``P.weight_scale``
``[out, in / group_size]`` (group) or ``[out, 1]`` (channel), ``P.weight_shape``
``I64 [2]``, for asymmetric schemes ``P.weight_zero_point`` packed the same way along
the *output* axis ``[out * bits / 32, groups]``, and for activation ordering
``P.weight_g_idx`` ``[in]``. Value: ``(code - zero) * scale``. 4 and 8 bits are read;
other widths (packed across word boundaries) are refused.

Numerics: ``(code - zero) * scale`` in float32 (exact), rounded once to the requested
dtype; compressed-tensors computes in the scale's dtype, one rounding too: bit-exact.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import QuantizationError
from . import base
from .base import (
    Config,
    Group,
    Index,
    Scheme,
    as_torch,
    group_index,
    group_scale_,
    int_codes_f32,
    require,
    shape_text,
)

if TYPE_CHECKING:
    import torch

__all__ = ["PackQuantized"]


class PackQuantized(Scheme):
    name = "pack-quantized"
    summary = (
        "compressed-tensors int4/int8 (weight_packed I32 [out, in*bits/32], weight_scale "
        "per group or channel, optional packed weight_zero_point and weight_g_idx)."
    )
    numerics = "(code - zero) x scale in float32 (exact), rounded once to the requested dtype."
    part_suffixes = ("_packed", "weight_scale", "weight_shape", "weight_zero_point", "g_idx")

    def claims(self, config: Config) -> bool:
        return config.method == "compressed-tensors" and "pack-quantized" in config.formats

    def detect(
        self, index: Index, config: Config | None, options: Mapping[str, Any]
    ) -> list[Group]:
        weights = _weight_args(config) if config is not None else {}
        opts = {
            "bits": int(options.get("bits", weights.get("num_bits", 4))),
            "group_size": options.get("group_size", weights.get("group_size")),
        }
        groups = []
        for name in index:
            if not name.endswith("weight_packed"):
                continue
            base_name = name[: -len("_packed")]
            parts = {"codes": name, "scale": base_name + "_scale"}
            for role, suffix in (
                ("zeros", "_zero_point"),
                ("g_idx", "_g_idx"),
                ("shape", "_shape"),
            ):
                if base_name + suffix in index:
                    parts[role] = base_name + suffix
            groups.append(self.make_group(base_name, parts, index, opts))
        return groups

    def make_group(
        self, name: str, parts: Mapping[str, str], index: Index, options: Mapping[str, Any]
    ) -> Group:
        codes, scale = parts["codes"], parts["scale"]
        bits = int(options.get("bits", 4))
        require(
            bits in (4, 8),
            f"{codes}: {bits}-bit pack-quantized codes straddle int32 words; tensorbridge "
            "reads 4 and 8 bits (decompress others with compressed-tensors)",
        )
        require(scale in index, f"{codes} has no {scale} beside it; the checkpoint is incomplete")
        (crow, cshape), (srow, sshape) = index[codes], index[scale]
        require(
            crow.name == "int32" and len(cshape) == 2,
            f"{codes} is {crow.name} {shape_text(cshape)}; pack-quantized codes are int32 matrices",
        )
        out, cols = cshape[0], cshape[1] * (32 // bits)
        require(
            len(sshape) == 2 and sshape[0] == out and sshape[1] >= 1 and srow.is_floating,
            f"{scale} {srow.name} {shape_text(sshape)} is not a float scale per output row "
            f"of {codes} ({out} rows)",
        )
        gs = options.get("group_size")
        gs = int(gs) if gs else -(-cols // sshape[1])
        if -(-cols // gs) != sshape[1]:
            raise QuantizationError(
                f"{scale} {shape_text(sshape)} does not tile {codes} ({cols} inputs) in groups "
                f"of {gs}; check group_size in the config"
            )
        if "zeros" in parts:
            zrow, zshape = index[parts["zeros"]]
            want = (-(-out * bits // 32), sshape[1])
            require(
                zrow.name == "int32" and tuple(zshape) == want,
                f"{parts['zeros']} {zrow.name} {shape_text(zshape)} is not zero points packed "
                f"along the output axis ({shape_text(want)})",
            )
        if "g_idx" in parts:
            gshape = index[parts["g_idx"]][1]
            require(
                tuple(gshape) == (cols,),
                f"{parts['g_idx']} {shape_text(gshape)} is not one group per input column "
                f"([{cols}])",
            )
        return Group(name, self.name, dict(parts), (out, cols), {"bits": bits, "group_size": gs})

    def check_values(self, group: Group, parts: Mapping[str, Any], where: str) -> None:
        if "g_idx" in parts:  # scales are [out, groups]
            groups = as_torch(parts["scale"]).shape[1]
            group_index(as_torch(parts["g_idx"]), groups, f"{where}: {group.parts['g_idx']}")

    def pieces(self, group: Group, parts: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        bits = group.options["bits"]
        per = 32 // bits
        out, cols = group.shape
        step = max(per, base.PIECE_ELEMENTS // max(1, cols) // per * per)
        for o0 in range(0, out, step):
            o1 = min(out, o0 + step)
            piece = {"codes": parts["codes"][o0:o1], "scale": parts["scale"][o0:o1]}
            if "zeros" in parts:
                piece["zeros"] = parts["zeros"][o0 // per : -(-o1 // per)]
            if "g_idx" in parts:
                piece["g_idx"] = parts["g_idx"]
            yield piece

    def kernel(self, parts: Mapping[str, torch.Tensor], group: Group) -> torch.Tensor:
        import torch

        bits, gs = group.options["bits"], group.options["group_size"]
        offset = 1 << (bits - 1)
        w = int_codes_f32(parts["codes"], bits, offset)[:, : group.shape[1]]
        rows = w.shape[0]
        zero = None
        if "zeros" in parts:  # packed along the output axis, stored + offset like the codes
            z = int_codes_f32(parts["zeros"].t().contiguous(), bits, offset)[:, :rows]
            zero = z.t()
        g: torch.Tensor | int = int(gs)
        if "g_idx" in parts:
            g = group_index(parts["g_idx"], parts["scale"].shape[1], group.parts["g_idx"])
        return group_scale_(w, g, parts["scale"].to(torch.float32), zero)


def _weight_args(config: Config) -> dict[str, Any]:
    """The ``weights`` quantization args of the config's pack-quantized groups (one set)."""
    groups = config.data.get("config_groups")
    found = []
    if isinstance(groups, Mapping):
        for g in groups.values():
            fmt = g.get("format", config.data.get("format")) if isinstance(g, Mapping) else None
            if (
                isinstance(g, Mapping)
                and isinstance(g.get("weights"), Mapping)
                and fmt
                in (
                    None,
                    "pack-quantized",
                )
            ):
                found.append(dict(g["weights"]))
    keys = ("num_bits", "group_size", "strategy", "symmetric")
    distinct = {tuple(w.get(k) for k in keys) for w in found}
    if len(distinct) > 1:
        raise QuantizationError(
            f"{config.source} has pack-quantized groups with different weight args "
            f"({sorted(map(str, distinct))}); pass scheme= with bits= and group_size= per "
            "layer, or decompress it with compressed-tensors"
        )
    return found[0] if found else {}

"""GPTQ: integer codes packed in int32, one scale and zero point per group of input rows.

Stored (AutoGPTQ / GPTQModel / transformers, ``quant_method: "gptq"``, e.g.
TheBloke/Llama-2-7B-GPTQ): ``P.qweight`` ``I32 [in * bits / 32, out]`` (input row
``r * (32 / bits) + j`` of column ``o`` in bits ``[j * bits, (j + 1) * bits)`` of
``qweight[r, o]``), ``P.qzeros`` ``I32 [groups, out * bits / 32]`` (packed along the
output axis the same way), ``P.scales`` ``F16 [groups, out]``, optional ``P.g_idx``
``I32 [in]`` (each input row's group; act-order / ``desc_act`` checkpoints permute it,
otherwise row ``i`` is in group ``i // group_size``). The model loads ``P.weight``
``[out, in]``: ``scale * (code - zero)``, transposed. 3-bit codes (AutoGPTQ's
``pack``) do not divide a word: every 3 words along the packed axis are one
little-endian stream of 32 codes (code ``k`` at bits ``[3k, 3k + 3)``, codes 10 and
21 straddling a word boundary), for ``qweight`` and ``qzeros`` alike.

Zero points: AutoGPTQ's format (``checkpoint_format: "gptq"``, v1) stores
``(zero - 1) & mask`` (a zero of 0 is stored as 15 at 4 bits); GPTQModel's
``gptq_v2`` stores the zero itself and always says so. A config naming no format is
v1: transformers' ``GPTQConfig`` defaults ``format`` to ``"gptq"`` (and reads a
legacy ``checkpoint_format`` over it), as AutoGPTQ's ``BaseQuantizeConfig`` defaulted
``checkpoint_format``; AutoGPTQ <= 0.7.1 wrote ``is_marlin_format: true`` for Marlin
checkpoints instead. Only a config that contradicts itself (``format`` and
``checkpoint_format`` naming different formats, or ``is_marlin_format`` beside a
non-Marlin format) is refused.

Numerics: ``scale * (code - zero)`` in float32 (exact: a small integer times an fp16
scale), rounded once to the requested dtype.
"""

from __future__ import annotations

import math
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
    packed_words,
    require,
    shape_text,
    unpack_int32,
)

if TYPE_CHECKING:
    import torch

__all__ = ["GPTQ"]

_FORMATS = ("gptq", "gptq_v2")
# transformers' GPTQConfig.__init__ (utils/quantization_config.py): ``format: str = "gptq"``
DEFAULT_FORMAT = "gptq"


def checkpoint_format(data: Mapping[str, Any]) -> str | None:
    """The GPTQ format a config names (lower-cased), or None where it names none.

    ``checkpoint_format`` (AutoGPTQ, older exports) and ``format`` (transformers 5,
    GPTQModel) are the same setting; ``is_marlin_format: true`` is AutoGPTQ <= 0.7.1's
    spelling of ``"marlin"``. Two of them naming different formats is refused.

    >>> checkpoint_format({"bits": 4, "sym": False}) is None
    True
    >>> checkpoint_format({"format": "GPTQ_V2"})
    'gptq_v2'
    """
    said = {
        key: str(data[key]).lower()
        for key in ("checkpoint_format", "format")
        if data.get(key) is not None
    }
    if data.get("is_marlin_format") is True:
        said["is_marlin_format"] = "marlin"
    if len(set(said.values())) > 1:
        given = ", ".join(f"{k}: {data[k]!r}" for k in said)
        raise QuantizationError(
            f"the GPTQ config contradicts itself ({given}); keep the one that names the "
            "checkpoint's format and remove the others"
        )
    return next(iter(said.values()), None)


class GPTQ(Scheme):
    name = "gptq"
    summary = (
        "int2/3/4/8 codes packed in int32 (P.qweight [in*bits/32, out]), per-group fp16 "
        "scales and packed zeros, optional act-order g_idx; loads as P.weight [out, in]."
    )
    numerics = "scale x (code - zero) in float32 (exact), rounded once to the requested dtype."
    part_suffixes = ("qweight", "qzeros", "g_idx")

    def claims(self, config: Config) -> bool:
        return config.method == "gptq"

    def from_names(self, index: Index, options: Mapping[str, Any]) -> list[Group]:
        """None: ``P.qweight`` is GPTQ's name and AWQ's, whose packings differ, so it is
        refused (for both: the registry asks GPTQ first)."""
        packed = next((n for n in index if n.endswith(".qweight")), None)
        if packed is not None:
            raise QuantizationError(
                f"{packed} is int-packed (GPTQ or AWQ, which pack along different axes and "
                "store zeros differently); put the checkpoint's config.json or "
                "quantize_config.json beside it, or pass scheme='gptq' / scheme='awq'"
            )
        return []

    def detect(
        self, index: Index, config: Config | None, options: Mapping[str, Any]
    ) -> list[Group]:
        data = config.data if config is not None else {}
        opts = {
            "bits": options.get("bits", data.get("bits", 4)),
            "group_size": options.get("group_size", data.get("group_size", 128)),
            "format": options.get(
                "checkpoint_format",
                checkpoint_format(data)
                if config is None or self.claims(config)
                else data.get("checkpoint_format"),
            ),
        }
        groups = []
        for name in index:
            if not name.endswith(".qweight"):
                continue
            base = name[: -len("qweight")]
            parts = {"codes": name}
            for role, suffix in (("zeros", "qzeros"), ("scale", "scales"), ("g_idx", "g_idx")):
                if base + suffix in index:
                    parts[role] = base + suffix
            groups.append(self.make_group(base + "weight", parts, index, opts))
        return groups

    def make_group(
        self, name: str, parts: Mapping[str, str], index: Index, options: Mapping[str, Any]
    ) -> Group:
        codes = parts["codes"]
        bits = int(options.get("bits", 4))
        require(
            bits in (2, 3, 4, 8),
            f"{codes}: {bits}-bit GPTQ is not a width AutoGPTQ / GPTQModel write (2, 3, 4 and "
            "8 bits are read); check bits in the config, or dequantize it with GPTQModel",
        )
        missing = [r for r in ("zeros", "scale") if r not in parts]
        require(
            not missing,
            f"{codes} has no {' or '.join(missing)} beside it; the checkpoint is incomplete",
        )
        fmt = str(options.get("format") or DEFAULT_FORMAT).lower()
        require(
            fmt in _FORMATS,
            f"checkpoint_format {fmt!r} is not one tensorbridge reads; it reads 'gptq' "
            "(AutoGPTQ, zeros stored minus 1) and 'gptq_v2' (GPTQModel): dequantize "
            f"{fmt!r} checkpoints (Marlin, BitBLAS, ...) with GPTQModel, or export them as "
            "'gptq'",
        )
        per = 32 // bits
        (crow, cshape), (zrow, zshape), (srow, sshape) = (
            index[parts[r]] for r in ("codes", "zeros", "scale")
        )
        require(
            crow.name == "int32" and zrow.name == "int32" and len(cshape) == 2,
            f"{codes} {crow.name} {shape_text(cshape)} / {parts['zeros']} {zrow.name}: GPTQ packs "
            "codes and zeros in int32 matrices",
        )
        require(
            per * bits == 32 or cshape[0] % bits == 0,
            f"{codes} has {cshape[0]} rows: {bits}-bit codes come in runs of {bits} words "
            f"(32 codes each); the tensor is truncated or not {bits}-bit",
        )
        rows_in, out = (cshape[0] * per if per * bits == 32 else cshape[0] // bits * 32), cshape[1]
        gs = int(options.get("group_size", 128))
        gs = rows_in if gs <= 0 else gs
        n_groups = math.ceil(rows_in / gs) if "g_idx" not in parts else sshape[0]
        want_s, want_z = (n_groups, out), (n_groups, packed_words(out, bits))
        if tuple(sshape) != want_s or tuple(zshape) != want_z:
            raise QuantizationError(
                f"{parts['scale']} {shape_text(sshape)} / {parts['zeros']} {shape_text(zshape)} "
                f"do not fit {codes} {shape_text(cshape)} ({rows_in} inputs, {bits}-bit, group "
                f"size {gs}: that needs {shape_text(want_s)} / {shape_text(want_z)}); check bits "
                "and group_size in the config"
            )
        if "g_idx" in parts:
            require(
                tuple(index[parts["g_idx"]][1]) == (rows_in,),
                f"{parts['g_idx']} {shape_text(index[parts['g_idx']][1])} is not one group per "
                f"input row ([{rows_in}])",
            )
        require(srow.is_floating, f"{parts['scale']} is {srow.name}; GPTQ scales are floats")
        opts = {"bits": bits, "group_size": gs, "format": fmt}
        return Group(name, self.name, dict(parts), (out, rows_in), opts)

    def check_values(self, group: Group, parts: Mapping[str, Any], where: str) -> None:
        if "g_idx" in parts:  # scales are [groups, out]
            groups = as_torch(parts["scale"]).shape[0]
            group_index(as_torch(parts["g_idx"]), groups, f"{where}: {group.parts['g_idx']}")

    def pieces(self, group: Group, parts: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        bits = group.options["bits"]
        per = 32 // bits if 32 % bits == 0 else 32  # output columns a run of zero words holds
        words = packed_words(per, bits)
        out, rows_in = group.shape
        step = max(per, base.PIECE_ELEMENTS // max(1, rows_in) // per * per)
        for o0 in range(0, out, step):
            o1 = min(out, o0 + step)
            piece = {
                "codes": parts["codes"][:, o0:o1],
                "zeros": parts["zeros"][:, o0 // per * words : -(-o1 // per) * words],
                "scale": parts["scale"][:, o0:o1],
            }
            if "g_idx" in parts:
                piece["g_idx"] = parts["g_idx"]
            yield piece

    def kernel(self, parts: Mapping[str, torch.Tensor], group: Group) -> torch.Tensor:
        import torch

        bits, gs, fmt = (group.options[k] for k in ("bits", "group_size", "format"))
        cols = parts["scale"].shape[1]
        q = unpack_int32(parts["codes"].t().contiguous(), bits)  # [cols, in]
        z = unpack_int32(parts["zeros"], bits)[:, :cols]  # [groups, cols]
        if fmt != "gptq_v2":  # v1 stored (zero - 1) & mask: zero 0 comes back from 15
            z = (z + 1) & ((1 << bits) - 1)
        rows_in = q.shape[1]
        g: torch.Tensor | int = int(gs)
        if "g_idx" in parts:
            g_idx = group_index(parts["g_idx"], parts["scale"].shape[0], group.parts["g_idx"])
            plain = g_idx.numel() == rows_in and torch.equal(g_idx, torch.arange(rows_in) // gs)
            g = g if plain else g_idx  # act-order: a gather; otherwise a broadcast
        w = q.to(torch.float32)
        return group_scale_(w, g, parts["scale"].to(torch.float32).t(), z.to(torch.float32).t())

"""AWQ (AutoAWQ's GEMM layout): int4 codes packed in int32 along the output axis, interleaved.

Stored (``quant_method: "awq"``, ``version: "gemm"``, e.g.
TheBloke/Llama-2-7B-AWQ): ``P.qweight`` ``I32 [in, out / 8]``, ``P.qzeros``
``I32 [in / group, out / 8]``, ``P.scales`` ``F16 [in / group, out]``. Each int32 holds
eight output columns, **not in order**: bits ``[4j, 4j + 4)`` hold column
``AWQ_ORDER[j]`` of its run of eight, ``AWQ_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]`` (read
in order, every column lands in the wrong place). The model loads ``P.weight``
``[out, in]``: ``(code - zero) * scale``, transposed. Other AWQ versions (GEMV,
exllama, Marlin) are refused.

Numerics: ``(code - zero) * scale`` in float32 (exact), rounded once to the requested
dtype (AutoAWQ's ``dequantize_gemm`` computes in fp16).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import QuantizationError
from . import base
from .base import Config, Group, Index, Scheme, group_scale_, int_codes_f32, require, shape_text

if TYPE_CHECKING:
    import torch

__all__ = ["AWQ", "AWQ_ORDER"]

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
_PER = 8


class AWQ(Scheme):
    name = "awq"
    summary = (
        "AutoAWQ GEMM: int4 codes packed 8 a word along the output axis in the order "
        "[0, 2, 4, 6, 1, 3, 5, 7] (P.qweight [in, out/8]), per-group zeros and fp16 scales."
    )
    numerics = "(code - zero) x scale in float32 (exact), rounded once to the requested dtype."
    part_suffixes = ("qweight", "qzeros")

    def claims(self, config: Config) -> bool:
        return config.method == "awq"

    def detect(
        self, index: Index, config: Config | None, options: Mapping[str, Any]
    ) -> list[Group]:
        data = config.data if config is not None else {}
        # AutoAWQ writes "version"; transformers 5's AwqConfig "format"
        given = options.get("version", data.get("version", data.get("format", "gemm")))
        version = str(given).lower()
        if version == "exllama":
            raise QuantizationError(
                "AWQ version 'exllama' names a kernel, not a layout: AutoAWQ loads GEMM "
                "checkpoints with it; if the tensors are GEMM's (qweight I32 [in, out / 8]) "
                "set version to 'gemm' in the config (tensorbridge reads only GEMM)"
            )
        if version != "gemm":
            raise QuantizationError(
                f"AWQ version {version!r} packs codes differently from the GEMM layout, the "
                "only one tensorbridge reads (GEMV, GEMV-fast, Marlin and llm-awq are not); "
                "dequantize it with AutoAWQ / GPTQModel, or export it as GEMM"
            )
        opts = {
            "bits": options.get("bits", data.get("bits", data.get("w_bit", 4))),
            "group_size": options.get(
                "group_size", data.get("group_size", data.get("q_group_size", 128))
            ),
        }
        groups = []
        for name in index:
            if name.endswith(".qweight"):
                base = name[: -len("qweight")]
                parts = {"codes": name, "zeros": base + "qzeros", "scale": base + "scales"}
                groups.append(self.make_group(base + "weight", parts, index, opts))
        return groups

    def make_group(
        self, name: str, parts: Mapping[str, str], index: Index, options: Mapping[str, Any]
    ) -> Group:
        codes = parts["codes"]
        require(int(options.get("bits", 4)) == 4, f"{codes}: AWQ's GEMM layout is 4-bit")
        missing = [parts[r] for r in ("zeros", "scale") if parts[r] not in index]
        if missing:
            raise QuantizationError(
                f"{codes} has no {missing[0]} beside it; the checkpoint is incomplete"
            )
        (crow, cshape), (zrow, zshape), (srow, sshape) = (
            index[parts[r]] for r in ("codes", "zeros", "scale")
        )
        require(
            crow.name == "int32" and zrow.name == "int32" and len(cshape) == 2,
            f"{codes} {crow.name} {shape_text(cshape)}: AWQ packs codes and zeros in int32 "
            "matrices",
        )
        rows_in, out = cshape[0], cshape[1] * _PER
        gs = int(options.get("group_size", 128))
        gs = rows_in if gs <= 0 else gs
        n_groups = math.ceil(rows_in / gs)
        want_s, want_z = (n_groups, out), (n_groups, out // _PER)
        if tuple(sshape) != want_s or tuple(zshape) != want_z:
            raise QuantizationError(
                f"{parts['scale']} {shape_text(sshape)} / {parts['zeros']} {shape_text(zshape)} "
                f"do not fit {codes} {shape_text(cshape)} (group size {gs}: that needs "
                f"{shape_text(want_s)} / {shape_text(want_z)}); check group_size in the config"
            )
        require(srow.is_floating, f"{parts['scale']} is {srow.name}; AWQ scales are floats")
        return Group(name, self.name, dict(parts), (out, rows_in), {"group_size": gs})

    def pieces(self, group: Group, parts: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        out, rows_in = group.shape
        step = max(_PER, base.PIECE_ELEMENTS // max(1, rows_in) // _PER * _PER)
        for o0 in range(0, out, step):
            o1 = min(out, o0 + step)
            w0, w1 = o0 // _PER, o1 // _PER
            yield {
                "codes": parts["codes"][:, w0:w1],
                "zeros": parts["zeros"][:, w0:w1],
                "scale": parts["scale"][:, o0:o1],
            }

    def kernel(self, parts: Mapping[str, torch.Tensor], group: Group) -> torch.Tensor:
        import torch

        gs = group.options["group_size"]
        q = int_codes_f32(parts["codes"], 4, 0, AWQ_ORDER)  # [in, cols]
        z = int_codes_f32(parts["zeros"], 4, 0, AWQ_ORDER)  # [groups, cols]
        s = parts["scale"].to(torch.float32).t()  # [cols, groups]
        w = q.t()  # [cols, in]: groups along the last axis
        return group_scale_(w, int(gs), s, z.t())

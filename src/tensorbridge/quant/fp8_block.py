"""fp8 block-wise: DeepSeek-V3's layout (``quant_method: "fp8"`` with ``weight_block_size``).

Stored: ``NAME`` as ``F8_E4M3`` ``[*lead, rows, cols]`` and ``NAME_scale_inv`` (``F32``,
``BF16`` or ``F8_E8M0``) ``[*lead, ceil(rows / br), ceil(cols / bc)]``: one scale per
``br x cols`` tile, multiplied (despite the name, ``scale_inv`` is the dequantization
factor). The block size ``[br, bc]`` comes from the config's ``weight_block_size`` or
``block_size=``, never from the scale grid: DeepSeek's 576-row ``kv_a_proj_with_mqa``
has a partial last row block (``ceil(576 / 128) = 5``), and a ``[448, 256]`` weight's
``[4, 2]`` grid looks like 112-row blocks while it is 128-row blocks with a partial
edge. A weight and its scale may sit in different shards.

Numerics: ``float32(code) * float32(scale)`` in float32 (exact for e4m3 codes and
fp32 scales away from subnormals), rounded once to the requested dtype; what
transformers' ``Fp8Dequantize`` computes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from ..dtypes import DTypeRow, resolve_dtype
from ..errors import QuantizationError
from .base import (
    FP8_MAX,
    Config,
    Group,
    Index,
    Scheme,
    fold_factor,
    fp8_to_f32_shifted,
    require,
    row_pieces,
    shape_text,
)

if TYPE_CHECKING:
    import torch

__all__ = ["FP8Block"]

_CODES = ("float8_e4m3fn", "float8_e5m2")
_SCALES = ("float32", "bfloat16", "float16", "float8_e8m0fnu")
_FP8_MAX = 448.0


class FP8Block(Scheme):
    name = "fp8-block"
    summary = (
        "fp8 e4m3 weights with one scale per block (DeepSeek-V3: NAME + NAME_scale_inv, "
        'quant_method "fp8", weight_block_size [128, 128]).'
    )
    numerics = "code x scale in float32 (exact), rounded once to the requested dtype."
    writes = True
    aliases = ("fp8-block-wise",)
    stray_dtypes = _CODES
    part_suffixes = ("_scale_inv",)
    suffixes: ClassVar[Mapping[str, Mapping[str, str]]] = {"": {"codes": "", "scale": "_scale_inv"}}
    takes_block_size = True

    def claims(self, config: Config) -> bool:
        return config.method == "fp8" and config.data.get("weight_block_size") is not None

    def code_max(self, codes: DTypeRow) -> float | None:
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
        names = self.role_suffixes(layout)
        br, bc = block_size or (128, 128)
        grid = (*shape[:-2], math.ceil(shape[-2] / br), math.ceil(shape[-1] / bc))
        return {
            name + names["codes"]: ("codes", resolve_dtype("float8_e4m3fn"), shape),
            name + names["scale"]: ("scale", resolve_dtype("float32"), grid),
        }

    def written_config(
        self, block_size: tuple[int, int] | None, ignored: list[str], layout: str | None
    ) -> dict[str, Any]:
        """transformers' ``FineGrainedFP8Config`` (DeepSeek-V3's ``quant_method: "fp8"``)."""
        return {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "weight_block_size": list(block_size or (128, 128)),
        }

    def from_names(self, index: Index, options: Mapping[str, Any]) -> list[Group]:
        """DeepSeek's ``NAME_scale_inv`` beside its codes: the name is this layout's alone
        (the block size still comes from ``block_size=``, never from the grid)."""
        return self.detect(index, None, options)

    def detect(
        self, index: Index, config: Config | None, options: Mapping[str, Any]
    ) -> list[Group]:
        groups = []
        for name in index:
            if not name.endswith("_scale_inv"):
                continue
            codes = name[: -len("_scale_inv")]
            require(
                codes in index,
                f"{name} has no weight {codes} beside it; the checkpoint is incomplete "
                "(a shard missing from the index?)",
            )
            opts = dict(options)
            if "block_size" not in opts and config is not None:
                opts["block_size"] = config.data.get("weight_block_size")
            groups.append(self.make_group(codes, {"codes": codes, "scale": name}, index, opts))
        return groups

    def make_group(
        self, name: str, parts: Mapping[str, str], index: Index, options: Mapping[str, Any]
    ) -> Group:
        codes, scale = parts["codes"], parts["scale"]
        (crow, cshape), (srow, sshape) = index[codes], index[scale]
        require(
            crow.name in _CODES,
            f"{codes} is {crow.name}; fp8-block weights are float8_e4m3fn (or e5m2)",
        )
        if srow.name == "uint8":
            raise QuantizationError(
                f"{scale} is uint8: e8m0 exponents or integer codes cannot be told apart; "
                "store it as F8_E8M0, or pass scheme= with the layout that says which"
            )
        require(srow.name in _SCALES, f"{scale} is {srow.name}; fp8-block scales are {_SCALES}")
        block = options.get("block_size")
        if block is None:
            raise QuantizationError(
                f"{codes} has block scales {scale} {shape_text(sshape)} but no block size: "
                "it is not inferred from the grid (a partial edge block makes that wrong); "
                "put config.json with weight_block_size beside the checkpoint or pass "
                "block_size=(128, 128) (command line: --block-size 128,128)"
            )
        br, bc = (int(b) for b in block)
        if not (0 < br < 1 << 31 and 0 < bc < 1 << 31):
            raise QuantizationError(
                f"{codes}: block size [{br}, {bc}] is not two positive 32-bit sizes; check "
                "weight_block_size in config.json or pass block_size="
            )
        require(len(cshape) >= 2, f"{codes} {shape_text(cshape)} is not a matrix (rows, cols)")
        *lead, rows, cols = cshape
        want = (*lead, math.ceil(rows / br), math.ceil(cols / bc))
        if tuple(sshape) != want:
            raise QuantizationError(
                f"{scale} {shape_text(sshape)} does not tile {codes} {shape_text(cshape)} in "
                f"[{br}, {bc}] blocks (that needs {shape_text(want)}); check weight_block_size "
                "in config.json or pass block_size="
            )
        return Group(name, self.name, dict(parts), tuple(cshape), {"block_size": (br, bc)})

    def pieces(self, group: Group, parts: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        br, _ = group.options["block_size"]
        *lead, rows, cols = group.shape
        for idx, r0, r1 in row_pieces(tuple(lead), rows, cols, br):
            rows_at = (*idx, slice(r0, r1))
            blocks_at = (*idx, slice(r0 // br, -(-r1 // br)))
            yield {"codes": parts["codes"][rows_at], "scale": parts["scale"][blocks_at]}

    def block_index(self, group: Group, flat: torch.Tensor) -> torch.Tensor:
        br, bc = (int(b) for b in group.options["block_size"])
        rows, cols = group.shape[-2:]
        nr, nc = -(-rows // br), -(-cols // bc)
        lead, rest = flat // (rows * cols), flat % (rows * cols)
        index: torch.Tensor = (lead * nr + rest // cols // br) * nc + rest % cols // bc
        return index

    def kernel(self, parts: Mapping[str, torch.Tensor], group: Group) -> torch.Tensor:
        import torch

        br, bc = group.options["block_size"]
        out, factor = fp8_to_f32_shifted(parts["codes"])
        s = fold_factor(out, factor, parts["scale"].to(torch.float32))
        n, cols = out.shape[-2:]
        # a piece inside one block row (the streamed case) broadcasts its one scale row
        s_rows = s if s.shape[-2] == 1 else s.repeat_interleave(br, dim=-2)[..., :n, :]
        full = cols // bc
        if full:
            out[..., : full * bc].unflatten(-1, (full, bc)).mul_(  # type: ignore[no-untyped-call]
                s_rows[..., :full, None]
            )
        if full * bc != cols:
            out[..., full * bc :].mul_(s_rows[..., full:])
        return out

    def quantize(self, x: torch.Tensor, **options: Any) -> dict[str, torch.Tensor]:
        """transformers' ``Fp8Quantize`` (float32 scales), partial edge blocks included."""
        import torch

        br, bc = (int(b) for b in options.get("block_size") or (128, 128))
        xf = x.detach().to(torch.float32).cpu()
        require(
            xf.ndim >= 2, f"fp8-block quantizes matrices; got shape {shape_text(tuple(xf.shape))}"
        )
        *lead, rows, cols = xf.shape
        nr, nc = math.ceil(rows / br), math.ceil(cols / bc)
        padded = torch.zeros(*lead, nr * br, nc * bc)
        padded[..., :rows, :cols] = xf
        tiles = padded.reshape(*lead, nr, br, nc, bc)
        max_abs = tiles.abs().amax(dim=(-3, -1))
        safe = torch.where(max_abs > 0, max_abs, torch.ones_like(max_abs))
        scales = torch.where(max_abs > 0, _FP8_MAX / safe, torch.ones_like(safe))
        inv = (1.0 / scales).to(torch.float32)
        if options.get("scales_only"):
            return {"scale": inv}
        q = torch.clamp(tiles * scales[..., :, None, :, None], -_FP8_MAX, _FP8_MAX)
        codes = q.to(torch.float8_e4m3fn).reshape(*lead, nr * br, nc * bc)[..., :rows, :cols]
        return {"codes": codes.contiguous(), "scale": inv}

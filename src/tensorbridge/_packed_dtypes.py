"""Torch's packed dtypes: several values a byte on the torch side, one a byte in NumPy.

A packed type is no row of the dtype table (:mod:`tensorbridge.dtypes`), whose two sides
hold the same bits: torch's ``float4_e2m1fn_x2`` keeps two values a byte, ml_dtypes'
``float4_e2m1fn`` one. Each is a :class:`PackedRow` (its torch name, the ml_dtypes
type of one value, its :mod:`~tensorbridge.packing` layout, safetensors code and
category); adding one is one line of ``_PACKED_SPEC``. Like the table, :data:`PACKED` is
built without importing torch or ml_dtypes: a row names both types and looks them up
on first use, and only a type the installed ml_dtypes exports makes a row
(:func:`tensorbridge._versions.ml_dtypes_exports`). :mod:`tensorbridge.dtypes`
re-exports both names and makes the lookups by torch and NumPy dtype.

>>> [(r.name, r.numpy_name, r.per_byte) for r in PACKED]
[('float4_e2m1fn_x2', 'float4_e2m1fn', 2)]
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, TypeAlias

import numpy as np

from . import packing
from ._versions import ml_dtypes_exports, ml_dtypes_module

if TYPE_CHECKING:
    import torch

    TorchDType: TypeAlias = torch.dtype

__all__ = ["PACKED", "Category", "PackedRow"]

# What a dtype's values are; the dtype table's rows say it too.
Category = Literal["bool", "int", "uint", "float", "complex"]


@dataclass(frozen=True, eq=False)
class PackedRow:
    """A torch dtype that packs several values into each byte, and NumPy's one-a-byte dtype.

    NumPy (ml_dtypes) keeps one sub-byte value a byte; torch's packed dtypes keep
    several, as their :class:`~tensorbridge.packing.Layout` says (``float4_e2m1fn_x2``:
    :data:`~tensorbridge.packing.TORCH_X2`, element ``2i`` in the low nibble of byte
    ``i``, as torch's ``Float4_e2m1fn_x2.h`` and safetensors' ``F4`` have it).
    Converting between the two is an explicit pack / unpack (``dtype=`` names the other
    side), and the last dimension changes by ``per_byte``. Adding a packed type is one
    row in ``_PACKED_SPEC``.

    >>> row = PACKED[0]
    >>> row.name, row.per_byte, row.unpack(np.array([0x21], np.uint8)).view(np.uint8)
    ('float4_e2m1fn_x2', 2, array([1, 2], dtype=uint8))
    """

    name: str
    numpy_name: str  # the ml_dtypes type of one value a byte
    layout: packing.Layout
    safetensors: str | None
    category: Category

    @cached_property
    def numpy(self) -> np.dtype[Any]:
        """The one-value-a-byte NumPy dtype (imports ml_dtypes on first use)."""
        dtype: np.dtype[Any] = np.dtype(getattr(ml_dtypes_module(), self.numpy_name))
        return dtype

    @cached_property
    def torch(self) -> TorchDType:
        """The packed torch dtype (imports torch on first use)."""
        import torch

        dtype: TorchDType = getattr(torch, self.name)
        return dtype

    @property
    def per_byte(self) -> int:
        return 8 // self.layout.bits

    @property
    def bits(self) -> int:
        return self.layout.bits

    def unpack(self, packed: np.ndarray) -> np.ndarray:
        """Packed bytes (uint8) -> one value a byte; the last axis grows ``per_byte`` times."""
        count = packed.shape[-1] * self.per_byte if packed.ndim else 0
        return self.layout.unpack(packed, count).view(self.numpy)

    def pack(self, values: np.ndarray) -> np.ndarray:
        """One value a byte (last axis a multiple of ``per_byte``) -> packed uint8 bytes."""
        return self.layout.pack(values)

    def __repr__(self) -> str:
        return f"PackedRow({self.name})"


# (torch name, ml_dtypes name of one value, its packing, safetensors code, category)
_PACKED_SPEC: tuple[tuple[str, str, packing.Layout, str | None, Category], ...] = (
    ("float4_e2m1fn_x2", "float4_e2m1fn", packing.TORCH_X2, "F4", "float"),
)

# The rows whose one-a-byte type the installed ml_dtypes exports.
PACKED: tuple[PackedRow, ...] = tuple(
    PackedRow(*spec) for spec in _PACKED_SPEC if spec[1] in ml_dtypes_exports()
)

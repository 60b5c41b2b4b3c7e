"""Packed dtypes (F4) as pseudo table rows, the way a checkpoint stores them.

Packed dtypes are not rows of the dtype table: their torch side packs several values
a byte and their NumPy side holds one, so they are no bit-cast. A pseudo-row names
each for headers, ``info()`` and ``float_dtype``; :data:`PACKED_ROWS` gives its
packing (values a byte, pack / unpack), :data:`PSEUDO_ROWS` the way back. The
safetensors format, the DCP writers and the dequantizing reader share them.

>>> from tensorbridge.dtypes import PACKED
>>> PSEUDO_ROWS[PACKED[0]].safetensors
'F4'
"""

from __future__ import annotations

from .dtypes import PACKED, DTypeRow, PackedRow

PACKED_ROWS: dict[DTypeRow, PackedRow] = {
    # one value a byte on the NumPy side, the ml_dtypes type the row names
    DTypeRow(p.numpy_name, 1, p.safetensors, p.category, carried=True, torch_name=p.name): p
    for p in PACKED
    if p.safetensors
}
PSEUDO_ROWS: dict[PackedRow, DTypeRow] = {p: r for r, p in PACKED_ROWS.items()}

"""Sub-byte packing: how each framework and file format puts several values in a byte.

NumPy (ml_dtypes) keeps a sub-byte value one a byte, in the low bits with the upper
bits zero (``np.uint8(0x0F).view(ml_dtypes.int4)`` is -1); torch, safetensors, ONNX and
GGUF keep several a byte, and how they share it is a property of the layout, not one
rule. Each convention is one line of :data:`LAYOUTS`:

=============== ==== ============================================ ============ ===========
layout          bits where value ``i`` goes                       over         odd counts
=============== ==== ============================================ ============ ===========
``TORCH_X2``    4    byte ``i // 2``, low nibble first            the last axis refused
``ONNX_4BIT``   4    byte ``i // 2``, low nibble first            the tensor   zero nibble
``ONNX_2BIT``   2    bits ``2i % 8`` of byte ``i // 4``           the tensor   zero bits
``ONNX_6BIT``   6    bits ``6i`` to ``6i + 5`` of an LSB-first    the tensor   zero bits
                     stream: four values in three bytes
``GGUF_HALVES`` 4    a 32-value block's value ``j`` in the low    the last axis refused
                     nibble of its byte ``j``, ``j + 16`` high
=============== ==== ============================================ ============ ===========

The first four are one rule, an LSB-first bit stream (value ``i`` in bits ``[i * bits,
(i + 1) * bits)`` of the bytes read as one little-endian number); they differ in what
they pack (a tensor row by row, or flat, whole) and in what they do with a count that
does not fill whole bytes. ``GGUF_HALVES`` splits each block into runs instead: run
``q`` of a block of ``n`` values fills field ``q`` of its ``n * bits / 8`` bytes (the
same rule over other block sizes and widths is ggml's K-quants', which
:mod:`tensorbridge.quant.ggml` takes with :func:`dataclasses.replace`).

:meth:`Layout.unpack` gives one value a byte (``uint8``, the upper bits zero: view it as
the ml_dtypes type); :meth:`Layout.pack` keeps the low ``bits`` of each byte and drops
the rest, which is the value ml_dtypes reads from such a byte. Both check every count
against the bytes present before allocating, then run whole NumPy passes over
cache-sized steps of the data (a stream's group of bytes read as one little-endian
word and its fields moved in halving steps; a split block a field at a time), never a
Python loop over values. NumPy only: this module imports neither torch nor the rest of
the package but its errors.

>>> TORCH_X2.unpack(np.array([0x21, 0x43], np.uint8), 4).tolist()
[1, 2, 3, 4]
>>> ONNX_6BIT.pack(np.array([1, 2, 3], np.uint8)).tolist()  # ceil(18 / 8) = 3 bytes
[129, 48, 0]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from .errors import FormatError, InvalidArgumentError, UnsupportedDtypeError

__all__ = [
    "BY_NAME",
    "GGUF_HALVES",
    "LAYOUTS",
    "ONNX_2BIT",
    "ONNX_4BIT",
    "ONNX_6BIT",
    "TORCH_X2",
    "Layout",
]


@dataclass(frozen=True)
class Layout:
    """One packing convention: ``bits`` a value, laid out as a stream or in split blocks.

    Args:
        name: the layout's name in messages.
        bits: bits a value (1 to 8).
        split: 0 for an LSB-first bit stream; ``n`` for blocks of ``n`` values split
            into ``8 // bits`` runs, run ``q`` in field ``q`` (bits ``[q * bits, (q + 1)
            * bits)``) of the block's ``n * bits // 8`` bytes.
        whole: pack the whole tensor as one flat stream (ONNX's ``raw_data``) rather than
            each row of the last axis.
        pads: a count that does not fill whole bytes takes zero bits up to the next
            byte; otherwise it is refused.
        holds: the types stored this way, as their conventions name them.
        source: where the convention is defined.
    """

    name: str
    bits: int
    split: int = 0
    whole: bool = False
    pads: bool = False
    holds: tuple[str, ...] = ()
    source: str = ""

    def __post_init__(self) -> None:
        if not 1 <= self.bits <= 8:
            raise InvalidArgumentError(
                f"layout {self.name!r} has {self.bits}-bit values; pass bits from 1 to 8"
            )
        if self.split and (8 % self.bits or self.split % (8 // self.bits)):
            raise InvalidArgumentError(
                f"layout {self.name!r} splits blocks of {self.split} {self.bits}-bit values; "
                "pass bits that divide 8 and a block that fills whole bytes"
            )
        if self.pads and not self.whole:
            raise InvalidArgumentError(
                f"layout {self.name!r} pads rows; pass whole=True (only a tensor packed "
                "flat pads, at its one end)"
            )

    @property
    def group_values(self) -> int:
        """Values in the smallest run of whole bytes: a block, or ``lcm(bits, 8) / bits``."""
        return self.split or math.lcm(self.bits, 8) // self.bits

    @property
    def group_bytes(self) -> int:
        """The bytes a group of :attr:`group_values` values takes."""
        return self.group_values * self.bits // 8

    def packed_size(self, count: int) -> int:
        """Bytes that ``count`` values take (a row's, or the tensor's for ``whole``).

        >>> ONNX_6BIT.packed_size(5), ONNX_4BIT.packed_size(5), TORCH_X2.packed_size(6)
        (4, 3, 3)

        Raises:
            InvalidArgumentError: a count the layout cannot hold (odd for ``TORCH_X2``,
                not whole blocks for ``GGUF_HALVES``, negative).
        """
        if isinstance(count, bool) or not isinstance(count, int | np.integer) or count < 0:
            raise InvalidArgumentError(
                f"{self.name} counts values with an int >= 0, got {count!r}; pass the count"
            )
        count = int(count)
        if self.split and count % self.split:
            raise InvalidArgumentError(
                f"{self.name} packs whole blocks of {self.split} values, got {count}; pad "
                f"the values to a multiple of {self.split}"
            )
        if not self.pads and count * self.bits % 8:
            raise InvalidArgumentError(
                f"{self.name} packs whole bytes of {self.bits}-bit values, got {count} "
                f"values; pad them to a multiple of {8 // math.gcd(self.bits, 8)}"
            )
        return -(-count * self.bits // 8)

    def pack(self, values: np.ndarray) -> np.ndarray:
        """One value a byte (the low ``bits`` of each; the rest dropped) -> packed bytes.

        A ``whole`` layout packs the array flat, in C order, to one axis; the others pack
        each row of the last axis, which shrinks to :meth:`packed_size` of its length.

        >>> ONNX_2BIT.pack(np.array([1, 2, 3, 0, 3], np.uint8)).tolist()
        [57, 3]
        >>> import ml_dtypes
        >>> ONNX_4BIT.pack(np.array([-1, 7, -8], ml_dtypes.int4)).tolist()
        [127, 8]

        Args:
            values: any array of one-byte items (``uint8``, ``int8``, an ml_dtypes
                sub-byte type).

        Raises:
            UnsupportedDtypeError: items that are not one byte.
            InvalidArgumentError: a 0-d array for a row-wise layout, or a row length the
                layout cannot hold (:meth:`packed_size`).
        """
        v = self._rows(_one_a_byte(values, "pack"))
        out = np.empty((*v.shape[:-1], self.packed_size(v.shape[-1])), np.uint8)
        self._run(v, out, packing=True)
        return out

    def unpack(self, packed: np.ndarray, count: int) -> np.ndarray:
        """Packed bytes -> ``count`` values one a byte (``uint8``, the upper bits zero).

        A ``whole`` layout reads the bytes flat and gives ``(count,)``; the others read
        each row of the last axis, and give ``(*packed.shape[:-1], count)``. The bytes
        must be exactly ``packed_size(count)`` (``onnx.helper.make_tensor`` asks the
        same of ``raw_data``); padding bits are not looked at.

        >>> GGUF_HALVES.unpack(np.arange(16, dtype=np.uint8) * 17, 32)[[0, 1, 16, 17]].tolist()
        [0, 1, 0, 1]

        Raises:
            UnsupportedDtypeError: items that are not one byte.
            FormatError: bytes that are not exactly those of ``count`` values.
            InvalidArgumentError: a count the layout cannot hold, or 0-d ``packed``.
        """
        p = self._rows(_one_a_byte(packed, "unpack"))
        need, have = self.packed_size(count), p.shape[-1]
        if have != need:
            where = "" if self.whole else " a row"
            raise FormatError(
                f"{count} values packed as {self.name} take {need} bytes{where}, but {have} "
                "are given; pass the count the bytes were packed from"
            )
        out = np.empty((*p.shape[:-1], count), np.uint8)
        self._run(out, p, packing=False)
        return out

    def _rows(self, a: np.ndarray) -> np.ndarray:
        if self.whole:
            return a.reshape(-1)
        if a.ndim == 0:
            raise InvalidArgumentError(
                f"{self.name} packs along the last axis, but the array is 0-d; pass a.reshape(1)"
            )
        return a

    # --- the kernels ------------------------------------------------------------------
    # Values and bytes are cut into groups, ``group_values`` values in ``group_bytes``
    # bytes (rows of a row-wise layout hold whole groups: ``packed_size`` checks), and
    # the groups are run a cache-sized step at a time.

    def _run(self, values: np.ndarray, packed: np.ndarray, *, packing: bool) -> None:
        """Pack ``values`` into ``packed`` (or unpack the other way): the whole groups a
        cache-sized step at a time, then a whole layout's last group, cut short."""
        g, nb = self.group_values, self.group_bytes
        kernel = self._pack_groups if packing else self._unpack_groups
        n_groups = values.shape[-1] // g  # a row's (a whole layout: the one row's)
        vg, v_rest = _groups(values, g, n_groups)
        pg, p_rest = _groups(packed, nb, n_groups)
        step = max(1, _STEP // g)
        for s in range(0, len(vg), step):
            kernel(vg[s : s + step], pg[s : s + step])
        if v_rest.size:  # padded with zeros to a group, then cut again
            v_pad, p_pad = np.zeros((1, g), np.uint8), np.zeros((1, nb), np.uint8)
            v_pad[0, : v_rest.size], p_pad[0, : p_rest.size] = v_rest, p_rest
            kernel(v_pad, p_pad)
            if packing:
                p_rest[...] = p_pad[0, : p_rest.size]
            else:
                v_rest[...] = v_pad[0, : v_rest.size]

    def _pack_groups(self, v: np.ndarray, p: np.ndarray) -> None:
        """``(groups, group_values)`` values -> ``(groups, group_bytes)`` bytes."""
        bits, mask = self.bits, (1 << self.bits) - 1
        if self.split:  # field q of a block's bytes: its run q of values
            k = 8 // bits
            runs = v.reshape(len(v), k, -1)
            np.bitwise_and(runs[:, 0], mask, out=p)
            for q in range(1, k):  # the top field's shift drops the high bits by itself
                p |= (runs[:, q] if q == k - 1 else runs[:, q] & mask) << (bits * q)
            return
        # a stream: a group's values, one a byte, as one little-endian word, moved down
        # from bit 8i to bit i * bits in halving steps; its low bytes are the group's
        word = np.dtype(f"<u{self.group_values}")
        _, keep, moved = self._spread[-1]  # every value's low bits, at bit 8i
        packed = np.ascontiguousarray(v).view(word)[:, 0] & (keep | moved)
        for shift, keep, moved in self._spread[::-1]:
            field = packed & moved
            field >>= shift
            packed &= keep
            packed |= field
        for j in range(p.shape[1]):  # byte j: a column at a time (NumPy is slow on short rows)
            np.copyto(p[:, j], packed >> (8 * j) if j else packed, casting="unsafe")

    def _unpack_groups(self, v: np.ndarray, p: np.ndarray) -> None:
        """``(groups, group_bytes)`` bytes -> ``(groups, group_values)`` values."""
        bits, mask = self.bits, (1 << self.bits) - 1
        if self.split:  # field q of a block's bytes is its run q of values
            k = 8 // bits
            runs = v.reshape(len(v), k, -1)
            for q in range(k):  # made whole, then copied: one pass over the short, strided
                field = p >> (bits * q) if q else p  # rows of runs (NumPy is slow on them)
                runs[:, q] = field & mask if q < k - 1 else field
            return
        # a stream: the group's bytes as one little-endian word, value i moved up from bit
        # i * bits to bit 8i in halving steps; the word's bytes are the values
        word = np.dtype(f"<u{self.group_values}")
        values = v.view(word)[:, 0]  # v: new memory, contiguous
        np.copyto(values, p[:, 0], casting="unsafe")
        for j in range(1, p.shape[1]):
            values |= p[:, j].astype(word) << (8 * j)
        for shift, keep, moved in self._spread:
            field = values << shift
            field &= moved
            values &= keep
            values |= field

    @cached_property
    def _spread(self) -> tuple[tuple[int, int, int], ...]:
        """A stream group's steps from packed to one value a byte: ``(shift, keep,
        moved)``, each step moving the upper half of every run of fields up by ``shift``
        (``moved`` masks where it lands, ``keep`` the lower half, left in place)."""
        g, bits, steps = self.group_values, self.bits, []
        half = g // 2
        while half:
            field = (1 << bits * half) - 1
            keep = sum(field << (8 * half * c) for c in range(0, g // half, 2))
            moved = sum(field << (8 * half * c) for c in range(1, g // half, 2))
            steps.append((half * (8 - bits), keep, moved))
            half //= 2
        if not steps:  # 8 bits: nothing moves
            steps.append((0, 0xFF, 0))
        return tuple(steps)


# values a kernel step: its temporaries stay in the cache
_STEP = 1 << 16


def _groups(a: np.ndarray, size: int, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of ``n_groups`` groups of ``size`` as ``(groups, size)``, and a row's rest.

    A view where NumPy can make one (strided rows split in place); only a whole layout's
    one row has a rest (its last group, cut short), a view of ``a``'s tail.
    """
    cut = n_groups * size
    if a.shape[-1] == cut:
        return a.reshape(-1, size), a[..., :0].reshape(-1)
    return a[:cut].reshape(-1, size), a[cut:]


def _one_a_byte(a: Any, verb: str) -> np.ndarray:
    """``a`` as ``uint8`` (a view where it can be), refusing items wider than a byte."""
    arr = np.asarray(a)
    if arr.dtype.itemsize != 1:
        raise UnsupportedDtypeError(
            f"{verb} takes one-byte items (uint8 or an ml_dtypes sub-byte type), got "
            f"{arr.dtype}; convert the values with astype(ml_dtypes.<type>) first"
        )
    return arr.view(np.uint8)


# The table. Each line's source is where its convention is defined; tests/test_packing.py
# checks each against that source's own code where it is installed.
TORCH_X2 = Layout(
    "torch_x2",
    4,
    holds=("torch float4_e2m1fn_x2", "safetensors F4"),
    # c10/util/Float4_e2m1fn_x2.h (torch/headeronly/util/): "val1 : val0", bits 7654 :
    # 3210, so element 2i is the low nibble; safetensors' F4 and torchao store it so
    source="torch c10/util/Float4_e2m1fn_x2.h",
)
ONNX_4BIT = Layout(
    "onnx_4bit",
    4,
    whole=True,
    pads=True,
    holds=("ONNX INT4", "ONNX UINT4", "ONNX FLOAT4E2M1"),
    # onnx.proto (TensorProto.raw_data): "the first element is stored in the 4 LSB";
    # numpy_helper._pack_4bitx2 pads an odd count with a zero nibble
    source="onnx.proto TensorProto.raw_data; onnx.numpy_helper._pack_4bitx2",
)
ONNX_2BIT = Layout(
    "onnx_2bit",
    2,
    whole=True,
    pads=True,
    holds=("ONNX INT2", "ONNX UINT2"),
    # onnx.proto: "x0 | (x1 << 2) | (x2 << 4) | (x3 << 6)"; numpy_helper._pack_2bitx4
    source="onnx.proto TensorProto.raw_data; onnx.numpy_helper._pack_2bitx4",
)
ONNX_6BIT = Layout(
    "onnx_6bit",
    6,
    whole=True,
    pads=True,
    holds=("ONNX FLOAT6E2M3", "ONNX FLOAT6E3M2"),
    # onnx.proto (1.23): "a contiguous 24-bit LSB-first bitstream ... the final group is
    # zero-padded; the packed byte length is ceil(6 * num_elements / 8)"; the bytes past
    # that are cut, as numpy_helper._pack_6bit cuts them and helper.make_tensor requires
    source="onnx.proto TensorProto.raw_data; onnx.numpy_helper._pack_6bit",
)
GGUF_HALVES = Layout(
    "gguf_halves",
    4,
    split=32,
    holds=("ggml Q4_0", "ggml Q4_1", "ggml IQ4_NL", "ggml MXFP4"),
    # gguf.quants.Q4_0.dequantize_blocks: qs.reshape(n, -1, 1, 16) >> [0, 4], so the 16
    # low nibbles are values 0-15 and the high ones 16-31 (ggml-quants.c's
    # dequantize_row_q4_0: y[j] = low nibble of qs[j], y[j + qk/2] = high nibble)
    source="ggml-quants.c dequantize_row_q4_0; gguf.quants.Q4_0.dequantize_blocks",
)

LAYOUTS: tuple[Layout, ...] = (TORCH_X2, ONNX_4BIT, ONNX_2BIT, ONNX_6BIT, GGUF_HALVES)
BY_NAME: dict[str, Layout] = {layout.name: layout for layout in LAYOUTS}

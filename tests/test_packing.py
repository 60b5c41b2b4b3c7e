"""Sub-byte packing layouts, each checked on every bit pattern against its defining code.

Every layout of :mod:`tensorbridge.packing` is compared with an implementation that
is not ours: ONNX's through ``onnx.numpy_helper.from_array`` / ``to_array`` and
``onnx.helper.make_tensor`` (the public route to its pack and unpack functions), the
values read through ml_dtypes' own types, GGUF's split halves through the ``gguf``
package's Q4_0 quantizer and dequantizer, torch's ``float4_e2m1fn_x2`` through
torchao's ``pack_uint4`` / ``unpack_uint4`` and tensorbridge's torch conversions.
"Every bit pattern" means: every byte value (and for the 6-bit stream every 3-byte
group, 2**24 of them) at every position of a layout's group, unpacked, and every
value at every position of a group packed; then random arrays of odd, padded lengths.
"""

from __future__ import annotations

import ast
import dataclasses
import doctest
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge import packing
from tensorbridge.dtypes import PACKED
from tensorbridge.errors import FormatError, InvalidArgumentError, UnsupportedDtypeError
from tensorbridge.packing import (
    GGUF_HALVES,
    LAYOUTS,
    ONNX_2BIT,
    ONNX_4BIT,
    ONNX_6BIT,
    TORCH_X2,
    Layout,
)

RNG = np.random.default_rng(29)
# odd and padded lengths: every remainder of a 4-value group, around and past a kernel step
LENGTHS = [0, 1, 2, 3, 4, 5, 6, 7, 9, 31, 33, 255, 1001, 65_537, 200_003]


def every_group(layout: Layout) -> np.ndarray:
    """Every bit pattern of a stream layout's group of bytes, groups end to end."""
    n = layout.group_bytes
    counter = np.arange(1 << (8 * n), dtype=np.dtype("<u2" if n == 1 else "<u4"))
    return counter.view(np.uint8).reshape(len(counter), -1)[:, :n].reshape(-1)


def every_value_everywhere(bits: int, group: int) -> np.ndarray:
    """Groups of ``group`` values: each of the 2**bits values at each position, the rest
    random, ``(2**bits * group, group)``."""
    values = RNG.integers(0, 1 << bits, (1 << bits, group, group), dtype=np.uint8)
    for j in range(group):
        values[:, j, j] = np.arange(1 << bits)
    return values.reshape(-1, group)


def test_the_table() -> None:
    assert [x.name for x in LAYOUTS] == [
        "torch_x2",
        "onnx_4bit",
        "onnx_2bit",
        "onnx_6bit",
        "gguf_halves",
    ]
    assert {x.name: x for x in LAYOUTS} == packing.BY_NAME
    assert all(x.holds and x.source for x in LAYOUTS)
    assert [(x.bits, x.group_values, x.group_bytes) for x in LAYOUTS] == [
        (4, 2, 1),
        (4, 2, 1),
        (2, 4, 1),
        (6, 4, 3),
        (4, 32, 16),
    ]
    assert [x for x in LAYOUTS if x.whole] == [ONNX_4BIT, ONNX_2BIT, ONNX_6BIT]
    assert [x for x in LAYOUTS if x.pads] == [ONNX_4BIT, ONNX_2BIT, ONNX_6BIT]
    with pytest.raises(InvalidArgumentError, match=r"pads rows; pass whole=True"):
        Layout("x", 4, pads=True)
    with pytest.raises(InvalidArgumentError, match=r"pass bits that divide 8 and a block"):
        Layout("x", 6, split=32)
    with pytest.raises(InvalidArgumentError, match=r"9-bit values; pass bits from 1 to 8"):
        Layout("x", 9)


# --- golden bytes, computed by hand --------------------------------------------------------

GOLDEN: list[tuple[Layout, list[int], list[int]]] = [
    # torch: val1 : val0 = bits 7654 : 3210
    (TORCH_X2, [0x1, 0x2, 0xF, 0x3], [0x21, 0x3F]),
    # ONNX 4-bit: first element in the 4 LSB; an odd count takes a zero high nibble
    (ONNX_4BIT, [0x1, 0x2, 0x3], [0x21, 0x03]),
    # ONNX 2-bit: x0 | x1 << 2 | x2 << 4 | x3 << 6 = 1 | 8 | 48 | 0; then 3, padded
    (ONNX_2BIT, [1, 2, 3, 0, 3], [0x39, 0x03]),
    # ONNX 6-bit stream: 1 | (2 & 3) << 6, 2 >> 2 | (3 & 15) << 4, 3 >> 4 | 0 << 2
    (ONNX_6BIT, [1, 2, 3], [0x81, 0x30, 0x00]),
    # four all-ones values fill three bytes; 0, 63 take ceil(12 / 8) = 2 bytes
    (ONNX_6BIT, [63, 63, 63, 63], [0xFF, 0xFF, 0xFF]),
    (ONNX_6BIT, [0, 63], [0xC0, 0x0F]),
    (ONNX_6BIT, [63], [0x3F]),
    # GGUF: value j in the low nibble of byte j, value j + 16 in its high nibble
    (GGUF_HALVES, [*range(16), *range(15, -1, -1)], [j | (15 - j) << 4 for j in range(16)]),
]


@pytest.mark.parametrize(
    ("layout", "values", "golden"), GOLDEN, ids=[f"{x.name}-{len(v)}" for x, v, _ in GOLDEN]
)
def test_golden_bytes(layout: Layout, values: list[int], golden: list[int]) -> None:
    packed = layout.pack(np.array(values, np.uint8))
    assert packed.dtype == np.uint8 and packed.tolist() == golden
    assert layout.packed_size(len(values)) == len(golden)
    got = layout.unpack(np.array(golden, np.uint8), len(values))
    assert got.dtype == np.uint8 and got.tolist() == values


# --- ONNX, through onnx's own from_array / to_array / make_tensor --------------------------

ONNX = [
    (ONNX_4BIT, "INT4", "int4"),
    (ONNX_4BIT, "UINT4", "uint4"),
    (ONNX_4BIT, "FLOAT4E2M1", "float4_e2m1fn"),
    (ONNX_2BIT, "INT2", "int2"),
    (ONNX_2BIT, "UINT2", "uint2"),
    (ONNX_6BIT, "FLOAT6E2M3", "float6_e2m3fn"),
    (ONNX_6BIT, "FLOAT6E3M2", "float6_e3m2fn"),
]
ONNX_IDS = [type_name for _, type_name, _ in ONNX]


def _onnx(type_name: str, ml_name: str) -> tuple[Any, int, np.dtype[Any]]:
    onnx = pytest.importorskip("onnx", reason="onnx's own pack and unpack are the oracle")
    code = getattr(onnx.TensorProto, type_name, None)
    ml = getattr(ml_dtypes, ml_name, None)
    if code is None or ml is None:
        pytest.skip(reason=f"the installed onnx or ml_dtypes lacks {type_name}")
    return onnx, code, np.dtype(ml)


def onnx_unpack(onnx: Any, code: int, raw: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """onnx's reading of packed ``raw_data``: ``make_tensor(raw=True)``, ``to_array``."""
    tensor = onnx.helper.make_tensor("t", code, shape, raw.tobytes(), raw=True)
    values: np.ndarray = onnx.numpy_helper.to_array(tensor)
    return values


def onnx_pack(onnx: Any, values: np.ndarray) -> np.ndarray:
    """onnx's packing of an ml_dtypes array: ``from_array``'s ``raw_data``."""
    return np.frombuffer(onnx.numpy_helper.from_array(values).raw_data, np.uint8)


@pytest.mark.parametrize(("layout", "type_name", "ml_name"), ONNX, ids=ONNX_IDS)
def test_onnx_unpacks_every_bit_pattern_as_onnx_does(
    layout: Layout, type_name: str, ml_name: str
) -> None:
    onnx, code, ml = _onnx(type_name, ml_name)
    raw = every_group(layout)  # every byte (6-bit: every 3-byte group) in every place
    count = raw.size * 8 // layout.bits
    ours = layout.unpack(raw, count)
    theirs = onnx_unpack(onnx, code, raw, (count,))
    assert theirs.dtype == ml and ours.dtype == np.uint8
    assert np.array_equal(ours, theirs.view(np.uint8))  # the bits: value in the low bits
    assert int(ours.max()) == (1 << layout.bits) - 1  # the upper bits zero
    # the values, as ml_dtypes reads our bytes and onnx's (NaN where the type has one)
    a, b = ours.view(ml).astype(np.float32), theirs.astype(np.float32)
    assert np.array_equal(a, b, equal_nan=True)
    assert np.array_equal(layout.pack(ours), raw)  # and back: every byte pattern


@pytest.mark.parametrize(("layout", "type_name", "ml_name"), ONNX, ids=ONNX_IDS)
def test_onnx_packs_every_value_at_every_position_as_onnx_does(
    layout: Layout, type_name: str, ml_name: str
) -> None:
    onnx, _, ml = _onnx(type_name, ml_name)
    g = layout.group_values
    values = every_value_everywhere(layout.bits, g).reshape(-1)
    assert np.array_equal(layout.pack(values), onnx_pack(onnx, values.view(ml)))
    # every group of values there is (6-bit: 64**4), as the bytes of every_group
    raw = every_group(layout)
    every = layout.unpack(raw, 8 * raw.size // layout.bits)
    assert np.array_equal(layout.pack(every), onnx_pack(onnx, every.view(ml)))


@pytest.mark.parametrize(("layout", "type_name", "ml_name"), ONNX, ids=ONNX_IDS)
@pytest.mark.parametrize("n", LENGTHS)
def test_onnx_odd_and_padded_lengths(layout: Layout, type_name: str, ml_name: str, n: int) -> None:
    onnx, code, ml = _onnx(type_name, ml_name)
    values = RNG.integers(0, 1 << layout.bits, n, dtype=np.uint8)
    packed = layout.pack(values)
    assert packed.size == -(-n * layout.bits // 8)  # ceil(n * bits / 8), as make_tensor asks
    assert np.array_equal(packed, onnx_pack(onnx, values.view(ml)))
    assert np.array_equal(layout.unpack(packed, n), values)
    assert np.array_equal(onnx_unpack(onnx, code, packed, (n,)).view(np.uint8), values)


@pytest.mark.parametrize(("layout", "type_name", "ml_name"), ONNX[::3], ids=ONNX_IDS[::3])
def test_onnx_packs_a_tensor_flat(layout: Layout, type_name: str, ml_name: str) -> None:
    """ONNX packs the whole tensor, not its rows: a (3, 5) tensor is one stream of 15."""
    onnx, code, ml = _onnx(type_name, ml_name)
    values = RNG.integers(0, 1 << layout.bits, (3, 5), dtype=np.uint8)
    packed = layout.pack(values)
    assert packed.shape == (layout.packed_size(15),)
    assert np.array_equal(packed, onnx_pack(onnx, values.view(ml)))
    assert np.array_equal(layout.unpack(packed, 15).reshape(3, 5), values)
    theirs = onnx_unpack(onnx, code, packed, (3, 5))
    assert np.array_equal(theirs.view(np.uint8), values)


# --- torch's float4_e2m1fn_x2 (safetensors F4) ---------------------------------------------


def test_torch_x2_every_byte_against_torchao() -> None:
    kernels = pytest.importorskip(
        "torchao.prototype.mx_formats.kernels", reason="torchao's fp4 packing is the oracle"
    )
    every = np.arange(256, dtype=np.uint8)
    ours = TORCH_X2.unpack(every, 512)
    theirs = kernels.unpack_uint4(torch.from_numpy(every)).numpy()
    assert np.array_equal(ours, theirs)
    assert np.array_equal(TORCH_X2.pack(ours), every)
    assert np.array_equal(kernels.pack_uint4(torch.from_numpy(ours)).numpy(), every)
    # the values: ml_dtypes' reading of each code is torchao's e2m1 decoder's
    values = ours.view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    assert np.array_equal(values, kernels.f4_unpacked_to_f32(torch.from_numpy(ours)).numpy())


def test_torch_x2_is_what_torchs_packed_dtype_holds() -> None:
    """c10/util/Float4_e2m1fn_x2.h: "val1 : val0" in bits 7654 : 3210, seem each."""
    every = torch.arange(256, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    row = next(p for p in PACKED if p.name == "float4_e2m1fn_x2")
    assert row.layout is TORCH_X2 and row.per_byte == 2 and row.bits == 4
    unpacked = tb.to_numpy(every, dtype=ml_dtypes.float4_e2m1fn)
    assert unpacked.dtype == ml_dtypes.float4_e2m1fn and unpacked.shape == (512,)
    b = np.arange(256)
    assert np.array_equal(unpacked.view(np.uint8)[0::2], b & 0xF)  # val0: bits 3210
    assert np.array_equal(unpacked.view(np.uint8)[1::2], b >> 4)  # val1: bits 7654
    back = tb.to_torch(unpacked, dtype=torch.float4_e2m1fn_x2)
    assert back.dtype == torch.float4_e2m1fn_x2
    assert torch.equal(back.view(torch.uint8), every.view(torch.uint8))
    # PackedRow: rows of the last axis, its public behaviour kept
    rows = RNG.integers(0, 16, (3, 8), dtype=np.uint8)
    assert row.unpack(row.pack(rows.view(ml_dtypes.float4_e2m1fn))).dtype == row.numpy
    assert np.array_equal(row.unpack(row.pack(rows)).view(np.uint8), rows)


@pytest.mark.parametrize("n", [n for n in LENGTHS if n % 2 == 0])
def test_torch_x2_rows(n: int) -> None:
    """Rows of the last axis, each packed alone: the same bytes as one flat stream."""
    values = RNG.integers(0, 16, (3, n), dtype=np.uint8)
    packed = TORCH_X2.pack(values)
    assert packed.shape == (3, n // 2)
    assert np.array_equal(packed.reshape(-1), ONNX_4BIT.pack(values))
    assert np.array_equal(TORCH_X2.unpack(packed, n), values)


# --- GGUF's split halves, through the gguf package ---------------------------------------------


def _q4_0_blocks(qs: np.ndarray) -> np.ndarray:
    """Q4_0 blocks of packed codes ``qs`` (n, 16) and an f16 scale of 1."""
    d = np.full((len(qs), 1), np.float16(1.0)).view(np.uint8)
    return np.concatenate([d, qs], axis=1)


def test_gguf_halves_unpacks_every_byte_everywhere_as_gguf_does() -> None:
    gguf = pytest.importorskip("gguf", reason="the gguf package (llama.cpp's) is the oracle")
    from gguf import quants

    every = np.arange(256, dtype=np.uint8)
    qs = (every[:, None] + np.arange(16, dtype=np.uint8)).astype(np.uint8)  # b + j at byte j
    codes = GGUF_HALVES.unpack(qs, 32)
    assert codes.shape == (256, 32)
    # Q4_0: value = scale * (code - 8), exact in float32 for a scale of 1
    theirs = quants.dequantize(_q4_0_blocks(qs), gguf.GGMLQuantizationType.Q4_0)
    assert np.array_equal(codes.astype(np.float32) - 8, theirs.reshape(256, 32))
    assert np.array_equal(GGUF_HALVES.pack(codes), qs)  # and back: every byte everywhere


def test_gguf_halves_packs_every_value_at_every_position_as_gguf_does() -> None:
    gguf = pytest.importorskip("gguf", reason="the gguf package (llama.cpp's) is the oracle")
    from gguf import quants

    codes = every_value_everywhere(4, 32)
    # gguf's Q4_0 quantizer codes round(x / d) + 8 with d = -max|x| / 8: values 8 - code
    # with a code 0 (x = 8) in the block give d = -1 and the codes back exactly
    codes[:, 0] = np.where(np.arange(len(codes)) % 32 == 0, codes[:, 0], 0)
    codes[::32, 1] = 0
    blocks = quants.quantize(8.0 - codes.astype(np.float32), gguf.GGMLQuantizationType.Q4_0)
    theirs = blocks.reshape(len(codes), 18)
    assert np.array_equal(theirs[:, :2].copy().view(np.float16), np.full((len(codes), 1), -1.0))
    assert np.array_equal(GGUF_HALVES.pack(codes), theirs[:, 2:])
    assert np.array_equal(GGUF_HALVES.unpack(theirs[:, 2:], 32), codes)  # strided rows


# --- what every layout does alike -------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.name)
def test_pack_keeps_the_low_bits_as_ml_dtypes_reads_them(layout: Layout) -> None:
    """The bits above a value's are dropped: ml_dtypes reads a byte by its low bits too."""
    raw = np.tile(np.arange(256, dtype=np.uint8), layout.group_values)
    mask = (1 << layout.bits) - 1
    assert np.array_equal(layout.pack(raw), layout.pack(raw & mask))
    if layout.bits == 4:
        assert np.array_equal(raw.view(ml_dtypes.int4), (raw & mask).view(ml_dtypes.int4))


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: x.name)
def test_round_trip_of_every_byte_value_at_every_position(layout: Layout) -> None:
    nb = layout.group_bytes
    every = (np.arange(256, dtype=np.uint8)[:, None] + np.arange(nb, dtype=np.uint8)).astype(
        np.uint8
    )  # byte value b + j at byte j of group b: every value at every byte
    count = 256 * layout.group_values
    packed = every.reshape(-1) if layout.whole else every
    values = layout.unpack(packed, count if layout.whole else layout.group_values)
    assert np.array_equal(layout.pack(values), packed)


@pytest.mark.parametrize("layout", [TORCH_X2, GGUF_HALVES], ids=lambda x: x.name)
def test_strided_and_read_only_inputs(layout: Layout) -> None:
    values = RNG.integers(0, 16, (4, 96), dtype=np.uint8)
    strided = values[:, :64]  # rows 96 apart
    strided.flags.writeable = False
    packed = layout.pack(strided)
    assert np.array_equal(packed, layout.pack(strided.copy()))
    wide = np.zeros((4, 40), np.uint8)
    wide[:, 8:] = packed
    assert np.array_equal(layout.unpack(wide[:, 8:], 64), strided)
    assert not np.shares_memory(layout.unpack(packed, 64), packed)


def test_the_ml_dtypes_view_gives_signed_values() -> None:
    """Signed types come back as their low bits: the ml_dtypes view reads the sign."""
    int4 = np.array([-8, -1, 0, 7], ml_dtypes.int4)
    packed = ONNX_4BIT.pack(int4)
    assert packed.tolist() == [0xF8, 0x70]
    back = ONNX_4BIT.unpack(packed, 4)
    assert back.tolist() == [8, 15, 0, 7] and back.view(ml_dtypes.int4).tolist() == [-8, -1, 0, 7]
    int2 = np.array([-2, -1, 0, 1, -2], ml_dtypes.int2)
    assert ONNX_2BIT.unpack(ONNX_2BIT.pack(int2), 5).view(ml_dtypes.int2).tolist() == [
        -2,
        -1,
        0,
        1,
        -2,
    ]


# --- refusals ---------------------------------------------------------------------------


def test_refusals_name_the_fix() -> None:
    with pytest.raises(FormatError, match=r"5 values packed as onnx_4bit take 3 bytes, but 2"):
        ONNX_4BIT.unpack(np.zeros(2, np.uint8), 5)
    with pytest.raises(FormatError, match=r"take 3 bytes a row, but 4 are given; pass the"):
        TORCH_X2.unpack(np.zeros((2, 4), np.uint8), 6)
    with pytest.raises(FormatError, match=r"onnx_6bit take 4 bytes"):  # extra bytes too
        ONNX_6BIT.unpack(np.zeros(6, np.uint8), 5)
    with pytest.raises(InvalidArgumentError, match=r"whole bytes .* pad them to a multiple of 2"):
        TORCH_X2.pack(np.zeros((2, 3), np.uint8))
    with pytest.raises(InvalidArgumentError, match=r"whole blocks of 32 values, got 16; pad"):
        GGUF_HALVES.pack(np.zeros(16, np.uint8))
    with pytest.raises(InvalidArgumentError, match=r"0-d; pass a.reshape\(1\)"):
        TORCH_X2.pack(np.uint8(3))
    with pytest.raises(InvalidArgumentError, match=r"an int >= 0, got -1"):
        ONNX_2BIT.unpack(np.zeros(0, np.uint8), -1)
    with pytest.raises(UnsupportedDtypeError, match=r"one-byte items .* got float32; convert"):
        ONNX_4BIT.pack(np.zeros(4, np.float32))
    with pytest.raises(UnsupportedDtypeError, match=r"got int16"):
        ONNX_4BIT.unpack(np.zeros(4, np.int16), 8)
    big = 1 << 60  # checked against the bytes given before anything is allocated
    with pytest.raises(FormatError, match=r"take 576460752303423488 bytes"):
        ONNX_4BIT.unpack(np.zeros(8, np.uint8), big)


def test_ggml_block_sizes_are_the_same_rule() -> None:
    """ggml's K-quants split runs at other block sizes and widths: the table's line, with
    ``dataclasses.replace``; Q6_K's high bits are value 32q + j in bits 2q of byte j."""
    quarters = dataclasses.replace(GGUF_HALVES, name="q", bits=2, split=128)
    qh = np.array([0b11100100] * 32, np.uint8)  # fields 0, 1, 2, 3
    assert quarters.unpack(qh, 128).tolist() == [0] * 32 + [1] * 32 + [2] * 32 + [3] * 32


def test_the_module_imports_numpy_and_the_errors_only() -> None:
    tree = ast.parse(Path(packing.__file__).read_text())
    imported = {
        (n.module or "") if isinstance(n, ast.ImportFrom) else a.name
        for n in ast.walk(tree)
        if isinstance(n, (ast.Import, ast.ImportFrom))
        for a in n.names
    }
    stdlib = {"__future__", "dataclasses", "functools", "math", "typing"}
    assert imported == {*stdlib, "numpy", "errors"}


def test_docstring_examples_run() -> None:
    result = doctest.testmod(packing)
    assert result.attempted > 0 and result.failed == 0

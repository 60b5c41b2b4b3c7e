"""tensorbridge.io.gguf: the gguf package (llama.cpp's own Python reader/writer) as oracle.

Files written by ``gguf.GGUFWriter`` are read back bit for bit in PyTorch order; files
tensorbridge writes are read by ``gguf.GGUFReader``; quantized tensors dequantize as
``gguf.quants.dequantize`` does; every malformed header raises ``FormatError``.
"""

from __future__ import annotations

import dataclasses
import json
import re
import struct
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge import packing
from tensorbridge.cli import main
from tensorbridge.dtypes import PACKED
from tensorbridge.errors import FormatError, UnsupportedDtypeError, UnsupportedTensorError
from tensorbridge.io import gguf as tbg
from tensorbridge.io._detect import detect
from tensorbridge.io.gguf import reader as tbg_reader
from tensorbridge.io.gguf import writer as tbg_writer
from tensorbridge.quant import ggml
from tensorbridge.quant.ggml import TYPES

gguf = pytest.importorskip("gguf", reason="the gguf package (llama.cpp's) is the oracle")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import quants  # noqa: E402

ARCH = {"general.architecture": "llama"}
PLAIN = {  # ggml type -> the NumPy dtype of its values
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F64": np.dtype(np.float64),
    "I8": np.dtype(np.int8),
    "I16": np.dtype(np.int16),
    "I32": np.dtype(np.int32),
    "I64": np.dtype(np.int64),
}
SHAPE = (2, 3, 64)  # no two dimensions alike: a reversed shape cannot pass by chance


def values(dtype: np.dtype[Any], shape: tuple[int, ...] = SHAPE, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype.kind == "i":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return (rng.standard_normal(shape) * 3).astype(dtype)


def write_with_gguf(path: Path, tensors: dict[str, tuple[np.ndarray, Any]], **kv: Any) -> None:
    """A file written by the gguf package: ``{name: (array, raw_dtype or None)}``."""
    w = gguf.GGUFWriter(str(path), "llama")
    for key, (method, value) in kv.items():
        getattr(w, f"add_{method}")(key, value)
    for name, (a, raw) in tensors.items():
        w.add_tensor(name, a, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reader_tensor(path: Path, name: str) -> Any:
    return next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)


# --- the type table ---------------------------------------------------------------------------


def test_the_type_table_is_ggmls() -> None:
    ours = {t.name: (t.code, t.block_size, t.type_size) for t in TYPES}
    theirs = {q.name: (int(q), *gguf.GGML_QUANT_SIZES[q]) for q in Q}
    assert ours == theirs


# --- reading what the gguf package wrote ------------------------------------------------------


@pytest.mark.parametrize("ggml", list(PLAIN))
def test_every_plain_type_written_by_gguf(ggml: str, tmp_path: Path) -> None:
    a = values(PLAIN[ggml])
    path = tmp_path / "m.gguf"
    if ggml == "BF16":  # the gguf package takes bf16 as its bits with raw_dtype
        write_with_gguf(path, {"w": (a.view(np.uint16), Q.BF16)})
    else:
        write_with_gguf(path, {"w": (a, None)})
    with tb.open(path) as f:
        got = f["w"]
        assert f.ggml_type("w") == ggml and f.info("w")[1] == SHAPE
        assert got.dtype == PLAIN[ggml] and got.shape == SHAPE  # PyTorch order, not GGUF's
        assert got.tobytes() == a.tobytes()
        assert not got.flags.writeable
        t = f.get("w", framework="torch")
        assert t.dtype == tb.resolve_dtype(PLAIN[ggml]).torch and tuple(t.shape) == SHAPE
    theirs = reader_tensor(path, "w")
    assert list(theirs.shape) == list(reversed(SHAPE))  # GGUF stores ne[0] (the row) first
    assert theirs.data.tobytes() == a.tobytes()


def test_bf16_is_bfloat16_zero_copy_not_raw_bytes(tmp_path: Path) -> None:
    a = values(PLAIN["BF16"], (5, 96))
    path = tmp_path / "m.gguf"
    write_with_gguf(path, {"w": (a.view(np.uint16), Q.BF16)})
    # what vllm #29948 and modular #6660 were handed: raw bytes, twice the columns
    assert reader_tensor(path, "w").data.dtype == np.uint8
    assert reader_tensor(path, "w").data.shape == (5, 192)
    with tb.open(path) as f:
        got = f["w"]
        assert got.dtype == ml_dtypes.bfloat16 and got.shape == (5, 96)
        assert np.array_equal(got.view(np.uint16), a.view(np.uint16))
        raw = f.raw("w")  # a view of the mapped file
        assert np.shares_memory(got, raw) and np.shares_memory(got, f["w"])
        assert not got.flags.writeable and not got.flags.owndata
        with pytest.raises(ValueError, match="read-only"):
            got[0, 0] = 1
        t = f.get("w", framework="torch")
        t[0, 0] = 7.0  # copy-on-write: the file is unchanged
        owned = f.get("w", mmap=False)
        assert owned.flags.writeable and not np.shares_memory(owned, raw)
    assert tb.load(path)["w"].tobytes() == a.tobytes()


def test_metadata_of_every_value_type(tmp_path: Path) -> None:
    kv = {
        "a.u8": ("uint8", 200),
        "a.i8": ("int8", -100),
        "a.u16": ("uint16", 60000),
        "a.i16": ("int16", -30000),
        "a.u32": ("uint32", 4096),
        "a.i32": ("int32", -5),
        "a.u64": ("uint64", 2**40),
        "a.i64": ("int64", -(2**40)),
        "a.f32": ("float32", 1e-5),
        "a.f64": ("float64", 0.1),
        "a.bool": ("bool", True),
        "a.str": ("string", "héllo"),
        "a.tokens": ("array", ["<s>", "</s>", "▁the"]),
        "a.scores": ("array", [0.0, -1.5]),
        "a.types": ("array", [1, 2, 3]),
        "a.flags": ("array", [True, False]),
    }
    path = tmp_path / "m.gguf"
    write_with_gguf(path, {"w": (np.zeros(4, np.float32), None)}, **kv)
    with tb.open(path) as f:
        types = f.metadata_types
        typed = f.plain_values()
        text = f.metadata
    assert types["general.architecture"] == "STRING" and text["general.architecture"] == "llama"
    assert [types[k] for k in kv] == [
        "UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "UINT64", "INT64",
        "FLOAT32", "FLOAT64", "BOOL", "STRING", "ARRAY[STRING]", "ARRAY[FLOAT32]",
        "ARRAY[INT32]", "ARRAY[BOOL]",
    ]  # fmt: skip
    assert typed["a.u32"] == 4096 and type(typed["a.u32"]) is np.uint32
    assert typed["a.f32"] == np.float32(1e-5) and typed["a.f64"] == 0.1
    assert typed["a.bool"] is True and typed["a.tokens"] == ["<s>", "</s>", "▁the"]
    assert typed["a.flags"] == [True, False] and text["a.flags"] == "[true, false]"
    assert text["a.tokens"] == '["<s>", "</s>", "▁the"]' and text["a.u64"] == str(2**40)
    # written back by tensorbridge: every type kept, as the gguf package reads it
    out = tmp_path / "out.gguf"
    tb.save({"w": np.zeros(4, np.float32)}, out, metadata=typed)
    fields = gguf.GGUFReader(str(out)).fields
    for key in kv:
        assert fields[key].types[0].name == types[key].split("[")[0], key
        assert fields[key].contents() == pytest.approx(typed[key]), key


# --- quantized tensors ------------------------------------------------------------------------

QUANTIZABLE = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "MXFP4", "TQ2_0"]
FROM_BITS = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS", "NVFP4"]


def quantized_blocks(name: str, rows: int, width: int, seed: int = 0) -> np.ndarray:
    """Blocks of type ``name``: gguf's quantizer where it has one, else random bits with
    finite f16 scales (the K-quants' and NVFP4's layouts, written as llama.cpp would)."""
    qtype = Q[name]
    rng = np.random.default_rng(seed)
    if name in QUANTIZABLE:
        return np.asarray(
            quants.quantize(rng.standard_normal((rows, width)).astype(np.float32), qtype)
        )
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    b = rng.integers(0, 256, (rows, width // block, size), dtype=np.uint8)
    if name != "NVFP4":  # f16 scales at the start of each block: keep them finite
        scale = rng.uniform(-0.1, 0.1, (rows, width // block, 2)).astype(np.float16)
        b[..., :2] = scale[..., :1].view(np.uint8).reshape(rows, width // block, 2)
        if name in ("Q2_K", "Q4_K", "Q5_K"):  # d and dmin
            b[..., 2:4] = b[..., :2]
        if name in ("Q3_K", "Q6_K"):  # d is the last two bytes
            b[..., -2:] = b[..., :2]
    return b.reshape(rows, -1)


@pytest.mark.parametrize("name", QUANTIZABLE + FROM_BITS)
def test_quantized_types_dequantize_as_gguf_does(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows, width = 5, 256
    blocks = quantized_blocks(name, rows, width)
    path = tmp_path / "q.gguf"
    write_with_gguf(path, {"q": (blocks, Q[name]), "n": (np.ones(3, np.float32), None)})
    reference = quants.dequantize(blocks, Q[name])
    assert reference.shape == (rows, width)
    with tb.open(path) as f:
        assert f.ggml_type("q") == name and f.keys() == ["q", "n"]
        assert f.raw("q").tobytes() == blocks.tobytes()
        block, size = gguf.GGML_QUANT_SIZES[Q[name]]
        assert f.raw("q").shape == (rows, width // block, size)
        with pytest.raises(UnsupportedDtypeError, match=r"open it with dequantize='bf16'"):
            f["q"]
        assert list(f.unsupported()) == ["q"] and f.notes == [
            f"q.gguf holds quantized tensors (1 {name}); read with dequantize='bf16' "
            "(or 'f32', 'f16'), or as blocks with raw()"
        ]
    with pytest.raises(UnsupportedDtypeError, match=rf"tensor 'q' is {name}, ggml's"):
        tb.load(path)
    monkeypatch.setattr(ggml, "_DEQUANTIZE_CHUNK", 4 * 32 * 3)  # 1-3 blocks a step
    got = tb.load(path, dequantize="f32")
    assert got["q"].dtype == np.float32 and got["q"].shape == (rows, width)
    assert got["q"].tobytes() == reference.tobytes()  # bit for bit, NaN payloads included
    assert got["n"].tobytes() == np.ones(3, np.float32).tobytes()  # plain: as stored
    bf16 = tb.load(path, dequantize="bf16", framework="torch")["q"]
    assert torch.equal(
        bf16.view(torch.int16), torch.from_numpy(reference).bfloat16().view(torch.int16)
    )


def test_mxfp4_nibble_order_is_the_layouts_not_a_global_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # one MXFP4 block: e8m0 scale byte 127 (2**0), then the codes of 32 values
    codes = np.array([1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 14, 15, 0, 8] * 2, np.uint8)
    codes[16:] = codes[16:][::-1]
    packed = codes[:16] | (codes[16:] << 4)  # GGUF: element j low, element j + 16 high
    block = np.concatenate([[127], packed]).astype(np.uint8).reshape(1, 17)
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    expected = e2m1[codes]
    got = tbg.dequantize_blocks(block, "MXFP4", (32,))
    assert got.tolist() == expected.tolist()
    assert quants.dequantize(block, Q.MXFP4).reshape(-1).tolist() == expected.tolist()
    # the same 16 bytes read the safetensors F4 / torchao / gpt-oss way (2j low, 2j + 1 high)
    f4 = next(p for p in PACKED if p.safetensors == "F4")
    interleaved = f4.unpack(packed).astype(np.float32)
    assert interleaved.tolist() == e2m1[np.stack([codes[:16], codes[16:]], 1).reshape(-1)].tolist()
    assert interleaved.tolist() != expected.tolist()
    assert "element j in the low nibble and element j + 16" in ggml.BY_NAME["MXFP4"].layout
    assert [t.name for t in TYPES if t.packing] == ["Q4_0", "Q4_1", "IQ4_NL", "MXFP4", "NVFP4"]
    assert {t.packing.name for t in TYPES if t.packing} == {"gguf_halves", "gguf_halves_16"}
    assert ggml.BY_NAME["MXFP4"].packing is packing.GGUF_HALVES
    # the kernel follows the row: told TORCH_X2, the same bytes give safetensors' order
    mxfp4 = dataclasses.replace(ggml.BY_NAME["MXFP4"], packing=packing.TORCH_X2)
    monkeypatch.setitem(ggml.BY_NAME, "MXFP4", mxfp4)
    pairs = tbg.dequantize_blocks(block, "MXFP4", (32,))
    assert pairs.tolist() == interleaved.tolist()


def test_nvfp4_nibble_order_within_its_sub_blocks(tmp_path: Path) -> None:
    codes = np.arange(64, dtype=np.uint8) % 16
    qs = codes.reshape(4, 2, 8)  # per 16-value sub-block: j low, j + 8 high
    packed = (qs[:, 0] | (qs[:, 1] << 4)).reshape(-1)
    scales = np.full(4, 0x38, np.uint8)  # ue4m3 1.0
    block = np.concatenate([scales, packed]).reshape(1, 36)
    e2m1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])
    got = tbg.dequantize_blocks(block, "NVFP4", (64,))
    assert got.tolist() == e2m1[codes].tolist()
    assert got.tolist() == quants.dequantize(block, Q.NVFP4).reshape(-1).tolist()


def test_dequantize_refusals(tmp_path: Path) -> None:
    path = tmp_path / "q.gguf"
    write_with_gguf(path, {"q": (quantized_blocks("Q8_0", 2, 64), Q.Q8_0)})
    with pytest.raises(UnsupportedDtypeError, match=r"dequantize='int8' is not a dtype to"):
        tb.open(path, dequantize="int8")
    st = tmp_path / "a.safetensors"
    tb.save({"x": np.zeros(2)}, st)
    with tb.open(st, dequantize="bf16") as plain:  # nothing quantized: read as stored
        assert plain["x"].dtype == np.float64
    with pytest.raises(ValueError, match=r"a GGUF file's tensors name their own types"):
        tb.open(path, dequantize="bf16", scheme="mxfp4")
    with tb.open(path, dequantize="bf16") as f:
        assert f.info("q")[0].name == "bfloat16" and f.nbytes("q") == 2 * 64 * 2
        assert f.notes[0].endswith("read as bfloat16 (dequantized)")
        assert f["q"].dtype == ml_dtypes.bfloat16 and not f["q"].flags.writeable
        assert f.get("q", mmap=False).flags.writeable


# --- writing ----------------------------------------------------------------------------------


@pytest.mark.parametrize("ggml", list(PLAIN))
def test_save_round_trips_and_gguf_reads_it(ggml: str, tmp_path: Path) -> None:
    a = values(PLAIN[ggml])
    path = tmp_path / "m.gguf"
    tb.save(
        {
            "blk.0.w": torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
            if ggml == "BF16"
            else a
        },
        path,
        metadata=ARCH,
    )
    got = tb.load(path)["blk.0.w"]
    assert got.dtype == PLAIN[ggml] and got.shape == SHAPE and got.tobytes() == a.tobytes()
    theirs = reader_tensor(path, "blk.0.w")
    assert theirs.tensor_type.name == ggml and list(theirs.shape) == list(reversed(SHAPE))
    assert theirs.data.tobytes() == a.tobytes()
    assert theirs.data_offset % 32 == 0


def test_save_layout_and_metadata_as_gguf_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    sd = {"a": np.arange(3, dtype=np.float32), "model.layers.0.b": torch.ones(2, 5)}
    meta = {
        **ARCH,
        "llama.block_count": 1,
        "llama.rope.freq_base": 10000.0,
        "x.neg": -3,
        "x.tokens": ["a", "b\udcff"],  # a token that is not valid UTF-8 survives
        "x.types": [1, 2],
        "x.exact": np.float64(0.1),
        "general.alignment": np.uint32(64),
    }
    tb.save(sd, path, metadata=meta)
    r = gguf.GGUFReader(str(path))
    assert [t.name for t in r.tensors] == ["a", "model.layers.0.b"]  # names as given
    assert r.alignment == 64 and all(t.data_offset % 64 == 0 for t in r.tensors)
    types = {k: [t.name for t in f.types] for k, f in r.fields.items()}
    assert types["general.architecture"] == ["STRING"]
    assert types["llama.block_count"] == ["UINT32"] and types["x.neg"] == ["INT32"]
    assert types["llama.rope.freq_base"] == ["FLOAT32"] and types["x.exact"] == ["FLOAT64"]
    assert types["x.types"] == ["ARRAY", "INT32"] and types["x.tokens"] == ["ARRAY", "STRING"]
    assert list(r.fields)[3] == "general.architecture"  # first, after GGUF's own fields
    with tb.open(path) as f:
        assert f.plain_values()["x.tokens"] == ["a", "b\udcff"] and f.alignment == 64


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_q8_0_is_bit_identical_to_ggufs_quantizer(dtype: torch.dtype, tmp_path: Path) -> None:
    x = torch.randn(7, 96, dtype=torch.float64).mul(5).to(dtype)
    x[0, :32] = 0  # an all-zero block
    path = tmp_path / "q.gguf"
    tbg.save(
        {"w": x, "norm": torch.ones(96)}, path, metadata=ARCH, quantize="q8_0", chunk_bytes=1000
    )
    want = quants.quantize(tb.to_numpy(x.float()), Q.Q8_0)
    with tb.open(path) as f:
        assert f.ggml_type("w") == "Q8_0" and f.ggml_type("norm") == "F32"  # 1-d stays
        assert f.raw("w").tobytes() == np.asarray(want).tobytes()
    theirs = reader_tensor(path, "w")
    assert theirs.tensor_type == Q.Q8_0 and theirs.data.tobytes() == np.asarray(want).tobytes()
    back = tb.load(path, dequantize="f32")["w"]
    assert np.array_equal(back, quants.dequantize(np.asarray(want), Q.Q8_0))


@pytest.mark.parametrize(
    "row", [r for r in tb.dtype_table() if not r.kernels], ids=lambda r: r.name
)
def test_the_new_rows_are_refused_naming_npy_or_cast(tmp_path: Path, row: tb.DTypeRow) -> None:
    """GGUF has no type for int4, float6, ...: refused naming .npy/.npz; a float row casts
    with float_dtype= (ml_dtypes' cast: torch has no kernel) or quantizes to Q8_0."""
    path = tmp_path / "m.gguf"
    a = np.arange(64, dtype=np.uint8)[: 32 * row.itemsize].view(row.numpy).reshape(2, -1)
    for value in (a, tb.to_torch(a)) if row.in_torch else (a,):
        with pytest.raises(UnsupportedDtypeError) as info:
            tb.save({"x": value}, path, metadata=ARCH)
        assert str(info.value).endswith(
            f"GGUF has no tensor type for {row.name}; it holds float32, float16, int8, int16, "
            f"int32, int64, float64, bfloat16 (save it to .npy or .npz, which keep {row.name} "
            "as it is)"
        )
    assert not path.exists()
    if row.is_floating:
        tb.save({"x": a}, path, metadata=ARCH, float_dtype="float32")
        want = tb.to_numpy(a, dtype="float32")
        assert tb.load(path)["x"].tobytes() == want.tobytes()  # NaN payloads included
        tb.save({"x": a.reshape(1, -1)}, path, metadata=ARCH, quantize="q8_0", overwrite=True)
        with tb.open(path, dequantize="float32") as f:  # Q8_0 of the values: 1/127 of max
            error = np.abs(f["x"] - want.reshape(1, -1))
        assert np.isfinite(want).all() and error.max() <= np.abs(want).max() / 127


def test_save_refusals(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    w = {"w": np.zeros((2, 32), np.float32)}
    with pytest.raises(FormatError, match=r"needs the metadata key 'general.architecture'"):
        tb.save(w, path)
    with pytest.raises(FormatError, match=r"'general.architecture'"):
        tb.save(w, path, metadata={"general.name": "x"})
    for bad, match in [
        (np.zeros(2, np.bool_), r"GGUF has no tensor type for bool"),
        (np.zeros(2, np.uint8), r"GGUF has no tensor type for uint8"),
        (np.zeros(2, np.complex64), r"GGUF has no tensor type for complex64"),
    ]:
        with pytest.raises(UnsupportedDtypeError, match=match):
            tb.save({"x": bad}, path, metadata=ARCH)
    with pytest.raises(UnsupportedTensorError, match=r"has 5 dimensions; GGUF holds at most 4"):
        tb.save({"x": np.zeros((1, 1, 1, 1, 2))}, path, metadata=ARCH)
    with pytest.raises(UnsupportedTensorError, match=r"blocks of 32 values; the last dimension"):
        tb.save({"x": np.zeros((2, 48), np.float32)}, path, metadata=ARCH, quantize="q8_0")
    with pytest.raises(ValueError, match=r"tensorbridge writes Q8_0"):
        tb.save(w, path, metadata=ARCH, quantize="q4_k")
    with pytest.raises(ValueError, match=r"quantize= writes GGUF's Q8_0 blocks"):
        tb.save(w, tmp_path / "m.safetensors", quantize="q8_0")
    with pytest.raises(TypeError, match=r"metadata 'x': dict is no GGUF value"):
        tb.save(w, path, metadata={**ARCH, "x": {"a": 1}})
    assert not path.exists() and list(tmp_path.iterdir()) == []


def test_save_is_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "m.gguf"
    tb.save({"w": np.ones(4, np.float32)}, path, metadata=ARCH)
    before = path.read_bytes()

    def broken(it: Any, chunk_bytes: int) -> Any:
        yield b"\0" * 8
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(tbg_writer, "_chunks", broken)
    with pytest.raises(RuntimeError, match="disk on fire"):
        tb.save({"w": np.zeros(4, np.float32)}, path, metadata=ARCH, overwrite=True)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["m.gguf"]


# --- detection, the command line ---------------------------------------------------------------


def test_detected_by_magic_whatever_its_name(tmp_path: Path) -> None:
    path = tmp_path / "model.bin"
    tb.save({"w": np.ones(2, np.float16)}, tmp_path / "m.gguf", metadata=ARCH)
    (tmp_path / "m.gguf").rename(path)
    assert detect(path) == "gguf"
    with tb.open(path) as f:
        assert f.notes == [
            "model.bin is a GGUF file, not a torch zip archive; read it as such (rename it to "
            "model.gguf)"
        ]


def test_cli_inspect_convert_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "m.gguf"
    write_with_gguf(
        src,
        {
            "tok_embd.weight": (values(PLAIN["F16"], (4, 64)), None),
            "q": (quantized_blocks("Q4_0", 2, 64), Q.Q4_0),
        },
        **{"llama.context_length": ("uint32", 2048)},
    )
    assert main(["inspect", str(src)]) == 0
    out, err = capsys.readouterr()
    assert re.search(r"tok_embd.weight +float16 +\(4, 64\)", out) and "1 unsupported" in out
    # the command line names its option, not the Python argument
    assert "open it with --dequantize bf16 (or f32, f16)" in out
    assert "holds quantized tensors (1 Q4_0)" in err
    assert main(["inspect", "--dequantize", "bf16", str(src)]) == 0
    out, _ = capsys.readouterr()
    assert re.search(r"\nq +bfloat16 +\(2, 64\) +256 B", out)
    dst = tmp_path / "out.safetensors"
    assert main(["convert", "--dequantize", "f32", str(src), str(dst), "--verify"]) == 0
    out, _ = capsys.readouterr()
    assert "verify: bit-exact" in out
    got = tb.load(dst)
    assert (
        got["q"].tobytes() == quants.dequantize(quantized_blocks("Q4_0", 2, 64), Q.Q4_0).tobytes()
    )
    with tb.open(dst) as f:
        assert f.metadata["llama.context_length"] == "2048"
    assert main(["compare", "--dequantize", "f32", str(src), str(dst)]) == 0
    assert main(["convert", str(src), str(tmp_path / "x.safetensors")]) == 1
    _, err = capsys.readouterr()
    assert "open it with --dequantize bf16" in err


# --- untrusted headers ------------------------------------------------------------------------


def header(
    *,
    version: int = 3,
    kv: list[bytes] | None = None,
    tensors: list[bytes] | None = None,
    n_tensors: int | None = None,
    n_kv: int | None = None,
    data: bytes = b"",
) -> bytes:
    kv = kv or []
    tensors = tensors or []
    out = b"GGUF" + struct.pack(
        "<IQQ",
        version,
        len(tensors) if n_tensors is None else n_tensors,
        len(kv) if n_kv is None else n_kv,
    )
    out += b"".join(kv) + b"".join(tensors)
    out += bytes(-len(out) % 32)
    return out + data


def s(text: str | bytes, length: int | None = None) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def kv_str(key: str, value: str) -> bytes:
    return s(key) + struct.pack("<I", 8) + s(value)


def ti(name: str, dims: list[int], ggml: int = 0, offset: int = 0) -> bytes:
    return (
        s(name)
        + struct.pack("<I", len(dims))
        + b"".join(struct.pack("<Q", d) for d in dims)
        + struct.pack("<IQ", ggml, offset)
    )


ARCH_KV = kv_str("general.architecture", "llama")
CORRUPT: dict[str, tuple[bytes, str]] = {
    "version 1": (header(version=1), r"is GGUF version 1; tensorbridge reads versions 2 and 3"),
    "big-endian": (header(version=3 << 24), r"is a big-endian GGUF file"),
    "huge tensor count": (
        header(n_tensors=2**62),
        r"claims 4611686018427387904 tensors and 0 key-value pairs, more than",
    ),
    "huge kv count": (header(n_kv=2**40), r"claims 0 tensors and 1099511627776 key-value pairs"),
    "huge string": (header(kv=[s("k", 2**60)]), r"key 0 \(1152921504606846976 bytes\) needs"),
    "huge array": (
        header(kv=[s("k") + struct.pack("<IIQ", 9, 4, 2**60)]),
        r"key 'k' claims 1152921504606846976 items of UINT32",
    ),
    "nested array": (
        header(kv=[s("k") + struct.pack("<IIQ", 9, 9, 1) + bytes(16)]),
        r"key 'k' is an array of arrays",
    ),
    "unknown value type": (
        header(kv=[s("k") + struct.pack("<I", 13) + bytes(8)]),
        r"key 'k' has unknown value type 13",
    ),
    "duplicate key": (header(kv=[ARCH_KV, ARCH_KV]), r"key 'general.architecture' appears twice"),
    "bad alignment": (
        header(kv=[s("general.alignment") + struct.pack("<II", 4, 48)]),
        r"general.alignment is 48 \(UINT32\); it must be a UINT32 power of two",
    ),
    "alignment type": (
        header(kv=[s("general.alignment") + struct.pack("<Ii", 5, 32)]),
        r"general.alignment is 32 \(INT32\)",
    ),
    "5 dims": (
        header(tensors=[ti("t", [1, 1, 1, 1, 1])], data=bytes(32)),
        r"tensor 't' has 5 dimensions; GGUF allows 4",
    ),
    "unknown type": (
        header(tensors=[ti("t", [1], ggml=4)], data=bytes(32)),
        r"tensor 't' has ggml type 4, which is unknown or removed",
    ),
    "duplicate tensor": (
        header(tensors=[ti("t", [1]), ti("t", [1], offset=32)], data=bytes(64)),
        r"tensor 't' appears twice",
    ),
    "overflow": (
        header(tensors=[ti("t", [2**32, 2**32])], data=bytes(32)),
        r"tensor 't' has shape \[4294967296, 4294967296\]: more than 2\*\*63 elements",
    ),
    "past the end": (
        header(tensors=[ti("t", [16])], data=bytes(32)),
        r"tensor 't' \(F32, shape \[16\]\) takes bytes .* past the end",
    ),
    "misaligned": (
        header(tensors=[ti("t", [1], offset=4)], data=bytes(64)),
        r"tensor 't''s offset 4 is not a multiple of 32",
    ),
    "overlap": (
        header(tensors=[ti("a", [16]), ti("b", [8], offset=32)], data=bytes(128)),
        r"tensors 'a' and 'b' overlap",
    ),
    "partial block": (
        header(tensors=[ti("t", [48, 2], ggml=8)], data=bytes(128)),
        r"tensor 't' is Q8_0 with rows of 48 values, not a multiple of its block of 32",
    ),
}


@pytest.mark.parametrize("case", list(CORRUPT))
def test_corrupt_headers_raise_format_errors(case: str, tmp_path: Path) -> None:
    data, match = CORRUPT[case]
    path = tmp_path / "bad.gguf"
    path.write_bytes(data)
    with pytest.raises(FormatError, match=match):
        tb.open(path)


def test_every_truncation_raises_a_format_error(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    tb.save(
        {"w": np.arange(8, dtype=np.float32), "v": np.ones((2, 3), np.float16)},
        path,
        metadata={**ARCH, "t": ["a", "bc"], "n": 3},
    )
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    with tb.open(path) as f:
        end = f.entry("w").begin  # the header and its padding
        last = f.entry("v").begin + f.entry("v").nbytes  # the padding after it is optional
    for n in [1, 3, 4, 7, 8, 20, 24, *range(30, end, 7), last - 1]:
        cut.write_bytes(data[:n])
        with pytest.raises(FormatError, match=r"truncated or corrupt|no GGUF file|is GGUF version"):
            tb.open(cut)
    cut.write_bytes(b"")
    with pytest.raises(FormatError, match=r"is empty"):
        tb.open(cut)


def test_open_does_not_allocate_what_a_header_claims(tmp_path: Path) -> None:
    # a 40-byte file claiming 2**60 tensors is refused before any list of that size exists
    path = tmp_path / "bad.gguf"
    path.write_bytes(header(n_tensors=2**60, n_kv=2**60))
    with pytest.raises(FormatError, match=r"more than the file's 32 bytes can hold"):
        tb.open(path)


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "MXFP4", "Q4_K", "Q6_K"])
def test_own_kernels_match_gguf_on_every_bit_pattern(name: str) -> None:
    # random bytes: every code, and f16 / e8m0 scales that are subnormal, inf or NaN
    block, size = gguf.GGML_QUANT_SIZES[Q[name]]
    rng = np.random.default_rng(1)
    blocks = rng.integers(0, 256, (4096, size), dtype=np.uint8)
    blocks[:256, 0] = np.arange(256)  # every scale byte (MXFP4's whole scale)
    with np.errstate(all="ignore"):
        want = quants.dequantize(blocks, Q[name])
    got = tbg.dequantize_blocks(blocks, name, (4096 * block,))
    assert got.view(np.uint32).tobytes() == want.reshape(-1).view(np.uint32).tobytes()
    bf16 = tbg.dequantize_blocks(blocks, name, (4096 * block,), "bf16")
    assert (
        bf16.tobytes()
        == torch.from_numpy(want.reshape(-1)).bfloat16().view(torch.int16).numpy().tobytes()
    )


@pytest.mark.parametrize("module", [tbg, tbg_reader, tbg_writer, ggml, tb.io])
def test_docstring_examples_run(module: Any) -> None:
    import doctest

    # the package's submodules' examples use its public names (save, open) as one
    public = {name: getattr(tbg, name) for name in tbg.__all__}
    result = doctest.testmod(module, extraglobs=public, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted > 0


def test_inspect_cuts_long_metadata_short(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.gguf"
    tokens = [f"token{i}" for i in range(1000)]
    tb.save({"w": np.ones(2)}, path, metadata={**ARCH, "tokenizer.ggml.tokens": tokens})
    assert main(["inspect", str(path)]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    shown = json.loads(line.removeprefix("metadata: "))["tokenizer.ggml.tokens"]  # cut, as text
    assert shown.startswith('["token0", "token1"') and len(line) < 300
    assert shown.endswith(f"... ({len(json.dumps(tokens)):,} characters; --json shows them all)")
    assert main(["inspect", "--json", str(path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report[0]["metadata"]["tokenizer.ggml.tokens"] == tokens  # a JSON array, whole


def test_convert_gguf_to_gguf_keeps_every_metadata_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_with_gguf(
        src,
        {"w": (values(PLAIN["F32"], (3, 64)), None)},
        **{"x.u16": ("uint16", 7), "x.i64": ("int64", -1), "x.f32": ("float32", 0.1)},
    )
    assert main(["convert", str(src), str(dst), "--float-dtype", "f16", "--verify"]) == 0
    assert "verify: bit-exact to the source cast to float16" in capsys.readouterr().out
    with tb.open(src) as a, tb.open(dst) as b:
        assert b.metadata_types == a.metadata_types and b.metadata == a.metadata
        assert b.ggml_type("w") == "F16"


def test_version_2_scalars_empty_tensors_and_directories(tmp_path: Path) -> None:
    path = tmp_path / "m.gguf"
    sd = {"s": np.array(3.5, np.float32), "e": np.zeros((0, 4), np.float16)}
    tb.save(sd, path, metadata=ARCH)
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack("<I", 2)  # GGUF v2 has v3's layout
    path.write_bytes(bytes(data))
    with tb.open(tmp_path) as f:  # a directory holding one .gguf file
        assert f.version == 2 and f.keys() == ["s", "e"]
        assert f["s"].shape == () and f["s"] == 3.5 and f["e"].shape == (0, 4)
    assert [list(t.shape) for t in gguf.GGUFReader(str(path)).tensors] == [[], [4, 0]]


def test_string_arrays_are_walked_across_windows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorbridge.io import _gguf_header

    monkeypatch.setattr(_gguf_header, "_SPAN", 24)  # windows shorter than some strings
    tokens = ["", "a", "x" * 50, "bc", "y" * 17, "z"] * 5
    path = tmp_path / "m.gguf"
    tb.save({"w": np.ones(3)}, path, metadata={**ARCH, "t": tokens, "after": "end"})
    with tb.open(path) as f:
        assert f.plain_values()["t"] == tokens and f.metadata["after"] == "end"
        assert f["w"].tolist() == [1.0, 1.0, 1.0]
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: data.index(b"x" * 50) + 300])  # inside the array: a walk fails
    with pytest.raises(FormatError, match=r"key 't''s 30 strings run past the end of the file"):
        tb.open(cut)


@pytest.mark.parametrize("seed", range(4))
def test_string_array_walk_matches_a_plain_walk(seed: int) -> None:
    """The vectorized walk over a string array ends where reading every length one by
    one ends: empty strings, NUL bytes and runs of them inside the text (false starts),
    strings of 255, 256 and 70,000 bytes, across window boundaries; one byte short of
    the last string is reported truncated."""
    from tensorbridge.io import _gguf_header

    rng = np.random.default_rng(seed)
    pool = [b"", b"\0", b"\0" * 8, b"a\0\0\0\0\0\0\0\0b", b"x" * 255, b"y" * 256, b"z" * 70_000]
    items = []
    for _ in range(3000):
        if rng.random() < 0.2:
            items.append(pool[rng.integers(len(pool))])
        else:
            items.append(rng.integers(0, 256, rng.integers(0, 40), dtype=np.uint8).tobytes())
    data = b"".join(struct.pack("<Q", len(t)) + t for t in items) + bytes(64)
    end = len(data) - 64
    for span in (24, 1 << 16):
        _gguf_header._SPAN = span
        try:
            assert _gguf_header._skip_strings(data, 0, len(items), len(data)) == end
            assert _gguf_header._skip_strings(data, 0, len(items), end - 1) > end - 1
            assert _gguf_header._strings(data, 0, len(items)) == [
                t.decode("utf-8", "surrogateescape") for t in items
            ]
        finally:
            _gguf_header._SPAN = 1 << 16


# --- split sets (llama.cpp's gguf-split) -----------------------------------------------------


def write_split(d: Path, n_tensors: int = 5, per_shard: int = 2) -> list[Path]:
    """A set written by the gguf package's own splitter (``split_max_tensors``):
    ``m-00001-of-00003.gguf`` ... with split.no / split.count / split.tensors.count,
    the model's metadata in the first shard only, as llama.cpp's gguf-split writes."""
    d.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(d / "m.gguf"), "llama", split_max_tensors=per_shard)
    w.add_uint32("llama.context_length", 2048)
    for i in range(n_tensors):
        w.add_tensor(f"blk.{i}.w", values(PLAIN["F16"], (3, 32), seed=i))
    w.add_tensor("q", quantized_blocks("Q4_0", 2, 64), raw_dtype=Q.Q4_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return sorted(d.glob("*.gguf"))


def test_split_set_opens_whole_from_any_shard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    shards = write_split(tmp_path / "set")
    assert [p.name for p in shards] == [f"m-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    names = [f"blk.{i}.w" for i in range(5)] + ["q"]
    for opened in [*shards, tmp_path / "set"]:
        with tb.open(opened, dequantize="f32") as f:
            assert f.keys() == names and f.paths == shards
            assert not any(k.startswith("split.") for k in f.metadata)
            assert f.metadata["llama.context_length"] == "2048"
            for i in range(5):
                assert np.array_equal(f[f"blk.{i}.w"], values(PLAIN["F16"], (3, 32), seed=i))
            want = quants.dequantize(quantized_blocks("Q4_0", 2, 64), Q.Q4_0)
            assert f["q"].tobytes() == want.tobytes()
    got = tb.load(shards[2], dequantize="bf16")
    assert list(got) == names and got["blk.4.w"].dtype == np.float16
    assert main(["inspect", str(shards[1])]) == 0
    out, err = capsys.readouterr()
    assert "blk.0.w" in out and "blk.4.w" in out and "split set: 3 files" in err
    dst = tmp_path / "one.gguf"
    assert main(["convert", "--dequantize", "f32", str(shards[0]), str(dst)]) == 0
    r = gguf.GGUFReader(str(dst))
    assert [t.name for t in r.tensors] == names and "split.count" not in r.fields


def test_split_set_missing_or_inconsistent_shard_is_refused(tmp_path: Path) -> None:
    shards = write_split(tmp_path / "a")
    shards[1].unlink()
    with pytest.raises(FormatError, match=r"m-00002-of-00003.gguf', shard 2 of 3 .* is missing"):
        tb.open(shards[0])
    # a shard of another split of another model, renamed into the set
    write_split(tmp_path / "b", n_tensors=7)
    (tmp_path / "b" / "m-00002-of-00004.gguf").rename(shards[1])
    with pytest.raises(
        FormatError, match=r"says it is shard 2 of 4 with 8 tensors in all, .* shard 2 of 3 with 6"
    ):
        tb.open(shards[2])
    renamed = tmp_path / "a" / "x.gguf"
    shards[0].rename(renamed)
    with pytest.raises(FormatError, match=r"is not named NAME-00001-of-00003.gguf"):
        tb.open(renamed)

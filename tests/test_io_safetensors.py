"""tensorbridge.io.safetensors: bit-exact round trips, the official library as oracle, bad files."""

from __future__ import annotations

import json
import mmap
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge.errors import FormatError, UnsupportedDtypeError, UnsupportedTensorError
from tensorbridge.io import _safetensors_plan
from tensorbridge.io import safetensors as st
from tensorbridge.io.safetensors_header import LAYOUT_ORDER

safetensors_torch = pytest.importorskip(
    "safetensors.torch", reason="the official library is the oracle"
)
safe_open = pytest.importorskip("safetensors").safe_open

F4 = getattr(torch, "float4_e2m1fn_x2", None)
needs_f4 = pytest.mark.skipif(
    F4 is None or not hasattr(ml_dtypes, "float4_e2m1fn"),
    reason="needs torch.float4_e2m1fn_x2 and ml_dtypes.float4_e2m1fn",
)


# --- helpers ----------------------------------------------------------------------------------


def patterns(row: tb.DTypeRow) -> np.ndarray:
    """Every bit pattern of 8- and 16-bit types; edge patterns plus random bits for wider ones."""
    if row.name == "bool":
        return np.array([True, False, True])
    size = row.itemsize
    if size <= 2:
        raw = np.arange(1 << (8 * size)).astype(f"u{size}")
    else:
        edges = [0, 1, (1 << (8 * size)) - 1, 1 << (8 * size - 1), (1 << (8 * size - 1)) - 1]
        edges += [0x7FC00001, 0xFFBFFFFF, 0x7F800001] if size == 4 else []
        edges += [0x7FF0000000000001, 0xFFF8DEADBEEF0001] if size == 8 else []
        rand = np.random.default_rng(size).integers(0, 256, 4096 * size, dtype=np.uint8)
        raw = np.concatenate([np.array(edges, dtype=f"u{size}"), rand.view(f"u{size}")])
    return raw.view(np.uint8).view(row.numpy)


def bits(x: Any) -> bytes:
    if isinstance(x, torch.Tensor):
        return bytes(x.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return bytes(np.ascontiguousarray(x).tobytes())


def base_is_mmap(a: np.ndarray) -> bool:
    base: Any = a
    while isinstance(base, np.ndarray):
        base = base.base
    return isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)


def header_of(path: Path) -> dict[str, Any]:
    data = path.read_bytes()
    return json.loads(data[8 : 8 + struct.unpack("<Q", data[:8])[0]])  # type: ignore[no-any-return]


def raw_file(header: dict[str, Any] | bytes, data: bytes = b"", length: int | None = None) -> bytes:
    text = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(text) if length is None else length) + text + data


SAFETENSORS_ROWS = [r for r in tb.dtype_table() if r.safetensors]


# --- round trips ------------------------------------------------------------------------------


def test_every_table_code_has_a_layout_rank() -> None:
    assert {r.safetensors for r in SAFETENSORS_ROWS} <= set(LAYOUT_ORDER)


def test_round_trip_every_bit_pattern(row: tb.DTypeRow, tmp_path: Path) -> None:
    if row.safetensors is None:
        pytest.skip(reason=f"{row.name} has no safetensors dtype code")
    a = patterns(row)
    t = tb.to_torch(a.copy())
    path = tmp_path / "m.safetensors"
    for source in (a, t):
        st.save({"x": source}, path)
        with st.open(path) as f:
            assert f.info("x") == (row, a.shape)
        out = st.load(path)["x"]
        assert out.dtype == row.numpy and bits(out) == bits(a)
        out_t = st.load(path, framework="torch")["x"]
        assert out_t.dtype == row.torch and bits(out_t) == bits(a)
        owned = st.load(path, framework="torch", mmap=False)["x"]
        assert owned.dtype == row.torch and bits(owned) == bits(a)
        # the official reader sees the same bits
        theirs = safetensors_torch.load_file(path)["x"]
        assert theirs.dtype == row.torch and bits(theirs) == bits(a)


def test_official_files_load_bit_exact(row: tb.DTypeRow, tmp_path: Path) -> None:
    if row.safetensors is None:
        pytest.skip(reason=f"{row.name} has no safetensors dtype code")
    t = tb.to_torch(patterns(row).copy()).reshape(-1, 1)
    path = tmp_path / "theirs.safetensors"
    safetensors_torch.save_file({"x": t, "z": t[:3].clone()}, path)
    for framework in ("numpy", "torch"):
        for mmap_ in (True, False):
            out = st.load(path, framework=framework, mmap=mmap_)
            assert out.keys() == {"x", "z"}
            assert bits(out["x"]) == bits(t) and tuple(out["x"].shape) == tuple(t.shape)


@needs_f4
def test_f4_every_byte(tmp_path: Path) -> None:
    packed = torch.arange(256, dtype=torch.uint8).reshape(128, 2).view(F4)  # type: ignore[arg-type]
    path = tmp_path / "f4.safetensors"
    st.save({"q": packed}, path)
    assert header_of(path)["q"] == {"dtype": "F4", "shape": [128, 4], "data_offsets": [0, 256]}
    assert path.read_bytes() == safetensors_torch.save({"q": packed}, metadata={"format": "pt"})
    # NumPy: one value a byte, element 2i from the low nibble
    values = st.load(path)["q"]
    assert values.dtype == ml_dtypes.float4_e2m1fn and values.shape == (128, 4)
    u = values.view(np.uint8).reshape(-1)
    assert np.array_equal(u[0::2], np.arange(256) & 0x0F)
    assert np.array_equal(u[1::2], np.arange(256) >> 4)
    # torch: packed again, the same bytes
    for mmap_ in (True, False):
        t = st.load(path, framework="torch", mmap=mmap_)["q"]
        assert t.dtype == F4 and t.shape == (128, 2) and bits(t) == bits(packed)
    theirs = safetensors_torch.load_file(path)["q"]
    assert theirs.dtype == F4 and bits(theirs) == bits(packed)
    # NumPy float4 arrays are packed on the way in
    st.save({"q": values}, tmp_path / "np.safetensors")
    assert (tmp_path / "np.safetensors").read_bytes() == path.read_bytes()
    # float_dtype widens the values exactly
    wide = st.load(path, framework="torch", float_dtype=torch.float32)["q"]
    assert torch.equal(wide, torch.from_numpy(values.astype(np.float32)))


@needs_f4
def test_f4_odd_last_dimension(tmp_path: Path) -> None:
    values = np.arange(6, dtype=np.uint8).view(ml_dtypes.float4_e2m1fn).reshape(2, 3)
    path = tmp_path / "odd.safetensors"
    st.save({"q": values}, path)
    assert bits(st.load(path)["q"]) == bits(values)
    with pytest.raises(UnsupportedDtypeError, match=r"even last dimension.*framework='numpy'"):
        st.load(path, framework="torch")
    with pytest.raises(UnsupportedTensorError, match="whole bytes"):
        st.save({"q": values[:1]}, path)


# --- the rows issue 29 added: F4 kept, F6 refused, no code refused -----------------------------

# the table's rows safetensors has no code for, and no packing of (float4_e2m1fn: F4)
NO_CODE = [
    r
    for r in tb.dtype_table()
    if not r.kernels and r.safetensors is None and r.name != "float4_e2m1fn"
]
F6 = {"float6_e2m3fn": "F6_E2M3", "float6_e3m2fn": "F6_E3M2"}


@pytest.mark.parametrize("row", NO_CODE, ids=lambda r: r.name)
def test_rows_without_a_code_are_refused_on_save_naming_npy(
    row: tb.DTypeRow, tmp_path: Path
) -> None:
    a = np.arange(256, dtype=np.uint8)[: 64 * row.itemsize].view(row.numpy)
    path = tmp_path / "m.safetensors"
    if row.name in F6:
        want = (
            f"safetensors defines no bit order for {F6[row.name]} (its source gives only the "
            f"size, 6 bits a value), so tensorbridge neither reads nor writes it; keep "
            f"{row.name} in .npy, .npz or Zarr, which store one value a byte"
        )
    else:
        want = (
            f"{row.name} has no safetensors dtype code; save it to .npy or .npz, which keep "
            f"{row.name} as it is"
        )
    for value in (a, tb.to_torch(a)) if row.in_torch else (a,):
        with pytest.raises(UnsupportedDtypeError) as info:
            st.save({"ok": np.ones(2), "w": value}, path)
        assert str(info.value) == f"cannot save tensor 'w' to {path}: {want}"
    if row.is_floating:  # a cast into it is refused too
        with pytest.raises(UnsupportedDtypeError, match=rf"{row.name} has no safetensors|F6_"):
            st.save({"w": np.ones(4, np.float32)}, path, float_dtype=row.numpy)
    assert not path.exists()


@pytest.mark.parametrize("code", ["F6_E2M3", "F6_E3M2"])
def test_f6_files_are_refused_saying_safetensors_defines_no_bit_order(
    code: str, tmp_path: Path
) -> None:
    """safetensors' own source gives F6 its size (6 bits a value, 4 values in 3 bytes) and
    no bit order; its own readers list such a tensor but cannot give its values."""
    path = tmp_path / "f6.safetensors"
    entry = {
        "x": {"dtype": code, "shape": [4], "data_offsets": [0, 3]},
        "y": {"dtype": "U8", "shape": [1], "data_offsets": [3, 4]},
    }
    path.write_bytes(raw_file(entry, b"\x01\x02\x03\x04"))
    with safe_open(path, "numpy") as theirs:  # the official reader: valid, but no values
        assert sorted(theirs.keys()) == ["x", "y"]
        with pytest.raises(Exception, match=rf"Dtype not understood: {code}"):
            theirs.get_tensor("x")
    name = {v: k for k, v in F6.items()}[code]
    with pytest.raises(FormatError) as info:
        st.open(path)
    assert str(info.value) == (
        f"{path}: tensor 'x': safetensors defines no bit order for {code} (its source gives "
        f"only the size, 6 bits a value), so tensorbridge neither reads nor writes it; keep "
        f"{name} in .npy, .npz or Zarr, which store one value a byte"
    )
    with pytest.raises(FormatError, match=rf"no bit order for {code}"):
        tb.load(path)


@pytest.mark.parametrize("code", ["F8_E8M0", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ"])
def test_float8_codes_read_as_numpy_where_the_official_numpy_reader_fails(
    code: str, tmp_path: Path
) -> None:
    """safetensors' NumPy loader looks for np.float8_* (absent): tensorbridge gives the
    ml_dtypes array, every byte value."""
    row = next(r for r in tb.dtype_table() if r.safetensors == code)
    path = tmp_path / "f8.safetensors"
    path.write_bytes(
        raw_file(
            {"x": {"dtype": code, "shape": [256], "data_offsets": [0, 256]}}, bytes(range(256))
        )
    )
    with safe_open(path, "numpy") as theirs, pytest.raises(AttributeError, match=r"numpy"):
        theirs.get_tensor("x")
    got = st.load(path)["x"]
    assert got.dtype == row.numpy and bits(got) == bytes(range(256))
    st.save({"x": got}, tmp_path / "again.safetensors")
    assert header_of(tmp_path / "again.safetensors")["x"]["dtype"] == code
    assert (tmp_path / "again.safetensors").read_bytes().endswith(bytes(range(256)))


def test_writer_matches_the_official_bytes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    sd = {
        f"t.{r.name}": tb.to_torch(np.resize(patterns(r), 24)).reshape(2, 3, 4)
        for r in SAFETENSORS_ROWS
    }
    sd["scalar"] = torch.tensor(3.5)
    sd["empty"] = torch.zeros(0, 5, dtype=torch.int16)
    sd["é unicode\n"] = torch.from_numpy(rng.standard_normal(7))
    if F4 is not None:
        sd["f4"] = torch.randint(0, 256, (3, 2), dtype=torch.uint8).view(F4)
    path = tmp_path / "m.safetensors"
    st.save(sd, path, metadata={"format": "pt"})
    assert path.read_bytes() == safetensors_torch.save(sd, metadata={"format": "pt"})
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        for k, v in sd.items():
            assert bits(f.get_tensor(k)) == bits(v)


def test_golden_bytes(tmp_path: Path) -> None:
    path = tmp_path / "tiny.safetensors"
    st.save(
        {"b": np.array([1, 2], np.uint8), "a": torch.tensor([1.5], dtype=torch.bfloat16)},
        path,
        metadata={"z": "last", "author": "me"},
    )
    header = (
        b'{"__metadata__":{"author":"me","format":"pt","z":"last"},'
        b'"a":{"dtype":"BF16","shape":[1],"data_offsets":[0,2]},'
        b'"b":{"dtype":"U8","shape":[2],"data_offsets":[2,4]}}'
    )
    header += b" " * (-len(header) % 8)
    assert len(header) == 168
    assert path.read_bytes() == struct.pack("<Q", 168) + header + b"\xc0\x3f\x01\x02"


def test_empty_and_zero_size(tmp_path: Path) -> None:
    path = tmp_path / "e.safetensors"
    st.save({}, path)
    assert path.read_bytes() == b"\x20" + b"\0" * 7 + b'{"__metadata__":{"format":"pt"}}'
    assert st.load(path) == {}
    st.save({"z": torch.zeros(3, 0), "s": np.full((), 2.0)}, path)
    out = st.load(path, framework="torch")
    assert out["z"].shape == (3, 0) and out["s"].shape == () and out["s"].item() == 2.0


# --- memory: views, copy-on-write, owned ------------------------------------------------------


def test_numpy_results_are_read_only_views(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    st.save({"w": torch.arange(6.0).reshape(2, 3)}, path)
    before = path.read_bytes()
    a = st.load(path)["w"]
    assert not a.flags.writeable and base_is_mmap(a)
    with pytest.raises(ValueError, match="read-only"):
        a[0, 0] = 42
    with st.open(path) as f:
        assert np.shares_memory(f["w"], f["w"])  # one mapping, no copies
    owned = st.load(path, mmap=False)["w"]
    assert owned.flags.writeable and not base_is_mmap(owned)
    owned[:] = -1
    assert path.read_bytes() == before


def test_torch_results_are_copy_on_write(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    st.save({"w": torch.arange(6.0), "v": torch.ones(2, dtype=torch.bfloat16)}, path)
    before = path.read_bytes()
    with st.open(path) as f:
        t1, t2 = f.get("w", framework="torch"), f.get("w", framework="torch")
        assert t1.data_ptr() == t2.data_ptr()  # both views of the one private mapping
    t1 += 100
    st.load(path, framework="torch")["v"].mul_(3)
    assert path.read_bytes() == before
    assert torch.equal(st.load(path, framework="torch")["w"], torch.arange(6.0))
    owned = st.load(path, framework="torch", mmap=False)["w"]
    owned += 1
    assert path.read_bytes() == before


def test_arrays_outlive_the_file_object(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    st.save({"w": torch.arange(4)}, path)
    f = st.open(path)
    a, t = f["w"], f.get("w", framework="torch")
    f.close()
    assert a.tolist() == [0, 1, 2, 3] and t.tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="closed"):
        f["w"]


# --- saving: casts, sharing, layouts, metadata ------------------------------------------------


def test_float_dtype_casts_floating_values_only(tmp_path: Path) -> None:
    bf = torch.randn(33, 7).to(torch.bfloat16)
    sd: dict[str, Any] = {
        "w": bf.t(),  # non-contiguous, cast chunk by chunk
        "steps": torch.tensor([3, -1], dtype=torch.int64),
        "mask": torch.tensor([True, False]),
        "h": np.linspace(-2, 2, 9, dtype=np.float16),
    }
    path = tmp_path / "m.safetensors"
    st.save(sd, path, float_dtype="float32", chunk_bytes=16)
    with safe_open(path, framework="pt") as f:
        assert f.get_tensor("w").dtype == torch.float32
        assert torch.equal(f.get_tensor("w"), bf.t().float())
        assert torch.equal(f.get_tensor("steps"), sd["steps"])
        assert torch.equal(f.get_tensor("mask"), sd["mask"])
        assert torch.equal(f.get_tensor("h"), torch.from_numpy(sd["h"]).float())
    # and on the way out
    back = st.load(path, float_dtype=torch.bfloat16)
    assert back["w"].dtype == ml_dtypes.bfloat16 and bits(back["w"]) == bits(bf.t().contiguous())
    assert back["steps"].dtype == np.int64
    owned = st.load(path, framework="torch", mmap=False, float_dtype=torch.float16)
    assert owned["h"].dtype == torch.float16 and owned["steps"].dtype == torch.int64


@needs_f4
def test_float_dtype_widens_f4_on_save(tmp_path: Path) -> None:
    packed = torch.arange(256, dtype=torch.uint8).reshape(64, 4).view(F4)  # type: ignore[arg-type]
    values = tb.to_numpy(packed, dtype=ml_dtypes.float4_e2m1fn)
    path = tmp_path / "m.safetensors"
    st.save({"t": packed, "n": values}, path, float_dtype=torch.bfloat16, chunk_bytes=40)
    theirs = safetensors_torch.load_file(path)
    expected = torch.from_numpy(values.astype(np.float32)).to(torch.bfloat16)
    assert theirs["t"].shape == theirs["n"].shape == (64, 8)
    assert torch.equal(theirs["t"], expected) and torch.equal(theirs["n"], expected)


def test_numpy_sources_memmap_and_byte_swapped(tmp_path: Path) -> None:
    src = np.lib.format.open_memmap(tmp_path / "src.npy", mode="w+", dtype=np.float32, shape=(300,))
    src[:] = np.arange(300)
    src.flush()
    mapped = np.load(tmp_path / "src.npy", mmap_mode="r")
    swapped = np.arange(5, dtype=">i4")
    path = tmp_path / "m.safetensors"
    st.save({"m": mapped, "s": swapped}, path, chunk_bytes=64)
    out = safetensors_torch.load_file(path)
    assert torch.equal(out["m"], torch.arange(300, dtype=torch.float32))
    assert out["s"].dtype == torch.int32 and out["s"].tolist() == [0, 1, 2, 3, 4]


def test_progress_bar_on_request(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    st.save({"x": torch.ones(1000)}, tmp_path / "m.safetensors", progress=True)
    assert "saving m.safetensors" in capsys.readouterr().err
    st.save({"x": torch.ones(1000)}, tmp_path / "m.safetensors", progress=False)
    assert capsys.readouterr().err == ""


def test_tied_weights_are_written_once_and_strided_views_in_full(tmp_path: Path) -> None:
    w = torch.randn(4, 5)
    sd = {"embed": w, "lm_head": w, "row": w[1], "t": w.t()}
    with pytest.raises(RuntimeError, match="share memory"):
        safetensors_torch.save_file({"embed": w, "lm_head": w}, tmp_path / "theirs.safetensors")
    path = tmp_path / "m.safetensors"
    st.save(sd, path)
    theirs = safetensors_torch.load_file(path)  # the official reader: lm_head is not stored
    assert sorted(theirs) == ["embed", "row", "t"]
    for k in theirs:
        assert torch.equal(theirs[k], sd[k])
    with safe_open(path, framework="pt") as f:  # the tie, as safetensors' save_model records it
        assert f.metadata() == {"format": "pt", "lm_head": "embed"}
    header = int.from_bytes(path.read_bytes()[:8], "little")
    assert path.stat().st_size == 8 + header + 4 * (20 + 5 + 20)  # the 4x5 weight once
    with st.open(path) as f:  # tensorbridge restores it: one memory, two names
        assert f.keys() == ["embed", "row", "t", "lm_head"]
        assert f.aliases == {"lm_head": "embed"} and f.metadata == {"format": "pt"}
        a, b = f["embed"], f["lm_head"]
        assert np.shares_memory(a, b) and np.array_equal(a, w.numpy())
    tied = torch.nn.Linear(5, 4, bias=False)
    model = torch.nn.ModuleDict({"embed": tied, "lm_head": tied})
    st.save(model.state_dict(), tmp_path / "model.safetensors")
    fresh = torch.nn.Linear(5, 4, bias=False)
    again = torch.nn.ModuleDict({"embed": fresh, "lm_head": fresh})
    safetensors_torch.load_model(again, tmp_path / "model.safetensors")  # the official loader
    assert torch.equal(again["lm_head"].weight, tied.weight)


def test_chunks_are_zero_copy_views_of_tensor_memory() -> None:
    t = torch.arange(1000, dtype=torch.float32)
    item = _safetensors_plan.make_item("t", t, None)
    chunks = list(st._chunks(item, chunk_bytes=1024))
    assert len(chunks) == 4 and sum(len(c) for c in chunks) == 4000
    assert all(isinstance(c, memoryview) for c in chunks)
    assert np.frombuffer(chunks[0], np.uint8).ctypes.data == t.data_ptr()


def test_metadata_round_trip_and_validation(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    meta = {"step": "100", "note": 'ünïcode "quoted"\n', "format": "np"}
    st.save({"x": torch.ones(1)}, path, metadata=meta)
    with st.open(path) as f:
        assert f.metadata == meta
    with safe_open(path, framework="pt") as f:
        assert f.metadata() == meta
    st.save({"x": torch.ones(1)}, path)
    assert st.open(path).metadata == {"format": "pt"}
    with pytest.raises(TypeError, match=r"metadata\['step'\] = 100"):
        st.save({"x": torch.ones(1)}, path, metadata={"step": 100})  # type: ignore[dict-item]


def test_bad_inputs_name_the_tensor(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    with pytest.raises(UnsupportedDtypeError, match=r"'z'.*complex128.*view_as_real"):
        st.save({"z": torch.zeros(2, dtype=torch.complex128)}, path)
    with pytest.raises(UnsupportedTensorError, match=r"'s'.*to_dense"):
        st.save({"s": torch.eye(2).to_sparse()}, path)
    with pytest.raises(UnsupportedTensorError, match=r"'l'.*list"):
        st.save({"l": [1, 2]}, path)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="reserved"):
        st.save({"__metadata__": torch.ones(1)}, path)
    with pytest.raises(TypeError, match="names must be str"):
        st.save({1: torch.ones(1)}, path)  # type: ignore[dict-item]
    assert not path.exists()


# --- sharding ---------------------------------------------------------------------------------


def test_sharded_layout_and_index(tmp_path: Path) -> None:
    sd = {
        "a": torch.arange(10, dtype=torch.uint8),
        "b": torch.arange(30, dtype=torch.uint8),
        "c": torch.arange(5, dtype=torch.uint8),
        "d": torch.arange(100, dtype=torch.uint8),  # over the limit: a shard of its own
        "e": torch.ones(1, dtype=torch.uint8),
    }
    st.save(sd, tmp_path / "model.safetensors", max_shard_size=40)
    names = [f"model-0000{i}-of-00004.safetensors" for i in range(1, 5)]
    assert sorted(os.listdir(tmp_path)) == [*names, "model.safetensors.index.json"]
    index_text = (tmp_path / "model.safetensors.index.json").read_text()
    assert index_text == textwrap.dedent(
        """\
        {
          "metadata": {
            "total_size": 146
          },
          "weight_map": {
            "a": "model-00001-of-00004.safetensors",
            "b": "model-00001-of-00004.safetensors",
            "c": "model-00002-of-00004.safetensors",
            "d": "model-00003-of-00004.safetensors",
            "e": "model-00004-of-00004.safetensors"
          }
        }
        """
    )
    for name, keys in zip(names, (["a", "b"], ["c"], ["d"], ["e"]), strict=True):
        with safe_open(tmp_path / name, framework="pt") as f:
            assert f.metadata() == {"format": "pt"} and sorted(f.keys()) == keys
    for where in (tmp_path, tmp_path / "model.safetensors.index.json"):
        with st.open(where) as f:
            assert f.keys() == ["a", "b", "c", "d", "e"] and f.metadata == {"format": "pt"}
        out = st.load(where, framework="torch")
        assert all(torch.equal(out[k], v) for k, v in sd.items())
    assert st.load(tmp_path, keys=["d"])["d"].tolist() == list(range(100))
    with pytest.raises(KeyError, match="'zz' is not in"):
        st.load(tmp_path, keys=["a", "zz"])


def test_resaving_replaces_the_previous_layout(tmp_path: Path) -> None:
    sd = {"a": torch.zeros(100), "b": torch.ones(100)}
    target = tmp_path / "model.safetensors"
    st.save(sd, target, max_shard_size="400B")
    assert len(os.listdir(tmp_path)) == 3
    st.save(sd, target, max_shard_size="1KB")  # everything fits: one plain file
    assert os.listdir(tmp_path) == ["model.safetensors"]
    st.save(sd, tmp_path, max_shard_size=401)  # a directory means model.safetensors in it
    assert sorted(os.listdir(tmp_path))[-1] == "model.safetensors.index.json"
    assert "model.safetensors" not in os.listdir(tmp_path)
    assert torch.equal(st.load(tmp_path, framework="torch")["b"], sd["b"])


@pytest.mark.parametrize(
    ("size", "expected"),
    [(123, 123), ("5GB", 5 * 10**9), ("500MB", 5 * 10**8), ("2GiB", 2 << 30), ("2.3 gb", 2.3e9),
     ("10kib", 10240), ("77", 77)],
)  # fmt: skip
def test_shard_sizes(size: int | str, expected: int) -> None:
    assert st.parse_size(size) == expected


@pytest.mark.parametrize("size", ["5 parsecs", "GB", "-1MB", 0, -5, True, 1.5])
def test_bad_shard_sizes(size: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_shard_size"):
        st.save({"x": torch.ones(1)}, tmp_path / "m.safetensors", max_shard_size=size)


def test_open_resolves_directories(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no checkpoint file or index \(\*\.safetensors"):
        st.open(tmp_path)
    st.save({"x": torch.ones(1)}, tmp_path / "one.safetensors")
    assert st.open(tmp_path).keys() == ["x"]
    st.save({"y": torch.ones(1)}, tmp_path / "two.safetensors")
    with pytest.raises(FormatError, match="holds 2 files"):
        st.open(tmp_path)


def test_bad_index_files(tmp_path: Path) -> None:
    st.save({"x": torch.ones(1)}, tmp_path / "s.safetensors")
    index = tmp_path / "model.safetensors.index.json"
    for weight_map, match in [
        ({"x": "../s.safetensors"}, "not a file name"),
        ({"x": "s.safetensors", "y": "s.safetensors"}, "'y' is not in s.safetensors"),
        ([], 'no "weight_map"'),
    ]:
        index.write_text(json.dumps({"weight_map": weight_map}))
        with pytest.raises(FormatError, match=match):
            st.open(index)
    index.write_text("{")
    with pytest.raises(FormatError, match="not valid JSON"):
        st.open(index)


# --- hostile and broken files -----------------------------------------------------------------


def _entry(dtype: str = "U8", shape: Any = (4,), offsets: Any = (0, 4)) -> dict[str, Any]:
    return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}


MALFORMED = {
    "empty": (b"", "shorter than the 8-byte"),
    "short-length": (b"\x10\x00\x00", "shorter than the 8-byte"),
    "header-over-limit": (raw_file(b"{}", length=100_000_001), "over the 100,000,000-byte limit"),
    "header-past-end": (raw_file(b"{}      ", length=4096), "truncated"),
    "not-utf8": (raw_file(b'{"\xff":1}'), "not UTF-8"),
    "bad-json": (raw_file(b"{not json}"), "not valid JSON"),
    "deep-json": (raw_file(b"[" * 100_000), "not valid JSON"),
    "nan": (raw_file(b'{"a":{"dtype":"U8","shape":[NaN],"data_offsets":[0,0]}}'), "valid JSON"),
    "duplicate": (
        raw_file(b'{"a":{},"a":{}}'),
        "duplicate key 'a'",
    ),
    "not-object": (raw_file(b"[1, 2]"), "JSON list, not an object"),
    "entry-not-object": (raw_file({"a": 5}), "tensor 'a': the entry is 5"),
    "unknown-dtype": (raw_file({"a": _entry("F3_E1M1")}, bytes(4)), "'a': unknown dtype 'F3_E1M1'"),
    "missing-dtype": (raw_file({"a": {"shape": [1]}}), "'a': unknown dtype None"),
    "negative-shape": (raw_file({"a": _entry(shape=[-4])}, bytes(4)), "'a': shape \\[-4\\]"),
    "float-shape": (raw_file({"a": _entry(shape=[4.0])}, bytes(4)), "non-negative integers"),
    "bool-shape": (raw_file({"a": _entry(shape=[True])}, bytes(1)), "non-negative integers"),
    "one-offset": (raw_file({"a": _entry(offsets=[4])}, bytes(4)), "not \\[begin, end\\]"),
    "reversed-offsets": (raw_file({"a": _entry(offsets=[4, 0])}, bytes(4)), "begin <= end"),
    "out-of-bounds": (raw_file({"a": _entry(offsets=[0, 4])}, bytes(3)), "run past the 3-byte"),
    "wrong-length": (
        raw_file({"a": _entry("F32", [3], [0, 8])}, bytes(8)),
        "'a': F32 with shape \\[3\\] needs 12 bytes, but data_offsets \\[0, 8\\] hold 8",
    ),
    "huge-shape": (
        raw_file({"a": _entry("F64", [2**62, 2**62, 2**62], [0, 8])}, bytes(8)),
        "more bytes than the file holds",
    ),
    "overlap": (
        raw_file({"a": _entry(), "b": _entry(offsets=[2, 6])}, bytes(6)),
        "'b': data_offsets \\[2, 6\\] overlaps tensor 'a'",
    ),
    "gap": (
        raw_file({"a": _entry(), "b": _entry(offsets=[6, 10])}, bytes(10)),
        "'b': data_offsets \\[6, 10\\] leaves bytes 4..6 unused",
    ),
    "trailing-bytes": (raw_file({"a": _entry()}, bytes(9)), "5 bytes after the last tensor"),
    "metadata-value": (
        raw_file({"__metadata__": {"k": 1}, "a": _entry()}, bytes(4)),
        "__metadata__\\['k'\\] is 1",
    ),
    "metadata-list": (raw_file({"__metadata__": ["k"]}), "__metadata__ is a JSON list"),
    "f4-odd-count": (raw_file({"a": _entry("F4", [3], [0, 2])}, bytes(2)), "odd number of 4-bit"),
}


@pytest.mark.parametrize("case", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_files_raise_format_error(case: tuple[bytes, str], tmp_path: Path) -> None:
    data, match = case
    path = tmp_path / "bad.safetensors"
    path.write_bytes(data)
    with pytest.raises(FormatError, match=match) as info:
        st.open(path)
    assert str(path) in str(info.value)


def test_every_truncation_raises_format_error(tmp_path: Path) -> None:
    good = tmp_path / "good.safetensors"
    st.save({"a": torch.arange(3.0), "b": torch.ones(2, dtype=torch.int8)}, good)
    data = good.read_bytes()
    bad = tmp_path / "bad.safetensors"
    for cut in range(len(data)):
        bad.write_bytes(data[:cut])
        with pytest.raises(FormatError):
            st.load(bad)
    assert st.load(good)["b"].tolist() == [1, 1]


def test_error_messages_stay_short(tmp_path: Path) -> None:
    path = tmp_path / "bad.safetensors"
    path.write_bytes(raw_file({"x" * 10_000: _entry(shape=[1] * 100_000)}, bytes(4)))
    with pytest.raises(FormatError) as info:
        st.open(path)
    assert len(str(info.value)) < 400


# --- atomic writes ----------------------------------------------------------------------------


def test_failed_save_leaves_the_previous_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "m.safetensors"
    st.save({"x": torch.ones(4)}, path)
    before = path.read_bytes()
    real = st.iter_bytes

    def failing(*args: Any, **kwargs: Any) -> Any:
        chunks = real(*args, **kwargs)
        yield next(chunks)
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(st, "iter_bytes", failing)
    with pytest.raises(RuntimeError, match="disk on fire"):
        st.save({"x": torch.zeros(1000)}, path, chunk_bytes=64)
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["m.safetensors"]


_SLOW_SAVE = """
import sys, time, torch
from tensorbridge.io import safetensors as st
from tensorbridge.io.safetensors_header import LAYOUT_ORDER
real = st.iter_bytes
def slow(*args, **kwargs):
    for chunk in real(*args, **kwargs):
        time.sleep(0.005)
        yield chunk
st.iter_bytes = slow
st.save({"x": torch.ones(1 << 20)}, sys.argv[1], chunk_bytes=4096)
"""


@pytest.mark.parametrize("previous", [False, True], ids=["fresh", "overwrite"])
def test_killed_save_leaves_no_partial_file(previous: bool, tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    if previous:
        st.save({"old": torch.arange(3)}, path)
    before = path.read_bytes() if previous else None
    child = subprocess.Popen([sys.executable, "-c", _SLOW_SAVE, str(path)])
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            temps = [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
            if temps and temps[0].stat().st_size > 64 * 1024:
                break
            assert child.poll() is None, "the child finished before it could be killed"
            time.sleep(0.01)
        else:
            pytest.fail("the child never started writing")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    if previous:
        assert path.read_bytes() == before
    else:
        assert not path.exists()


def test_owned_loads_show_a_progress_bar_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.safetensors"
    tb.save({"w": torch.ones(1000)}, path, progress=False)
    with tb.open(path) as f:
        assert f.nbytes("w") == 4000 and f.filename == "p.safetensors"
        loaded = f.read(mmap=False, progress=True)
    assert "loading p.safetensors" in capsys.readouterr().err
    assert loaded["w"].flags.writeable and loaded["w"].sum() == 1000


def test_save_creates_missing_parent_directories(tmp_path: Path) -> None:
    path = tmp_path / "out" / "nested" / "m.safetensors"
    tb.save({"w": torch.arange(3)}, path, progress=False)
    assert sorted(os.listdir(path.parent)) == ["m.safetensors"]
    assert tb.load(path)["w"].tolist() == [0, 1, 2]

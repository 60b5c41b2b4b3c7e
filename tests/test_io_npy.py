"""``.npy`` / ``.npz``: the bit-carrier convention, NumPy compatibility, validation, streaming."""

from __future__ import annotations

import io
import os
import struct
import textwrap
import tokenize
import warnings
import zipfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorbridge as tb
from _budget import examples
from _peak_rss import run_child
from tensorbridge.errors import FormatError, UnsupportedDtypeError, UnsupportedTensorError
from tensorbridge.io import _npy_header, npy, npz


def by_suffix(path: Any) -> Any:
    """The module that writes ``path``: npy.py no longer hands ``.npz`` paths to npz.py
    (issue 28), so a test of both formats picks the module by the suffix."""
    return npz if str(path).lower().endswith(".npz") else npy


ROWS = tb.dtype_table()
EXTENDED = [r for r in ROWS if r.carrier is not None]
NATIVE = [r for r in ROWS if r.carrier is None]


def bits(x: Any) -> bytes:
    """The bytes of an array's or tensor's values in C order."""
    if isinstance(x, torch.Tensor):
        x = x.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return bytes(np.ascontiguousarray(x).reshape(-1).view(np.uint8).tobytes())


def shaped(patterns: np.ndarray) -> np.ndarray:
    """A 2-D array of the patterns when they divide evenly, else the 1-D array."""
    return patterns.reshape(4, -1) if patterns.size % 4 == 0 else patterns


# --- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize("source", ["numpy", "torch"])
def test_npy_round_trip_every_dtype(
    tmp_path: Path, row: tb.DTypeRow, patterns: np.ndarray, framework: str, source: str
) -> None:
    a = shaped(patterns)
    obj = a if source == "numpy" else tb.to_torch(a)
    p = tmp_path / "x.npy"
    npy.save(obj, p)
    got = npy.load(p, framework=framework)
    if framework == "numpy":
        assert got.dtype == row.numpy
    else:
        assert got.dtype == row.torch
    assert tuple(got.shape) == a.shape
    assert bits(got) == bits(a)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize("mmap", [True, False])
def test_npz_round_trip_every_dtype(
    tmp_path: Path, row: tb.DTypeRow, patterns: np.ndarray, framework: str, mmap: bool
) -> None:
    a = shaped(patterns)
    p = tmp_path / "x.npz"
    parts = {"whole": a, "strided": a[..., ::3], "scalar": a.reshape(-1)[:1].reshape(())}
    npz.save({k: tb.to_torch(v) if k == "strided" else v for k, v in parts.items()}, p)
    got = npz.load(p, framework=framework, mmap=mmap)
    assert list(got) == list(parts)
    for k, v in parts.items():
        assert got[k].dtype == (row.numpy if framework == "numpy" else row.torch)
        assert tuple(got[k].shape) == v.shape
        assert bits(got[k]) == bits(v), k


def test_fortran_and_noncontiguous_inputs(tmp_path: Path) -> None:
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    for x in (np.asfortranarray(a), a[:, ::-1, 1::2], torch.from_numpy(a).permute(2, 1, 0)):
        npy.save(x, tmp_path / "x.npy", chunk_bytes=8)  # tiny chunks: many pieces
        want = np.asarray(x)
        assert np.array_equal(npy.load(tmp_path / "x.npy"), want)
        assert np.array_equal(npy.load(tmp_path / "x.npy", framework="torch").numpy(), want)


def test_chunk_size_does_not_change_the_bytes(tmp_path: Path) -> None:
    a = np.random.default_rng(0).standard_normal((37, 11)).astype(ml_dtypes.bfloat16)
    npy.save(a, tmp_path / "a.npy")
    for chunk in (1, 6, 100, 1 << 30):
        npy.save(a, tmp_path / "b.npy", chunk_bytes=chunk)
        assert (tmp_path / "b.npy").read_bytes() == (tmp_path / "a.npy").read_bytes()


# --- the on-disk convention: golden bytes and plain NumPy -------------------------------------


def _prefix(header: bytes) -> bytes:
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(header)) + header


def test_golden_bytes_bfloat16(tmp_path: Path) -> None:
    raw = np.array([0x3F80, 0xC000, 0x7FC1, 0x0001], np.uint16)  # 1, -2, a NaN payload, tiny
    npy.save(raw.view(ml_dtypes.bfloat16).reshape(2, 2), tmp_path / "g.npy")
    golden = (
        _prefix(
            b"{'descr': [('bfloat16', '<u2')], 'fortran_order': False, 'shape': (2, 2), }"
            + b" " * 42
            + b"\n"
        )
        + b"\x80\x3f\x00\xc0\xc1\x7f\x01\x00"
    )
    assert (tmp_path / "g.npy").read_bytes() == golden
    assert len(golden) - 8 == 128  # data aligned to 64 bytes, as NumPy aligns it


def test_golden_bytes_float32_identical_to_np_save(tmp_path: Path) -> None:
    a = np.array([1.0, -0.0, np.inf], np.float32)
    npy.save(a, tmp_path / "g.npy")
    golden = (
        _prefix(b"{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }" + b" " * 60 + b"\n")
        + b"\x00\x00\x80\x3f"
        + b"\x00\x00\x00\x80"
        + b"\x00\x00\x80\x7f"
    )
    assert (tmp_path / "g.npy").read_bytes() == golden
    buf = io.BytesIO()
    np.save(buf, a)
    assert buf.getvalue() == golden


@pytest.mark.parametrize("row", NATIVE, ids=lambda r: r.name)
@pytest.mark.parametrize("order", ["C", "F"])
def test_native_dtypes_are_byte_identical_to_np_save(
    tmp_path: Path, row: tb.DTypeRow, order: str
) -> None:
    a = np.asarray(np.arange(12).reshape(3, 4) % 2, order=order).astype(row.numpy, order="K")
    buf = io.BytesIO()
    np.save(buf, a)
    npy.save(a, tmp_path / "x.npy")
    assert (tmp_path / "x.npy").read_bytes() == buf.getvalue()
    npy.save(tb.to_torch(a), tmp_path / "t.npy")  # the tensor of the same layout, too
    assert (tmp_path / "t.npy").read_bytes() == buf.getvalue()


@pytest.mark.parametrize("row", EXTENDED, ids=lambda r: r.name)
def test_plain_np_load_reads_the_raw_bits(tmp_path: Path, row: tb.DTypeRow) -> None:
    from conftest import make_patterns

    a = make_patterns(row)[:256]
    npy.save(a, tmp_path / "x.npy")
    npz.save({"w": a}, tmp_path / "x.npz")
    unsigned = a.view(f"<u{row.itemsize}")
    for mode in (None, "r"):
        plain = np.load(tmp_path / "x.npy", mmap_mode=mode)
        assert plain.dtype == np.dtype([(row.name, f"<u{row.itemsize}")])
        assert np.array_equal(plain[row.name], unsigned)
        assert plain.view(row.numpy).tobytes() == a.tobytes()
        del plain
    with np.load(tmp_path / "x.npz") as z:
        assert np.array_equal(z["w"][row.name], unsigned)


# --- the rows issue 29 added: sub-byte integers and the types only NumPy has -----------------

NEW = [r for r in ROWS if not r.kernels]  # int1 ... uint4, float8_e3m4 ... bcomplex32


def test_types_only_numpy_has_round_trip_every_bit_pattern(
    tmp_path: Path, numpy_only_row: tb.DTypeRow
) -> None:
    """Kept by the bit-carrier convention, as bf16 and fp8 are (a torch result refused)."""
    from conftest import make_patterns

    row = numpy_only_row
    a = shaped(make_patterns(row))
    npy.save(a, tmp_path / "x.npy")
    npz.save({"whole": a, "strided": a[..., ::3]}, tmp_path / "x.npz")
    for mmap in (True, False):
        got = npy.load(tmp_path / "x.npy", mmap=mmap)
        assert got.dtype == row.numpy and got.shape == a.shape and bits(got) == bits(a)
        members = npz.load(tmp_path / "x.npz", mmap=mmap)
        assert bits(members["whole"]) == bits(a) and bits(members["strided"]) == bits(a[..., ::3])
        assert {m.dtype for m in members.values()} == {row.numpy}
    with npy.open(tmp_path / "x.npy") as f:
        assert f.info("x") == (row, a.shape)
    assert np.load(tmp_path / "x.npy").dtype == np.dtype([(row.name, f"<u{row.itemsize}")])
    with pytest.raises(UnsupportedDtypeError, match=rf"ml_dtypes {row.name} has no torch dtype"):
        npy.load(tmp_path / "x.npy", framework="torch")


@pytest.mark.parametrize("row", NEW, ids=lambda r: r.name)
def test_what_np_save_writes_of_each_new_type_reads_with_dtype(
    tmp_path: Path, row: tb.DTypeRow
) -> None:
    """np.save writes an ml_dtypes array as raw void ('<V1', '<V4' for bcomplex32): the
    bytes are kept, the type is lost, so only dtype= can restore it."""
    from conftest import make_patterns

    a = make_patterns(row)
    np.save(tmp_path / "x.npy", a)
    np.savez(tmp_path / "x.npz", w=a)
    with open(tmp_path / "x.npy", "rb") as f:
        assert np.lib.format.read_magic(f) == (1, 0)
        stored = np.lib.format.read_array_header_1_0(f)[2]  # as NumPy itself reads it
    assert stored == np.dtype(f"V{row.itemsize}")
    width = row.itemsize
    for name in ("x.npy", "x.npz"):
        path = tmp_path / name
        with pytest.raises(UnsupportedDtypeError) as info:
            tb.load(path)
        message = str(info.value)
        assert f"raw {width}-byte data: np.save writes ml_dtypes arrays this way" in message
        assert f"the {width}-byte types are " in message and row.name in message.split("are ")[-1]
        for mmap in (True, False):
            got = tb.load(path, dtype=row.name, mmap=mmap)
            got = got if name.endswith(".npy") else got["w"]
            assert got.dtype == row.numpy and bits(got) == bits(a)
        if row.in_torch:
            t = tb.load(path, dtype=row.torch, framework="torch")
            t = t if name.endswith(".npy") else t["w"]
            assert t.dtype is row.torch and bits(t) == bits(a)
        other = "bfloat16" if width != 2 else "float8_e4m3fn"
        with pytest.raises(UnsupportedDtypeError, match=rf"dtype='{other}' does not fit raw"):
            tb.load(path, dtype=other)


def test_np_save_files_load_with_tensorbridge(tmp_path: Path) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.save(tmp_path / "f.npy", np.asfortranarray(a))
    np.save(tmp_path / "be.npy", a.astype(">f4"))
    np.savez(tmp_path / "s.npz", a=a, b=np.arange(5), c=np.float64(2.5))
    np.savez_compressed(tmp_path / "c.npz", a=a, b=np.arange(5))
    for name in ("f.npy", "be.npy"):
        for framework in ("numpy", "torch"):
            got = npy.load(tmp_path / name, framework=framework)
            assert np.array_equal(np.asarray(got), a)
    for name in ("s.npz", "c.npz"):
        for mmap in (True, False):
            got = npz.load(tmp_path / name, mmap=mmap)
            assert np.array_equal(got["a"], a) and np.array_equal(got["b"], np.arange(5))
    assert npz.load(tmp_path / "s.npz", keys=["c"]) == {"c": np.float64(2.5)}


def test_our_npz_loads_with_np_load_and_aligns_members(tmp_path: Path) -> None:
    parts = {"a": np.arange(7, dtype=np.int16), "long/name é": np.ones((3, 5)), "z": np.bool_(1)}
    npz.save(parts, tmp_path / "x.npz")
    with np.load(tmp_path / "x.npz") as z:
        assert sorted(z.files) == sorted(parts)
        for k, v in parts.items():
            assert np.array_equal(z[k], v)
    with npz.open(tmp_path / "x.npz") as f:
        mapped = np.frombuffer(f._map(False), np.uint8)
        for k in parts:
            arr = f[k]
            start = arr.__array_interface__["data"][0] - mapped.__array_interface__["data"][0]
            assert start % 64 == 0 and np.shares_memory(arr, mapped)
    first = (tmp_path / "x.npz").read_bytes()
    npz.save(parts, tmp_path / "x.npz")
    assert (tmp_path / "x.npz").read_bytes() == first  # deterministic: fixed timestamps


# --- memory semantics -------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", [".npy", ".npz"])
def test_mmap_results_are_read_only_views_and_torch_is_copy_on_write(
    tmp_path: Path, suffix: str
) -> None:
    p = tmp_path / f"x{suffix}"
    a = np.arange(8, dtype=np.float32)
    by_suffix(p).save(a if suffix == ".npy" else {"x": a}, p)
    before = p.read_bytes()
    with by_suffix(p).open(p) as f:
        v1, v2 = f["x"], f["x"]
        assert not v1.flags.writeable and np.shares_memory(v1, v2)
        with pytest.raises(ValueError, match=r"read-only"):
            v1[0] = 5
        t = f.get("x", framework="torch")
        t[0] = 99  # private pages: never reaches the file nor the read-only views
        assert v1[0] == 0
        owned = f.get("x", mmap=False)
        assert owned.flags.writeable and not np.shares_memory(owned, v1)
        owned_t = f.get("x", framework="torch", mmap=False)
        assert owned_t.data_ptr() != t.data_ptr()
    assert p.read_bytes() == before
    assert np.array_equal(
        npy.load(p, framework="numpy") if suffix == ".npy" else npz.load(p)["x"], a
    )


def test_float_dtype_casts_floating_values_only(tmp_path: Path) -> None:
    w = np.array([1.5, -2.25, np.nan], ml_dtypes.bfloat16)
    steps = np.array([7], np.int64)
    npz.save({"w": w, "steps": steps}, tmp_path / "x.npz", float_dtype="float32")
    with np.load(tmp_path / "x.npz") as z:  # a plain float32 member now
        assert z["w"].dtype == np.float32 and z["steps"].dtype == np.int64
        assert np.array_equal(z["w"], w.astype(np.float32), equal_nan=True)
    npy.save(w, tmp_path / "w.npy")
    got = npy.load(tmp_path / "w.npy", float_dtype="float16", framework="torch")
    assert got.dtype == torch.float16
    assert npz.load(tmp_path / "x.npz", float_dtype="bf16")["steps"].dtype == np.int64


def test_load_keys(tmp_path: Path) -> None:
    npz.save({"a": np.ones(2), "b": np.zeros(2)}, tmp_path / "x.npz")
    assert list(npz.load(tmp_path / "x.npz", keys=["b"])) == ["b"]
    with pytest.raises(KeyError, match=r"'c' is not in this file"):
        npz.load(tmp_path / "x.npz", keys=["c"])
    npy.save(np.ones(2), tmp_path / "w.npy")
    assert npy.load(tmp_path / "w.npy", keys=["w"]).shape == (2,)
    with npy.open(tmp_path / "w.npy") as f:
        assert f.keys() == ["w"] and f.info("w")[1] == (2,)
    with pytest.raises(KeyError, match=r"holds one array, 'w'"):
        npy.load(tmp_path / "w.npy", keys=["v"])


# --- atomic, streamed writes ------------------------------------------------------------------


def test_failed_save_leaves_the_previous_file(tmp_path: Path, monkeypatch: Any) -> None:
    p = tmp_path / "x.npz"
    npz.save({"a": np.ones(3)}, p)
    before = p.read_bytes()
    with pytest.raises(UnsupportedDtypeError, match=r"at 'bad'"):
        npz.save({"a": np.zeros(3), "bad": np.array(["text"])}, p)

    def broken(*args: Any, **kwargs: Any) -> Any:
        yield b"\0" * 8
        raise OSError("disk full")

    monkeypatch.setattr(npy, "iter_bytes", broken)
    with pytest.raises(OSError, match=r"disk full"):
        npz.save({"a": np.zeros(3)}, p)
    with pytest.raises(OSError, match=r"disk full"):
        npy.save(np.zeros(3), tmp_path / "new.npy")
    assert p.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["x.npz"]  # no temporary file left, no new.npy


def test_save_refuses_what_the_layout_cannot_hold(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedTensorError, match=r"save to a .npz path"):
        npy.save({"a": np.ones(2)}, tmp_path / "x.npy")
    with pytest.raises(UnsupportedTensorError, match=r"pass a mapping"):
        npz.save(np.ones(2), tmp_path / "x.npz")
    with pytest.raises(UnsupportedTensorError, match=r"to_dense"):
        npy.save(torch.eye(2).to_sparse(), tmp_path / "x.npy")
    with pytest.raises(tb.NoDataError):
        npy.save(torch.empty(2, device="meta"), tmp_path / "x.npy")
    assert os.listdir(tmp_path) == []


def test_progress_bar_reports_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    npy.save(np.ones(1000), tmp_path / "x.npy", progress=True)
    assert "saving x.npy" in capsys.readouterr().err


_RSS_CHILD = textwrap.dedent(
    """
    import sys, numpy as np
    import torch  # the cast imports it: loaded before the measure, which is of the save
    from tensorbridge.io import npy

    m = np.load(sys.argv[1], mmap_mode="r")
    reset_peak()
    base = status("VmRSS")
    npy.save(m, sys.argv[2], float_dtype="bfloat16", chunk_bytes=16 << 20, progress=False)
    streamed = status("VmHWM") - base
    reset_peak()
    base = status("VmRSS")
    m.sum()  # control: touching the whole input does show up in the measure
    control = status("VmHWM") - base
    print(streamed, control)
    """
)


@pytest.mark.slow  # a 512 MiB input, read twice in a child
def test_streaming_save_of_a_large_memmap_has_bounded_peak_rss(tmp_path: Path) -> None:
    n = (512 << 20) // 4
    src, dst = tmp_path / "src.npy", tmp_path / "dst.npy"
    np.lib.format.open_memmap(src, mode="w+", dtype=np.float32, shape=(n,)).flush()  # sparse
    streamed, control = map(int, run_child(_RSS_CHILD, str(src), str(dst)).split())
    assert control > 400 << 20, "the measure misses a full read of the input"
    assert streamed < 96 << 20, f"peak RSS grew {streamed >> 20} MiB for a 512 MiB input"
    assert dst.stat().st_size == 128 + n * 2
    with npy.open(dst) as f:
        assert f.info("dst")[0] is tb.resolve_dtype("bfloat16")


# --- malformed files --------------------------------------------------------------------------


def _npy(header: str, data: bytes = b"\0" * 12, version: int = 1) -> bytes:
    text = header.encode("latin1") + b"\n"
    length = struct.pack("<H" if version == 1 else "<I", len(text))
    return b"\x93NUMPY" + bytes([version, 0]) + length + text + data


_OK = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }"
MALFORMED = {
    "empty": (b"", "not a .npy file"),
    "bad magic": (b"\x93NUMPX" + _npy(_OK)[6:], "not a .npy file"),
    "unknown version": (_npy(_OK).replace(b"\x01\x00", b"\x09\x00", 1), "version 9.0"),
    "header past the end": (_npy(_OK)[:40], "truncated: the header needs"),
    "header too long": (
        b"\x93NUMPY\x02\x00" + struct.pack("<I", 1 << 30) + b"{" * 64,
        "more than the 10000",
    ),
    "not a literal": (_npy("{'descr': __import__('os').system('x')}"), "not a Python literal"),
    "not a dict": (_npy("[1, 2, 3]"), "must be a dict"),
    "extra key": (
        _npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}"),
        "exactly 'descr'",
    ),
    "negative shape": (
        _npy("{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}"),
        "non-negative ints",
    ),
    "float shape": (
        _npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3.0,)}"),
        "non-negative ints",
    ),
    "too many dims": (  # NumPy's limit: 64 dimensions, 32 on NumPy 1.x
        _npy(
            "{'descr': '<f4', 'fortran_order': False, 'shape': "
            + str((1,) * (_npy_header._MAX_NDIM + 1))
            + "}"
        ),
        f"at most {_npy_header._MAX_NDIM}",
    ),
    "bad fortran_order": (
        _npy("{'descr': '<f4', 'fortran_order': 'no', 'shape': (3,)}"),
        "fortran_order 'no'",
    ),
    "bad descr": (
        _npy("{'descr': 'zz9', 'fortran_order': False, 'shape': (3,)}"),
        "descr 'zz9' is not a dtype",
    ),
    "shape mismatch": (
        _npy("{'descr': '<f4', 'fortran_order': False, 'shape': (4,)}"),
        "truncated: shape (4,) of float32 needs 16 data bytes",
    ),
    "truncated data": (_npy(_OK)[:-1], "truncated"),
    "trailing bytes": (_npy(_OK) + b"\0", "trailing bytes"),
    "huge shape": (
        _npy("{'descr': '<f8', 'fortran_order': False, 'shape': (10**12, 10**12)}"),
        "not a Python literal",
    ),
    "huge literal shape": (
        _npy("{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000, 1000000)}"),
        "needs 8000000000000000000 data bytes",
    ),
}


@pytest.mark.parametrize("case", MALFORMED, ids=str)
def test_malformed_npy_raises_format_error(tmp_path: Path, case: str) -> None:
    content, message = MALFORMED[case]
    p = tmp_path / "bad.npy"
    p.write_bytes(content)
    with pytest.raises(FormatError, match=r"bad.npy") as info:
        npy.load(p)
    assert message in str(info.value)
    archive = tmp_path / "bad.npz"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("m.npy", content)
    with pytest.raises(FormatError, match=r"member 'm.npy'") as info:
        npz.load(archive)
    assert message in str(info.value)


# Headers np.load reads (numpy/lib/_format_impl.py, _read_array_header / _filter_header):
# tensorbridge reads each of them, and refuses each header np.load refuses.
_F8 = "'descr': '<f4', 'fortran_order': False"
HEADERS = {
    "python 2 long (NumPy's win64python2.npy)": (f"{{{_F8}, 'shape': (3L,), }}", 1, True),
    "python 2 long, version 2.0": (f"{{{_F8}, 'shape': (3L,), }}", 2, True),
    "python 2 long, 2-D": ("{'descr': '<f4', 'fortran_order': True, 'shape': (1L, 3L)}", 1, True),
    "python 2 long, space before L": (f"{{{_F8}, 'shape': (3 L,), }}", 1, True),
    "python 2 unicode prefixes": (
        "{u'descr': u'<f4', u'fortran_order': False, u'shape': (3L,), }",
        1,
        True,
    ),
    "double quotes": ('{"descr": "<f4", "fortran_order": False, "shape": (3,)}', 1, True),
    "no padding": (f"{{{_F8}, 'shape': (3,)}}", 1, True),
    "indented, tabs, CRLF": (f"  {{{_F8},\t'shape': (3,)}}\t\r", 1, True),
    "over several lines": ("{'descr': '<f4',\n 'fortran_order': False,\n 'shape': (3,)}", 1, True),
    "a comment": (f"{{{_F8}, 'shape': (3,)}}  # written by hand", 1, True),
    "hex shape": (f"{{{_F8}, 'shape': (0x3,)}}", 1, True),
    "version 3.0": (f"{{{_F8}, 'shape': (3,), }}", 3, True),
    "python 2 long in version 3.0": (f"{{{_F8}, 'shape': (3L,), }}", 3, False),
    "lower-case l": (f"{{{_F8}, 'shape': (3l,), }}", 1, False),
    "an L after the dict": (f"{{{_F8}, 'shape': (3,), }} L", 1, False),
    "bytes descr": ("{'descr': b'<f4', 'fortran_order': False, 'shape': (3,)}", 1, False),
    "bytes keys": ("{b'descr': '<f4', b'fortran_order': False, b'shape': (3,)}", 1, False),
    "bool shape": (f"{{{_F8}, 'shape': (True, 3)}}", 1, False),
    "NUL padding": (f"{{{_F8}, 'shape': (3,)}}\0\0", 1, False),
}


@pytest.mark.parametrize("case", HEADERS, ids=str)
def test_reads_every_header_np_load_reads(tmp_path: Path, case: str) -> None:
    header, version, readable = HEADERS[case]
    text = header.encode("utf8" if version == 3 else "latin1") + b"\n"
    length = struct.pack("<H" if version == 1 else "<I", len(text))
    data = np.arange(3, dtype="<f4").tobytes()
    p = tmp_path / "h.npy"
    p.write_bytes(b"\x93NUMPY" + bytes([version, 0]) + length + text + data)
    try:
        with warnings.catch_warnings():  # NumPy warns that a Python 2 header is slow
            warnings.simplefilter("ignore", UserWarning)
            ref = np.load(p)
    except (ValueError, TypeError, SyntaxError, tokenize.TokenError):  # by Python version
        ref = None
    assert (ref is not None) == readable  # the table says what np.load does
    if ref is None:
        with pytest.raises(FormatError, match=r"h.npy': "):
            npy.load(p)
        return
    got = npy.load(p)
    assert got.shape == ref.shape and got.dtype == ref.dtype and bits(got) == bits(ref)
    assert type(got.shape[0]) is int


NUMPY_DATA = Path(np.__file__).parent / "lib" / "tests" / "data"
WIN64PYTHON2 = (  # numpy/lib/tests/data/win64python2.npy, byte for byte
    b"\x93NUMPY\x01\x00F\x00{'descr': '<f8', 'fortran_order': False, 'shape': (2L,), }"
    + b" " * 11
    + b"\n"
    + np.ones(2, "<f8").tobytes()
)


@pytest.mark.parametrize("name", ["win64python2.npy", "python3.npy"])
def test_numpys_own_test_files(tmp_path: Path, name: str) -> None:
    shipped = NUMPY_DATA / name
    if not shipped.is_file():
        pytest.skip(reason=f"the installed NumPy does not ship {shipped}")
    got = npy.load(shipped)
    assert got.dtype == np.float64 and bits(got) == bits(np.ones(2))
    if name == "win64python2.npy":
        assert shipped.read_bytes() == WIN64PYTHON2
    with tb.open(shipped) as f:  # and what it writes is a plain .npy
        tb.save(f, tmp_path / "out.npy")
    assert bits(np.load(tmp_path / "out.npy")) == bits(np.ones(2))


def test_python2_header_recreated(tmp_path: Path) -> None:
    (tmp_path / "p2.npy").write_bytes(WIN64PYTHON2)
    assert bits(npy.load(tmp_path / "p2.npy")) == bits(np.ones(2))
    with zipfile.ZipFile(tmp_path / "p2.npz", "w") as zf:  # a Python 2 np.savez member
        zf.writestr("a.npy", WIN64PYTHON2)
    assert bits(npz.load(tmp_path / "p2.npz")["a"]) == bits(np.ones(2))


def test_every_truncation_of_a_valid_file_raises(tmp_path: Path) -> None:
    npy.save(np.arange(5, dtype=ml_dtypes.bfloat16), tmp_path / "ok.npy")
    good = (tmp_path / "ok.npy").read_bytes()
    for n in range(len(good)):
        (tmp_path / "cut.npy").write_bytes(good[:n])
        with pytest.raises(FormatError, match=r"cut.npy"):
            npy.open(tmp_path / "cut.npy")


def test_unsupported_dtypes_name_the_file_and_the_fix(tmp_path: Path) -> None:
    np.save(tmp_path / "bf.npy", np.ones(3, ml_dtypes.bfloat16))  # written as raw '<V2'
    with pytest.raises(
        UnsupportedDtypeError,
        match=r"bf.npy': raw 2-byte data.*dtype='bfloat16'.*--as-dtype bfloat16.*are bfloat16$",
    ):
        npy.load(tmp_path / "bf.npy")
    np.save(tmp_path / "s.npy", np.array(["ab", "c"]))
    with pytest.raises(UnsupportedDtypeError, match=r"s.npy': string dtype"):
        npy.load(tmp_path / "s.npy")
    # a structured dtype that only resembles the convention is not taken for it
    np.save(tmp_path / "st.npy", np.zeros(2, [("bfloat16", ">u2")]))
    with pytest.raises(UnsupportedDtypeError, match=r"structured"):
        npy.load(tmp_path / "st.npy")


def test_object_arrays_are_never_unpickled(tmp_path: Path) -> None:
    np.save(tmp_path / "o.npy", np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    np.savez(tmp_path / "o.npz", o=np.array([{"a": 1}], dtype=object))
    for name in ("o.npy", "o.npz"):  # a well-formed file of an unsupported dtype
        with pytest.raises(UnsupportedDtypeError, match=r"never unpickles"):
            by_suffix(name).load(tmp_path / name)


def test_corrupt_npz_archives(tmp_path: Path) -> None:
    a = np.arange(1000, dtype=np.float32)
    np.savez_compressed(tmp_path / "c.npz", a=a)
    good = (tmp_path / "c.npz").read_bytes()
    cut = tmp_path / "cut.npz"
    cut.write_bytes(good[: len(good) // 2])
    with pytest.raises(FormatError, match=r"cut.npz.*not a readable .npz"):
        npz.open(cut)
    flipped = bytearray(good)
    flipped[200] ^= 0xFF  # inside the deflated data
    (tmp_path / "flip.npz").write_bytes(flipped)
    with pytest.raises(FormatError, match=r"flip.npz"):
        npz.load(tmp_path / "flip.npz")
    # a central directory that claims far more than the deflated bytes can hold
    bomb = bytearray(good)
    cd = bomb.rindex(b"PK\x01\x02")
    struct.pack_into("<I", bomb, cd + 24, 0x7FFFFFF0)
    (tmp_path / "bomb.npz").write_bytes(bomb)
    with pytest.raises(FormatError, match=r"more than deflate can produce"):
        npz.load(tmp_path / "bomb.npz")
    npz.save({"a": a}, tmp_path / "s.npz")
    stored = (tmp_path / "s.npz").read_bytes()
    (tmp_path / "s_cut.npz").write_bytes(stored[:200] + stored[-200:])
    with pytest.raises(FormatError, match=r"s_cut.npz"):
        npz.load(tmp_path / "s_cut.npz")
    flipped = bytearray(stored)
    flipped[stored.index(a.tobytes()) + 5] ^= 0x01  # one bit of the stored data
    (tmp_path / "bit.npz").write_bytes(flipped)
    assert npz.load(tmp_path / "bit.npz")["a"][1] != a[1]  # a mapped read checks no CRC
    with pytest.raises(FormatError, match=r"bit.npz.*does not match its CRC"):
        npz.load(tmp_path / "bit.npz", mmap=False)  # an owned read does
    with zipfile.ZipFile(tmp_path / "dup.npz", "w") as zf:
        zf.writestr("a.npy", stored[:10])
        zf.writestr("a", stored[:10])
    with pytest.raises(FormatError, match=r"two members are both named 'a'"):
        npz.open(tmp_path / "dup.npz")


class _Trickle(io.RawIOBase):
    """A stream that hands out at most a few bytes a read."""

    def __init__(self, data: bytes) -> None:
        self._data, self._pos = data, 0
        self._rng = np.random.default_rng(1)

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        n = min(int(self._rng.integers(1, 8)), len(b), len(self._data) - self._pos)
        b[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        return n


def test_reads_in_short_chunks() -> None:
    a = np.arange(100, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(10, 10)
    data = npy.header_bytes(tb.resolve_dtype("bfloat16"), a.shape) + a.tobytes()
    h = npy.parse_header(data, len(data), "mem")
    got = npy.read_data(_Trickle(data[h.offset :]), h, "mem")  # type: ignore[arg-type]
    assert got.dtype == a.dtype and got.tobytes() == a.tobytes()
    with pytest.raises(FormatError, match=r"mem: truncated"):
        npy.read_data(_Trickle(data[h.offset : -3]), h, "mem")  # type: ignore[arg-type]


@settings(
    max_examples=examples(300),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_random_corruption_never_escapes_as_another_error(tmp_path: Path, data: Any) -> None:
    suffix = data.draw(st.sampled_from([".npy", ".npz"]))
    p = tmp_path / f"fuzz{suffix}"
    a = np.arange(6, dtype=ml_dtypes.bfloat16).reshape(2, 3)
    if suffix == ".npy":
        npy.save(a, p)
    else:
        np.savez_compressed(p, a=np.arange(6.0)) if data.draw(st.booleans()) else npz.save(
            {"a": a}, p
        )
    raw = bytearray(p.read_bytes())
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    p.write_bytes(bytes(raw[:cut]))
    try:
        for framework in ("numpy", "torch"):
            by_suffix(p).load(p, framework=framework)
    except (FormatError, UnsupportedDtypeError):
        pass


# --- NumPy to NumPy: members torch cannot hold are copied, never read -------------------------


def _exotic() -> dict[str, np.ndarray]:
    return {
        "long": np.arange(3, dtype=np.longdouble) / 3,  # float128 on x86-64 Linux
        "text": np.array(["ab", "ç"]),
        "raw": np.array([b"x\x00", b"yz"]),
        "rec": np.zeros(2, [("a", "<i4"), ("b", "<f8")]),
        "when": np.array(["2026-12-04"], dtype="datetime64[D]"),
        "w": np.arange(4, dtype=np.float32),
    }


@pytest.mark.parametrize("write", [np.savez, np.savez_compressed], ids=["stored", "deflated"])
def test_numpy_to_numpy_carries_members_torch_cannot_hold(
    tmp_path: Path, write: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorbridge.cli import main

    src, dst = tmp_path / "src.npz", tmp_path / "dst.npz"
    write(src, **_exotic())
    with tb.open(src) as f:
        assert "w" not in f.unsupported() and "long" in f.unsupported()
        tb.save(f, dst)
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst) as b:
        for name in _exotic():  # each member's .npy, byte for byte
            assert a.read(f"{name}.npy") == b.read(f"{name}.npy"), name
    with np.load(dst) as z:
        assert z["long"].dtype == np.longdouble  # the bytes were compared above, padding too
        assert np.array_equal(z["long"], _exotic()["long"])
    assert main(["convert", str(src), str(tmp_path / "cli.npz"), "--verify"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "verify: bit-exact"
    assert err.startswith("note: copied long (float128), text (<U2), raw (|S2), rec (")
    assert err.rstrip().endswith("unchanged: no torch dtype holds them, so their .npy bytes "
                                 "are carried as they are")  # fmt: skip
    assert main(["convert", str(src), str(tmp_path / "one.npy"), "--include", "text", "-q"]) == 0
    assert np.load(tmp_path / "one.npy").tolist() == ["ab", "ç"]
    assert main(["convert", str(tmp_path / "one.npy"), str(tmp_path / "back.npz"), "-q"]) == 0
    assert np.load(tmp_path / "back.npz")["one"].tolist() == ["ab", "ç"]
    # a cast cannot reach float128; leaving it out converts the rest, cast
    assert main(["convert", str(src), str(tmp_path / "c.npz"), "--float-dtype", "f16", "-q"]) == 1
    assert capsys.readouterr().err.endswith(
        "error: at 'long': float128 has no torch dtype, so it is copied unchanged and cannot "
        "be cast; leave it out, or convert without a cast\n"
    )
    assert not (tmp_path / "c.npz").exists()
    # torch-side destinations still refuse what torch cannot hold
    assert main(["convert", str(src), str(tmp_path / "x.safetensors"), "-q"]) == 1
    assert "float128 (16 bytes) has no torch dtype" in capsys.readouterr().err


def test_object_members_are_not_carried(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from tensorbridge.cli import main

    src = tmp_path / "o.npz"
    np.savez(src, o=np.array([{"a": 1}], dtype=object), w=np.ones(2))
    with (
        tb.open(src) as f,
        pytest.raises(
            UnsupportedDtypeError,
            match=r"member 'o.npy': descr '\|O' holds Python objects, which only pickle can read; "
            r"tensorbridge never unpickles, and does not copy them to another file either",
        ),
    ):
        tb.save(f, tmp_path / "d.npz")
    assert main(["convert", str(src), str(tmp_path / "d.npz")]) == 1
    assert (
        capsys.readouterr()
        .err.rstrip()
        .endswith("pass --exclude NAME or --skip-unsupported to convert the rest")
    )
    assert main(["convert", str(src), str(tmp_path / "d.npz"), "--skip-unsupported", "-q"]) == 0
    assert list(np.load(tmp_path / "d.npz")) == ["w"]
    np.savez(src, o=np.array([None], dtype=object), t=np.array(["kept"]))
    assert main(["convert", str(src), str(tmp_path / "e.npz"), "--skip-unsupported", "-q"]) == 0
    assert "skipped o: " in capsys.readouterr().err  # the strings are still copied
    assert list(np.load(tmp_path / "e.npz")) == ["t"]

"""HDF5 files and Keras weights: bit-exact against h5py's own reads, loaded by Keras, and refused
cleanly when hostile.

h5py is the oracle for every row of the table and every storage layout (contiguous and
mapped, chunked, compressed, compact, unwritten, big-endian, after a user block); HDF5
2.0's bfloat16 and float8 types are made with the HDF5 library's own type calls; Keras
(on the torch backend) saves the weight files read here and loads the ones written here.
"""

from __future__ import annotations

import ctypes
import glob
import os
import struct
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge.errors import FormatError, InvalidNameError, MissingExtraError
from tensorbridge.io import hdf5
from tensorbridge.io._detect import detect

h5py = pytest.importorskip("h5py", reason="pip install tensorbridge[hdf5]")
h5t, h5s, h5d = h5py.h5t, h5py.h5s, h5py.h5d


def _h5py_bytes(path: Path, name: str) -> bytes:
    """The dataset's values as h5py reads them (``ds[()]``), as bytes."""
    with h5py.File(path, "r") as f:
        return bytes(np.ascontiguousarray(f[name][()]).tobytes())


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == np.ascontiguousarray(b).tobytes()


# --- every row of the table, written by tensorbridge, read by h5py -------------------------------


def test_every_row_round_trips_bit_exact_and_h5py_reads_the_same_bytes(
    row: tb.DTypeRow, patterns: np.ndarray, tmp_path: Path
) -> None:
    path = tmp_path / "x.h5"
    values = patterns.reshape(2, -1) if patterns.size % 2 == 0 else patterns
    tb.save({"group/x": values, "s": values[..., :1].copy()}, path)
    assert _h5py_bytes(path, "group/x") == values.tobytes()  # h5py's read: the same bits
    with h5py.File(path, "r") as f:
        ds = f["group/x"]
        if row.carried:  # no HDF5 type h5py names: opaque bytes named as Keras names bf16
            assert ds.dtype == np.dtype(f"V{row.itemsize}") and ds.attrs["dtype"] == row.name
        else:
            assert ds.dtype == row.numpy and "dtype" not in ds.attrs
        assert ds.id.get_offset() % hdf5.ALIGNMENT == 0
    with tb.open(path) as f:
        got = f["group/x"]
        assert got.dtype == row.numpy and _same_bits(got, values)
        assert f.layout("group/x")["mapped"] and not got.flags.writeable
        assert f.metadata == {}  # the dtype attribute names the type: no metadata
        t = f.get("group/x", framework="torch")
    assert t.dtype == row.torch
    assert t.view(torch.uint8).numpy().tobytes() == values.tobytes()


@pytest.mark.parametrize(
    "layout",
    ["contiguous", "chunked", "gzip", "shuffle-gzip-fletcher32", "compact", "big-endian"],
)
def test_rows_h5py_writes_are_read_bit_exact(
    row: tb.DTypeRow, patterns: np.ndarray, layout: str, tmp_path: Path
) -> None:
    if row.carried:
        pytest.skip(reason=f"h5py has no HDF5 type for {row.name} (tested as opaque bytes)")
    path = tmp_path / "h.h5"
    values = patterns[:1024] if layout == "compact" else patterns
    options: dict[str, Any] = {
        "contiguous": {},
        "chunked": {"chunks": (max(1, values.size // 3),)},
        "gzip": {"compression": "gzip"},
        "shuffle-gzip-fletcher32": {"compression": "gzip", "shuffle": True, "fletcher32": True},
        "compact": {},
        "big-endian": {"dtype": values.dtype.newbyteorder(">")},
    }[layout]
    with h5py.File(path, "w") as f:
        if layout == "compact":
            dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
            dcpl.set_layout(h5d.COMPACT)
            tid = h5t.py_create(values.dtype, logical=True)
            space = h5s.create_simple(values.shape)
            h5d.create(f.id, b"x", tid, space, dcpl=dcpl).write(h5s.ALL, h5s.ALL, values)
        else:
            f.create_dataset("x", data=values, **options)
    expected = np.frombuffer(_h5py_bytes(path, "x"), values.dtype.newbyteorder(">"))
    if layout == "big-endian":
        expected = expected.astype(values.dtype)
    else:
        expected = np.frombuffer(_h5py_bytes(path, "x"), values.dtype)
    with tb.open(path) as f:
        got = f.get("x", mmap=False)
        assert f.layout("x")["mapped"] is (layout in ("contiguous", "big-endian"))
    assert got.dtype == row.numpy and got.tobytes() == expected.tobytes()
    assert got.tobytes() == values.tobytes()


# --- HDF5 2.0's own bfloat16 and float8 types ----------------------------------------------------


def _libhdf5() -> ctypes.CDLL | None:
    found = glob.glob(os.path.join(os.path.dirname(h5py.__file__), "..", "h5py.libs", "libhdf5-*"))
    return ctypes.CDLL(found[0]) if found else None


def _predefined(name: str) -> Any:
    """HDF5 2.0's predefined type ``H5T_<name>`` (a copy), or None where the library lacks it."""
    lib = _libhdf5()
    if lib is None:
        return None
    try:
        hid = ctypes.c_int64.in_dll(lib, f"H5T_{name}_g").value
    except ValueError:
        return None
    lib.H5Tcopy.restype = ctypes.c_int64
    return h5t.typewrap(lib.H5Tcopy(ctypes.c_int64(hid)))


def _float_type(size: int, exponent: int, mantissa: int, bias: int, order: int) -> Any:
    """A float type built with HDF5's own calls (``H5Tset_fields``, ``H5Tset_ebias``)."""
    t = h5t.IEEE_F32LE.copy()
    bits = 1 + exponent + mantissa
    t.set_fields(bits - 1, mantissa, exponent, 0, mantissa)
    t.set_offset(0)
    t.set_precision(bits)
    t.set_size(size)
    t.set_ebias(bias)
    t.set_order(order)
    return t


_NATIVE_FLOATS = {  # HDF5 2.0's predefined name: (row, size, exponent, mantissa, bias)
    "FLOAT_BFLOAT16LE": ("bfloat16", 2, 8, 7, 127),
    "FLOAT_BFLOAT16BE": ("bfloat16", 2, 8, 7, 127),
    "FLOAT_F8E4M3": ("float8_e4m3fn", 1, 4, 3, 7),
    "FLOAT_F8E5M2": ("float8_e5m2", 1, 5, 2, 15),
}


@pytest.mark.parametrize("name", sorted(_NATIVE_FLOATS))
def test_hdf5_native_bfloat16_and_float8_read_by_their_layout(name: str, tmp_path: Path) -> None:
    row_name, size, exponent, mantissa, bias = _NATIVE_FLOATS[name]
    big = name.endswith("BE")
    built = _float_type(size, exponent, mantissa, bias, h5t.ORDER_BE if big else h5t.ORDER_LE)
    predefined = _predefined(name)
    if predefined is not None:  # the library's own type: the same layout as the one built
        assert predefined.get_fields() == built.get_fields()
        assert predefined.get_ebias() == bias and predefined.get_size() == size
    bits = np.arange(1 << (8 * size), dtype=np.uint32).astype(f"u{size}")
    stored = bits.astype(bits.dtype.newbyteorder(">")) if big else bits
    path = tmp_path / "native.h5"
    with h5py.File(path, "w") as f:
        for key, tid in (("built", built), ("predefined", predefined)):
            if tid is not None:
                ds = h5d.create(f.id, key.encode(), tid, h5s.create_simple(bits.shape))
                ds.write(h5s.ALL, h5s.ALL, np.ascontiguousarray(stored).view(np.uint8), mtype=tid)
        widened = f["built"].dtype  # h5py cannot name it: it widens the values
    assert widened.itemsize > size
    with tb.open(path) as f:
        for key in f:
            got = f[key]
            assert got.dtype == np.dtype(getattr(ml_dtypes, row_name)), key
            assert got.view(f"u{size}").tobytes() == bits.tobytes(), key  # every pattern
            assert f.layout(key)["mapped"] is not (big and size > 1)


def test_hdf5_complex_class_and_r_i_compounds_are_complex(tmp_path: Path) -> None:
    values = np.array([1 + 2j, -3.5 - 0.25j, np.nan], np.complex64)
    path = tmp_path / "c.h5"
    with h5py.File(path, "w") as f:
        f["compound"] = values  # h5py's r/i compound
        native = getattr(h5t, "COMPLEX_IEEE_F32LE", None)
        if native is not None:  # HDF5 2.0's complex class
            ds = h5d.create(f.id, b"native", native, h5s.create_simple(values.shape))
            ds.write(h5s.ALL, h5s.ALL, values, mtype=native)
        half = h5t.create(h5t.COMPOUND, 4)  # complex32 as a compound of two float16
        half.insert(b"r", 0, h5t.IEEE_F16LE)
        half.insert(b"i", 2, h5t.IEEE_F16LE)
        ds = h5d.create(f.id, b"half", half, h5s.create_simple((3,)))
        parts = values.view(np.float32).astype(np.float16)  # re, im, re, im, ...
        ds.write(h5s.ALL, h5s.ALL, parts.view(np.uint8), mtype=half)
    with tb.open(path) as f:
        assert _same_bits(f["compound"], values)
        if "native" in f:
            assert _same_bits(f["native"], values)
        assert f["half"].dtype == ml_dtypes.complex32
        assert f["half"].tobytes() == parts.tobytes()


# --- opaque bytes and dtype= ---------------------------------------------------------------------


def test_opaque_bytes_without_a_dtype_attribute_need_dtype(tmp_path: Path) -> None:
    bf16 = np.array([1.0, -2.0, 3.5], ml_dtypes.bfloat16)
    path = tmp_path / "plain.h5"
    with h5py.File(path, "w") as f:
        f["w"] = bf16  # what h5py makes of an ml_dtypes array: |V2, its type lost
        f["n"] = np.arange(3, dtype=np.int16)
        f["m"] = bf16
        f["m"].attrs["dtype"] = "float8_e4m3fn"  # a marker naming a type of another size
    with tb.open(path) as f:
        with pytest.raises(tb.UnsupportedDtypeError, match=r"2-byte values .*dtype='bfloat16'"):
            f["w"]
        assert f["n"].tolist() == [0, 1, 2]
        with pytest.raises(tb.UnsupportedDtypeError, match=r"attribute says 'float8_e4m3fn'"):
            f["m"]
        assert sorted(f.unsupported()) == ["m", "w"]
    with tb.open(path, dtype="bfloat16") as f:
        assert _same_bits(f["w"], bf16) and f["w"].dtype == ml_dtypes.bfloat16
        assert f["n"].dtype == np.int16  # dtype= names opaque bytes only
    with pytest.raises(tb.UnsupportedDtypeError, match=r"names the type of opaque HDF5 data"):
        tb.open(path, dtype="float32")
    with pytest.raises(tb.UnsupportedDtypeError, match=r"read the other entries with keys="):
        tb.load(path)


# --- Keras ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def keras() -> Any:
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras", reason="Keras 3 (pip install keras) saves the files")
    if keras.backend.backend() != "torch":
        pytest.skip(reason=f"Keras runs on {keras.backend.backend()} here, not torch")
    return keras


def _model(keras: Any, seed: int) -> Any:
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((4,)),
            keras.layers.Dense(3, name="hidden"),
            keras.layers.Dense(2, dtype="bfloat16", name="head"),
        ]
    )


# Keras' torch-backend variables implement __array__ without copy= (keras/src/backend/torch/
# core.py): NumPy 2 warns whenever Keras converts one, in save_weights and get_weights
_KERAS_WARNING = pytest.mark.filterwarnings(
    "ignore:__array__ implementation doesn't accept a copy keyword:DeprecationWarning"
)
_KERAS_PATHS = [
    "layers/dense/vars/0",
    "layers/dense/vars/1",
    "layers/dense_1/vars/0",
    "layers/dense_1/vars/1",
]


@_KERAS_WARNING
def test_keras_weights_read_under_their_layer_paths(keras: Any, tmp_path: Path) -> None:
    model = _model(keras, 1)
    model.save_weights(tmp_path / "m.weights.h5")
    model.save(tmp_path / "m.keras")
    weights = model.get_weights()
    assert weights[2].dtype == ml_dtypes.bfloat16
    for name in ("m.weights.h5", "m.keras"):
        path = tmp_path / name
        assert detect(path) == "hdf5"
        with tb.open(path) as f:
            assert f.keys() == _KERAS_PATHS and f.notes == []
            for key, w in zip(_KERAS_PATHS, weights, strict=True):
                assert f[key].dtype == w.dtype and _same_bits(f[key], w), (name, key)
                assert f.layout(key)["mapped"]  # Keras stores the member: read in place
            assert f.metadata["layers/dense_1/vars@name"] == "head"
            assert "layers/dense_1/vars/0@dtype" not in f.metadata  # the type's name
    deflated = zipfile.ZipFile(tmp_path / "d.keras", "w", zipfile.ZIP_DEFLATED)
    with zipfile.ZipFile(tmp_path / "m.keras") as z, deflated:  # read through zipfile
        for info in z.infolist():
            deflated.writestr(info.filename, z.read(info))
    with tb.open(tmp_path / "d.keras") as f:
        assert _same_bits(f["layers/dense_1/vars/0"], weights[2])
        assert not f.layout("layers/dense_1/vars/0")["mapped"]


@_KERAS_WARNING
def test_weights_written_by_tensorbridge_load_in_keras(keras: Any, tmp_path: Path) -> None:
    source = _model(keras, 1)
    source.save_weights(tmp_path / "a.weights.h5")
    new = {k: (v * 2 - 1).astype(v.dtype) for k, v in tb.load(tmp_path / "a.weights.h5").items()}
    tb.save(new, tmp_path / "b.weights.h5")
    loaded = _model(keras, 2)
    loaded.load_weights(tmp_path / "b.weights.h5")
    for got, key in zip(loaded.get_weights(), _KERAS_PATHS, strict=True):
        assert got.dtype == new[key].dtype and _same_bits(got, new[key])  # bf16 included
    reference = _model(keras, 3)
    reference.set_weights([new[k] for k in _KERAS_PATHS])
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    out = keras.ops.convert_to_numpy(loaded(x))
    assert np.array_equal(out, keras.ops.convert_to_numpy(reference(x)))
    assert out.dtype == ml_dtypes.bfloat16


# --- storage the reader must get right -----------------------------------------------------------


def test_user_block_and_a_mislabelled_file(tmp_path: Path) -> None:
    values = np.arange(10, dtype=np.float64)
    for block in (512, 4096):
        path = tmp_path / f"u{block}.h5"
        with h5py.File(path, "w", userblock_size=block) as f:
            f["x"] = values
        with open(path, "r+b") as raw:
            raw.write(b"{not json, not a pickle: a user block}")
        assert detect(path) == "hdf5"
        with tb.open(path) as f:
            assert _same_bits(f["x"], values) and f.layout("x")["mapped"]
    renamed = (tmp_path / "u512.h5").rename(tmp_path / "u.safetensors")
    with tb.open(renamed) as f:
        assert f.notes[0].startswith("u.safetensors is an HDF5 file, not a safetensors file")


def test_unwritten_and_sparse_datasets_are_bounded(tmp_path: Path) -> None:
    path = tmp_path / "fill.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("small", shape=(4,), dtype="i4", fillvalue=7)  # never written
        f.create_dataset("huge", shape=(1 << 40,), dtype="f4", chunks=(1 << 16,))
        f.create_dataset("sparse", shape=(3 << 20,), dtype="u1", chunks=(1 << 16,))
        f["sparse"][:3] = 1
    with tb.open(path) as f:
        assert f["small"].tolist() == [7, 7, 7, 7] and not f.layout("small")["mapped"]
        assert f.info("huge")[1] == (1 << 40,)  # the header alone: nothing allocated
        with pytest.raises(FormatError, match=r"declares 4,398,046,511,104 bytes but stores 0"):
            f["huge"]
        assert f["sparse"][:4].tolist() == [1, 1, 1, 0]  # 3 MiB: within max_fill_bytes
    with hdf5.open(path, max_fill_bytes=0) as f, pytest.raises(FormatError, match=r"=None"):
        f["sparse"]


def test_a_plugin_filter_is_never_loaded(tmp_path: Path) -> None:
    path = tmp_path / "plugin.h5"
    with h5py.File(path, "w") as f:
        dcpl = h5py.h5p.create(h5py.h5p.DATASET_CREATE)
        dcpl.set_chunk((4,))
        dcpl.set_filter(307, h5py.h5z.FLAG_OPTIONAL)  # bzip2's id: a plugin HDF5 would load
        ds = h5d.create(f.id, b"x", h5t.NATIVE_INT32, h5s.create_simple((8,)), dcpl=dcpl)
        ds.write(h5s.ALL, h5s.ALL, np.arange(8, dtype=np.int32))
        f.create_dataset("ok", data=np.arange(8), compression="lzf", shuffle=True)
    with tb.open(path) as f:
        with pytest.raises(tb.UnsupportedDtypeError, match=r"filter 307, a plugin library"):
            f["x"]
        assert f["ok"].tolist() == list(range(8))  # HDF5's and h5py's own filters read


def test_links_ties_and_objects_from_other_files(tmp_path: Path) -> None:
    other = tmp_path / "other.h5"
    with h5py.File(other, "w") as f:
        f["secret"] = np.arange(3)
    path = tmp_path / "links.h5"
    with h5py.File(path, "w") as f:
        f["a/w"] = np.ones(2, np.float32)
        f["soft"] = h5py.SoftLink("/a/w")
        f["ext"] = h5py.ExternalLink(str(other), "/secret")
        f["a/tied"] = f["a/w"]  # a second hard link: one dataset, two names
        f["group_only"] = h5py.SoftLink("/a")
        f.create_dataset("elsewhere", shape=(3,), dtype="i8", external=[(str(other), 0, 24)])
    with tb.open(path) as f:
        assert f.keys() == ["a/tied", "a/w", "elsewhere"]
        assert f.aliases == {"a/w": "a/tied"}
        assert "soft" not in f and "ext" not in f and "group_only/w" not in f
        assert f.notes == [
            "links.h5: 3 soft or external link(s) not followed (ext, group_only, soft); "
            "their targets are read under their own names"
        ]
        with pytest.raises(tb.UnsupportedDtypeError, match=r"keeps its data in other files"):
            f["elsewhere"]
        with pytest.raises(KeyError, match=r"'ext' is not in this file"):
            f["ext"]


def test_metadata_attributes_round_trip(tmp_path: Path) -> None:
    meta = {
        "epoch": 3,
        "lr": 0.5,
        "name": "run-1",
        "flag": True,
        "ids": [1, 2, 3],
        "tags": ["a", "b"],
        "config": {"depth": 2},
        "enc@units": 7,  # on the group enc
        "enc/w@unit": "m",  # on the dataset enc/w
        "mail@host": "x",  # no tensor or group 'mail': a root attribute named so
    }
    path = tmp_path / "m.h5"
    tb.save({"enc/w": np.zeros(2)}, path, metadata=meta)
    with tb.open(path) as f:
        values = f.plain_values()
        assert values == {**meta, "config": '{"depth": 2}'}
        assert f.metadata["ids"] == "[1, 2, 3]" and f.metadata["name"] == "run-1"
    with h5py.File(path, "r") as f:
        assert f["enc"].attrs["units"] == 7 and f["enc/w"].attrs["unit"] == "m"
        assert f.attrs["mail@host"] == "x"
    copy = tmp_path / "copy.h5"
    with tb.open(path) as f:
        tb.save(f, copy)  # an opened file's attributes go along
    with tb.open(copy) as f:
        assert f.plain_values() == values
    bf16 = {"b": np.ones(2, ml_dtypes.bfloat16)}
    with pytest.raises(tb.InvalidArgumentError, match=r"would replace the 'dtype' attribute"):
        tb.save(bf16, tmp_path / "x.h5", metadata={"b@dtype": "float16"})


@pytest.mark.parametrize("libver", ["earliest", "latest"])
@pytest.mark.parametrize("userblock", [0, 1024])
def test_string_lengths_are_read_from_the_object_header(
    libver: str, userblock: int, tmp_path: Path
) -> None:
    """What HDF5 would allocate for a variable-length string attribute, found first."""
    from tensorbridge.io.hdf5.headers import attribute_lengths
    from tensorbridge.io.hdf5.source import superblock

    path = tmp_path / "s.h5"
    strings = {"dtype": "bfloat16", "long": "x" * 300, "names": ["a", "bcd", "ef" * 40]}
    with h5py.File(path, "w", libver=libver, userblock_size=userblock or None) as f:
        f["w"] = np.ones(2, "V2")
        for key, value in strings.items():
            f["w"].attrs[key] = value
        f["w"].attrs["n"] = 3
        f["dense"] = np.zeros(1)
        for i in range(20):  # more than 8: HDF5 keeps them in a fractal heap (libver latest)
            f["dense"].attrs[f"a{i}"] = "v"
    data = path.read_bytes()
    layout = superblock(data[:65536])
    assert layout.base == userblock

    def read(pos: int, n: int) -> bytes:
        return data[pos : pos + n]

    with h5py.File(path, "r") as f:
        lengths = attribute_lengths(read, layout, h5py.h5o.get_info(f["w"].id).addr)
        dense = attribute_lengths(read, layout, h5py.h5o.get_info(f["dense"].id).addr)
    assert lengths == {"dtype": 8, "long": 300, "names": 80, "n": 0}
    if libver == "latest":
        assert dense is None  # not walked here: its string attributes are not read
    with tb.open(path) as f:
        assert f["w"].dtype == ml_dtypes.bfloat16
        assert f.plain_values()["w@names"] == ["a", "bcd", "ef" * 40]
        assert ("dense@a3" in f.plain_values()) is (libver == "earliest")


def test_names_that_are_no_utf_8(tmp_path: Path) -> None:
    """HDF5 names are bytes: one that is no UTF-8 reads as its bytes escaped (a fuzz find)."""
    path = tmp_path / "names.h5"
    with h5py.File(path, "w") as f:
        f["w"] = np.arange(2)
        h5py.h5a.create(f.id, b"n\x96e", h5t.STD_I64LE, h5s.create(h5s.SCALAR)).write(
            np.array(7, np.int64)
        )
    with tb.open(path) as f:
        assert f.plain_values() == {"n\udc96e": 7} and f.notes == []


def test_names_are_checked_before_anything_is_written(tmp_path: Path) -> None:
    path = tmp_path / "n.h5"
    for bad, why in (
        ("/abs", "empty path component"),
        ("a//b", "empty path component"),
        ("a/./b", r"'\.' or '\.\.' component"),
        ("a\x00b", "NUL"),
    ):
        with pytest.raises(InvalidNameError, match=why):
            tb.save({bad: np.zeros(1)}, path)
    with pytest.raises(InvalidNameError, match=r"'a' would be a dataset and the group holding"):
        tb.save({"a": np.zeros(1), "a/b": np.zeros(1)}, path)
    assert not path.exists()
    big = {"x": np.arange(3, dtype=">i4")}  # byte-swapped input: stored little-endian
    tb.save(big, path)
    assert tb.load(path)["x"].tolist() == [0, 1, 2]


def test_float_dtype_and_torch_tensors(tmp_path: Path) -> None:
    path = tmp_path / "t.h5"
    sd = {"w": torch.randn(3, 4), "step": torch.tensor(5), "half": torch.ones(2, dtype=torch.half)}
    tb.save(sd, path, float_dtype="bfloat16")
    got = tb.load(path, framework="torch")
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["w"], sd["w"].bfloat16())
    assert got["step"].dtype == torch.int64 and got["half"].dtype == torch.bfloat16
    got["w"][0, 0] = 99.0  # copy-on-write: the file is unchanged
    assert tb.load(path)["w"][0, 0] != 99.0


def test_without_h5py_the_extra_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "x.h5"
    tb.save({"x": np.zeros(1)}, path)
    monkeypatch.setitem(sys.modules, "h5py", None)
    with pytest.raises(MissingExtraError, match=r"pip install tensorbridge\[hdf5\]"):
        tb.open(path)
    with pytest.raises(MissingExtraError, match=r"pip install tensorbridge\[hdf5\]"):
        tb.save({"x": np.zeros(1)}, tmp_path / "y.h5")


# --- hostile files -------------------------------------------------------------------------------


def _sample(tmp_path: Path) -> Path:
    path = tmp_path / "sample.h5"
    tb.save(
        {"w": np.arange(64, dtype=np.float32).reshape(8, 8), "b": np.ones(8, ml_dtypes.bfloat16)},
        path,
        metadata={"epoch": 1},
    )
    with h5py.File(path, "a") as f:
        f.create_dataset("z", data=np.arange(1000), compression="gzip", chunks=(100,))
    return path


def _read_all(path: Path) -> None:
    with tb.open(path) as f:
        f.plain_values()
        for name in f:
            f.get(name, mmap=False)
            f[name]


@pytest.fixture
def sample(tmp_path: Path) -> Iterator[Path]:
    yield _sample(tmp_path)


def test_truncated_files_raise_format_error(sample: Path, tmp_path: Path) -> None:
    data = sample.read_bytes()
    cut = tmp_path / "cut.h5"
    for n in sorted({0, 1, 8, 9, 64, 100, 500, *range(1000, len(data), 997), len(data) - 1}):
        cut.write_bytes(data[:n])
        with pytest.raises(FormatError):
            _read_all(cut)


def test_an_offset_beyond_the_file_is_refused(sample: Path) -> None:
    with h5py.File(sample, "r") as f:
        offset, size = f["w"].id.get_offset(), f["w"].id.get_storage_size()
    data = bytearray(sample.read_bytes())
    layout = struct.pack("<QQ", offset, size)  # the contiguous layout message's address, size
    at = data.find(layout)
    assert at > 0 and data.find(layout, at + 1) < 0
    data[at : at + 8] = struct.pack("<Q", len(data) - 16)
    sample.write_bytes(bytes(data))
    with tb.open(sample) as f:  # HDF5 2.0 checks it too, and says so first
        with pytest.raises(FormatError, match=r"dataset 'w'.*(lie outside|corrupt)"):
            f["w"]
        assert f["b"].dtype == ml_dtypes.bfloat16  # the others still read


def test_huge_dimensions_are_refused_before_allocating(sample: Path) -> None:
    data = bytearray(sample.read_bytes())
    dims = struct.pack("<QQQQ", 8, 8, 8, 8)  # w's dataspace: its dimensions and maxima
    at = data.find(dims)
    data[at : at + 32] = struct.pack("<QQQQ", 1 << 40, 1 << 20, 1 << 40, 1 << 20)
    dims = struct.pack("<QQ", 1000, 1000)  # z's (chunked, compressed): its dimension, maximum
    at = data.find(dims)
    assert at > 0
    data[at : at + 16] = struct.pack("<QQ", 1 << 50, 1 << 50)
    sample.write_bytes(bytes(data))
    with tb.open(sample) as f:
        with pytest.raises(FormatError, match=r"dataset 'w'.*corrupt"):  # HDF5 2.0 checks it
            f.get("w", mmap=False)
        assert f.info("z")[1] == (1 << 50,)
        with pytest.raises(FormatError, match=r"'z' declares 9,007,199,254,740,992 bytes but "):
            f.get("z", mmap=False)  # a chunked dataset's size is ours to check


def test_a_zip_without_weights_and_a_corrupt_member(tmp_path: Path) -> None:
    path = tmp_path / "m.keras"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("config.json", "{}")
        z.writestr("model.weights.h5", b"\x89HDF\r\n\x1a\n" + bytes(40))
    assert detect(path) == "hdf5"
    with pytest.raises(FormatError, match=r"member 'model.weights.h5': HDF5 cannot read it"):
        tb.open(path)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("config.json", "{}")
    with pytest.raises(FormatError, match=r"zip archive without model.weights.h5"):
        hdf5.open(path)


@pytest.mark.parametrize(
    "module",
    ["tensorbridge.io.hdf5", "tensorbridge.io.hdf5.reader", "tensorbridge.io.hdf5.writer",
     "tensorbridge.io.hdf5.datatypes"],
)  # fmt: skip
def test_docstring_examples_run(module: str) -> None:
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0

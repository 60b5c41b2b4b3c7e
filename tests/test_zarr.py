"""Zarr: the data-type module (bits, fill values, registration), the format, plain readers.

Every check compares bytes, never values, so NaN payloads and -0.0 count. The readers
that matter are the ones a plain NumPy process has (zarr, dask, tensorstore): they run
in a subprocess that never imports torch.
"""

from __future__ import annotations

import doctest
import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorbridge as tb
from conftest import make_patterns

zarr = pytest.importorskip("zarr", reason="zarr is an extra: pip install tensorbridge[zarr]")

from zarr.core.dtype import data_type_registry  # noqa: E402
from zarr.core.dtype.registry import DataTypeRegistry  # noqa: E402

from tensorbridge import zarr_dtypes as zd  # noqa: E402
from tensorbridge._commit import begin_store  # noqa: E402
from tensorbridge.errors import (  # noqa: E402
    FormatError,
    MissingExtraError,
    UncommittedCheckpointError,
    UnsupportedDtypeError,
)
from tensorbridge.io import zarr as tbz  # noqa: E402

SRC = Path(tb.__file__).resolve().parent.parent
ROOT = SRC.parent
# zarr-extensions' names that tensorstore 0.1.86 does not read (its zarr3 driver says
# "... data type is not one of the supported data types")
NOT_TENSORSTORE = frozenset({
    "complex_float16", "complex_bfloat16", "float8_e4m3", "float6_e2m3fn", "float6_e3m2fn",
    "uint4", "uint2",
})  # fmt: skip
TENSORSTORE = [c for c in zd.DATA_TYPES if c._zarr_v3_name not in NOT_TENSORSTORE]
# the table's rows no Zarr data type holds: zarr-extensions and tensorstore name none
NO_ZARR_TYPE = frozenset({"int1", "uint1", "float8_e5m3fnu"})
IN_ZARR = [r for r in tb.dtype_table() if r.name not in NO_ZARR_TYPE]


def bits(a: Any) -> bytes:
    return np.ascontiguousarray(a).view(np.uint8).tobytes()


def type_patterns(cls: type[zd.MLType]) -> np.ndarray:
    """Every bit pattern of a 1- or 2-byte type; a complex one: the table's edge pairs."""
    dt = cls._numpy
    if dt.itemsize == 4:
        return make_patterns(tb.resolve_dtype(dt))
    return np.arange(1 << (8 * dt.itemsize), dtype=np.uint32).astype(f"u{dt.itemsize}").view(dt)


def fill_values(cls: type[zd.MLType]) -> np.ndarray:
    """The values a fill value can spell: every bit pattern (of each part of a complex
    type), or an integer type's values (a JSON integer is the value of the low bits;
    bytes with high bits set read the same)."""
    if issubclass(cls, zd.MLInt):
        every = np.arange(256, dtype=np.uint8).view(cls._numpy).astype(np.int64)
        return np.arange(every.min(), every.max() + 1).astype(cls._numpy)
    if cls._numpy.itemsize == 4:  # a complex fill value spells each part alone: pair every
        real = np.arange(1 << 16, dtype=np.uint32)  # pattern with another (an odd multiplier
        imag = (real * 40503 + 1) & 0xFFFF  # permutes them), each in both places
        return (real | imag << 16).view(cls._numpy)
    return type_patterns(cls)


def plain_python(code: str, tmp_path: Path, timeout: int = 300) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter that must never import torch; its JSON result."""
    script = tmp_path / "plain.py"
    script.write_text(
        textwrap.dedent(code)
        + "\nif __name__ == '__main__':  # not in spawned worker processes\n"
        + "    import sys, json\n    RESULT['torch'] = 'torch' in sys.modules\n"
        + "    print('RESULT', json.dumps(RESULT))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tmp_path,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"no result (rc {done.returncode}):\n{done.stdout}\n{done.stderr[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1][len("RESULT ") :])
    assert result.pop("torch") is False, "the plain process imported torch"
    return result


# --- the data-type module ------------------------------------------------------------------


def test_the_data_type_module_imports_neither_torch_nor_tensorbridge(tmp_path: Path) -> None:
    got = plain_python(
        """
        import sys
        import tensorbridge.zarr_dtypes
        RESULT = {"tb": sorted(m for m in sys.modules if m.startswith("tensorbridge"))}
        """,
        tmp_path,
    )
    assert got["tb"] == [
        "tensorbridge",
        "tensorbridge.zarr_dtypes",
        "tensorbridge.zarr_dtypes._fill",
    ]


@pytest.mark.parametrize("cls", zd.DATA_TYPES, ids=lambda c: c._zarr_v3_name)
def test_every_bit_pattern_round_trips(cls: type[zd.MLType], tmp_path: Path) -> None:
    a = type_patterns(cls)
    z = zarr.create_array(
        str(tmp_path / "a"),
        shape=a.shape,
        dtype=a.dtype,
        chunks=(1000,),
        config={"write_empty_chunks": True},
    )
    z[:] = a
    back = zarr.open_array(str(tmp_path / "a"))
    meta = json.loads((tmp_path / "a" / "zarr.json").read_text())
    assert meta["data_type"] == cls._zarr_v3_name and back.dtype == a.dtype
    assert bits(back[:]) == bits(a)
    assert isinstance(back.metadata.data_type, cls)


@pytest.mark.parametrize("cls", zd.DATA_TYPES, ids=lambda c: c._zarr_v3_name)
def test_every_fill_value_keeps_its_bits(cls: type[zd.MLType]) -> None:
    t = cls()
    for value in fill_values(cls):
        spelled = json.loads(json.dumps(t.to_json_scalar(value, zarr_format=3)))
        back = t.from_json_scalar(spelled, zarr_format=3)
        assert bits(np.asarray(back)) == bits(np.asarray(value)), (value, spelled)


@pytest.mark.parametrize("cls", zd.DATA_TYPES, ids=lambda c: c._zarr_v3_name)
def test_a_fill_value_fills_unwritten_chunks_with_its_bits(
    cls: type[zd.MLType], tmp_path: Path
) -> None:
    dt = cls._numpy
    fill = np.array([0x7FC1 if dt.itemsize == 2 else 0x7F], f"u{min(dt.itemsize, 2)}")
    if dt.itemsize == 4:
        fill = np.array([0x7E01, 0xFC00], np.uint16)  # a NaN payload and -inf
        if dt == np.dtype(ml_dtypes.bcomplex32):
            fill = np.array([0x7FC1, 0xFF80], np.uint16)  # the same in bfloat16 parts
    value = fill_values(cls)[-1] if issubclass(cls, zd.MLInt) else fill.view(dt)[0]
    z = zarr.create_array(str(tmp_path / "f"), shape=(6,), dtype=dt, chunks=(3,), fill_value=value)
    z[:3] = np.zeros(3, dt)
    again = zarr.open_array(str(tmp_path / "f"))
    assert bits(again[3:]) == bits(np.full(3, value, dt))


def test_fill_value_spellings() -> None:
    bf16, e4m3fn, e8m0, fp4 = (
        zd.BFloat16(),
        zd.Float8E4M3FN(),
        zd.Float8E8M0FNU(),
        zd.Float4E2M1FN(),
    )
    as_bf16 = np.array([0x7FC0, 0x7FC1, 0x8000, 0x3FC0], np.uint16).view(ml_dtypes.bfloat16)
    assert [bf16.to_json_scalar(v, zarr_format=3) for v in as_bf16] == [
        "NaN",  # the canonical NaN
        "0x7fc1",  # a payload: only bits say it
        -0.0,
        1.5,
    ]
    # tensorstore spells float8_e8m0fnu numbers with another bias: bits are unambiguous
    assert e8m0.to_json_scalar(np.float32(1.0), zarr_format=3) == "0x7f"
    assert e8m0.to_json_scalar(np.float32("nan"), zarr_format=3) == "NaN"
    assert bits(e8m0.from_json_scalar(0.0, zarr_format=3)) == b"\x00"  # tensorstore's default
    assert bits(e8m0.default_scalar()) == b"\x00"
    with pytest.raises(ValueError, match=r"'Infinity' has no exact float8_e4m3fn representation"):
        e4m3fn.from_json_scalar("Infinity", zarr_format=3)
    with pytest.raises(ValueError, match=r"'NaN' has no exact float4_e2m1fn representation"):
        fp4.from_json_scalar("NaN", zarr_format=3)
    with pytest.raises(ValueError, match=r"0.1 has no exact bfloat16 representation"):
        bf16.from_json_scalar(0.1, zarr_format=3)
    with pytest.raises(ValueError, match=r"'0x1ff' is not 1 byte\(s\) of hexadecimal bits"):
        e4m3fn.from_json_scalar("0x1ff", zarr_format=3)
    assert zd.ComplexFloat16().to_json_scalar(1 + 2j, zarr_format=3) == [1.0, 2.0]
    bc = zd.ComplexBFloat16()
    assert bc.to_json_scalar(1 + 2j, zarr_format=3) == [1.0, 2.0]
    assert bits(bc.from_json_scalar(["0x7fc1", -0.0], zarr_format=3)) == bits(
        np.array([0x7FC1, 0x8000], np.uint16)
    )
    # the new floats: NaN as zarr-extensions spells it, no infinity where the type has none
    for cls, nan in ((zd.Float8E4M3, 0x7C), (zd.Float8E3M4, 0x78), (zd.Float8E4M3B11FNUZ, 0x80)):
        assert bits(cls().from_json_scalar("NaN", zarr_format=3)) == bytes([nan])
    assert bits(zd.Float8E4M3().from_json_scalar("Infinity", zarr_format=3)) == b"\x78"
    for cls in (zd.Float6E2M3FN, zd.Float6E3M2FN, zd.Float8E4M3B11FNUZ):
        with pytest.raises(ValueError, match=r"'Infinity' has no exact float"):
            cls().from_json_scalar("Infinity", zarr_format=3)
    assert zd.Float6E2M3FN().to_json_scalar(7.5, zarr_format=3) == 7.5
    # the integers: JSON integers within the range, a byte's low bits as its value
    int4, uint2 = zd.Int4(), zd.UInt2()
    assert (
        int4.to_json_scalar(np.array([0x18], np.uint8).view(ml_dtypes.int4)[0], zarr_format=3) == -8
    )
    assert bits(int4.from_json_scalar(-8, zarr_format=3)) == b"\x08"
    assert bits(uint2.from_json_scalar(3.0, zarr_format=3)) == b"\x03"  # as zarr's own ints
    with pytest.raises(
        ValueError, match=r"fill value 8 is outside int4's range; give an integer from -8 to 7"
    ):
        int4.from_json_scalar(8, zarr_format=3)
    with pytest.raises(TypeError, match=r"fill value 'NaN' is not a uint2 value"):
        uint2.from_json_scalar("NaN", zarr_format=3)
    with pytest.raises(TypeError, match=r"fill value True is not a int4 value"):
        int4.from_json_scalar(True, zarr_format=3)


def test_zarr_v2_has_no_name_for_them() -> None:
    with pytest.raises(ValueError, match=r"zarr v2 has no name for bfloat16; .* zarr_format=3"):
        zarr.create_array({}, shape=(2,), dtype=ml_dtypes.bfloat16, zarr_format=2)


def test_big_endian_chunks_are_refused_not_misread(tmp_path: Path) -> None:
    z = zarr.create_array(str(tmp_path / "b"), shape=(2,), dtype=ml_dtypes.bfloat16)
    z[:] = np.ones(2, ml_dtypes.bfloat16)
    meta_path = tmp_path / "b" / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["codecs"][0]["configuration"]["endian"] = "big"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match=r"bfloat16 chunks stored big-endian cannot be read"):
        zarr.open_array(str(tmp_path / "b"))[:]


def test_float8_e4m3_and_float8_e4m3fn_keep_their_own_names() -> None:
    """zarr-extensions' float8_e4m3 is the IEEE-style format, a different one from
    float8_e4m3fn: each is stored under its own name, never the other's."""
    assert zd.zarr_name(ml_dtypes.float8_e4m3) == "float8_e4m3"
    assert zd.zarr_name(ml_dtypes.float8_e4m3fn) == "float8_e4m3fn"
    assert data_type_registry.get("float8_e4m3fn") is zd.Float8E4M3FN
    assert data_type_registry.get("float8_e4m3") is zd.Float8E4M3
    assert zd.Float8E4M3().to_json_scalar(float("inf"), zarr_format=3) == "Infinity"


def test_every_name_is_zarr_extensions_and_no_name_is_invented() -> None:
    """The names are the directory names of zarr-extensions' data-types/ (checked against
    github.com/zarr-developers/zarr-extensions at 4da7b37); it has none for int1, uint1 or
    float8_e5m3fnu, so neither has this module."""
    extensions = {
        "bfloat16", "complex_bfloat16", "complex_float16", "float4_e2m1fn", "float6_e2m3fn",
        "float6_e3m2fn", "float8_e3m4", "float8_e4m3", "float8_e4m3b11fnuz",
        "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "int2", "int4",
        "uint2", "uint4",
    }  # fmt: skip
    ours = {c._zarr_v3_name for c in zd.DATA_TYPES}
    assert ours - {"float8_e4m3fn"} == extensions  # float8_e4m3fn: tensorstore's name
    for name in NO_ZARR_TYPE:
        assert zd.zarr_name(getattr(ml_dtypes, name)) is None
    every_carried = {r.name for r in tb.dtype_table() if r.carried}
    named = {r.name for r in tb.dtype_table() if r.carried and zd.zarr_name(r.numpy)}
    assert every_carried - named == NO_ZARR_TYPE


def test_entry_points_name_every_type_and_load_as_zarr_3_2_would() -> None:
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    group = project["project"]["entry-points"]["zarr.data_type"]
    assert group == {
        c._zarr_v3_name: f"tensorbridge.zarr_dtypes:{c.__name__}" for c in zd.DATA_TYPES
    }
    fresh = DataTypeRegistry()  # zarr >= 3.2 loads the group lazily, like this
    fresh._lazy_load_list.extend(
        EntryPoint(name, value, "zarr.data_type") for name, value in group.items()
    )
    fresh._lazy_load()
    assert fresh.contents == {c._zarr_v3_name: c for c in zd.DATA_TYPES}


# --- plain NumPy processes read what tensorbridge writes ------------------------------------


def _reference_store(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A store of the bit patterns of every table row a Zarr data type holds, and the
    expected bytes as uint8 .npy."""
    arrays = {r.name: make_patterns(r) for r in IN_ZARR}
    arrays["bfloat16_2d"] = make_patterns(tb.resolve_dtype("bf16")).reshape(256, 256)
    arrays["scalar"] = np.array(np.uint16(0x7FC1)).view(ml_dtypes.bfloat16)
    store = tmp_path / "ref.zarr"
    tbz.save(arrays, store, max_chunk_bytes=4096)
    for name, a in arrays.items():
        np.save(tmp_path / f"{name}.npy", np.ascontiguousarray(a).reshape(-1).view(np.uint8))
    return store, arrays


@pytest.mark.slow  # a child importing zarr, dask and tensorstore
def test_plain_numpy_reads_with_zarr_dask_and_tensorstore(tmp_path: Path) -> None:
    pytest.importorskip("dask.array", reason="dask is not installed")
    pytest.importorskip("tensorstore", reason="tensorstore is not installed")
    store, arrays = _reference_store(tmp_path)
    got = plain_python(
        f"""
        import numpy as np, zarr, dask.array as da, tensorstore as ts
        import tensorbridge.zarr_dtypes  # zarr 3.1 loads no entry points
        store = {str(store)!r}
        RESULT = {{}}
        for name in {sorted(arrays)!r}:
            want = np.load(name + ".npy").tobytes()
            z = zarr.open_array(store + "/" + name, mode="r")
            r = {{"zarr": np.ascontiguousarray(z[...]).view(np.uint8).tobytes() == want,
                  "dtype": str(z.dtype)}}
            d = da.from_zarr(store + "/" + name).compute(scheduler="threads")
            r["dask"] = np.ascontiguousarray(d).view(np.uint8).tobytes() == want
            try:
                t = ts.open({{"driver": "zarr3",
                             "kvstore": {{"driver": "file", "path": store + "/" + name}}}}).result()
                a = t.read().result()
                r["tensorstore"] = np.ascontiguousarray(a).view(np.uint8).tobytes() == want
                r["ts_dtype"] = str(t.dtype.numpy_dtype)
            except Exception as e:
                r["tensorstore"] = type(e).__name__ + ": " + str(e)[:400]
            RESULT[name] = r
        """,
        tmp_path,
    )
    for name, a in arrays.items():
        r = got[name]
        assert r["zarr"] and r["dask"] and r["dtype"] == str(a.dtype), (name, r)
        zarr_type = zd.zarr_name(a.dtype)
        if zarr_type in NOT_TENSORSTORE:  # e.g. complex_float16, float6_e2m3fn
            assert f"{zarr_type} data type is not one of the supported" in r["tensorstore"]
        else:
            assert r["tensorstore"] is True and r["ts_dtype"] == str(a.dtype), (name, r)


@pytest.mark.slow  # a child starting a dask cluster of worker processes
def test_dask_distributed_workers_read_without_torch(tmp_path: Path) -> None:
    pytest.importorskip("distributed", reason="dask.distributed is not installed")
    a = make_patterns(tb.resolve_dtype("bf16")).reshape(512, 128)
    e8m0 = make_patterns(tb.resolve_dtype("float8_e8m0fnu")).reshape(16, 16)
    tbz.save({"w": a, "s": e8m0}, tmp_path / "d.zarr", max_chunk_bytes=8192)
    np.save(tmp_path / "w.npy", a.view(np.uint8))
    np.save(tmp_path / "s.npy", e8m0.view(np.uint8))
    got = plain_python(
        f"""
        import sys, numpy as np, dask.array as da
        from dask.distributed import Client, LocalCluster
        import tensorbridge.zarr_dtypes
        if __name__ == "__main__":
            with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                              dashboard_address=None) as cluster, Client(cluster) as client:
                RESULT = {{}}
                for name in ("w", "s"):
                    d = da.from_zarr({str(tmp_path / "d.zarr")!r} + "/" + name)
                    out = d.map_blocks(lambda b: b.view(np.uint8), dtype=np.uint8).compute()
                    RESULT[name] = out.tobytes() == np.load(name + ".npy").tobytes()
                RESULT["chunks"] = d.numblocks
                RESULT["workers"] = len(client.scheduler_info()["workers"])
                RESULT["worker_torch"] = list(
                    client.run(lambda: "torch" in sys.modules).values()
                )
        """,
        tmp_path,
        timeout=400,
    )
    assert got["w"] and got["s"] and got["workers"] == 2
    assert got["worker_torch"] == [False, False]


@pytest.mark.parametrize("cls", TENSORSTORE, ids=lambda c: c._zarr_v3_name)
def test_arrays_tensorstore_writes_read_back_bit_for_bit(
    cls: type[zd.MLType], tmp_path: Path
) -> None:
    ts = pytest.importorskip("tensorstore", reason="tensorstore is not installed")
    a = type_patterns(cls)
    width = a.dtype.itemsize
    fills: list[Any] = [None, 1, int(fill_values(cls)[0])]  # an integer type: integers
    if not issubclass(cls, zd.MLInt):
        fills = [None, "0x" + "01".rjust(2 * width, "0")]
        if cls._rules.has_nan:
            fills.append("NaN")
        if width == 2:
            fills.append("0x7fc1")  # a NaN payload
    for i, fill in enumerate(fills):
        path = tmp_path / f"ts{i}"
        meta: dict[str, Any] = {
            "shape": [a.size + 300],  # chunks of 100 past the data are never written
            "data_type": cls._zarr_v3_name,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [100]}},
        }
        if fill is not None:
            meta["fill_value"] = fill
        spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(path)}}
        t = ts.open({**spec, "metadata": meta, "create": True}).result()
        t[: a.size].write(a).result()
        theirs = t.read().result()
        ours = zarr.open_array(str(path), mode="r")[...]
        assert ours.dtype == a.dtype and bits(ours[: a.size]) == bits(a)
        if cls is zd.Float8E8M0FNU and fill == "0x01":
            # tensorstore 0.1 writes this fill value as the number 2**-62 (its e8m0
            # numbers use another exponent bias), which is bits 0x41 for everyone else
            stored = json.loads((path / "zarr.json").read_text())["fill_value"]
            assert stored == 2.0**-62 and bits(ours[300:]) == b"\x41" * a.size
            continue
        if issubclass(cls, zd.MLInt):  # a fill value is a value: tensorstore sign-extends
            # it into the high bits (-2 is 0xfe), ml_dtypes leaves them clear (0x02), and
            # zarr-extensions says readers ignore them
            assert np.array_equal(ours.astype(np.int64), theirs.astype(np.int64)), fill
            continue
        assert bits(ours) == bits(theirs), fill


# --- the format: tb.save / tb.open / tb.load ---------------------------------------------


def test_every_table_row_round_trips_through_the_format(tmp_path: Path) -> None:
    tensors = {r.name: tb.to_torch(make_patterns(r)) for r in IN_ZARR if r.in_torch}
    tensors["scalar"] = torch.tensor(-0.0, dtype=torch.bfloat16)
    tensors["empty"] = torch.zeros(0, 3, dtype=torch.float8_e5m2)
    tensors["columns"] = torch.arange(24, dtype=torch.int32).reshape(4, 6).t()  # not contiguous
    tb.save(tensors, tmp_path / "m.zarr", metadata={"step": 7, "cfg": {"lr": 0.5}})
    with tb.open(tmp_path / "m.zarr") as f:
        assert f.keys() == list(tensors)
        assert f.metadata == {"step": "7", "cfg": '{"lr": 0.5}'}
        assert f.plain_values() == {"step": 7, "cfg": {"lr": 0.5}}
        for name, t in tensors.items():
            row, shape = f.info(name)
            assert row.torch is t.dtype and shape == tuple(t.shape)
            a = f[name]
            assert not a.flags.writeable and bits(a) == bits(tb.to_numpy(t.contiguous()))
    back = tb.load(tmp_path / "m.zarr", framework="torch")
    for name, t in tensors.items():
        assert back[name].dtype is t.dtype
        assert bits(tb.to_numpy(back[name])) == bits(tb.to_numpy(t.contiguous()))


@pytest.mark.parametrize("row", [r for r in IN_ZARR if not r.kernels], ids=lambda r: r.name)
def test_every_bit_pattern_of_the_new_rows_round_trips(tmp_path: Path, row: tb.DTypeRow) -> None:
    """int4 ... and the types only NumPy has: NumPy -> store -> NumPy (and torch where torch
    has the type), every byte value kept, high bits of a sub-byte element included."""
    a = make_patterns(row)
    sources = {"a": a, "t": tb.to_torch(a)} if row.in_torch else {"a": a}
    tb.save(sources, tmp_path / "n.zarr")
    meta = json.loads((tmp_path / "n.zarr" / "a" / "zarr.json").read_text())
    assert meta["data_type"] == zd.zarr_name(row.numpy)
    with tb.open(tmp_path / "n.zarr") as f:
        for name in sources:
            assert f.info(name) == (row, a.shape)
            assert f[name].dtype == row.numpy and bits(f[name]) == bits(a)
    if row.in_torch:
        back = tb.load(tmp_path / "n.zarr", framework="torch")
        assert all(t.dtype is row.torch and bits(tb.to_numpy(t)) == bits(a) for t in back.values())
    else:
        with pytest.raises(
            UnsupportedDtypeError, match=rf"ml_dtypes {row.name} has no torch dtype"
        ):
            tb.load(tmp_path / "n.zarr", framework="torch")
    plain = zarr.open_array(str(tmp_path / "n.zarr" / "a"), mode="r")[...]  # zarr itself
    assert plain.dtype == row.numpy and bits(plain) == bits(a)


@pytest.mark.parametrize("row", [r for r in IN_ZARR if not r.kernels], ids=lambda r: r.name)
def test_tensorstore_reads_the_new_types_it_knows(tmp_path: Path, row: tb.DTypeRow) -> None:
    """What tb.save writes of int4, float8_e3m4, ... tensorstore opens bit for bit; a
    zarr-extensions name it lacks (float6, uint4, ...) it refuses by that name."""
    ts = pytest.importorskip("tensorstore", reason="tensorstore is not installed")
    a = make_patterns(row)
    tb.save({"a": a}, tmp_path / "n.zarr")
    spec = {"driver": "zarr3", "kvstore": {"driver": "file", "path": str(tmp_path / "n.zarr/a")}}
    name = zd.zarr_name(row.numpy)
    if name in NOT_TENSORSTORE:
        with pytest.raises(ValueError, match=rf"{name} data type is not one of the supported"):
            ts.open(spec).result()
    else:
        got = ts.open(spec).result().read().result()
        assert got.dtype == row.numpy and bits(got) == bits(a)


@pytest.mark.parametrize("name", sorted(NO_ZARR_TYPE))
def test_rows_without_a_zarr_data_type_are_refused_naming_npy(tmp_path: Path, name: str) -> None:
    row = tb.resolve_dtype(name)
    a = make_patterns(row)
    message = (
        rf"at 'w': {name} has no Zarr data type \(zarr-extensions and tensorstore define none\); "
        r"save it to .npy or .npz, which keep every dtype of the table"
    )
    for value in (a, tb.to_torch(a)) if row.in_torch else (a,):
        with pytest.raises(UnsupportedDtypeError, match=message):
            tb.save({"ok": np.ones(2), "w": value}, tmp_path / "r.zarr")
        assert not (tmp_path / "r.zarr").exists()
    with pytest.raises(UnsupportedDtypeError, match=rf"^{name} has no Zarr data type"):
        tbz.create_array(tmp_path, "w", (2,), name, (2,))
    if row.is_floating:  # a cast to a type Zarr holds is stored
        tb.save({"w": a}, tmp_path / "c.zarr", float_dtype="bfloat16")
        want = tb.to_numpy(a, dtype="bfloat16")  # ml_dtypes' cast, as to_numpy's
        assert bits(tb.load(tmp_path / "c.zarr")["w"]) == bits(want)


def test_float_dtype_casts_floats_only(tmp_path: Path) -> None:
    t = {"w": torch.randn(40, 3), "i": torch.arange(4)}
    tb.save(t, tmp_path / "c.zarr", float_dtype="bf16")
    got = tb.load(tmp_path / "c.zarr", framework="torch")
    assert got["w"].dtype is torch.bfloat16 and torch.equal(got["w"], t["w"].bfloat16())
    assert got["i"].dtype is torch.int64


def test_chunks_are_bounded_and_every_chunk_is_written(tmp_path: Path) -> None:
    a = np.zeros((64, 32), np.float32)
    a[0, 0] = -0.0
    tbz.save({"z": a}, tmp_path / "s.zarr", max_chunk_bytes=1024)
    z = zarr.open_array(str(tmp_path / "s.zarr/z"))
    assert z.chunks == (8, 32)  # 8 * 32 * 4 = 1024 bytes
    chunk_files = [p for p in (tmp_path / "s.zarr/z/c").rglob("*") if p.is_file()]
    assert len(chunk_files) == 8  # all zeros, and still written (write_empty_chunks)
    meta = json.loads((tmp_path / "s.zarr/z/zarr.json").read_text())
    assert [c["name"] for c in meta["codecs"]] == ["bytes"]  # uncompressed


def test_overwrite_replaces_the_store_and_drops_old_arrays(tmp_path: Path) -> None:
    p = tmp_path / "o.zarr"
    tb.save({"a": np.ones(2), "b": np.ones(2)}, p)
    with pytest.raises(tb.DestinationExistsError, match=r"pass overwrite=True"):
        tb.save({"a": np.zeros(2)}, p)
    tb.save({"a": np.zeros(3)}, p, overwrite=True)
    assert sorted(os.listdir(p)) == ["a", "zarr.json"]
    assert tb.load(p)["a"].tolist() == [0, 0, 0]


def test_a_directory_that_is_no_store_is_left_alone(tmp_path: Path) -> None:
    d = tmp_path / "data.zarr"
    d.mkdir()
    (d / "notes.txt").write_text("mine")
    with pytest.raises(FormatError, match=r"exists and is no Zarr store; remove it"):
        tb.save({"a": np.ones(2)}, d, overwrite=True)
    assert os.listdir(d) == ["notes.txt"]


def test_an_uncommitted_store_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "u.zarr"
    tb.save({"a": np.ones(2)}, p)
    # the fallback commit (no atomic exchange) died after removing the previous index
    staging = begin_store(p, "deadbeef" * 4)
    tbz.create_array(staging, "a", (2,), "float64", (2,))
    (p / "zarr.json").unlink()
    with pytest.raises(UncommittedCheckpointError, match=r"still running or died before"):
        tb.open(p)
    with pytest.raises(UncommittedCheckpointError):
        tbz.ZarrFile(p)


def test_stores_made_by_zarr_itself_are_read(tmp_path: Path) -> None:
    g = zarr.open_group(str(tmp_path / "g.zarr"), mode="w", attributes={"who": "zarr"})
    g.create_array("b", shape=(3,), dtype="int16")[:] = [1, 2, 3]
    g.create_array("a", shape=(2,), dtype=ml_dtypes.float8_e5m2)[:] = np.ones(2)
    with tb.open(tmp_path / "g.zarr") as f:
        assert f.keys() == ["a", "b"] and f.metadata == {"who": "zarr"}
        assert f["b"].tolist() == [1, 2, 3] and f["a"].dtype == ml_dtypes.float8_e5m2
    one = zarr.create_array(str(tmp_path / "one.zarr"), shape=(2,), dtype="float32")
    one[:] = [1.5, 2.5]
    got = tb.load(tmp_path / "one.zarr")  # a bare array is one entry
    assert isinstance(got, np.ndarray) and got.tolist() == [1.5, 2.5]


def test_names_and_values_a_store_cannot_hold_are_refused(tmp_path: Path) -> None:
    p = tmp_path / "r.zarr"
    with pytest.raises(tb.InvalidNameError, match=r"'a/b': it holds a path separator"):
        tb.save({"a/b": torch.ones(1)}, p)
    with pytest.raises(tb.InvalidNameError, match=r"'__x': names starting with '__' are reserved"):
        tb.save({"__x": torch.ones(1)}, p)
    fp4 = torch.zeros(2, 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)
    with pytest.raises(UnsupportedDtypeError, match=r"at 'q': float4_e2m1fn_x2 packs two"):
        tb.save({"q": fp4}, p)
    with pytest.raises(ValueError, match=r"metadata 'f' = .* is not a JSON value"):
        tb.save({"a": torch.ones(1)}, p, metadata={"f": object()})
    with pytest.raises(ValueError, match=r"'tensorbridge' is reserved"):
        tb.save({"a": torch.ones(1)}, p, metadata={"tensorbridge": 1})
    assert not p.exists()


def test_a_missing_extra_names_the_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "zarr", None)
    with pytest.raises(MissingExtraError, match=r"pip install tensorbridge\[zarr\]"):
        tb.save({"a": np.ones(2)}, tmp_path / "m.zarr")
    assert isinstance(MissingExtraError("x"), ImportError)


# --- regions: the API parallel writers share --------------------------------------------


def test_chunk_grid_tiles_every_block() -> None:
    rows = [((0, 0), (3, 8)), ((3, 0), (3, 8)), ((6, 0), (2, 8))]  # uneven Shard(0)
    assert tbz.chunk_grid((8, 8), rows, 4) == (1, 8)
    cols = [((0, 0), (8, 4)), ((0, 4), (8, 4))]  # Shard(1)
    assert tbz.chunk_grid((8, 8), cols, 4) == (8, 4)
    assert tbz.chunk_grid((), [((), ())], 2) == ()
    assert tbz.chunk_grid((0, 5), [((0, 0), (0, 5))], 2) == (1, 5)
    big = tbz.chunk_grid((4096, 4096), [((0, 0), (4096, 4096))], 2, max_chunk_bytes=1 << 20)
    assert big == (128, 4096)
    prime = tbz.chunk_grid((10007, 3), [((0, 0), (10007, 3))], 4, max_chunk_bytes=1024)
    assert prime == (1, 3)  # 10007 is prime: one row a chunk is the only divisor that fits


def test_write_region_refuses_blocks_that_cut_chunks(tmp_path: Path) -> None:
    z = tbz.create_array(tmp_path, "w", (8, 4), "float32", (2, 4))
    with pytest.raises(ValueError, match=r"cuts chunks of \(2, 4\) on dimension 0"):
        tbz.write_region(z, (1, 0), np.ones((2, 4), np.float32))
    with pytest.raises(ValueError, match=r"lies outside the array's shape"):
        tbz.write_region(z, (6, 0), np.ones((4, 4), np.float32))
    assert tbz.write_region(z, (6, 0), np.ones((2, 4), np.float32)) == 32


def test_aligned_regions_from_separate_writers_make_the_whole(tmp_path: Path) -> None:
    full = tb.to_torch(make_patterns(tb.resolve_dtype("bf16"))).reshape(256, 256)
    blocks = [((0, 0), (96, 256)), ((96, 0), (160, 256))]
    chunks = tbz.chunk_grid(full.shape, blocks, 2, max_chunk_bytes=8192)
    tbz.create_array(tmp_path, "w", full.shape, torch.bfloat16, chunks)
    for (r0, _), (n, _) in blocks:  # each "rank" opens the array and writes its rows
        tbz.write_region(
            tbz.open_region(tmp_path / "w"), (r0, 0), full[r0 : r0 + n], buffer_bytes=4096
        )
    assert bits(zarr.open_array(str(tmp_path / "w"))[...]) == bits(tb.to_numpy(full))


@pytest.mark.parametrize(
    "module", [zd, tbz, tbz.store, tbz.writer, tbz.reader], ids=lambda m: m.__name__
)
def test_docstring_examples_run(module: Any) -> None:
    # the package's modules' examples use its public names (save, load, write_region) as one
    public = {name: getattr(tbz, name) for name in tbz.__all__}
    failures, tried = doctest.testmod(module, extraglobs=public, optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failures == 0


def test_a_store_writer_that_fails_leaves_the_previous_store(tmp_path: Path) -> None:
    p = tmp_path / "w.zarr"
    tb.save({"a": np.arange(3)}, p)
    with pytest.raises(RuntimeError, match=r"writer died"), tbz.StoreWriter(p) as store:
        store.create("b", (2,), "int8")
        raise RuntimeError("writer died")
    assert sorted(os.listdir(p)) == ["a", "zarr.json"]  # no staging directory left either
    assert list(tb.load(p)) == ["a"]


def test_a_read_mostly_made_of_fill_value_is_refused_unless_asked(tmp_path: Path) -> None:
    """zarr skips chunks equal to the fill value: a declared shape can dwarf the files."""
    p = tmp_path / "sparse.zarr"
    g = zarr.open_group(str(p), mode="w")
    a = g.create_array("a", shape=(1000,), chunks=(100,), dtype="float64", fill_value=0)
    a[:100] = 1.0  # zarr's default write_empty_chunks=False: one chunk file of ten
    with tbz.open(p, max_fill_bytes=1000) as f, pytest.raises(FormatError) as err:
        f["a"]
    assert "declares 8,000 bytes but its chunk files hold at most 800" in str(err.value)
    assert "max_fill_bytes=None" in str(err.value)
    with tbz.open(p, max_fill_bytes=None) as f:
        back = f["a"]
    assert back[:100].tolist() == [1.0] * 100 and not back[100:].any()
    with tbz.open(p, max_fill_bytes=7200) as f:  # what the files miss, exactly allowed
        assert f["a"].sum() == 100.0
    # tensorbridge writes every chunk, zeros included: nothing is made up
    mine = tmp_path / "mine.zarr"
    tb.save({"z": np.zeros((64, 64))}, mine)
    with tbz.open(mine, max_fill_bytes=0) as f:
        assert f["z"].shape == (64, 64) and not f["z"].any()


def test_a_read_of_many_absent_chunks_is_refused_unless_asked(tmp_path: Path) -> None:
    """A fine grid over few files makes zarr look up each absent chunk: bounded too."""
    p = tmp_path / "fine.zarr"
    g = zarr.open_group(str(p), mode="w")
    a = g.create_array("a", shape=(3000,), chunks=(2,), dtype="uint8", fill_value=0)
    a[:2] = 7  # one chunk file of 1,500: 3 KB in all, far under max_fill_bytes
    with tbz.open(p) as f, pytest.raises(FormatError) as err:
        f["a"]
    assert "declares 1,500 chunks but the store holds 1 chunk file:" in str(err.value)
    assert "max_fill_bytes=None" in str(err.value)
    with tbz.open(p, max_fill_bytes=None) as f:
        back = f["a"]
    assert back[:2].tolist() == [7, 7] and not back[2:].any()
    written = 1500 - tbz.MAX_FILL_CHUNKS  # chunk files: exactly MAX_FILL_CHUNKS absent
    a[2 : 2 * written] = 1
    with tbz.open(p) as f:
        assert f["a"].sum() == 14 + 2 * (written - 1)

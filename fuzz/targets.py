"""One fuzz target per reader: valid seeds written by the real tools, and the harness.

A target turns an input (bytes) into a file on disk, together with the fixed, valid
files it needs beside it (the shards an index names, the ``.distcp`` file a DCP
``.metadata`` describes, the chunks of a Zarr array, the quantized checkpoint a config
describes), opens it the way a user does (``tb.open``) and reads every tensor, both as
owned NumPy memory and as torch tensors. What it may raise is the target's ``allowed``
exceptions, each with a non-empty message; anything else is a finding.

>>> sorted(READERS)[:3]
['dcp', 'distcp', 'gguf']
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["JSON_EXPANSION", "READERS", "Reader", "read_all", "seeds"]

# Bytes of Python objects CPython's json may build per byte of text: 33 measured for the
# worst shape (many one-key objects, ``[{"":{}}, ...]``), 11 for a real safetensors
# header; ``tests/test_fuzz.py`` holds the worst shapes to it.
JSON_EXPANSION = 40


@dataclass(frozen=True)
class Reader:
    """A reader under test: how its inputs become files, and what it may raise."""

    name: str
    filename: str  # the fuzzed file's name inside the target's directory
    seeds: Callable[[Path], list[bytes]]  # valid inputs, written by the real tools
    prepare: Callable[[Path], None] = lambda d: None  # the valid files beside the input
    writer: Callable[[bytes, Path], Path] | None = None  # places the input (default: the file)
    open_kwargs: dict[str, Any] = field(default_factory=dict)
    allowed: tuple[str, ...] = ("FormatError", "UnsupportedDtypeError")
    # how much a reader may legitimately allocate per input byte: deflate expands at
    # most 1032:1; CPython's json builds up to ~33 bytes of objects per byte of text
    # (JSON_EXPANSION); every other format stores its bytes as they are
    expansion: int = 1

    def place(self, data: bytes, directory: Path) -> Path:
        """Write ``data`` as this reader's file in ``directory``; the path to open."""
        if self.writer is not None:
            return self.writer(data, directory)
        (directory / self.filename).write_bytes(data)
        return directory / self.filename


def read_all(path: Path, **open_kwargs: Any) -> int:
    """Open ``path`` and read every entry as owned NumPy memory and as torch tensors.

    Returns the number of bytes read, so a caller can check the work was done.
    """
    import tensorbridge as tb

    total = 0
    with tb.open(path, **open_kwargs) as f:
        f.plain_values()
        for arrays in (f.read(mmap=False), f.read(framework="torch")):
            values = arrays.values() if isinstance(arrays, dict) else [arrays]
            for a in values:
                total += int(a.nbytes)
    return total


# ---------------------------------------------------------------- seeds


def _sample_arrays() -> list[dict[str, np.ndarray]]:
    import ml_dtypes

    rng = np.random.default_rng(0)
    return [
        {"w": np.arange(12, dtype=np.float32).reshape(3, 4)},
        {
            "a": rng.standard_normal((2, 3)).astype(np.float16),
            "b": np.arange(5, dtype=np.int64),
            "c": np.zeros((0, 3), dtype=np.uint8),
            "d": np.array(3.5, dtype=np.float64),
            "e": np.arange(4, dtype=ml_dtypes.bfloat16),
        },
        {"x": np.array([True, False, True]), "y": np.arange(6, dtype=np.int8).reshape(2, 3, 1)},
    ]


def _files(
    scratch: Path, name: str, write: Callable[[Path, dict[str, np.ndarray]], None]
) -> list[bytes]:
    out = []
    for i, tensors in enumerate(_sample_arrays()):
        p = scratch / f"{i}-{name}"
        write(p, tensors)
        out.append(p.read_bytes())
    return out


def _seeds_safetensors(scratch: Path) -> list[bytes]:
    from safetensors.numpy import save_file

    out = _files(scratch, "s.safetensors", lambda p, t: save_file(t, str(p), {"k": "v"}))
    import torch
    from safetensors.torch import save_file as save_torch

    p = scratch / "t.safetensors"
    save_torch(
        {
            "t": torch.arange(6, dtype=torch.bfloat16),
            "f8": torch.zeros(4, dtype=torch.float8_e4m3fn),
        },
        str(p),
    )
    return [*out, p.read_bytes()]


def _seeds_npy(scratch: Path) -> list[bytes]:
    out = []
    for tensors in _sample_arrays():
        for a in tensors.values():
            buf = io.BytesIO()
            np.save(buf, a)
            out.append(buf.getvalue())
    buf = io.BytesIO()
    np.save(buf, np.asfortranarray(np.arange(6, dtype=">i4").reshape(2, 3)))
    return [*out, buf.getvalue()]


def _seeds_npz(scratch: Path) -> list[bytes]:
    out = []
    savers: tuple[Any, ...] = (np.savez, np.savez_compressed)
    for save in savers:
        for tensors in _sample_arrays()[::2]:
            buf = io.BytesIO()
            save(buf, **{k: np.asarray(v) for k, v in tensors.items()})
            out.append(buf.getvalue())
    return out


def _seeds_pt(scratch: Path) -> list[bytes]:
    import torch

    out = []
    for new_zip in (True, False):
        for tensors in _sample_arrays()[::2]:
            buf = io.BytesIO()
            state = {k: torch.from_numpy(np.array(v)) for k, v in tensors.items()}
            state["nested"] = {"step": 3, "lr": 0.1, "t": [torch.ones(2)]}  # type: ignore[assignment]
            torch.save(state, buf, _use_new_zipfile_serialization=new_zip)
            out.append(buf.getvalue())
        buf = io.BytesIO()
        torch.save(torch.arange(3), buf, _use_new_zipfile_serialization=new_zip)
        out.append(buf.getvalue())
    # what the pickle machine makes placeholders of: a pickled module, a config object, a
    # parameter; and a newer pickle protocol (frames, MEMOIZE, STACK_GLOBAL)
    import argparse

    torch.manual_seed(0)
    extra: list[tuple[Any, dict[str, Any]]] = [
        ({"model": torch.nn.Linear(2, 2), "args": argparse.Namespace(lr=0.1)}, {}),
        ({"p": torch.nn.Parameter(torch.ones(2)), "size": torch.Size([2])}, {"pickle_protocol": 4}),
    ]
    for obj, kwargs in extra:
        buf = io.BytesIO()
        torch.save(obj, buf, **kwargs)
        out.append(buf.getvalue())
    return out


def _seeds_gguf(scratch: Path) -> list[bytes]:
    import gguf

    out = []
    for i, quantized in enumerate((False, True)):
        p = scratch / f"{i}.gguf"
        w = gguf.GGUFWriter(str(p), "llama")
        w.add_block_count(1)
        w.add_string("general.name", "fuzz")
        w.add_array("tokenizer.ggml.scores", [0.5, 1.5])
        w.add_tensor("a", np.arange(8, dtype=np.float32).reshape(2, 4))
        w.add_tensor("b", np.arange(3, dtype=np.int16))
        if quantized:
            blocks = gguf.quants.quantize(
                np.linspace(-1, 1, 64, dtype=np.float32).reshape(2, 32),
                gguf.GGMLQuantizationType.Q8_0,
            )
            w.add_tensor("q", blocks, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        out.append(p.read_bytes())
    return out


def _seeds_hdf5(scratch: Path) -> list[bytes]:
    import zipfile

    import h5py

    import tensorbridge as tb

    out = _files(scratch, "t.h5", lambda p, t: tb.save(t, p, metadata={"epoch": 1}))
    p = scratch / "h5py.h5"  # what h5py writes: chunks, filters, compact data, attributes
    with h5py.File(p, "w") as f:
        f.create_dataset(
            "g/z", data=np.arange(300, dtype=np.int32), compression="gzip", chunks=(64,)
        )
        f.create_dataset("g/s", data=np.linspace(0, 1, 50), shuffle=True, chunks=(16,))
        f.create_dataset("fill", shape=(8,), dtype="f2", fillvalue=1.5)
        f["opaque"] = np.ones(3, "V2")
        f["opaque"].attrs["dtype"] = "bfloat16"
        f.attrs["note"] = "seed"
        f["g"].attrs["ids"] = [1, 2, 3]
    out.append(p.read_bytes())
    buf = io.BytesIO()  # a Keras .keras archive: its weights a stored member
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("config.json", "{}")
        z.writestr("model.weights.h5", out[0])
    return [*out, buf.getvalue()]


def _dcp_dir(directory: Path) -> None:
    import torch
    from torch.distributed.checkpoint import state_dict_saver

    if (directory / ".metadata").exists():
        return
    state = {
        "w": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "b": torch.ones(2, dtype=torch.bfloat16),
        "step": 5,
    }
    state_dict_saver.save(state, checkpoint_id=str(directory), no_dist=True)


def _seeds_dcp(scratch: Path) -> list[bytes]:
    d = scratch / "dcp"
    d.mkdir(exist_ok=True)
    _dcp_dir(d)
    return [(d / ".metadata").read_bytes()]


def _prepare_dcp(directory: Path) -> None:
    _dcp_dir(directory)


def _seeds_distcp(scratch: Path) -> list[bytes]:
    d = scratch / "dcp"
    d.mkdir(exist_ok=True)
    _dcp_dir(d)
    return [(d / DISTCP).read_bytes()]


DISTCP = "__0_0.distcp"  # the data file dcp.save writes for rank 0


def _zarr_store(directory: Path) -> None:
    import tensorbridge as tb

    store = directory / "s.zarr"
    if not store.exists():
        tb.save({"w": np.arange(12, dtype=np.float32).reshape(3, 4)}, store)
        for kind, node in (("group", store), ("array", store / "w")):
            (directory / f"{kind}.json").write_bytes((node / "zarr.json").read_bytes())


def _seeds_zarr(scratch: Path) -> list[bytes]:
    d = scratch / "zarr"
    d.mkdir(exist_ok=True)
    _zarr_store(d)
    return [b"a" + (d / "array.json").read_bytes(), b"g" + (d / "group.json").read_bytes()]


def _zarr_place(data: bytes, directory: Path) -> Path:
    # the first byte picks the node whose zarr.json the rest replaces: "g" the group's,
    # anything else the array's; the other node keeps its valid document (kept outside
    # the store, where zarr would take it for a node)
    _zarr_store(directory)
    store = directory / "s.zarr"
    target = "group" if data[:1] == b"g" else "array"
    for kind, node in (("group", store), ("array", store / "w")):
        doc = data[1:] if kind == target else (directory / f"{kind}.json").read_bytes()
        (node / "zarr.json").write_bytes(doc)
    return store


def _shards(directory: Path) -> None:
    from safetensors.numpy import save_file

    if (directory / "model-00001-of-00002.safetensors").exists():
        return
    save_file(
        {"a": np.arange(4, dtype=np.float32)}, str(directory / "model-00001-of-00002.safetensors")
    )
    save_file(
        {"b": np.ones((2, 2), dtype=np.int32)}, str(directory / "model-00002-of-00002.safetensors")
    )


def _seeds_index(scratch: Path) -> list[bytes]:
    index = {
        "metadata": {"total_size": 32},
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        },
    }
    return [
        json.dumps(index, indent=2).encode(),
        json.dumps({"weight_map": {"a": "model-00001-of-00002.safetensors"}}).encode(),
    ]


def _quant_dir(directory: Path) -> None:
    from safetensors.torch import save_file

    if (directory / "model.safetensors").exists():
        return
    import torch

    torch.manual_seed(0)
    w = torch.randn(4, 256).to(torch.float8_e4m3fn)
    save_file(
        {
            "l.weight": w,
            "l.weight_scale_inv": torch.ones(1, 2),
            "l.bias": torch.zeros(4, dtype=torch.bfloat16),
        },
        str(directory / "model.safetensors"),
    )


_QUANT_FILES = ("config.json", "hf_quant_config.json", "quantize_config.json")


def _quant_place(data: bytes, directory: Path) -> Path:
    # the first byte picks which config file the rest is: config.json, ModelOpt's, AutoGPTQ's
    _quant_dir(directory)
    for name in _QUANT_FILES:
        (directory / name).unlink(missing_ok=True)
    name = _QUANT_FILES[data[0] % 3] if data else _QUANT_FILES[0]
    (directory / name).write_bytes(data[1:])
    return directory / "model.safetensors"


def _seeds_quant(scratch: Path) -> list[bytes]:
    fp8 = {
        "quant_method": "fp8",
        "weight_block_size": [128, 128],
        "fmt": "e4m3",
        "activation_scheme": "dynamic",
    }
    return [
        b"\x00"
        + json.dumps({"architectures": ["X"], "quantization_config": fp8}, indent=2).encode(),
        b"\x01"
        + json.dumps(
            {"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "FP8"}}
        ).encode(),
        b"\x02"
        + json.dumps(
            {"bits": 4, "group_size": 128, "quant_method": "gptq", "desc_act": False}
        ).encode(),
    ]


_ONNX_DATA = "w.bin"  # the external data file beside the fuzzed model: 16 float32 values


def _onnx_data(directory: Path) -> None:
    (directory / _ONNX_DATA).write_bytes(np.arange(16, dtype=np.float32).tobytes())


def _seeds_onnx(scratch: Path) -> list[bytes]:
    """Models onnx writes: raw_data of several types, typed fields (float_data, int32_data
    with negative and 16-bit entries, int64_data, double_data), packed INT4 / FLOAT4,
    external data in the prepared file, a Constant node and metadata."""
    import ml_dtypes
    from onnx import TensorProto, helper, numpy_helper

    raw = [numpy_helper.from_array(a, n) for n, a in (
        ("w", np.arange(12, dtype=np.float32).reshape(3, 4)),
        ("h", np.arange(5, dtype=ml_dtypes.bfloat16)),
        ("q", np.array([-8, 7, 1], ml_dtypes.int4)),
        ("f4", np.array([0.5, -6, 1.5], ml_dtypes.float4_e2m1fn)),
        ("f6", np.array([1, 2, -0.5, 7.5, 3], ml_dtypes.float6_e2m3fn)),
    )]  # fmt: skip
    typed = [
        helper.make_tensor("i8", TensorProto.INT8, [3], [-1, 0, 127]),
        helper.make_tensor("f16", TensorProto.FLOAT16, [2], [1.5, -2.0]),
        helper.make_tensor("i64", TensorProto.INT64, [2], [-5, 1 << 40]),
        helper.make_tensor("f64", TensorProto.DOUBLE, [2], [0.25, -1e300]),
        helper.make_tensor("fl", TensorProto.FLOAT, [2, 1], [3.5, -0.0]),
    ]
    ext = TensorProto(name="e", data_type=TensorProto.FLOAT, dims=[4, 4])
    ext.data_location = TensorProto.EXTERNAL
    for key, value in (("location", _ONNX_DATA), ("offset", "0"), ("length", "64")):
        ext.external_data.add(key=key, value=value)
    const = helper.make_node("Constant", [], ["c"], value_ints=[1, -2, 3])
    out = []
    for i, (nodes, inits) in enumerate((([], raw), ([const], [*typed, ext]), ([], raw + typed))):
        graph = helper.make_graph(nodes, "g", [], [], initializer=inits)
        m = helper.make_model(graph, producer_name="fuzz")
        helper.set_model_props(m, {"seed": str(i)})
        out.append(m.SerializeToString())
    return [out[1], out[0], out[2]]  # the first seed: external data and typed fields


READERS: dict[str, Reader] = {
    r.name: r
    for r in (
        Reader("safetensors", "x.safetensors", _seeds_safetensors, expansion=JSON_EXPANSION),
        Reader(
            "index",
            "model.safetensors.index.json",
            _seeds_index,
            prepare=_shards,
            expansion=JSON_EXPANSION,
        ),
        Reader("npy", "x.npy", _seeds_npy),
        Reader("npz", "x.npz", _seeds_npz, expansion=1032),
        Reader("pt", "x.pt", _seeds_pt),
        Reader("gguf", "x.gguf", _seeds_gguf, open_kwargs={"dequantize": "f32"}),
        # HDF5's own reader (h5py) checks the file; deflated chunks expand as .npz members
        Reader("hdf5", "x.h5", _seeds_hdf5, expansion=1032),
        # the header's names and spans take up to ~16 bytes of Python objects a byte of
        # protobuf (many one-character initializers, measured), typed entries up to 8 (a
        # one-byte varint read as int64): within the JSON readers' bound
        Reader("onnx", "m.onnx", _seeds_onnx, prepare=_onnx_data, expansion=JSON_EXPANSION),
        Reader("dcp", ".metadata", _seeds_dcp, prepare=_prepare_dcp),
        # the data file: a torch.save zip per item, with the valid .metadata beside it
        Reader("distcp", DISTCP, _seeds_distcp, prepare=_prepare_dcp),
        Reader(
            "zarr",
            "zarr.json",
            _seeds_zarr,
            prepare=_zarr_store,
            writer=_zarr_place,
            expansion=JSON_EXPANSION,
        ),
        Reader(
            "quant",
            "config.json",
            _seeds_quant,
            prepare=_quant_dir,
            writer=_quant_place,
            open_kwargs={"dequantize": "bf16"},
            expansion=JSON_EXPANSION,
            allowed=("FormatError", "UnsupportedDtypeError", "QuantizationError"),
        ),
    )
}


def seeds(reader: Reader, scratch: Path) -> list[bytes]:
    """The reader's valid seed inputs, written by the real tools under ``scratch``."""
    scratch.mkdir(parents=True, exist_ok=True)
    return reader.seeds(scratch)

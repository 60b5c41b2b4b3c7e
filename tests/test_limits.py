"""The readers' limits: SECURITY.md states each value the code enforces, and each holds.

Every constant is read from its module, so a changed limit fails here until the page
says the new value; each limit is then tested with a file just over it.
"""

from __future__ import annotations

import collections
import json
import struct
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge.io import (
    _gguf_header,
    _npy_header,
    dcp,
    hdf5,
    npy,
    pickle_machine,
    safetensors_header,
    torch_archive,
    zarr,
)
from tensorbridge.quant import detect

ROOT = Path(__file__).resolve().parent.parent
POLICY = (ROOT / "SECURITY.md").read_text(encoding="utf-8")


def _bytes(n: int) -> str:
    """How SECURITY.md writes a byte count: 1 GiB, 64 MiB, or 100,000,000 bytes."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n % size == 0:
            return f"{n // size} {unit}"
    return f"{n:,} bytes"


@pytest.mark.parametrize(
    ("constant", "stated"),
    [
        ("MAX_HEADER", _bytes(safetensors_header.MAX_HEADER)),
        ("MAX_RANK", f"{safetensors_header.MAX_RANK} dimensions"),
        ("MAX_HEADER_SIZE", f"{npy.MAX_HEADER_SIZE:,} characters"),
        ("_MAX_NDIM", f"{_npy_header._MAX_NDIM} dimensions"),
        ("MAX_DIMS", f"{_gguf_header.MAX_DIMS} dimensions"),
        ("MAX_DEPTH", f"{pickle_machine.MAX_DEPTH} levels"),
        ("MAX_PICKLE", _bytes(torch_archive.MAX_PICKLE)),
        ("MAX_METADATA", _bytes(dcp.MAX_METADATA)),
        ("MAX_VALUE", _bytes(dcp.MAX_VALUE)),
        ("MAX_NODE_JSON", _bytes(zarr.MAX_NODE_JSON)),
        ("MAX_FILL_BYTES", _bytes(hdf5.MAX_FILL_BYTES)),
        ("MAX_CONFIG", _bytes(detect.MAX_CONFIG)),
        ("_DEFLATE_MAX_RATIO", f"{tb.io.npz._DEFLATE_MAX_RATIO:,} times"),
    ],
)
def test_security_md_states_the_limit(constant: str, stated: str) -> None:
    row = next((line for line in POLICY.splitlines() if f"`{constant}`" in line), None)
    if constant == "_DEFLATE_MAX_RATIO":
        row = next(line for line in POLICY.splitlines() if "deflated member" in line)
    assert row is not None, f"SECURITY.md has no row for {constant}"
    assert stated in row, f"SECURITY.md says {row!r}; the code's value is {stated}"


def _safetensors(path: Path, header: dict[str, Any] | bytes, data: bytes) -> Path:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    return path


def test_a_safetensors_rank_over_the_limit_is_a_format_error(tmp_path: Path) -> None:
    rank = safetensors_header.MAX_RANK
    ok = {"w": {"dtype": "F32", "shape": [1] * rank, "data_offsets": [0, 4]}}
    with tb.open(_safetensors(tmp_path / "ok.safetensors", ok, b"\0" * 4)) as f:
        assert f["w"].ndim == rank
    bad = {"w": {"dtype": "F32", "shape": [1] * (rank + 1), "data_offsets": [0, 4]}}
    with pytest.raises(tb.FormatError, match=rf"shape has {rank + 1} dimensions, over the"):
        tb.open(_safetensors(tmp_path / "bad.safetensors", bad, b"\0" * 4))


def test_json_nested_past_the_recursion_limit_is_refused(tmp_path: Path) -> None:
    depth = sys.getrecursionlimit() * 2
    deep = b'{"a":' + b"[" * depth + b"]" * depth + b"}"
    with pytest.raises(tb.FormatError, match="the header is not valid JSON"):
        tb.open(_safetensors(tmp_path / "deep.safetensors", deep, b""))
    model = tmp_path / "model"
    tb.save({"w": np.ones((2, 2), np.float32)}, model / "model.safetensors")
    (model / "config.json").write_bytes(b'{"quantization_config":' + deep[5:])
    with pytest.raises(tb.QuantizationError, match=r"config\.json is not readable JSON"):
        tb.open(model, dequantize="bf16")
    store = tmp_path / "deep.zarr"
    store.mkdir()
    (store / "zarr.json").write_bytes(b'{"zarr_format":3,"attributes":' + deep[5:])
    assert zarr.store_kind(store) is None  # not taken for a store; nothing raised


def test_a_config_over_the_limit_is_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(detect, "MAX_CONFIG", 100)
    model = tmp_path / "model"
    tb.save({"w": np.ones((2, 2), np.float32)}, model / "model.safetensors")
    config = {"quantization_config": {"quant_method": "fp8", "pad": "x" * 100}}
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(tb.QuantizationError, match=r"over 100 bytes.*pass config="):
        tb.open(model, dequantize="bf16")


class _Oversized:
    """Pickles as a tensor that claims more elements than its storage holds."""

    def __init__(self, storage: Any, numel: int) -> None:
        self.storage, self.numel = storage, numel

    def __reduce_ex__(self, protocol: Any) -> Any:
        rebuild = torch._utils._rebuild_tensor_v2
        return rebuild, (self.storage, 0, (self.numel,), (1,), False, collections.OrderedDict())


@pytest.mark.filterwarnings("ignore:TypedStorage is deprecated:UserWarning")
@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_a_pt_tensor_larger_than_its_storage_is_refused(tmp_path: Path, zipped: bool) -> None:
    """The pickle machine checks every view against its storage: no byte past it is read."""
    p = tmp_path / "evil.pt"
    storage = torch.ones(4).storage()
    obj = {"w": _Oversized(storage, 1 << 20)}
    torch.save(obj, p, _use_new_zipfile_serialization=zipped)
    with (
        pytest.raises(tb.FormatError, match=r"evil\.pt.*reaches element 1048575 of a storage of 4"),
        tb.open(p) as f,
    ):
        f["w"]

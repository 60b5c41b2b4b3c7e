"""No foreign exception, anywhere: hostile inputs end in tensorbridge's own errors.

Each row is an input class an outside review found raising a raw Python exception
(``IndexError``, ``UnicodeEncodeError``, ``NotImplementedError``, ``FileExistsError``,
``OSError``), with its siblings; the test asserts a :class:`~tensorbridge.TensorBridgeError`
whose message names the file.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import struct
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

import tensorbridge as tb

# --- the inputs ---------------------------------------------------------------------------------

Case = Callable[[Path], tuple[Callable[[], object], Path]]  # -> (what raises, the file named)


def _read_all(path: Path) -> Callable[[], object]:
    def run() -> object:
        with tb.open(path) as f:
            return [f[k] for k in f if k not in f.unsupported()]

    return run


def _gptq(bad: int) -> Case:
    def case(tmp_path: Path) -> tuple[Callable[[], object], Path]:
        pre = "layer."
        n_in, out, gs = 64, 8, 32
        g = torch.Generator().manual_seed(0)
        g_idx = (torch.arange(n_in) // gs).to(torch.int32)
        g_idx[5] = bad
        sd = {
            pre + "qweight": torch.randint(-(2**31), 2**31 - 1, (n_in // 8, out), generator=g),
            pre + "qzeros": torch.zeros(n_in // gs, out // 8, dtype=torch.int32),
            pre + "scales": torch.ones(n_in // gs, out, dtype=torch.float16),
            pre + "g_idx": g_idx,
        }
        sd[pre + "qweight"] = sd[pre + "qweight"].to(torch.int32)
        tb.save(sd, tmp_path / "model.safetensors")
        config = {"quant_method": "gptq", "bits": 4, "group_size": gs, "desc_act": True}
        config["checkpoint_format"] = "gptq"
        (tmp_path / "config.json").write_text(json.dumps({"quantization_config": config}))
        return (lambda: tb.load(tmp_path, dequantize="f32")), tmp_path / "model.safetensors"

    return case


def _dcp(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    dcp.save({"w": torch.arange(6.0).reshape(2, 3), "step": 7}, checkpoint_id=d, no_dist=True)
    return d


def _relative_path(name: str) -> Case:
    def case(tmp_path: Path) -> tuple[Callable[[], object], Path]:
        d = _dcp(tmp_path)
        meta = dcp.FileSystemReader(d).read_metadata()  # torch's own classes, to edit
        for info in meta.storage_data.values():
            info.relative_path = name
        with open(d / ".metadata", "wb") as f:
            pickle.dump(meta, f)
        return _read_all(d), d / ".metadata"

    return case


def _chunk_zip(patch: Callable[[bytearray, int, int], None]) -> Case:
    """The stored zip of tensor ``w`` in its .distcp, changed by ``patch(data, start, end)``."""

    def case(tmp_path: Path) -> tuple[Callable[[], object], Path]:
        d = _dcp(tmp_path)
        meta = dcp.FileSystemReader(d).read_metadata()  # torch's own classes, to edit
        info = next(v for k, v in meta.storage_data.items() if k.fqn == "w")
        path = d / info.relative_path
        data = bytearray(path.read_bytes())
        patch(data, info.offset, info.offset + info.length)
        path.write_bytes(bytes(data))
        return _read_all(d), path

    return case


def _central(data: bytearray, start: int, end: int, member: str) -> int:
    """The offset of ``member``'s central directory record within ``[start, end)``."""
    at = start
    while True:
        at = data.index(b"PK\x01\x02", at, end)
        n = struct.unpack_from("<H", data, at + 28)[0]
        if data[at + 46 : at + 46 + n].endswith(member.encode()):
            return at
        at += 4


def _set(field: int, fmt: str, value: int, member: str = "data.pkl") -> Callable[..., None]:
    def patch(data: bytearray, start: int, end: int) -> None:
        struct.pack_into(fmt, data, _central(data, start, end, member) + field, value)

    return patch


def _bad_utf8_name(data: bytearray, start: int, end: int) -> None:
    at = _central(data, start, end, "data.pkl")
    flags = struct.unpack_from("<H", data, at + 8)[0]
    struct.pack_into("<H", data, at + 8, flags | 0x800)  # "the name is UTF-8"
    data[at + 46] = 0xFF  # ... and it is not


def _truncated_directory(data: bytearray, start: int, end: int) -> None:
    """The directory's size says it ends inside its first record (zip64's record too)."""
    eocd = data.rindex(b"PK\x05\x06", start, end)
    struct.pack_into("<I", data, eocd + 12, 20)
    with contextlib.suppress(ValueError):  # torch writes zip64 records: their size rules
        struct.pack_into("<Q", data, data.rindex(b"PK\x06\x06", start, eocd) + 40, 20)


def _npy(descr: str) -> Case:
    def case(tmp_path: Path) -> tuple[Callable[[], object], Path]:
        head = f"{{'descr': {descr}, 'fortran_order': False, 'shape': (2,), }}".encode()
        head += b" " * (-(10 + len(head) + 1) % 64) + b"\n"
        p = tmp_path / "a.npy"
        p.write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head + bytes(16))
        return _read_all(p), p

    return case


def _under_a_file(save: Callable[[Path, Path], None], name: str) -> Case:
    def case(tmp_path: Path) -> tuple[Callable[[], object], Path]:
        (tmp_path / "file").write_text("a regular file")
        target = tmp_path / "file" / name
        return (lambda: save(tmp_path, target)), target

    return case


def _dcp_to(tmp_path: Path, target: Path, **options: object) -> None:
    with tb.open(_dcp(tmp_path)) as f:
        tb.save(f, target, **options)  # type: ignore[arg-type]


CASES: dict[str, Case] = {
    "gptq-g_idx-too-large": _gptq(10**6),
    "gptq-g_idx-negative": _gptq(-1),
    "dcp-file-name-surrogate": _relative_path("__0_\ud800.distcp"),
    "dcp-file-name-escaped-bytes": _relative_path("__0_\udcff.distcp"),
    "dcp-file-name-backslash": _relative_path("..\\__0_0.distcp"),
    "dcp-file-name-separator": _relative_path("sub/__0_0.distcp"),
    "dcp-file-name-parent": _relative_path(".."),
    "dcp-file-name-nul": _relative_path("__0_0.distcp\x00"),
    "dcp-zip-bad-crc": _chunk_zip(_set(16, "<I", 0xDEADBEEF)),
    "dcp-zip-unknown-method": _chunk_zip(_set(10, "<H", 99)),
    "dcp-zip-deflate64": _chunk_zip(_set(10, "<H", 9)),
    "dcp-zip-encrypted": _chunk_zip(_set(8, "<H", 0x1)),
    "dcp-zip-name-not-utf8": _chunk_zip(_bad_utf8_name),
    "dcp-zip-truncated-directory": _chunk_zip(_truncated_directory),
    "dcp-zip-negative-offset": _chunk_zip(_set(42, "<I", 0xFFFFFFF0, "data/0")),
    "npy-descr-empty-list": _npy("[]"),
    "npy-descr-empty-tuple-field": _npy("[()]"),
    "npy-descr-nested-empty": _npy("[('a', [])]"),
    "npy-descr-dict": _npy("{'names': ['a'], 'formats': ['<f4']}"),
    "npy-descr-none": _npy("None"),
    "npy-descr-empty-string": _npy("''"),
    "zarr-under-a-file": _under_a_file(lambda t, p: tb.save({"a": np.ones(2)}, p), "x.zarr"),
    "dcp-to-zarr-under-a-file": _under_a_file(_dcp_to, "x.zarr"),
    "dcp-to-safetensors-under-a-file": _under_a_file(_dcp_to, "m.safetensors"),
    "dcp-to-npy-under-a-file": _under_a_file(lambda t, p: _dcp_to(t, p, format="npy"), "npy"),
    "npz-under-a-file": _under_a_file(lambda t, p: tb.save({"a": np.ones(2)}, p), "m.npz"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_hostile_inputs_raise_tensorbridge_errors(name: str, tmp_path: Path) -> None:
    if "zarr" in name:
        pytest.importorskip("zarr", reason="Zarr stores are an extra (tensorbridge[zarr])")
    run, named = CASES[name](tmp_path)
    with pytest.raises(tb.TensorBridgeError) as info:
        run()
    text = str(info.value)
    assert str(named) in text or repr(str(named)) in text, text


def test_a_dcp_metadata_file_is_read_under_any_name(tmp_path: Path) -> None:
    d = _dcp(tmp_path)
    (d / ".metadata").rename(d / "ckpt.metadata")
    with tb.open(d / "ckpt.metadata") as f:  # the checkpoint is its directory
        assert f.keys() == ["w"] and f["w"].tolist() == [[0, 1, 2], [3, 4, 5]]
        assert f.metadata == {"step": "7"}


# --- resources: descriptors and file sizes, in a child process ----------------------------------


def _child(code: str, tmp_path: Path) -> str:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(code))
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow  # a child process writing hundreds of files
def test_hundreds_of_shards_open_under_a_small_descriptor_limit(tmp_path: Path) -> None:
    """400 shards under ``ulimit -n 256``: a shard index holds at most 64 shards open."""
    out = _child(
        """
        import resource, sys, numpy as np, tensorbridge as tb
        d = sys.argv[1] + "/ckpt/"
        n = 400
        tb.save({f"t{i}": np.full(4, i, np.float32) for i in range(n)}, d, max_shard_size=16)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        with tb.open(d) as f:
            assert len(f.keys()) == n and f.shard_of("t399").endswith("00400-of-00400.safetensors")
            for i in range(n):  # mapped one at a time, and as torch tensors
                assert f[f"t{i}"][0] == i and f.get(f"t{i}", framework="torch")[0] == i
            owned = f.read(mmap=False)
            assert [owned[f"t{i}"][0] for i in range(n)] == list(range(n))
        try:  # every shard mapped at once: one descriptor a map on Python < 3.13
            tb.load(d)
        except tb.TensorBridgeError as err:
            assert "ulimit -n" in str(err) and "mmap=False" in str(err), err
        print("ok")
        """,
        tmp_path,
    )
    assert out.strip() == "ok"


@pytest.mark.slow  # a child process writing hundreds of files
def test_a_dcp_checkpoint_of_hundreds_of_files_under_a_small_descriptor_limit(
    tmp_path: Path,
) -> None:
    """300 ``.distcp`` files (one per tensor) under ``ulimit -n 256``: at most 64 mapped."""
    out = _child(
        """
        import resource, sys, torch, tensorbridge as tb
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint import FileSystemWriter
        d, n = sys.argv[1] + "/ckpt", 300
        state = {f"t{i}": torch.full((4,), float(i)) for i in range(n)}
        dcp.save(state, storage_writer=FileSystemWriter(d, single_file_per_rank=False),
                 no_dist=True)
        hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        resource.setrlimit(resource.RLIMIT_NOFILE, (256, hard))
        with tb.open(d) as f:
            assert [f[f"t{i}"][0] for i in range(n)] == list(range(n))
            tb.save(f, d + "-out/", max_shard_size="1KB")
        with tb.open(d + "-out") as g:
            assert [g[f"t{i}"][0] for i in range(n)] == list(range(n))
        print("ok")
        """,
        tmp_path,
    )
    assert out.strip() == "ok"


@pytest.mark.slow  # a child process writing hundreds of files
def test_a_file_size_limit_is_a_destination_error_for_every_dcp_target(tmp_path: Path) -> None:
    out = _child(
        """
        import os, resource, signal, sys, torch, tensorbridge as tb
        import torch.distributed.checkpoint as dcp
        t = sys.argv[1]
        dcp.save({"w": torch.ones(512, 1024)}, checkpoint_id=t + "/ckpt", no_dist=True)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
        for target, options in (("z.zarr", {}), ("m.safetensors", {}), ("n", {"format": "npy"})):
            try:
                with tb.open(t + "/ckpt") as f:
                    tb.save(f, t + "/" + target, **options)
            except tb.DestinationError as err:
                assert target in str(err) and "File too large" in str(err), err
            else:
                raise AssertionError(target + " was written past the file size limit")
        print(sorted(n for n in os.listdir(t) if n != "child.py"))
        """,
        tmp_path,
    )
    assert out.strip() == "['ckpt']"  # nothing left behind

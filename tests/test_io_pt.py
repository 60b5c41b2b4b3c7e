"""``.pt`` / ``.pth`` / ``.bin``: pickle-machine + mmap reads, flattened keys, safe refusals."""

from __future__ import annotations

import os
import pickle
import zipfile
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge.dtypes import exact_widenings
from tensorbridge.errors import FormatError, UnsupportedDtypeError, UnsupportedTensorError
from tensorbridge.io import pt


def bits(x: Any) -> bytes:
    if isinstance(x, torch.Tensor):
        x = x.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return bytes(np.ascontiguousarray(x).reshape(-1).view(np.uint8).tobytes())


# --- round trips ----------------------------------------------------------------------------


@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize("suffix", [".pt", ".bin"])
def test_round_trip_every_dtype(
    tmp_path: Path, row: tb.DTypeRow, patterns: np.ndarray, framework: str, suffix: str
) -> None:
    p = tmp_path / f"m{suffix}"
    if row.kernels:
        pt.save({"array": patterns, "tensor": tb.to_torch(patterns)[1:]}, p)
        got = pt.load(p, framework=framework)
        assert list(got) == ["array", "tensor"]
        for k, want in (("array", patterns), ("tensor", patterns[1:])):
            assert got[k].dtype == (row.numpy if framework == "numpy" else row.torch)
            assert bits(got[k]) == bits(want)
        plain = torch.load(p, weights_only=True)  # torch reads our file on its own
        assert plain["array"].dtype == row.torch and bits(plain["array"]) == bits(patterns)
    else:  # torch.save cannot pickle torch's sub-byte integers: refused before writing
        for value in (patterns, tb.to_torch(patterns)):
            with pytest.raises(UnsupportedDtypeError) as info:
                pt.save({"w": value}, p)
            assert str(info.value) == (
                f"at 'w': torch.save cannot write torch.{row.name} (it raises 'dtype "
                f"torch.{row.name} is not recognized'); save it to .npy or .npz, which keep "
                f"{row.name} as it is"
            )
        assert not p.exists()
        with pytest.raises(KeyError, match=rf"dtype torch.{row.name} is not recognized"):
            torch.save({"w": tb.to_torch(patterns)}, tmp_path / "theirs.pt")  # torch's own


def _naming(tmp_path: Path, name: str) -> Path:
    """A torch zip archive whose pickle rebuilds a ``torch.<name>`` tensor of every byte
    value: torch.save's own file of a uint16 tensor (``_rebuild_tensor_v3`` over an untyped
    storage, as torch writes its newer dtypes) with the dtype global renamed. torch.save
    cannot write it for a sub-byte integer; torch.load reads it."""
    storage = np.concatenate([np.arange(256, dtype=np.uint8), np.zeros(256, np.uint8)])
    torch.save({"w": torch.from_numpy(storage.view(np.uint16).copy())}, tmp_path / "u16.pt")
    out = tmp_path / f"{name}.pt"
    with zipfile.ZipFile(tmp_path / "u16.pt") as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            if info.filename.endswith("/data.pkl"):
                assert data.count(b"ctorch\nuint16\n") == 1
                data = data.replace(b"ctorch\nuint16\n", f"ctorch\n{name}\n".encode())
            dst.writestr(info, data)
    return out


@pytest.mark.parametrize("name", ["int1", "int2", "int4", "uint1", "uint2", "uint4"])
def test_a_pickle_naming_a_sub_byte_dtype_reads_every_byte(tmp_path: Path, name: str) -> None:
    """The pickle machine maps torch's sub-byte dtypes as torch.load does (256 byte values,
    the high bits kept), though torch.save writes none."""
    if not hasattr(torch, name) or name not in {r.name for r in tb.dtype_table()}:
        pytest.skip(reason=f"torch.{name} or ml_dtypes.{name} is missing here")
    if tb.resolve_dtype(name).kernels:
        pytest.skip(reason=f"torch.{name} is no row of this installation")
    row = tb.resolve_dtype(name)
    path = _naming(tmp_path, name)
    theirs = torch.load(path, weights_only=True)["w"]
    assert theirs.dtype is row.torch and bits(theirs) == bytes(range(256))
    with pt.open(path) as f:
        assert f.info("w") == (row, (256,))
        assert f["w"].dtype == row.numpy and bits(f["w"]) == bytes(range(256))
    for mmap_ in (True, False):
        t = pt.load(path, framework="torch", mmap=mmap_)["w"]
        assert t.dtype is row.torch and bits(t) == bytes(range(256))
    with pytest.raises(UnsupportedDtypeError, match=rf"torch.save cannot write torch.{name}"):
        pt.save(pt.load(path), tmp_path / "again.pt")


def test_types_only_numpy_has_are_refused_naming_npy(
    tmp_path: Path, numpy_only_row: tb.DTypeRow
) -> None:
    row = numpy_only_row
    a = np.arange(256, dtype=np.uint8)[: 64 * row.itemsize].view(row.numpy)
    with pytest.raises(UnsupportedDtypeError) as info:
        pt.save({"w": a}, tmp_path / "m.pt")
    message = str(info.value)
    assert message.startswith(
        f"at 'w': ml_dtypes {row.name} has no torch dtype, so a .pt file cannot hold it; save "
        f"it to .npy or .npz, which keep {row.name} as it is"
    )
    assert not (tmp_path / "m.pt").exists()
    if row.is_floating:  # the widening the message names holds every value
        wide = exact_widenings(row)[0]
        assert message.endswith(f", or pass float_dtype=torch.{wide.name}, which holds its values")
        pt.save({"w": a}, tmp_path / "m.pt", float_dtype=wide.torch)
        back = torch.load(tmp_path / "m.pt", weights_only=True)["w"]
        assert back.dtype is wide.torch
        assert bits(back) == bits(tb.to_numpy(a, dtype=wide))


def test_torch_save_files_flatten_to_dotted_keys(tmp_path: Path) -> None:
    w = torch.randn(3, 2).to(torch.bfloat16)
    ckpt = {
        "model": {"encoder": {"w": w}, "head.b": torch.zeros(2)},
        "layers": [torch.ones(1), {"scale": torch.tensor(2.0)}],
        "epoch": 3, "lr": 1e-3, "name": "run-1", "best": None, "size": torch.Size([2, 3]),
    }  # fmt: skip
    torch.save(ckpt, tmp_path / "ckpt.pth")
    with pt.open(tmp_path / "ckpt.pth") as f:
        assert f.keys() == ["model.encoder.w", "model.head.b", "layers.0", "layers.1.scale"]
        assert f.metadata == {
            "epoch": "3",
            "lr": "0.001",
            "name": "run-1",
            "best": "None",
            "size": "torch.Size([2, 3])",
        }
        assert f.info("model.encoder.w") == (tb.resolve_dtype("bfloat16"), (3, 2))
        assert bits(f["model.encoder.w"]) == bits(w)
    got = pt.load(tmp_path / "ckpt.pth", keys=["layers.1.scale"], framework="torch")
    assert list(got) == ["layers.1.scale"] and got["layers.1.scale"].item() == 2.0


def test_a_single_tensor_file(tmp_path: Path) -> None:
    t = torch.arange(6, dtype=torch.int16).reshape(2, 3)
    torch.save(t, tmp_path / "emb.pt")
    got = pt.load(tmp_path / "emb.pt")
    assert isinstance(got, np.ndarray) and np.array_equal(got, t.numpy())
    with pt.open(tmp_path / "emb.pt") as f:
        assert f.keys() == ["emb"]
    pt.save(np.ones(3, ml_dtypes.bfloat16), tmp_path / "one.pt")
    assert torch.load(tmp_path / "one.pt", weights_only=True).dtype == torch.bfloat16
    with pytest.raises(KeyError, match=r"holds one array"):
        pt.load(tmp_path / "one.pt", keys=["x"])


def test_colliding_flattened_keys_are_refused(tmp_path: Path) -> None:
    torch.save({"a.b": torch.ones(1), "a": {"b": torch.zeros(1)}}, tmp_path / "c.pt")
    with pytest.raises(FormatError, match=r"two entries flatten to the key 'a.b'"):
        pt.open(tmp_path / "c.pt")


# --- memory semantics -------------------------------------------------------------------------


def test_numpy_views_are_read_only_and_zero_copy(tmp_path: Path) -> None:
    base = torch.arange(16, dtype=torch.float32)
    torch.save({"w": base, "tied": base, "half": base[8:]}, tmp_path / "m.pt")
    before = (tmp_path / "m.pt").read_bytes()
    with pt.open(tmp_path / "m.pt") as f:
        w, tied, half = f["w"], f["tied"], f["half"]
        assert not w.flags.writeable
        with pytest.raises(ValueError, match=r"read-only"):
            w[0] = 1
        assert np.shares_memory(w, tied) and np.shares_memory(w, half)  # one mapped storage
        t = f.get("w", framework="torch")
        t_tied = f.get("tied", framework="torch")
        t[0] = 42  # copy-on-write: the tie holds, the file and the NumPy views do not change
        assert t_tied[0] == 42 and w[0] == 0
        owned = f.get("w", mmap=False)
        assert owned.flags.writeable and not np.shares_memory(owned, w)
    assert (tmp_path / "m.pt").read_bytes() == before


def test_float_dtype(tmp_path: Path) -> None:
    sd = {"w": torch.tensor([1.5, float("nan")], dtype=torch.bfloat16),
          "steps": torch.tensor([7])}  # fmt: skip
    pt.save(sd, tmp_path / "m.pt", float_dtype="float32")
    plain = torch.load(tmp_path / "m.pt", weights_only=True)
    assert plain["w"].dtype == torch.float32 and plain["steps"].dtype == torch.int64
    got = pt.load(tmp_path / "m.pt", framework="torch", float_dtype="bf16")
    assert got["w"].dtype == torch.bfloat16 and got["steps"].dtype == torch.int64
    assert got["w"][0] == 1.5 and got["w"][1].isnan()  # torch narrows every NaN to 0xFFFF


# --- refusing what only a full unpickle could build -------------------------------------------


class _Payload:
    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> Any:
        return (os.system, (f"touch {self.marker}",))


class Custom:
    def __init__(self) -> None:
        self.x = 1


def test_pickled_code_is_refused_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    torch.save({"w": torch.ones(2), "evil": _Payload(str(marker))}, tmp_path / "evil.pt")
    with pytest.raises(FormatError, match=r"calls posix\.system, which tensorbridge never calls"):
        pt.load(tmp_path / "evil.pt")
    with pytest.raises(FormatError, match=r"evil\.pt"):
        pt.open(tmp_path / "evil.pt")
    assert not marker.exists()
    # a class of the file's own is a placeholder: listed, never imported or called
    torch.save({"w": torch.ones(2), "obj": Custom()}, tmp_path / "custom.pt")
    with pt.open(tmp_path / "custom.pt") as f:
        assert f.keys() == ["w", "obj"] and f.metadata == {"obj.x": "1"}
        assert "Custom object: a placeholder" in f.unsupported()["obj"]
        with pytest.raises(tb.UnsupportedDtypeError, match=r"'obj'.*--skip-unsupported"):
            f.read()


def test_a_raw_pickle_payload_inside_the_archive_is_refused(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    torch.save({"w": torch.ones(2)}, tmp_path / "m.pt")
    src = zipfile.ZipFile(tmp_path / "m.pt")
    with src, zipfile.ZipFile(tmp_path / "swap.pt", "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename.endswith("data.pkl"):
                data = pickle.dumps(_Payload(str(marker)), protocol=2)
            dst.writestr(info, data)
    with pytest.raises(FormatError, match=r"swap\.pt.*never calls"):
        pt.load(tmp_path / "swap.pt")
    assert not marker.exists()


def test_not_a_torch_archive(tmp_path: Path) -> None:
    (tmp_path / "junk.bin").write_bytes(b"not a checkpoint" * 8)
    with pytest.raises(FormatError, match=r"junk\.bin' is not a torch\.save archive.*text"):
        pt.load(tmp_path / "junk.bin")
    torch.save({"w": torch.arange(1000.0)}, tmp_path / "ok.pt")
    good = (tmp_path / "ok.pt").read_bytes()
    (tmp_path / "cut.pt").write_bytes(good[: len(good) // 2])
    with pytest.raises(FormatError, match=r"cut.pt"):
        pt.load(tmp_path / "cut.pt")


def test_save_refusals_name_the_key(tmp_path: Path) -> None:
    with pytest.raises(
        UnsupportedTensorError,
        match=r"^at 'cfg.hook': object is not a tensor, an array or a plain value \(numbers, "
        r"strings, None, torch.Size\); a .pt file tensorbridge writes loads with "
        r"torch.load\(weights_only=True\), so it holds no other objects$",
    ):
        pt.save({"w": torch.ones(1), "cfg": {"hook": object()}}, tmp_path / "m.pt")
    with pytest.raises(
        UnsupportedTensorError,
        match=r"at 'cfg', the key frozenset\(\) is a frozenset; keys are strings, numbers",
    ):
        pt.save({"cfg": {frozenset(): 1}}, tmp_path / "m.pt")
    with pytest.raises(tb.UnsupportedDtypeError, match=r"at 's'"):
        pt.save({"s": np.array(["a"])}, tmp_path / "m.pt")
    with pytest.raises(UnsupportedTensorError, match=r"to_dense"):
        pt.save({"sp": torch.eye(2).to_sparse()}, tmp_path / "m.pt")
    assert os.listdir(tmp_path) == []


def test_sparse_entries_in_a_foreign_file(tmp_path: Path) -> None:
    torch.save({"sp": torch.eye(2).to_sparse(), "w": torch.ones(2)}, tmp_path / "s.pt")
    with pt.open(tmp_path / "s.pt") as f:
        assert f.keys() == ["sp", "w"]
        assert "_rebuild_sparse_tensor" in f.unsupported()["sp"]
        with pytest.raises(tb.UnsupportedDtypeError, match=r"'sp' is a sparse tensor"):
            f["sp"]
        assert f["w"].tolist() == [1.0, 1.0]


def test_progress_counts_bytes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pt.save({"w": torch.ones(1000)}, tmp_path / "m.pt", progress=True)
    assert "saving m.pt" in capsys.readouterr().err
    assert torch.load(tmp_path / "m.pt", weights_only=True)["w"].sum() == 1000


def test_values_repeated_far_beyond_the_file_are_refused(tmp_path: Path) -> None:
    # a zero stride lets a few stored bytes claim gigabytes: every copy would allocate them
    p = tmp_path / "e.pt"
    torch.save({"big": torch.zeros(4).expand(1 << 26, 4), "small": torch.ones(3).expand(5, 3)}, p)
    with tb.open(p) as f:
        assert f.info("big")[1] == (1 << 26, 4)  # still listed, by its header
        small = f.read(["small"], mmap=False)["small"]
        assert small.shape == (5, 3) and small.tolist() == [[1.0] * 3] * 5
        for options in ({}, {"mmap": False}, {"framework": "torch"}):
            with pytest.raises(
                tb.FormatError,
                match=r"'big' has shape \[67108864, 4\] and strides \[0, 1\].*torch\.load",
            ):
                f.read(["big"], **options)


# --- nesting: a .pt destination keeps the tree it is given, or the .pt source's ---------------


def same_tree(a: Any, b: Any) -> bool:
    """Equal containers (types, key order, OrderedDict attributes), tensors bit for bit."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return (
            list(a) == list(b) and vars(a) == vars(b) if type(a) is not dict else list(a) == list(b)
        ) and all(same_tree(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and type(a) in (list, tuple):
        return len(a) == len(b) and all(same_tree(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bits(a) == bits(b)
    return bool(a == b)


def checkpoint() -> dict[str, Any]:
    """A training checkpoint as Lightning and hand-written loops save one."""
    from collections import OrderedDict

    model = OrderedDict((f"layers.{i}.weight", torch.randn(3, 2)) for i in range(3))
    model["emb"] = torch.ones(4, dtype=torch.bfloat16)
    model._metadata = OrderedDict({"": {"version": 1}, "layers.0": {"version": 2}})  # type: ignore[attr-defined]
    return {
        "global_step": 129,
        "model": model,
        "config_dict": {"lr": 3e-4, "betas": (0.9, 0.95), "name": "tiny", "dropout": None},
        "optimizer": {
            "state": {0: {"exp_avg": torch.zeros(3, 2), "step": torch.tensor(129.0)}},
            "param_groups": [{"params": [0, 1, 2, 3], "lr": 3e-4, "fused": False}],
        },
        "a.b": torch.full((1,), 2.0),  # a key with a dot, beside a nested one
        "a": {"c": torch.zeros(1)},
        "shape": torch.Size([3, 2]),
        "empty": {},
        "blob": b"\x00\xff",
    }


def test_save_keeps_a_nested_tree(tmp_path: Path) -> None:
    ckpt = checkpoint()
    tb.save(ckpt, tmp_path / "ckpt.pt")
    assert same_tree(torch.load(tmp_path / "ckpt.pt", weights_only=True), ckpt)
    got = tb.load(tmp_path / "ckpt.pt")  # read back by the one dotted-name rule
    assert "config_dict.betas.1" not in got and "optimizer.state.0.exp_avg" in got
    with pt.open(tmp_path / "ckpt.pt") as f:
        assert f.plain_values()["config_dict.betas.1"] == 0.95
    with pytest.raises(FormatError, match=r"two entries flatten to the key 'a.c'"):
        tb.save({**ckpt, "a.c": torch.ones(1)}, tmp_path / "clash.pt")  # tb.load could not
    assert not (tmp_path / "clash.pt").exists()


def test_pt_to_pt_keeps_the_source_structure(tmp_path: Path) -> None:
    ckpt = checkpoint()
    torch.save(ckpt, tmp_path / "src.pt")
    with tb.open(tmp_path / "src.pt") as f:
        tb.save(f, tmp_path / "dst.pt")
        tb.save(f, tmp_path / "bare.pt", metadata=False)  # the plain values left out
        tb.save(f, tmp_path / "new.pt", metadata={"note": "re-saved"})  # ... replaced
    assert same_tree(torch.load(tmp_path / "dst.pt", weights_only=True), ckpt)
    bare = torch.load(tmp_path / "bare.pt", weights_only=True)
    assert list(bare) == ["model", "optimizer", "a.b", "a", "empty"]
    assert list(bare["optimizer"]) == ["state"] and bare["empty"] == {}
    assert same_tree(bare["model"], ckpt["model"])
    new = torch.load(tmp_path / "new.pt", weights_only=True)
    assert new["note"] == "re-saved" and "global_step" not in new
    with tb.open(tmp_path / "src.pt") as f:  # flat formats keep dotted names, as before
        tb.save(f, tmp_path / "flat.safetensors")
    assert "config_dict.lr" in tb.open(tmp_path / "flat.safetensors").metadata


def test_structure_is_the_readers_skeleton(tmp_path: Path) -> None:
    from tensorbridge._keys import Leaf, rebuild

    torch.save({"m": [torch.ones(1), {"w": torch.zeros(1)}], 3: "x"}, tmp_path / "s.pt")
    with pt.open(tmp_path / "s.pt") as f:
        skel = f.structure()
        assert skel == {"m": [Leaf("m.0"), {"w": Leaf("m.1.w")}], 3: Leaf("3")}
        assert sorted([*f.keys(), *f.plain_values()]) == ["3", "m.0", "m.1.w"]
    with pytest.raises(
        tb.InvalidArgumentError,
        match=r"^t: m is a list, and leaving out its item 'm.0' would renumber the items after "
        r"it; keep all of its items or none$",
    ):
        rebuild(skel, {"m.1.w": 1, "3": "x"}, where="t")
    assert rebuild(skel, {"3": "x"}, where="t") == {3: "x"}  # the whole list left out
    torch.save(torch.ones(2), tmp_path / "one.pt")
    tb.save({"w": np.ones(2)}, tmp_path / "flat.safetensors")
    for name in ("one.pt", "flat.safetensors"):  # nothing nested to keep
        with tb.open(tmp_path / name) as f:
            assert f.structure() is None


# --- state dicts keep what torch's load_state_dict uses; legacy files of every protocol ---


def test_state_dict_metadata_survives(tmp_path: Path) -> None:
    """A real state dict: an OrderedDict whose ``_metadata`` (module versions) is kept."""
    from collections import OrderedDict

    from tensorbridge.io.torch_archive import open_archive

    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.BatchNorm1d(3))
    sd = model.state_dict()
    p = tmp_path / "m.pt"
    torch.save(sd, p)
    archive = open_archive(p, repr(str(p)))
    try:
        obj = archive.obj
        assert type(obj) is OrderedDict
        assert obj._metadata == sd._metadata  # type: ignore[attr-defined]
        assert list(obj) == list(sd)
    finally:
        archive.close()
    with tb.open(p) as f:
        assert f.keys() == list(sd)


def test_ordered_dict_attributes_must_be_plain(tmp_path: Path) -> None:
    """BUILD on an OrderedDict sets only plain, non-dunder attributes; anything else is dropped."""
    from collections import OrderedDict

    from tensorbridge.io.pickle_machine import unpickle

    head = b"\x80\x02ccollections\nOrderedDict\n)R"
    kept = unpickle(head + b"}X\x09\x00\x00\x00_metadata}X\x01\x00\x00\x00aK\x01ssb.")
    assert type(kept) is OrderedDict and kept._metadata == {"a": 1}  # type: ignore[attr-defined]
    for state in (b"}X\x09\x00\x00\x00__class__K\x01sb.", b"}X\x01\x00\x00\x00acm\nC\n)Rsb."):
        got = unpickle(head + state)
        assert type(got) is OrderedDict and vars(got) == {}


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
def test_legacy_file_of_every_pickle_protocol(tmp_path: Path, protocol: int) -> None:
    from tensorbridge.io._detect import detect

    p = tmp_path / "m.pt"
    want = {"w": torch.arange(6.0).reshape(2, 3), "n": 7}
    torch.save(want, p, _use_new_zipfile_serialization=False, pickle_protocol=protocol)
    assert detect(p) == "pt-legacy"
    with tb.open(p) as f:
        assert f.keys() == ["w"]
        assert f.plain_values() == {"n": 7}
        assert bits(f.read(["w"])["w"]) == bits(want["w"])

"""Writers never corrupt silently: every writer refuses, before it creates anything, a
tensor name it cannot store faithfully (the rules of ``tensorbridge._keys``)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

import tensorbridge as tb
from tensorbridge import _keys

pytest.importorskip("zarr", reason="the Zarr writers need zarr")

# a bad-name class -> (the names saved, what the message says)
BAD: dict[str, tuple[list[str], str]] = {
    "nul": (["w\x00a", "w\x00b"], r"'w\\x00a': it holds a NUL character"),
    "surrogate": (["w\udc80"], r"'w\\udc80': it is not valid Unicode"),
    "dotdot": (["../../escaped"], r"'\.\./\.\./escaped': it (has a '\.\.' component|holds a path)"),
    "absolute": (["/abs/x"], r"'/abs/x': it (is an absolute path|holds a path separator)"),
    "backslash": (["a\\b"], r"'a\\\\b': it holds a"),
    "separator": (["a/b"], r"'a/b': it holds a path separator"),
    "periods": (["..."], r"'\.\.\.': it is only periods"),
    "empty": ([""], r"'': it is empty"),
    "case": (["Weight", "weight"], r"'Weight' and 'weight' differ only in case"),
    "reserved": (["__metadata__"], r"'__metadata__' is reserved"),
    "zarr_prefix": (["__x"], r"'__x': names starting with '__' are reserved"),
    "long": (["w" * 64], r"it is 64 bytes in UTF-8 and llama.cpp"),
    "npy_suffix": (["a", "a.npy"], r"'a' and 'a.npy' are one member to np.load"),
}

# the writers, and the bad-name classes each refuses (the rest it stores faithfully)
EVERYWHERE = {"nul", "surrogate"}
PATHS = EVERYWHERE | {"dotdot", "absolute", "backslash", "empty"}
FILES = PATHS | {"separator", "periods", "case"}
REFUSES = {
    "safetensors": EVERYWHERE | {"reserved"},
    "sharded": EVERYWHERE | {"reserved"},
    "npz": PATHS | {"npy_suffix"},
    "pt": EVERYWHERE,
    "gguf": EVERYWHERE | {"long"},
    "zarr": FILES | {"zarr_prefix"},
    "dcp-npy": FILES,
    "dcp-safetensors": EVERYWHERE | {"reserved"},
    "dcp-zarr": FILES | {"zarr_prefix"},
    "SafetensorsWriter": EVERYWHERE | {"reserved"},
    "ZarrWriter": FILES | {"zarr_prefix"},
}


def _state(names: list[str]) -> dict[str, torch.Tensor]:
    return {n: torch.full((2,), float(i)) for i, n in enumerate(names)}


def _dcp_source(tmp_path: Path, names: list[str]) -> tb.io.TensorFile:
    src = tmp_path / "src"
    dcp.save(_state(names), checkpoint_id=src, no_dist=True)
    return tb.open(src)


def _save(writer: str, names: list[str], tmp_path: Path, out: Path) -> None:
    """Save ``names`` with ``writer`` into the (empty) directory ``out``."""
    gguf = {"general.architecture": "llama"}
    simple: dict[str, Callable[[], None]] = {
        "safetensors": lambda: tb.save(_state(names), out / "m.safetensors"),
        "sharded": lambda: tb.save(_state(names), out / "m.safetensors.index.json"),
        "npz": lambda: tb.save(_state(names), out / "m.npz"),
        "pt": lambda: tb.save(_state(names), out / "m.pt"),
        "gguf": lambda: tb.save(_state(names), out / "m.gguf", metadata=gguf),
        "zarr": lambda: tb.save(_state(names), out / "m.zarr"),
    }
    if writer in simple:
        simple[writer]()
        return
    if writer.startswith("dcp-"):
        with _dcp_source(tmp_path, names) as f:
            if writer == "dcp-npy":
                tb.save(f, out / "npy", format="npy")
            else:
                tb.save(f, out / ("m." + writer.removeprefix("dcp-")))
        return
    cls: Any = {"SafetensorsWriter": tb.SafetensorsWriter, "ZarrWriter": tb.ZarrWriter}[writer]
    target = out / ("m.zarr" if writer == "ZarrWriter" else "ckpt")
    try:
        dcp.save(_state(names), storage_writer=cls(target), no_dist=True)
    except CheckpointException as err:  # DCP wraps a writer's error with the rank's
        raise next(iter(err.failures.values()))[0] from None


CASES = [(w, b) for w in REFUSES for b in BAD if b in REFUSES[w]]


@pytest.mark.parametrize(("writer", "bad"), CASES, ids=[f"{w}-{b}" for w, b in CASES])
def test_every_writer_refuses_a_name_it_cannot_store(writer: str, bad: str, tmp_path: Path) -> None:
    names, says = BAD[bad]
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(tb.InvalidNameError, match=says) as info:
        _save(writer, names, tmp_path, out)
    assert "rename" in str(info.value)
    assert os.listdir(out) == []  # nothing created, not even a temporary


STORED = [
    (w, b)
    for w in ("safetensors", "npz", "pt", "gguf")
    for b in ("dotdot", "absolute", "backslash", "separator", "case", "periods")
    if b not in REFUSES[w]
]


@pytest.mark.parametrize(("writer", "bad"), STORED, ids=[f"{w}-{b}" for w, b in STORED])
def test_names_a_format_stores_faithfully_round_trip(writer: str, bad: str, tmp_path: Path) -> None:
    names = BAD[bad][0]
    out = tmp_path / "out"
    out.mkdir()
    _save(writer, names, tmp_path, out)
    (path,) = out.iterdir()
    with tb.open(path) as f:
        assert f.keys() == names
        assert [f[n].tolist() for n in names] == [[float(i)] * 2 for i in range(len(names))]


def test_npz_members_are_named_as_numpy_names_them(tmp_path: Path) -> None:
    """np.savez adds .npy to every key and np.load takes one off; "x/y" stays inside."""
    p = tmp_path / "m.npz"
    tb.save({"a.npy": np.ones(1), "x/y": np.full(1, 2.0)}, p)
    with np.load(p) as z:
        assert sorted(z.files) == ["a.npy", "x/y"]
        assert z["a.npy"].tolist() == [1.0] and z["x/y"].tolist() == [2.0]
    np.savez(tmp_path / "np.npz", a=np.zeros(1), **{"a.npy": np.ones(1)})
    with np.load(tmp_path / "np.npz") as z:  # why "a" and "a.npy" are refused together
        assert z["a.npy"].tolist() == [0.0]


def test_the_rules_are_one_function_each() -> None:
    assert _keys.no_nul("a\x00") and _keys.no_nul("a") is None
    assert _keys.valid_unicode("\ud800") and _keys.valid_unicode("é") is None
    assert _keys.inside_container("C:x") and _keys.inside_container("a/..b") is None
    assert _keys.inside_container("a\\..\\b") and _keys.inside_container("a/../b")
    assert _keys.one_file_name("..") and _keys.one_file_name("a..b") is None
    assert _keys.case_insensitive("Stra\u00dfe") == _keys.case_insensitive("STRASSE")
    assert _keys.case_insensitive("e\u0301") == _keys.case_insensitive("\u00e9")  # NFC
    rules = _keys.NameRules((_keys.no_nul,), same=str.lower, same_means="collide")
    rules.check(["a", "b", 3], "'x'")  # names that are no str are the writer's to refuse
    with pytest.raises(tb.InvalidNameError, match=r"^'x': the tensors 'a' and 'A' collide"):
        rules.check(["a", "A"], "'x'")
    assert issubclass(tb.InvalidNameError, ValueError)

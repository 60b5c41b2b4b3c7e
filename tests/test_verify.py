"""``tb.verify``: a conversion re-read and checked bit for bit, from Python.

``convert --verify`` is this call; these tests call it directly: a faithful conversion
passes, a cast passes only when it is named, and every kind of difference is a line.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import tensorbridge as tb


@pytest.fixture
def src(tmp_path: Path) -> Path:
    path = tmp_path / "src.safetensors"
    tb.save(
        {"w": torch.randn(4, 8), "h": torch.randn(3).to(torch.bfloat16), "i": torch.arange(5)},
        path,
    )
    return path


def test_a_conversion_verifies(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.npz"
    tb.save(tb.open(src), out)
    result = tb.verify(src, out)
    assert isinstance(result, tb.Verification)
    assert result.ok and result.problems == ()
    assert sorted(result.checked) == ["h", "i", "w"]
    with tb.open(src) as f:  # an open file verifies the same
        assert tb.verify(f, out, names=["w"]) == tb.Verification(("w",), ())


def test_a_cast_verifies_only_when_named(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "bf16.safetensors"
    tb.save(tb.open(src), out, float_dtype="bfloat16")
    assert tb.verify(src, out, float_dtype="bfloat16").ok
    problems = tb.verify(src, out).problems
    assert problems == ("w: float32(4, 8) became bfloat16(4, 8)",)


def test_differences_are_named(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.safetensors"
    values = tb.load(src)
    values["w"] = values["w"].copy()
    values["w"][0, 0] = np.nextafter(values["w"][0, 0], np.float32(np.inf))  # one ULP
    del values["i"]
    tb.save(values, out)
    result = tb.verify(src, out)
    assert not result.ok
    assert sorted(result.problems) == ["i: missing from the output", "w: the bytes differ"]


def test_nan_payloads_are_compared_as_bits(tmp_path: Path) -> None:
    a = np.array([np.nan, 1.0], np.float32)
    b = a.copy()
    b.view(np.uint32)[0] ^= 1  # another NaN: equal as values under equal_nan, not as bits
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    assert tb.verify(tmp_path / "a.npy", tmp_path / "a.npy").ok
    [problem] = tb.verify(tmp_path / "a.npy", tmp_path / "b.npy").problems
    assert problem.endswith(": the bytes differ")


def test_one_array_file_stands_for_the_name_given(src: Path, tmp_path: Path) -> None:
    out = tmp_path / "w.npy"
    with tb.open(src) as f:
        tb.save(f["w"], out)
        assert tb.verify(f, out, names=["w"]).ok
        assert tb.verify(f, out, names=["h"]).problems == ("h: bfloat16(3,) became float32(4, 8)",)


def test_members_torch_cannot_hold_are_compared_as_bytes(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", w=np.ones(3, np.float32), s=np.array(["x", "yz"]))
    tb.save(tb.open(tmp_path / "a.npz"), tmp_path / "b.npz")  # "s" copied as .npy bytes
    result = tb.verify(tmp_path / "a.npz", tmp_path / "b.npz")
    assert result.ok and sorted(result.checked) == ["s", "w"]
    np.savez(tmp_path / "c.npz", w=np.ones(3, np.float32), s=np.array(["x", "yy"]))
    assert tb.verify(tmp_path / "a.npz", tmp_path / "c.npz").problems == ("s: the bytes differ",)

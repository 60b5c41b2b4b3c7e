"""One handle, one version: after ``f = tb.open(p)``, an atomic replacement of ``p`` (a new
file renamed over it, another save committing) changes nothing ``f`` returns, through NumPy
or torch, mapped or read into memory; where a reader must open a file lazily (a Zarr
store's chunks, a DCP checkpoint's data files) it refuses a replaced one instead of
mixing versions.
"""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge.errors import FormatError


def version(v: int) -> dict[str, torch.Tensor]:
    """The same names, shapes and dtypes in every version; only the values differ."""
    return {"a": torch.full((8, 4), float(v)), "b": torch.arange(6, dtype=torch.int32) * v}


def replace_file(save: Callable[[Path], None], path: Path) -> None:
    """Write a new version beside ``path`` and rename it over ``path`` (atomic)."""
    new = path.with_name("new-" + path.name)
    save(new)
    os.replace(new, path)


FILES: dict[str, Callable[[dict[str, torch.Tensor], Path], None]] = {
    "safetensors": lambda sd, p: tb.save(sd, p, overwrite=True),
    "npz": lambda sd, p: np.savez(p, **{k: t.numpy() for k, t in sd.items()}),
    "npz-deflated": lambda sd, p: np.savez_compressed(p, **{k: t.numpy() for k, t in sd.items()}),
    "gguf": lambda sd, p: tb.save(sd, p, metadata={"general.architecture": "llama"}),
}
SUFFIX = {"safetensors": ".safetensors", "npz": ".npz", "npz-deflated": ".npz", "gguf": ".gguf"}


def reads(f: Any, name: str) -> list[np.ndarray]:
    """``name`` read every way a handle gives it: NumPy and torch, mapped and not."""
    out = []
    for framework in ("numpy", "torch"):
        for mapped in (True, False):
            x = f.get(name, framework=framework, mmap=mapped)
            out.append(x.numpy() if isinstance(x, torch.Tensor) else np.asarray(x))
    return out


def assert_version(f: Any, v: int) -> None:
    for name, t in version(v).items():
        for got in reads(f, name):
            assert np.array_equal(got, t.numpy()), (name, v)


@pytest.mark.parametrize("kind", list(FILES))
def test_a_file_replaced_after_open_reads_as_opened(kind: str, tmp_path: Path) -> None:
    if kind == "gguf":
        pytest.importorskip("gguf", reason="the gguf extra is not installed")
    p = tmp_path / f"m{SUFFIX[kind]}"
    FILES[kind](version(1), p)
    with tb.open(p) as f:
        replace_file(lambda q: FILES[kind](version(2), q), p)
        assert_version(f, 1)  # nothing read before the replacement: still the opened file
    with tb.open(p) as f:
        assert_version(f, 2)


def test_an_npy_replaced_after_open_reads_as_opened(tmp_path: Path) -> None:
    p = tmp_path / "x.npy"
    np.save(p, np.full(5, 1.0))
    with tb.open(p) as f:
        replace_file(lambda q: np.save(q, np.full(7, 2.0)), p)  # another size, too
        for got in reads(f, "x"):
            assert got.tolist() == [1.0] * 5


def test_a_save_over_an_open_file_changes_nothing_it_reads(tmp_path: Path) -> None:
    p = tmp_path / "m.safetensors"
    tb.save(version(1), p)
    with tb.open(p) as f:
        tb.save(version(2), p, overwrite=True)
        assert_version(f, 1)


def test_sharded_shards_are_the_opened_index_versions(tmp_path: Path) -> None:
    tb.save(version(1), tmp_path, max_shard_size=64)
    with tb.open(tmp_path) as f:
        assert type(f).__name__ == "ShardedFile"
        tb.save(version(2), tmp_path, max_shard_size=64, overwrite=True)  # same shard names
        assert_version(f, 1)


def test_an_index_replaced_while_its_shards_open_is_opened_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorbridge.io import sharded

    tb.save(version(1), tmp_path, max_shard_size=64)
    opens = [0]
    real = sharded.ShardedFile._scan

    def racing(self: Any) -> None:
        opens[0] += 1
        real(self)
        if opens[0] == 1:  # a save commits between reading the index and the check
            tb.save(version(2), tmp_path, max_shard_size=64, overwrite=True)

    monkeypatch.setattr(sharded.ShardedFile, "_scan", racing)
    with tb.open(tmp_path) as f:
        assert opens[0] == 2
        assert_version(f, 2)


def test_a_replaced_zarr_store_is_refused_not_mixed(tmp_path: Path) -> None:
    pytest.importorskip("zarr", reason="the zarr extra is not installed")
    p = tmp_path / "m.zarr"
    tb.save(version(1), p)
    with tb.open(p) as f:
        assert_version(f, 1)
        tb.save(version(2), p, overwrite=True)
        for framework in ("numpy", "torch"):
            with pytest.raises(FormatError, match=r"replaced since it was opened.*open it again"):
                f.get("a", framework=framework)
    with tb.open(p) as f:
        assert_version(f, 2)


def _dcp(path: Path, v: int) -> None:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(version(v), checkpoint_id=str(path), no_dist=True)


def _replace_dcp(path: Path, v: int) -> None:
    """A new checkpoint renamed file by file over ``path``'s, ``.metadata`` last."""
    new = path.with_name("new-" + path.name)
    _dcp(new, v)
    for q in sorted(new.iterdir(), key=lambda q: q.name == ".metadata"):
        os.replace(q, path / q.name)
    shutil.rmtree(new)


def test_dcp_data_files_replaced_after_open_are_refused_or_read_as_opened(tmp_path: Path) -> None:
    p = tmp_path / "ckpt"
    _dcp(p, 1)
    with tb.open(p) as f:
        _replace_dcp(p, 2)  # no data file mapped yet: each is checked when first mapped
        for framework in ("numpy", "torch"):
            with pytest.raises(FormatError, match=r"replaced since it was opened"):
                f.get("a", framework=framework)
    with tb.open(p) as f:
        assert_version(f, 2)  # every data file mapped now
        _replace_dcp(p, 3)
        assert_version(f, 2)


def test_a_conversion_task_refuses_a_checkpoint_replaced_since_it_was_planned(
    tmp_path: Path,
) -> None:
    """A worker process reopens the checkpoint by path: it must be the version planned."""
    from tensorbridge.io import assemble

    p = tmp_path / "ckpt"
    _dcp(p, 1)
    with tb.open(p) as f:
        versions = tuple(sorted(f.file_versions().items()))
    _replace_dcp(p, 2)
    with pytest.raises(FormatError, match=r"replaced since it was opened"):
        assemble.run(assemble.Task(str(p.absolute()), (), versions=versions))
    with tb.open(p) as f:
        now = tuple(sorted(f.file_versions().items()))
    assert assemble.run(assemble.Task(str(p.absolute()), (), versions=now)) == 0

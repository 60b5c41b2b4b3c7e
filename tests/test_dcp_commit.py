"""The commit protocol every multi-file writer shares: one version readable at every step."""

from __future__ import annotations

import errno
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp

import tensorbridge as tb
from tensorbridge import _commit as commit
from tensorbridge._atomic import STAGING_PREFIX
from tensorbridge._commit import begin, new_save_id, pending, publish, require_committed


def test_publish_moves_staged_entries_then_writes_the_index(tmp_path: Path) -> None:
    dest = tmp_path / "ckpt"
    staging = begin(dest, new_save_id())
    (staging / "a.bin").write_bytes(b"a")
    (staging / "arr").mkdir()
    (staging / "arr" / "c0").write_bytes(b"chunk")

    assert staging.parent == dest and staging.name.startswith(STAGING_PREFIX)
    with pytest.raises(tb.UncommittedCheckpointError, match="still running or died"):
        require_committed(dest, "index.json")

    publish(dest, staging, ["a.bin", "arr"], "index.json", b'{"v": 1}')

    assert sorted(p.name for p in dest.iterdir()) == ["a.bin", "arr", "index.json"]
    assert (dest / "arr" / "c0").read_bytes() == b"chunk"
    assert require_committed(dest, "index.json").read_bytes() == b'{"v": 1}'
    assert pending(dest) == []


def test_a_second_save_replaces_files_directories_and_stale_entries(tmp_path: Path) -> None:
    dest = tmp_path / "ckpt"
    first = begin(dest, new_save_id())
    for name in ("a.bin", "old.bin"):
        (first / name).write_bytes(b"old")
    (first / "arr").mkdir()
    (first / "arr" / "c0").write_bytes(b"old")
    publish(dest, first, ["a.bin", "old.bin", "arr"], "index.json", b"1")
    killed = dest / f"{STAGING_PREFIX}{new_save_id()}"  # a save that died: no claim held
    killed.mkdir()
    (killed / "a.bin").write_bytes(b"partial")

    second = begin(dest, new_save_id())
    (second / "a.bin").write_bytes(b"new")
    (second / "arr").mkdir()
    (second / "arr" / "c1").write_bytes(b"new")
    publish(dest, second, ["a.bin", "arr"], "index.json", b"2", stale=["old.bin", "a.bin"])

    assert sorted(p.name for p in dest.iterdir()) == ["a.bin", "arr", "index.json"]
    assert (dest / "a.bin").read_bytes() == b"new"
    assert [p.name for p in (dest / "arr").iterdir()] == ["c1"]
    assert (dest / "index.json").read_bytes() == b"2"


def test_no_index_and_no_staging_is_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"there is no index\.json"):
        require_committed(tmp_path, "index.json")
    assert issubclass(tb.UncommittedCheckpointError, tb.FormatError)


# --- commit_files and publish_store: every step reads as one version ---------------------------


class Killed(BaseException):
    """Stands for a SIGKILL: nothing catches it (cleanup that only removes a save's own
    uncommitted files may still run, which a kill would skip: the states are the same)."""


def _stop_at(m: pytest.MonkeyPatch, k: int) -> list[int]:
    """Make the ``k``-th file-system call of the commit raise :class:`Killed`."""
    calls = [0]

    def wrap(real: Any) -> Any:
        def hit(*a: Any, **kw: Any) -> Any:
            calls[0] += 1
            if calls[0] == k:
                raise Killed
            return real(*a, **kw)

        return hit

    for name in ("link", "replace", "rename", "unlink", "fsync"):
        m.setattr(os, name, wrap(getattr(os, name)))
    m.setattr(commit, "exchange", wrap(commit.exchange))
    return calls


def _sd(seed: int, n: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {f"w{i}": torch.randn(64, 16, generator=g) for i in range(n)}


def _which(got: dict[str, Any], *versions: dict[str, torch.Tensor]) -> int:
    for i, v in enumerate(versions):
        same = (np.array_equal(np.asarray(got[k]), v[k].numpy()) for k in v)
        if got.keys() == v.keys() and all(same):
            return i
    return -1


def _every_step(
    tmp_path: Path, m: pytest.MonkeyPatch, save: Any, old: Any, new: Any, dest: str
) -> Counter[int]:
    """Stop a save of ``new`` over ``old`` at each of its calls; judge, then save again."""
    ref = tmp_path / "ref"
    save(new, ref / dest)
    save(old, tmp_path / "count" / dest)  # calls counted over the previous version
    with m.context() as mm:
        calls = _stop_at(mm, 0)
        save(new, tmp_path / "count" / dest)
    seen: Counter[int] = Counter()
    for k in range(1, calls[0] + 1):
        d = tmp_path / f"k{k}"
        save(old, d / dest)
        with m.context() as mm, pytest.raises(Killed):
            _stop_at(mm, k)
            save(new, d / dest)
        seen[_which(tb.load(d / dest), old, new)] += 1
        save(new, d / dest)  # the next save cleans whatever the stopped one left
        assert sorted(os.listdir(d)) == sorted(os.listdir(ref))
        assert sorted(os.listdir(d / dest)) == sorted(os.listdir(ref / dest))
    assert -1 not in seen
    return seen


@pytest.mark.parametrize("n_old", [3, 4])  # the same shard names, or others
def test_a_sharded_save_stopped_at_any_step_reads_as_one_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n_old: int
) -> None:
    def save(sd: Any, path: Path) -> None:
        tb.save(sd, str(path) + os.sep, max_shard_size=4096, overwrite=True)

    seen = _every_step(tmp_path, monkeypatch, save, _sd(1, n_old), _sd(2, 3), "ckpt")
    assert seen[0] and seen[1]  # stops before and after the commit were both reached


def test_one_file_replacing_a_sharded_save_stopped_at_any_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The index goes before its shards: it never names one already removed."""

    def save(sd: Any, path: Path) -> None:
        limit = 4096 if len(sd) == 4 else None  # the previous version sharded, the new not
        tb.save(sd, str(path) + os.sep, max_shard_size=limit, overwrite=True)

    seen = _every_step(tmp_path, monkeypatch, save, _sd(1, 4), _sd(2, 3), "ckpt")
    assert seen[0] and seen[1]


def test_a_zarr_save_stopped_at_any_step_reads_as_one_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("zarr", reason="the zarr extra is not installed")

    def save(sd: Any, path: Path) -> None:
        tb.save(sd, path, overwrite=True)

    seen = _every_step(tmp_path, monkeypatch, save, _sd(1, 4), _sd(2, 3), "m.zarr")
    assert seen[0] and seen[1]


def test_an_index_naming_hidden_files_is_read(tmp_path: Path) -> None:
    """The state between the commit and the final names: the index names hidden files."""
    sd = _sd(3, 2)
    tb.save(sd, tmp_path, max_shard_size=4096)
    index = tmp_path / "model.safetensors.index.json"
    doc = json.loads(index.read_text())
    first = doc["weight_map"]["w0"]
    hidden = commit.temp_name(first)
    (tmp_path / first).rename(tmp_path / hidden)
    doc["weight_map"]["w0"] = hidden
    index.write_text(json.dumps(doc))
    assert commit.final_name(hidden) == first
    assert _which(tb.load(tmp_path), sd) == 0
    back = {k: torch.zeros(64, 16) for k in sd}
    dcp.load(back, storage_reader=tb.SafetensorsReader(tmp_path), no_dist=True)
    assert _which(back, sd) == 0
    tb.save(sd, tmp_path, max_shard_size=4096, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    ]


def _no_links(*a: Any, **kw: Any) -> None:
    raise OSError(errno.EPERM, "Operation not permitted")


def test_without_hard_links_the_files_are_copied_into_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tb.save(_sd(1, 3), tmp_path, max_shard_size=4096)
    monkeypatch.setattr(os, "link", _no_links)
    tb.save(_sd(2, 3), tmp_path, max_shard_size=4096, overwrite=True)
    assert _which(tb.load(tmp_path), _sd(2, 3)) == 0
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]


@pytest.mark.parametrize("n_old", [3, 4])
def test_without_hard_links_a_sharded_save_stopped_at_any_step_reads_as_one_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, n_old: int
) -> None:
    """The copying protocol keeps an index naming complete files at every step too."""
    monkeypatch.setattr(os, "link", _no_links)  # _stop_at wraps it: still no links

    def save(sd: Any, path: Path) -> None:
        tb.save(sd, str(path) + os.sep, max_shard_size=4096, overwrite=True)

    seen = _every_step(tmp_path, monkeypatch, save, _sd(1, n_old), _sd(2, 3), "ckpt")
    assert seen[0] and seen[1]


def test_a_store_is_swapped_whole_and_foreign_files_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("zarr", reason="the zarr extra is not installed")
    p = tmp_path / "m.zarr"
    tb.save(_sd(1, 3), p)
    (p / "README").write_text("mine")
    before = os.stat(p).st_ino
    tb.save(_sd(2, 2), p, overwrite=True)
    assert os.stat(p).st_ino != before  # a new directory took the name
    assert sorted(os.listdir(p)) == ["README", "w0", "w1", "zarr.json"]
    assert (p / "README").read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["m.zarr"]  # no staging left beside it
    monkeypatch.setattr(commit, "exchange", lambda a, b: False)  # no renameat2: renames
    tb.save(_sd(3, 1), p, overwrite=True)
    assert sorted(os.listdir(p)) == ["README", "w0", "zarr.json"]
    assert _which(tb.load(p), _sd(3, 1)) == 0
    assert sorted(os.listdir(tmp_path)) == ["m.zarr"]


def test_exchange_swaps_two_directories(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("a")
    if not commit.exchange(a, b):
        pytest.skip("no renameat2(RENAME_EXCHANGE) here: the fallback is used")
    assert (b / "x").read_text() == "a" and os.listdir(a) == []

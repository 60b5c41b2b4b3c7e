"""The commit protocol every DCP writer shares: staged entries, the index written last."""

from __future__ import annotations

from pathlib import Path

import pytest

import tensorbridge as tb
from tensorbridge.dcp._commit import (
    STAGING_PREFIX,
    begin,
    new_save_id,
    pending,
    publish,
    require_committed,
)


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
    killed = begin(dest, new_save_id())  # a save that died: never published
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

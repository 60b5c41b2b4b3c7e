"""Bounded work and memory for hostile inputs, each at the bound SECURITY.md ("Bounds") states.

* DCP chunk tiling: O(N log N) in the chunk count (:mod:`tensorbridge._boxes`), checked
  against a brute-force pairwise check and at 32,000 chunks.
* DCP value entries: at most ``MAX_VALUE`` bytes once decompressed, read in pieces.
* GGUF string arrays: walked in windows, linear, whatever the strings hold.
* ``.npz``: its central directory costs memory in proportion to the member count.

The builders here also make the full-size inputs the slow tests (and the figures in
SECURITY.md) use.
"""

from __future__ import annotations

import dataclasses
import io
import itertools
import pickle
import random
import struct
import tracemalloc
import warnings
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tensorbridge as tb
from _peak_rss import run_child
from tensorbridge import _boxes
from tensorbridge.dcp._tiling import check_tiles
from tensorbridge.io import _gguf_header
from tensorbridge.io.dcp import Chunk
from tensorbridge.io.dcp import reader as dcp_reader
from tensorbridge.io.dcp.reader import _disjoint

# --- builders --------------------------------------------------------------------------------


def dcp_value_bomb(d: Path, inflated: int) -> Path:
    """A DCP checkpoint whose value ``step`` is a torch.save zip with a deflated data.pkl of
    ``inflated`` bytes (a valid pickle of 3, then zeros), appended to its ``.distcp``."""
    import torch.distributed.checkpoint as tdcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled": one process
        tdcp.save({"w": torch.ones(2), "step": 3}, checkpoint_id=d, no_dist=True)
    meta = pickle.loads((d / ".metadata").read_bytes())  # our own file: trusted
    buf = io.BytesIO()
    head = pickle.dumps(3, protocol=2)
    with zipfile.ZipFile(buf, "w") as zf:
        info = zipfile.ZipInfo("archive/data.pkl")
        info.compress_type = zipfile.ZIP_DEFLATED
        with zf.open(info, "w", force_zip64=True) as m:
            m.write(head)
            left = inflated - len(head)
            zeros = bytes(1 << 20)
            while left > 0:
                m.write(zeros[: min(left, len(zeros))])
                left -= min(left, len(zeros))
        zf.writestr("archive/byteorder", "little")
        zf.writestr("archive/version", "3\n")
    item = buf.getvalue()
    (key,) = [k for k in meta.storage_data if k.fqn == "step"]
    distcp = d / meta.storage_data[key].relative_path
    offset = distcp.stat().st_size
    with distcp.open("ab") as f:
        f.write(item)
    meta.storage_data[key] = dataclasses.replace(
        meta.storage_data[key], offset=offset, length=len(item)
    )
    (d / ".metadata").write_bytes(pickle.dumps(meta))
    return d


def gguf_strings(path: Path, item: bytes, count: int) -> Path:
    """A GGUF file with one key: an array of ``count`` strings, each the bytes ``item``."""
    key = b"tokenizer.ggml.tokens"
    head = b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", len(key)) + key
    path.write_bytes(head + struct.pack("<IIQ", 9, 8, count) + item * count)
    return path


EMPTY = struct.pack("<Q", 0)  # an empty string
ZEROS7 = struct.pack("<Q", 7) + bytes(7)  # 7 zero bytes: candidates in every string's text


def npz_members(path: Path, count: int) -> Path:
    """A ``.npz`` of ``count`` one-element int8 members, stored."""
    one = io.BytesIO()
    np.save(one, np.zeros(1, np.int8))
    data = one.getvalue()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        for i in range(count):
            zf.writestr(f"m{i}.npy", data)
    return path


# --- DCP chunk tiling --------------------------------------------------------------------------


def _overlaps(a: tuple[Any, Any], b: tuple[Any, Any]) -> bool:
    return all(ao < bo + bn and bo < ao + an for ao, an, bo, bn in zip(*a, *b, strict=True))


def _brute(boxes: list[tuple[Any, Any]]) -> bool:
    return any(_overlaps(a, b) for a, b in itertools.combinations(boxes, 2))


@pytest.mark.parametrize("ndim", [1, 2, 3, 4])
def test_first_overlap_agrees_with_a_pairwise_check(ndim: int) -> None:
    rng = random.Random(ndim)
    for _ in range(600):
        boxes = [
            (
                tuple(rng.randint(0, 5) for _ in range(ndim)),
                tuple(rng.randint(1, 3) for _ in range(ndim)),
            )
            for _ in range(rng.randint(2, 9))
        ]
        found = _boxes.first_overlap(boxes)
        assert (found is not None) == _brute(boxes), boxes
        if found is not None:
            a, b = boxes[found[0]], boxes[found[1]]
            assert _overlaps(a, b) and a[0] <= b[0]


def test_the_sweep_for_irregular_boxes_agrees_and_stops_at_its_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_boxes, "MAX_WORK", 0)  # no grid: every 3-d case takes the sweep
    rng = random.Random(3)
    for _ in range(300):
        boxes = [
            (tuple(rng.randint(0, 4) for _ in range(3)), tuple(rng.randint(1, 3) for _ in range(3)))
            for _ in range(rng.randint(2, 7))
        ]
        try:
            found = _boxes.first_overlap(boxes)
        except _boxes.TooIrregular:
            continue
        assert (found is not None) == _brute(boxes), boxes
    monkeypatch.setattr(_boxes, "MAX_WORK", 10)
    bricks = [((i, j, k), (1, 1, 1)) for i, j, k in itertools.product(range(2), range(4), range(4))]
    with pytest.raises(_boxes.TooIrregular):
        _boxes.first_overlap(bricks)
    with pytest.raises(tb.FormatError, match="too many chunks to check"):
        _disjoint([Chunk(o, s, "f", 0, 0) for o, s in bricks])


@pytest.mark.parametrize("n", [32_000])
def test_column_chunks_at_the_stated_count_tile_and_an_overlap_is_found(n: int) -> None:
    chunks = [Chunk((0, i), (1, 1), "f", 0, 0) for i in range(n)]
    assert _disjoint(chunks)
    check_tiles("w", (1, n), [(c.offsets, c.shape) for c in chunks])
    chunks[-1] = Chunk((0, n - 2), (1, 2), "f", 0, 0)  # the last two overlap
    assert not _disjoint(chunks)
    with pytest.raises(tb.UnsupportedTensorError, match=r"\(0, 31998\) and \(0, 31998\)"):
        check_tiles("w", (1, n), [(c.offsets, c.shape) for c in chunks])


# --- DCP value entries -------------------------------------------------------------------------


@pytest.mark.parametrize("over", [0, 1])
def test_a_value_is_read_up_to_its_decompressed_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, over: int
) -> None:
    d = dcp_value_bomb(tmp_path / "ck", 1 << 20)
    total = (1 << 20) + len(b"little") + len(b"3\n")  # the item's members, decompressed
    monkeypatch.setattr(dcp_reader, "MAX_VALUE", total - over)  # read by DcpFile
    with tb.open(d) as f:
        if over:
            assert f.metadata == {} and "once decompressed" in f.unsupported()["step"]
        else:
            assert f.metadata == {"step": "3"} and f.unsupported() == {}


@pytest.mark.slow
def test_a_gigabyte_deflated_value_costs_little(tmp_path: Path) -> None:
    d = dcp_value_bomb(tmp_path / "ck", 1 << 30)
    assert (d / "__0_0.distcp").stat().st_size < 2 << 20
    peak = int(
        run_child(
            "import sys, tensorbridge as tb, tensorbridge.io.dcp, torch.distributed.checkpoint\n"
            "reset_peak(); base = status('VmRSS')\n"
            "f = tb.open(sys.argv[1]); assert 'step' in f.unsupported()\n"
            "print(status('VmHWM') - base)",
            str(d),
        )
    )
    assert peak < 100 << 20, peak


# --- GGUF string arrays ------------------------------------------------------------------------


@pytest.mark.parametrize("item", [EMPTY, ZEROS7, struct.pack("<Q", 1) + b"\x00"])
def test_string_arrays_of_zero_bytes_are_walked_exactly(tmp_path: Path, item: bytes) -> None:
    count = 70_000  # several windows
    p = gguf_strings(tmp_path / "m.gguf", item, count)
    with tb.open(p) as f:
        assert f.metadata_types == {"tokenizer.ggml.tokens": "ARRAY[STRING]"}
    data = item * count + b"tail"
    assert _gguf_header._skip_strings(data, 0, count, len(data)) == len(item) * count
    assert _gguf_header._skip_strings(data, 0, count, len(item) * count - 1) > len(item) * count - 1
    assert _gguf_header._strings(data, 0, 3) == [item[8:].decode()] * 3


@pytest.mark.slow
@pytest.mark.parametrize("item", [EMPTY, ZEROS7])
def test_forty_megabytes_of_strings_cost_memory_in_proportion(tmp_path: Path, item: bytes) -> None:
    count = 40_000_000 // len(item)
    p = gguf_strings(tmp_path / "m.gguf", item, count)
    peak = int(
        run_child(
            "import sys, tensorbridge as tb, tensorbridge.io.dcp, torch.distributed.checkpoint\n"
            "reset_peak(); base = status('VmRSS')\n"
            "f = tb.open(sys.argv[1])\nprint(status('VmHWM') - base)",
            str(p),
        )
    )
    assert peak < 80 << 20, peak  # the mapped file and a window's arrays


# --- .npz members ------------------------------------------------------------------------------


def test_npz_members_cost_memory_in_proportion(tmp_path: Path) -> None:
    cost = {}
    for n in (1_000, 4_000):
        p = npz_members(tmp_path / f"{n}.npz", n)
        tracemalloc.start()
        try:
            with tb.open(p) as f:
                assert len(f.keys()) == n
                cost[n] = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    per_member = cost[4_000] / 4_000
    assert per_member < 2_048, per_member  # SECURITY.md: about 770 bytes a member
    assert 3.0 < cost[4_000] / cost[1_000] < 5.0, cost  # linear, not worse

"""The streamed writer's pipeline: computed chunks made ahead by worker threads.

``tensorbridge._pipeline.pipelined`` runs tasks (dequantized pieces) in worker
threads while the writer writes the chunk before; these tests pin what it must
keep: the bytes (identical to dequantizing whole weights and saving them, for
every worker count and chunking), the order, a failure mid-stream (raised, no file
under the final name, no thread left), the bounded set of reused buffers, and
the caller's torch thread count.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge._pipeline import Slot, Task, pipelined, serial_workers
from tensorbridge._tensorfile import Deferred
from tensorbridge.quant import base


def stream_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("tensorbridge-stream")]


def filler(value: int, n: int, seen: list[int] | None = None) -> Task:
    def fill(slot: Slot) -> memoryview:
        buf = slot.reserve(n)
        if seen is not None:
            seen.append(id(slot))
        buf[:n] = value
        return buf[:n].data

    return fill


# --- the pipeline itself ------------------------------------------------------------------------


@pytest.mark.parametrize("count", [1, 2, 3])
def test_chunks_come_in_order_with_their_tags(count: int) -> None:
    units: list[tuple[int, Any]] = []
    for i in range(20):
        units.append((i, filler(i, 1 + i % 3)) if i % 4 else (i, bytes([i]) * 2))
    got = [(tag, bytes(v)) for tag, v in pipelined(units, count)]
    want = [(i, bytes([i]) * (2 if i % 4 == 0 else 1 + i % 3)) for i in range(20)]
    assert got == want
    assert not stream_threads()


def test_slots_are_reused_count_plus_one() -> None:
    """``count`` tasks computing and one chunk being written: count + 1 buffers, reused."""
    seen: list[int] = []
    out = [bytes(v) for _, v in pipelined(((i, filler(i, 4, seen)) for i in range(50)), 3)]
    assert out == [bytes([i]) * 4 for i in range(50)]
    assert len(set(seen)) == 4


def test_a_plain_chunk_is_yielded_before_its_producer_moves_on() -> None:
    """A producer that reuses one buffer (as ``iter_bytes`` does) is not advanced while
    its chunk waits behind running tasks."""
    shared = bytearray(3)

    def units() -> Iterator[tuple[str, Any]]:
        for i in range(6):
            yield "task", filler(100 + i, 2)
            shared[:] = bytes([i]) * 3
            yield "plain", memoryview(shared)

    got = [bytes(v) for _, v in pipelined(units(), 2)]
    want = []
    for i in range(6):
        want += [bytes([100 + i]) * 2, bytes([i]) * 3]
    assert got == want


def test_a_task_error_is_raised_in_the_caller_and_the_workers_are_joined() -> None:
    def broken(slot: Slot) -> memoryview:
        raise tb.QuantizationError("piece 5 is broken")

    units = [(i, broken if i == 5 else filler(i, 8)) for i in range(40)]
    got = []
    with pytest.raises(tb.QuantizationError, match="piece 5 is broken"):
        for tag, _ in pipelined(units, 2):
            got.append(tag)
    assert got == [0, 1, 2, 3, 4]
    assert not stream_threads()


def test_a_caller_that_stops_early_leaves_no_thread() -> None:
    gen = pipelined(((i, filler(i, 8)) for i in range(100)), 3)
    assert bytes(next(gen)[1]) == bytes(8)
    gen.close()
    assert not stream_threads()


def test_workers_run_torch_single_threaded_and_the_caller_keeps_its_count() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        with serial_workers(2) as pool:
            inside = {pool.submit(torch.get_num_threads).result() for _ in range(8)}
            # a parallel kernel in a worker must not read the default back in
            pool.submit(lambda: torch.ones(1 << 18).index_select(0, torch.arange(1 << 17)))
            inside |= {pool.submit(torch.get_num_threads).result() for _ in range(8)}
            assert inside == {1}
            assert torch.get_num_threads() == 3
            later: list[int] = []
            t = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
            t.start()
            t.join()
            assert later == [3]  # a thread started meanwhile gets the caller's default
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)


# --- the streamed save of dequantized weights ---------------------------------------------------


def quantized_dir(tmp_path: Path, scheme: str) -> Path:
    g = torch.Generator().manual_seed(7)
    sd: dict[str, torch.Tensor] = {"model.norm.weight": torch.randn(64, generator=g).bfloat16()}
    for i, shape in enumerate([(256, 256), (384, 128), (128, 512)]):
        w = torch.randn(shape, generator=g) * 3
        sd.update(tb.quantize(w, scheme, name=f"model.layers.{i}.mlp.weight"))
    d = tmp_path / scheme
    tb.save(sd, d / "model.safetensors")
    if scheme == "fp8-block":
        config = {"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}
        (d / "config.json").write_text(json.dumps(config))
    return d


SCHEMES = ["fp8-block", "mxfp8", "mxfp4", "nvfp4-modelopt"]


@pytest.mark.parametrize("scheme", SCHEMES)
def test_streamed_file_is_byte_identical_to_saving_whole_weights(
    tmp_path: Path, scheme: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every worker count and chunking writes the bytes that dequantizing each whole weight
    (no pipeline) and saving it writes; small pieces and tasks make many of each, so
    tasks of several tensors are in flight at once."""
    d = quantized_dir(tmp_path, scheme)
    opts = {} if scheme == "fp8-block" else {"scheme": scheme}
    whole = tb.load(d, dequantize="bf16", framework="torch", **opts)
    assert len(whole) == 4
    tb.save(whole, tmp_path / "ref.safetensors")
    ref = (tmp_path / "ref.safetensors").read_bytes()
    monkeypatch.setattr(base, "PIECE_ELEMENTS", 4096)
    before = torch.get_num_threads()
    try:
        for threads, chunk in ((1, 1 << 20), (2, 1), (3, 20_000)):
            torch.set_num_threads(threads)
            monkeypatch.setattr("tensorbridge.io.safetensors.STREAM_CHUNK", chunk)
            out = tmp_path / f"streamed-{threads}.safetensors"
            with tb.open(d, dequantize="bf16", **opts) as f:  # as convert --dequantize does
                values = {n: f.stream_value(n) for n in f}  # type: ignore[attr-defined]
                assert sum(isinstance(v, Deferred) for v in values.values()) == 3
                tb.save(values, out)
            assert out.read_bytes() == ref, (threads, chunk)
    finally:
        torch.set_num_threads(before)
    assert not stream_threads()


class Failing(Deferred):
    """A computed tensor whose task ``bad`` raises (or whose producer raises there)."""

    def __init__(self, n: int, bad: int, in_producer: bool = False) -> None:
        self.shape, self.row = (n,), tb.resolve_dtype("uint8")
        self.bad, self.in_producer = bad, in_producer

    def tasks(self, chunk_bytes: int) -> Iterator[Task]:
        for i in range(self.shape[0] // 1000):
            if i == self.bad and self.in_producer:
                raise tb.QuantizationError(f"producer failed at {i}")
            yield self.fill(i)

    def fill(self, i: int) -> Task:
        def run(slot: Slot) -> memoryview:
            if i == self.bad:
                raise tb.QuantizationError(f"task {i} failed")
            buf = slot.reserve(1000)
            buf[:1000] = i
            return buf[:1000].data

        return run


@pytest.mark.parametrize("in_producer", [False, True])
def test_an_error_mid_stream_leaves_no_file_and_no_thread(
    tmp_path: Path, in_producer: bool
) -> None:
    out = tmp_path / "m.safetensors"
    values = {"a": np.arange(10, dtype=np.int32), "b": Failing(50_000, 30, in_producer)}
    where = "producer failed at 30" if in_producer else "task 30 failed"
    with pytest.raises(tb.QuantizationError, match=where):
        tb.save(values, out)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no file, no temporary
    assert not stream_threads()
    out.write_bytes(b"previous")  # and an existing file is left as it was
    with pytest.raises(tb.QuantizationError):
        tb.save(values, out, overwrite=True)
    assert out.read_bytes() == b"previous"
    assert not stream_threads()


def test_a_computed_tensor_is_written_whole() -> None:
    """``Deferred.chunks`` (for writers without the pipeline) runs the same tasks."""
    ok = Failing(5000, bad=-1)
    assert b"".join(bytes(c) for c in ok.chunks(1 << 20)) == b"".join(
        bytes([i]) * 1000 for i in range(5)
    )
    assert not stream_threads()


def test_module_doctests() -> None:
    import doctest

    from tensorbridge import _pipeline

    failures, tried = doctest.testmod(_pipeline)
    assert tried >= 2 and failures == 0

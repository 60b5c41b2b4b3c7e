"""Special files and links: every reader opens regular files only, and stays in its checkpoint.

A FIFO, ``/dev/zero``, a socket or a directory in place of any file a reader opens (the
file given, a shard, an index, a Zarr ``zarr.json`` or chunk, a DCP ``.metadata`` or
``.distcp``, a quantized checkpoint's ``config.json``) is refused with a
:class:`~tensorbridge.FormatError` without blocking or reading without end; a link that
leads out of the checkpoint's directory is refused with :class:`~tensorbridge.LinkError`
unless ``follow_links=True``, and links of a Hugging Face cache snapshot into its
``blobs`` are followed.

The special-file cases run in one child process (a FIFO that blocked would hang the
suite): each case under ``signal.alarm``, the child under a timeout.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge._files import Links, open_regular, read_limited
from tensorbridge.quant import read_config

# --- checkpoints of every reader, and where each opens a file ----------------------------------


def _safetensors(d: Path) -> Path:
    tb.save({"w": np.arange(4, dtype=np.float32)}, d / "model.safetensors")
    return d / "model.safetensors"


def _sharded(d: Path) -> Path:
    tensors = {"a": np.zeros(4, np.float32), "b": np.ones(4, np.float32)}
    tb.save(tensors, f"{d}/", max_shard_size=16)
    return d


def _npy(d: Path) -> Path:
    tb.save(np.arange(3), d / "a.npy")
    return d / "a.npy"


def _npz(d: Path) -> Path:
    tb.save({"x": np.arange(3)}, d / "a.npz")
    return d / "a.npz"


def _pt(d: Path) -> Path:
    tb.save({"x": torch.arange(3)}, d / "a.pt")
    return d / "a.pt"


def _gguf(d: Path) -> Path:
    tb.save({"w": np.zeros(4, np.float32)}, d / "m.gguf", metadata={"general.architecture": "x"})
    return d / "m.gguf"


def _zarr(d: Path) -> Path:
    pytest.importorskip("zarr", reason="Zarr stores need zarr (pip install tensorbridge[zarr])")
    tb.save({"w": np.arange(4, dtype=np.float32)}, d / "s.zarr")
    return d / "s.zarr"


def _dcp(d: Path) -> Path:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torch.distributed is disabled": one process
        dcp.save({"w": torch.ones(2), "step": 3}, checkpoint_id=d / "ck", no_dist=True)
    return d / "ck"


def _quantized(d: Path) -> Path:
    tb.save({"w": np.zeros(4, np.float32)}, d / "model.safetensors")
    (d / "config.json").write_text('{"quantization_config": {"quant_method": "fp8"}}')
    return d


# case id -> (builder, the file replaced (relative to the built checkpoint's directory,
# "" for the path given), options for tb.load)
_CASES: dict[str, tuple[Callable[[Path], Path], str, dict[str, Any]]] = {
    "safetensors": (_safetensors, "", {}),
    "safetensors-in-directory": (_safetensors, "model.safetensors", {"dir": True}),
    "shard": (_sharded, "model-00002-of-00002.safetensors", {}),
    "index": (_sharded, "model.safetensors.index.json", {}),
    "npy": (_npy, "", {}),
    "npz": (_npz, "", {}),
    "pt": (_pt, "", {}),
    "gguf": (_gguf, "", {}),
    "zarr-group-json": (_zarr, "zarr.json", {}),
    "zarr-array-json": (_zarr, "w/zarr.json", {}),
    "zarr-chunk": (_zarr, "w/c/0", {}),
    "dcp-metadata": (_dcp, ".metadata", {}),
    "dcp-distcp": (_dcp, "__0_0.distcp", {}),
    "config-json": (_quantized, "config.json", {"dequantize": "bf16"}),
}
_KINDS = ("fifo", "zero", "socket", "directory")


def _replace(path: Path, kind: str) -> None:
    """Put a special file of ``kind`` where ``path`` was."""
    if path.is_dir():
        shutil.rmtree(path)
    else:
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "zero":
        os.symlink("/dev/zero", path)
    elif kind == "directory":
        path.mkdir()
    else:  # a bound socket leaves its file; a relative name keeps under sun_path's 108 bytes
        here = os.getcwd()
        os.chdir(path.parent)
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.bind(path.name)
        finally:
            os.chdir(here)


_CHILD = textwrap.dedent(
    """
    import json, signal, sys, warnings
    import tensorbridge as tb

    class Hung(Exception):
        pass

    def alarm(*_):
        raise Hung("blocked")

    signal.signal(signal.SIGALRM, alarm)
    warnings.simplefilter("ignore")
    out = {}
    for case in json.loads(sys.argv[1]):
        signal.alarm(20)
        try:
            tb.load(case["path"], **case["options"])
            out[case["id"]] = ["ok", ""]
        except BaseException as err:
            out[case["id"]] = [type(err).__name__, str(err)]
        finally:
            signal.alarm(0)
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def special_results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """Every (reader, file, kind) case, read once in a child process: {id: [class, message]}."""
    cases = []
    for cid, (build, rel, case_options) in _CASES.items():
        for kind in _KINDS:
            for follow in (False, True):
                if (kind == "directory" and not rel) or (follow and kind != "zero"):
                    continue  # a directory given is a checkpoint directory: another path
                d = tmp_path_factory.mktemp(f"{cid}-{kind}")
                top = build(d)
                opts = dict(case_options)
                given = top
                if opts.pop("dir", False):
                    given = top.parent
                target = (top if top.is_dir() else top.parent) / rel if rel else top
                _replace(target, kind)
                if follow:
                    opts["follow_links"] = True
                name = f"{cid}-{kind}" + ("-follow" if follow else "")
                cases.append({"id": name, "path": str(given), "options": opts})
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(cases)],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results: dict[str, list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    return results


_WHAT = {
    "fifo": "is a FIFO (named pipe), not a regular file",
    "zero": "is a character device, not a regular file",
    "socket": "is a socket, not a regular file",
    "directory": "is a directory, not a regular file",
}


@pytest.mark.parametrize("kind", _KINDS)
@pytest.mark.parametrize("case", list(_CASES))
def test_special_files_are_refused_without_blocking(
    special_results: dict[str, list[str]], case: str, kind: str
) -> None:
    if kind == "directory" and not _CASES[case][1]:
        pytest.skip(reason="a directory given is read as a checkpoint directory")
    cls, message = special_results[f"{case}-{kind}"]
    inside = bool(_CASES[case][1]) and not _CASES[case][2].get("dir")
    if kind == "zero" and (inside or _CASES[case][2].get("dir")):
        # a file the checkpoint names, linked to /dev/zero: a link out of it
        assert cls == "LinkError", (cls, message)
        assert "is a link to /dev/zero" in message
        assert "follow_links=True" in message and "--follow-links" in message
        cls, message = special_results[f"{case}-{kind}-follow"]
    if case == "config-json":
        assert cls == "QuantizationError", (cls, message)
    elif kind == "directory" and case in ("safetensors-in-directory", "index", "dcp-metadata"):
        # a directory is searched for files: one of that name is no candidate
        assert cls in ("FileNotFoundError", "UncommittedCheckpointError"), (cls, message)
        return
    else:
        assert cls == "FormatError", (cls, message)
    assert _WHAT[kind] in message, message


# --- links -------------------------------------------------------------------------------------


def _link_out(target_dir: Path, file: Path) -> None:
    """Move ``file`` into ``target_dir`` and leave a link to it in its place."""
    target_dir.mkdir(exist_ok=True)
    moved = target_dir / file.name
    shutil.move(file, moved)
    os.symlink(moved, file)


def _link_in(file: Path) -> None:
    """Move ``file`` into a subdirectory beside it, with a relative link in its place."""
    sub = file.parent / "real"
    sub.mkdir(exist_ok=True)
    shutil.move(file, sub / file.name)
    os.symlink(Path("real") / file.name, file)


def _assert_link_error(err: pytest.ExceptionInfo[tb.LinkError], name: str) -> None:
    message = str(err.value)
    assert name in message and "outside the checkpoint's directory" in message
    assert "follow_links=True" in message and "--follow-links" in message


def test_a_shard_linked_out_of_the_checkpoint_is_refused_unless_followed(tmp_path: Path) -> None:
    d = _sharded(tmp_path / "ck")
    shard = d / "model-00001-of-00002.safetensors"
    _link_out(tmp_path / "elsewhere", shard)
    with pytest.raises(tb.LinkError) as err:
        tb.open(d)
    _assert_link_error(err, shard.name)
    with pytest.raises(tb.LinkError):
        tb.io.safetensors.open(d / "model.safetensors.index.json")
    got = tb.load(d, follow_links=True)
    assert got["a"].tolist() == [0.0] * 4 and got["b"].tolist() == [1.0] * 4


def test_links_that_stay_inside_are_followed(tmp_path: Path) -> None:
    d = _sharded(tmp_path / "ck")
    _link_in(d / "model-00001-of-00002.safetensors")
    _link_in(d / "model.safetensors.index.json")
    assert tb.load(d)["a"].tolist() == [0.0] * 4
    store = _zarr(tmp_path)
    _link_in(store / "w" / "c" / "0")
    assert tb.load(store)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_the_path_given_may_be_a_link_anywhere(tmp_path: Path) -> None:
    real = _safetensors(tmp_path / "real")
    (tmp_path / "mine").mkdir()
    os.symlink(real, tmp_path / "mine" / "w.safetensors")
    assert tb.load(tmp_path / "mine" / "w.safetensors")["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
    os.symlink(real.parent, tmp_path / "linked-dir")  # a directory given as a link: its own
    assert tb.load(tmp_path / "linked-dir")["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_directory_whose_file_links_out_is_refused(tmp_path: Path) -> None:
    f = _safetensors(tmp_path / "ck")
    _link_out(tmp_path / "elsewhere", f)
    with pytest.raises(tb.LinkError) as err:
        tb.open(tmp_path / "ck")
    _assert_link_error(err, "model.safetensors")
    assert tb.load(tmp_path / "ck", follow_links=True)["w"].shape == (4,)


@pytest.mark.parametrize("rel", ["w/c/0", "w/zarr.json", "zarr.json"])
def test_zarr_files_linked_out_are_refused(tmp_path: Path, rel: str) -> None:
    store = _zarr(tmp_path)
    _link_out(tmp_path / "elsewhere", store / rel)
    with pytest.raises(tb.LinkError) as err:
        tb.load(store)
    _assert_link_error(err, Path(rel).name)
    assert tb.load(store, follow_links=True)["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("name", [".metadata", "__0_0.distcp"])
def test_dcp_files_linked_out_are_refused(tmp_path: Path, name: str) -> None:
    d = _dcp(tmp_path)
    _link_out(tmp_path / "elsewhere", d / name)
    with pytest.raises(tb.LinkError) as err:
        tb.load(d)
    _assert_link_error(err, name)
    assert tb.load(d, follow_links=True)["w"].tolist() == [1.0, 1.0]


def test_a_config_linked_out_is_refused(tmp_path: Path) -> None:
    d = _quantized(tmp_path / "ck")
    _link_out(tmp_path / "elsewhere", d / "config.json")
    with pytest.raises(tb.LinkError) as err:
        tb.open(d, dequantize="bf16")
    _assert_link_error(err, "config.json")
    with pytest.raises(tb.LinkError):
        read_config(d)
    assert read_config(d, follow_links=True) is not None


def test_a_gguf_split_shard_linked_out_is_refused(tmp_path: Path) -> None:
    from tensorbridge.io._gguf_header import SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS

    d = tmp_path / "ck"
    for i in range(2):
        meta: dict[str, Any] = {
            SPLIT_NO: np.uint16(i),
            SPLIT_COUNT: np.uint16(2),
            SPLIT_TENSORS: np.int32(2),
            "general.architecture": "x",
        }
        tb.save(
            {f"w{i}": np.zeros(4, np.float32)}, d / f"m-{i + 1:05d}-of-00002.gguf", metadata=meta
        )
    _link_out(tmp_path / "elsewhere", d / "m-00002-of-00002.gguf")
    with pytest.raises(tb.LinkError) as err:
        tb.open(d / "m-00001-of-00002.gguf")
    _assert_link_error(err, "m-00002-of-00002.gguf")
    assert sorted(tb.load(d / "m-00001-of-00002.gguf", follow_links=True)) == ["w0", "w1"]


# --- the Hugging Face cache --------------------------------------------------------------------


def _hf_cache(tmp_path: Path) -> Path:
    """A cache as huggingface_hub lays it out: snapshots/<rev>/<file> -> ../../blobs/<hash>."""
    src = _sharded(tmp_path / "download")
    (src / "config.json").write_text('{"quantization_config": {"quant_method": "fp8"}}')
    repo = tmp_path / "hub" / "models--org--name"
    snapshot = repo / "snapshots" / ("0123abcd" * 5)
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(snapshot.name)
    for i, f in enumerate(sorted(src.iterdir())):
        blob = repo / "blobs" / f"{i:040x}"
        shutil.move(f, blob)
        os.symlink(Path("..") / ".." / "blobs" / blob.name, snapshot / f.name)
    return snapshot


def test_a_hugging_face_cache_snapshot_reads_by_default(tmp_path: Path) -> None:
    snapshot = _hf_cache(tmp_path)
    for given in (snapshot, snapshot / "model.safetensors.index.json"):
        got = tb.load(given)
        assert got["a"].tolist() == [0.0] * 4 and got["b"].tolist() == [1.0] * 4
    assert read_config(snapshot) is not None
    # a link out of the cache repository is still refused
    os.unlink(snapshot / "model-00002-of-00002.safetensors")
    outside = _safetensors(tmp_path / "elsewhere")
    os.symlink(outside, snapshot / "model-00002-of-00002.safetensors")
    with pytest.raises(tb.LinkError, match="Hugging Face cache repository"):
        tb.open(snapshot)


def test_huggingface_hub_sees_the_cache_the_test_builds(tmp_path: Path) -> None:
    hub = pytest.importorskip("huggingface_hub", reason="checks the layout with huggingface_hub")
    from huggingface_hub.file_download import _create_symlink

    snapshot = _hf_cache(tmp_path)
    # huggingface_hub's own link maker, as hf_hub_download calls it for a new blob
    blob = snapshot.parent.parent / "blobs" / ("f" * 40)
    blob.write_text('{"architectures": ["X"]}')
    _create_symlink(str(blob), str(snapshot / "generation_config.json"), new_blob=False)
    assert not os.path.isabs(os.readlink(snapshot / "generation_config.json"))
    info = hub.scan_cache_dir(tmp_path / "hub")
    (repo,) = info.repos
    assert repo.repo_id == "org/name"
    files = {f.file_name for r in repo.revisions for f in r.files}
    assert {"model.safetensors.index.json", "config.json", "generation_config.json"} <= files
    assert tb.load(snapshot)["b"].tolist() == [1.0] * 4


# --- the primitive ----------------------------------------------------------------------------


def test_reads_are_bounded_by_the_bytes_got(tmp_path: Path) -> None:
    p = tmp_path / "c.json"
    p.write_bytes(b"x" * 100)
    assert read_limited(p, 100, "config") == b"x" * 100
    with pytest.raises(tb.FormatError, match="over 99 bytes, the limit of any config"):
        read_limited(p, 99, "config")
    with open_regular(p) as f:
        assert os.get_blocking(f.fileno())  # O_NONBLOCK cleared once the type is checked
        assert f.read() == b"x" * 100


def test_links_confine_to_the_checkpoint_directory(tmp_path: Path) -> None:
    (tmp_path / "ck").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "f").write_bytes(b"1")
    os.symlink(tmp_path / "other", tmp_path / "ck" / "sub")  # a directory on the way
    links = Links.of(tmp_path / "ck")
    with pytest.raises(tb.LinkError, match="is a link to"):
        links.check(tmp_path / "ck" / "sub" / "f")
    assert (
        Links.of(tmp_path / "ck", follow=True).read(tmp_path / "ck" / "sub" / "f", 8, "x") == b"1"
    )


def test_the_command_line_refuses_a_link_out_and_follows_it_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tensorbridge.cli import main

    d = _sharded(tmp_path / "ck")
    _link_out(tmp_path / "elsewhere", d / "model-00002-of-00002.safetensors")
    assert main(["inspect", str(d)]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "--follow-links" in err
    assert main(["inspect", "--follow-links", str(d)]) == 0
    assert "model-00002-of-00002.safetensors" not in capsys.readouterr().err
    out = tmp_path / "out.safetensors"
    assert main(["convert", str(d), str(out)]) == 1
    assert "--follow-links" in capsys.readouterr().err
    assert main(["convert", "--follow-links", "-q", str(d), str(out)]) == 0
    assert tb.load(out)["b"].tolist() == [1.0] * 4

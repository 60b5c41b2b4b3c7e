"""The format registry: every row's claims hold, one save signature, one dotted-name rule."""

from __future__ import annotations

import doctest
import importlib
import inspect
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge._keys import flatten
from tensorbridge._tensorfile import StoredBits
from tensorbridge.cli import main
from tensorbridge.errors import FormatError, UnsupportedTensorError
from tensorbridge.io import TensorFile, destination
from tensorbridge.io._detect import detect
from tensorbridge.io._formats import FORMATS, Format, by_kind, by_suffix, listing
from tensorbridge.io._formats import by_name as format_named

WRITABLE = [f for f in FORMATS if f.writes]


def by_name(f: Format) -> str:
    return f.name


def required(fmt: Format) -> dict[str, str]:
    """The metadata a format's files must hold (GGUF's general.architecture)."""
    return {key: "test" for key in fmt.required_metadata}


# the module an extra installs, where it is not named like the extra
_EXTRA_MODULE = {"hdf5": "h5py"}


@pytest.fixture(autouse=True)
def _extras_installed(request: pytest.FixtureRequest) -> None:
    """A format whose optional library is missing is skipped, not failed."""
    fmt = getattr(request.node, "callspec", None) and request.node.callspec.params.get("fmt")
    if isinstance(fmt, Format) and fmt.extra:
        module = _EXTRA_MODULE.get(fmt.extra, fmt.extra)
        pytest.importorskip(module, reason=f"pip install tensorbridge[{fmt.extra}]")


def two(fmt: Format) -> dict[str, np.ndarray]:
    return {"a": np.arange(6, dtype=np.float32), "b": np.ones(3, ml_dtypes.bfloat16)}


# --- the table itself -------------------------------------------------------------------------


def test_rows_are_consistent() -> None:
    suffixes = [s for f in FORMATS for s in f.suffixes]
    kinds = [k for f in FORMATS for k in f.kinds]
    assert len(suffixes) == len(set(suffixes)) and len(kinds) == len(set(kinds))
    assert all(s.startswith(".") and s == s.lower() for s in suffixes)
    names = [f.name for f in FORMATS]
    assert names == [
        "safetensors",
        "npy",
        "npz",
        "pt",
        "gguf",
        "zarr",
        "hdf5",
        "dcp",
        "npy-dir",
        "onnx",
    ]
    for f in FORMATS:
        assert f.single_array or f.many_arrays, f.name
        assert not f.text_metadata or f.metadata, f.name
        assert by_kind(f.kinds[0]) is f
        # a suffix names each format but a directory whose files are its entries
        assert by_suffix(f.suffixes[0].upper()) is f if f.suffixes else f.file_per_entry
        assert not f.file_per_entry or (f.directory and f.in_directory and not f.writes)
        assert repr(f) == f"<Format {f.name}>"


@pytest.mark.parametrize("fmt", FORMATS, ids=by_name)
def test_reader_is_a_tensor_file_in_the_named_module(fmt: Format) -> None:
    assert issubclass(fmt.reader, TensorFile)  # type: ignore[arg-type]
    # defined in the named module, or in a module of the named package (io/gguf/reader.py)
    assert fmt.reader.__module__ in (fmt.module, f"{fmt.module}.reader")
    if not fmt.writes:  # read-only (DCP): saving to it is refused, naming what is written
        with pytest.raises(FormatError, match="does not write"):
            fmt.save  # noqa: B018
        return
    assert fmt.save is importlib.import_module(fmt.module).save


@pytest.mark.parametrize("fmt", WRITABLE, ids=by_name)
def test_every_save_has_the_one_signature(fmt: Format) -> None:
    params = list(inspect.signature(fmt.save).parameters.values())
    assert [(p.name, p.kind) for p in params[:2]] == [
        ("tensors", inspect.Parameter.POSITIONAL_OR_KEYWORD),
        ("path", inspect.Parameter.POSITIONAL_OR_KEYWORD),
    ]
    rest = params[2:]
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in rest)
    common = {p.name: p.default for p in rest[:3]}
    assert common == {"float_dtype": None, "metadata": None, "progress": None}
    assert all(p.default is not inspect.Parameter.empty for p in rest)  # options are optional


def test_listing_follows_the_table_order() -> None:
    metadata_suffixes = ".safetensors or .pt or .gguf or .zarr or .h5 or .onnx"
    many_suffixes = ".safetensors / .npz / .pt / .gguf / .zarr / .h5 / .onnx"
    assert listing(lambda f: f.metadata, " or ") == metadata_suffixes
    assert listing(lambda f: f.many_arrays) == many_suffixes
    assert listing(lambda f: False) == ""


# --- each claim, checked by behaviour ----------------------------------------------------------


@pytest.mark.parametrize("fmt", WRITABLE, ids=by_name)
def test_many_arrays(fmt: Format, tmp_path: Path) -> None:
    path = tmp_path / f"x{fmt.suffixes[0]}"
    if not fmt.many_arrays:
        with pytest.raises(UnsupportedTensorError, match=r"holds one array"):
            tb.save(two(fmt), path)
        assert not path.exists()
        return
    tb.save(two(fmt), path, metadata=required(fmt))
    got = tb.load(path)
    assert list(got) == ["a", "b"]
    assert got["b"].dtype == ml_dtypes.bfloat16 and got["b"].tobytes() == two(fmt)["b"].tobytes()


@pytest.mark.parametrize("fmt", WRITABLE, ids=by_name)
def test_single_array(fmt: Format, tmp_path: Path) -> None:
    path = tmp_path / f"x{fmt.suffixes[0]}"
    a = np.arange(4, dtype=np.int16)
    if not fmt.single_array:
        with pytest.raises(TypeError, match=r"expected a mapping"):
            tb.save(a, path)
        return
    tb.save(a, path)
    got = tb.load(path)
    assert isinstance(got, np.ndarray) and got.tobytes() == a.tobytes()
    with tb.open(path) as f:
        assert f.single and f.keys() == ["x"]


@pytest.mark.parametrize("fmt", WRITABLE, ids=by_name)
def test_metadata(fmt: Format, tmp_path: Path) -> None:
    path = tmp_path / f"x{fmt.suffixes[0]}"
    data: Any = two(fmt) if fmt.many_arrays else np.zeros(2)
    if not fmt.metadata:
        with pytest.raises(ValueError, match=r"no place for metadata; save to .safetensors or"):
            tb.save(data, path, metadata={"epoch": 3})
        assert not path.exists()
        return
    tb.save(data, path, metadata={**required(fmt), "epoch": 3})
    with tb.open(path) as f:
        assert f.metadata["epoch"] == "3"
        assert f.plain_values()["epoch"] == ("3" if fmt.text_metadata else 3)


def test_every_save_checks_its_destination_in_one_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``tb.save``, ``quantize_checkpoint`` and ``convert`` ask ``Destination.check`` (the
    rules live there once): the same refusal, in Python's words and in convert's."""
    from tensorbridge.io import Destination

    seen: list[dict[str, Any]] = []
    check = Destination.check

    def spy(self: Destination, **given: Any) -> None:
        seen.append({k: v for k, v in given.items() if v})
        check(self, **given)

    monkeypatch.setattr(Destination, "check", spy)
    src = tmp_path / "m.safetensors"
    tb.save({"l.weight": np.ones((4, 64), np.float32)}, src, metadata={"who": "me"})
    assert seen.pop() == {"metadata": {"who": "me"}}
    python = (
        "max_shard_size= needs a .safetensors destination (or a directory); '.npz' files are "
        "not sharded (save to a .safetensors path or a directory)"
    )
    with pytest.raises(tb.InvalidArgumentError) as e:
        tb.save({"w": np.ones(2)}, tmp_path / "o.npz", max_shard_size="1KB")
    assert str(e.value) == python and seen.pop() == {"max_shard_size": "1KB"}
    assert main(["convert", str(src), str(tmp_path / "o.npz"), "--max-shard-size", "1KB"]) == 2
    assert capsys.readouterr().err == (
        "tensorbridge convert: error: "
        + python.replace("max_shard_size=", "--max-shard-size")
        + "\n"
    )
    assert seen.pop() == {"max_shard_size": "1KB"}
    assert main(["convert", str(src), str(tmp_path / "o.npz"), "--quantize", "mxfp4"]) == 2
    assert seen.pop() == {"scheme": "mxfp4"}
    assert "--quantize mxfp4: tensorbridge writes the schemes'" in capsys.readouterr().err
    with pytest.raises(tb.InvalidArgumentError, match=r"^scheme='mxfp4': tensorbridge writes"):
        tb.quantize_checkpoint(src, tmp_path / "o.npz", "mxfp4")
    assert seen.pop() == {"scheme": "mxfp4"}
    assert main(["convert", str(src), str(src), "-q"]) == 1  # exists: no usage error
    assert capsys.readouterr().err == (
        f"tensorbridge convert: error: {src} exists; pass --overwrite to replace it\n"
    )
    assert not seen.pop()
    assert not seen and not (tmp_path / "o.npz").exists()


@pytest.mark.parametrize("fmt", WRITABLE, ids=by_name)
def test_sharding(fmt: Format, tmp_path: Path) -> None:
    path = tmp_path / f"x{fmt.suffixes[0]}"
    data: Any = two(fmt) if fmt.many_arrays else np.zeros(2)
    if not fmt.sharding:
        with pytest.raises(ValueError, match=r"are not sharded \(save to a .safetensors path"):
            tb.save(data, path, max_shard_size=8)
        return
    tb.save(data, path, max_shard_size=8)
    index = destination(path).index
    assert index.exists() and not path.exists()
    assert list(tb.load(index)) == ["a", "b"]


@pytest.mark.parametrize("fmt", WRITABLE, ids=by_name)
def test_memory_map(fmt: Format, tmp_path: Path) -> None:
    path = tmp_path / f"x{fmt.suffixes[0]}"
    data = two(fmt) if fmt.many_arrays else np.arange(6, dtype=np.float32)
    tb.save(data, path, metadata=required(fmt))
    with tb.open(path) as f:
        name = f.keys()[0]
        first, again = f[name], f[name]
        assert not first.flags.writeable
        # a mapped file hands out views of one mapping; a file read into memory, new copies
        assert np.shares_memory(first, again) is fmt.memory_map
        owned = f.get(name, mmap=False)
        assert owned.flags.writeable and not np.shares_memory(owned, first)


@pytest.mark.parametrize("fmt", WRITABLE, ids=by_name)
def test_raw_dtype(fmt: Format, tmp_path: Path) -> None:
    path = tmp_path / f"x{fmt.suffixes[0]}"
    data = two(fmt) if fmt.many_arrays else np.arange(6, dtype=np.float32)
    tb.save(data, path, metadata=required(fmt))
    if fmt.raw_dtype:
        with tb.open(path, dtype="bf16") as f:  # no raw member here: the dtypes stay
            assert f.info(f.keys()[0])[0].name == "float32"
        return
    with pytest.raises(ValueError, match=r"an ml_dtypes array was saved as \(.npy / .npz / .h5\)"):
        tb.open(path, dtype="bf16")


@pytest.mark.parametrize("fmt", WRITABLE, ids=by_name)
@pytest.mark.parametrize("float_dtype", [None, "f32"])
def test_stored_bits(fmt: Format, float_dtype: str | None, tmp_path: Path) -> None:
    """A row that states ``stored_bits`` takes a file's bfloat16 bytes as ``StoredBits``
    and writes what the array gives, cast or not; every other row is given the array."""
    src = tmp_path / "src.safetensors"
    tb.save(two(fmt), src)
    with tb.open(src) as f:
        values = {n: tb.io.copied_value(f, n, fmt) for n in f}
        assert isinstance(values["b"], StoredBits) is fmt.stored_bits
        assert isinstance(values["a"], np.ndarray)  # a NumPy dtype: the mapped array
        arrays = {n: f[n] for n in f}
    if not fmt.stored_bits:
        return
    out, want = tmp_path / f"bits{fmt.suffixes[0]}", tmp_path / f"arrays{fmt.suffixes[0]}"
    pick = (lambda d: d) if fmt.many_arrays else (lambda d: d["b"])
    tb.save(pick(values), out, float_dtype=float_dtype, metadata=required(fmt))
    tb.save(pick(arrays), want, float_dtype=float_dtype, metadata=required(fmt))
    assert out.read_bytes() == want.read_bytes()


@pytest.mark.parametrize("fmt", WRITABLE, ids=by_name)
def test_suffix_and_kind(fmt: Format, tmp_path: Path) -> None:
    for suffix in fmt.suffixes:
        path = tmp_path / f"x{suffix}"
        assert destination(path).format is fmt
        tb.save(two(fmt) if fmt.many_arrays else np.zeros(2), path, metadata=required(fmt))
        assert by_kind(detect(path)) is fmt
        with tb.open(path) as f:
            assert f.notes == [] and isinstance(f, fmt.reader)  # type: ignore[arg-type]
    other = next(f for f in WRITABLE if f is not fmt)
    renamed = (tmp_path / f"x{fmt.suffixes[0]}").rename(tmp_path / f"y{other.suffixes[0]}")
    with tb.open(renamed) as f:
        assert f.notes[0] == (
            f"{renamed.name} is {fmt.description}, not {other.description}; read it as such "
            f"(rename it to y{fmt.suffixes[0]})"
        )


def test_a_read_only_format_is_refused_as_a_destination(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tensorbridge.io import _formats

    npz = _formats.by_name("npz")
    read_only = Format(**{**npz.__dict__, "name": "npz-ro", "writes": False})
    monkeypatch.setitem(_formats._BY_SUFFIX, ".npz", read_only)
    with pytest.raises(FormatError, match=r"reads a .npz archive but does not write one; use "):
        destination(tmp_path / "x.npz")
    with pytest.raises(FormatError, match=r"does not write one; save to .safetensors or"):
        read_only.save  # noqa: B018


def test_a_directory_opens_what_tensorbridge_writes_into_one(tmp_path: Path) -> None:
    """A directory of .npy files (convert --format npy) is one checkpoint, a file an
    entry; a directory holding one .npz opens it; model files rank before both."""
    arrays = tmp_path / "arrays"
    arrays.mkdir()
    tb.save(np.arange(3, dtype=np.int16), arrays / "model.layers.0.w.npy")
    tb.save(np.ones(2, ml_dtypes.bfloat16), arrays / "b.npy")
    (arrays / "README").write_text("not an array")
    assert detect(arrays) == "npy-dir"
    with tb.open(arrays) as f:
        assert isinstance(f, format_named("npy-dir").reader)  # type: ignore[arg-type]
        assert f.keys() == ["b", "model.layers.0.w"] and f.info("b")[0].name == "bfloat16"
        assert f.get("model.layers.0.w", framework="torch").tolist() == [0, 1, 2]
    with pytest.raises(KeyError, match=r"'c' is not in this file; its keys are \['b', "):
        tb.load(arrays, keys=["c"])
    packed = tmp_path / "packed"
    packed.mkdir()
    tb.save({"x": np.zeros(2)}, packed / "weights.npz")
    assert list(tb.load(packed)) == ["x"]
    tb.save({"y": torch.ones(1)}, packed / "pytorch_model.bin")  # a model file ranks first
    assert list(tb.load(packed)) == ["y"]
    tb.save({"z": np.ones(1)}, arrays / "model.safetensors")
    assert list(tb.load(arrays)) == ["z"]
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "x.npy").write_bytes(b"\x93NUMPY\x01\x00")  # validated when opened
    with pytest.raises(FormatError, match=r"x.npy': truncated"):
        tb.open(tmp_path / "bad")


# --- one dotted-name rule ----------------------------------------------------------------------


def test_flatten_names_and_leaves() -> None:
    size = torch.Size([2, 3])
    tree = {"enc": {"layers": [{"w": 1}, (2, 3)]}, "size": size, 7: "x", "empty": {}}
    assert flatten(tree, where="t") == {
        "enc.layers.0.w": 1,
        "enc.layers.1.0": 2,
        "enc.layers.1.1": 3,
        "size": size,  # a tuple subclass is a leaf
        "7": "x",
    }
    with pytest.raises(FormatError, match=r"^t: two entries flatten to the key 'a.b'; rename"):
        flatten({"a.b": 1, "a": {"b": 2}}, where="t")


def test_save_and_pt_read_name_nesting_the_same_way(tmp_path: Path) -> None:
    w = [torch.zeros(2), torch.ones(2)]
    tree = {"model": {"layers": w}, "head": {"b": torch.full((1,), 2.0)}}
    for suffix in (".safetensors", ".npz", ".pt"):
        tb.save(tree, tmp_path / f"nested{suffix}")
        got = tb.load(tmp_path / f"nested{suffix}")
        assert sorted(got) == ["head.b", "model.layers.0", "model.layers.1"], suffix
        assert got["model.layers.1"].tolist() == [1.0, 1.0]
    torch.save(tree, tmp_path / "theirs.pt")  # torch's own nesting, read by the same rule
    assert list(tb.load(tmp_path / "theirs.pt")) == ["model.layers.0", "model.layers.1", "head.b"]


def test_save_refuses_two_tensors_of_one_name(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    with pytest.raises(FormatError, match=r"two entries flatten to the key 'a.b'"):
        tb.save({"a.b": torch.zeros(1), "a": {"b": torch.ones(1)}}, path)
    assert not path.exists()
    with pytest.raises(TypeError, match=r"at 'a.0': str is not a tensor or array"):
        tb.save({"a": ["text"]}, path)


# --- the command line asks the formats ----------------------------------------------------------


def test_cli_messages_come_from_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src.safetensors"
    tb.save(two(by_suffix(".npz")), src, metadata={"who": "me"})  # type: ignore[arg-type]
    assert main(["convert", str(src), str(tmp_path / "o.npy")]) == 2
    err = capsys.readouterr().err
    assert "a .npy file holds one array but 2 tensors were selected" in err
    assert "write .safetensors / .npz / .pt / .gguf" in err
    assert main(["convert", str(src), str(tmp_path / "o.npz"), "--max-shard-size", "1KB"]) == 2
    assert "--max-shard-size needs a .safetensors destination" in capsys.readouterr().err
    assert main(["convert", str(src), str(tmp_path / "o.npz")]) == 0
    assert capsys.readouterr().err == (
        "note: dropped metadata who: .npz files have no place for it (convert to "
        ".safetensors or .pt or .gguf or .zarr or .h5 or .onnx to keep it; --no-metadata leaves it "
        "out "
        "without this note)\n"
    )
    assert main(["convert", str(src), str(tmp_path / "o.npz"), "--overwrite", "-q"]) == 0
    assert main(["convert", str(src), str(tmp_path / "o.npz"), "--overwrite", "--no-metadata"]) == 0
    assert capsys.readouterr().err == ""
    assert main(["convert", str(src), str(tmp_path / "a.npy"), "--include", "a", "--verify"]) == 0
    assert "verify: bit-exact" in capsys.readouterr().out


@pytest.mark.parametrize(
    "module",
    [
        "tensorbridge.io._detect",
        "tensorbridge.io._formats",
        "tensorbridge._keys",
        "tensorbridge.io.assemble",
        "tensorbridge.io.dcp",
        "tensorbridge.io.dcp.reader",
        "tensorbridge.io.npz",
    ],
)
def test_docstring_examples_run(module: str) -> None:
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0


# --- the low-precision rows: the docs' table of which format holds which ------------------------

_DOCS = Path(__file__).resolve().parent.parent / "docs" / "formats.md"
_HOLDS_SUFFIX = {
    "`.npy` / `.npz`": (".npy", ".npz"),
    "safetensors": (".safetensors",),
    "`.pt`": (".pt",),
    "GGUF": (".gguf",),
    "Zarr `data_type`": (".zarr",),
}


def _cells(name: str) -> dict[str, str]:
    """docs/formats.md's table row of ``name``: column -> cell."""
    text = _DOCS.read_text(encoding="utf-8")
    table = text[text.index("<!-- tb:low-precision-formats") :].split("\n\n")[0]
    lines = table.splitlines()[1:]
    header = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    return {r[0]: dict(zip(header[1:], r[1:], strict=True)) for r in rows}.get(name, {})


def _holds_table() -> dict[str, dict[str, str]]:
    """docs/formats.md's table: dtype -> column -> the cell's first word ("yes" / "no")."""
    names = [r.name for r in tb.dtype_table() if not r.kernels]
    table = {n: {k: c.split()[0] for k, c in _cells(n).items()} for n in names}
    return {n: cells for n, cells in table.items() if cells}


def test_the_docs_table_names_every_new_row() -> None:
    assert set(_holds_table()) == {r.name for r in tb.dtype_table() if not r.kernels}


@pytest.mark.parametrize("name", sorted(_holds_table()))
def test_every_format_holds_or_refuses_a_new_row_as_the_docs_say(tmp_path: Path, name: str) -> None:
    """Held: every byte value back, from NumPy and (where torch has the type) from torch.
    Not held: refused before anything is written, naming .npy / .npz."""
    pytest.importorskip("zarr", reason="pip install tensorbridge[zarr]")
    row = tb.resolve_dtype(name)
    a = np.arange(256, dtype=np.uint8)[: 64 * row.itemsize].view(row.numpy).reshape(4, -1)
    sources = (a, tb.to_torch(a)) if row.in_torch else (a,)
    for column, cell in _holds_table()[name].items():
        for suffix in _HOLDS_SUFFIX[column]:
            path = tmp_path / f"m{suffix}"
            options = {"metadata": {"general.architecture": "x"}} if suffix == ".gguf" else {}
            for value in sources:
                saved = value if suffix == ".npy" else {"w": value}  # .npy: one array
                if cell == "yes":
                    tb.save(saved, path, overwrite=True, **options)
                    got = tb.load(path) if suffix == ".npy" else tb.load(path)["w"]
                    want = a.view(np.uint8)
                    if "packed" in _cells(name)[column]:  # F4: a value's own 4 bits only
                        want = want & 0x0F
                    assert got.dtype == row.numpy and got.tobytes() == want.tobytes(), suffix
                    continue
                assert cell == "no", (name, column, cell)
                with pytest.raises(tb.UnsupportedDtypeError) as info:
                    tb.save(saved, path, **options)
                assert ".npy" in str(info.value) and ".npz" in str(info.value), str(info.value)
                assert not path.exists(), suffix

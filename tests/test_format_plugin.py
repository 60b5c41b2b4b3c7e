"""Formats are plug-ins: a format nobody here wrote is read, written, inspected, converted
and compared through the public registration alone, and the built-in formats register
through the same entry point group a third party's package uses.

The toy format lives in a package this test writes into a temporary directory (as a
third party's installed package would be): ``toyformat/__init__.py`` holds the row and
imports nothing heavy, ``toyformat/reader.py`` the reader and ``save``. A ``*.dist-info``
directory beside it declares the entry point, which :mod:`importlib.metadata` finds on
``sys.path`` as it finds an installed distribution's.
"""

from __future__ import annotations

import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import tensorbridge as tb
from tensorbridge.cli import main
from tensorbridge.errors import FormatError, InvalidArgumentError
from tensorbridge.io import Format, _formats, register_format, unregister_format

ROOT = Path(__file__).resolve().parents[1]

# the toy format's row: what a third party's package would hold in its light module
ROW = """
from tensorbridge.io import Format

TOY = Format(
    "toy",
    "toyformat.reader",
    "ToyFile",
    "a toy tensor file",
    suffixes=(".toy",),
    kinds=("toy",),
    magic=b"TOYTENSORS\\n",
    keeps="tensors by name; no metadata",
)
"""

# the toy format's module: a magic line, then one line per tensor (name, dtype, shape, hex)
READER = """
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

import tensorbridge as tb
from tensorbridge.errors import FormatError
from tensorbridge.io import TensorFile

MAGIC = b"TOYTENSORS\\n"


class ToyFile(TensorFile):
    def __init__(self, path: "str | os.PathLike[str]") -> None:
        super().__init__()
        self.path = Path(path)
        data = self.path.read_bytes()
        if not data.startswith(MAGIC):
            raise FormatError(f"{self.path} is not a toy tensor file (no TOYTENSORS line)")
        self._entries = {}
        for line in data[len(MAGIC):].decode().splitlines():
            name, dtype, shape, payload = line.split("\\t")
            row = tb.resolve_dtype(dtype)
            dims = tuple(int(n) for n in shape.split(",") if n)
            self._entries[name] = (row, dims, bytes.fromhex(payload))

    def keys(self) -> list[str]:
        return list(self._entries)

    def info(self, name: str) -> Any:
        row, shape, _ = self._entries[name]
        return row, shape

    def _array(self, name: str, *, copy_on_write: bool) -> np.ndarray:
        row, shape, payload = self._entries[name]
        a = np.frombuffer(payload, dtype=row.numpy).reshape(shape)
        return a.copy() if copy_on_write else a


def open(path: "str | os.PathLike[str]") -> ToyFile:
    return ToyFile(path)


def save(
    tensors: Mapping[str, Any],
    path: "str | os.PathLike[str]",
    *,
    float_dtype: Any = None,
    metadata: Any = None,
    progress: Any = None,
) -> None:
    if metadata:
        raise ValueError("a toy file has no place for metadata")
    lines = [MAGIC]
    for name, value in tensors.items():
        a = tb.to_numpy(value)
        if float_dtype is not None and tb.resolve_dtype(a.dtype).is_floating:
            a = tb.to_numpy(value, dtype=float_dtype)
        row = tb.resolve_dtype(a.dtype)
        shape = ",".join(map(str, a.shape))
        lines.append(f"{name}\\t{row.name}\\t{shape}\\t{a.tobytes().hex()}\\n".encode())
    Path(path).write_bytes(b"".join(lines))
"""


def metadata_dir(where: Path, name: str, entry_points: dict[str, str]) -> None:
    """A ``NAME-0.1.dist-info`` that declares ``entry_points`` in tensorbridge.formats."""
    info = where / f"{name}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    lines = [f"{k} = {v}" for k, v in entry_points.items()]
    text = "[tensorbridge.formats]\n" + "\n".join(lines) + "\n"
    (info / "entry_points.txt").write_text(text)


@pytest.fixture
def site(tmp_path: Path) -> Iterator[Path]:
    """A directory on ``sys.path`` holding the toy package; the normal table afterwards."""
    where = tmp_path / "site"
    (where / "toyformat").mkdir(parents=True)
    (where / "toyformat" / "__init__.py").write_text(textwrap.dedent(ROW))
    (where / "toyformat" / "reader.py").write_text(textwrap.dedent(READER))
    sys.path.insert(0, str(where))
    try:
        yield where
    finally:
        sys.path.remove(str(where))
        for m in [m for m in sys.modules if m.split(".")[0] == "toyformat"]:
            del sys.modules[m]
        _formats._rediscover()  # the table every other test sees
    assert [f.name for f in _formats.FORMATS] == [f.name for f in _formats.BUILTIN]


@pytest.fixture
def toy(site: Path) -> Iterator[Format]:
    """The toy format, registered from code for the test and taken back after it."""
    from toyformat import TOY  # type: ignore[import-not-found]

    register_format(TOY)
    try:
        yield TOY
    finally:
        unregister_format(TOY)
    assert _formats.by_suffix(".toy") is None


def arrays() -> dict[str, np.ndarray]:
    import ml_dtypes

    return {
        "w": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.array([1.5, -2.0], ml_dtypes.bfloat16),
        "step": np.array(7, np.int64),
    }


def same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> bool:
    return sorted(got) == sorted(want) and all(  # safetensors sorts its names
        got[k].dtype == want[k].dtype
        and got[k].shape == want[k].shape
        and got[k].tobytes() == want[k].tobytes()
        for k in want
    )


# --- the toy format through the public API and the command line --------------------------------


def test_open_load_save(toy: Format, tmp_path: Path) -> None:
    path = tmp_path / "m.toy"
    tb.save(arrays(), path)
    assert path.read_bytes().startswith(b"TOYTENSORS\n")
    assert same(tb.load(path), arrays())
    with tb.open(path) as f:
        assert type(f).__name__ == "ToyFile" and f.keys() == ["w", "b", "step"]
        assert f.get("w", framework="torch").tolist() == [[0, 1, 2], [3, 4, 5]]
    renamed = path.rename(tmp_path / "m.bin")  # read as what its bytes are
    with tb.open(renamed) as f:
        assert f.notes == ["m.bin is a toy tensor file, not a torch zip archive; read it as "
                           "such (rename it to m.toy)"]  # fmt: skip
    with pytest.raises(InvalidArgumentError, match=r"'.toy' files have no place for metadata"):
        tb.save(arrays(), tmp_path / "x.toy", metadata={"a": "b"})


def test_inspect_convert_compare(
    toy: Format, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = tmp_path / "src.safetensors"
    tb.save(arrays(), src)
    out = tmp_path / "out.toy"
    assert main(["convert", str(src), str(out), "--verify"]) == 0
    assert "verify: bit-exact" in capsys.readouterr().out
    assert same(tb.load(out), arrays())

    assert main(["inspect", str(out), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    text = json.dumps(doc)
    assert "w" in text and "bfloat16" in text

    back = tmp_path / "back.safetensors"
    assert main(["convert", str(out), str(back)]) == 0
    capsys.readouterr()
    assert same(tb.load(back), arrays())

    assert main(["compare", str(out), str(src)]) == 0
    capsys.readouterr()
    changed = {**arrays(), "w": arrays()["w"] + 1}
    tb.save(changed, tmp_path / "other.toy")
    assert main(["compare", str(out), str(tmp_path / "other.toy")]) == 1
    assert "w" in capsys.readouterr().out


def test_registration_is_checked_and_undone(toy: Format) -> None:
    assert _formats.by_name("toy") is toy and _formats._origin["toy"] == "register_format"
    assert [f.name for f in _formats.FORMATS][-1] == "toy"  # after the built-ins (order 100)
    clash = Format("toy2", "toyformat.reader", "ToyFile", "x", suffixes=(".npz",), kinds=("t2",))
    with pytest.raises(InvalidArgumentError, match=r"a registered format has the suffix '.npz'"):
        register_format(clash)
    with pytest.raises(InvalidArgumentError, match=r"has the name 'toy', the suffix '.toy'"):
        register_format(toy)
    with pytest.raises(InvalidArgumentError, match=r"no format 'toy2' is registered"):
        unregister_format("toy2")


# --- discovery through entry points -------------------------------------------------------------


def test_a_third_party_format_is_found_through_its_entry_point(site: Path, tmp_path: Path) -> None:
    metadata_dir(site, "toyformat", {"toy": "toyformat:TOY"})
    _formats._rediscover()
    assert "toyformat.reader" not in sys.modules  # discovery imports the row only
    fmt = _formats.by_suffix(".toy")
    assert fmt is not None and _formats._origin["toy"] == "toyformat"
    tb.save({"x": np.arange(3)}, tmp_path / "x.toy")
    assert "toyformat.reader" in sys.modules  # imported when first used
    assert tb.load(tmp_path / "x.toy")["x"].tolist() == [0, 1, 2]


def test_a_broken_entry_point_is_skipped_with_a_warning(site: Path) -> None:
    metadata_dir(site, "brokenformat", {"broken": "no_such_module:ROW"})
    with pytest.warns(RuntimeWarning, match=r"entry point 'broken' of brokenformat failed"):
        _formats._rediscover()
    assert "broken" not in [f.name for f in _formats.FORMATS]


def test_the_built_in_formats_register_through_their_entry_points(site: Path) -> None:
    """The package's own metadata (as pyproject.toml declares it, re-installed) names every
    built-in row; without it (stale or absent metadata) they are registered directly."""
    tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    ours = declared[_formats.ENTRY_POINT_GROUP]
    assert [_formats.by_name(n) for n in ours] == list(_formats.BUILTIN)
    metadata_dir(site, "tensorbridge", ours)  # shadows the installed metadata
    _formats._rediscover()
    assert {_formats._origin[f.name] for f in _formats.BUILTIN} == {"tensorbridge"}
    assert list(_formats.FORMATS) == list(_formats.BUILTIN)
    (site / "tensorbridge-0.1.dist-info" / "entry_points.txt").write_text("")  # stale
    _formats._rediscover()
    assert {_formats._origin[f.name] for f in _formats.BUILTIN} == {"direct"}
    assert list(_formats.FORMATS) == list(_formats.BUILTIN)


def test_every_format_module_load_is_the_one_generic_load() -> None:
    from tensorbridge.io import gguf, npy, npz, pt, safetensors, zarr
    from tensorbridge.io._common import loader

    generic = loader(npy.open, None).__code__
    for module in (npy, npz, gguf, safetensors, pt, zarr):
        assert module.load.__module__ in (module.__name__, f"{module.__name__}.reader")
        assert module.load.__code__ is generic  # one function body
        assert module.load.__doc__


def test_a_format_that_states_no_capability_refuses_to_provide_it() -> None:
    npz = _formats.by_name("npz")
    with pytest.raises(FormatError, match=r"a .npz archive has no metadata_value"):
        npz.metadata_value(1, "uint8")
    assert _formats.by_name("gguf").metadata_value(3, "uint64") == 3


def test_save_options_are_the_save_signature() -> None:
    import inspect

    for fmt in _formats.FORMATS:
        if fmt.writes:
            params = list(inspect.signature(fmt.save).parameters)[5:]
            assert tuple(params) == fmt.save_options, fmt.name

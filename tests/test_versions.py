"""Each version flag in tensorbridge._versions, checked against the library it describes.

Every test runs on whichever side of the line the installed stack is and asserts that
side's behaviour, so a flag that is wrong anywhere fails on that stack (``.ci/compat``
runs the suite on the newest releases and on the declared floors).
"""

from __future__ import annotations

import doctest
import warnings
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge import _versions

# the ml_dtypes types torch has kernels for: NumPy 2.5 imports them through DLPack
EXTENDED = [r for r in tb.dtype_table() if r.carried and r.kernels]
# torch's sub-byte integers ml_dtypes has: DLPack has no code for them
SUBBYTE = [r for r in tb.dtype_table() if r.in_torch and not r.kernels]


def test_docstring_examples_run() -> None:
    result = doctest.testmod(_versions)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize(
    ("text", "expected"),
    [("2.15.0+cu132", (2, 15, 0)), ("1.24.0", (1, 24, 0)), ("2.5.0rc1", (2, 5, 0)), ("x", ())],
)
def test_release_reads_the_numeric_part(text: str, expected: tuple[int, ...]) -> None:
    assert _versions.release(text) == expected


def test_versions_are_the_installed_ones() -> None:
    numpy_release = tuple(int(p) for p in np.__version__.split(".")[:2])
    assert _versions.NUMPY[:2] == numpy_release
    assert _versions.TORCH[:2] == tuple(int(p) for p in torch.__version__.split(".")[:2])
    assert _versions.ML_DTYPES[:2] == tuple(int(p) for p in ml_dtypes.__version__.split(".")[:2])


def test_numpy_maxdims_is_the_largest_rank_numpy_makes() -> None:
    n = _versions.NUMPY_MAXDIMS
    assert np.empty((1,) * n).ndim == n
    with pytest.raises(ValueError, match="dimension"):
        np.empty((1,) * (n + 1))


@pytest.mark.parametrize("row", EXTENDED, ids=lambda r: r.name)
def test_numpy_dlpack_extended_says_what_np_from_dlpack_does(row: tb.DTypeRow) -> None:
    t = torch.zeros(4, dtype=row.carrier).view(row.torch)
    if _versions.NUMPY_DLPACK_EXTENDED:
        a = np.from_dlpack(t)
        assert a.dtype == row.numpy and a.ctypes.data == t.data_ptr()
    else:
        with pytest.raises((RuntimeError, BufferError), match="Unsupported dtype in DLTensor"):
            np.from_dlpack(t)


@pytest.mark.parametrize("row", SUBBYTE, ids=lambda r: r.name)
def test_torch_exports_its_sub_byte_integers_as_bytes_on_every_stack(row: tb.DTypeRow) -> None:
    # aten/src/ATen/DLConvertor.cpp: int1-int7 say kDLInt 8, uint1-uint7 kDLUInt 8
    t = torch.arange(16, dtype=torch.uint8).view(row.torch)
    a = np.from_dlpack(t)
    assert a.dtype == (np.int8 if row.category == "int" else np.uint8)
    assert a.ctypes.data == t.data_ptr()


def test_torch_dlpack_read_only_says_what_dunder_dlpack_takes() -> None:
    t = torch.ones(3)
    if _versions.TORCH_DLPACK_READ_ONLY:
        capsule = t.__dlpack__(max_version=(1, 0), read_only=True)
        assert "dltensor_versioned" in repr(capsule)
    else:
        with pytest.raises(TypeError, match="read_only"):
            t.__dlpack__(read_only=True)  # type: ignore[call-arg]


def _load_sparse(path: Path) -> list[str]:
    """The warnings a restricted torch.load of a file with a sparse entry raises."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = torch.load(path, weights_only=True)
    assert loaded["sp"].layout is torch.sparse_coo
    return [str(w.message) for w in caught]


def test_quiet_sparse_validation_silences_only_torchs_validation_warning(tmp_path: Path) -> None:
    path = tmp_path / "s.pt"
    torch.save({"sp": torch.eye(2).to_sparse()}, path)
    warns = _versions.TORCH >= (2, 15)  # torch 2.15 announces the check it runs
    assert any(_versions.TORCH_SPARSE_VALIDATION_WARNING in m for m in _load_sparse(path)) is warns
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with _versions.quiet_sparse_validation():
            torch.load(path, weights_only=True)
            warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["another warning"]


def test_torch_e4m3fn_saturates_says_what_the_cast_does() -> None:
    x = torch.tensor([float("inf"), -1e6, 500.0, 448.0])
    got = x.to(torch.float8_e4m3fn).float()
    saturates = _versions.torch_e4m3fn_saturates()
    if saturates:
        assert got.tolist() == [448.0, -448.0, 448.0, 448.0]
    else:
        assert got[:3].isnan().all() and got[3] == 448.0
    assert saturates is (_versions.TORCH >= (2, 13))  # the release where it changed
    r = tb.cast_report(x, "float8_e4m3fn")
    assert (r.saturated, r.nan_created) == ((3, 0) if saturates else (0, 3))


def test_numpy_read_only_dlpack_export_matches_the_flag() -> None:
    frozen = np.zeros(2)
    frozen.flags.writeable = False
    if _versions.NUMPY_DLPACK_READ_ONLY:
        assert frozen.__dlpack__(max_version=(1, 0)) is not None
        assert _versions.NUMPY >= (2, 1)
    else:
        with pytest.raises((TypeError, BufferError)):
            frozen.__dlpack__(max_version=(1, 0))

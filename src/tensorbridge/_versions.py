"""What differs between the supported releases of NumPy, torch and ml_dtypes, decided once.

tensorbridge runs on every release from the floors in ``pyproject.toml`` to the newest
(``.ci/compat`` runs the test suite on both ends). Where those releases behave
differently, the difference is a flag here, computed once at import from the installed
versions or from the feature itself, and every other module asks this one instead of
looking at a version. The tests check each flag against the library it describes
(tests/test_versions.py), on whichever side of the line the installed stack is.

(Which dtypes exist is the dtype table's business: a row whose dtype the installed torch
or ml_dtypes lacks is left out when :mod:`tensorbridge.dtypes` builds the table, from
the names :func:`ml_dtypes_exports` reads.)

The torch flags (``TORCH``, ``TORCH_DLPACK_READ_ONLY``) and the ml_dtypes ones
(``ML_DTYPES``, ``NUMPY_DLPACK_EXTENDED``) are computed when first asked for, so that
the modules which read files without torch (about 2.7 s to import) or ml_dtypes (about
0.8 s) can ask this one too.

>>> release("2.15.0+cu132")
(2, 15, 0)
>>> from tensorbridge._versions import TORCH
>>> TORCH >= (2, 4)
True
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

__all__ = [
    "ML_DTYPES",
    "NUMPY",
    "NUMPY_DLPACK_EXTENDED",
    "NUMPY_MAXDIMS",
    "TORCH",
    "TORCH_DLPACK_READ_ONLY",
    "TORCH_SPARSE_VALIDATION_WARNING",
    "byte_bounds",
    "literal_all",
    "ml_dtypes_exports",
    "ml_dtypes_module",
    "quiet_sparse_validation",
    "release",
    "torch_e4m3fn_saturates",
]


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string, without local or pre-release parts.

    >>> release("2.5.0rc1"), release("0.7.0")
    ((2, 5, 0), (0, 7, 0))
    """
    m = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in m.group().split(".")) if m else ()


NUMPY = release(np.__version__)

# The largest rank of a NumPy array (NPY_MAXDIMS): 64 from NumPy 2.0, 32 before.
NUMPY_MAXDIMS = 64 if NUMPY >= (2,) else 32


def ml_dtypes_module() -> ModuleType:
    """``ml_dtypes``, imported on first use: about 0.8 s, its extension's start-up (it
    registers its types with NumPy). The dtype table imports it through this."""
    return importlib.import_module("ml_dtypes")


@cache
def ml_dtypes_exports() -> frozenset[str]:
    """The names the installed ml_dtypes exports, without importing it where it is not
    imported yet.

    Every release of ml_dtypes (0.2.0 to 0.7.0 read, the floor 0.5 among them) lists its
    types in ``__all__`` in ``ml_dtypes/__init__.py`` and imports each from its extension
    there (a name it lacks fails the import itself), so that list,
    read from the source as a literal (:func:`ast.literal_eval`: nothing of it runs), is
    what the module holds. The module's own ``__all__`` answers where it is imported
    already, or where the source cannot be read (a zip without sources) or holds no
    literal list.
    """
    module = sys.modules.get("ml_dtypes")
    if module is None:
        spec = importlib.util.find_spec("ml_dtypes")
        get_source = getattr(spec.loader, "get_source", None) if spec else None
        try:
            source = get_source("ml_dtypes") if get_source else None
        except (ImportError, OSError):
            source = None
        names = literal_all(source or "")
        if names is not None:
            return names
        module = ml_dtypes_module()
    return frozenset(getattr(module, "__all__", dir(module)))


def literal_all(source: str) -> frozenset[str] | None:
    """The module-level ``__all__ = [...]`` of Python ``source`` read as a literal, or None
    (no such list, or not a literal, or not Python).

    >>> sorted(literal_all("__all__ = ['b', 'a']"))
    ['a', 'b']
    """
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return None
    for node in body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == [
            "__all__"
        ]:
            try:
                return frozenset(ast.literal_eval(node.value))
            except ValueError:
                return None
    return None


def _ml_dtypes_flags() -> dict[str, Any]:
    ml_dtypes = ml_dtypes_module()
    version = release(ml_dtypes.__version__)
    return {
        "ML_DTYPES": version,
        # np.from_dlpack imports bfloat16, the float8 family and complex32 as ml_dtypes
        # arrays from NumPy 2.5 with ml_dtypes 0.7; before, it raises "Unsupported dtype
        # in DLTensor." for them, and those dtypes must go through torch's importer and
        # the dtype table.
        "NUMPY_DLPACK_EXTENDED": NUMPY >= (2, 5) and version >= (0, 7),
    }


def _numpy_exports_read_only() -> bool:
    frozen = np.zeros(1)
    frozen.flags.writeable = False
    try:
        frozen.__dlpack__(max_version=(1, 0))
    except (TypeError, BufferError):
        return False
    return True


# ndarray.__dlpack__ speaks DLPack 1.0 (max_version=, the read-only flag) from NumPy 2.1;
# before, it takes no keywords and refuses to export a read-only array at all (BufferError).
NUMPY_DLPACK_READ_ONLY = _numpy_exports_read_only()


def _torch_flags() -> dict[str, Any]:
    import torch

    return {
        "TORCH": release(str(torch.__version__)),
        # Tensor.__dlpack__ takes read_only= from torch 2.14, so an exported capsule can
        # carry DLPack's read-only flag; before, the flag cannot be asked for.
        "TORCH_DLPACK_READ_ONLY": "read_only"
        in inspect.signature(torch.Tensor.__dlpack__).parameters,
    }


if TYPE_CHECKING:  # computed (importing torch, ml_dtypes) when first asked for, by __getattr__
    TORCH: tuple[int, ...]
    TORCH_DLPACK_READ_ONLY: bool
    ML_DTYPES: tuple[int, ...]
    NUMPY_DLPACK_EXTENDED: bool


def __getattr__(name: str) -> Any:
    if name in ("TORCH", "TORCH_DLPACK_READ_ONLY"):
        globals().update(_torch_flags())
        return globals()[name]
    if name in ("ML_DTYPES", "NUMPY_DLPACK_EXTENDED"):
        globals().update(_ml_dtypes_flags())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@cache
def torch_e4m3fn_saturates() -> bool:
    """Whether torch's casts to float8_e4m3fn saturate overflow and ±inf to ±448.

    They do from torch 2.13; torch 2.12 and older make NaN there, as ml_dtypes does.
    tensorbridge casts with torch's kernel either way (every other float8, bfloat16 and
    float16 cast is the same from torch 2.10 to 2.15). Probed with one cast, on first use
    (a first torch op costs milliseconds, too much for every import).

    >>> from tensorbridge._versions import TORCH
    >>> torch_e4m3fn_saturates() == (TORCH >= (2, 13))
    True
    """
    import torch

    return float(torch.tensor([1e6]).to(torch.float8_e4m3fn).float()[0]) == 448.0


# torch 2.15 validates every sparse tensor that torch.load(weights_only=True) reads and
# warns that it does ("an O(nnz) scan"). Validating an untrusted file is what the readers
# want, so they silence this one warning (older torch raises no such warning).
# NumPy 2.0 moved ``byte_bounds`` to ``numpy.lib.array_utils`` and removed ``np.byte_bounds``
byte_bounds = (
    np.lib.array_utils.byte_bounds  # type: ignore[attr-defined,unused-ignore]
    if hasattr(np.lib, "array_utils")
    else np.byte_bounds  # type: ignore[attr-defined,unused-ignore]
)

TORCH_SPARSE_VALIDATION_WARNING = "Validating sparse tensor invariants because weights_only=True"


@contextmanager
def quiet_sparse_validation() -> Iterator[None]:
    """Run a ``torch.load(weights_only=True)`` without torch 2.15's sparse-validation warning.

    Also a decorator. Every other warning still reaches the caller.

    >>> with quiet_sparse_validation():
    ...     pass
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=re.escape(TORCH_SPARSE_VALIDATION_WARNING), category=UserWarning
        )
        yield

"""The conversion plan: one decision per value signature, reported as it is run."""

from __future__ import annotations

import ast
import pathlib
import warnings
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import tensorbridge as tb
from tensorbridge import _plan
from tensorbridge.dtypes import PACKED

SRC = pathlib.Path(tb.__file__).parent


def bits(a: Any) -> bytes:
    return bytes(np.ascontiguousarray(a).view(np.uint8).tobytes())


@pytest.fixture
def fresh_plans() -> Any:
    _plan.forget()
    before = _plan.decisions[0]
    yield lambda: _plan.decisions[0] - before
    _plan.forget()


def test_a_tree_decides_once_per_leaf_signature(fresh_plans: Any) -> None:
    kinds = [
        lambda: torch.randn(4),
        lambda: torch.randn(4).to(torch.bfloat16),
        lambda: torch.arange(3),
    ]
    sd = {f"l{i}": kinds[i % 3]() for i in range(1000)}

    out = tb.tree_to_numpy(sd)
    assert fresh_plans() == 3
    assert all(np.shares_memory(out[k], tb.to_numpy(v)) for k, v in sd.items())

    cast = tb.tree_to_numpy(sd, float_dtype="float32")
    assert fresh_plans() == 4  # only the bfloat16 leaves change plan (a cast)
    assert cast["l1"].dtype == np.float32 and cast["l2"].dtype == np.int64


def test_plans_are_reused_for_values_of_one_signature(fresh_plans: Any) -> None:
    for n in range(1, 50):
        tb.to_numpy(torch.zeros(n, dtype=torch.bfloat16), dtype=np.float32)
        tb.to_torch(np.zeros(n, np.float32)[::-1])
    assert fresh_plans() == 2


FLAGGED = {
    "grad": lambda t: t.float().requires_grad_(),
    "neg": lambda t: torch._neg_view(t.float()),
    "conj": lambda t: t.to(torch.complex64).conj(),
    "view of grad": lambda t: t.float().requires_grad_()[1:],
}


@pytest.mark.parametrize("flag", FLAGGED, ids=str)
@pytest.mark.parametrize(
    "kwargs", [{}, {"copy": True}, {"dtype": "float32"}, {"readonly": True}], ids=repr
)
def test_a_quick_plan_never_serves_a_value_it_was_not_made_for(
    flag: str, kwargs: dict[str, Any], fresh_plans: Any
) -> None:
    plain = torch.arange(6.0)
    if flag == "conj" and "dtype" in kwargs:
        kwargs = {"dtype": "complex128"}
    tb.to_numpy(plain.to(torch.complex64) if flag == "conj" else plain, **kwargs)  # the quick plan
    x = FLAGGED[flag](plain)

    got = tb.to_numpy(x, **kwargs)
    _plan.forget()
    want = _plan.decide_numpy(x, kwargs.get("dtype"), kwargs.get("copy"), **_ro(kwargs)).run(
        x, None
    )

    assert got.dtype == want.dtype and bits(got) == bits(want)
    assert got.flags.writeable == want.flags.writeable


def test_a_quick_array_cast_serves_only_arrays_it_can_read(fresh_plans: Any) -> None:
    def base() -> np.ndarray:  # each leaf its own memory: no ties, so no staging
        return np.arange(24, dtype=np.float32)

    frozen = base()
    frozen.flags.writeable = False
    odd = np.ndarray((5,), np.float32, buffer=bytearray(64), strides=(6,))  # torch has none
    arrays = {
        "a plain": base(),  # first in order: its plan's quick serves the others
        "frozen": frozen,
        "reversed": base()[::-1],
        "strided": base()[::2],
        "transposed": base().reshape(4, 6).T,
        "odd strides": odd,
        "empty": base()[:0],
    }

    owners = {k: arrays[k] for k in ("a plain", "frozen")}  # provably apart: quick plans

    for tree in (owners, arrays):
        out = tb.tree_to_torch(tree, float_dtype="bfloat16")

        for k, a in tree.items():
            want = tb.to_torch(a, dtype=torch.bfloat16)  # the full plan of its own signature
            got = out[k]
            assert got.dtype == want.dtype and got.shape == want.shape
            assert got.stride() == want.stride() and torch.equal(got, want)
            assert a.size == 0 or not np.shares_memory(tb.to_numpy(got), a)


def _ro(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {"readonly": kwargs.get("readonly", False), "into": False}


def test_a_quick_view_refuses_other_devices_and_layouts() -> None:
    tb.to_numpy(torch.zeros(4))
    sparse = torch.eye(3).to_sparse()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pytest.importorskip("scipy", reason="sparse results need scipy")
    assert type(tb.to_numpy(sparse)).__name__ == "coo_array"
    with pytest.raises(tb.NoDataError, match="meta tensor"):
        tb.to_numpy(torch.zeros(4, device="meta"))


def test_describe_reports_the_plan_itself() -> None:
    conj = torch.zeros(2, dtype=torch.complex64).conj()
    d = tb.describe(conj)
    assert d.to_numpy.verdict == "copy" and d.to_numpy.steps == ("resolve",)
    assert tb.describe(torch.zeros(2)).to_numpy.steps == ("view",)
    ro = np.zeros(3, np.float32)
    ro.flags.writeable = False
    assert tb.describe(ro).to_torch.steps == ("copy",)
    grad = tb.describe(torch.zeros(2, requires_grad=True))
    assert grad.to_numpy.steps == ("detach", "view")


def test_plan_repr_names_steps_and_reason() -> None:
    p = _plan.plan_numpy(torch.zeros(2, dtype=torch.bfloat16), "float32")
    assert repr(p) == "Plan(to_numpy: cast (is bfloat16 and a cast to float32 makes new values))"


def test_copy_false_refusals_come_from_planning() -> None:
    with pytest.raises(tb.CopyRequiredError, match="is bfloat16 and a cast to float32"):
        _plan.plan_numpy(torch.zeros(2, dtype=torch.bfloat16), "float32", False)


# --- packed rows ---------------------------------------------------------------------------------


@pytest.mark.skipif(not PACKED, reason="this torch / ml_dtypes has no packed dtype")
@pytest.mark.parametrize("row", PACKED, ids=lambda r: r.name)
@given(data=st.binary(min_size=1, max_size=64))
def test_packed_rows_unpack_and_pack_every_byte(row: Any, data: bytes) -> None:
    packed = np.frombuffer(data, np.uint8).reshape(1, -1)
    values = row.unpack(packed)
    assert values.dtype == row.numpy and values.shape == (1, len(data) * row.per_byte)
    assert bits(row.pack(values)) == data
    first = packed[0, 0] & ((1 << row.bits) - 1)
    assert values.view(np.uint8)[0, 0] == first  # low bits first


@pytest.mark.skipif(not PACKED, reason="this torch / ml_dtypes has no packed dtype")
def test_packed_row_is_what_the_converters_use() -> None:
    row = PACKED[0]
    t = torch.tensor([0x21, 0x43], dtype=torch.uint8).view(row.torch)
    values = tb.to_numpy(t, dtype=row.numpy)
    assert values.view(np.uint8).tolist() == [1, 2, 3, 4]
    back = tb.to_torch(values, dtype=row.torch)
    assert back.view(torch.uint8).tolist() == [0x21, 0x43]
    assert row.numpy == np.dtype(ml_dtypes.float4_e2m1fn)


# --- module boundaries -----------------------------------------------------------------------


def _imports_of_private_names() -> list[str]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.ImportFrom):
                continue
            base = path.parent
            for _ in range(max(node.level - 1, 0)):
                base = base.parent
            where = base.joinpath(*(node.module or "").split(".")) if node.module else base
            for alias in node.names:
                name = alias.name
                if not name.startswith("_") or name.startswith("__"):
                    continue
                if (where / f"{name}.py").exists() or (where / name).is_dir():
                    continue  # a private module itself, not a name inside one
                found.append(f"{path.relative_to(SRC)}: from {node.module} import {name}")
    return found


def test_no_module_imports_another_modules_underscore_names() -> None:
    assert _imports_of_private_names() == []

"""DLPack producers and capsules as inputs to ``tb.to_numpy`` / ``tb.to_torch``.

The producers here expose nothing but ``__dlpack__`` / ``__dlpack_device__`` (no NumPy
or torch type), forward another array's export and count the exports: a capsule can be
imported once, so a conversion calls ``__dlpack__`` once. Every dtype of the table is
checked for bits, dtype, shared memory and writability; JAX and MLX run when installed.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

import tensorbridge as tb
from conftest import ROWS, data_address, tensor_bytes
from tensorbridge._versions import NUMPY_DLPACK_READ_ONLY

VERSIONED = b"dltensor_versioned"
READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)
FLAGS_OFFSET = 8 + 2 * ctypes.sizeof(ctypes.c_void_p)  # after version, manager_ctx, deleter
# DLManagedTensorVersioned: flags, then DLTensor {data, device(8), ndim(4), dtype{u8,u8,u16}}
DEVICE_OFFSET = FLAGS_OFFSET + 8 + ctypes.sizeof(ctypes.c_void_p)
DTYPE_OFFSET = DEVICE_OFFSET + 8 + 4


def mark_read_only(capsule: Any) -> Any:
    """Set DLPack's read-only flag in a versioned capsule, as a read-only producer does."""
    flags = ctypes.c_uint64.from_address(_pointer(capsule, VERSIONED) + FLAGS_OFFSET)
    flags.value |= READ_ONLY
    return capsule


def flags_of(capsule: Any) -> int:
    return int(ctypes.c_uint64.from_address(_pointer(capsule, VERSIONED) + FLAGS_OFFSET).value)


class Producer:
    """A foreign array: exports ``inner``'s memory through DLPack only, and counts exports."""

    def __init__(self, inner: Any, *, read_only: bool = False) -> None:
        self._inner = inner
        self._read_only = read_only
        self.calls = 0
        self.kwargs: list[dict[str, Any]] = []

    def __dlpack__(
        self,
        *,
        stream: Any = None,
        max_version: tuple[int, int] | None = None,
        dl_device: Any = None,
        copy: bool | None = None,
    ) -> Any:
        self.calls += 1
        asked = {"stream": stream, "max_version": max_version, "dl_device": dl_device}
        self.kwargs.append({**asked, "copy": copy})
        forward = {k: v for k, v in asked.items() if v is not None and k != "stream"}
        capsule = self._inner.__dlpack__(**forward)
        if self._read_only and max_version is not None:
            mark_read_only(capsule)
        return capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return tuple(self._inner.__dlpack_device__())  # type: ignore[return-value]


class LegacyProducer:
    """A producer from before DLPack 1.0: no keywords, an unversioned capsule."""

    def __init__(self, inner: torch.Tensor) -> None:
        self._inner = inner
        self.calls = 0

    def __dlpack__(self, stream: Any = None) -> Any:
        self.calls += 1
        return self._inner.__dlpack__()

    def __dlpack_device__(self) -> tuple[int, int]:
        return tuple(self._inner.__dlpack_device__())  # type: ignore[return-value]


def exported(row: tb.DTypeRow) -> tb.DTypeRow:
    """The row DLPack carries for ``row``: torch exports its sub-byte integers (int4, ...)
    as int8 / uint8 (DLPack has no code for them), so a producer's import is that."""
    if row.in_torch and not row.kernels:
        return tb.resolve_dtype("int8" if row.category == "int" else "uint8")
    return row


def _tensor(patterns: np.ndarray) -> torch.Tensor:
    """A fresh tensor holding the patterns' bytes (built through bytes, not tensorbridge)."""
    u8 = torch.tensor(np.frombuffer(patterns.tobytes(), np.uint8))
    return u8.view(tb.resolve_dtype(patterns.dtype).torch)


# --- every dtype, writable producer --------------------------------------------------------------


def test_to_numpy_of_a_producer_shares_every_dtype_bit_exact(
    row: tb.DTypeRow, patterns: np.ndarray
) -> None:
    t = _tensor(patterns)
    p = Producer(t)

    a = tb.to_numpy(p)

    assert p.calls == 1
    assert a.dtype == exported(row).numpy and a.tobytes() == patterns.tobytes()
    assert data_address(a) == t.data_ptr() and a.flags.writeable
    a.view(np.uint8)[:1] = 1  # the shared memory: the producer sees the write
    assert tensor_bytes(t)[:1] == b"\x01"


def test_to_torch_of_a_producer_shares_every_dtype_bit_exact(
    row: tb.DTypeRow, patterns: np.ndarray
) -> None:
    t = _tensor(patterns)
    p = Producer(t)

    u = tb.to_torch(p)

    assert p.calls == 1
    assert type(u) is torch.Tensor and u.dtype is exported(row).torch
    assert tensor_bytes(u) == patterns.tobytes() and u.data_ptr() == t.data_ptr()


def test_the_newest_dlpack_version_torch_reads_is_requested() -> None:
    p = Producer(torch.arange(3.0))
    tb.to_numpy(p)
    (kwargs,) = p.kwargs
    assert kwargs["max_version"] is not None and kwargs["max_version"][0] == 1
    assert kwargs["max_version"] >= (1, 0) and kwargs["dl_device"] is None


@pytest.mark.parametrize("copy", [True, False])
def test_copy_true_is_independent_and_copy_false_shares(copy: bool) -> None:
    t = torch.arange(6.0, dtype=torch.bfloat16)
    p = Producer(t)

    a = tb.to_numpy(p, copy=copy)
    u = tb.to_torch(Producer(t), copy=copy)

    assert p.calls == 1
    assert (data_address(a) == t.data_ptr()) is not copy
    assert (u.data_ptr() == t.data_ptr()) is not copy
    assert a.tobytes() == tensor_bytes(t) == tensor_bytes(u)


def test_dtype_casts_with_torchs_kernel() -> None:
    t = torch.tensor([1.5, -2.25, float("nan"), 3e38], dtype=torch.float32)

    a = tb.to_numpy(Producer(t), dtype="bf16")
    u = tb.to_torch(Producer(t), dtype=torch.float8_e4m3fn)

    assert a.dtype == tb.numpy_dtype("bf16")
    assert a.tobytes() == tensor_bytes(t.to(torch.bfloat16))
    assert tensor_bytes(u) == tensor_bytes(t.to(torch.float8_e4m3fn))
    with pytest.raises(tb.CopyRequiredError, match="cast to bfloat16 makes new values"):
        tb.to_numpy(Producer(t), dtype="bf16", copy=False)


def test_readonly_out_device_and_requires_grad_follow_the_tensor_contract() -> None:
    t = torch.arange(4.0)
    ro = tb.to_numpy(Producer(t), readonly=True)
    assert not ro.flags.writeable and data_address(ro) == t.data_ptr()

    buf = np.zeros(4, np.float64)
    assert tb.to_numpy(Producer(t), out=buf) is buf and buf.tolist() == [0, 1, 2, 3]
    out = torch.zeros(4, dtype=torch.float16)
    assert tb.to_torch(Producer(t), out=out) is out and out.tolist() == [0, 1, 2, 3]

    on_cpu = tb.to_torch(Producer(t), device="cpu")
    assert on_cpu.data_ptr() == t.data_ptr()
    leaf = tb.to_torch(Producer(t), requires_grad=True)
    assert leaf.is_leaf and leaf.requires_grad and leaf.data_ptr() == t.data_ptr()


# --- read-only memory ---------------------------------------------------------------------------


def test_read_only_producer_gives_a_read_only_view(row: tb.DTypeRow, patterns: np.ndarray) -> None:
    t = _tensor(patterns)
    p = Producer(t, read_only=True)

    a = tb.to_numpy(p)

    assert p.calls == 1
    assert a.dtype == exported(row).numpy and a.tobytes() == patterns.tobytes()
    assert data_address(a) == t.data_ptr()  # still zero-copy
    assert not a.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        a.view(np.uint8)[0] = 1

    own = tb.to_numpy(Producer(t, read_only=True), copy=True)
    assert own.flags.writeable and data_address(own) != t.data_ptr()
    assert own.tobytes() == patterns.tobytes()


def test_read_only_producer_is_copied_into_a_tensor(row: tb.DTypeRow, patterns: np.ndarray) -> None:
    t = _tensor(patterns)
    raw = patterns.tobytes()
    p = Producer(t, read_only=True)

    u = tb.to_torch(p)

    assert p.calls == 1
    assert u.dtype is exported(row).torch and tensor_bytes(u) == raw
    assert u.data_ptr() != t.data_ptr()  # never a writable alias of read-only memory
    u.view(torch.uint8).fill_(7)
    assert tensor_bytes(t) == raw


def test_read_only_producer_with_copy_false_names_the_fix() -> None:
    p = Producer(torch.arange(3.0), read_only=True)

    with pytest.raises(tb.CopyRequiredError) as info:
        tb.to_torch(p, copy=False)

    assert p.calls == 1
    assert str(info.value) == (
        "to_torch(copy=False) cannot share memory: the input is read-only (its DLPack "
        "export marks it so), and a writable tensor must not alias it; pass copy=None to "
        "allow the copy"
    )
    shared = tb.to_numpy(Producer(torch.arange(3.0), read_only=True), copy=False)
    assert not shared.flags.writeable


def test_read_only_producer_into_out_and_with_a_cast_is_allowed() -> None:
    t = torch.arange(3.0)
    out = torch.empty(3)
    assert tb.to_torch(Producer(t, read_only=True), out=out) is out
    cast = tb.to_torch(Producer(t, read_only=True), dtype="f16")
    assert cast.dtype is torch.float16 and cast.tolist() == [0, 1, 2]
    wide = tb.to_numpy(Producer(t, read_only=True), dtype="f64")
    assert wide.flags.writeable  # a cast makes new memory


numpy_exports_read_only = pytest.mark.skipif(
    not NUMPY_DLPACK_READ_ONLY,
    reason="NumPy < 2.1 refuses to export a read-only array through DLPack",
)


@numpy_exports_read_only
def test_read_only_numpy_arrays_export_the_flag_and_are_honoured() -> None:
    a = np.arange(5.0)
    a.flags.writeable = False
    assert flags_of(a.__dlpack__(max_version=(1, 0))) & READ_ONLY  # NumPy marks it

    view = tb.to_numpy(Producer(a))
    t = tb.to_torch(Producer(a))

    assert not view.flags.writeable and np.shares_memory(view, a)
    assert t.data_ptr() != data_address(a) and t.tolist() == a.tolist()
    with pytest.raises(tb.CopyRequiredError, match="the input is read-only"):
        tb.to_torch(Producer(a), copy=False)


@numpy_exports_read_only
def test_torch_from_dlpack_writes_into_a_read_only_mmap_and_tensorbridge_does_not(
    tmp_path: Path,
) -> None:
    # torch.from_dlpack aliases np.load(mmap_mode='r') writably; a write then kills the
    # process (SIGSEGV). tb.to_torch copies instead. Both run in children.
    path = tmp_path / "w.npy"
    np.save(path, np.arange(1000.0))
    setup = f"""
        import numpy as np, torch, tensorbridge as tb
        class P:
            def __init__(self, a): self.a = a
            def __dlpack__(self, **kw): return self.a.__dlpack__(**kw)
            def __dlpack_device__(self): return self.a.__dlpack_device__()
        a = np.load({str(path)!r}, mmap_mode="r")
    """
    plain = "t = torch.from_dlpack(P(a)); t[0] = 1.0"
    ours = textwrap.dedent("""
        t = tb.to_torch(P(a)); t[0] = 1.0
        try:
            tb.to_torch(P(a), copy=False)
        except tb.CopyRequiredError as e:
            print("refused:", e)
        print("file", float(np.load(%r)[0]))
    """) % str(path)

    def run(body: str) -> subprocess.CompletedProcess[str]:
        code = textwrap.dedent(setup) + textwrap.dedent(body)
        env = {**os.environ, "PYTHONPATH": str(Path(tb.__file__).parent.parent)}
        return subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=tmp_path,  # where a core file of the crash would land
        )

    crashed = run(plain)
    assert crashed.returncode == (-11 if sys.platform == "linux" else crashed.returncode)
    assert crashed.returncode != 0  # SIGSEGV: a write into a read-only mapping
    safe = run(ours)
    assert safe.returncode == 0, safe.stderr
    assert "refused: to_torch(copy=False) cannot share memory: the input is read-only" in (
        safe.stdout
    )
    assert "file 0.0" in safe.stdout


# --- unversioned producers and raw capsules ------------------------------------------------------


def test_unversioned_producer_counts_as_read_only_like_np_from_dlpack() -> None:
    t = torch.arange(4, dtype=torch.bfloat16)
    p = LegacyProducer(t)

    a = tb.to_numpy(p)

    assert p.calls == 1  # the rejected max_version= call made no capsule
    assert a.dtype == tb.numpy_dtype("bf16") and data_address(a) == t.data_ptr()
    assert not a.flags.writeable
    assert not np.from_dlpack(LegacyProducer(torch.arange(2.0))).flags.writeable  # as NumPy

    u = tb.to_torch(LegacyProducer(t))
    assert u.data_ptr() != t.data_ptr() and torch.equal(u, t)
    with pytest.raises(tb.CopyRequiredError, match=r"unversioned DLPack export cannot mark"):
        tb.to_torch(LegacyProducer(t), copy=False)


def test_versioned_capsule_is_shared_and_consumed_once() -> None:
    t = torch.arange(4.0)
    capsule = t.__dlpack__(max_version=(1, 0))

    u = tb.to_torch(capsule)

    assert u.data_ptr() == t.data_ptr()
    assert "used_dltensor_versioned" in repr(capsule)
    with pytest.raises(tb.UnsupportedTensorError) as info:
        tb.to_numpy(capsule)
    assert str(info.value) == (
        "this DLPack capsule ('used_dltensor_versioned') was already imported, and a "
        "capsule can be imported once; pass the producing array itself, or a fresh "
        "x.__dlpack__()"
    )


def test_read_only_versioned_capsule_and_unversioned_capsule() -> None:
    t = torch.arange(4.0)
    ro = tb.to_numpy(mark_read_only(t.__dlpack__(max_version=(1, 0))))
    assert not ro.flags.writeable and data_address(ro) == t.data_ptr()
    legacy = tb.to_numpy(torch.utils.dlpack.to_dlpack(t))
    assert not legacy.flags.writeable and data_address(legacy) == t.data_ptr()
    with pytest.raises(tb.CopyRequiredError, match="the input is read-only"):
        tb.to_torch(mark_read_only(t.__dlpack__(max_version=(1, 0))), copy=False)


def test_a_capsule_that_is_not_dlpack_is_refused() -> None:
    make = ctypes.pythonapi.PyCapsule_New
    make.restype, make.argtypes = (
        ctypes.py_object,
        [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p],
    )
    other = make(ctypes.addressof(ctypes.c_int(1)), b"not_dlpack", None)
    with pytest.raises(tb.UnsupportedTensorError, match="PyCapsule named 'not_dlpack' is not"):
        tb.to_torch(other)


# --- what torch cannot import --------------------------------------------------------------------


def test_negative_strides_go_through_numpy_and_stay_shared_in_numpy() -> None:
    base = np.arange(12.0).reshape(3, 4)
    view = base[::-1, ::2]

    a = tb.to_numpy(Producer(view))
    assert np.shares_memory(a, base) and a.strides == view.strides
    assert np.array_equal(a, view)

    t = tb.to_torch(Producer(view))  # torch has no negative strides: one copy
    assert t.tolist() == view.tolist() and t.data_ptr() != data_address(view)
    with pytest.raises(tb.CopyRequiredError, match="negative strides"):
        tb.to_torch(Producer(view), copy=False)


class DeviceProducer:
    """Memory on a device torch cannot read (here Metal); copies itself to the host on request."""

    def __init__(self, host: torch.Tensor, *, can_copy: bool = True) -> None:
        self._host = host
        self._can_copy = can_copy
        self.kwargs: list[dict[str, Any]] = []

    def __dlpack__(self, **kwargs: Any) -> Any:
        self.kwargs.append(kwargs)
        if not self._can_copy or kwargs.get("dl_device") != (1, 0) or not kwargs.get("copy"):
            raise BufferError("cannot export Metal memory")
        return self._host.clone().__dlpack__(max_version=kwargs.get("max_version"))

    def __dlpack_device__(self) -> tuple[int, int]:
        return (8, 0)  # kDLMetal


def test_a_device_torch_cannot_read_is_asked_for_one_host_copy() -> None:
    host = torch.arange(4, dtype=torch.bfloat16)
    p = DeviceProducer(host)

    a = tb.to_numpy(p, copy=True)

    assert len(p.kwargs) == 1 and p.kwargs[0]["dl_device"] == (1, 0) and p.kwargs[0]["copy"]
    assert a.flags.writeable and a.tobytes() == tensor_bytes(host)
    assert data_address(a) != host.data_ptr()
    u = tb.to_torch(DeviceProducer(host))
    assert torch.equal(u.view(torch.int16), host.view(torch.int16))

    refused = DeviceProducer(host)
    with pytest.raises(tb.CopyRequiredError, match=r"is on kDLMetal:0, which torch cannot"):
        tb.to_numpy(refused, copy=False)
    assert refused.kwargs == []  # refused before any export
    with pytest.raises(tb.UnsupportedTensorError, match="could not export its data from kDLMetal"):
        tb.to_torch(DeviceProducer(host, can_copy=False))


def test_a_producer_that_cannot_export_names_the_fix() -> None:
    class Broken:
        def __dlpack__(self, **kwargs: Any) -> Any:
            raise BufferError("exporting a lazy array is not supported")

        def __dlpack_device__(self) -> tuple[int, int]:
            return (1, 0)

    with pytest.raises(tb.UnsupportedTensorError) as info:
        tb.to_numpy(Broken())
    assert str(info.value) == (
        "test_a_producer_that_cannot_export_names_the_fix.<locals>.Broken could not export "
        "its data through DLPack (BufferError: exporting a lazy array is not supported); "
        "convert it to a NumPy array or torch tensor with its own library first"
    )


def test_a_dtype_torch_cannot_import_is_refused_with_its_dlpack_name() -> None:
    capsule = torch.zeros(4, dtype=torch.uint8).__dlpack__(max_version=(1, 0))
    code = ctypes.c_uint8.from_address(_pointer(capsule, VERSIONED) + DTYPE_OFFSET)
    code.value = 17  # kDLFloat4_e2m1fn, 8 bits: no torch dtype
    with pytest.raises(tb.UnsupportedDtypeError, match="cannot import the float4_e2m1fn DLPack"):
        tb.to_torch(capsule)


def test_a_device_torch_cannot_import_names_the_device() -> None:
    capsule = torch.zeros(4).__dlpack__(max_version=(1, 0))
    kind = ctypes.c_int32.from_address(_pointer(capsule, VERSIONED) + DEVICE_OFFSET)
    assert kind.value == 1  # kDLCPU
    kind.value = 12  # kDLExtDev: no torch build reads it
    with pytest.raises(tb.UnsupportedTensorError) as info:
        tb.to_numpy(capsule)
    assert not isinstance(info.value, tb.UnsupportedDtypeError)
    assert "cannot import the float32 DLPack array on kDLExtDev:0" in str(info.value)
    assert str(info.value).endswith("; move it to the CPU with its own library first")


# --- real producers ------------------------------------------------------------------------------

JAX_ROWS = [r for r in ROWS if r.itemsize <= 4 and r.name != "complex32"]


@pytest.mark.parametrize("row", JAX_ROWS, ids=lambda r: r.name)
def test_jax_arrays_every_dtype(row: tb.DTypeRow) -> None:
    if importlib.util.find_spec("jax") is None:
        pytest.skip(reason="jax is not installed (pip install 'jax[cpu]')")
    import jax.numpy as jnp

    from conftest import make_patterns

    patterns = make_patterns(row)
    if row.name == "bool":
        patterns = patterns.view(np.bool_)
    x = jnp.asarray(patterns)
    assert x.dtype == row.numpy

    a = tb.to_numpy(x)
    t = tb.to_torch(x)

    assert a.dtype == row.numpy and a.tobytes() == patterns.tobytes()
    assert data_address(a) == x.unsafe_buffer_pointer()  # zero-copy
    assert not a.flags.writeable  # JAX arrays are immutable (unversioned export)
    assert t.dtype is row.torch and tensor_bytes(t) == patterns.tobytes()
    assert t.data_ptr() != x.unsafe_buffer_pointer()
    with pytest.raises(tb.CopyRequiredError, match="the input is read-only"):
        tb.to_torch(x, copy=False)


MLX_DTYPES = ["bool", "uint8", "int8", "int16", "uint16", "int32", "uint32", "int64",
              "uint64", "float16", "float32", "bfloat16", "complex64"]  # fmt: skip


@pytest.mark.parametrize("name", MLX_DTYPES)
def test_mlx_arrays(name: str) -> None:
    if importlib.util.find_spec("mlx") is None:
        pytest.skip(reason="mlx is not installed (pip install 'mlx[cpu]')")
    import mlx.core as mx

    from conftest import make_patterns

    row = tb.resolve_dtype(name)
    bits = make_patterns(row)[:4096]
    carrier = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32, 8: mx.uint64}[row.itemsize]
    mx_dtype = getattr(mx, "bool_" if name == "bool" else name)
    x = mx.array(bits.view(f"u{row.itemsize}")).astype(carrier).view(mx_dtype)
    mx.eval(x)

    a = tb.to_numpy(x)
    t = tb.to_torch(x)

    assert a.dtype == row.numpy and a.tobytes() == bits.tobytes()
    assert not a.flags.writeable  # MLX exports unversioned capsules
    assert t.dtype is row.torch and tensor_bytes(t) == bits.tobytes()


def test_module_doctests() -> None:
    import doctest

    import tensorbridge._dlpack as module

    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0


# --- producers as tree leaves --------------------------------------------------------------------


def test_tree_leaves_that_are_producers_are_imported_once_and_cast() -> None:
    w = torch.arange(6, dtype=torch.float32).to(torch.bfloat16)
    p, q = Producer(w), Producer(torch.arange(3))
    tree = {"w": p, "n": q, "lr": 0.1}

    out = tb.tree_to_numpy(tree)
    assert p.calls == 1 and q.calls == 1
    assert out["w"].dtype == ml_dtypes.bfloat16 and np.shares_memory(out["w"], tb.to_numpy(w))
    assert out["lr"] == 0.1

    cast = tb.tree_to_numpy({"w": Producer(w), "n": q}, float_dtype="float32")
    assert cast["w"].dtype == np.float32 and cast["w"].tolist() == w.float().tolist()
    assert cast["n"].dtype == np.int64

    back = tb.tree_to_torch({"w": Producer(w)}, float_dtype="float32")
    assert back["w"].dtype == torch.float32 and torch.equal(back["w"], w.float())


def test_describe_a_producer_through_its_one_export() -> None:
    ro = Producer(torch.arange(6.0), read_only=True)
    d = tb.describe(ro)
    assert ro.calls == 1 and d.kind.endswith("Producer")
    assert d.readonly and d.to_torch.verdict == "copy" and d.to_numpy.verdict == "share"
    w = tb.describe(Producer(torch.zeros(2, 3, dtype=torch.bfloat16)))
    assert (w.shape, w.numpy_dtype, w.to_torch.steps) == ((2, 3), "bfloat16", ("view",))
    assert not w.readonly and "DLPack producer" in w.notes[0]

"""The catalogue of bad inputs: every wrong thing a user can hand the API and the CLI.

One table, ``ROWS``: each row is one wrong input (a call, or a command line), the
exception class it must raise (or the command's exit status), and a regular
expression the message must match: the argument, call or flag that fixes it. A row
fails when the class is wrong (a generic ``TypeError`` from NumPy or torch leaking
through), or when the message stops naming the fix.

The same rows are the table in ``docs/errors.md``, between the ``catalogue`` markers;
:func:`test_docs_table_is_in_sync` fails when the page differs from :func:`markdown`.
After changing a row, regenerate the page:

    PYTHONPATH=src python tests/test_catalogue.py
"""

from __future__ import annotations

import contextlib
import os
import pickle
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge import _plan
from tensorbridge.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOCS_PAGE = ROOT / "docs" / "errors.md"
BEGIN, END = "<!-- catalogue:begin -->", "<!-- catalogue:end -->"

# torch 2.13 deprecates creating quantized tensors (the quint8 rows) and says so once.
pytestmark = pytest.mark.filterwarnings(
    "ignore:torch.quantize_per_tensor, torch.quantize_per_channel:UserWarning"
)


class Env:
    """What a row's call may use: a scratch directory with small files, and monkeypatch."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp = tmp_path
        self.monkeypatch = monkeypatch
        monkeypatch.chdir(tmp_path)

    @property
    def st(self) -> Path:
        """A safetensors file with a float and an int tensor."""
        p = self.tmp / "m.safetensors"
        if not p.exists():
            tb.save({"w": np.ones((2, 3), np.float32), "i": np.arange(3)}, p)
        return p

    def text(self, name: str = "notes.txt", data: bytes = b"hello") -> Path:
        p = self.tmp / name
        p.write_bytes(data)
        return p

    def empty_dir(self) -> Path:
        p = self.tmp / "empty"
        p.mkdir(exist_ok=True)
        return p

    def dcp(self, commit: bool = True) -> Path:
        """A torch.distributed.checkpoint directory (no process group needed to write it)."""
        import torch.distributed.checkpoint as dcp

        p = self.tmp / "ckpt"
        if not p.exists():
            with warnings_ignored():
                dcp.save({"w": torch.ones(4), "b": torch.arange(3)}, checkpoint_id=p)
        if not commit:
            (p / ".metadata").unlink()
        return p

    def gguf_q8(self) -> Path:
        p = self.tmp / "q.gguf"
        meta = {"general.architecture": "llama"}
        tb.save({"w": np.ones((4, 32), np.float32)}, p, metadata=meta, quantize="q8_0")
        return p

    def without(self, *modules: str) -> None:
        """Make ``import MODULE`` fail, as when the optional extra is not installed."""
        for m in modules:
            self.monkeypatch.setitem(sys.modules, m, None)
        _plan.forget()  # plans made while it was importable would skip the check


@contextlib.contextmanager
def warnings_ignored() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@contextlib.contextmanager
def process_group() -> Iterator[Any]:
    """A one-rank gloo group and its 1-D CPU mesh, for DTensor rows; destroyed after."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():
        pytest.skip(reason="another test left a default process group running")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def dtensor_call(placement: str, call: Callable[[Any], Any], destroy: bool = False) -> Any:
    from torch.distributed.tensor import DTensor, Partial, Shard, distribute_tensor

    with process_group() as mesh:
        if placement == "partial":
            x = DTensor.from_local(torch.ones(4), mesh, [Partial()])
        else:
            x = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)])
        if destroy:
            torch.distributed.destroy_process_group()
        return call(x)


def fake_tensor() -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        return torch.ones(3)


class Wrapped(torch.Tensor):
    """A tensor subclass tensorbridge does not know (it might keep values elsewhere)."""


OK = "ok=False"  # a row whose call returns a Comparison with ok=False and a problem


@dataclass(frozen=True)
class Row:
    """One wrong input and what tensorbridge must answer."""

    id: str
    given: str  # the input, as the docs show it
    call: Callable[[Env], Any]  # for a CLI row: returns the argv
    raises: type[BaseException] | int | str  # class, CLI exit status, or OK
    match: str  # regex the message (stderr, problem) must match: it names the fix
    fix: str  # what the message tells the user to do, for the docs
    skip: Callable[[], str | None] = field(default=lambda: None)

    @property
    def area(self) -> str:
        return self.id.split(":")[0]


def cuda_present() -> str | None:
    return "this machine has CUDA" if torch.cuda.is_available() else None


def needs(module: str) -> Callable[[], str | None]:
    """A row's skip: the optional extra ``module`` is absent (its setup needs it)."""
    return lambda: None if find_spec(module) else f"the {module} extra is not installed"


def no_longdouble() -> str | None:
    if np.dtype(np.longdouble).itemsize <= 8:
        return "long double is float64 on this platform"
    return None


F32 = np.ones(4, np.float32)
RO = np.frombuffer(b"\0" * 16, np.float32)  # read-only memory
Q = tb.quantize(torch.randn(256, 256), "fp8-block", name="w")
# a GPTQ / AWQ layer's stored tensors (4-bit shapes): what its config says is refused
GPTQ5 = {
    "l.qweight": torch.zeros(32, 64, dtype=torch.int32),
    "l.qzeros": torch.zeros(2, 8, dtype=torch.int32),
    "l.scales": torch.ones(2, 64, dtype=torch.float16),
}
NV = tb.quantize(torch.randn(8, 32), "nvfp4-modelopt", name="w")
MX_U8 = {"w": torch.zeros(4, 16, dtype=torch.uint8), "w_scale": torch.ones(4, 1, dtype=torch.uint8)}
E = "InvalidArgumentError"

ROWS: list[Row] = [
    # --- to_numpy --------------------------------------------------------------------------
    Row(
        "to_numpy:list",
        "`tb.to_numpy([1, 2])`",
        lambda e: tb.to_numpy([1, 2]),
        tb.UnsupportedTensorError,
        r"torch\.as_tensor\(x\)",
        "pass `torch.as_tensor(x)`, or `tb.tree_to_numpy(x)` for a list of tensors",
    ),
    Row(
        "to_numpy:dict",
        "`tb.to_numpy({'w': t})`",
        lambda e: tb.to_numpy({"w": torch.ones(1)}),
        tb.UnsupportedTensorError,
        r"tb\.tree_to_numpy\(x\)",
        "pass `tb.tree_to_numpy(x)`",
    ),
    Row(
        "to_numpy:none",
        "`tb.to_numpy(None)`",
        lambda e: tb.to_numpy(None),
        tb.UnsupportedTensorError,
        r"expects a torch\.Tensor, got NoneType",
        "pass a `torch.Tensor`",
    ),
    Row(
        "to_numpy:str",
        "`tb.to_numpy('abc')`",
        lambda e: tb.to_numpy("abc"),
        tb.UnsupportedTensorError,
        r"got str; pass",
        "pass a `torch.Tensor`",
    ),
    Row(
        "to_numpy:quint8",
        "a `torch.quint8` tensor",
        lambda e: tb.to_numpy(torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)),
        tb.UnsupportedDtypeError,
        r"dtype=np\.float32 to dequantize.*int_repr\(\)",
        "pass `dtype=np.float32` to dequantize, or convert `t.int_repr()`",
    ),
    Row(
        "to_numpy:int3",
        "a `torch.int3` tensor (no NumPy type)",
        lambda e: tb.to_numpy(torch.zeros(2, dtype=torch.uint8).view(torch.int3)),
        tb.UnsupportedDtypeError,
        r"pass dtype=np\.int8 for its bytes as torch holds them",
        "pass `dtype=np.int8` for its bytes as torch holds them",
    ),
    Row(
        "to_numpy:meta",
        "a meta tensor",
        lambda e: tb.to_numpy(torch.ones(2, device="meta")),
        tb.NoDataError,
        r"x\.to_empty\(device='cpu'\)",
        "materialise it (`x.to_empty(device='cpu')`, then load its values)",
    ),
    Row(
        "to_numpy:fake",
        "a `FakeTensor` (`FakeTensorMode`)",
        lambda e: tb.to_numpy(fake_tensor()),
        tb.NoDataError,
        r"convert the real tensor",
        "convert the real tensor it stands for",
    ),
    Row(
        "to_numpy:subclass",
        "an unknown `torch.Tensor` subclass",
        lambda e: tb.to_numpy(torch.ones(2).as_subclass(Wrapped)),
        tb.UnsupportedTensorError,
        r"x\.as_subclass\(torch\.Tensor\)",
        "pass a plain tensor (`x.as_subclass(torch.Tensor)`)",
    ),
    Row(
        "to_numpy:mkldnn",
        "an mkldnn tensor",
        lambda e: tb.to_numpy(torch.ones(2, 2).to_mkldnn()),
        tb.UnsupportedTensorError,
        r"x\.to_dense\(\)",
        "pass `x.to_dense()`",
    ),
    Row(
        "to_numpy:sparse-no-scipy",
        "a sparse tensor, scipy not installed",
        lambda e: (e.without("scipy", "scipy.sparse"), tb.to_numpy(torch.eye(2).to_sparse())),
        tb.MissingExtraError,
        r"pip install tensorbridge\[sparse\]",
        "`pip install tensorbridge[sparse]`",
    ),
    Row(
        "to_numpy:cast-copy-false",
        "`tb.to_numpy(f32, dtype='float64', copy=False)`",
        lambda e: tb.to_numpy(torch.ones(2), dtype="float64", copy=False),
        tb.CopyRequiredError,
        r"a cast to float64 makes new values; pass copy=None",
        "pass `copy=None` to allow the copy",
    ),
    Row(
        "to_numpy:conj-copy-false",
        "`tb.to_numpy(t.conj(), copy=False)`",
        lambda e: tb.to_numpy(torch.ones(2, dtype=torch.complex64).conj(), copy=False),
        tb.CopyRequiredError,
        r"conjugate or negative bit.*copy=None",
        "pass `copy=None` (or `t.resolve_conj()` first)",
    ),
    Row(
        "to_numpy:complex-to-real",
        "`tb.to_numpy(c64, dtype='float32')`",
        lambda e: tb.to_numpy(torch.ones(2, dtype=torch.complex64), dtype="float32"),
        tb.UnsupportedDtypeError,
        r"x\.real",
        "pass `x.real` explicitly, or a complex dtype",
    ),
    Row(
        "to_numpy:dtype-name",
        "`dtype='bf17'`",
        lambda e: tb.to_numpy(torch.ones(2), dtype="bf17"),
        tb.UnsupportedDtypeError,
        r"a name such as 'bfloat16' \(known names:",
        "pass a name from the dtype table (`'bfloat16'`, ...)",
    ),
    Row(
        "to_numpy:dtype-int",
        "`dtype=5`",
        lambda e: tb.to_numpy(torch.ones(2), dtype=5),
        tb.UnsupportedDtypeError,
        r"5 is not a dtype; pass a torch dtype",
        "pass a torch dtype, a NumPy dtype or a name",
    ),
    Row(
        "to_numpy:out-shape",
        "`out=` of another shape",
        lambda e: tb.to_numpy(torch.ones(2), out=np.empty(3, np.float32)),
        tb.ShapeMismatchError,
        r"pass an out of the source's shape",
        "pass an `out` of the source's shape",
    ),
    Row(
        "to_numpy:out-readonly",
        "a read-only `out=`",
        lambda e: tb.to_numpy(torch.ones(4), out=RO),
        tb.UnsupportedTensorError,
        r"pass a writable array",
        "pass a writable array",
    ),
    Row(
        "to_numpy:out-tensor",
        "`out=` a tensor",
        lambda e: tb.to_numpy(torch.ones(2), out=torch.empty(2)),
        tb.UnsupportedTensorError,
        r"out=np\.empty\(shape, dtype\)",
        "pass `out=np.empty(shape, dtype)` (or use `tb.to_torch(x, out=tensor)`)",
    ),
    Row(
        "to_numpy:dtensor",
        "a sharded DTensor",
        lambda e: dtensor_call("shard", tb.to_numpy),
        tb.ShardedTensorError,
        r"tb\.local_shard\(x\).*gather=True",
        "pass `tb.local_shard(x)` for this rank's block, or `gather=True`",
    ),
    Row(
        "to_numpy:dtensor-partial",
        "a `Partial` DTensor with `gather=True`",
        lambda e: dtensor_call("partial", lambda x: tb.to_numpy(x, gather=True)),
        tb.ShardedTensorError,
        r"reduce it first \(x\.redistribute",
        "reduce it first (`x.redistribute(placements=[Replicate()])`)",
    ),
    Row(
        "to_numpy:dtensor-gather-copy-false",
        "`gather=True, copy=False`",
        lambda e: dtensor_call("shard", lambda x: tb.to_numpy(x, gather=True, copy=False)),
        tb.CopyRequiredError,
        r"gathering it makes new memory\); pass copy=None",
        "pass `copy=None`: a gather always copies",
    ),
    Row(
        "to_numpy:dtensor-no-group",
        "`gather=True` after `destroy_process_group()`",
        lambda e: dtensor_call("shard", lambda x: tb.to_numpy(x, gather=True), destroy=True),
        tb.ShardedTensorError,
        r"no process group is running.*before "
        r"torch\.distributed\.destroy_process_group\(\)",
        "gather while the process group runs, or take `tb.local_shard(x)`",
    ),
    # --- to_torch --------------------------------------------------------------------------
    Row(
        "to_torch:none",
        "`tb.to_torch(None)`",
        lambda e: tb.to_torch(None),
        tb.UnsupportedTensorError,
        r"expects an array, a number or a nested list",
        "pass an array, a number or a nested list of numbers",
    ),
    Row(
        "to_torch:dict",
        "`tb.to_torch({'w': a})`",
        lambda e: tb.to_torch({"w": F32}),
        tb.UnsupportedTensorError,
        r"tb\.tree_to_torch\(x\)",
        "pass `tb.tree_to_torch(x)`",
    ),
    Row(
        "to_torch:str",
        "`tb.to_torch('abc')`",
        lambda e: tb.to_torch("abc"),
        tb.UnsupportedTensorError,
        r"got str; pass",
        "pass an array of numbers",
    ),
    Row(
        "to_torch:object",
        "an object array",
        lambda e: tb.to_torch(np.array([1, "a"], object)),
        tb.UnsupportedDtypeError,
        r"np\.asarray\(a, dtype=np\.float32\)",
        "convert to a numeric dtype (`np.asarray(a, dtype=np.float32)`)",
    ),
    Row(
        "to_torch:structured",
        "a structured array",
        lambda e: tb.to_torch(np.zeros(2, [("a", "<i4"), ("b", "<f4")])),
        tb.UnsupportedDtypeError,
        r"convert each field separately \(a\['a'\]\)",
        "convert each field separately (`a['a']`)",
    ),
    Row(
        "to_torch:datetime64",
        "a `datetime64` array",
        lambda e: tb.to_torch(np.zeros(2, "datetime64[D]")),
        tb.UnsupportedDtypeError,
        r"a\.view\(np\.int64\)",
        "pass `a.view(np.int64)` (the ticks)",
    ),
    Row(
        "to_torch:timedelta64",
        "a `timedelta64` array",
        lambda e: tb.to_torch(np.zeros(2, "timedelta64[s]")),
        tb.UnsupportedDtypeError,
        r"a\.view\(np\.int64\)",
        "pass `a.view(np.int64)` (the ticks)",
    ),
    Row(
        "to_torch:unicode",
        "a string array (`<U1`)",
        lambda e: tb.to_torch(np.array(["a"])),
        tb.UnsupportedDtypeError,
        r"encode the strings to numbers first",
        "encode the strings to numbers first",
    ),
    Row(
        "to_torch:bytes",
        "a bytes array (`S1`)",
        lambda e: tb.to_torch(np.array([b"a"])),
        tb.UnsupportedDtypeError,
        r"encode the strings to numbers first \(e\.g\. np\.frombuffer",
        "encode the strings to numbers (`np.frombuffer(a.tobytes(), np.uint8)`)",
    ),
    Row(
        "to_torch:void",
        "a raw void array (`V2`)",
        lambda e: tb.to_torch(np.zeros(2, "V2")),
        tb.UnsupportedDtypeError,
        r"pass a\.view\(np\.uint8\)",
        "pass `a.view(np.uint8)`",
    ),
    Row(
        "to_torch:longdouble",
        "a `np.longdouble` array",
        lambda e: tb.to_torch(np.zeros(2, np.longdouble)),
        tb.UnsupportedDtypeError,
        r"pass a\.astype\(np\.float64\), which rounds",
        "pass `a.astype(np.float64)` (rounds to 53 bits)",
        skip=no_longdouble,
    ),
    Row(
        "to_torch:float8_e4m3",
        "an `ml_dtypes.float8_e4m3` array (a type torch lacks)",
        lambda e: tb.to_torch(np.zeros(2, __import__("ml_dtypes").float8_e4m3)),
        tb.UnsupportedDtypeError,
        r"pass dtype=torch\.bfloat16, torch\.float16 or torch\.float32 \(each holds every",
        "pass `dtype=torch.bfloat16`, `torch.float16` or `torch.float32` (each exact)",
    ),
    Row(
        "to_torch:masked",
        "a masked array (`np.ma`)",
        lambda e: tb.to_torch(np.ma.masked_array([1.0, 2.0], mask=[0, 1])),
        tb.UnsupportedTensorError,
        r"a\.filled\(fill_value\).*np\.ma\.getmaskarray\(a\)",
        "pass `a.filled(fill_value)`, or the data and `np.ma.getmaskarray(a)` separately",
    ),
    Row(
        "to_torch:negative-strides",
        "`tb.to_torch(a[::-1], copy=False)`",
        lambda e: tb.to_torch(np.arange(4.0)[::-1], copy=False),
        tb.CopyRequiredError,
        r"negative strides.*copy=None",
        "pass `copy=None` to allow the copy",
    ),
    Row(
        "to_torch:cast-copy-false",
        "`tb.to_torch(f64, dtype='float32', copy=False)`",
        lambda e: tb.to_torch(np.arange(4.0), dtype="float32", copy=False),
        tb.CopyRequiredError,
        r"makes new values; pass copy=None",
        "pass `copy=None` to allow the copy",
    ),
    Row(
        "to_torch:readonly-copy-false",
        "read-only memory with `copy=False`",
        lambda e: tb.to_torch(RO, copy=False),
        tb.CopyRequiredError,
        r"mmap_mode='c'.*copy=None",
        "open files copy-on-write (`mmap_mode='c'`), or pass `copy=None`",
    ),
    Row(
        "to_torch:byteswapped-copy-false",
        "a big-endian array with `copy=False`",
        lambda e: tb.to_torch(np.ones(2, ">f4"), copy=False),
        tb.CopyRequiredError,
        r"byte-swapped.*copy=None",
        "pass `copy=None` to allow the swap",
    ),
    Row(
        "to_torch:requires-grad-int",
        "`requires_grad=True` on an int array",
        lambda e: tb.to_torch(np.arange(4), requires_grad=True),
        tb.UnsupportedDtypeError,
        r"pass dtype=torch\.float32 as well",
        "pass `dtype=torch.float32` as well",
    ),
    Row(
        "to_torch:out-shape",
        "`out=` of another shape",
        lambda e: tb.to_torch(np.arange(4.0), out=torch.empty(3, dtype=torch.float64)),
        tb.ShapeMismatchError,
        r"pass an out of the source's shape",
        "pass an `out` of the source's shape",
    ),
    Row(
        "to_torch:out-ndarray",
        "`out=` an ndarray",
        lambda e: tb.to_torch(np.arange(4.0), out=np.empty(4)),
        tb.UnsupportedTensorError,
        r"out=torch\.empty\(shape, dtype=\.\.\.\)",
        "pass `out=torch.empty(...)` (or use `tb.to_numpy(x, out=array)`)",
    ),
    Row(
        "to_torch:device-name",
        "`device='gpu'`",
        lambda e: tb.to_torch(F32, device="gpu"),
        tb.InvalidArgumentError,
        r"pass 'cpu', 'cuda', 'cuda:1'",
        "pass `'cpu'`, `'cuda'`, `'cuda:1'`, `'mps'` or a `torch.device`",
    ),
    Row(
        "to_torch:device-absent",
        "`device='cuda'` on a torch without CUDA",
        lambda e: tb.to_torch(F32, device="cuda"),
        tb.InvalidArgumentError,
        r"no cuda device; pass device='cpu'",
        "pass `device='cpu'` (or leave out `device=`)",
        skip=cuda_present,
    ),
    Row(
        "to_torch:dtensor",
        "a sharded DTensor",
        lambda e: dtensor_call("shard", tb.to_torch),
        tb.ShardedTensorError,
        r"gather=True.*x\.to_local\(\)",
        "pass `gather=True`, or `x.to_local()` for this rank's block",
    ),
    # --- dtype lookups, trees, DTensor blocks -----------------------------------------------
    Row(
        "dtypes:unknown-name",
        "`tb.resolve_dtype('floaty')`",
        lambda e: tb.resolve_dtype("floaty"),
        tb.UnsupportedDtypeError,
        r"known names: (bcomplex32, )?bfloat16",  # ml_dtypes 0.7 has bcomplex32
        "pass a known name",
    ),
    Row(
        "dtypes:quint8",
        "`tb.numpy_dtype(torch.quint8)`",
        lambda e: tb.numpy_dtype(torch.quint8),
        tb.UnsupportedDtypeError,
        r"int_repr\(\)",
        "convert `t.int_repr()` or dequantize",
    ),
    Row(
        "dtypes:object",
        "`tb.torch_dtype(np.dtype(object))`",
        lambda e: tb.torch_dtype(np.dtype(object)),
        tb.UnsupportedDtypeError,
        r"convert to a numeric dtype first",
        "convert to a numeric dtype first",
    ),
    Row(
        "tree:meta-leaf",
        "a meta tensor deep in a tree",
        lambda e: tb.tree_to_numpy({"a": {"b": [torch.ones(1, device="meta")]}}),
        tb.NoDataError,
        r"^at \['a'\]\['b'\]\[0\]: .*to_empty",
        "the key path, then: materialise it",
    ),
    Row(
        "tree:object-leaf",
        "an object array in a tree",
        lambda e: tb.tree_to_torch({"a": np.array([1, "a"], object)}),
        tb.UnsupportedDtypeError,
        r"^at \['a'\]: .*np\.asarray",
        "the key path, then: convert to a numeric dtype",
    ),
    Row(
        "tree:float-dtype-int",
        "`tb.tree_to_numpy(t, float_dtype='int8')`",
        lambda e: tb.tree_to_numpy({"a": torch.ones(1)}, float_dtype="int8"),
        tb.UnsupportedDtypeError,
        r"pass a float dtype.*or dtype='int8' to cast every leaf",
        "pass a float dtype, or `dtype='int8'` to cast every leaf",
    ),
    Row(
        "tree:float-dtype-name",
        "`float_dtype='bf12'`",
        lambda e: tb.tree_to_numpy({"a": torch.ones(1)}, float_dtype="bf12"),
        tb.UnsupportedDtypeError,
        r"known names",
        "pass a known name",
    ),
    Row(
        "tree:copy-false",
        "`tb.tree_to_numpy(t, float_dtype='float64', copy=False)`",
        lambda e: tb.tree_to_numpy({"a": torch.ones(1)}, float_dtype="float64", copy=False),
        tb.CopyRequiredError,
        r"^at \['a'\]: .*copy=None",
        "pass `copy=None`",
    ),
    Row(
        "tree:dtensor-leaf",
        "a DTensor leaf without `gather=True`",
        lambda e: dtensor_call("shard", lambda x: tb.tree_to_numpy({"w": x})),
        tb.ShardedTensorError,
        r"^at \['w'\]: .*gather=True",
        "pass `gather=True`",
    ),
    Row(
        "local_shard:plain",
        "`tb.local_shard(plain_tensor)`",
        lambda e: tb.local_shard(torch.ones(2)),
        tb.UnsupportedTensorError,
        r"pass tb\.to_numpy\(x\)",
        "pass `tb.to_numpy(x)`",
    ),
    Row(
        "local_shard:ndarray",
        "`tb.local_shard(array)`",
        lambda e: tb.local_shard(F32),
        tb.UnsupportedTensorError,
        r"expects a DTensor, got ndarray",
        "pass a DTensor; an array is already whole",
    ),
    # --- diagnostics -----------------------------------------------------------------------
    Row(
        "describe:list",
        "`tb.describe([1])`",
        lambda e: tb.describe([1]),
        tb.UnsupportedTensorError,
        r"pass np\.asarray\(x\)",
        "pass `np.asarray(x)`",
    ),
    Row(
        "describe:none",
        "`tb.describe(None)`",
        lambda e: tb.describe(None),
        tb.UnsupportedTensorError,
        r"got NoneType; pass np\.asarray\(x\)",
        "pass a tensor or array",
    ),
    Row(
        "stats:str",
        "`tb.stats('x')`",
        lambda e: tb.stats("x"),
        tb.UnsupportedTensorError,
        r"pass np\.asarray\(x\)",
        "pass `np.asarray(x)`",
    ),
    Row(
        "stats:object",
        "`tb.stats(object_array)`",
        lambda e: tb.stats(np.array([1, "a"], object)),
        tb.UnsupportedDtypeError,
        r"convert to a numeric dtype first",
        "convert to a numeric dtype first",
    ),
    Row(
        "cast_report:list",
        "`tb.cast_report([1.0], 'bf16')`",
        lambda e: tb.cast_report([1.0], "bf16"),
        tb.UnsupportedTensorError,
        r"pass np\.asarray\(x\)",
        "pass `np.asarray(x)`",
    ),
    Row(
        "cast_report:to-int",
        "`tb.cast_report(x, 'int8')`",
        lambda e: tb.cast_report(np.ones(3), "int8"),
        tb.UnsupportedDtypeError,
        r"pass e\.g\. dtype='float32'",
        "pass a floating-point or complex dtype",
    ),
    Row(
        "cast_report:dtype-name",
        "`tb.cast_report(x, 'bf17')`",
        lambda e: tb.cast_report(np.ones(3), "bf17"),
        tb.UnsupportedDtypeError,
        r"known names",
        "pass a known name",
    ),
    Row(
        "compare:negative-rtol",
        "`tb.compare(a, b, rtol=-1)`",
        lambda e: tb.compare(F32, F32, rtol=-1),
        tb.InvalidArgumentError,
        r"pass a number >= 0, or None",
        "pass a number >= 0, or `None` for the dtype's default",
    ),
    Row(
        "compare:nan-atol",
        "`tb.compare(a, b, atol=float('nan'))`",
        lambda e: tb.compare(F32, F32, atol=float("nan")),
        tb.InvalidArgumentError,
        r"atol=nan is not a tolerance; pass a number >= 0",
        "pass a number >= 0",
    ),
    Row(
        "compare:trees-differ",
        "`tb.compare({'a': x}, {'b': x})`",
        lambda e: tb.compare({"a": F32}, {"b": F32}),
        OK,
        r"1 key path\(s\) only in a; 1 key path\(s\) only in b",
        "returns `ok=False`; `.missing` / `.extra` list the paths",
    ),
    Row(
        "compare:tree-vs-list",
        "`tb.compare({'a': x}, [x])`",
        lambda e: tb.compare({"a": F32}, [F32]),
        OK,
        r"only in a.*only in b",
        "returns `ok=False`; `.missing` / `.extra` list the paths",
    ),
    Row(
        "compare:shapes",
        "`tb.compare(x2, x3)`",
        lambda e: tb.compare(np.ones(2), np.ones(3)),
        OK,
        r"shapes differ: \(2,\) vs \(3,\)",
        "returns `ok=False`; `.problem` names both shapes",
    ),
    # --- files: open / load ----------------------------------------------------------------
    Row(
        "open:unknown-content",
        "a file that is no tensor format",
        lambda e: tb.open(e.text()),
        tb.FormatError,
        r"match no format tensorbridge reads \(a safetensors file",
        "the formats it reads are listed; pass one of them",
    ),
    Row(
        "open:missing",
        "a path that does not exist",
        lambda e: tb.open(e.tmp / "nope.safetensors"),
        FileNotFoundError,
        r"nope\.safetensors",
        "check the path",
    ),
    Row(
        "open:empty-dir",
        "a directory with no checkpoint in it",
        lambda e: tb.open(e.empty_dir()),
        FileNotFoundError,
        r"holds no checkpoint file or index \(\*\.safetensors\.index\.json",
        "the file names it looks for are listed",
    ),
    Row(
        "open:pickle",
        "a plain pickle (`x.pkl`)",
        lambda e: tb.open(e.text("x.pkl", pickle.dumps({"w": [1.0]}))),
        tb.FormatError,
        r"a plain pickle, not a torch\.save archive; tensorbridge never runs a pickle",
        "never run: only `torch.save` archives are read, by tensorbridge's own pickle machine",
    ),
    Row(
        "open:not-torch-save",
        "random bytes named `model.pt` (or `.pth`, `.bin`, `.ckpt`)",
        lambda e: tb.open(e.text("model.ckpt", b"\x00\x01hello, world")),
        tb.FormatError,
        r"is not a torch\.save archive: it starts with 00 01 68 65 6c 6c 6f 2c",
        "shows the first bytes, and what they look like when known (text, ONNX, TFLite, Core ML)",
    ),
    Row(
        "open:truncated",
        "a safetensors file cut short",
        lambda e: tb.open(e.text("cut.safetensors", e.st.read_bytes()[:-5])),
        tb.FormatError,
        r"cut\.safetensors: tensor 'w'.*the file is truncated or corrupt",
        "names the file, the tensor and the bad offsets: fetch the file again",
    ),
    Row(
        "open:uncommitted-dcp",
        "a DCP directory whose save never committed",
        lambda e: tb.open(e.dcp(commit=False)),
        tb.UncommittedCheckpointError,
        r"no \.metadata.*wait for it to finish or save again",
        "wait for the save to finish, or save again",
    ),
    Row(
        "open:dtype-on-safetensors",
        "`tb.open('m.safetensors', dtype='bf16')`",
        lambda e: tb.open(e.st, dtype="bf16"),
        tb.InvalidArgumentError,
        r"pass float_dtype= \(command line: --float-dtype\)",
        "pass `float_dtype=` to cast values",
    ),
    Row(
        "open:scheme-alone",
        "`tb.open(p, scheme='fp8')` without `dequantize=`",
        lambda e: tb.open(e.st, scheme="fp8"),
        tb.InvalidArgumentError,
        r"pass dequantize='bf16' with it",
        "pass `dequantize='bf16'` with it",
    ),
    Row(
        "open:gguf-quantized",
        "a GGUF Q8_0 tensor read without `dequantize=`",
        lambda e: tb.open(e.gguf_q8())["w"],
        tb.UnsupportedDtypeError,
        r"dequantize='bf16'",
        "open with `dequantize='bf16'`",
        needs("gguf"),
    ),
    Row(
        "load:framework",
        "`tb.load(p, framework='jax')`",
        lambda e: tb.load(e.st, framework="jax"),
        tb.InvalidArgumentError,
        r"pass 'numpy' or 'torch'",
        "pass `'numpy'` or `'torch'`",
    ),
    Row(
        "load:missing-key",
        "`tb.load(p, keys=['nope'])`",
        lambda e: tb.load(e.st, keys=["nope"]),
        KeyError,
        r"its keys are \['i', 'w'\]",
        "pick from the keys it lists",
    ),
    Row(
        "load:float-dtype-int",
        "`tb.load(p, float_dtype='int8')`",
        lambda e: tb.load(e.st, float_dtype="int8"),
        tb.UnsupportedDtypeError,
        r"pass a float dtype such as 'bfloat16'",
        "pass a floating-point dtype",
    ),
    Row(
        "load:float-dtype-name",
        "`tb.load(p, float_dtype='bf17')`",
        lambda e: tb.load(e.st, float_dtype="bf17"),
        tb.UnsupportedDtypeError,
        r"'bf17' is not a dtype.*known names",
        "pass a known name",
    ),
    Row(
        "load:dequantize-int",
        "`tb.load(p, dequantize='int8')`",
        lambda e: tb.load(e.st, dequantize="int8"),
        tb.QuantizationError,
        r"pass a 16- or 32-bit float: 'bfloat16'",
        "pass `'bfloat16'`, `'float16'` or `'float32'`",
    ),
    # --- files: save -----------------------------------------------------------------------
    Row(
        "save:unknown-suffix",
        "`tb.save(sd, 'x.foo')`",
        lambda e: tb.save({"a": F32}, "x.foo"),
        tb.FormatError,
        r"use \.bin, \.gguf, \.h5, \.hdf5, \.npy",
        "use a suffix from the list",
    ),
    Row(
        "save:exists",
        "a destination that exists",
        lambda e: tb.save({"a": F32}, e.st),
        tb.DestinationExistsError,
        r"pass overwrite=True \(command line: --overwrite\)",
        "pass `overwrite=True`",
    ),
    Row(
        "save:list",
        "`tb.save([t], p)`",
        lambda e: tb.save([F32], "x.safetensors"),
        tb.UnsupportedTensorError,
        r"pass a state dict, e\.g\. \{'weight': tensor\}",
        "pass a state dict (`{'weight': tensor}`)",
    ),
    Row(
        "save:str-value",
        "`tb.save({'a': 'x'}, p)`",
        lambda e: tb.save({"a": "x"}, "x.safetensors"),
        tb.UnsupportedTensorError,
        r"put other values in metadata=",
        "put other values in `metadata=`",
    ),
    Row(
        "save:object-array",
        "an object array in the state dict",
        lambda e: tb.save({"a": np.array([1, "a"], object)}, "x.safetensors"),
        tb.UnsupportedDtypeError,
        r"tensor 'a'.*np\.asarray\(a, dtype=np\.float32\)",
        "convert to a numeric dtype",
    ),
    Row(
        "save:masked",
        "a masked array in the state dict",
        lambda e: tb.save({"a": np.ma.masked_array([1.0], mask=[1])}, "x.safetensors"),
        tb.UnsupportedTensorError,
        r"mask would be lost; pass a\.filled\(\)",
        "pass `a.filled()`",
    ),
    Row(
        "save:meta",
        "a meta tensor in the state dict",
        lambda e: tb.save({"a": torch.ones(1, device="meta")}, "x.safetensors"),
        tb.NoDataError,
        r"tensor 'a'.*materialise it first",
        "materialise it first",
    ),
    Row(
        "save:sparse",
        "a sparse tensor in the state dict",
        lambda e: tb.save({"a": torch.eye(2).to_sparse()}, "x.safetensors"),
        tb.UnsupportedTensorError,
        r"x\.to_dense\(\)",
        "pass `x.to_dense()`",
    ),
    Row(
        "save:npy-many",
        "two tensors to a `.npy` path",
        lambda e: tb.save({"a": F32, "b": F32}, "x.npy"),
        tb.UnsupportedTensorError,
        r"save to a \.npz path, or pass one tensor",
        "save to a `.npz` path, or pass one tensor",
    ),
    Row(
        "save:name-nul",
        "names with a NUL (`'w\\x00a'`, `'w\\x00b'`)",
        lambda e: tb.save({"w\x00a": F32, "w\x00b": F32}, "x.npz"),
        tb.InvalidNameError,
        r"'w\\x00a': it holds a NUL character.*; rename the tensor",
        "rename the tensor (the rule it breaks is named)",
    ),
    Row(
        "save:name-path",
        "`tb.save({'../../x': t}, 'x.npz')`",
        lambda e: tb.save({"../../x": F32}, "x.npz"),
        tb.InvalidNameError,
        r"a '\.\.' component, which would point outside the archive.*rename the tensor",
        "rename the tensor: `.npz` members stay inside the archive",
    ),
    Row(
        "save:shard-size",
        "`max_shard_size='lots'`",
        lambda e: tb.save({"a": F32}, "x.safetensors", max_shard_size="lots"),
        tb.InvalidArgumentError,
        r"'5GB' \(10\*\*9 bytes\)",
        "pass bytes or `'5GB'`, `'2GiB'`",
    ),
    Row(
        "save:shard-npz",
        "`max_shard_size=` to a `.npz`",
        lambda e: tb.save({"a": F32}, "x.npz", max_shard_size="5GB"),
        tb.InvalidArgumentError,
        r"save to a \.safetensors path or a directory",
        "save to a `.safetensors` path or a directory",
    ),
    Row(
        "save:metadata-npy",
        "`metadata=` to a `.npz`",
        lambda e: tb.save({"a": F32}, "x.npz", metadata={"k": "v"}),
        tb.InvalidArgumentError,
        r"leave out metadata=",
        "save to a format with metadata",
    ),
    Row(
        "save:quantize-safetensors",
        "`quantize=` to a `.safetensors`",
        lambda e: tb.save({"a": F32}, "x.safetensors", quantize="q8_0"),
        tb.InvalidArgumentError,
        r"save to a \.gguf path, or leave out quantize=",
        "save to a `.gguf` path, or leave out `quantize=`",
    ),
    Row(
        "save:format-plain",
        "`format=` for a plain save",
        lambda e: tb.save({"a": F32}, "x.safetensors", format="npy"),
        tb.InvalidArgumentError,
        r"tb\.save\(tb\.open\(dcp_dir\), path\)",
        "only for an opened DCP checkpoint: leave it out",
    ),
    Row(
        "save:float-dtype-int",
        "`tb.save(sd, p, float_dtype='int8')`",
        lambda e: tb.save({"a": F32}, "x.safetensors", float_dtype="int8"),
        tb.UnsupportedDtypeError,
        r"pass a float dtype such as 'bfloat16'",
        "pass a floating-point dtype",
    ),
    Row(
        "save:float-dtype-name",
        "`tb.save(sd, p, float_dtype='bf17')`",
        lambda e: tb.save({"a": F32}, "x.safetensors", float_dtype="bf17"),
        tb.UnsupportedDtypeError,
        r"'bf17' is not a dtype.*known names",
        "pass a known name",
    ),
    Row(
        "save:gguf-architecture",
        "a GGUF save without `general.architecture`",
        lambda e: tb.save({"a": F32}, "x.gguf"),
        tb.FormatError,
        r"pass metadata=\{'general\.architecture'",
        "pass `metadata={'general.architecture': ...}`",
    ),
    Row(
        "save:gguf-quantize-type",
        "`quantize='q4_k'` (not written)",
        lambda e: tb.save(
            {"a": np.ones((4, 32), np.float32)},
            "x.gguf",
            metadata={"general.architecture": "llama"},
            quantize="q4_k",
        ),
        tb.InvalidArgumentError,
        r"pass quantize='q8_0'.*llama-quantize",
        "pass `quantize='q8_0'`, or use llama.cpp's `llama-quantize`",
    ),
    Row(
        "save:gguf-no-package",
        "`quantize='q8_0'`, gguf not installed",
        lambda e: (
            e.without("gguf", "gguf.quants"),
            tb.save(
                {"a": np.ones((4, 32), np.float32)},
                "x.gguf",
                metadata={"general.architecture": "llama"},
                quantize="q8_0",
            ),
        ),
        tb.MissingExtraError,
        r"pip install tensorbridge\[gguf\]",
        "`pip install tensorbridge[gguf]`",
    ),
    Row(
        "save:zarr-not-installed",
        "a `.zarr` save, zarr not installed",
        lambda e: (e.without("zarr"), tb.save({"a": F32}, "x.zarr")),
        tb.MissingExtraError,
        r"pip install tensorbridge\[zarr\]",
        "`pip install tensorbridge[zarr]`",
    ),
    Row(
        "verify:float-dtype",
        "`tb.verify(src, dst, float_dtype='int32')`",
        lambda e: tb.verify(e.st, e.st, float_dtype="int32"),
        tb.UnsupportedDtypeError,
        r"float_dtype=int32 is not a floating-point dtype; pass a float dtype such as 'bfloat16'",
        "pass a floating-point `float_dtype=` (the cast the save ran)",
    ),
    # --- quantized weights -----------------------------------------------------------------
    Row(
        "quantize:element",
        "`tb.quantize(w, 'mxfp8', element='e3m4')`",
        lambda e: tb.quantize(torch.ones(2, 32), "mxfp8", element="e3m4"),
        tb.QuantizationError,
        r"mxfp8's elements are 'e4m3' .* or 'e5m2' .*; pass one of those",
        "pass `element='e4m3'` or `'e5m2'`",
    ),
    Row(
        "quantize:element-mxfp4",
        "`tb.quantize(w, 'mxfp4', element='e5m2')`",
        lambda e: tb.quantize(torch.ones(2, 32), "mxfp4", element="e5m2"),
        tb.QuantizationError,
        r"mxfp4's elements are fp4 e2m1; .*leave element out",
        "leave out `element=`, or quantize with `'mxfp8'`",
    ),
    Row(
        "quantize_checkpoint:nothing",
        "`tb.quantize_checkpoint(src, dst, 'mxfp4')` of a file with no weight to quantize",
        lambda e: tb.quantize_checkpoint(e.st, "q.safetensors", "mxfp4"),
        tb.QuantizationError,
        r"no weight of .* is one mxfp4 quantizes \(2-D\+ float weights, not embeddings, "
        r"lm_head or norms\); nothing to quantize",
        "which weights a scheme quantizes: 2-D+ float `...weight` tensors, not embeddings, "
        "`lm_head` or norms",
    ),
    Row(
        "dequantize_checkpoint:one-array",
        "`tb.dequantize_checkpoint(src, 'w.npy', 'bf16')` of a checkpoint of many tensors",
        lambda e: tb.dequantize_checkpoint(e.st, "w.npy", "bf16"),
        tb.InvalidArgumentError,
        r"a \.npy file holds one array but 2 tensors were selected; pass names=\[one of "
        r"them\], or write \.safetensors",
        "pass `names=[...]` with one tensor, or write a format of many arrays",
    ),
    Row(
        "dequantize:gptq-width",
        "GPTQ with `bits: 5` (6, 7)",
        lambda e: tb.dequantize(GPTQ5, config={"quant_method": "gptq", "bits": 5}),
        tb.QuantizationError,
        r"5-bit GPTQ is not a width .* \(2, 3, 4 and 8 bits are read\); check bits",
        "check `bits` in the config, or dequantize with GPTQModel",
    ),
    Row(
        "dequantize:gptq-format",
        "GPTQ with `format: 'marlin'`",
        lambda e: tb.dequantize(
            GPTQ5, config={"quant_method": "gptq", "bits": 4, "format": "marlin"}
        ),
        tb.QuantizationError,
        r"it reads 'gptq' .* and 'gptq_v2' .*: dequantize 'marlin' checkpoints .* with GPTQModel",
        "dequantize it with GPTQModel, or export it as `gptq`",
    ),
    Row(
        "dequantize:awq-gemv",
        "AWQ with `version: 'gemv'` (`gemv_fast`, `marlin`, `llm-awq`)",
        lambda e: tb.dequantize(GPTQ5, config={"quant_method": "awq", "version": "gemv"}),
        tb.QuantizationError,
        r"the only one tensorbridge reads .*; dequantize it with AutoAWQ / GPTQModel, or export",
        "dequantize it with AutoAWQ / GPTQModel, or export it as GEMM",
    ),
    Row(
        "dequantize:awq-exllama",
        "AWQ with `version: 'exllama'`",
        lambda e: tb.dequantize(GPTQ5, config={"quant_method": "awq", "version": "exllama"}),
        tb.QuantizationError,
        r"names a kernel, not a layout: .* set version to 'gemm'",
        'set `version: "gemm"` when the tensors are GEMM\'s',
    ),
    Row(
        "dequantize:no-scheme",
        "`tb.dequantize(codes, scale)`",
        lambda e: tb.dequantize(Q["w"], Q["w_scale_inv"]),
        tb.QuantizationError,
        r"needs scheme= \(one of fp8-block",
        "pass `scheme=`",
    ),
    Row(
        "dequantize:unknown-scheme",
        "`scheme='fp9'`",
        lambda e: tb.dequantize(Q["w"], Q["w_scale_inv"], scheme="fp9"),
        tb.QuantizationError,
        r"pass one of fp8-block",
        "pass a scheme from the list",
    ),
    Row(
        "dequantize:no-scale",
        "codes without `scale`",
        lambda e: tb.dequantize(Q["w"], scheme="fp8"),
        tb.QuantizationError,
        r"pass dequantize\(codes, scale",
        "pass the scales",
    ),
    Row(
        "dequantize:int-dtype",
        "`dtype='int8'`",
        lambda e: tb.dequantize(Q, block_size=(128, 128), dtype="int8"),
        tb.QuantizationError,
        r"'bfloat16', 'float16' or 'float32'",
        "pass `'bfloat16'`, `'float16'` or `'float32'`",
    ),
    Row(
        "dequantize:list",
        "`tb.dequantize([1, 2])`",
        lambda e: tb.dequantize([1, 2]),
        tb.UnsupportedTensorError,
        r"pass torch\.as_tensor\(x\) for each leaf",
        "pass tensors or arrays",
    ),
    Row(
        "dequantize:str",
        "`tb.dequantize('w')`",
        lambda e: tb.dequantize("w"),
        tb.UnsupportedTensorError,
        r"torch\.as_tensor\(codes\) with scale= and scheme=",
        "pass codes with `scale=` and `scheme=`",
    ),
    Row(
        "dequantize:block-size",
        "fp8 block scales, no config, no `block_size=`",
        lambda e: tb.dequantize(Q),
        tb.QuantizationError,
        r"block_size=\(128, 128\)",
        "pass `block_size=(128, 128)`",
    ),
    Row(
        "dequantize:scale-grid",
        "a scale grid that does not tile the weight",
        lambda e: tb.dequantize(Q, config={"quant_method": "fp8", "weight_block_size": [64, 64]}),
        tb.QuantizationError,
        r"does not tile w \[256, 256\] in \[64, 64\]",
        "names the weight, its shape and the block; fix the config",
    ),
    Row(
        "dequantize:u8-ambiguous",
        "a `U8` scale (e8m0 or codes?)",
        lambda e: tb.dequantize(MX_U8),
        tb.QuantizationError,
        r"w_scale is U8: it could hold e8m0.*scheme='mxfp4'",
        "pass `scheme='mxfp4'` (or the config)",
    ),
    Row(
        "dequantize:u8-fp8-block",
        "a `U8` scale beside fp8-block codes",
        lambda e: tb.dequantize(
            {"w": Q["w"], "w_scale_inv": torch.ones(2, 2, dtype=torch.uint8)}, block_size=(128, 128)
        ),
        tb.QuantizationError,
        r"uint8: e8m0 exponents or integer codes",
        "pass `scheme=` (the scale's meaning is never guessed)",
    ),
    Row(
        "dequantize:nvfp4-convention",
        "NVFP4 weights without `scheme=`",
        lambda e: tb.dequantize(NV),
        tb.QuantizationError,
        r"never guessed.*nvfp4-modelopt",
        "pass `scheme='nvfp4-modelopt'` or `'nvfp4-compressed-tensors'`",
    ),
    Row(
        "dequantize:nvfp4-no-global",
        "NVFP4 without its global scale",
        lambda e: tb.dequantize(
            {k: v for k, v in NV.items() if k != "w_scale_2"}, scheme="nvfp4-modelopt"
        ),
        tb.QuantizationError,
        r"no global scale w_scale_2.*off by a constant factor",
        "add the `_scale_2` tensor (the result would be off by a constant factor)",
    ),
    Row(
        "dequantize:scale-shape",
        "a scale of the wrong shape",
        lambda e: tb.dequantize(
            dict(NV, w_scale=NV["w_scale"][:, :1].contiguous()), scheme="nvfp4-modelopt"
        ),
        tb.QuantizationError,
        r"w_scale \[8, 1\] does not tile w \[8, 16\]",
        "names both shapes",
    ),
    Row(
        "dequantize:unsupported-method",
        "`quant_method='bitsandbytes'`",
        lambda e: tb.dequantize({"w": torch.ones(2)}, config={"quant_method": "bitsandbytes"}),
        tb.QuantizationError,
        r"use bitsandbytes",
        "use bitsandbytes itself",
    ),
    Row(
        "dequantize:orphan-scale",
        "a scale with no weight beside it",
        lambda e: tb.dequantize(dict(Q, v_scale_inv=torch.ones(1)), block_size=(128, 128)),
        tb.QuantizationError,
        r"v_scale_inv has no weight v beside it",
        "names the orphan; add its weight or drop it",
    ),
    Row(
        "quant_report:not-quantized",
        "`tb.quant_report({'w': w})`",
        lambda e: tb.quant_report({"w": torch.ones(32, 32)}),
        tb.QuantizationError,
        r"no quantized weights found .*pass scheme= to see what quantizing would do",
        "pass `scheme=` (or the quantized checkpoint)",
    ),
    Row(
        "quantize:unknown-scheme",
        "`tb.quantize(w, 'q4')`",
        lambda e: tb.quantize(torch.ones(32, 32), "q4"),
        tb.QuantizationError,
        r"pass one of fp8-block",
        "pass a scheme from the list",
    ),
    Row(
        "quantize:row-length",
        "`tb.quantize(w_3x3, 'mxfp4')`",
        lambda e: tb.quantize(torch.ones(3, 3), "mxfp4"),
        tb.QuantizationError,
        r"a multiple of 32 values.*\(pad the last axis\)",
        "pad the last axis to a multiple of 32",
    ),
    # --- DCP writers and readers -----------------------------------------------------------
    Row(
        "dcp:writer-shard-size",
        "`tb.SafetensorsWriter(p, max_shard_size='lots')`",
        lambda e: tb.SafetensorsWriter("out", max_shard_size="lots"),
        tb.InvalidArgumentError,
        r"'5GB' \(10\*\*9 bytes\)",
        "pass bytes or `'5GB'`",
    ),
    Row(
        "dcp:writer-buffer",
        "`tb.SafetensorsWriter(p, buffer_size=0)`",
        lambda e: tb.SafetensorsWriter("out", buffer_size=0),
        tb.InvalidArgumentError,
        r"pass an int such as 64 << 20",
        "pass a positive number of bytes",
    ),
    Row(
        "dcp:zarr-chunk",
        "`tb.ZarrWriter(p, max_chunk_bytes=0)`",
        lambda e: tb.ZarrWriter("out.zarr", max_chunk_bytes=0),
        tb.InvalidArgumentError,
        r"max_chunk_bytes=0 is not a positive number of bytes",
        "pass a positive number of bytes",
    ),
    Row(
        "dcp:zarr-not-installed",
        "`tb.ZarrReader(p)`, zarr not installed",
        lambda e: (e.without("zarr"), tb.ZarrReader("in.zarr")),
        tb.MissingExtraError,
        r"pip install tensorbridge\[zarr\]",
        "`pip install tensorbridge[zarr]`",
    ),
]

CLI = "cli"
CLI_ROWS: list[Row] = [
    Row(
        "cli:no-command",
        "`tensorbridge`",
        lambda e: [],
        2,
        r"required: COMMAND",
        "name a command (`tensorbridge --help`)",
    ),
    Row(
        "cli:unknown-command",
        "`tensorbridge frobnicate`",
        lambda e: ["frobnicate"],
        2,
        r"choose from 'inspect', 'convert'",
        "pick a command from the list",
    ),
    Row(
        "cli:inspect-missing",
        "`tensorbridge inspect nope.safetensors`",
        lambda e: ["inspect", "nope.safetensors"],
        1,
        r"nope\.safetensors: No such file or directory",
        "check the path",
    ),
    Row(
        "cli:inspect-unknown",
        "`tensorbridge inspect notes.txt`",
        lambda e: ["inspect", str(e.text())],
        1,
        r"match no format tensorbridge reads",
        "the formats it reads are listed",
    ),
    Row(
        "cli:inspect-empty-dir",
        "`tensorbridge inspect empty/`",
        lambda e: ["inspect", str(e.empty_dir())],
        1,
        r"holds no checkpoint file or index",
        "the file names it looks for are listed",
    ),
    Row(
        "cli:inspect-as-dtype",
        "`inspect --as-dtype bf17`",
        lambda e: ["inspect", str(e.st), "--as-dtype", "bf17"],
        2,
        r"pass one of bool, uint8",
        "pick a dtype from the list",
    ),
    Row(
        "cli:convert-suffix",
        "`convert m.safetensors out.foo`",
        lambda e: ["convert", str(e.st), "out.foo"],
        2,
        r"use \.bin, \.gguf",
        "use a suffix from the list",
    ),
    Row(
        "cli:convert-exists",
        "`convert` onto an existing file",
        lambda e: ["convert", str(e.st), str(e.st)],
        1,
        r"; pass --overwrite to replace it",
        "pass `--overwrite`",
    ),
    Row(
        "cli:convert-float-dtype",
        "`convert --float-dtype bf17`",
        lambda e: ["convert", str(e.st), "o.safetensors", "--float-dtype", "bf17"],
        2,
        r"pass one of float16, float32",
        "pick a float dtype from the list",
    ),
    Row(
        "cli:convert-float-dtype-int",
        "`convert --float-dtype int8`",
        lambda e: ["convert", str(e.st), "o.safetensors", "--float-dtype", "int8"],
        2,
        r"int8 is not a floating-point dtype; pass one of",
        "pick a float dtype",
    ),
    Row(
        "cli:convert-dequantize-int",
        "`convert --dequantize int8`",
        lambda e: ["convert", str(e.st), "o.safetensors", "--dequantize", "int8"],
        2,
        r"--dequantize int8 is not a floating-point dtype; pass one of",
        "pick a float dtype",
    ),
    Row(
        "cli:convert-shard-npz",
        "`convert --max-shard-size 5GB` to `.npz`",
        lambda e: ["convert", str(e.st), "o.npz", "--max-shard-size", "5GB"],
        2,
        r"needs a \.safetensors destination \(or a directory\)",
        "write a `.safetensors` file or a directory",
    ),
    Row(
        "cli:convert-shard-size",
        "`convert --max-shard-size lots`",
        lambda e: ["convert", str(e.st), "o.safetensors", "--max-shard-size", "lots"],
        2,
        r"'5GB' \(10\*\*9 bytes\)",
        "pass `5GB`, `500MB`, `2GiB` or bytes",
    ),
    Row(
        "cli:convert-workers-plain",
        "`convert --workers 2` from a plain file",
        lambda e: ["convert", str(e.st), "o.safetensors", "--workers", "2"],
        2,
        r"apply to a DCP checkpoint source",
        "leave it out: only DCP sources take it",
    ),
    Row(
        "cli:convert-format-plain",
        "`convert --format npy` from a plain file",
        lambda e: ["convert", str(e.st), "o.safetensors", "--format", "npy"],
        2,
        r"--format npy writes a DCP checkpoint's tensors",
        "leave it out",
    ),
    Row(
        "cli:convert-workers-zero",
        "`convert --workers 0`",
        lambda e: ["convert", str(e.dcp()), "o.safetensors", "--workers", "0"],
        2,
        r"pass a number of processes >= 1",
        "pass `--workers 1` or more",
    ),
    Row(
        "cli:convert-workers-and-dask",
        "`--workers 2 --dask-scheduler ADDR`",
        lambda e: [
            "convert",
            str(e.dcp()),
            "o.safetensors",
            "--workers",
            "2",
            "--dask-scheduler",
            "tcp://x:1",
        ],
        2,
        r"pass --workers or --dask-scheduler, not both",
        "pass one of them",
    ),
    Row(
        "cli:convert-dask-missing",
        "`--dask-scheduler`, dask not installed",
        lambda e: (
            e.without("distributed"),
            ["convert", str(e.dcp()), "o.safetensors", "--dask-scheduler", "x:1"],
        )[1],
        1,
        r"pip install tensorbridge\[dask\]",
        "`pip install tensorbridge[dask]`",
    ),
    Row(
        "cli:convert-scheme-alone",
        "`convert --scheme mxfp4` without `--dequantize`",
        lambda e: ["convert", str(e.st), "o.safetensors", "--scheme", "mxfp4"],
        2,
        r"pass --dequantize bf16 with them",
        "pass `--dequantize bf16` with it",
    ),
    Row(
        "cli:convert-include-none",
        "`convert --include 'zz*'` (no match)",
        lambda e: ["convert", str(e.st), "o.safetensors", "--include", "zz*"],
        2,
        r"'tensorbridge inspect .*' lists the names",
        "`tensorbridge inspect SRC` lists them",
    ),
    Row(
        "cli:convert-npy-many",
        "`convert` two tensors to `.npy`",
        lambda e: ["convert", str(e.st), "o.npy"],
        2,
        r"pick one with --include NAME",
        "pick one with `--include NAME`",
    ),
    Row(
        "cli:convert-as-dtype",
        "`convert --as-dtype bf16` from safetensors",
        lambda e: ["convert", str(e.st), "o.safetensors", "--as-dtype", "bf16"],
        1,
        r"to cast values pass --float-dtype$",
        "pass `--float-dtype` to cast values",
    ),
    Row(
        "cli:convert-gguf-quantized",
        "`convert q.gguf out.safetensors` (Q8_0 tensors)",
        lambda e: ["convert", str(e.gguf_q8()), "o.safetensors"],
        1,
        r"--dequantize bf16",
        "pass `--dequantize bf16`",
        needs("gguf"),
    ),
    Row(
        "cli:compare-missing",
        "`compare m.safetensors nope.safetensors`",
        lambda e: ["compare", str(e.st), "nope.safetensors"],
        1,
        r"nope\.safetensors: No such file or directory",
        "check the path",
    ),
    Row(
        "cli:compare-rtol-text",
        "`compare --rtol abc`",
        lambda e: ["compare", str(e.st), str(e.st), "--rtol", "abc"],
        2,
        r"argument --rtol: invalid float value: 'abc'",
        "pass a number",
    ),
    Row(
        "cli:compare-rtol-negative",
        "`compare --rtol -1`",
        lambda e: ["compare", str(e.st), str(e.st), "--rtol", "-1"],
        2,
        r"pass a number >= 0",
        "pass a number >= 0",
    ),
    Row(
        "cli:compare-plot-missing",
        "`compare --plot x.png`, matplotlib not installed",
        lambda e: (
            e.without("matplotlib", "matplotlib.pyplot"),
            ["compare", str(e.st), str(e.st), "--plot", "x.png"],
        )[1],
        1,
        r"pip install 'tensorbridge\[plot\]'",
        "`pip install 'tensorbridge[plot]'`",
    ),
    Row(
        "cli:cast-report-no-dtype",
        "`cast-report m.safetensors`",
        lambda e: ["cast-report", str(e.st)],
        2,
        r"is not quantized: pass --dtype DTYPE for a cast or --scheme NAME",
        "pass `--dtype bf16` (or another float), or `--scheme mxfp4` for a quantization",
    ),
    Row(
        "cli:cast-report-dtype-and-scheme",
        "`cast-report m.safetensors --dtype bf16 --scheme mxfp4`",
        lambda e: ["cast-report", str(e.st), "--dtype", "bf16", "--scheme", "mxfp4"],
        2,
        r"pass --dtype \(a cast\) or --scheme \(a quantization\), not both",
        "pass one of them",
    ),
    Row(
        "cli:compare-scheme-neither",
        "`compare m.safetensors m.safetensors --scheme mxfp4`",
        lambda e: ["compare", str(e.st), str(e.st), "--scheme", "mxfp4"],
        2,
        r"holds mxfp4 weights; leave out --scheme",
        "leave out `--scheme`, or compare with the quantized checkpoint",
    ),
    Row(
        "cli:convert-quantize-gptq",
        "`convert m.safetensors o.safetensors --quantize gptq`",
        lambda e: ["convert", str(e.st), str(e.st.parent / "o.safetensors"), "--quantize", "gptq"],
        2,
        r"dequantizes gptq but does not write it; pass one of fp8-block",
        "pass a scheme tensorbridge writes (mxfp8, mxfp4, nvfp4-*, fp8-block)",
    ),
    Row(
        "cli:convert-layout",
        "`convert m.safetensors o.safetensors --quantize mxfp8 --layout gpt-oss`",
        lambda e: [
            "convert",
            str(e.st),
            str(e.st.parent / "o.safetensors"),
            "--quantize",
            "mxfp8",
            "--layout",
            "gpt-oss",
        ],
        2,
        r"mxfp8 is written in its published layout only; leave out --layout",
        "leave out `--layout` (`gpt-oss` is mxfp4's)",
    ),
    Row(
        "cli:convert-element",
        "`convert m.safetensors o.safetensors --quantize mxfp4 --element e5m2`",
        lambda e: [
            "convert",
            str(e.st),
            str(e.st.parent / "o.safetensors"),
            "--quantize",
            "mxfp4",
            "--element",
            "e5m2",
        ],
        2,
        r"the element type is mxfp8's choice .*; mxfp4's is fixed, leave out --element",
        "leave out `--element`, or `--quantize mxfp8`",
    ),
    Row(
        "cli:convert-gguf-architecture",
        "`convert m.safetensors o.gguf` (no `general.architecture`)",
        lambda e: ["convert", str(e.st), str(e.st.parent / "o.gguf")],
        1,
        r"needs the metadata key 'general.architecture' .*; pass --metadata "
        r"general.architecture=NAME",
        "pass `--metadata general.architecture=llama` (or `--metadata-json FILE`)",
    ),
    Row(
        "cli:convert-metadata",
        "`convert m.safetensors o.gguf --metadata nokey`",
        lambda e: ["convert", str(e.st), str(e.st.parent / "o.gguf"), "--metadata", "nokey"],
        2,
        r"--metadata nokey: pass KEY=VALUE",
        "pass `KEY=VALUE` (or `KEY:TYPE=VALUE`)",
    ),
    Row(
        "cli:convert-quantize-npz",
        "`convert m.safetensors o.npz --quantize mxfp4`",
        lambda e: ["convert", str(e.st), str(e.st.parent / "o.npz"), "--quantize", "mxfp4"],
        2,
        r"writes the schemes' published safetensors layouts",
        "write a `.safetensors` file or a directory",
    ),
    Row(
        "cli:cast-report-int",
        "`cast-report --dtype int8`",
        lambda e: ["cast-report", str(e.st), "--dtype", "int8"],
        2,
        r"int8 is not a floating-point dtype; pass one of",
        "pick a float dtype",
    ),
]

ALL = ROWS + CLI_ROWS


def _message(e: BaseException) -> str:
    return str(e.args[0]) if isinstance(e, KeyError) and e.args else str(e)


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.id)
def test_api_row(row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    why = row.skip()
    if why:
        pytest.skip(reason=why)
    env = Env(tmp_path, monkeypatch)
    if row.raises == OK:
        result = row.call(env)
        assert isinstance(result, tb.Comparison) and result.ok is False
        assert result.problem is not None and re.search(row.match, result.problem), result.problem
        return
    assert isinstance(row.raises, type)
    with pytest.raises(BaseException) as info:
        row.call(env)
    e = info.value
    assert type(e) is row.raises, f"{type(e).__name__}: {e}"
    if isinstance(e, tb.TensorBridgeError):
        builtin = (TypeError, ValueError, ImportError, FileExistsError)
        assert isinstance(e, builtin), "a library error also subclasses a built-in one"
    assert re.search(row.match, _message(e), re.S), _message(e)


@pytest.mark.parametrize("row", CLI_ROWS, ids=lambda r: r.id)
def test_cli_row(
    row: Row, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    why = row.skip()
    if why:
        pytest.skip(reason=why)
    env = Env(tmp_path, monkeypatch)
    argv = row.call(env)
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own usage errors
        code = e.code
    _, err = capsys.readouterr()
    assert code == row.raises, err
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines and re.search(row.match, lines[-1]), err  # one line names the fix
    assert lines[-1].startswith("tensorbridge"), err


def test_the_catalogue_is_large_and_ids_are_unique() -> None:
    ids = [r.id for r in ALL]
    assert len(ids) == len(set(ids))
    assert len(ALL) >= 80


def test_every_public_function_has_a_row() -> None:
    """Each public callable (not a dataclass or an error class) is exercised by some row."""
    import inspect

    text = inspect.getsource(sys.modules[__name__])
    callables = [
        n for n in tb.__all__
        if callable(getattr(tb, n)) and not n[0].isupper() and n != "dtype_table"
    ]  # fmt: skip
    missing = [n for n in callables if f"tb.{n}(" not in text]
    assert missing == []
    for cls in ("SafetensorsWriter", "ZarrWriter", "ZarrReader"):
        assert f"tb.{cls}(" in text


# --- the docs page -------------------------------------------------------------------------------

_AREAS = {
    "to_numpy": "`tb.to_numpy`",
    "to_torch": "`tb.to_torch`",
    "dtypes": "Dtype lookups",
    "tree": "Trees",
    "local_shard": "`tb.local_shard`",
    "describe": "Diagnostics",
    "stats": "Diagnostics",
    "cast_report": "Diagnostics",
    "compare": "Diagnostics",
    "quant_report": "Diagnostics",
    "open": "Reading files",
    "load": "Reading files",
    "save": "Writing files",
    "dequantize": "Quantized weights",
    "quantize": "Quantized weights",
    "quantize_checkpoint": "Quantized weights",
    "dequantize_checkpoint": "Quantized weights",
    "verify": "Writing files",
    "dcp": "DCP writers and readers",
    "cli": "The command line",
}


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """The docs table, one section per area, one line per row."""
    parts: list[str] = []
    area = None
    for row in ALL:
        heading = _AREAS[row.area]
        if heading != area:
            area = heading
            parts += ["" if parts else None, f"### {heading}", ""]  # type: ignore[list-item]
            parts += ["| input | raises | the message tells you |", "| --- | --- | --- |"]
        if isinstance(row.raises, int):
            raised = f"exit status {row.raises}"
        elif row.raises == OK:
            raised = "returns `ok=False`"
        else:
            assert isinstance(row.raises, type)
            raised = f"`{row.raises.__name__}`"
        parts.append(f"| {_cell(row.given)} | {raised} | {_cell(row.fix)} |")
    return "\n".join(p for p in parts if p is not None)


def _page_table() -> str:
    text = DOCS_PAGE.read_text(encoding="utf-8")
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip("\n")


def test_docs_table_is_in_sync() -> None:
    assert _page_table() == markdown(), (
        "docs/errors.md is out of date; run PYTHONPATH=src python tests/test_catalogue.py"
    )
    assert f"{len(ALL)} rows" in DOCS_PAGE.read_text(encoding="utf-8")


def write_page() -> None:
    text = DOCS_PAGE.read_text(encoding="utf-8")
    head, rest = text.split(BEGIN)
    _, tail = rest.split(END)
    head = re.sub(r"\d+ rows", f"{len(ALL)} rows", head)
    DOCS_PAGE.write_text(f"{head}{BEGIN}\n{markdown()}\n{END}{tail}", encoding="utf-8")


if __name__ == "__main__":
    os.chdir(ROOT)
    write_page()
    print(f"wrote {DOCS_PAGE.relative_to(ROOT)} ({len(ALL)} rows)")

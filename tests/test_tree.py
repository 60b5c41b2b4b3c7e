"""tree_to_numpy / tree_to_torch: structure, pass-through, casts, ties, key paths, batching."""

from __future__ import annotations

import dataclasses
import doctest
from collections import OrderedDict, defaultdict, deque, namedtuple
from typing import Any

import ml_dtypes
import numpy as np
import optree
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorbridge as tb
from _budget import examples
from conftest import ROWS  # the rows torch has (NumPy-only ones: their own tests)
from tensorbridge import _memory as M
from tensorbridge import _staging as S
from tensorbridge import tree as T
from tensorbridge.tree import tree_to_numpy, tree_to_torch

Pair = namedtuple("Pair", "first second")

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
FP4: Any = getattr(torch, "float4_e2m1fn_x2", None)
needs_fp4 = pytest.mark.skipif(FP4 is None, reason="this torch has no float4_e2m1fn_x2")


@dataclasses.dataclass
class Box:
    weight: Any
    bias: Any = None


@dataclasses.dataclass(frozen=True)
class Frozen:
    weight: Any
    step: int = 0


@dataclasses.dataclass
class Tracked:
    """__post_init__ counts its runs: rebuilding a converted tree must not run it again."""

    value: Any
    runs: int = dataclasses.field(init=False, default=0)

    def __post_init__(self) -> None:
        self.runs += 1


def bits(x: Any) -> bytes:
    """The raw bytes of a tensor or array, in logical (C) order."""
    if isinstance(x, torch.Tensor):
        x = tb.to_numpy(x.cpu())
    return np.ascontiguousarray(x).tobytes()


def random_tensor(row: tb.DTypeRow, shape: tuple[int, ...] = (3, 4), seed: int = 0) -> torch.Tensor:
    """A tensor of every bit pattern mix (NaN payloads included); bools stay 0/1."""
    g = torch.Generator().manual_seed(seed)
    n = int(np.prod(shape))
    if row.name == "bool":
        return torch.randint(0, 2, shape, generator=g).bool()
    raw = torch.randint(0, 256, (n * row.itemsize,), dtype=torch.uint8, generator=g)
    return raw.view(row.torch).reshape(shape)


# --- structure --------------------------------------------------------------------------------


def skeleton(x: Any) -> Any:
    """The structure of a tree, with every tensor or array replaced by its shape."""
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return ("array", tuple(x.shape))
    if isinstance(x, defaultdict):
        return (defaultdict, x.default_factory, [(k, skeleton(v)) for k, v in x.items()])
    if isinstance(x, dict):
        return (type(x), [(k, skeleton(v)) for k, v in x.items()])
    if isinstance(x, deque):
        return (deque, x.maxlen, [skeleton(v) for v in x])
    if isinstance(x, (list, tuple)):
        return (type(x), [skeleton(v) for v in x])
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (type(x), [(f.name, skeleton(getattr(x, f.name))) for f in dataclasses.fields(x)])
    return ("leaf", type(x), x)


def arrays_of(x: Any) -> list[Any]:
    """Every tensor / array of a tree in container order (a walker independent of optree)."""
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return [x]
    if isinstance(x, dict):
        return [a for v in x.values() for a in arrays_of(v)]
    if isinstance(x, (list, tuple, deque)):
        return [a for v in x for a in arrays_of(v)]
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return [a for f in dataclasses.fields(x) for a in arrays_of(getattr(x, f.name))]
    return []


CONTAINERS = {
    "dict": lambda a, b: {"z": a, "a": b},  # insertion order, not sorted order
    "OrderedDict": lambda a, b: OrderedDict([("z", a), ("a", b)]),
    "defaultdict": lambda a, b: defaultdict(list, {"z": a, "a": b}),
    "list": lambda a, b: [a, b],
    "tuple": lambda a, b: (a, b),
    "namedtuple": lambda a, b: Pair(a, b),
    "deque": lambda a, b: deque([a, b], maxlen=5),
    "dataclass": lambda a, b: Box(a, b),
    "frozen dataclass": lambda a, b: Frozen(a, b),
    "int keys": lambda a, b: {3: a, 1: b},
}


@pytest.mark.parametrize("make", CONTAINERS.values(), ids=CONTAINERS.keys())
def test_each_container_kind_keeps_type_order_and_values(make: Any) -> None:
    a = torch.arange(6, dtype=torch.bfloat16).reshape(2, 3)
    b = torch.tensor([True, False])
    tree = {"outer": [make(a, b), make(b, "text")]}
    out = tree_to_numpy(tree)
    assert skeleton(out) == skeleton(tree)
    assert [bits(x) for x in arrays_of(out)] == [bits(x) for x in arrays_of(tree)]
    back = tree_to_torch(out)
    assert skeleton(back) == skeleton(tree)
    assert [x.dtype for x in arrays_of(back)] == [x.dtype for x in arrays_of(tree)]
    assert [bits(x) for x in arrays_of(back)] == [bits(x) for x in arrays_of(tree)]


def test_dataclasses_are_rebuilt_without_running_init_again() -> None:
    tracked = Tracked(torch.ones(2))
    assert tracked.runs == 1
    out = tree_to_numpy({"t": tracked}, copy=True)["t"]
    assert type(out) is Tracked and out.runs == 1 and isinstance(out.value, np.ndarray)
    assert isinstance(tracked.value, torch.Tensor)  # the input is left alone


def test_slotted_and_nested_dataclasses() -> None:
    @dataclasses.dataclass(slots=True)
    class Slotted:
        inner: Any
        n: int = 2

    tree = Slotted(Box(torch.zeros(1), Frozen(torch.ones(1))))
    out = tree_to_numpy(tree)
    assert type(out) is Slotted and type(out.inner) is Box and type(out.inner.bias) is Frozen
    assert isinstance(out.inner.bias.weight, np.ndarray) and out.n == 2


def test_dataclass_registration_is_private_to_tensorbridge() -> None:
    @dataclasses.dataclass
    class Local:
        x: Any

    tree_to_numpy(Local(torch.zeros(1)))
    instance: Any = Local(1)
    assert optree.tree_leaves(instance) == [instance]  # the default namespace: still a leaf
    assert tree_to_numpy(Local) is Local  # a dataclass *type* is a leaf like any other


def test_a_bare_tensor_is_a_tree() -> None:
    t = torch.arange(3)
    assert np.shares_memory(tree_to_numpy(t), t.numpy())


TREE_DTYPES = [
    r for r in ROWS if r.name in ("float32", "bfloat16", "int64", "bool", "float8_e4m3fn")
]


@st.composite
def tensors(draw: st.DrawFn) -> torch.Tensor:
    row = draw(st.sampled_from(TREE_DTYPES))
    shape = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
    return random_tensor(row, shape, seed=draw(st.integers(0, 2**16)))


leaves = st.one_of(
    tensors(), st.integers(), st.text(max_size=3), st.none(), st.floats(allow_nan=False)
)
keys = st.text(alphabet="abcxyz", min_size=1, max_size=3)
trees = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=3),
        st.lists(children, max_size=3).map(tuple),
        st.dictionaries(keys, children, max_size=3),
        st.dictionaries(keys, children, max_size=3).map(OrderedDict),
        st.builds(Pair, children, children),
        st.builds(Box, children, children),
    ),
    max_leaves=10,
)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=trees, copy=st.sampled_from([None, True]))
def test_random_trees_round_trip_bit_exact(tree: Any, copy: bool | None) -> None:
    out = tree_to_numpy(tree, copy=copy)
    assert skeleton(out) == skeleton(tree)
    src = arrays_of(tree)
    got = arrays_of(out)
    assert all(isinstance(a, np.ndarray) for a in got)
    assert [a.dtype for a in got] == [tb.numpy_dtype(t.dtype) for t in src]
    assert [bits(a) for a in got] == [bits(t) for t in src]
    back = tree_to_torch(out, copy=copy)
    assert skeleton(back) == skeleton(tree)
    assert [t.dtype for t in arrays_of(back)] == [t.dtype for t in src]
    assert [bits(t) for t in arrays_of(back)] == [bits(t) for t in src]


# --- pass-through -----------------------------------------------------------------------------


def test_non_array_leaves_are_the_same_objects() -> None:
    marker = object()
    leaves = {
        "i": 3,
        "f": 2.5,
        "s": "relu",
        "n": None,
        "o": marker,
        "b": b"x",
        "scalar": np.float32(1),
    }
    for out in (tree_to_numpy(leaves, float_dtype=np.float16), tree_to_numpy(leaves, copy=True)):
        assert all(out[k] is v for k, v in leaves.items())
    back = tree_to_torch({k: v for k, v in leaves.items() if k != "scalar"}, dtype=torch.float16)
    assert all(back[k] is leaves[k] for k in back)


def test_numpy_scalars_become_tensors_on_the_way_to_torch() -> None:
    out = tree_to_torch({"lr": np.float64(0.5), "step": np.int64(3)}, float_dtype=torch.float32)
    assert out["lr"].dtype == torch.float32 and out["lr"].item() == 0.5
    assert out["step"].dtype == torch.int64 and out["step"].shape == ()


def test_arrays_in_tree_to_numpy_follow_the_copy_contract() -> None:
    a = np.arange(4.0)
    assert tree_to_numpy({"a": a})["a"] is a
    copied = tree_to_numpy({"a": a}, copy=True)["a"]
    assert not np.shares_memory(copied, a) and np.array_equal(copied, a)
    frozen = tree_to_numpy({"a": a}, readonly=True)["a"]
    assert np.shares_memory(frozen, a) and not frozen.flags.writeable and a.flags.writeable
    assert tree_to_numpy({"a": a}, float_dtype="bf16")["a"].dtype == ml_dtypes.bfloat16


def test_tensors_in_tree_to_torch_follow_the_copy_contract() -> None:
    t = torch.arange(4.0)
    assert tree_to_torch({"t": t})["t"] is t
    copied = tree_to_torch({"t": t}, copy=True)["t"]
    assert copied.data_ptr() != t.data_ptr() and torch.equal(copied, t)
    assert tree_to_torch({"t": t}, device="cpu")["t"] is t
    assert tree_to_torch({"t": t}, float_dtype=torch.bfloat16)["t"].dtype == torch.bfloat16


# --- dtype casts ------------------------------------------------------------------------------


def bn_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3),
        torch.nn.BatchNorm2d(8),
        torch.nn.ReLU(),
        torch.nn.Flatten(),
        torch.nn.Linear(8 * 4 * 4, 10),
    )


def test_float_dtype_on_a_bf16_state_dict_keeps_integer_buffers() -> None:
    model = bn_model().to(torch.bfloat16)
    model(torch.randn(2, 3, 6, 6, dtype=torch.bfloat16))  # moves the BatchNorm statistics
    sd = model.state_dict()
    assert sd["1.num_batches_tracked"].dtype == torch.int64
    out = tree_to_numpy(sd, float_dtype=np.float32)
    assert list(out) == list(sd)
    assert out["1.num_batches_tracked"].dtype == np.int64
    assert out["1.num_batches_tracked"] == 1
    for name, t in sd.items():
        if t.is_floating_point():
            assert out[name].dtype == np.float32, name
            assert np.array_equal(out[name], t.float().numpy()), name
    back = tree_to_torch(out, float_dtype=torch.bfloat16)
    assert all(torch.equal(back[k], v) and back[k].dtype == v.dtype for k, v in sd.items())
    bf16_model = bn_model().to(torch.bfloat16)
    bf16_model.load_state_dict(back)  # a state dict torch accepts as it is


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_float_dtype_casts_exactly_the_floating_rows(row: tb.DTypeRow) -> None:
    t = random_tensor(row, (2, 3))
    if row.is_floating:  # keep finite values so the float32 check can compare
        t = torch.tensor([[0.5, -1.0, 2.0], [0.0, 0.25, 1.5]]).to(row.torch)
    out = tree_to_numpy({"x": t}, float_dtype="float32")["x"]
    if row.is_floating:
        assert out.dtype == np.float32
        assert np.array_equal(out, t.float().numpy())
    else:  # bool, integers and complex (complex32 included) are left alone
        assert out.dtype == row.numpy
        assert bits(out) == bits(t)
    back = tree_to_torch({"x": tb.to_numpy(t)}, float_dtype=torch.float32)["x"]
    assert back.dtype == (torch.float32 if row.is_floating else row.torch)


def test_dtype_casts_every_array_leaf() -> None:
    tree = {"w": torch.ones(2, dtype=torch.bfloat16), "n": torch.tensor([1, 2]), "s": "x"}
    out = tree_to_numpy(tree, dtype="float64")
    assert out["w"].dtype == out["n"].dtype == np.float64 and out["s"] == "x"
    back = tree_to_torch(out, dtype=torch.int32)
    assert back["w"].dtype == back["n"].dtype == torch.int32


@needs_fp4
def test_fp4_unpacking_and_packing_go_leaf_by_leaf() -> None:
    packed = torch.tensor([0x21, 0x43], dtype=torch.uint8).view(FP4)
    out = tree_to_numpy({"q": packed, "step": 7}, dtype=ml_dtypes.float4_e2m1fn)
    assert out["step"] == 7 and out["q"].dtype == ml_dtypes.float4_e2m1fn
    assert out["q"].astype(np.float32).tolist() == [0.5, 1.0, 1.5, 2.0]
    back = tree_to_torch(out, dtype=FP4)
    assert bits(back["q"].view(torch.uint8)) == bits(packed.view(torch.uint8))


def test_dtype_and_float_dtype_together_is_an_error() -> None:
    with pytest.raises(TypeError, match="not both"):
        tree_to_numpy({}, dtype="f32", float_dtype="f32")
    with pytest.raises(TypeError, match="not both"):
        tree_to_torch({}, dtype="f32", float_dtype="f32")


def test_float_dtype_must_be_a_float() -> None:
    with pytest.raises(tb.UnsupportedDtypeError, match="float_dtype=int32 is not a floating"):
        tree_to_numpy({}, float_dtype=np.int32)


# --- ties -------------------------------------------------------------------------------------

CASES = {"share": {}, "copy": {"copy": True}, "cast": {"float_dtype": "float32"}}


@pytest.mark.parametrize("kwargs", CASES.values(), ids=CASES.keys())
def test_the_same_tensor_twice_becomes_the_same_array(kwargs: dict[str, Any]) -> None:
    w = torch.randn(4, 4, dtype=torch.bfloat16)
    out = tree_to_numpy({"embed": w, "head": w}, **kwargs)
    assert out["embed"] is out["head"]


@pytest.mark.parametrize("kwargs", CASES.values(), ids=CASES.keys())
def test_views_of_one_storage_stay_views(kwargs: dict[str, Any]) -> None:
    a = torch.randn(4, 6, dtype=torch.bfloat16)
    tree = {"a": a, "rows": a[1:], "t": a.t(), "col": a[:, 2], "flat": a.view(-1)[::5]}
    out = tree_to_numpy(tree, **kwargs)
    for name, t in tree.items():
        expected = t.float().numpy() if kwargs.get("float_dtype") else tb.to_numpy(t)
        assert out[name].dtype == expected.dtype and np.array_equal(out[name], expected), name
        assert np.shares_memory(out["a"], out[name]), name
        assert out[name].strides == tuple(s * out[name].itemsize for s in t.stride()), name
    if kwargs:
        assert not np.shares_memory(out["a"], tb.to_numpy(a))  # a copy, made once
    out["a"][1, 2] = 42  # written through one leaf, seen through the others
    assert out["rows"][0, 2] == out["t"][2, 1] == out["col"][1] == 42
    assert out["flat"][1] == out["a"].reshape(-1)[5]


def test_a_tie_in_a_real_state_dict_survives_a_cast() -> None:
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied input and output embeddings
    sd = model.to(torch.bfloat16).state_dict()
    assert sd["0.weight"] is not sd["1.weight"]  # state_dict detaches each entry separately
    out = tree_to_numpy(sd, float_dtype="float32")
    assert np.shares_memory(out["0.weight"], out["1.weight"])
    assert np.array_equal(out["1.weight"], sd["1.weight"].float().numpy())


def test_views_with_another_dtype_share_raw_copies() -> None:
    w = torch.randn(8)
    tree = {"w": w, "bits": w.view(torch.int32), "bytes": w.view(torch.uint8)[4:12]}
    out = tree_to_numpy(tree, copy=True)
    assert np.shares_memory(out["w"], out["bits"]) and np.shares_memory(out["w"], out["bytes"])
    assert all(bits(out[k]) == bits(v) for k, v in tree.items())
    cast = tree_to_numpy(tree, float_dtype="float64")  # floats cast, integer views copied
    assert cast["w"].dtype == np.float64 and cast["bits"].dtype == np.int32
    assert np.array_equal(cast["w"], w.double().numpy()) and bits(cast["bits"]) == bits(w)
    assert np.shares_memory(cast["bits"], cast["bytes"])


def test_leaves_that_do_not_overlap_are_copied_apart() -> None:
    big = torch.zeros(1000, 100)
    out = tree_to_numpy({"first": big[0], "last": big[-1]}, copy=True)
    assert not np.shares_memory(out["first"], out["last"])
    rows = tree_to_torch({"first": big.numpy()[0], "last": big.numpy()[-1]}, copy=True)
    assert rows["first"].untyped_storage().nbytes() == 400  # not the 400 kB in between


def test_ties_survive_tree_to_torch_copies_and_casts() -> None:
    a = np.arange(12.0).reshape(3, 4)
    a.flags.writeable = False  # a read-only source must be copied, never aliased
    tree = {"a": a, "tail": a[1:], "cols": a[:, ::2], "t": torch.from_numpy(np.arange(3.0))}
    for kwargs in ({}, {"copy": True}, {"float_dtype": torch.float32}):
        out = tree_to_torch(tree, **kwargs)
        storage = out["a"].untyped_storage().data_ptr()
        assert out["tail"].untyped_storage().data_ptr() == storage
        assert out["cols"].untyped_storage().data_ptr() == storage
        assert out["tail"].data_ptr() - out["a"].data_ptr() == 4 * out["a"].element_size()
        assert torch.equal(out["cols"], torch.from_numpy(a[:, ::2].copy()).to(out["a"].dtype))
        out["a"][1, 0] = -1
        assert out["tail"][0, 0] == -1 and a[1, 0] == 4.0


def test_memory_mapped_leaves(tmp_path: Any) -> None:
    path = tmp_path / "w.npy"
    np.save(path, np.arange(8.0, dtype=np.float32))
    ro = np.load(path, mmap_mode="r")
    out = tree_to_torch({"w": ro, "tail": ro[2:]}, float_dtype=torch.float16)
    assert out["tail"].data_ptr() == out["w"].data_ptr() + 2 * 2
    assert out["w"].tolist() == list(range(8))
    cow = np.load(path, mmap_mode="c")
    shared = tree_to_torch({"w": cow})
    shared["w"][0] = 9
    assert cow[0] == 9 and np.load(path)[0] == 0


def test_an_array_and_a_tensor_over_one_memory_stay_tied() -> None:
    a = np.arange(6.0)
    out = tree_to_torch({"array": a, "tensor": torch.from_numpy(a)[2:]}, float_dtype=torch.float32)
    assert out["tensor"].data_ptr() == out["array"].data_ptr() + 2 * 4


VIEWS = {
    "whole": lambda a: a,
    "rows": lambda a: a[1:4],
    "cols": lambda a: a[:, 2:7],
    "row": lambda a: a[3],
    "T": lambda a: a.T,
    "step rows": lambda a: a[::2],
    "odd rows": lambda a: a[1::2],
    "flat slice": lambda a: a.reshape(-1)[5:30:3],
    "corner": lambda a: a[4:, 6:],
    "element": lambda a: a[5, 7, ...],  # a 0-d view (a[5, 7] is a NumPy scalar)
}


@settings(max_examples=examples(80), deadline=None)
@given(
    picks=st.lists(st.sampled_from(sorted(VIEWS)), min_size=1, max_size=5),
    mode=st.sampled_from(["copy", "float32", "float64", "to torch"]),
)
def test_random_views_keep_exactly_their_memory_overlaps(picks: list[str], mode: str) -> None:
    base = np.arange(48, dtype=np.float32).reshape(6, 8)
    if mode == "to torch":
        base.flags.writeable = False  # so tree_to_torch must copy
        tree = {f"{i}:{name}": VIEWS[name](base) for i, name in enumerate(picks)}
        out = {k: tb.to_numpy(v) for k, v in tree_to_torch(tree).items()}
    else:
        t = torch.from_numpy(base).to(torch.bfloat16)
        tree = {f"{i}:{name}": VIEWS[name](t) for i, name in enumerate(picks)}
        kwargs = {"copy": True} if mode == "copy" else {"float_dtype": mode}
        out = tree_to_numpy(tree, **kwargs)
        tree = {k: tb.to_numpy(v) for k, v in tree.items()}
    for k, v in tree.items():
        assert np.array_equal(out[k].astype(np.float64), v.astype(np.float64)), k
        assert not np.shares_memory(out[k], base)
    for k in tree:
        for j in tree:
            assert np.shares_memory(out[k], out[j]) == np.shares_memory(tree[k], tree[j]), (k, j)


# --- key paths --------------------------------------------------------------------------------


def message_of(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(tb.TensorBridgeError) as info:
        fn(*args, **kwargs)
    return str(info.value)


@needs_fp4
@pytest.mark.parametrize("kwargs", [{}, {"copy": True}], ids=["fast", "general"])
def test_errors_name_the_key_path(kwargs: dict[str, Any]) -> None:
    bad = torch.zeros(2, dtype=torch.uint8).view(FP4)
    tree = {"encoder": {"layers": [torch.zeros(1), 1, "x", {"weight": bad}]}}
    with pytest.raises(tb.UnsupportedDtypeError) as info:
        tree_to_numpy(tree, **kwargs)
    plain = message_of(tb.to_numpy, bad, **kwargs)
    assert str(info.value) == f"at ['encoder']['layers'][3]['weight']: {plain}"
    assert isinstance(info.value, TypeError)


@needs_fp4
def test_key_path_entries_for_every_container_kind() -> None:
    bad = torch.zeros(2, dtype=torch.uint8).view(FP4)
    plain = message_of(tb.to_numpy, bad)
    cases = {
        "['a'][1]": {"a": [0, bad]},
        "[3][0]": {3: (bad,)},
        "['o']['k']": {"o": OrderedDict(k=bad)},
        ".second": Pair(1, bad),
        "['m'].weight": {"m": Box(bad)},
        ".weight": Frozen(bad),
    }
    for path, tree in cases.items():
        assert message_of(tree_to_numpy, tree) == f"at {path}: {plain}"


@pytest.mark.parametrize("to", ["numpy", "torch"])
def test_a_flat_state_dict_names_the_leaf_a_nested_one_would(to: str) -> None:
    # A flat dict of str keys skips the tree walk; its errors still name the leaf that
    # optree's order (sorted keys) meets first, and its keys keep their own order.
    if to == "numpy":
        bad: Any = torch.empty(2, device="meta")
        good: Any = torch.ones(2)
        convert: Any = tree_to_numpy
    else:
        bad, good, convert = np.array(["x", "y"]), np.ones(2), tree_to_torch
    flat = {"z": good, "m": bad, "b": bad[:1], "a": good}
    nested = {"n": flat}

    with pytest.raises(Exception) as flat_error:
        convert(flat)
    with pytest.raises(Exception) as nested_error:
        convert(nested)

    assert type(flat_error.value) is type(nested_error.value)
    assert str(flat_error.value).startswith("at ['b']: ")
    assert str(nested_error.value) == str(flat_error.value).replace("at [", "at ['n'][", 1)
    fine = convert({"z": good, "a": good, "m": good})
    assert list(fine) == ["z", "a", "m"] and fine["z"] is fine["a"]


def test_a_failing_root_leaf_keeps_its_own_message() -> None:
    meta = torch.empty(2, device="meta")
    assert message_of(tree_to_numpy, meta) == message_of(tb.to_numpy, meta)


def test_copy_false_refusals_name_the_key_path() -> None:
    sd = {"block": [{"w": torch.ones(2, dtype=torch.bfloat16)}]}
    with pytest.raises(tb.CopyRequiredError) as info:
        tree_to_numpy(sd, float_dtype="float32", copy=False)
    plain = message_of(tb.to_numpy, sd["block"][0]["w"], dtype="float32", copy=False)
    assert str(info.value) == f"at ['block'][0]['w']: {plain}"
    shared = tree_to_numpy({"n": torch.arange(2)}, float_dtype="float32", copy=False)
    assert shared["n"].dtype == np.int64  # no cast needed: shared, no error

    frozen = np.zeros(2)
    frozen.flags.writeable = False
    with pytest.raises(tb.CopyRequiredError, match=r"^at \['x'\]\.first: to_torch\(copy=False\)"):
        tree_to_torch({"x": Pair(frozen, 1)}, copy=False)


def test_tree_to_torch_errors_name_the_key_path() -> None:
    words = np.array(["a", "b"])
    plain = message_of(tb.to_torch, words)
    assert message_of(tree_to_torch, {"vocab": [words]}) == f"at ['vocab'][0]: {plain}"
    masked = np.ma.masked_array([1.0, 2.0], mask=[False, True])
    assert message_of(tree_to_torch, {"m": masked}).startswith("at ['m']: a masked array")


def test_meta_tensors_in_a_tree_raise_no_data_with_the_path() -> None:
    with pytest.raises(tb.NoDataError, match=r"^at \['w'\]: a meta tensor"):
        tree_to_numpy({"ok": torch.zeros(1), "w": torch.empty(3, device="meta")})


# --- copy semantics ---------------------------------------------------------------------------


def test_default_shares_memory_with_cpu_tensors() -> None:
    sd: dict[str, torch.Tensor] = {"w": torch.zeros(3), "p": torch.nn.Parameter(torch.zeros(2))}
    out = tree_to_numpy(sd)
    out["w"][0] = 1
    out["p"][0] = 2
    assert sd["w"][0] == 1 and sd["p"][0] == 2


def test_copy_true_is_independent() -> None:
    sd: dict[str, Any] = {"w": torch.zeros(3), "a": np.zeros(3)}
    out = tree_to_numpy(sd, copy=True)
    sd["w"][0] = 1
    sd["a"][0] = 1
    assert out["w"][0] == 0 and out["a"][0] == 0
    back = tree_to_torch(out, copy=True)
    out["w"][1] = 5
    assert back["w"][1] == 0


def test_readonly_arrays_cannot_be_written_through() -> None:
    w = torch.zeros(4)
    for kwargs in ({}, {"copy": True}, {"float_dtype": "float16"}):
        out = tree_to_numpy({"w": w, "v": w[1:]}, readonly=True, **kwargs)
        assert not out["w"].flags.writeable and not out["v"].flags.writeable
        with pytest.raises(ValueError, match="read-only"):
            out["v"][0] = 1


def test_tree_to_torch_shares_writable_arrays_and_never_aliases_read_only_ones() -> None:
    a = np.zeros(3)
    frozen = np.zeros(3)
    frozen.flags.writeable = False
    out = tree_to_torch({"a": a, "frozen": frozen})
    out["a"][0] = 1
    assert a[0] == 1
    out["frozen"][0] = 1
    assert frozen[0] == 0


@pytest.mark.parametrize("frozen_first", [True, False])
def test_float_dtype_shares_the_other_leaves_but_never_aliases_read_only_ones(
    frozen_first: bool,
) -> None:
    """The leaves a cast leaves alone are views where writable, copies where read-only,
    in whichever order the tree meets them (the pass reuses a dtype's view plan)."""
    a = np.arange(3)
    frozen = np.arange(3)
    frozen.flags.writeable = False
    backwards = np.arange(3)[::-1]  # torch cannot view it: copied, same values
    w = np.ones(4, np.float32)
    leaves = [("frozen", frozen), ("a", a)] if frozen_first else [("a", a), ("frozen", frozen)]
    tree = dict([*leaves, ("backwards", backwards), ("w", w)])
    out = tree_to_torch(tree, float_dtype=torch.bfloat16)
    assert out["w"].dtype == torch.bfloat16 and out["w"].tolist() == [1.0] * 4
    assert out["a"].data_ptr() == a.ctypes.data
    assert out["frozen"].data_ptr() != frozen.ctypes.data
    assert out["backwards"].tolist() == [2, 1, 0]
    out["frozen"][0] = 9
    assert frozen[0] == 0


# --- planning (pure) --------------------------------------------------------------------------


def layout(
    start: int,
    shape: tuple[int, ...],
    strides: tuple[int, ...],
    size: int = 4,
    where: Any = ("cuda:0", 1000),
    dtype: str = "float32",
) -> S.Layout:
    row = tb.resolve_dtype(dtype)
    assert row.itemsize == size
    return S.Layout.of(where, start, shape, strides, row)


def test_plan_merges_overlapping_leaves_transitively() -> None:
    entries = [
        (layout(0, (4,), (4,)), None),  # [0, 16)
        (layout(12, (4,), (4,)), None),  # [12, 28): overlaps the first
        (layout(24, (2,), (4,)), None),  # [24, 32): overlaps only the second
        (layout(64, (2,), (4,)), None),  # [64, 72): alone
    ]
    assert S.plan_groups(entries) == [
        S.Group((0, 1, 2), 0, 32, True),
        S.Group((3,), 64, 72, False),
    ]


def test_plan_keeps_storages_devices_and_casts_apart() -> None:
    entries = [
        (layout(0, (4,), (4,)), None),
        (layout(0, (4,), (4,), where=("cuda:0", 2000)), None),
        (layout(0, (4,), (4,), where=("cuda:1", 1000)), None),
        (layout(0, (4,), (4,)), ("float32", "float16")),
    ]
    assert [g.members for g in S.plan_groups(entries)] == [(0,), (1,), (2,), (3,)]


def test_plan_alike_leaves_convert_once_without_a_span() -> None:
    same = layout(8, (2, 2), (4, 8))
    entries = [(same, None), (layout(8, (2, 2), (4, 8)), None)]
    assert S.plan_groups(entries) == [S.Group((0, 1), 8, 8 + 16, False)]
    other_dtype = layout(8, (2, 2), (4, 8), dtype="int32")  # same bytes, other dtype
    assert S.plan_groups([(same, None), (other_dtype, None)])[0].shared


def test_plan_empty_and_misaligned_leaves_stand_alone() -> None:
    empty = layout(4, (0, 3), (12, 4))
    bytes_view = layout(1, (8,), (1,), size=1, dtype="uint8")  # [1, 9)
    word = layout(4, (2,), (4,))  # [4, 12): 3 bytes into the span, not a whole word
    groups = S.plan_groups([(empty, None), (bytes_view, None), (word, None)])
    assert groups == [
        S.Group((0,), 4, 4, False),
        S.Group((1,), 1, 9, False),
        S.Group((2,), 4, 12, False),
    ]


def test_plan_staging_aligns_every_slot() -> None:
    offsets, total = S.plan_staging([10, 0, 64, 65, 1])
    assert offsets == [0, 64, 64, 128, 256] and total == 320
    assert S.plan_staging([]) == ([], 0)


# --- the staging path, driven with CPU tensors ------------------------------------------------


def staged(values: list[Any], cast: str | None, direction: str) -> list[torch.Tensor]:
    """Run gather (device -> host) or scatter (host -> device) on CPU memory."""
    planned = []
    for i, v in enumerate(values):
        row = tb.resolve_dtype(v.dtype)
        dst = tb.resolve_dtype(cast) if cast and row.is_floating else row
        if isinstance(v, np.ndarray):
            lay = S.array_layout(v, row)
        else:  # as device tensors are planned: by storage
            lay = S.tensor_layout(v, row, by_address=direction == "scatter")
        planned.append(S.Leaf(i, v, row, dst, lay))
    cursor = S.Cursor()
    jobs = S.plan_jobs(planned, cursor)
    if direction == "gather":
        bufs = S.gather(jobs, cursor)
    else:
        bufs = S.scatter(jobs, torch.device("cpu"), cursor)
    made = S.rebuild(zip(jobs, bufs, strict=True), planned)
    return [made[i] for i in range(len(values))]


@pytest.mark.parametrize("cast", [None, "float32", "float8_e4m3fn"], ids=str)
def test_gather_stages_once_and_waits_once(cast: str | None, monkeypatch: Any) -> None:
    waits: list[torch.device] = []
    monkeypatch.setattr(M, "wait", waits.append)
    w = torch.randn(6, 5).to(torch.bfloat16)
    other = torch.randn(3)
    values = [w, w[2:], w.t(), other, torch.arange(4), w[:, 1]]
    got = staged(values, cast, "gather")
    assert waits == [torch.device("cpu")]  # one wait for the one device, not one per leaf
    for v, g in zip(values, got, strict=True):
        want = v.to(tb.torch_dtype(cast)) if cast and v.is_floating_point() else v
        assert g.dtype == want.dtype and bits(g) == bits(want)
    assert got[1].untyped_storage().data_ptr() == got[0].untyped_storage().data_ptr()
    assert got[1].data_ptr() - got[0].data_ptr() == 2 * 5 * got[0].element_size()
    assert got[2].stride() == (1, 5)
    assert got[5].data_ptr() == got[0].data_ptr() + got[0].element_size()
    assert got[0].data_ptr() != w.data_ptr()


@pytest.mark.parametrize("cast", [None, "float64", "float16"], ids=str)
def test_scatter_stages_host_leaves_and_keeps_ties(cast: str | None) -> None:
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    values = [a, a[1:], torch.arange(5), np.float32(2) * np.ones(2, np.float32)]
    got = staged(values, cast, "scatter")
    assert got[1].untyped_storage().data_ptr() == got[0].untyped_storage().data_ptr()
    # (on a CPU "device" every staging slot shares one storage: the offset is the real check)
    assert got[1].data_ptr() - got[0].data_ptr() == 4 * got[0].element_size()
    for v, g in zip(values, got, strict=True):
        want = torch.as_tensor(np.asarray(v))
        if cast and want.is_floating_point():
            want = want.to(tb.torch_dtype(cast))
        assert g.dtype == want.dtype and torch.equal(g, want)


# --- CUDA (skipped without a device) ----------------------------------------------------------


@needs_cuda
def test_cuda_tree_to_numpy_is_bit_exact_and_waits_once(monkeypatch: Any) -> None:
    waits: list[torch.device] = []
    real_wait = M.wait

    def counting_wait(device: torch.device) -> None:
        waits.append(device)
        real_wait(device)

    monkeypatch.setattr(M, "wait", counting_wait)
    w = random_tensor(tb.resolve_dtype("bfloat16"), (64, 32)).cuda()
    sd = {f"l{i}": torch.randn(16, device="cuda") for i in range(50)}
    sd.update(w=w, tail=w[8:], n=torch.arange(3, device="cuda"))
    out = tree_to_numpy(sd)
    assert len(waits) == 1
    assert all(bits(out[k]) == bits(v.cpu()) for k, v in sd.items())
    assert np.shares_memory(out["w"], out["tail"])
    cast = tree_to_numpy(sd, float_dtype="float32")
    assert bits(cast["w"]) == bits(w.float()) and cast["n"].dtype == np.int64  # NaN payloads too


@needs_cuda
def test_cuda_tree_to_torch_stages_host_leaves() -> None:
    a = np.arange(12.0, dtype=np.float32).reshape(3, 4)
    out = tree_to_torch({"a": a, "tail": a[1:], "n": np.arange(3)}, device="cuda")
    assert out["a"].device.type == "cuda" and torch.equal(out["a"].cpu(), torch.from_numpy(a))
    assert out["tail"].untyped_storage().data_ptr() == out["a"].untyped_storage().data_ptr()
    back = tree_to_torch(out, device="cpu", float_dtype=torch.float64)
    assert back["tail"].dtype == torch.float64
    assert torch.equal(back["tail"], out["tail"].cpu().double())


@needs_cuda
def test_cuda_copy_false_names_the_key_path() -> None:
    with pytest.raises(tb.CopyRequiredError, match=r"^at \['w'\]: to_numpy\(copy=False\)"):
        tree_to_numpy({"w": torch.zeros(2, device="cuda")}, copy=False)


# --- docs -------------------------------------------------------------------------------------


def test_doctests(monkeypatch: pytest.MonkeyPatch) -> None:
    # The examples call tb.tree_to_numpy; make that resolve before and after the export.
    monkeypatch.setattr(tb, "tree_to_numpy", tree_to_numpy, raising=False)
    monkeypatch.setattr(tb, "tree_to_torch", tree_to_torch, raising=False)
    result = doctest.testmod(T, optionflags=doctest.ELLIPSIS)
    assert result.attempted >= 2 and result.failed == 0

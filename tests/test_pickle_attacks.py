"""Hostile pickles against the pickle machine, as the attacker of issue 26 would write them.

Each attack is a ``torch.save`` file crafted by hand (raw opcodes of protocols 0-5,
inside real zip structures of the zip era or legacy streams) and opened the way a user
does (``tb.open``: plain values, every supported entry as owned NumPy memory and as a
torch tensor). Every attack asserts

* its outcome: a ``TensorBridgeError`` whose message names what is wrong (and never
  advises ``weights_only=False``), or the documented accepted result;
* the interpreter unchanged afterwards: ``vars()`` of ``pathlib``'s path classes,
  ``collections.OrderedDict``, ``torch.Tensor``, ``torch.Size``, ``builtins``,
  ``torch._utils``, ``copyreg``'s tables and the machine's own table, and no module
  imported that the file named;
* gross blow-ups only: at most ``CPU_LIMIT`` seconds of CPU (a ``SIGPROF`` watchdog) and
  a traced peak of ``EXPANSION`` times the file plus ``MARGIN``; benchmarks time, not
  these tests.

An attack the current machine does not withstand is marked
``xfail(strict=True, reason=<the hole>)``: the suite stays green and the hole stays
written down until it is fixed (then the mark must go). The refused inputs are also in
``tests/fuzz_corpus/pt/`` (``attack-<id>``), which ``tests/test_fuzz.py`` replays.
"""

# ruff: noqa: E501  (the attack table keeps one attack to a row, bytes spelled out)

from __future__ import annotations

import builtins
import collections
import copyreg
import io
import pathlib
import pickle
import re
import signal
import struct
import sys
import tracemalloc
import warnings
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import numpy as np
import pytest
import torch

import tensorbridge as tb
from tensorbridge.errors import TensorBridgeError
from tensorbridge.io import pickle_machine

CORPUS = Path(__file__).parent / "fuzz_corpus" / "pt"
CPU_LIMIT = 5.0  # seconds of CPU an attack may cost: a bound for blow-ups, not a benchmark
EXPANSION = 8  # traced bytes per file byte, beyond MARGIN
MARGIN = 32 << 20
COPY_MARGIN = 64 << 20  # pt.COPY_MARGIN: what one entry may repeat beyond the file

# --------------------------------------------------------------------------- the assembler


def s(text: str) -> bytes:
    """A str: SHORT_BINUNICODE or BINUNICODE."""
    raw = text.encode("utf-8", "surrogatepass")
    if len(raw) < 256:
        return b"\x8c" + bytes([len(raw)]) + raw
    return b"X" + struct.pack("<I", len(raw)) + raw


def i(n: int) -> bytes:
    """An int: BININT1 / BININT2 / BININT, else LONG1 (any sign, any size below 2**2040)."""
    if 0 <= n < 256:
        return b"K" + bytes([n])
    if 0 <= n < 65536:
        return b"M" + struct.pack("<H", n)
    if -(2**31) <= n < 2**31:
        return b"J" + struct.pack("<i", n)
    body = n.to_bytes((n.bit_length() + 8) // 8, "little", signed=True)
    return b"\x8a" + bytes([len(body)]) + body


def g(module: str, name: str) -> bytes:
    """GLOBAL module.name (protocol 0's text form, as torch writes with protocol 2)."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def tup(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"


def ints(*ns: int) -> bytes:
    return tup(*(i(n) for n in ns))


def call(fn: bytes, *args: bytes) -> bytes:
    return fn + tup(*args) + b"R"


def pid(
    key: str, numel: int | bytes, stype: str = "FloatStorage", *, legacy: bool = False
) -> bytes:
    """A storage's persistent id, BINPERSID: ("storage", torch.<stype>, key, "cpu", numel)."""
    n = numel if isinstance(numel, bytes) else i(numel)
    return tup(s("storage"), g("torch", stype), s(key), s("cpu"), n, b"N" if legacy else b"") + b"Q"


def v2(storage: bytes, offset: bytes, size: bytes, stride: bytes) -> bytes:
    """torch._utils._rebuild_tensor_v2(storage, offset, size, stride, False, OrderedDict())."""
    hooks = call(g("collections", "OrderedDict"))
    return call(
        g("torch._utils", "_rebuild_tensor_v2"), storage, offset, size, stride, b"\x89", hooks
    )


def v3(storage: bytes, offset: bytes, size: bytes, stride: bytes, dtype: bytes) -> bytes:
    hooks = call(g("collections", "OrderedDict"))
    return call(
        g("torch._utils", "_rebuild_tensor_v3"),
        storage,
        offset,
        size,
        stride,
        b"\x89",
        hooks,
        dtype,
    )


def f32(n: int, key: str = "0") -> bytes:
    """A float32 tensor of n elements over the storage ``key`` of n floats."""
    return v2(pid(key, n), i(0), ints(n), ints(1))


def d(*pairs: tuple[str, bytes]) -> bytes:
    """A dict of str keys, as protocol 2 writes it: EMPTY_DICT MARK k v ... SETITEMS."""
    return b"}(" + b"".join(s(k) + v for k, v in pairs) + b"u"


def p2(body: bytes) -> bytes:
    return b"\x80\x02" + body + b"."


def floats(n: int) -> bytes:
    return np.arange(n, dtype=np.float32).tobytes()


def zip_pt(
    pkl: bytes,
    storages: dict[str, bytes] | None = None,
    *,
    prefix: str = "archive/",
    members: dict[str, bytes] | None = None,
    deflate: tuple[str, ...] = (),
) -> bytes:
    """A zip-era torch.save archive: PREFIX/data.pkl, PREFIX/data/<key>, byteorder, version."""
    entries = {f"{prefix}data.pkl": pkl, f"{prefix}byteorder": b"little"}
    entries.update({f"{prefix}data/{k}": v for k, v in (storages or {}).items()})
    entries[f"{prefix}version"] = b"3\n"
    entries.update(members or {})
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, body in entries.items():
            info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            deflated = any(name.endswith(x) for x in deflate)
            info.compress_type = zipfile.ZIP_DEFLATED if deflated else zipfile.ZIP_STORED
            zf.writestr(info, body)
    return buf.getvalue()


_MAGIC = pickle.dumps(0x1950A86A20F9469CFC6C, protocol=2)
_INFO = pickle.dumps(
    {
        "protocol_version": 1001,
        "little_endian": True,
        "type_sizes": {"short": 2, "int": 4, "long": 4},
    },
    protocol=2,
)


def legacy_pt(
    obj: bytes,
    storages: list[tuple[str, int, bytes]] = (),  # type: ignore[assignment]
    *,
    keys: bytes | None = None,
    magic: bytes = _MAGIC,
    protocol: bytes = pickle.dumps(1001, protocol=2),
    info: bytes = _INFO,
) -> bytes:
    """A legacy (pre-1.6) torch.save stream: magic, protocol, sys_info, object, keys, storages."""
    if keys is None:
        keys = pickle.dumps([k for k, _, _ in storages], protocol=2)
    body = b"".join(struct.pack("<q", n) + raw for _, n, raw in storages)
    return magic + protocol + info + obj + keys + body


def one(value: bytes) -> bytes:
    """A zip-era archive whose data.pkl is {"w": <a 4-float tensor>, "x": value}."""
    return zip_pt(p2(d(("w", f32(4)), ("x", value))), {"0": floats(4)})


def _stored(nbytes: int) -> bytes:
    return (bytes(range(256)) * (nbytes // 256 + 1))[:nbytes]


def one_tensor(tensor: bytes, nbytes: int = 16) -> bytes:
    """A zip-era archive whose data.pkl is {"t": tensor} over storage "0" of nbytes bytes."""
    return zip_pt(p2(d(("t", tensor))), {"0": _stored(nbytes)})


# --------------------------------------------------------------------------- the harness


class Hang(BaseException):
    """The CPU watchdog fired."""


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise Hang(f"over {CPU_LIMIT} s of CPU time")


_PATH_CLASSES = (pathlib.PurePath, pathlib.Path, pathlib.PosixPath, pathlib.PurePosixPath)
_WATCHED: dict[str, Any] = {
    **{c.__name__: c for c in _PATH_CLASSES},
    "OrderedDict": collections.OrderedDict,
    "torch.Tensor": torch.Tensor,
    "torch.Size": torch.Size,
    "torch.nn.Parameter": torch.nn.Parameter,
    "builtins": builtins,
    "torch._utils": torch._utils,
    "copyreg": copyreg,
    "pickle_machine.TABLE": pickle_machine.TABLE,
    "pickle_machine.CONSTANTS": pickle_machine.CONSTANTS,
}
# modules the attacks name: none may be imported by reading a file
_NAMED_MODULES = ("antigravity", "this", "turtle", "webbrowser", "pdb", "pty", "timeit")


def snapshot() -> dict[str, Any]:
    """What an input must not change: every watched namespace, by name and object identity."""
    out: dict[str, Any] = {}
    for name, obj in _WATCHED.items():
        space = obj if isinstance(obj, dict) else vars(obj)
        out[name] = {k: id(v) for k, v in space.items() if k != "_"}  # "_": the REPL's last value
    out["copyreg.tables"] = (
        dict(copyreg.dispatch_table),
        dict(copyreg._extension_registry),  # type: ignore[attr-defined]
        dict(copyreg._inverted_registry),  # type: ignore[attr-defined]
    )
    out["StorageType"] = {k: vars(v).copy() for k, v in pickle_machine.CONSTANTS.items()
                          if isinstance(v, pickle_machine.StorageType)}  # fmt: skip
    out["dtypes"] = {
        k: (str(v), v.itemsize) for k, v in vars(torch).items() if isinstance(v, torch.dtype)
    }
    out["modules"] = sorted(m for m in _NAMED_MODULES if m in sys.modules)
    out["Path.name"] = pathlib.Path("/a/b.txt").name
    return out


@dataclass
class Outcome:
    error: BaseException | None
    keys: list[str]
    unsupported: dict[str, str]
    values: dict[str, Any]
    arrays: dict[str, np.ndarray]
    warnings: list[str]
    peak: int
    cpu: float


def attempt(path: Path) -> Outcome:
    """Open ``path`` and read everything it offers, bounded by the watchdog, traced."""
    keys: list[str] = []
    unsupported: dict[str, str] = {}
    values: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    error: BaseException | None = None
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    before = signal.signal(signal.SIGPROF, _alarm)
    import resource

    cpu0 = resource.getrusage(resource.RUSAGE_SELF).ru_utime
    signal.setitimer(signal.ITIMER_PROF, CPU_LIMIT)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with tb.open(path) as f:
                keys = f.keys()
                unsupported = dict(f.unsupported())
                values = f.plain_values()
                _ = f.metadata
                names = [k for k in keys if k not in unsupported]
                got = f.read(names, mmap=False) if names else {}
                arrays = dict(got) if isinstance(got, dict) else {names[0]: got}
                f.read(names, framework="torch")
        except (Exception, Hang) as err:  # every one is judged below
            error = err
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGPROF, before)
    cpu = resource.getrusage(resource.RUSAGE_SELF).ru_utime - cpu0
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return Outcome(
        error, keys, unsupported, values, arrays, [str(w.message) for w in caught], peak, cpu
    )


# --------------------------------------------------------------------------- the attacks

Check = Callable[[Outcome], None]


@dataclass(frozen=True)
class Attack:
    """One hostile file: its bytes, and what must come of it."""

    id: str
    data: Callable[[], bytes]
    refused: str | None = None  # a regex the error message must match; None: accepted
    accepted: Check | None = None  # for accepted files: what the result must be
    hole: str | None = None  # the hole, while the machine has it
    suffix: str = ".pt"
    warns_once: bool = False  # torch's once-a-process warnings: checked in a fresh process
    allowance: int = 0  # traced bytes allowed beyond the bound (pt.COPY_MARGIN for repeats)


def _tensor_w(out: Outcome) -> None:
    assert out.keys[:1] == ["w"]
    assert out.arrays["w"].tobytes() == floats(4)


def _set_listed(out: Outcome) -> None:
    """A set holding a tensor or placeholder: "x" is listed as unsupported, not a value."""
    _tensor_w(out)
    assert "x" in out.unsupported and "x" not in out.values, (out.unsupported, out.values)
    assert "set" in out.unsupported["x"]


def _keys_are_str(out: Outcome) -> None:
    assert all(type(k) is str for k in [*out.keys, *out.values, *out.unsupported])


_PLAIN = (
    str,
    int,
    float,
    bool,
    type(None),
    bytes,
    complex,
    torch.Size,
    torch.dtype,
    set,
    frozenset,
)


def _deep_plain(value: Any) -> bool:
    """Only plain values, inside containers too (a set may hold what the machine built)."""
    if type(value) in (tuple, list, set, frozenset):
        return all(_deep_plain(v) for v in value)
    return type(value) in _PLAIN


def _placeholder(name: str) -> Check:
    def check(out: Outcome) -> None:
        _tensor_w(out)
        _keys_are_str(out)
        assert any(name in why for why in out.unsupported.values()), out.unsupported
        assert all(type(v) in _PLAIN for v in out.values.values()), out.values

    return check


def _values(expected: dict[str, Any]) -> Check:
    def check(out: Outcome) -> None:
        _tensor_w(out)
        assert out.values == expected

    return check


def _array(key: str, want: np.ndarray) -> Check:
    def check(out: Outcome) -> None:
        assert np.array_equal(out.arrays[key], want) and out.arrays[key].dtype == want.dtype

    return check


def _build_on_global(module: str, name: str, state: bytes) -> bytes:
    return one(g(module, name) + state + b"b")


_STATE_NAME = b"}" + s("name") + s("/etc/passwd") + b"s"  # {"name": "/etc/passwd"}
_SLOTS_STATE = b"N" + _STATE_NAME + b"\x86"  # (None, {...}): BUILD's slot-state form

ATTACKS: list[Attack] = []


def attack(name: str, *args: Any, **kwargs: Any) -> None:
    taken = {a.id for a in ATTACKS}
    unique, n = name, 1
    while unique in taken:
        n += 1
        unique = f"{name}-{n}"
    ATTACKS.append(Attack(unique, *args, **kwargs))


# --- class and module mutation: BUILD / SETITEM(S) / APPEND(S) / ADDITEMS on what the file did not build
for _mod, _name in (
    ("pathlib", "PosixPath"), ("pathlib", "PurePath"), ("collections", "OrderedDict"),
    ("torch", "Tensor"), ("torch", "Size"), ("torch._utils", "_rebuild_tensor_v2"),
    ("builtins", "set"), ("_codecs", "encode"), ("copyreg", "_reconstructor"),
    ("torch", "float32"), ("torch", "FloatStorage"), ("torch", "UntypedStorage"),
    ("torch", "strided"), ("torch.nn.parameter", "Parameter"), ("os", "environ"),
):  # fmt: skip
    for _how, _state in (("dict", _STATE_NAME), ("slots", _SLOTS_STATE)):
        attack(
            f"build-{_how}-on-{_mod}.{_name}",
            lambda m=_mod, n=_name, st=_state: _build_on_global(m, n, st),
            refused=r"BUILD aimed at|holds the global|global",
        )
    attack(
        f"setitem-on-{_mod}.{_name}",
        lambda m=_mod, n=_name: one(g(m, n) + s("name") + s("x") + b"s"),
        refused=r"SETITEM aimed at",
    )
    attack(
        f"setitems-on-memoized-{_mod}.{_name}",
        lambda m=_mod, n=_name: one(g(m, n) + b"q\x000h\x00(" + s("__dict__") + b"}u"),
        refused=r"SETITEM aimed at",
    )
    attack(
        f"append-on-{_mod}.{_name}",
        lambda m=_mod, n=_name: one(g(m, n) + i(1) + b"a"),
        refused=r"APPEND aimed at",
    )
    attack(
        f"appends-on-{_mod}.{_name}",
        lambda m=_mod, n=_name: one(g(m, n) + b"(" + i(1) + b"e"),
        refused=r"APPEND aimed at",
    )
    attack(
        f"additems-on-{_mod}.{_name}",
        lambda m=_mod, n=_name: one(g(m, n) + b"(" + i(1) + b"\x90"),
        refused=r"ADDITEMS aimed at",
    )

# BUILD on values the table built (a tuple, a torch.Size, a str, a frozenset, bytes)
for _what, _value in (
    ("tuple", ints(1, 2)), ("torch.Size", call(g("torch", "Size"), ints(2))),
    ("str", s("x")), ("frozenset", b"(\x91"), ("bytes", b"C\x01a"), ("int", i(5)),
    ("storage", pid("0", 4)),
):  # fmt: skip
    attack(
        f"build-on-{_what}", lambda v=_value: one(v + _STATE_NAME + b"b"), refused=r"BUILD aimed at"
    )

# BUILD on what the file built is allowed and inert
attack(
    "build-on-ordereddict-instance",
    lambda: one(call(g("collections", "OrderedDict")) + b"}" + s("_metadata") + i(1) + b"sb"),
    accepted=_values({}),
)
attack(
    "build-on-tensor-is-ignored",
    lambda: zip_pt(p2(d(("w", f32(4) + b"}" + s("shape") + ints(9, 9) + b"sb"))), {"0": floats(4)}),
    accepted=_tensor_w,
)
attack(
    "build-on-placeholder-records-state",
    lambda: one(g("argparse", "Namespace") + b")\x81" + _STATE_NAME + b"b"),
    accepted=_placeholder("argparse.Namespace"),
)

_CALL_REFUSED = (
    r"never calls|given|not a|no layout|never takes|other than|builds no tensor|NEWOBJ_EX"
)

# --- calls: REDUCE / NEWOBJ / NEWOBJ_EX / INST / OBJ of what the table lacks
for _mod, _name, _args in (
    ("builtins", "eval", s("1+1")), ("builtins", "exec", s("x=1")), ("os", "system", s("true")),
    ("posix", "system", s("true")), ("subprocess", "check_output", s("true")),
    ("builtins", "getattr", g("torch", "Tensor") + s("__init__")),
    ("builtins", "setattr", g("pathlib", "PurePath") + s("name") + s("x")),
    ("builtins", "__import__", s("antigravity")), ("importlib", "import_module", s("this")),
    ("torch", "load", s("/dev/zero")), ("torch.storage", "_load_from_bytes", b"C\x01a"),
    ("torch", "Tensor", i(1 << 20)), ("torch", "empty", i(1 << 20)),
    ("torch.nn.parameter", "Parameter", i(3)), ("torch", "Size", i(1 << 40)),
    ("builtins", "bytearray", i(1 << 33)), ("builtins", "bytes", i(1 << 33)),
    ("builtins", "set", i(5)), ("collections", "OrderedDict", i(1 << 30)),
    ("builtins", "complex", s("1+2j")), ("_codecs", "encode", s("x") + s("utf-16")),
    ("torch", "device", s("cuda") + s("0")), ("torch", "device", s("x" * 65)),
    ("functools", "partial", g("os", "system") + s("true")), ("webbrowser", "open", s("x")),
    ("pdb", "set_trace", b""), ("copyreg", "_reconstructor", g("os", "_wrap_close") + g("builtins", "object") + b"N"),
    ("torch._tensor", "_rebuild_from_type_v2", g("builtins", "eval") + g("torch", "Tensor") + tup(s("1")) + b"}"),
    ("torch._tensor", "_rebuild_from_type_v2", g("argparse", "Namespace") + g("torch", "Tensor") + tup() + b"}"),
    ("torch._utils", "_rebuild_parameter", s("x") + b"\x89}"),
    ("torch.serialization", "_get_layout", s("torch.sparse_coo_x")),
    ("builtins", "frozenset", i(1 << 40)), ("torch._utils", "_rebuild_parameter_with_state", f32(4)),
    ("torch._utils", "_rebuild_tensor_v2", pid("0", 4) + i(0) + ints(4)[:0]),
    ("torch._utils", "_rebuild_tensor_v3", pid("0", 4) + i(0) + ints(4) + ints(1)),
):  # fmt: skip
    _id = f"{_mod}.{_name}"
    attack(f"reduce-{_id}", lambda m=_mod, n=_name, a=_args: one(call(g(m, n), a)),
           refused=_CALL_REFUSED)  # fmt: skip
    attack(f"newobj-{_id}", lambda m=_mod, n=_name, a=_args: one(g(m, n) + tup(a) + b"\x81"),
           refused=_CALL_REFUSED)  # fmt: skip
    attack(f"inst-{_id}",
           lambda m=_mod, n=_name, a=_args: one(b"(" + a + b"i" + m.encode() + b"\n" + n.encode() + b"\n"),
           refused=_CALL_REFUSED)  # fmt: skip
    attack(f"obj-{_id}", lambda m=_mod, n=_name, a=_args: one(b"(" + g(m, n) + a + b"o"),
           refused=_CALL_REFUSED)  # fmt: skip
    attack(f"newobj_ex-{_id}",
           lambda m=_mod, n=_name, a=_args: one(g(m, n) + tup(a) + b"}\x92"),
           refused=r"NEWOBJ_EX|never calls|given|not a")  # fmt: skip

# placeholders: called, called again, used as a callable's argument: inert
attack(
    "placeholder-reduce",
    lambda: one(call(g("argparse", "Namespace"))),
    accepted=_placeholder("argparse.Namespace"),
)
attack(
    "placeholder-called-twice",
    lambda: one(call(g("argparse", "Namespace")) + b")R"),
    accepted=_placeholder("argparse.Namespace"),
)
attack(
    "placeholder-newobj_ex",
    lambda: one(g("m", "C") + tup(i(1)) + b"}" + s("k") + i(2) + b"s\x92"),
    accepted=_placeholder("m.C"),
)
attack(
    "placeholder-inst",
    lambda: one(b"(" + i(1) + b"iomegaconf\nListConfig\n"),
    accepted=_placeholder("omegaconf.ListConfig"),
)
attack(
    "placeholder-obj", lambda: one(b"(" + g("m", "C") + i(1) + b"o"), accepted=_placeholder("m.C")
)
attack(
    "placeholder-class-left-in-result",
    lambda: one(g("argparse", "Namespace")),
    accepted=_placeholder("argparse.Namespace"),
)
# a refused global named but never called is an inert placeholder of its name
attack(
    "refused-global-left-in-result",
    lambda: one(g("os", "system")),
    accepted=_placeholder("os.system"),
)
attack(
    "refused-global-as-dict-key",
    lambda: one(b"}" + g("os", "system") + i(1) + b"s"),
    accepted=_keys_are_str,
)
attack(
    "torch-tensor-class-left-in-result",
    lambda: one(g("torch", "Tensor")),
    accepted=_placeholder("torch.Tensor"),
)
attack(
    "refused-global-in-set",
    lambda: one(b"\x8f(" + g("builtins", "eval") + b"\x90"),
    accepted=_set_listed,
)
attack(
    "placeholder-in-frozenset",
    lambda: one(b"(" + call(g("m", "C")) + b"\x91"),
    accepted=_set_listed,
)
attack("tensor-in-a-set", lambda: one(b"\x8f(" + f32(4) + b"\x90"), accepted=_set_listed)
# torch._utils._rebuild_* outside the table (v1, sparse, quantized ...): placeholders, listed
attack("rebuild-tensor-v1-is-a-placeholder",
       lambda: one(call(g("torch._utils", "_rebuild_tensor"), pid("0", 4), i(0), ints(4), ints(1))),
       accepted=_placeholder("torch._utils._rebuild_tensor"))  # fmt: skip
attack(
    "placeholder-named-module",
    lambda: one(call(g("antigravity", "fly"))),
    accepted=_placeholder("antigravity.fly"),
)
attack("placeholder-as-reconstructor-class",
       lambda: one(call(g("copyreg", "_reconstructor"), g("m", "C"), g("builtins", "object"), b"N")),
       accepted=_placeholder("m.C"))  # fmt: skip
attack("reconstructor-of-an-instance",
       lambda: one(call(g("copyreg", "_reconstructor"), call(g("m", "C")), g("builtins", "object"), b"N")),
       refused=r"_reconstructor given")  # fmt: skip
attack("stack-global-non-str", lambda: one(i(1) + s("x") + b"\x93"), refused=r"STACK_GLOBAL given")
attack(
    "stack-global-refused",
    lambda: one(s("os") + s("system") + b"\x93" + tup(s("true")) + b"R"),
    refused=r"calls os\.system",
)
attack("global-non-utf8", lambda: one(b"c\xff\xfe\nx\n"), refused=r"malformed")
attack("reduce-on-dtype", lambda: one(call(g("torch", "float32"))), refused=r"REDUCE of a dtype")
attack(
    "reduce-on-storage-type",
    lambda: one(call(g("torch", "FloatStorage"), i(4))),
    refused=r"REDUCE of a StorageType",
)
attack("reduce-on-tensor", lambda: one(f32(4) + tup() + b"R"), refused=r"REDUCE of a TensorRef")
attack("reduce-args-not-tuple", lambda: one(g("m", "C") + b"]R"), refused=r"not a tuple")

# --- memo confusion
attack("get-undefined-memo", lambda: one(b"h\x07"), refused=r"malformed")
attack("long-get-undefined-memo", lambda: one(b"j\xff\xff\xff\xff"), refused=r"malformed")
attack("text-get-negative", lambda: one(b"g-1\n"), refused=r"malformed")
attack("put-negative", lambda: one(i(1) + b"p-1\n"), refused=r"negative memo")
attack("memoize-empty-stack", lambda: one(b"(\x94"), refused=r"malformed")
attack(
    "put-overwrites-storage-with-str",
    lambda: zip_pt(p2(d(("w", f32(4)), ("x", pid("0", 4) + b"q\x010" + s("x") + b"q\x01" + v2(b"h\x01", i(0), ints(4), ints(1))))), {"0": floats(4)}),
    refused=r"something other than a storage",
)  # fmt: skip
attack(
    "memoized-dict-as-size",
    lambda: one(b"}q\x05" + v2(pid("0", 4), i(0), b"h\x05", ints(1))),
    refused=r"size is not a tuple",
)
attack(
    "memoized-tensor-as-storage",
    lambda: one(f32(4) + b"q\x05" + v2(b"h\x05", i(0), ints(4), ints(1))),
    refused=r"something other than a storage",
)
attack(
    "memo-huge-index",
    lambda: one(i(1) + b"r\xff\xff\xff\xff" + b"0" + b"j\xff\xff\xff\xff"),
    accepted=_values({"x": 1}),
)
attack("self-containing-list", lambda: one(b"]q\x00h\x00a"), refused=r"holds itself")
attack("self-containing-dict", lambda: one(b"}q\x00" + s("k") + b"h\x00s"), refused=r"holds itself")
attack(
    "mutual-cycle",
    lambda: one(b"]q\x00}q\x01" + s("k") + b"h\x00s0h\x01a"),
    refused=r"holds itself",
)
attack(
    "placeholder-holds-itself",
    lambda: one(call(g("m", "C")) + b"q\x00h\x00b"),
    refused=r"holds itself",
)

# --- placeholders and odd types smuggled into names, keys, sizes, dtypes
attack("placeholder-as-storage-key", lambda: one(v2(tup(s("storage"), g("torch", "FloatStorage"), call(g("m", "K")), s("cpu"), i(4)) + b"Q", i(0), ints(4), ints(1))),
       refused=r"persistent id that names no storage")  # fmt: skip
attack("int-as-storage-key", lambda: one(v2(tup(s("storage"), g("torch", "FloatStorage"), i(0), s("cpu"), i(4)) + b"Q", i(0), ints(4), ints(1))),
       refused=r"names no storage")  # fmt: skip
attack(
    "str-subclass-storage-type",
    lambda: one(v2(pid("0", 4, "StringStorage"), i(0), ints(4), ints(1))),
    refused=r"names no storage",
)
attack(
    "bool-as-numel",
    lambda: one(v2(pid("0", b"\x88"), i(0), ints(1), ints(1))),
    refused=r"names no storage",
)
attack(
    "placeholder-as-numel",
    lambda: one(v2(pid("0", call(g("m", "N"))), i(0), ints(4), ints(1))),
    refused=r"names no storage",
)
attack(
    "placeholder-in-size",
    lambda: one(v2(pid("0", 4), i(0), tup(call(g("m", "N"))), ints(1))),
    refused=r"size holds Opaque",
)
attack(
    "bool-in-size",
    lambda: one(v2(pid("0", 4), i(0), tup(b"\x88"), ints(1))),
    refused=r"size holds bool",
)
attack(
    "float-in-stride",
    lambda: one(v2(pid("0", 4), i(0), ints(4), tup(b"G?\xf0\x00\x00\x00\x00\x00\x00"))),
    refused=r"stride holds float",
)
attack(
    "bool-as-offset",
    lambda: one(v2(pid("0", 4), b"\x88", ints(4), ints(1))),
    refused=r"offset is not",
)
attack(
    "placeholder-as-dtype",
    lambda: one_tensor(
        v3(pid("0", 16, "UntypedStorage"), i(0), ints(4), ints(1), call(g("m", "D")))
    ),
    refused=r"without a dtype",
)
attack(
    "str-as-dtype",
    lambda: one_tensor(v3(pid("0", 16, "UntypedStorage"), i(0), ints(4), ints(1), s("float32"))),
    refused=r"without a dtype",
)
attack("placeholder-dict-keys-become-text",
       lambda: one(b"}" + call(g("m", "K")) + f32(4, "0") + b"s"),
       accepted=lambda out: (_keys_are_str(out), None)[1])  # fmt: skip
attack("non-str-keys-become-text",
       lambda: zip_pt(p2(b"}(" + i(7) + f32(4) + b"\x88" + i(1) + b"N" + i(2) + b"G@\t!\xfbTD-\x18" + i(3) + b"u"), {"0": floats(4)}),
       accepted=lambda out: (_keys_are_str(out), None)[1])  # fmt: skip
attack(
    "keys-that-collide",
    lambda: zip_pt(p2(b"}(" + i(1) + f32(4) + s("1") + f32(4) + b"u"), {"0": floats(4)}),
    refused=r"flatten to the key",
)
attack(
    "huge-int-as-value", lambda: one(b"\x8b" + struct.pack("<i", 2000) + b"\x01" * 2000),
    refused=r"an integer of 2,000 bytes",
)  # fmt: skip
attack(
    "huge-int-as-key", lambda: zip_pt(p2(b"}" + b"\x8b" + struct.pack("<i", 2000) + b"\x01" * 2000 + f32(4) + b"s"), {"0": floats(4)}),
    refused=r"an integer of 2,000 bytes",
)  # fmt: skip

# --- dtype confusion
attack(
    "typed-storage-other-dtype",
    lambda: one(v3(pid("0", 4), i(0), ints(4), ints(1), g("torch", "int32"))),
    refused=r"rebuilt on a torch.float32 storage",
)
attack(
    "untyped-storage-ragged",
    lambda: one_tensor(
        v3(pid("0", 6, "UntypedStorage"), i(0), ints(1), ints(1), g("torch", "float32")), 6
    ),
    refused=r"no whole",
)
attack("two-dtypes-one-untyped-storage",
       lambda: zip_pt(p2(d(("a", v3(pid("0", 16, "UntypedStorage"), i(0), ints(4), ints(1), g("torch", "float32"))),
                            ("b", v3(pid("0", 16, "UntypedStorage"), i(0), ints(4), ints(1), g("torch", "int32"))))), {"0": floats(4)}),
       accepted=_array("b", np.frombuffer(floats(4), np.int32)))  # fmt: skip
attack("duplicate-key-two-types",
       lambda: zip_pt(p2(d(("a", v2(pid("0", 4), i(0), ints(4), ints(1))), ("b", v2(pid("0", 2, "DoubleStorage"), i(0), ints(2), ints(1))))), {"0": floats(4)}),
       refused=r"named with two types")  # fmt: skip
attack("duplicate-key-typed-and-untyped",
       lambda: zip_pt(p2(d(("a", v2(pid("0", 4), i(0), ints(4), ints(1))), ("b", v3(pid("0", 16, "UntypedStorage"), i(0), ints(4), ints(1), g("torch", "float32"))))), {"0": floats(4)}),
       refused=r"named with two types")  # fmt: skip
for _dt in (
    "qint8",
    "quint4x2",
    "bits8",
    "uint1",
    "int4",
    "float4_e2m1fn_x2",
    "bits16",
    "complex32",
):
    attack(
        f"untyped-storage-as-{_dt}",
        lambda dt=_dt: one_tensor(
            v3(pid("0", 16, "UntypedStorage"), i(0), ints(2), ints(1), g("torch", dt))
        ),
        accepted=lambda out: (
            None if "t" in out.unsupported or "t" in out.arrays else pytest.fail(repr(out))
        ),
        warns_once=True,
    )  # torch warns once a process: see test_a_dtype_name_makes_torch_warn
attack("untyped-unaligned-storage-read",
       lambda: zip_pt(p2(d(("t", v3(pid("0", 16, "UntypedStorage"), i(0), ints(4), ints(1), g("torch", "float32"))))), {"0": floats(4)}, prefix="a/"),
       accepted=_array("t", np.arange(4, dtype=np.float32)))  # fmt: skip

# --- sizes, strides, offsets
attack(
    "negative-size",
    lambda: one_tensor(v2(pid("0", 4), i(0), ints(-1), ints(1))),
    refused=r"size holds int -1",
)
attack(
    "negative-stride",
    lambda: one_tensor(v2(pid("0", 4), i(3), ints(4), ints(-1))),
    refused=r"stride holds int -1",
)
attack(
    "negative-offset",
    lambda: one_tensor(v2(pid("0", 4), i(-1), ints(1), ints(1))),
    refused=r"offset is not",
)
attack(
    "rank-mismatch",
    lambda: one_tensor(v2(pid("0", 4), i(0), ints(2, 2), ints(1))),
    refused=r"differ in rank",
)
attack(
    "rank-65",
    lambda: one_tensor(v2(pid("0", 4), i(0), ints(*[1] * 65), ints(*[1] * 65))),
    refused=r"at most 64",
)
attack(
    "size-2-to-the-64",
    lambda: one_tensor(v2(pid("0", 4), i(0), ints(2**64), ints(1))),
    refused=r"size holds int",
)
attack(
    "size-long4-negative-length",
    lambda: one_tensor(v2(pid("0", 4), i(0), tup(b"\x8b\xff\xff\xff\xff"), ints(1))),
    refused=r"claims",
)
attack(
    "size-long4-claims-2-gib",
    lambda: one_tensor(v2(pid("0", 4), i(0), tup(b"\x8b\xff\xff\xff\x7f"), ints(1))),
    refused=r"claims 2,147,483,647 bytes",
)
attack(
    "offset-past-storage",
    lambda: one_tensor(v2(pid("0", 4), i(2**62 - 1), ints(1), ints(1))),
    refused=r"reaches element",
)
attack(
    "offset-plus-extent-past",
    lambda: one_tensor(v2(pid("0", 4), i(1), ints(4), ints(1))),
    refused=r"reaches element 4 of a storage of 4",
)
attack(
    "stride-past-storage",
    lambda: one_tensor(v2(pid("0", 4), i(0), ints(2, 2), ints(3, 1))),
    refused=r"reaches element",
)
attack(
    "product-2-to-the-63-zero-strides",
    lambda: one_tensor(v2(pid("0", 4), i(0), ints(2**31, 2**31, 2), ints(0, 0, 0))),
    refused=r"far more than the file",
)
attack(
    "overflowing-extent",
    lambda: one_tensor(v2(pid("0", 4), i(0), ints(2**61, 2**61), ints(2**61, 2**61))),
    refused=r"reaches element",
)
attack(
    "overlapping-strides-within-margin",
    lambda: one_tensor(v2(pid("0", 4), i(0), ints(64, 4), ints(0, 1))),
    accepted=_array("t", np.tile(np.frombuffer(_stored(16), np.float32), (64, 1))),
    allowance=COPY_MARGIN,
)
attack(
    "zero-size-far-offset",
    lambda: one_tensor(v2(pid("0", 4), i(2**62 - 1), ints(0), ints(1))),
    accepted=lambda out: None,
)
attack(
    "zero-size-beside-2-to-the-61", lambda: one_tensor(v2(pid("0", 4), i(0), ints(0, 2**61), ints(1, 1))),
    refused=r"over 2\*\*62 bytes, more than NumPy",
)  # fmt: skip
attack(
    "storage-numel-lies-high",
    lambda: one_tensor(v2(pid("0", 100), i(0), ints(4), ints(1))),
    refused=r"holds 16 bytes, not the 100",
)
attack(
    "storage-numel-lies-huge",
    lambda: one_tensor(v2(pid("0", 2**62 - 1), i(0), ints(4), ints(1))),
    refused=r"holds 16 bytes",
)
attack(
    "storage-numel-2-to-the-62",
    lambda: one_tensor(v2(pid("0", 2**62), i(0), ints(4), ints(1))),
    refused=r"names no storage",
)
attack(
    "storage-missing",
    lambda: one_tensor(v2(pid("1", 4), i(0), ints(4), ints(1))),
    refused=r"data/1 a tensor names is not in the file",
)
attack(
    "storage-key-traversal",
    lambda: one_tensor(v2(pid("../data.pkl", 4), i(0), ints(4), ints(1))),
    refused=r"not in the file",
)
attack(
    "storage-key-nul",
    lambda: one_tensor(v2(pid("0\x00", 4), i(0), ints(4), ints(1))),
    refused=r"not in the file",
)
attack(
    "storage-deflated",
    lambda: zip_pt(p2(d(("t", f32(4)))), {"0": floats(4)}, deflate=("data/0",)),
    refused=r"compressed or encrypted",
)
attack(
    "byteorder-big",
    lambda: zip_pt(p2(d(("t", f32(4)))), {"0": floats(4)}, members={"archive/byteorder": b"big"}),
    refused=r"big-endian",
)
attack(
    "byteorder-garbage",
    lambda: zip_pt(
        p2(d(("t", f32(4)))), {"0": floats(4)}, members={"archive/byteorder": b"\xff" * 8}
    ),
    refused=r"byteorder|endian",
)
attack(
    "two-data-pkl",
    lambda: zip_pt(p2(d()), members={"other/data.pkl": p2(d())}),
    refused=r"without one data\.pkl \(it has 2\)",
)
attack(
    "persistent-id-text-protocol-0",
    lambda: zip_pt(b"(dp0\nS'w'\np1\nP0\ns.", {"0": floats(4)}),
    refused=r"names no storage",
)
attack(
    "persistent-id-without-storages",
    lambda: legacy_pt(p2(d(("t", f32(4)))), [], keys=pickle.dumps([], protocol=2)),
    refused=r"names no storage",
)

# --- lengths, frames, protocols, unknown opcodes
for _op, _name in ((b"\x8d", "binunicode8"), (b"\x8e", "binbytes8"), (b"\x96", "bytearray8")):
    for _n in (2**64 - 1, 2**63, 2**32, 1 << 30):
        attack(
            f"{_name}-claims-{_n}",
            lambda op=_op, n=_n: one(op + struct.pack("<Q", n) + b"abc"),
            refused=r"claims",
        )
attack("binunicode-claims-4-gib", lambda: one(b"X\xff\xff\xff\xff"), refused=r"claims")
attack("binstring-negative", lambda: one(b"T\xff\xff\xff\xff"), refused=r"claims")
attack(
    "frame-claims-past-end",
    lambda: b"\x80\x04\x95" + struct.pack("<Q", 1 << 40) + b"N.",
    refused=r"not a torch",
)
attack(
    "frame-in-data-pkl-lies-long",
    lambda: one(b"\x95" + struct.pack("<Q", 1 << 40) + i(1)),
    refused=r"frame claims",
)
attack(
    "frame-in-data-pkl-lies-short",
    lambda: one(b"\x95" + struct.pack("<Q", 0) + i(1)),
    accepted=_values({"x": 1}),
)
attack("proto-6", lambda: zip_pt(b"\x80\x06N."), refused=r"protocol 6")
for _op, _name in (
    (b"\x82\x01", "ext1"),
    (b"\x83\x01\x00", "ext2"),
    (b"\x84\x01\x00\x00\x00", "ext4"),
    (b"\x97", "next-buffer"),
    (b"\x98", "readonly-buffer"),
    (b"\xff", "0xff"),
):
    attack(f"opcode-{_name}", lambda op=_op: one(op), refused=r"which no checkpoint does")  # fmt: skip
attack("int-protocol-0-5000-digits", lambda: one(b"I" + b"9" * 5000 + b"\n"), refused=r"malformed")
attack(
    "long-protocol-0-5000-digits", lambda: one(b"L" + b"9" * 5000 + b"L\n"), refused=r"malformed"
)
attack("float-protocol-0-garbage", lambda: one(b"Fnot-a-float\n"), refused=r"malformed")
attack("unicode-protocol-0-bad-escape", lambda: one(b"V\\u12\n"), refused=r"malformed")
attack("string-protocol-0-unquoted", lambda: one(b"Sabc\n"), refused=r"without quotes")
attack(
    "string-protocol-0-invalid-escape", lambda: one(b"S'\\q'\n"),
    accepted=_values({"x": "\\q"}),
)  # fmt: skip
attack("string-protocol-0-non-utf8", lambda: one(b"S'\\xff'\n"), refused=r"malformed")
attack("text-line-without-newline", lambda: one(b"Ixyz"), refused=r"ends inside a text")
attack("stop-with-two-values", lambda: zip_pt(b"\x80\x02NN."), refused=r"stops with other than one")
attack("stop-inside-mark", lambda: zip_pt(b"\x80\x02(N."), refused=r"stops with other than one")
attack("no-stop", lambda: zip_pt(b"\x80\x02N"), refused=r"ends before its STOP")
attack("pop-empty", lambda: zip_pt(b"\x80\x020N."), refused=r"malformed")
attack("pop-mark-without-mark", lambda: zip_pt(b"\x80\x021N."), refused=r"malformed")
attack("empty-data-pkl", lambda: zip_pt(b""), refused=r"ends before its STOP")
attack("setitems-odd", lambda: one(b"}(" + i(1) + b"u"), refused=r"odd number")
attack("dict-odd", lambda: one(b"(" + i(1) + b"d"), refused=r"odd number")
attack("dict-unhashable-key", lambda: one(b"}]" + i(1) + b"s"), refused=r"malformed")
attack("set-unhashable", lambda: one(call(g("builtins", "set"), b"](]]e")), refused=r"malformed")
attack(
    "ordereddict-unhashable",
    lambda: one(call(g("collections", "OrderedDict"), b"(](]" + i(1) + b"\x86l" + b"tR"[:0])),
    refused=r"malformed",
)
attack(
    "encode-not-latin1",
    lambda: one(call(g("_codecs", "encode"), s("\u20ac") + s("latin1"))),
    refused=r"not latin-1",
)
attack(
    "bytes-via-encode",
    lambda: one(call(g("_codecs", "encode"), s("\xff") + s("latin1"))),
    accepted=_values({"x": b"\xff"}),
)
attack("surrogate-in-str", lambda: one(b"\x8c\x03\xed\xa0\x80"), accepted=_values({"x": "\ud800"}))
attack(
    "layout-by-name",
    lambda: one(call(g("torch.serialization", "_get_layout"), s("torch.strided"))),
    accepted=_values({"x": "torch.strided"}),
)

# --- nesting and cycles, iterative and deep
_N = 30_000  # far past any recursion limit; the fuzz harness (tracemalloc on) reads it in 2 s
attack("lists-30k-deep", lambda: one(b"]" * _N + b"a" * (_N - 1)), refused=r"nested over 200")
attack(
    "dicts-30k-deep",
    lambda: one((b"}" + i(0)) * _N + b"N" + b"s" * _N),
    refused=r"nested over 200|malformed",
)
attack("tuples-30k-deep", lambda: one(b"N" + b"\x85" * _N), refused=r"nested over 200")
attack(
    "tuples-100k-deep-mark", lambda: one(b"(" * _N + b"N" + b"t" * _N), refused=r"nested over 200"
)
attack(
    "frozensets-10k-deep-via-reduce",
    lambda: one((g("builtins", "frozenset") + b"((") * 10_000 + b"N" + b"ttR" * 10_000),
    refused=r"nested over 200",
)
attack(
    "placeholders-10k-deep",
    lambda: one((g("m", "C") + b"(") * 10_000 + b"N" + b"tR" * 10_000),
    refused=r"nested over 200",
)
attack(
    "placeholder-states-10k-deep",
    lambda: one((g("m", "C") + b")R") * 10_000 + b"N" + b"b" * 10_000),
    refused=r"nested over 200",
)
attack(
    "marks-30k",
    lambda: one(b"(" * _N + b"N" + b"1" * _N),
    refused=r"stops with other than one|malformed|odd number",
)
attack(
    "mark-stack-unclosed",
    lambda: one(b"(" * _N + b"N"),
    refused=r"stops with other than one|malformed|units of work",
)

# --- the legacy era
_LEGACY_T = tup(s("storage"), g("torch", "FloatStorage"), s("k"), s("cpu"), i(4), b"N") + b"Q"
_LEGACY_OBJ = p2(d(("w", v2(_LEGACY_T, i(0), ints(4), ints(1)))))
_LEGACY_STORE = [("k", 4, floats(4))]


def _legacy(obj: bytes = _LEGACY_OBJ, storages: Any = None, **kw: Any) -> bytes:
    return legacy_pt(obj, _LEGACY_STORE if storages is None else storages, **kw)


attack("legacy-valid", _legacy, accepted=_tensor_w)
attack(
    "legacy-magic-wrong",
    lambda: _legacy(magic=pickle.dumps(0x1950A86A20F9469CFC6D, protocol=2)),
    refused=r"header is corrupt|not a torch",
)
attack(
    "legacy-protocol-wrong",
    lambda: _legacy(protocol=pickle.dumps(1000, protocol=2)),
    refused=r"header is corrupt",
)
attack(
    "legacy-info-not-dict",
    lambda: _legacy(info=pickle.dumps([1], protocol=2)),
    refused=r"header is corrupt",
)
attack(
    "legacy-big-endian",
    lambda: _legacy(info=pickle.dumps({"little_endian": False}, protocol=2)),
    refused=r"big-endian",
)
attack(
    "legacy-little-endian-placeholder",
    lambda: _legacy(info=p2(b"}" + s("little_endian") + call(g("m", "T")) + b"s")),
    refused=r"not one this file may hold",
)
attack(
    "legacy-magic-then-global",
    lambda: _legacy(magic=_MAGIC[:-1] + b"0" + g("os", "system") + b"."),
    refused=r"not one this file may hold|holds the global",
)
attack(
    "legacy-magic-then-placeholder",
    lambda: _legacy(magic=_MAGIC[:-1] + b"0" + g("argparse", "Namespace") + b"."),
    refused=r"not one this file may hold",
)
attack(
    "legacy-keys-extra",
    lambda: _legacy(keys=pickle.dumps(["k", "j"], protocol=2)),
    refused=r"does not match",
)
attack(
    "legacy-keys-duplicate",
    lambda: _legacy(keys=pickle.dumps(["k", "k"], protocol=2)),
    refused=r"does not match",
)
attack(
    "legacy-keys-not-list",
    lambda: _legacy(keys=pickle.dumps({"k": 1}, protocol=2)),
    refused=r"storage list is corrupt",
)
attack(
    "legacy-keys-placeholder",
    lambda: _legacy(keys=p2(b"(" + call(g("m", "K")) + b"l")),
    refused=r"not one this file may hold|storage list",
)
attack(
    "legacy-count-lies",
    lambda: _legacy(storages=[("k", 5, floats(4))]),
    refused=r"records 5 elements",
)
attack(
    "legacy-count-2-to-the-62",
    lambda: _legacy(
        obj=p2(
            d(
                (
                    "w",
                    v2(
                        tup(
                            s("storage"),
                            g("torch", "FloatStorage"),
                            s("k"),
                            s("cpu"),
                            i(2**62 - 1),
                            b"N",
                        )
                        + b"Q",
                        i(0),
                        ints(4),
                        ints(1),
                    ),
                )
            )
        ),
        storages=[("k", 2**62 - 1, floats(4))],
    ),
    refused=r"remain",
)
attack("legacy-storage-truncated", lambda: _legacy()[:-3], refused=r"remain|truncated")
attack("legacy-no-storage-bytes", lambda: _legacy()[: -16 - 8], refused=r"cut short|truncated")
attack(
    "legacy-storage-view",
    lambda: _legacy(
        obj=p2(
            d(
                (
                    "w",
                    v2(
                        tup(
                            s("storage"),
                            g("torch", "FloatStorage"),
                            s("k"),
                            s("cpu"),
                            i(4),
                            tup(s("v"), i(0)),
                        )
                        + b"Q",
                        i(0),
                        ints(4),
                        ints(1),
                    ),
                )
            )
        )
    ),
    refused=r"storage view",
)
attack(
    "legacy-untyped-storage",
    lambda: _legacy(
        obj=p2(
            d(
                (
                    "w",
                    v3(
                        tup(
                            s("storage"),
                            g("torch", "UntypedStorage"),
                            s("k"),
                            s("cpu"),
                            i(16),
                            b"N",
                        )
                        + b"Q",
                        i(0),
                        ints(4),
                        ints(1),
                        g("torch", "float32"),
                    ),
                )
            )
        )
    ),
    refused=r"untyped storage in a legacy",
)
attack(
    "legacy-two-types-one-key",
    lambda: _legacy(
        obj=p2(
            d(
                ("w", v2(_LEGACY_T, i(0), ints(4), ints(1))),
                (
                    "x",
                    v2(
                        tup(s("storage"), g("torch", "IntStorage"), s("k"), s("cpu"), i(4), b"N")
                        + b"Q",
                        i(0),
                        ints(4),
                        ints(1),
                    ),
                ),
            )
        )
    ),
    refused=r"named with two types",
)
attack(
    "legacy-os-system",
    lambda: _legacy(obj=p2(d(("w", call(g("os", "system"), s("true")))))),
    refused=r"calls os\.system",
)
attack(
    "legacy-placeholder",
    lambda: _legacy(
        obj=p2(
            d(("w", v2(_LEGACY_T, i(0), ints(4), ints(1))), ("x", call(g("argparse", "Namespace"))))
        )
    ),
    accepted=_placeholder("argparse.Namespace"),
)
attack(
    "legacy-pid-5-tuple",
    lambda: _legacy(
        obj=p2(
            d(
                (
                    "w",
                    v2(
                        tup(s("storage"), g("torch", "FloatStorage"), s("k"), s("cpu"), i(4))
                        + b"Q",
                        i(0),
                        ints(4),
                        ints(1),
                    ),
                )
            )
        )
    ),
    refused=r"names no storage",
)
attack(
    "legacy-lists-30k-deep",
    lambda: _legacy(obj=p2(b"]" * _N + b"a" * (_N - 1))),
    refused=r"nested over 200",
)

# --- protocols 0-5: the same object, written by Python's own pickler
attack(
    "list-opcode-keeps-its-list",
    lambda: one(b"(" + i(1) + i(2) + b"l"),
    accepted=_values({"x.0": 1, "x.1": 2}),
)
attack(
    "list-opcode-then-setitem",
    lambda: one(b"}" + s("k") + b"(" + i(1) + b"l" + s("v") + b"s"),
    refused=r"SETITEM aimed at a str",
)


class _Storage:
    pass


class _Tensor:
    def __reduce__(self) -> Any:
        return (
            torch._utils._rebuild_tensor_v2,
            (_Storage(), 0, (4,), (1,), False, collections.OrderedDict()),
        )


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: Any) -> Any:
        return ("storage", torch.FloatStorage, "0", "cpu", 4) if isinstance(obj, _Storage) else None


def _protocol(n: int) -> bytes:
    buf = io.BytesIO()
    obj: dict[str, Any] = {
        "n": 3,
        "s": "é",
        "b": b"\x00",
        "f": 0.5,
        "c": 1 + 2j,
        "z": None,
        "l": [1, 2],
    }
    if n >= 1:  # protocol 0's persistent ids are text: no tensor
        obj = {"w": _Tensor(), **obj}
    _Pickler(buf, protocol=n).dump(obj)
    return zip_pt(buf.getvalue(), {"0": floats(4)})


_PROTOCOL_VALUES = {
    "n": 3,
    "s": "é",
    "b": b"\x00",
    "f": 0.5,
    "c": 1 + 2j,
    "z": None,
    "l.0": 1,
    "l.1": 2,
}
for _p in range(6):
    attack(f"protocol-{_p}", lambda n=_p: _protocol(n),
           accepted=(lambda out: _values(_PROTOCOL_VALUES)(out)) if _p else
           (lambda out: (out.keys == [] and out.values == _PROTOCOL_VALUES) or pytest.fail(repr(out.values))))  # fmt: skip

# --- files that are no pickle, under every suffix a torch.save file takes
for _suffix in (".pt", ".pth", ".bin", ".ckpt"):
    for _kind, _head, _like in (
        ("random", bytes(range(7, 71)), None), ("text", b"hello, this is a text file\n" * 3, "text"),
        ("tflite", b"\x1c\x00\x00\x00TFL3" + bytes(56), "TensorFlow Lite"),
        ("coreml", bytes(64) + b"\xef\xbe\xad\xde" + bytes(60), "Core ML"), ("empty", b"", "empty"),
    ):  # fmt: skip
        attack(
            f"not-a-pickle-{_kind}{_suffix}", lambda h=_head: h,
            # recognised toolkits' files are named by detection, the rest show their bytes
            refused=r"not a torch\.save archive: it (starts with|is)" + (f".*({_like})" if _like else ""),
            suffix=_suffix,
        )  # fmt: skip
    # an ONNX model's first bytes: read by the ONNX reader, which names the fault and how
    # the file was read (the suffix said torch.save)
    attack(
        f"not-a-pickle-onnx{_suffix}", lambda: b"\x08\x07\x12\x07pytorch" + bytes(40),
        refused=r"field numbered 0.*read as an ONNX model, as its first bytes say",
        suffix=_suffix,
    )  # fmt: skip
attack(
    "plain-pickle-protocol-4", lambda: pickle.dumps({"a": 1}, protocol=4),
    refused=r"not a torch\.save",
)  # fmt: skip

# --- holes of cost and amplification (each runs under the watchdog)


def _memo_reused(fn: bytes, arg: bytes, calls: int, *, args: bool = False) -> bytes:
    """``arg`` pushed once and memoized; then ``fn(arg)`` (``fn(*arg)`` when ``args``)
    ``calls`` times, each result dropped."""
    body = arg + b"r\x00\x00\x00\x00" + b"0" + fn + b"r\x01\x00\x00\x00" + b"0"
    body += (b"j\x01\x00\x00\x00j\x00\x00\x00\x00" + (b"" if args else b"\x85") + b"R0") * calls
    return one(body + i(1))


attack(
    "memo-reused-list-to-ordereddict", lambda: _memo_reused(
        g("collections", "OrderedDict"), b"](" + b"".join(tup(i(n), b"N") for n in range(5_000)) + b"e", 5_000),
    refused=r"units of work",
)  # fmt: skip
attack(
    "memo-reused-list-to-set", lambda: _memo_reused(
        g("builtins", "set"), b"(" + b"".join(i(256 + n) for n in range(5_000)) + b"l", 5_000),
    refused=r"units of work",
)  # fmt: skip
attack(
    "memo-reused-str-to-encode", lambda: _memo_reused(
        g("_codecs", "encode"), tup(s("a" * (1 << 16)), s("latin1")), 20_000, args=True),
    refused=r"units of work",
)  # fmt: skip


def _dag(levels: int) -> bytes:
    return one(b"]q\x00" + b"0](h\x00h\x00eq\x00" * levels)


attack(
    "shared-lists-dag-40-levels", lambda: _dag(40),
    refused=r"shared references expand",
)  # fmt: skip
attack(
    "shared-bytes-rendered-per-key", lambda: one(
        b"B" + struct.pack("<I", 1 << 18) + bytes(1 << 18) + b"q\x00" + b"0" + b"}("
        + b"".join(s(f"k{n}") + b"h\x00" for n in range(256)) + b"u"),
    refused=r"shared references expand",
)  # fmt: skip
attack(
    "shared-repeating-tensor-under-many-keys",
    lambda: zip_pt(p2(d(("a", v2(pid("0", 4), i(0), ints(10_000_000), ints(0)) + b"q\x00"),
                        ("b", b"h\x00"), ("c", b"h\x00"))), {"0": floats(4)}),
    refused=r"repeats its storage", allowance=COPY_MARGIN,
)  # fmt: skip
attack(
    "deflated-data-pkl-48-mib", lambda: zip_pt(b"\xff" + bytes(48 << 20), deflate=("data.pkl",)),
    refused=r"which no checkpoint does",
)  # fmt: skip


def _lying_deflate(n: int) -> bytes:
    """A deflated data.pkl of n bytes whose zip headers claim 228 (the fuzzers' find)."""
    data = bytearray(zip_pt(b"\xff" + bytes(n), deflate=("data.pkl",)))
    struct.pack_into("<I", data, 22, 228)  # the first local header: data.pkl's size
    central = data.find(b"PK\x01\x02")
    struct.pack_into("<I", data, central + 24, 228)
    return bytes(data)


attack(
    "deflated-data-pkl-claims-228-bytes",
    lambda: _lying_deflate(48 << 20),
    refused=r"corrupt|CRC|claims",
)
attack(
    "empty-set-flood", lambda: one(b"\x8f" * (1 << 19)),
    refused=r"units of work",
)  # fmt: skip

# --- every tensor of a real file, whatever else it holds


def _torch_save(obj: Any, **kw: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kw)
    return buf.getvalue()


def _quantized() -> torch.Tensor:
    with warnings.catch_warnings():  # torch deprecates making one; files still hold them
        warnings.simplefilter("ignore", UserWarning)
        return torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8)


def _w_readable(out: Outcome) -> None:
    _tensor_w(out)
    assert len(out.unsupported) == 1, out.unsupported


attack(
    "sparse-tensor-beside-a-dense-one", lambda: _torch_save({"w": torch.arange(4.0), "s": torch.ones(2).to_sparse()}),
    accepted=_w_readable,
)  # fmt: skip
attack(
    "quantized-tensor-beside-a-dense-one",
    lambda: _torch_save({"w": torch.arange(4.0), "q": _quantized()}),
    accepted=_w_readable,
)  # fmt: skip
attack(
    "legacy-pickle-protocol-4", lambda: _torch_save({"w": torch.arange(4.0)}, _use_new_zipfile_serialization=False, pickle_protocol=4),
    accepted=_tensor_w,
)  # fmt: skip
attack(
    "zip-pickle-protocol-5",
    lambda: _torch_save({"w": torch.arange(4.0), "n": 1}, pickle_protocol=5),
    accepted=_values({"n": 1}),
)

_FREE_UNPICKLE = re.compile(r"weights_only=False|pickle\.load\b|torch\.load\(\S*\)")


# --------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module", autouse=True)
def _warm(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Lazy imports and first-call caches happen here, not inside a snapshot."""
    path = tmp_path_factory.mktemp("warm") / "x.pt"
    path.write_bytes(one(call(g("argparse", "Namespace"))))
    attempt(path)


def _params() -> list[Any]:
    return [
        pytest.param(a, id=a.id, marks=[pytest.mark.xfail(strict=True, reason=a.hole)] if a.hole else [])
        for a in ATTACKS
    ]  # fmt: skip


@pytest.mark.parametrize("a", _params())
def test_attack(a: Attack, tmp_path: Path) -> None:
    """The file is refused with a message (or read as documented); nothing else changes."""
    data = a.data()
    path = tmp_path / f"x{a.suffix}"
    path.write_bytes(data)
    before = snapshot()
    out = attempt(path)
    assert snapshot() == before, "the interpreter changed"
    assert not isinstance(out.error, Hang), f"{out.error} for a {len(data):,}-byte file"
    assert out.peak <= len(data) * EXPANSION + MARGIN + a.allowance, (
        f"traced {out.peak:,} bytes for a {len(data):,}-byte file"
    )
    assert out.warnings == [] or a.warns_once, out.warnings
    if a.refused is not None:
        assert isinstance(out.error, TensorBridgeError), repr(out.error)
        message = str(out.error)
        assert re.search(a.refused, message), message
        assert not _FREE_UNPICKLE.search(message), message
    else:
        assert out.error is None, repr(out.error)
        assert a.accepted is not None
        a.accepted(out)
        assert all(_deep_plain(v) for v in out.values.values()), out.values


def _corpus_attacks() -> list[Attack]:
    """The refused attacks, by corpus name (the fuzz corpus requires a refusal)."""
    return [a for a in ATTACKS if a.refused is not None and a.hole is None and a.suffix == ".pt"]


def write_corpus() -> None:
    """Write every refused attack to tests/fuzz_corpus/pt/attack-<id> (run by hand)."""
    for a in _corpus_attacks():
        (CORPUS / f"attack-{a.id}").write_bytes(a.data())


def test_the_corpus_holds_every_refused_attack() -> None:
    """tests/test_fuzz.py replays them under its own harness; here they stay in step."""
    stale = [
        a.id for a in _corpus_attacks() if (CORPUS / f"attack-{a.id}").read_bytes() != a.data()
    ]
    assert stale == []
    names = {f"attack-{a.id}" for a in _corpus_attacks()}
    assert {p.name for p in CORPUS.glob("attack-*")} == names


def test_the_attacks_cover_every_table_entry() -> None:
    """Each global the table builds from is attacked (a new row must bring its attacks)."""
    attacked = {
        a.id.split("-", 1)[1] for a in ATTACKS if a.id.startswith(("reduce-", "build-dict-on-"))
    }
    named = {n.removeprefix("build-dict-on-") for n in attacked}
    missing = sorted(k for k in pickle_machine.TABLE if not any(n.startswith(k) for n in named))
    assert missing == [], missing


@pytest.mark.parametrize("dtype", ["qint8", "complex32"])
def test_a_dtype_name_makes_torch_warn(dtype: str, tmp_path: Path) -> None:
    """In a fresh process (torch warns once a process), under -W error: only our errors."""
    import subprocess

    path = tmp_path / "x.pt"
    path.write_bytes(
        one_tensor(v3(pid("0", 16, "UntypedStorage"), i(0), ints(2), ints(1), g("torch", dtype)))
    )
    code = (
        "import sys, tensorbridge as tb\n"
        "try:\n    tb.open(sys.argv[1]).close()\n"
        "except tb.TensorBridgeError:\n    pass\n"
    )
    root = Path(__file__).parent.parent
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", code, str(path)],
        capture_output=True, text=True, timeout=120, check=False,
        env={**__import__("os").environ, "PYTHONPATH": str(root / "src")},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-500:]


# --------------------------------------------------------------------------- DCP .metadata
# The same machine reads a DCP checkpoint's .metadata (placeholders: DCP's own classes and
# pathlib's, read field by field). Each attack edits the .metadata torch writes for a small
# checkpoint (protocol 4, framed: an inserted instruction makes the frame lie, which the
# machine tolerates) and opens the directory.


@dataclass(frozen=True)
class DcpAttack:
    id: str
    edit: Callable[[bytes], bytes]  # the valid .metadata -> the hostile one
    refused: str | None = None
    hole: str | None = None


def _reframe(raw: bytes) -> bytes:
    """The one frame torch's pickler wrote (PROTO 4, FRAME n: 11 bytes) made honest again."""
    return raw[:3] + struct.pack("<Q", len(raw) - 11) + raw[11:]


def _prefix(ops: bytes) -> Callable[[bytes], bytes]:
    """``ops`` (one value) pushed and popped just before the metadata's STOP (the first
    global must stay DCP's Metadata: that is how the file is told a DCP one)."""
    return lambda raw: _reframe(raw[:-1] + ops + b"0" + raw[-1:])


def _relative_path(ops: bytes) -> Callable[[bytes], bytes]:
    """Every item's file name replaced by ``ops``."""
    return lambda raw: _reframe(raw.replace(b"\x8c\x0c__0_0.distcp", ops))


_DCP_META = "torch.distributed.checkpoint.metadata"
DCP_ATTACKS = [
    DcpAttack(
        "build-on-PosixPath-class",
        _prefix(g("pathlib", "PosixPath") + _STATE_NAME + b"b"),
        r"BUILD aimed at pathlib\.PosixPath",
    ),
    DcpAttack(
        "build-slots-on-PosixPath-class",
        _prefix(g("pathlib", "PosixPath") + _SLOTS_STATE + b"b"),
        r"BUILD aimed at",
    ),
    DcpAttack(
        "build-on-Metadata-class",
        _prefix(g(_DCP_META, "Metadata") + _STATE_NAME + b"b"),
        r"BUILD aimed at",
    ),
    DcpAttack(
        "setitems-on-Metadata-class",
        _prefix(g(_DCP_META, "Metadata") + b"(" + s("k") + i(1) + b"u"),
        r"SETITEM aimed at",
    ),
    DcpAttack(
        "appends-on-PurePath-class",
        _prefix(g("pathlib", "PurePosixPath") + b"(" + i(1) + b"e"),
        r"APPEND aimed at",
    ),
    DcpAttack(
        "os-system",
        _prefix(call(g("os", "system"), s("true"))),
        r"not one this file may hold|never calls",
    ),
    DcpAttack(
        "torch-tensor-newobj",
        _prefix(g("torch", "Tensor") + tup(i(1 << 20)) + b"\x81"),
        r"never calls|not one this file may hold",
    ),
    DcpAttack(
        "bytearray-2-to-the-33",
        _prefix(call(g("builtins", "bytearray"), i(1 << 33))),
        r"bytearray given|not one this file",
    ),
    DcpAttack(
        "placeholder-of-another-class",
        _prefix(call(g("argparse", "Namespace"))),
        r"not one this file may hold",
    ),
    DcpAttack(
        "relative-path-a-PosixPath",
        _relative_path(call(g("pathlib", "PosixPath"), s("__0_0.distcp"))),
        r"calls pathlib\.PosixPath|not one in the directory",
    ),
    DcpAttack(
        "relative-path-traversal", _relative_path(s("../__0_0.distcp")), r"not one in the directory"
    ),
    DcpAttack(
        "relative-path-absolute", _relative_path(s("/etc/passwd")), r"not one in the directory"
    ),
    DcpAttack(
        "relative-path-surrogate", _relative_path(s("\udcff.distcp")), r"not one in the directory"
    ),
    DcpAttack(
        "relative-path-nul", _relative_path(s("__0_0.distcp\x00x")), r"not one in the directory"
    ),
    DcpAttack(
        "relative-path-1-mib", _relative_path(s("a" * (1 << 20))), r"not one in the directory"
    ),
    DcpAttack("relative-path-int", _relative_path(i(7)), r"not one in the directory"),
    DcpAttack(
        "lists-30k-deep-popped", _prefix(b"]" * _N + b"a" * (_N - 1))
    ),  # dropped before the result: never walked
    DcpAttack(
        "lists-30k-deep-as-a-file-name",
        _relative_path(b"]" * _N + b"a" * (_N - 1)),
        r"nested over 200",
    ),
    DcpAttack(
        "shared-lists-dag-40-levels-popped", _prefix(b"]q\x00" + b"0](h\x00h\x00eq\x00" * 40)
    ),  # dropped before the result: never walked
    DcpAttack(
        "shared-lists-dag-40-levels-as-a-file-name",
        _relative_path(
            b"]r\xff\xff\x00\x00" + b"0](j\xff\xff\x00\x00j\xff\xff\x00\x00er\xff\xff\x00\x00" * 40
        ),
        r"shared references expand|malformed",
    ),
    DcpAttack(
        "self-containing-list-popped", _prefix(b"]q\x00h\x00a")
    ),  # dropped before the result: never walked
    DcpAttack(
        "self-containing-list-as-a-file-name",
        _relative_path(b"]r\xff\xff\x00\x00j\xff\xff\x00\x00a"),
        r"holds itself|malformed",
    ),
    DcpAttack("memo-index-2-to-the-32-minus-1", _prefix(i(1) + b"r\xff\xff\xff\xff")),
    DcpAttack(
        "binunicode8-claims-2-to-the-63", _prefix(b"\x8d" + struct.pack("<Q", 1 << 63)), r"claims"
    ),
    DcpAttack(
        "frame-claims-past-end",
        lambda raw: raw[:3] + struct.pack("<Q", 1 << 40) + raw[11:],
        r"frame claims",
    ),
    DcpAttack(
        "chunk-list-of-100k-shared-chunks",  # one chunk record memoized, appended 100,001 times
        lambda raw: _reframe(
            raw.replace(
                b"ubaub", b"ubr\xff\xff\x00\x00a(" + b"j\xff\xff\x00\x00" * 100_000 + b"eub", 1
            )
        ),
        r"overlap|cover|twice|chunk",
    ),
    DcpAttack(
        "empty-set-flood",
        _prefix(b"\x8f" * (1 << 19) + b"0" * (1 << 19) + b"N"),
        r"units of work",
    ),
]


@pytest.fixture(scope="module")
def dcp_seed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fuzz.targets import _dcp_dir

    directory = tmp_path_factory.mktemp("dcp-seed")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dcp.save in one process says so
        _dcp_dir(directory)
    try:
        tb.open(directory).close()
    except TensorBridgeError as err:  # every attack would be judged against this refusal
        pytest.skip(reason=f"the valid checkpoint the attacks edit is refused: {err}")
    return directory


@pytest.mark.parametrize(
    "a",
    [
        pytest.param(a, id=a.id, marks=[pytest.mark.xfail(strict=True, reason=a.hole)] if a.hole else [])
        for a in DCP_ATTACKS
    ],
)  # fmt: skip
def test_dcp_metadata_attack(a: DcpAttack, dcp_seed: Path, tmp_path: Path) -> None:
    """A hostile .metadata beside a valid .distcp: refused, or read; nothing else changes."""
    for f in dcp_seed.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    data = a.edit((dcp_seed / ".metadata").read_bytes())
    assert data != (dcp_seed / ".metadata").read_bytes()
    (tmp_path / ".metadata").write_bytes(data)
    before = snapshot()
    out = attempt(tmp_path)
    assert snapshot() == before, "the interpreter changed"
    assert not isinstance(out.error, Hang), f"{out.error} for a {len(data):,}-byte file"
    assert out.peak <= len(data) * EXPANSION + MARGIN, f"traced {out.peak:,} bytes"
    if a.refused is not None:
        assert isinstance(out.error, TensorBridgeError), repr(out.error)
        assert re.search(a.refused, str(out.error)), str(out.error)
        assert not _FREE_UNPICKLE.search(str(out.error)), str(out.error)
    else:
        assert out.error is None, repr(out.error)
        assert {"w", "b"} <= set(out.arrays)

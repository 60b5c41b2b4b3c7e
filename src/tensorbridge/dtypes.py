"""The dtype table: the one place that pairs a torch dtype with a NumPy dtype.

Every conversion, file format and command looks dtypes up here; nothing else
branches on a particular dtype. A row pairs a torch dtype with the NumPy dtype
that holds the same bits: NumPy's own for the classic types, and the
``ml_dtypes`` types (bfloat16, the float8 family, complex32) for the ones NumPy
lacks. Both sides of a row have the same item size, so converting is a
reinterpretation of the same bytes (zero-copy, bit-exact).

Rows whose dtype the installed ml_dtypes lacks (``complex32`` before ml_dtypes
0.7) are skipped when the table is built, by asking for the dtype rather than
comparing versions; behaviour that differs between releases is decided in
:mod:`tensorbridge._versions`. Every row's torch dtype exists in the oldest torch
supported (2.10), so only ml_dtypes decides which rows exist.

The table is built without importing torch (about 2.7 s): a row names its torch
dtype, which is looked up the first time ``row.torch`` (or ``row.carrier``) is
asked for, and the lookups by torch dtype (``BY_TORCH``, ``PACKED_BY_TORCH``) are
made on first use. Reading a file's header, or copying its arrays to another file,
never needs torch.

Identity, never ``dtype.kind``: ml_dtypes reports bfloat16 as kind ``'V'`` (like
a structured or void dtype), float8_e5m2 as ``'f'`` and complex32 as ``'c'``.

>>> import tensorbridge as tb, torch
>>> tb.numpy_dtype(torch.bfloat16)
dtype(bfloat16)
>>> tb.torch_dtype("f32")
torch.float32
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, Union

import ml_dtypes
import numpy as np

from . import packing
from ._torch_checks import is_torch_dtype
from .errors import UnsupportedDtypeError

if TYPE_CHECKING:
    import torch

    TorchDType: TypeAlias = torch.dtype

__all__ = ["DTypeRow", "dtype_table", "numpy_dtype", "resolve_dtype", "torch_dtype"]

Category = Literal["bool", "int", "uint", "float", "complex"]


@dataclass(frozen=True, eq=False)
class DTypeRow:
    """One pairing of a torch dtype with the NumPy dtype that holds the same bits.

    Attributes:
        name: the canonical name, shared by torch and NumPy/ml_dtypes ("bfloat16").
        torch: the torch dtype (torch is imported when it is first asked for).
        numpy: the NumPy dtype (NumPy's own or an ml_dtypes one).
        carrier: ``None`` when ``Tensor.numpy()`` / ``torch.from_numpy`` handle the
            dtype natively; otherwise a same-width torch integer dtype that both
            sides understand, through which the bytes are reinterpreted.
        safetensors: the dtype code in the safetensors header, or ``None``.
        category: what the values are ("bool", "int", "uint", "float", "complex").
        aliases: other names accepted wherever a dtype is given ("bf16").
        carried: whether the bits cross through ``carrier`` (``carrier is not None``,
            answered without torch).
        torch_name: torch's name for the dtype, where it is not ``name``.
    """

    name: str
    numpy: np.dtype[Any]
    safetensors: str | None
    category: Category
    aliases: tuple[str, ...] = ()
    carried: bool = False
    torch_name: str | None = None

    @cached_property
    def torch(self) -> TorchDType:
        """The torch dtype (imports torch on first use; then a plain attribute)."""
        import torch

        dtype: TorchDType = getattr(torch, self.torch_name or self.name)
        return dtype

    @cached_property
    def carrier(self) -> TorchDType | None:
        """The same-width torch integer dtype the bits cross through, or None (native)."""
        if not self.carried:
            return None
        import torch

        dtype: TorchDType = getattr(torch, self.carrier_numpy.name)
        return dtype

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize

    @cached_property
    def carrier_numpy(self) -> np.dtype[Any]:
        """The NumPy dtype of the carrier (the row's own dtype when native)."""
        return _CARRIER_NUMPY[self.itemsize] if self.carried else self.numpy

    @property
    def is_floating(self) -> bool:
        return self.category == "float"

    def __repr__(self) -> str:
        return f"DTypeRow({self.name})"


# A carried row's carrier by item size: the integer type NumPy and torch both name so.
_CARRIER_NUMPY: dict[int, np.dtype[Any]] = {
    1: np.dtype(np.uint8),
    2: np.dtype(np.int16),
    4: np.dtype(np.int32),
}
# What every ``dtype=`` / ``float_dtype=`` accepts: a torch dtype, a NumPy dtype (or type), a
# name ("bfloat16", "bf16", "torch.float8_e4m3fn") or a row of the table.
DTypeLike: TypeAlias = Union["torch.dtype", "np.dtype[Any]", type, str, DTypeRow]
# What every ``device=`` accepts, as torch does.
DeviceLike: TypeAlias = Union["torch.device", str, int]

# (name, category, safetensors code, aliases); the NumPy side is NumPy's own type.
_NATIVE: tuple[tuple[str, Category, str | None, tuple[str, ...]], ...] = (
    ("bool", "bool", "BOOL", ("b1",)),
    ("uint8", "uint", "U8", ("u8",)),
    ("int8", "int", "I8", ("i8",)),
    ("int16", "int", "I16", ("i16",)),
    ("uint16", "uint", "U16", ("u16",)),
    ("int32", "int", "I32", ("i32",)),
    ("uint32", "uint", "U32", ("u32",)),
    ("int64", "int", "I64", ("i64",)),
    ("uint64", "uint", "U64", ("u64",)),
    ("float16", "float", "F16", ("f16", "fp16", "half")),
    ("float32", "float", "F32", ("f32", "fp32")),
    ("float64", "float", "F64", ("f64", "fp64", "double")),
    ("complex64", "complex", "C64", ("c64",)),
    ("complex128", "complex", None, ("c128",)),
)
# The NumPy side is the ml_dtypes type of the same name, reached through a carrier.
_EXTENDED: tuple[tuple[str, Category, str | None, tuple[str, ...]], ...] = (
    ("bfloat16", "float", "BF16", ("bf16",)),
    ("float8_e4m3fn", "float", "F8_E4M3", ("fp8_e4m3fn", "f8e4m3fn")),
    ("float8_e5m2", "float", "F8_E5M2", ("fp8_e5m2", "f8e5m2")),
    ("float8_e4m3fnuz", "float", "F8_E4M3FNUZ", ("fp8_e4m3fnuz",)),
    ("float8_e5m2fnuz", "float", "F8_E5M2FNUZ", ("fp8_e5m2fnuz",)),
    ("float8_e8m0fnu", "float", "F8_E8M0", ("fp8_e8m0fnu", "e8m0")),
    ("complex32", "complex", None, ("c32", "chalf")),
)


def _build() -> tuple[DTypeRow, ...]:
    rows = []
    for name, category, code, aliases in _NATIVE:
        rows.append(DTypeRow(name, np.dtype(name), code, category, aliases))
    for name, category, code, aliases in _EXTENDED:
        ndt = getattr(ml_dtypes, name, None)
        if ndt is None:
            continue  # the installed ml_dtypes lacks it
        rows.append(DTypeRow(name, np.dtype(ndt), code, category, aliases, carried=True))
    return tuple(rows)


_TABLE = _build()
BY_NUMPY: dict[np.dtype[Any], DTypeRow] = {r.numpy: r for r in _TABLE}
BY_SAFETENSORS: dict[str, DTypeRow] = {r.safetensors: r for r in _TABLE if r.safetensors}
BY_NAME: dict[str, DTypeRow] = {
    key: r for r in _TABLE for key in (r.name, f"torch.{r.name}", *r.aliases)
}
# Every common spelling of a dtype in one dict, for the hot paths' single lookup; the torch
# dtypes join it when BY_TORCH is made (the first time a torch dtype is looked up).
BY_SPEC: dict[Any, DTypeRow] = {
    **BY_NAME,
    **{r.numpy.type: r for r in _TABLE},
    **BY_NUMPY,
    **{r: r for r in _TABLE},
}


@dataclass(frozen=True, eq=False)
class PackedRow:
    """A torch dtype that packs several values into each byte, and NumPy's one-a-byte dtype.

    NumPy (ml_dtypes) keeps one sub-byte value a byte; torch's packed dtypes keep
    several, as their :class:`~tensorbridge.packing.Layout` says (``float4_e2m1fn_x2``:
    :data:`~tensorbridge.packing.TORCH_X2`, element ``2i`` in the low nibble of byte
    ``i``, as torch's ``Float4_e2m1fn_x2.h`` and safetensors' ``F4`` have it).
    Converting between the two is an explicit pack / unpack (``dtype=`` names the other
    side), and the last dimension changes by ``per_byte``. Adding a packed type is one
    row in ``_PACKED_SPEC``.

    >>> row = PACKED[0]
    >>> row.name, row.per_byte, row.unpack(np.array([0x21], np.uint8)).view(np.uint8)
    ('float4_e2m1fn_x2', 2, array([1, 2], dtype=uint8))
    """

    name: str
    numpy: np.dtype[Any]  # one value a byte
    layout: packing.Layout
    safetensors: str | None
    category: Category

    @cached_property
    def torch(self) -> TorchDType:
        """The packed torch dtype (imports torch on first use)."""
        import torch

        dtype: TorchDType = getattr(torch, self.name)
        return dtype

    @property
    def per_byte(self) -> int:
        return 8 // self.layout.bits

    @property
    def bits(self) -> int:
        return self.layout.bits

    def unpack(self, packed: np.ndarray) -> np.ndarray:
        """Packed bytes (uint8) -> one value a byte; the last axis grows ``per_byte`` times."""
        count = packed.shape[-1] * self.per_byte if packed.ndim else 0
        return self.layout.unpack(packed, count).view(self.numpy)

    def pack(self, values: np.ndarray) -> np.ndarray:
        """One value a byte (last axis a multiple of ``per_byte``) -> packed uint8 bytes."""
        return self.layout.pack(values)

    def __repr__(self) -> str:
        return f"PackedRow({self.name})"


# (torch name, ml_dtypes name of one value, its packing, safetensors code, category)
_PACKED_SPEC: tuple[tuple[str, str, packing.Layout, str | None, Category], ...] = (
    ("float4_e2m1fn_x2", "float4_e2m1fn", packing.TORCH_X2, "F4", "float"),
)


def _build_packed() -> tuple[PackedRow, ...]:
    rows = []
    for name, unpacked, layout, code, category in _PACKED_SPEC:
        ndt = getattr(ml_dtypes, unpacked, None)
        if ndt is not None:
            rows.append(PackedRow(name, np.dtype(ndt), layout, code, category))
    return tuple(rows)


# Packed dtypes are not rows of the table above (their two sides differ in size).
PACKED: tuple[PackedRow, ...] = _build_packed()
PACKED_BY_NUMPY: dict[np.dtype[Any], PackedRow] = {r.numpy: r for r in PACKED}

if TYPE_CHECKING:  # made on first use by __getattr__ below, which imports torch
    BY_TORCH: dict[torch.dtype, DTypeRow]
    PACKED_BY_TORCH: dict[torch.dtype, PackedRow]


def __getattr__(name: str) -> Any:
    """``BY_TORCH`` and ``PACKED_BY_TORCH``, made (importing torch) when first asked for."""
    if name in ("BY_TORCH", "PACKED_BY_TORCH"):
        _by_torch()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _by_torch() -> dict[torch.dtype, DTypeRow]:
    """The rows by torch dtype; made once, when it also joins ``BY_SPEC``."""
    made: dict[torch.dtype, DTypeRow] | None = globals().get("BY_TORCH")
    if made is None:
        made = {r.torch: r for r in _TABLE}
        globals()["PACKED_BY_TORCH"] = {r.torch: r for r in PACKED}
        BY_SPEC.update(made)
        globals()["BY_TORCH"] = made
    return made


def packed_target(spec: Any) -> PackedRow | None:
    """The packed row that ``spec`` (a ``dtype=`` as given) names on the torch side."""
    if is_torch_dtype(spec):
        return next((r for r in PACKED if r.torch is spec), None)
    if isinstance(spec, str):
        name = spec.removeprefix("torch.")
        return next((r for r in PACKED if r.name == name), None)
    return None


def unpacked_target(spec: Any) -> PackedRow | None:
    """The packed row whose one-a-byte NumPy dtype ``spec`` names (``ml_dtypes.float4_e2m1fn``)."""
    if spec is None or isinstance(spec, DTypeRow) or is_torch_dtype(spec):
        return None
    try:
        return PACKED_BY_NUMPY.get(np.dtype(spec))
    except TypeError:
        return None


def native_row(dt: np.dtype[Any]) -> DTypeRow | None:
    """The row of a NumPy dtype, byte-swapped ones included (their native counterpart)."""
    return BY_NUMPY.get(dt) or BY_NUMPY.get(dt.newbyteorder("="))


def dtype_table() -> tuple[DTypeRow, ...]:
    """Every dtype pairing this installation supports, in a stable order.

    >>> [r.name for r in dtype_table()][:3]
    ['bool', 'uint8', 'int8']
    """
    return _TABLE


def resolve_dtype(spec: DTypeLike) -> DTypeRow:
    """Find the table row for a torch dtype, a NumPy dtype(-like) or a name.

    Names are the canonical ones ("bfloat16", "float8_e4m3fn"), "torch.*" spellings
    and the short aliases "bf16", "f16", "f32", "f64" the command line uses.

    >>> resolve_dtype("bf16").torch
    torch.bfloat16

    Raises:
        UnsupportedDtypeError: the dtype has no counterpart on the other side, or the
            name is unknown; the message names the fix.
    """
    try:
        return BY_SPEC[spec]
    except (KeyError, TypeError):  # TypeError: unhashable specs
        pass
    if is_torch_dtype(spec):
        row = _by_torch().get(spec)
        if row is None:
            raise UnsupportedDtypeError(_explain_torch(spec))
        return row
    if isinstance(spec, str):
        row = BY_NAME.get(spec) or BY_NAME.get(spec.lower())
        if row is not None:
            return row
    try:
        if spec is None:  # np.dtype(None) would silently mean float64
            raise TypeError
        ndt = np.dtype(spec)  # type: ignore[arg-type]  # anything NumPy can read
    except TypeError:
        raise UnsupportedDtypeError(
            f"{spec!r} is not a dtype; pass a torch dtype, a NumPy dtype or a name such as "
            f"'bfloat16' (known names: {', '.join(sorted(r.name for r in _TABLE))})"
        ) from None
    row = BY_NUMPY.get(ndt)
    if row is None:
        raise UnsupportedDtypeError(explain_numpy(ndt))
    return row


def numpy_dtype(spec: DTypeLike) -> np.dtype[Any]:
    """The NumPy dtype that holds the same bits as ``spec`` (a torch dtype, NumPy dtype or name).

    >>> import torch
    >>> numpy_dtype(torch.float8_e4m3fn)
    dtype(float8_e4m3fn)
    """
    return resolve_dtype(spec).numpy


def torch_dtype(spec: DTypeLike) -> torch.dtype:
    """The torch dtype that holds the same bits as ``spec`` (a NumPy dtype, torch dtype or name).

    >>> import ml_dtypes
    >>> torch_dtype(ml_dtypes.bfloat16)
    torch.bfloat16
    """
    return resolve_dtype(spec).torch


# --- messages for dtypes with no counterpart -------------------------------------------------

_ML_NO_TORCH = {
    "int1": "a.astype(np.int8)",
    "int2": "a.astype(np.int8)",
    "int4": "a.astype(np.int8)",
    "uint1": "a.astype(np.uint8)",
    "uint2": "a.astype(np.uint8)",
    "uint4": "a.astype(np.uint8)",
    "float4_e2m1fn": "to_torch(a, dtype=torch.float4_e2m1fn_x2) to pack two values a byte",
    "float6_e2m3fn": "a.astype(np.float32)",
    "float6_e3m2fn": "a.astype(np.float32)",
    "float8_e3m4": "a.astype(np.float32)",
    "float8_e4m3": "a.astype(np.float32)",
    "float8_e4m3b11fnuz": "a.astype(np.float32)",
    "float8_e5m3fnu": "a.astype(np.float32)",
    "bcomplex32": "a.astype(np.complex64)",
}
_ML_NO_TORCH_BY_DTYPE = {
    np.dtype(getattr(ml_dtypes, n)): fix for n, fix in _ML_NO_TORCH.items() if hasattr(ml_dtypes, n)
}


def explain_numpy(ndt: np.dtype[Any]) -> str:
    """Why a NumPy dtype has no torch counterpart, and what to pass instead."""
    fix = _ML_NO_TORCH_BY_DTYPE.get(ndt)
    if fix is not None:
        how = fix if fix.startswith("to_torch") else f"{fix} (lossless)"
        return f"ml_dtypes {ndt} has no torch dtype; pass {how}"
    if ndt.names is not None:
        if not ndt.names:  # np.dtype([]): a record of no fields, no bytes
            return f"structured dtype {ndt} has no fields and no torch dtype"
        return (
            f"structured dtype {ndt} has no torch dtype; convert each field separately "
            f"(a[{ndt.names[0]!r}])"
        )
    kind = ndt.kind
    if kind in "Mm":
        return f"{ndt} has no torch dtype; pass a.view(np.int64) to keep the raw ticks"
    if kind == "O":
        return (
            "object arrays have no torch dtype; convert to a numeric dtype first "
            "(np.asarray(a, dtype=np.float32))"
        )
    if kind in "US":
        return (
            f"string dtype {ndt} has no torch dtype; encode the strings to numbers first "
            "(e.g. np.frombuffer(a.tobytes(), np.uint8))"
        )
    if kind == "V":
        return f"raw void dtype {ndt} has no torch dtype; pass a.view(np.uint8) for its bytes"
    if ndt.type in (np.longdouble, np.clongdouble):
        wider = "np.float64" if kind == "f" else "np.complex128"
        return (
            f"{ndt} ({ndt.itemsize} bytes) has no torch dtype; pass a.astype({wider}), "
            "which rounds to 53 bits"
        )
    if ndt.byteorder not in "=|" and ndt.newbyteorder("=") in BY_NUMPY:
        return f"{ndt} is byte-swapped; pass a.astype(a.dtype.newbyteorder('='))"
    return f"NumPy dtype {ndt} has no torch dtype"


_COUNT = {2: "two", 4: "four", 8: "eight"}
_TIMES = {2: "doubles", 4: "quadruples", 8: "grows eightfold"}


def _explain_torch(tdt: torch.dtype) -> str:
    name = str(tdt).removeprefix("torch.")
    packed = next((r for r in PACKED if r.torch is tdt), None)
    if packed is not None:
        return (
            f"{tdt} packs {_COUNT[packed.per_byte]} values a byte and has no NumPy dtype; pass "
            f"dtype=ml_dtypes.{packed.numpy} to unpack (the last dimension "
            f"{_TIMES[packed.per_byte]}) or tensor.view(torch.uint8) for the packed bytes"
        )
    if name.startswith(("qint", "quint")):
        return (
            f"quantized {tdt} has no NumPy dtype; pass dtype=np.float32 to dequantize, or "
            "convert tensor.int_repr() for the raw integers"
        )
    if name.startswith("bits"):
        return f"{tdt} has no NumPy dtype; pass tensor.view(torch.uint8) for its raw bytes"
    if name.startswith(("int", "uint")):
        return f"sub-byte {tdt} has no NumPy dtype; unpack it to torch.int8 / torch.uint8 first"
    if name == "complex32":
        return (
            "torch.complex32 needs ml_dtypes >= 0.7 for a NumPy dtype; upgrade ml_dtypes or "
            "pass dtype=np.complex64 to upcast"
        )
    if name.startswith("float8"):
        return (
            f"{tdt} needs a newer ml_dtypes for a NumPy dtype; upgrade ml_dtypes or pass "
            "dtype=np.float32 to upcast"
        )
    return f"{tdt} has no NumPy dtype"

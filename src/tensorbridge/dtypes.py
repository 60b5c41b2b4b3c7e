"""The dtype table: the one place that pairs a torch dtype with a NumPy dtype.

Every conversion, file format and command looks dtypes up here; nothing else
branches on a particular dtype. A row pairs a torch dtype with the NumPy dtype
that holds the same bits: NumPy's own for the classic types, and the
``ml_dtypes`` types (bfloat16, the float8 family, complex32, the sub-byte
integers) for the ones NumPy lacks. Both sides of a row have the same item size,
so converting is a reinterpretation of the same bytes (zero-copy, bit-exact).

Three kinds of dtype go beyond that, each said by an attribute, never by a name:

* **Kernel-less rows** (``kernels=False``): torch's ``int1``, ``int2``, ``int4``,
  ``uint1``, ``uint2``, ``uint4`` pair with ml_dtypes' types of the same name (one
  value a byte on both sides), but torch has no kernels for them (``clone``,
  ``copy_``, ``.to()``, ``.numpy()`` raise). Their bytes cross zero-copy through the
  ``uint8`` carrier, every copy runs on that carrier and every cast (``dtype=`` to
  or from them) through ml_dtypes' ``astype``. Bytes pass verbatim: a zero-copy
  conversion never inspects values, so a byte whose bits above the type's width are
  set is kept as it is, and ml_dtypes reads only its low N bits (int4 reads ``0x18``
  as -8, like ``0x08``). ml_dtypes' casts wrap wider integers (200 -> int4 -8) and
  truncate floats.
* **NumPy-only rows** (``in_torch=False``): the ml_dtypes types torch lacks
  (``float8_e3m4``, ``float8_e4m3``, ``float8_e4m3b11fnuz``, ``float8_e5m3fnu``,
  ``float6_e2m3fn``, ``float6_e3m2fn``, ``float4_e2m1fn``, ``bcomplex32``).
  ``row.torch`` raises :class:`~tensorbridge.UnsupportedDtypeError`; ``to_numpy(t,
  dtype=...)`` casts into them with ml_dtypes' ``astype``, and ``to_torch`` of such
  an array needs a ``dtype=`` (:func:`exact_widenings` names the exact ones).
* **Shell dtypes**, no row: torch's ``int3``, ``int5``-``int7``, ``uint3``,
  ``uint5``-``uint7`` (and any sub-byte integer the installed ml_dtypes lacks) have
  no NumPy type and no kernels. They are refused unless ``dtype=`` names ``int8`` or
  ``uint8``: the bytes exactly as torch holds them, a zero-copy view.

Rows whose dtype the installed ml_dtypes lacks (``complex32`` before ml_dtypes
0.7) are skipped when the table is built, by asking ml_dtypes which types it exports
(its ``__all__``) rather than comparing versions; behaviour that differs between
releases is decided in :mod:`tensorbridge._versions`. Every row's torch dtype exists
in the oldest torch supported (2.10), so only ml_dtypes decides which rows exist.

The table is built without importing torch (about 2.7 s) or ml_dtypes (about 0.8 s,
its extension's start-up): a row names its torch dtype and its NumPy dtype and knows
its item size and category, and the dtypes themselves are looked up the first time
``row.torch`` (or ``row.carrier``) and ``row.numpy`` are asked for. Which ml_dtypes
types exist is read from ``ml_dtypes/__init__.py``'s ``__all__`` as a literal, without
running it (the module itself is asked where it is imported already or its source
cannot be read). The lookups by torch dtype (``BY_TORCH``, ``PACKED_BY_TORCH``,
``SHELL_BY_TORCH``) and by NumPy dtype (``BY_NUMPY``, ``PACKED_BY_NUMPY``) are made on
first use; :func:`row_of_numpy` looks up a dtype in hand without importing ml_dtypes
where it is not imported yet (no ml_dtypes dtype exists before it is). Reading a
file's header, or copying its arrays to another file, needs neither.

Identity, never ``dtype.kind``: ml_dtypes reports bfloat16 and int4 as kind ``'V'``
(like a structured or void dtype), float8_e5m2 as ``'f'`` and complex32 as ``'c'``.

>>> import tensorbridge as tb, torch
>>> tb.numpy_dtype(torch.bfloat16)
dtype(bfloat16)
>>> tb.torch_dtype("f32")
torch.float32
>>> tb.resolve_dtype(torch.int4).kernels, tb.resolve_dtype("float8_e4m3").in_torch
(False, False)
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from functools import cache, cached_property
from typing import TYPE_CHECKING, Any, TypeAlias, Union

import numpy as np

from ._ml_cast import exact_in
from ._packed_dtypes import PACKED as PACKED
from ._packed_dtypes import Category
from ._packed_dtypes import PackedRow as PackedRow
from ._torch_checks import is_torch_dtype
from ._versions import ml_dtypes_exports, ml_dtypes_module
from .errors import UnsupportedDtypeError

if TYPE_CHECKING:
    import torch

    TorchDType: TypeAlias = torch.dtype

__all__ = ["DTypeRow", "dtype_table", "numpy_dtype", "resolve_dtype", "torch_dtype"]


@dataclass(frozen=True, eq=False)
class DTypeRow:
    """One pairing of a torch dtype with the NumPy dtype that holds the same bits.

    Attributes:
        name: the canonical name, shared by torch and NumPy/ml_dtypes ("bfloat16"); the
            NumPy dtype's name.
        itemsize: the NumPy dtype's item size in bytes (known without ml_dtypes).
        torch: the torch dtype (torch is imported when it is first asked for); raises
            :class:`~tensorbridge.UnsupportedDtypeError` for a NumPy-only row.
        numpy: the NumPy dtype (NumPy's own, or an ml_dtypes one for a carried row:
            ml_dtypes is imported when it is first asked for).
        carrier: ``None`` when ``Tensor.numpy()`` / ``torch.from_numpy`` handle the
            dtype natively; otherwise a same-width torch integer dtype that both
            sides understand, through which the bytes are reinterpreted.
        safetensors: the dtype code in the safetensors header, or ``None``.
        category: what the values are ("bool", "int", "uint", "float", "complex").
        aliases: other names accepted wherever a dtype is given ("bf16").
        carried: whether the bits cross through ``carrier`` (``carrier is not None``,
            answered without torch).
        torch_name: torch's name for the dtype, where it is not ``name``.
        kernels: whether torch has kernels for the dtype (``copy_``, ``.to()``,
            ``.numpy()``). ``False`` for torch's sub-byte integers and the NumPy-only
            rows: their copies run on the carrier's bytes, their casts through
            ml_dtypes' ``astype``.
        in_torch: whether torch has the dtype at all (``False``: a NumPy-only row).
    """

    name: str
    itemsize: int
    safetensors: str | None
    category: Category
    aliases: tuple[str, ...] = ()
    carried: bool = False
    torch_name: str | None = None
    kernels: bool = True
    in_torch: bool = True

    @cached_property
    def numpy(self) -> np.dtype[Any]:
        """The NumPy dtype (an ml_dtypes type imports ml_dtypes on first use)."""
        if not self.carried:
            return np.dtype(self.name)
        dtype: np.dtype[Any] = np.dtype(getattr(ml_dtypes_module(), self.name))
        return dtype

    @cached_property
    def torch(self) -> TorchDType:
        """The torch dtype (imports torch on first use; then a plain attribute)."""
        if not self.in_torch:
            raise UnsupportedDtypeError(_explain_numpy_only(self))
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
# The NumPy side is the ml_dtypes type of the same name, reached through a carrier:
# (name, item size, category, safetensors code, aliases).
_EXTENDED: tuple[tuple[str, int, Category, str | None, tuple[str, ...]], ...] = (
    ("bfloat16", 2, "float", "BF16", ("bf16",)),
    ("float8_e4m3fn", 1, "float", "F8_E4M3", ("fp8_e4m3fn", "f8e4m3fn")),
    ("float8_e5m2", 1, "float", "F8_E5M2", ("fp8_e5m2", "f8e5m2")),
    ("float8_e4m3fnuz", 1, "float", "F8_E4M3FNUZ", ("fp8_e4m3fnuz",)),
    ("float8_e5m2fnuz", 1, "float", "F8_E5M2FNUZ", ("fp8_e5m2fnuz",)),
    ("float8_e8m0fnu", 1, "float", "F8_E8M0", ("fp8_e8m0fnu", "e8m0")),
    ("complex32", 4, "complex", None, ("c32", "chalf")),
)
# torch's sub-byte integers that ml_dtypes also has: one value a byte on both sides, no
# torch kernels (torch's int1-int7 / uint1-uint7 are shells: views only). (name, size, category)
_SUBBYTE: tuple[tuple[str, int, Category], ...] = (
    ("int1", 1, "int"), ("int2", 1, "int"), ("int4", 1, "int"),
    ("uint1", 1, "uint"), ("uint2", 1, "uint"), ("uint4", 1, "uint"),
)  # fmt: skip
# The ml_dtypes types torch lacks: NumPy-only rows.
_NUMPY_ONLY: tuple[tuple[str, int, Category], ...] = (
    ("float8_e3m4", 1, "float"), ("float8_e4m3", 1, "float"),
    ("float8_e4m3b11fnuz", 1, "float"), ("float8_e5m3fnu", 1, "float"),
    ("float6_e2m3fn", 1, "float"), ("float6_e3m2fn", 1, "float"),
    ("float4_e2m1fn", 1, "float"), ("bcomplex32", 4, "complex"),
)  # fmt: skip


def _build() -> tuple[DTypeRow, ...]:
    """The rows, skipping those whose type the installed ml_dtypes lacks (the one place)."""
    rows = []
    for name, category, code, aliases in _NATIVE:
        rows.append(DTypeRow(name, np.dtype(name).itemsize, code, category, aliases))
    for name, size, category, code, aliases in _EXTENDED:
        if name in _EXPORTED:
            rows.append(DTypeRow(name, size, code, category, aliases, carried=True))
    for in_torch, specs in ((True, _SUBBYTE), (False, _NUMPY_ONLY)):  # no torch kernels
        for name, size, category in specs:
            if name in _EXPORTED:
                row = DTypeRow(name, size, None, category, carried=True, kernels=False)
                rows.append(row if in_torch else dataclasses.replace(row, in_torch=False))
    return tuple(rows)


_EXPORTED = ml_dtypes_exports()
_TABLE = _build()
BY_SAFETENSORS: dict[str, DTypeRow] = {r.safetensors: r for r in _TABLE if r.safetensors}
BY_NAME: dict[str, DTypeRow] = {
    key: r
    for r in _TABLE
    for key in (r.name, *((f"torch.{r.name}",) if r.in_torch else ()), *r.aliases)
}
# NumPy's own dtypes, the rows a NumPy dtype can name before ml_dtypes is imported.
_NATIVE_BY_NUMPY: dict[np.dtype[Any], DTypeRow] = {r.numpy: r for r in _TABLE if not r.carried}
# Every common spelling of a dtype in one dict, for the hot paths' single lookup; the
# ml_dtypes types join it when BY_NUMPY is made (the first time an ml_dtypes dtype is
# looked up), the torch dtypes when BY_TORCH is (the first time a torch dtype is).
BY_SPEC: dict[Any, DTypeRow] = {
    **BY_NAME,
    **{r.numpy.type: r for r in _NATIVE_BY_NUMPY.values()},
    **_NATIVE_BY_NUMPY,
    **{r: r for r in _TABLE},
}


if TYPE_CHECKING:  # made on first use by __getattr__ below (importing torch, ml_dtypes)
    BY_TORCH: dict[torch.dtype, DTypeRow]
    PACKED_BY_TORCH: dict[torch.dtype, PackedRow]
    SHELL_BY_TORCH: dict[torch.dtype, DTypeRow]
    BY_NUMPY: dict[np.dtype[Any], DTypeRow]
    PACKED_BY_NUMPY: dict[np.dtype[Any], PackedRow]

_BY_TORCH_NAMES = ("BY_TORCH", "PACKED_BY_TORCH", "SHELL_BY_TORCH")
_BY_NUMPY_NAMES = ("BY_NUMPY", "PACKED_BY_NUMPY")
_PACKED_BY_NUMPY: dict[np.dtype[Any], PackedRow] = {}  # filled when BY_NUMPY is made


def __getattr__(name: str) -> Any:
    """``BY_TORCH``, ``PACKED_BY_TORCH`` and ``SHELL_BY_TORCH`` (importing torch), and
    ``BY_NUMPY`` and ``PACKED_BY_NUMPY`` (importing ml_dtypes), made when first asked for."""
    if name in _BY_TORCH_NAMES:
        _by_torch()
        return globals()[name]
    if name in _BY_NUMPY_NAMES:
        _by_numpy()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _by_numpy() -> dict[np.dtype[Any], DTypeRow]:
    """The rows by NumPy dtype (importing ml_dtypes); made once, when the ml_dtypes types
    and dtypes also join ``BY_SPEC``."""
    made: dict[np.dtype[Any], DTypeRow] | None = globals().get("BY_NUMPY")
    if made is None:
        made = {r.numpy: r for r in _TABLE}
        _PACKED_BY_NUMPY.update({r.numpy: r for r in PACKED})
        globals()["PACKED_BY_NUMPY"] = _PACKED_BY_NUMPY
        BY_SPEC.update({r.numpy.type: r for r in _TABLE if r.carried})
        BY_SPEC.update({dt: r for dt, r in made.items() if r.carried})
        globals()["BY_NUMPY"] = made
    return made


def _numpy_rows() -> dict[np.dtype[Any], DTypeRow]:
    """``BY_NUMPY`` where ml_dtypes is imported, else NumPy's own rows: a dtype in hand
    is of an ml_dtypes type only once ml_dtypes is imported, so a lookup needs no import
    (as einops and array-api-compat look at ``sys.modules`` to check a type)."""
    made: dict[np.dtype[Any], DTypeRow] | None = globals().get("BY_NUMPY")
    if made is not None:
        return made
    return _by_numpy() if "ml_dtypes" in sys.modules else _NATIVE_BY_NUMPY


def row_of_numpy(dt: np.dtype[Any]) -> DTypeRow | None:
    """The row of a NumPy dtype in hand (``BY_NUMPY.get(dt)``), or None; imports ml_dtypes
    only where it is imported already.

    >>> row_of_numpy(np.dtype(np.float16)), row_of_numpy(np.dtype("V2"))
    (DTypeRow(float16), None)
    """
    return _numpy_rows().get(dt)


def packed_of_numpy(dt: np.dtype[Any]) -> PackedRow | None:
    """The packed row whose one-value-a-byte dtype is ``dt`` (``PACKED_BY_NUMPY.get(dt)``),
    or None; imports ml_dtypes only where it is imported already (as :func:`row_of_numpy`)."""
    _numpy_rows()
    return _PACKED_BY_NUMPY.get(dt)


def _by_torch() -> dict[torch.dtype, DTypeRow]:
    """The rows by torch dtype; made once, when it also joins ``BY_SPEC``.

    ``SHELL_BY_TORCH`` maps each of torch's sub-byte integers that has no row (no
    ml_dtypes type: ``int3``, ``uint5``, ...) to the byte row (``int8`` or ``uint8``)
    whose ``dtype=`` takes its bytes as torch holds them.
    """
    made: dict[torch.dtype, DTypeRow] | None = globals().get("BY_TORCH")
    if made is None:
        import torch

        made = {r.torch: r for r in _TABLE if r.in_torch}
        globals()["PACKED_BY_TORCH"] = {r.torch: r for r in PACKED}
        shells = {}
        for sign in ("int", "uint"):
            for bits in range(1, 8):
                tdt = getattr(torch, f"{sign}{bits}", None)
                if tdt is not None and tdt not in made:
                    shells[tdt] = BY_NAME[f"{sign}8"]
        globals()["SHELL_BY_TORCH"] = shells
        BY_SPEC.update(made)
        globals()["BY_TORCH"] = made
    return made


def is_byte(row: DTypeRow) -> bool:
    """Whether ``row`` is int8 or uint8: what a shell dtype's bytes may be viewed as."""
    return row.itemsize == 1 and row.kernels and row.category in ("int", "uint")


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
    if isinstance(spec, str):  # NumPy reads the name only once ml_dtypes is imported
        named = next((r for r in PACKED if r.numpy_name == spec), None)
        if named is not None:
            return named
    try:
        return packed_of_numpy(np.dtype(spec))
    except TypeError:
        return None


def native_row(dt: np.dtype[Any]) -> DTypeRow | None:
    """The row of a NumPy dtype, byte-swapped ones included (their native counterpart)."""
    return row_of_numpy(dt) or row_of_numpy(dt.newbyteorder("="))


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
    row = row_of_numpy(ndt)
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

_WIDEST_PART = 4  # exact widenings are sought among torch's dtypes up to 32-bit parts


@cache
def exact_widenings(row: DTypeRow) -> tuple[DTypeRow, ...]:
    """The wider torch rows (up to 32 bits a part) that hold every value of ``row`` exactly.

    Computed from the values themselves on first use (:func:`tensorbridge._ml_cast.exact_in`).

    >>> [r.name for r in exact_widenings(resolve_dtype("float8_e8m0fnu"))]
    ['bfloat16', 'float32']
    """
    parts = 2 if row.category == "complex" else 1
    wider = sorted(
        (
            r
            for r in _TABLE
            if r.category == row.category and r.in_torch and r.kernels
            and row.itemsize < r.itemsize <= _WIDEST_PART * parts
        ),
        key=lambda r: (r.itemsize, r.name),
    )  # fmt: skip
    exact = exact_in(row.numpy, [r.numpy for r in wider], complex_=parts == 2)
    return tuple(r for r in wider if r.numpy in exact)


def _either(rows: tuple[DTypeRow, ...]) -> str:
    names = [f"torch.{r.name}" for r in rows]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _explain_numpy_only(row: DTypeRow) -> str:
    widest = BY_NAME["complex128" if row.category == "complex" else "float64"]
    exact = exact_widenings(row) or (widest,)  # every type of the table has some today
    how = f"dtype={_either(exact)} (each holds every {row.name} value exactly)"
    packed = packed_of_numpy(row.numpy)
    if packed is not None:
        how = f"dtype=torch.{packed.name} to pack {_COUNT[packed.per_byte]} values a byte, or {how}"
    return f"ml_dtypes {row.name} has no torch dtype; pass {how}"


def explain_numpy(ndt: np.dtype[Any]) -> str:
    """Why a NumPy dtype has no torch counterpart, and what to pass instead."""
    row = row_of_numpy(ndt)
    if row is not None and not row.in_torch:
        return _explain_numpy_only(row)
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
    if ndt.byteorder not in "=|" and row_of_numpy(ndt.newbyteorder("=")):
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
        byte = "np.uint8" if name.startswith("u") else "np.int8"
        return (
            f"sub-byte {tdt} has no NumPy dtype (ml_dtypes has no {name}) and torch has no "
            f"kernels for it; pass dtype={byte} for its bytes as torch holds them, one value a "
            "byte (a zero-copy view)"
        )
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

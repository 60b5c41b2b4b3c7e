"""The one interface every quantization scheme implements, and the pieces they share.

A *scheme* turns stored codes and scales back into plain floating-point weights
(and, for the formats tensorbridge writes, the other way). Each scheme is one
module and one :class:`Scheme` subclass with four verbs:

* ``detect(index, config, options)`` — the :class:`Group` s of stored tensors it
  claims in a checkpoint (``index``: name -> dtype row and shape, read from headers
  only), each checked for consistency (a scale grid that tiles its weight, the
  dtypes the layout asks for) or refused with :class:`~tensorbridge.QuantizationError`;
* ``make_group(name, parts, index, options)`` — the same checks for parts given
  by role (``codes``, ``scale``, ``global_scale``), as ``tb.dequantize`` on arrays uses;
* ``kernel(parts, group)`` — the dequantized values of one piece, in float32;
* ``quantize(x, **options)`` — codes and scales in the scheme's own layout;

plus ``describe()``. A scheme also *describes itself*, so that no other module tests
its name: the names it answers to (``aliases``), what its stored tensors' names and
dtypes say without a config (:meth:`Scheme.from_names`), the suffixes of its stored tensors
(``part_suffixes``, ``suffixes`` by layout), what writing it takes (``row_block``,
``takes_block_size``, ``published_layout``, :meth:`Scheme.stored`,
:meth:`Scheme.written_config`), what its codes can reach (:meth:`Scheme.code_max`)
and which torchao tensor subclasses it reads (:meth:`Scheme.from_subclass`).
Adding a scheme is one module and one line in :mod:`tensorbridge.quant.registry`.

Pieces (``pieces``) let a checkpoint be streamed a block row at
a time: each piece is a dict of array slices whose dequantized values follow one
another in the output's C order.

Numerics, for every scheme: the product of code and scale is computed in float32
and rounded once to the requested dtype. Each scheme's ``numerics`` says where that
product can itself round (an fp32 scale product, subnormals).
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from ..dtypes import DTypeRow, resolve_dtype
from ..errors import QuantizationError
from .codes import (
    FP4_VALUES,
    FP8_MAX,
    e8m0_to_f32,
    fold_factor,
    fp4_codes_to_f32,
    fp4_encode,
    fp8_to_f32,
    fp8_to_f32_shifted,
    group_index,
    group_scale_,
    int_codes_f32,
    packed_words,
    torchao_parts,
    unpack_int32,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "ACTIVATION_SCALES",
    "FP4_VALUES",
    "FP8_MAX",
    "PIECE_ELEMENTS",
    "Config",
    "Group",
    "Index",
    "Scheme",
    "as_torch",
    "compressed_tensors_config",
    "e8m0_to_f32",
    "fold_factor",
    "fp4_codes_to_f32",
    "fp4_encode",
    "fp8_to_f32",
    "fp8_to_f32_shifted",
    "group_index",
    "group_scale_",
    "int_codes_f32",
    "packed_words",
    "require",
    "row_pieces",
    "scale_partner",
    "shape_text",
    "torchao_parts",
    "unpack_int32",
]

# name -> (stored dtype row, stored shape): what a checkpoint's headers say, nothing read
Index = Mapping[str, tuple[DTypeRow, tuple[int, ...]]]

# about how many output elements one piece holds: its float32 values (1 MiB) stay in cache
PIECE_ELEMENTS = 1 << 18
# stored beside a weight, describing activations: dropped from a dequantized checkpoint
ACTIVATION_SCALES = ("input_scale", "input_global_scale", "output_scale", "k_scale", "v_scale")


@dataclass(frozen=True)
class Config:
    """A checkpoint's quantization config: the JSON object and the file it came from.

    ``method`` is ``quant_method`` (``"fp8"``, ``"mxfp4"``, ``"compressed-tensors"``,
    ``"modelopt"``, ...), lower-cased; a ModelOpt ``hf_quant_config.json`` gives
    ``"modelopt"``.
    """

    data: Mapping[str, Any]
    source: str = "quantization_config"

    @property
    def method(self) -> str:
        if "quant_method" in self.data:
            return str(self.data["quant_method"]).lower()
        producer = self.data.get("producer")
        if isinstance(producer, Mapping) and "modelopt" in str(producer.get("name", "")).lower():
            return "modelopt"
        return ""

    @property
    def algo(self) -> str:
        """ModelOpt's ``quant_algo`` (``"NVFP4"``, ``"FP8"``), wherever the file keeps it."""
        inner = self.data.get("quantization")
        where = inner if isinstance(inner, Mapping) else self.data
        return str(where.get("quant_algo", "")).upper()

    @property
    def formats(self) -> set[str]:
        """compressed-tensors' ``format`` values (top level and each config group)."""
        found = {str(self.data["format"])} if self.data.get("format") else set()
        groups = self.data.get("config_groups")
        if isinstance(groups, Mapping):
            found |= {
                str(g["format"])
                for g in groups.values()
                if isinstance(g, Mapping) and g.get("format")
            }
        return found


@dataclass(frozen=True)
class Group:
    """Stored tensors that dequantize into one weight of the unquantized model.

    Attributes:
        name: the weight's name in the unquantized model (``...gate_up_proj``).
        scheme: the scheme's name.
        parts: role (``codes``, ``scale``, ``global_scale``) -> stored tensor name.
        shape: the dequantized weight's shape (the unquantized model's).
        options: what the scheme decided (block size, convention, layout).
        dropped: stored tensors left out of a dequantized checkpoint (activation scales).
    """

    name: str
    scheme: str
    parts: Mapping[str, str]
    shape: tuple[int, ...]
    options: Mapping[str, Any] = field(default_factory=dict)
    dropped: tuple[str, ...] = ()

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class Scheme(abc.ABC):
    """One quantization scheme: detect, dequantize, quantize, describe (see the module).

    The class attributes are what other modules ask instead of testing the name: the
    registry (aliases), a dequantized checkpoint's check that no stored part is left
    over (``part_suffixes``), ``tb.quantize`` (``suffixes``), ``convert --quantize``
    (``writes``, ``published_layout``, ``other_layouts``, ``row_block``,
    ``takes_block_size``, ``per_tensor_amax``, ``elements``) and ``quant_report``
    (``e8m0_scales``, :meth:`code_max`).
    """

    name: ClassVar[str]
    summary: ClassVar[str]  # one line: layout and where it comes from
    numerics: ClassVar[str]  # one line: how the product is computed and where it may round
    writes: ClassVar[bool] = False  # quantize() implemented (and convert --quantize writes it)
    # other names ``scheme=`` takes for it (lower case, ``-`` for ``_``)
    aliases: ClassVar[tuple[str, ...]] = ()
    # names that mean this scheme *or* another: the name -> the refusal that says which
    ambiguous: ClassVar[Mapping[str, str]] = {}
    # name endings of stored tensors that only mean something as a part of this scheme's
    # weights: one that no weight claims is refused, not passed through
    part_suffixes: ClassVar[tuple[str, ...]] = ()
    # stored dtypes that, left over beside this scheme's weights, mean a missing
    # partner (fp8 codes without their scale) rather than a tensor to pass through
    stray_dtypes: ClassVar[tuple[str, ...]] = ()
    # layout -> role -> what the stored tensor's name adds to the weight's ("": the
    # scheme's own layout, ``layout=None`` or ``"ocp"``): ``tb.quantize``'s names
    suffixes: ClassVar[Mapping[str, Mapping[str, str]]] = {}
    # the layout= that convert --quantize writes (the published one), and its others
    published_layout: ClassVar[str | None] = None
    other_layouts: ClassVar[tuple[str, ...]] = ()
    # the rows' length must be a multiple of this to quantize (its blocks along a row)
    row_block: ClassVar[int | None] = None
    # blocks span rows too, sized by ``block_size=(rows, cols)`` (default (128, 128))
    takes_block_size: ClassVar[bool] = False
    # quantizing a slice of rows needs the whole weight's largest magnitude (``amax=``)
    per_tensor_amax: ClassVar[bool] = False
    # element types by the names ``element=`` takes ({} where the element is fixed)
    elements: ClassVar[Mapping[str, str]] = {}
    # a U8 scale holds e8m0 exponent bytes (``2 ** (byte - 127)``)
    e8m0_scales: ClassVar[bool] = False

    def claims(self, config: Config) -> bool:
        """Whether ``config`` names this scheme."""
        return False

    def from_names(self, index: Index, options: Mapping[str, Any]) -> list[Group]:
        """The groups of ``index`` that names, dtypes and shapes alone say are this
        scheme's, when no config says anything (default: none); where they could be
        this scheme's but cannot say how to read them (two conventions, exponents or
        integers), :class:`~tensorbridge.QuantizationError` naming the argument that
        settles it. Detection asks every scheme, in the registry's order."""
        return []

    def from_subclass(
        self, x: torch.Tensor, inner: Mapping[str, torch.Tensor], attributes: Mapping[str, Any]
    ) -> dict[str, torch.Tensor] | None:
        """The parts by role of a torchao tensor subclass ``x`` that this scheme
        dequantizes bit-exactly (``inner`` and ``attributes``: what its
        ``__tensor_flatten__`` names), or ``None`` (default: no subclass)."""
        return None

    def code_max(self, codes: DTypeRow) -> float | None:
        """The largest magnitude a code stored as ``codes`` can hold (``None``: integer
        codes, no such limit). A block with a code there is reported as saturated."""
        return None

    def stored(
        self,
        name: str,
        shape: tuple[int, ...],
        *,
        block_size: tuple[int, int] | None = None,
        layout: str | None = None,
        element: str | None = None,
    ) -> dict[str, tuple[str, DTypeRow, tuple[int, ...]]]:
        """The stored tensors a ``shape`` weight ``name`` quantizes into (name -> role,
        dtype row, shape) in ``layout``, from its shape alone (a streaming writer needs
        them for the header before any value)."""
        raise QuantizationError(
            f"tensorbridge dequantizes {self.name} but does not write it; quantize with "
            "one of the MX formats, nvfp4 or fp8-block"
        )

    def written_config(
        self, block_size: tuple[int, int] | None, ignored: list[str], layout: str | None
    ) -> dict[str, Any]:
        """The ``quantization_config`` a loader reads :meth:`stored`'s layout from;
        ``ignored`` lists the modules left unquantized (sorted)."""
        raise QuantizationError(f"tensorbridge does not write {self.name}")

    def config_caveat(self, element: str | None) -> str | None:
        """What :meth:`written_config` cannot say (a note for the user), or None."""
        return None

    def role_suffixes(self, layout: str | None) -> Mapping[str, str]:
        """Role -> name suffix in ``layout`` (``None`` / ``"ocp"``: the scheme's own), or
        QuantizationError naming the layouts there are."""
        key = "" if layout in (None, "ocp") else str(layout)
        if key not in self.suffixes:
            others = [repr(k) for k in self.suffixes if k]
            raise QuantizationError(
                f"{self.name} has no layout {layout!r}; leave out layout= (the scheme's own)"
                + (f" or pass {' or '.join(others)}" if others else "")
            )
        return self.suffixes[key]

    @abc.abstractmethod
    def detect(
        self, index: Index, config: Config | None, options: Mapping[str, Any]
    ) -> list[Group]:
        """The groups of ``index`` this scheme claims, each checked (or refused)."""

    @abc.abstractmethod
    def make_group(
        self, name: str, parts: Mapping[str, str], index: Index, options: Mapping[str, Any]
    ) -> Group:
        """Check stored parts by role and work out the output, or raise QuantizationError."""

    @abc.abstractmethod
    def kernel(self, parts: Mapping[str, torch.Tensor], group: Group) -> torch.Tensor:
        """The float32 values of one piece (CPU tensors of the stored dtypes)."""

    def pieces(self, group: Group, parts: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """Slices of ``parts`` whose kernels give the output in C order (default: all)."""
        yield dict(parts)

    def quantize(self, x: torch.Tensor, **options: Any) -> dict[str, torch.Tensor]:
        """Codes and scales by role, in this scheme's layout (``scales_only=True``: the
        scales alone, for a writer that streams the scale tensor apart from the codes)."""
        raise QuantizationError(
            f"tensorbridge dequantizes {self.name} but does not write it; quantize with "
            "one of the MX formats, nvfp4 or fp8-block"
        )

    def check_values(self, group: Group, parts: Mapping[str, Any], where: str) -> None:
        """Check the stored values this scheme indexes by (an act-order ``g_idx``) once,
        before any piece is computed; ``where`` (the file) starts the message. The
        kernels check them too, without the file's name. Default: nothing to check.

        Raises:
            FormatError: an index out of its range.
        """
        return None

    def block_index(self, group: Group, flat: torch.Tensor) -> torch.Tensor | None:
        """Each output element's block: flat indices of the dequantized weight (C order)
        -> flat indices into its scale tensor; ``None`` where scales are not a grid over
        the weight (the integer schemes' act-order groups), so no per-block report.

        >>> from tensorbridge.quant import SCHEMES, Group
        >>> g = Group("w", "mxfp8", {}, (2, 64), {"layout": "ocp"})
        >>> SCHEMES["mxfp8"].block_index(g, torch.tensor([0, 31, 32, 64])).tolist()
        [0, 0, 1, 2]
        """
        return None

    def describe(self) -> str:
        return f"{self.name}: {self.summary} Numerics: {self.numerics}"

    def dequantize(
        self, parts: Mapping[str, Any], group: Group, dtype: torch.dtype
    ) -> torch.Tensor:
        """The whole weight as ``dtype``: each piece in float32, rounded once."""
        import torch

        out = torch.empty(group.shape, dtype=dtype)
        flat = out.view(-1)
        at = 0
        for piece in self.pieces(group, {k: as_torch(v) for k, v in parts.items()}):
            values = self.kernel(piece, group).reshape(-1)
            flat[at : at + values.numel()].copy_(values)
            at += values.numel()
        if at != flat.numel():  # pragma: no cover - a scheme's pieces disagree with its shape
            raise AssertionError(f"{self.name}: pieces gave {at} of {flat.numel()} values")
        return out


def as_torch(x: Any) -> torch.Tensor:
    """A CPU tensor of ``x``'s bits: an array's memory viewed through the dtype table's
    bit-cast (``_memory``), zero-copy; read-only memory is copied, as ``to_torch`` would.

    >>> import ml_dtypes
    >>> a = np.array([1.5], dtype=ml_dtypes.bfloat16)
    >>> t = as_torch(a)
    >>> t.dtype, t.data_ptr() == a.ctypes.data
    (torch.bfloat16, True)
    """
    import ml_dtypes
    import torch

    from .._memory import host_tensor

    if isinstance(x, torch.Tensor):
        return x
    a = np.asarray(x)
    if a.dtype == np.dtype(ml_dtypes.float4_e2m1fn):  # one value a byte: its code
        a = a.view(np.uint8)
    if not a.dtype.isnative:  # a big-endian file's array: native bytes, a copy
        a = a.astype(a.dtype.newbyteorder("="))
    t = host_tensor(a, resolve_dtype(a.dtype))
    if not a.flags.writeable and t.data_ptr() == a.ctypes.data:
        return t.clone()  # never a writable tensor over read-only memory
    return t


def scale_partner(name: str, index: Index) -> tuple[str, str] | None:
    """``(weight, codes)`` when ``name`` is a weight's scale by the common convention:
    ``NAME_scale`` beside codes ``NAME_packed`` or ``NAME`` (activation scales are not).

    >>> from tensorbridge.dtypes import resolve_dtype
    >>> u8 = (resolve_dtype("uint8"), (2,))
    >>> scale_partner("w_scale", {"w_packed": u8, "w_scale": u8})
    ('w', 'w_packed')
    >>> scale_partner("l.input_scale", {"l.input": u8, "l.input_scale": u8}) is None
    True
    """
    if not name.endswith("_scale") or name.endswith(ACTIVATION_SCALES):
        return None
    weight = name[: -len("_scale")]
    codes = weight + "_packed" if weight + "_packed" in index else weight
    return (weight, codes) if codes in index else None


def shape_text(shape: tuple[int, ...]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def row_pieces(
    lead: tuple[int, ...], rows: int, cols: int, block_rows: int
) -> Iterator[tuple[tuple[int, ...], int, int]]:
    """``(leading index, first row, end row)`` for every piece of a ``[*lead, rows, cols]``
    weight, about :data:`PIECE_ELEMENTS` values each: whole multiples of ``block_rows``,
    or a divisor of it, so that no piece straddles two block rows."""
    per = max(1, PIECE_ELEMENTS // max(1, cols))
    if per >= block_rows:
        per = per // block_rows * block_rows
    else:
        while block_rows % per:
            per -= 1
    for idx in np.ndindex(*lead):
        for r0 in range(0, rows, per):
            yield tuple(int(i) for i in idx), r0, min(rows, r0 + per)


def compressed_tensors_config(
    fmt: str, bits: int, group_size: int, strategy: str, ignored: list[str]
) -> dict[str, Any]:
    """The ``quantization_config`` llm-compressor writes for float weights quantized as
    ``fmt`` in groups of ``group_size`` along a row (one config group, ``Linear``).

    >>> compressed_tensors_config("mxfp4-pack-quantized", 4, 32, "group", [])["format"]
    'mxfp4-pack-quantized'
    """
    return {
        "quant_method": "compressed-tensors",
        "format": fmt,
        "quantization_status": "compressed",
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "format": fmt,
                "weights": {
                    "num_bits": bits,
                    "type": "float",
                    "strategy": strategy,
                    "group_size": group_size,
                    "symmetric": True,
                    "dynamic": False,
                },
                "input_activations": None,
            }
        },
        "ignore": ignored,
    }


def require(cond: bool, message: str) -> None:
    """Raise :class:`QuantizationError` with ``message`` unless ``cond``."""
    if not cond:
        raise QuantizationError(message)

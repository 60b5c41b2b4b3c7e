"""Which scheme a checkpoint uses, and which stored tensors make up each weight.

Decided in this order, and refused (:class:`~tensorbridge.QuantizationError`) rather
than guessed:

1. ``scheme=`` given by the caller: that scheme, with whatever config there is.
2. A config next to the checkpoint: ``config.json``'s ``quantization_config``, else
   ModelOpt's ``hf_quant_config.json``, else AutoGPTQ's ``quantize_config.json``;
   the scheme(s) its ``quant_method`` / ``format`` / ``quant_algo`` names.
3. No config: tensor names, dtypes and shapes, where they say one thing only, as
   each scheme says of itself (``Scheme.from_names``, asked in the registry's order)
   — gpt-oss ``_blocks`` / ``_scales``; fp8 codes with a float scale (per tensor or
   channel) or an ``F8_E8M0`` one (MXFP8); ``U8`` codes with an ``F8_E8M0`` scale
   (MXFP4). A ``U8`` scale (e8m0 exponents or integers?), block scales without a
   block size, int-packed ``qweight`` (GPTQ or AWQ?) and NVFP4 (two toolkits,
   reciprocal global scales) are refused with the argument that settles them.

Every stored tensor ends up in exactly one place: a group's part, a dropped
activation scale, or passed through bit-exact. A scale-like tensor no group claims
is refused (a mixed or corrupt checkpoint), so nothing is lost silently.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .._files import Links, read_limited
from ..errors import FormatError, LinkError, QuantizationError, TensorBridgeError
from .base import ACTIVATION_SCALES, Config, Group, Index, Scheme
from .registry import SCHEMES, scheme_named

__all__ = ["SCHEMES", "Plan", "plan", "read_config", "scheme_named"]

_UNSUPPORTED = {  # quant_method -> what to use instead
    "bitsandbytes": "bitsandbytes",
    "hqq": "hqq",
    "eetq": "eetq",
    "aqlm": "aqlm",
    "quanto": "optimum-quanto",
    "gguf": "the gguf package",
}
# suffixes of stored tensors that only mean something as part of a quantized weight
_PART_SUFFIXES = tuple(dict.fromkeys(x for s in SCHEMES.values() for x in s.part_suffixes))


@dataclass(frozen=True)
class Plan:
    """What dequantizing a checkpoint does: groups, tensors passed through, tensors dropped.

    ``names`` is the output's order: each group at its codes' place, passed-through
    tensors at theirs.
    """

    schemes: tuple[str, ...]
    groups: tuple[Group, ...]
    passthrough: tuple[str, ...]
    dropped: tuple[str, ...]
    names: tuple[str, ...]
    config: Config | None = None

    @property
    def quantized(self) -> bool:
        return bool(self.groups)

    def group(self, name: str) -> Group | None:
        """The group whose output is ``name``, if any."""
        return self._by_name.get(name)

    @property
    def _by_name(self) -> dict[str, Group]:
        cached: dict[str, Group] | None = self.__dict__.get("_cache")
        if cached is None:
            cached = {g.name: g for g in self.groups}
            object.__setattr__(self, "_cache", cached)
        return cached

    def summary(self) -> str:
        """One line: the scheme, how many weights, what was dropped."""
        if not self.groups:
            return "not quantized"
        text = f"{', '.join(self.schemes)}: {len(self.groups)} quantized weights"
        opts = {k: v for g in self.groups[:1] for k, v in g.options.items() if k == "block_size"}
        if opts:
            text += f" (block size {list(opts['block_size'])})"
        if self.dropped:
            more = f" and {len(self.dropped) - 3} more" if len(self.dropped) > 3 else ""
            text += f"; activation scales dropped: {', '.join(self.dropped[:3])}{more}"
        return text


def read_config(
    path: str | os.PathLike[str] | None, *, follow_links: bool = False
) -> Config | None:
    """The quantization config beside a checkpoint file or in a checkpoint directory.

    Each config is a regular file of at most ``MAX_CONFIG`` bytes inside the
    checkpoint's directory (or Hugging Face cache repository); one that is a link out
    of it raises :class:`~tensorbridge.errors.LinkError` unless ``follow_links=True``.
    """
    if path is None:
        return None
    p = Path(path)
    directory = p if p.is_dir() else p.parent
    links = Links.of(directory, follow=follow_links)
    config_json = _json(directory / "config.json", links)
    if isinstance(config_json, Mapping) and isinstance(
        config_json.get("quantization_config"), Mapping
    ):
        return Config(config_json["quantization_config"], "config.json")
    for name in ("hf_quant_config.json", "quantize_config.json"):
        data = _json(directory / name, links)
        if isinstance(data, Mapping):
            if name == "quantize_config.json" and "quant_method" not in data:
                data = {**data, "quant_method": "gptq"}
            return Config(data, name)
    return None


def config_of(config: Any) -> Config | None:
    """``config=`` as given: a Config, a quantization_config dict, a config.json dict, a path."""
    if config is None or isinstance(config, Config):
        return config
    if isinstance(config, (str, os.PathLike)):
        p = Path(config)
        if p.is_file() and p.suffix == ".json":
            data = _json(p)
            if isinstance(data, Mapping):
                inner = data.get("quantization_config")
                return Config(inner if isinstance(inner, Mapping) else data, p.name)
        return read_config(p)
    if isinstance(config, Mapping):
        inner = config.get("quantization_config")
        return Config(inner if isinstance(inner, Mapping) else config)
    raise TypeError(
        f"config= takes a dict, a path or None, got {type(config).__qualname__}; pass the "
        "quantization_config dict"
    )


MAX_CONFIG = 1 << 26  # a config.json over 64 MiB is no model's configuration


def _json(path: Path, links: Links | None = None) -> Any:
    """A config file's JSON (None when absent), read as a regular file of at most
    ``MAX_CONFIG`` bytes (``links``: confined to the checkpoint)."""
    try:
        if links is not None:
            raw = links.read(path, MAX_CONFIG, "model config")
        else:
            raw = read_limited(path, MAX_CONFIG, "model config")
    except FileNotFoundError:
        return None
    except LinkError:
        raise
    except FormatError as e:  # a FIFO, a device, a directory, or over the limit
        raise QuantizationError(f"{e}; pass config= the quantization_config dict instead") from None
    except OSError as e:
        raise QuantizationError(f"{path} is not readable ({e}); fix or remove it") from None
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:
        raise QuantizationError(f"{path} is not readable JSON ({e}); fix or remove it") from None


def plan(
    index: Index,
    config: Config | None = None,
    scheme: str | None = None,
    options: Mapping[str, Any] | None = None,
) -> Plan:
    """Work out every group of ``index`` (see the module docstring), or raise."""
    opts = dict(options or {})
    if scheme is not None:
        chosen = [scheme_named(scheme)]
    elif config is not None:
        chosen = _from_config(config)
    else:
        chosen = []
    groups: list[Group] = []
    if chosen:
        for s in chosen:
            try:
                groups += s.detect(index, config, opts)
            except TensorBridgeError:
                raise
            except (TypeError, ValueError, ArithmeticError) as err:
                # a config value of the wrong type or range (a block size of "x", 0, null)
                where = config.source if config is not None else "the options"
                raise QuantizationError(
                    f"{where} does not describe a {s.name} checkpoint: a value is malformed "
                    f"({err}); fix it, or pass scheme= and block_size= to override it"
                ) from None
    else:
        groups = _from_names(index, opts)
    return _assemble(index, groups, config, tuple(s.name for s in chosen))


def _from_config(config: Config) -> list[Scheme]:
    method = config.method
    if method in _UNSUPPORTED:
        raise QuantizationError(
            f"{config.source} says quant_method {method!r}, which tensorbridge does not "
            f"dequantize yet; use {_UNSUPPORTED[method]}"
        )
    chosen = [s for s in SCHEMES.values() if s.claims(config)]
    if not chosen:
        what = method or "no quant_method"
        extra = f", format {sorted(config.formats)}" if config.formats else ""
        extra += f", quant_algo {config.algo!r}" if config.algo else ""
        raise QuantizationError(
            f"{config.source} names {what}{extra}, which no scheme tensorbridge knows "
            f"matches ({', '.join(SCHEMES)}); pass scheme= if it is one of them"
        )
    return chosen


def _from_names(index: Index, options: Mapping[str, Any]) -> list[Group]:
    """No config: the groups whose names, dtypes and shapes say one thing only, as each
    scheme says (:meth:`~tensorbridge.quant.base.Scheme.from_names`: a scheme the names
    could mean in two ways refuses), scheme by scheme in the registry's order."""
    return [g for s in SCHEMES.values() for g in s.from_names(index, options)]


def _assemble(
    index: Index, groups: list[Group], config: Config | None, schemes: tuple[str, ...]
) -> Plan:
    owner: dict[str, Group] = {}
    first: dict[str, Group] = {}
    for g in groups:
        for part in g.parts.values():
            if part in owner and owner[part] is not g:
                raise QuantizationError(
                    f"{part} is claimed by both {owner[part].name} ({owner[part].scheme}) and "
                    f"{g.name} ({g.scheme}); pass scheme= to say which"
                )
            owner[part] = g
        first.setdefault(g.parts["codes"], g)
    dropped = {d for g in groups for d in g.dropped}
    names: list[str] = []
    passthrough: list[str] = []
    strays = {d for g in groups for d in SCHEMES[g.scheme].stray_dtypes}
    for name, (row, _) in index.items():
        if name in first:
            names.append(first[name].name)
        elif name in owner or name in dropped:
            continue
        elif groups and name.endswith(ACTIVATION_SCALES):
            dropped.add(name)
        elif name.endswith(_PART_SUFFIXES) or (
            groups and (row.name in strays or row.name == "float8_e8m0fnu")
        ):
            raise QuantizationError(
                f"{name} ({row.name}) belongs to no quantized weight of this "
                f"{'/'.join(schemes) or (groups[0].scheme if groups else 'unconfigured')} "
                "checkpoint (a missing partner, a mixed scheme, a shard left out, or no config "
                "beside it); pass scheme= or exclude it"
            )
        else:
            names.append(name)
            passthrough.append(name)
    clash = [g.name for g in groups if g.name in passthrough]
    if clash:
        raise QuantizationError(
            f"{clash[0]} is both a stored tensor and a dequantized weight's name; the "
            "checkpoint mixes layouts"
        )
    return Plan(
        schemes or tuple(dict.fromkeys(g.scheme for g in groups)),
        tuple(groups),
        tuple(passthrough),
        tuple(sorted(dropped)),
        tuple(names),
        config,
    )

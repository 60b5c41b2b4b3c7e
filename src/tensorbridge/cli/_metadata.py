"""convert's ``--metadata KEY[:TYPE]=VALUE`` and ``--metadata-json FILE``, read for the
destination's format: JSON values (text for a format that keeps text), GGUF types."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..errors import TensorBridgeError
from ._errors import UsageError


def metadata_args(args: argparse.Namespace, fmt: Any) -> dict[str, Any]:
    """``--metadata-json FILE``'s keys, then each ``--metadata KEY[:TYPE]=VALUE``, read
    for the destination's format (whether it keeps metadata at all is the destination's
    rule: ``Destination.check``).

    VALUE is read as JSON (``2``, ``1e-5``, ``true``, ``[1, 2]``, ``"2"``), else as
    text; a format that keeps text metadata (safetensors) keeps VALUE as given. TYPE
    names a GGUF value type (``uint64``, ``float64``, ``string``, ...).
    """
    out: dict[str, Any] = {}
    if args.metadata_json:
        try:
            with open(args.metadata_json, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            raise UsageError(f"--metadata-json {args.metadata_json}: {e}") from None
        if not isinstance(doc, dict):
            raise UsageError(
                f"--metadata-json {args.metadata_json} holds a {type(doc).__name__}; pass a "
                'JSON object ({"general.architecture": "llama", ...})'
            )
        out.update(doc if not fmt.text_metadata else {k: _text(v) for k, v in doc.items()})
    for item in args.metadata:
        key, sep, text = item.partition("=")
        key, colon, kind = key.partition(":")
        if not sep or not key:
            raise UsageError(f"--metadata {item}: pass KEY=VALUE (general.architecture=llama)")
        if fmt.text_metadata:
            if colon:
                raise UsageError(f"--metadata {item}: {fmt.description} keeps text; drop :{kind}")
            out[key] = text
            continue
        try:
            value: Any = json.loads(text)
        except ValueError:
            value = text
        if colon:
            if not fmt.typed_metadata:
                raise UsageError(f"--metadata {item}: :{kind} names a GGUF value type; drop it")
            try:
                value = fmt.metadata_value(value, kind)
            except TensorBridgeError as e:
                raise UsageError(f"--metadata {item}: {e}") from None
        out[key] = value
    return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)

"""The exceptions tensorbridge raises.

Every error says what was given, why it cannot be done, and the exact argument
that fixes it. Each class also inherits the built-in exception a caller would
expect (``TypeError`` for "this kind of value is not supported", ``ValueError``
for "this value breaks a rule you asked for"), so ``except TypeError`` keeps
working and tests can assert the precise class.

>>> import tensorbridge as tb
>>> issubclass(tb.CopyRequiredError, ValueError)
True
"""

from __future__ import annotations

__all__ = [
    "CopyRequiredError",
    "DestinationExistsError",
    "FormatError",
    "MissingExtraError",
    "NoDataError",
    "ShapeMismatchError",
    "TensorBridgeError",
    "UncommittedCheckpointError",
    "UnsupportedDtypeError",
    "UnsupportedTensorError",
]


class TensorBridgeError(Exception):
    """Base class of every error tensorbridge raises on purpose."""


class UnsupportedDtypeError(TensorBridgeError, TypeError):
    """A dtype with no lossless counterpart on the other side (or an unknown name)."""


class UnsupportedTensorError(TensorBridgeError, TypeError):
    """A tensor or array kind that cannot be converted as given (subclass, layout, mask)."""


class NoDataError(UnsupportedTensorError):
    """A meta or fake tensor: it describes a shape and dtype but holds no values."""


class CopyRequiredError(TensorBridgeError, ValueError):
    """``copy=False`` was passed, but the result cannot share memory with the input."""


class ShapeMismatchError(TensorBridgeError, ValueError):
    """An ``out=`` buffer whose shape differs from the source's."""


class FormatError(TensorBridgeError, ValueError):
    """A file that is malformed, truncated, or not of the format its name says."""


class DestinationExistsError(TensorBridgeError, FileExistsError):
    """A save would replace an existing file, and ``overwrite=True`` was not passed."""


class UncommittedCheckpointError(FormatError):
    """A checkpoint whose save never committed: interrupted, still running, or partial."""


class MissingExtraError(TensorBridgeError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""

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
    "DestinationError",
    "DestinationExistsError",
    "FormatError",
    "InvalidArgumentError",
    "InvalidNameError",
    "LinkError",
    "MissingExtraError",
    "NoDataError",
    "QuantizationError",
    "QuantizedTensorError",
    "ShapeMismatchError",
    "ShardedTensorError",
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


class QuantizedTensorError(UnsupportedTensorError):
    """A quantized tensor subclass (torchao's ``MXTensor``, ``NVFP4Tensor``, ...) given as is.

    Its storage holds codes and scales, not values: pass ``dtype=np.float32`` to
    dequantize it, or ``keep_quantized=True`` to a tree function for its parts.
    """


class ShardedTensorError(UnsupportedTensorError):
    """A DTensor asked for as a whole: its storage on this rank holds only a part of it.

    Pass ``tb.local_shard(x)`` for this rank's block, or ``gather=True`` for the whole
    tensor on every rank; ``Partial`` placements must be reduced first.
    """


class CopyRequiredError(TensorBridgeError, ValueError):
    """``copy=False`` was passed, but the result cannot share memory with the input."""


class InvalidArgumentError(TensorBridgeError, ValueError):
    """An argument whose value the function does not take (``framework=``, ``device=``, ...).

    Raised where a keyword names an option that does not exist (``framework='jax'``),
    a size or tolerance out of range (``max_shard_size='lots'``, ``rtol=-1``), or
    options that contradict each other; the message lists the values that work.
    """


class InvalidNameError(TensorBridgeError, ValueError):
    """A tensor name the destination format cannot store faithfully.

    A NUL, a lone surrogate, a path out of the container (``../x``, ``/abs``) where
    names become files or zip members, a name the format reserves, or two names that
    would become one (``A`` and ``a`` as files on a case-insensitive filesystem). The
    message names the tensor and the rule; nothing has been written.
    """


class ShapeMismatchError(TensorBridgeError, ValueError):
    """An ``out=`` buffer whose shape differs from the source's."""


class FormatError(TensorBridgeError, ValueError):
    """A file that is malformed, truncated, or not of the format its name says."""


class LinkError(FormatError):
    """A file a checkpoint names (a shard, a chunk, a config) is a link leading outside it.

    Links that stay inside the checkpoint's directory (or, in a Hugging Face cache, its
    repository) are followed; pass ``follow_links=True`` (command line:
    ``--follow-links``) to follow the others.
    """


class DestinationExistsError(TensorBridgeError, FileExistsError):
    """A save would replace an existing file, and ``overwrite=True`` was not passed."""


class DestinationError(TensorBridgeError, OSError):
    """A save's destination cannot be written: no space, a file size limit, no permission.

    Raised with the ``errno`` of the failed write (``ENOSPC``, ``EFBIG``, ``EACCES``,
    ``EISDIR``, ...); the previous file, or none, stays under the final name.
    """


class UncommittedCheckpointError(FormatError):
    """A checkpoint whose save never committed: interrupted, still running, or partial."""


class QuantizationError(TensorBridgeError, ValueError):
    """A quantized checkpoint or tensor whose scheme is unknown, ambiguous or inconsistent.

    Raised instead of guessing: a scale grid that does not tile its weight, a ``U8``
    tensor that could be e8m0 scales or packed codes, a missing global scale, a
    scheme named by neither a config nor the caller. The message names the tensors
    and the argument (``scheme=``, ``block_size=``) or file that settles it.
    """


class MissingExtraError(TensorBridgeError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""

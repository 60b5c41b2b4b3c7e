"""Storage plug-ins for ``torch.distributed.checkpoint`` (DCP): every rank writes its own bytes.

``dcp.save(state_dict, storage_writer=tb.SafetensorsWriter(dir))`` on N ranks writes
the final Hugging Face checkpoint directly: the coordinator fixes every file's layout
from DCP's global plan, each rank writes only the bytes of its own shards at their
final offsets, and the coordinator commits the result (``tensorbridge._commit``) once every rank
has reported success. ``tb.SafetensorsReader(dir)`` reads any committed checkpoint
back into any sharding with ``dcp.load``.

The modules here are imported on first use of their names (``tb.SafetensorsWriter``),
so ``import tensorbridge`` does not pull in ``torch.distributed``.
"""

# The file layer first: the writers here commit through ``tensorbridge._commit``,
# which writes with the file layer's atomic helpers.
from .. import io as _io  # noqa: F401

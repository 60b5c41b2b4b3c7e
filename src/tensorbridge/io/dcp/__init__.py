"""``torch.distributed.checkpoint`` directories, read without a process group or a free unpickle.

A DCP checkpoint (``dcp.save`` with the default ``FileSystemWriter``) is a directory:

* ``.metadata`` — a pickle of ``torch.distributed.checkpoint.metadata.Metadata``: for
  each state-dict key (nested containers flattened with ``.``) either a
  ``TensorStorageMetadata`` (dtype, global shape, and the chunks the ranks stored, each
  an ``offsets`` / ``sizes`` box of the global tensor) or a ``BytesStorageMetadata``
  (any other value); and ``storage_data``, which maps each chunk (key, offsets) to a
  ``_StorageInfo``: a ``.distcp`` file name, a byte offset and a length.
* ``__R_I.distcp`` — the items, back to back. A tensor chunk is one ``torch.save``
  archive (a zip whose ``data.pkl`` rebuilds the tensor from the stored member
  ``data/<key>``); a non-tensor value is one ``torch.save`` of the value.

**Nothing is unpickled freely.** ``.metadata`` goes through tensorbridge's pickle
machine (:mod:`tensorbridge.io.pickle_machine`) with exactly the classes DCP writes
(the metadata dataclasses of torch 2.0 to 2.13, ``pathlib`` paths) admitted as inert
records, ``torch.Size`` and dtypes from its table, and any other global refused with
a :class:`~tensorbridge.errors.FormatError` before anything is called; the records
are then read field by field into a :class:`CheckpointMetadata` of plain values
(names are plain ``str``). A chunk's ``data.pkl`` and a value stored as bytes go
through the same machine: a tensor only from the storage its item holds.

**Tensor bytes are mapped, never loaded whole.** torch stores the storage member
uncompressed; its place is found from the zip's central directory and local header,
every offset and size checked against the item and the file, and the chunk is a
read-only view of the memory-mapped ``.distcp``. An item laid out otherwise (a
compressed member, a stream transform, big-endian bytes, a pickle this module does
not recognise) is read by DCP's own public ``FileSystemReader.read_data``, which
loads that chunk whole.

**Entries.** ``keys()`` lists the tensors and the non-tensor values in the
checkpoint's order. A tensor stored in one chunk is a zero-copy view; one stored in
several is assembled into new memory by ``[name]`` (``tb.save`` and ``tensorbridge
convert`` instead assemble it window by window into the output: see
:mod:`tensorbridge.io.assemble`). Plain values (``step``, learning rates, tuples of
numbers) become ``metadata`` (strings; typed in :meth:`DcpFile.plain_values`) and are
not keys; any other value (an object of a class, a tensor pickled as bytes) is a key
that :meth:`~DcpFile.unsupported` names with the reason.

The package: :mod:`.metadata` (the ``.metadata`` pickle, checked into plain data),
:mod:`.items` (where a chunk's bytes lie in its ``torch.save`` zip) and :mod:`.reader`
(:class:`DcpFile`, :func:`open`, :func:`load`).

>>> import os, tempfile, torch, tensorbridge as tb
>>> import torch.distributed.checkpoint as dcp
>>> d = os.path.join(tempfile.mkdtemp(), "ckpt")
>>> sd = {"w": torch.ones(2, 3), "step": 7}
>>> _ = dcp.save(sd, checkpoint_id=d, no_dist=True)
>>> with tb.open(d) as f:
...     f.keys(), f["w"].shape, f.metadata
(['w'], (2, 3), {'step': '7'})
"""

from __future__ import annotations

from .items import MAX_VALUE as MAX_VALUE
from .metadata import MAX_METADATA as MAX_METADATA
from .metadata import METADATA_FILE, read_metadata
from .reader import Chunk, DcpFile, load, open

__all__ = ["METADATA_FILE", "Chunk", "DcpFile", "load", "open", "read_metadata"]

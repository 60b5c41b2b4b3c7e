"""Zarr v3 stores: a group directory holding one array per tensor, committed atomically.

Layout of ``OUT.zarr`` as :func:`save` and :class:`tensorbridge.ZarrWriter` write it::

    OUT.zarr/zarr.json         the group: {"zarr_format": 3, "node_type": "group",
                               "attributes": {...metadata, "tensorbridge": {...}}}
    OUT.zarr/<name>/zarr.json  one array per tensor, named by its dotted key
    OUT.zarr/<name>/c/0/1      its chunks: a regular grid, raw little-endian bytes

**Data types.** Every row of the dtype table that a Zarr data type is defined for: the
classic ones under zarr's own names (``bool``, ``int8`` ... ``uint64``, ``float16`` ...
``float64``, ``complex64``, ``complex128``), the ml_dtypes ones (bfloat16, float8,
float6, float4, int2/int4/uint2/uint4, complex32, bcomplex32) under the names of
:mod:`tensorbridge.zarr_dtypes` (zarr-extensions' and tensorstore's), so a plain NumPy
process with zarr, dask or tensorstore reads the bits back. ``int1``, ``uint1`` and
``float8_e5m3fnu``, which zarr-extensions names no type for, are refused naming
``.npy`` / ``.npz``; packed float4 (torch ``float4_e2m1fn_x2``) is refused rather than
unpacked behind the caller's back.

**Chunks** are uncompressed (the ``bytes`` codec alone, as safetensors stores bytes)
and at most ``max_chunk_bytes``; every chunk is written, even one that equals the fill
value (zarr would otherwise skip it, and its comparison folds NaN payloads and -0.0).

**Names** are Zarr node names and directories: :data:`NAMES` holds them to the v3
spec's rules (not empty, no ``/``, not only periods, no leading ``__``) and to what a
directory can hold faithfully: no NUL, no lone surrogate, no ``\\``, and no two names
that differ only in case (one directory on macOS and Windows).

**Metadata** goes to the group's attributes as JSON values (``tb.load`` gives them
back in ``metadata`` as strings and typed in ``plain_values()``); the key
``"tensorbridge"`` is reserved for the tensors' order.

**Commit.** The new store is built, group ``zarr.json`` included, in a hidden sibling
staging directory ``.tensorbridge-tmp-<id>.OUT.zarr``, then swapped with ``OUT.zarr``
in one atomic exchange (the protocol of :mod:`tensorbridge._commit`): a save that
dies leaves the previous store (or none) under ``OUT.zarr``, never a partial one.

**Writing regions.** Parallel writers (DCP ranks, conversion workers) share a store
through :func:`create_array`, :func:`open_region` and :func:`write_region`: the chunk
grid comes from :func:`chunk_grid`, aligned to every writer's block, so no two
writers ever touch one chunk (two unaligned writers of one chunk lose data: each
rewrites the whole chunk).

zarr is an optional dependency: ``pip install tensorbridge[zarr]``.

The package: :mod:`.store` (names, the chunk grid, arrays written region by region),
:mod:`.writer` (:func:`save`, :class:`StoreWriter`) and :mod:`.reader`
(:class:`ZarrFile`, :func:`open`, :func:`load`).

>>> import os, tempfile, numpy as np, tensorbridge as tb
>>> p = os.path.join(tempfile.mkdtemp(), "w.zarr")
>>> w = np.arange(6, dtype=np.int16).reshape(2, 3)
>>> tb.save({"w": w}, p, metadata={"step": 7})
>>> with tb.open(p) as f:
...     f.keys(), f["w"].tolist(), f.plain_values()
(['w'], [[0, 1, 2], [3, 4, 5]], {'step': 7})
"""

from __future__ import annotations

from .reader import MAX_FILL_BYTES, MAX_FILL_CHUNKS, ZarrFile, load, open
from .store import (
    GROUP_FILE,
    MAX_CHUNK_BYTES,
    NAMES,
    chunk_grid,
    create_array,
    open_region,
    require_zarr,
    storable,
    write_region,
)
from .store import MAX_NODE_JSON as MAX_NODE_JSON
from .store import RESERVED as RESERVED
from .store import check_names as check_names
from .store import store_kind as store_kind
from .writer import StoreWriter, group_document, save
from .writer import assembly as assembly
from .writer import attributes as attributes
from .writer import existing_arrays as existing_arrays

__all__ = [
    "GROUP_FILE",
    "MAX_CHUNK_BYTES",
    "MAX_FILL_BYTES",
    "MAX_FILL_CHUNKS",
    "NAMES",
    "StoreWriter",
    "ZarrFile",
    "chunk_grid",
    "create_array",
    "group_document",
    "load",
    "open",
    "open_region",
    "require_zarr",
    "save",
    "storable",
    "write_region",
]

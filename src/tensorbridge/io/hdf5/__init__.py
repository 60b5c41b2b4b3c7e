"""HDF5 files and Keras weights: datasets by path, mapped where stored plainly, written atomically.

**Reading** (:class:`HDF5File`). Every dataset reached through hard links is an entry
named by its HDF5 path without the leading slash (``group/sub/name``), in each group's
order (creation order where the group tracks it, as tensorbridge's files do; else by
name, as h5py iterates); soft and external links are not followed (a note names them),
virtual datasets and external storage are refused (their data lies in other files).
Attributes are metadata: the root group's under their own names, another object's as
``PATH@NAME``; ``f.metadata`` gives them as text, ``f.plain_values()`` typed.

* A contiguous dataset whose storage is allocated (no filters: HDF5 filters only chunked
  data) is a read-only view of the mapped file at ``H5Dget_offset``, checked to lie
  within the file; torch gets it copy-on-write. Chunked, compressed and compact
  datasets, and unwritten ones (their fill value), are read by h5py into new memory,
  with the file's own type as the memory type, so HDF5 converts nothing; a read may
  exceed the bytes the file stores for it (1032 times that for a filtered one: deflate's
  limit) by ``max_fill_bytes`` at most. Filters are HDF5's and h5py's own (a plugin's,
  a library HDF5 would load because the file names it, is refused).
* Types (:mod:`.datatypes`): integers, IEEE floats, h5py's bool and complex, and HDF5
  2.0's bfloat16 / float8 types by their bit layout, never widened; opaque bytes only
  with a ``dtype`` attribute naming their type, as Keras writes bfloat16
  (``keras/src/saving/saving_lib.py``, ``H5IOStore``), or with ``dtype=``.
* A file whose HDF5 signature follows a user block (at 512, 1024, ... bytes) is read
  as HDF5 finds it. A Keras ``.keras`` archive (a zip) is read as its
  ``model.weights.h5``: in place when stored (Keras stores it uncompressed), through
  ``zipfile`` when deflated. Keras' weights are datasets ``layers/<layer>/vars/<i>``.

**Writing** (:func:`save`). The format's spec, as tensorbridge writes it:

* each tensor is one contiguous dataset, allocated when created, never filled, its
  bytes starting at a multiple of 64 (HDF5's alignment property), little-endian;
* a name's ``/`` separates groups (``layers/dense/vars/0``), which track creation
  order, so the file lists the tensors in the order saved;
* a dtype NumPy holds is its HDF5 type (h5py's: integers, IEEE floats, bool as the
  enum ``FALSE = 0`` / ``TRUE = 1``, complex as the compound ``r``/``i``); a dtype
  NumPy lacks (an ml_dtypes type: bfloat16, the float8 types, complex32, ...) is
  opaque bytes of its size (h5py's ``|V2``) with the string attribute ``dtype``
  naming the ml_dtypes type (``"bfloat16"``, ``"float8_e4m3fn"``, ``"complex32"``):
  for bfloat16 exactly what Keras 3 writes, so ``keras.Model.load_weights`` reads it;
* metadata keys become attributes (``PATH@NAME`` on that dataset or group).

h5py (``pip install tensorbridge[hdf5]``) reads and writes the files; it is imported
when a file is first opened or saved.

**Hostile files.** The HDF5 library parses the file; what it cannot be trusted with is
checked first: a global heap collection it would loop on (:mod:`.source`), a
variable-length string attribute's stated length (:mod:`.headers`: HDF5 allocates it
before reading), attributes of variable-length sequences and references (h5py's
conversion of a damaged one crashes), filter plugins, links and data in other files.

The package: :mod:`.datatypes` (HDF5 types and the dtype table), :mod:`.source` (the
bytes h5py reads), :mod:`.headers` (attribute messages), :mod:`.reader` (:class:`HDF5File`,
:func:`open`, :func:`load`), :mod:`.writer` (:func:`save`).

>>> import os, tempfile, numpy as np, tensorbridge as tb
>>> p = os.path.join(tempfile.mkdtemp(), "w.h5")
>>> tb.save({"enc/w": np.ones((2, 3), np.float32)}, p, metadata={"step": 7})
>>> with tb.open(p) as f:
...     f.keys(), f["enc/w"].shape, f.plain_values()
(['enc/w'], (2, 3), {'step': 7})
"""

from __future__ import annotations

from .datatypes import MARKER, require_h5py
from .reader import DEFLATE_RATIO, MAX_FILL_BYTES, HDF5File, load, open
from .writer import ALIGNMENT, NAMES, save

__all__ = [
    "ALIGNMENT",
    "DEFLATE_RATIO",
    "MARKER",
    "MAX_FILL_BYTES",
    "NAMES",
    "HDF5File",
    "load",
    "open",
    "require_h5py",
    "save",
]

"""ONNX models: their initializers read memory-mapped, their weights replaced in place.

An ONNX model (``onnx/onnx.proto``) is one protobuf ``ModelProto``: a graph of nodes
whose weights are its *initializers*, ``TensorProto`` messages holding each tensor's
name, ``dims``, ``data_type`` and values: in ``raw_data`` (little-endian bytes), in a
typed field (``float_data``, ``int32_data`` ...) or, for models near or over
protobuf's 2 GiB limit, in *external data*: a file beside the model named by
``location``, at ``offset``, ``length`` bytes. What this package promises:

* **Every data type of onnx 1.23** (the table and its storage rules are in
  :mod:`.data_types`): the float and integer types, bool, complex64/128, bfloat16, the
  float8 types (FNUZ and E8M0 included) as the dtype table's rows; FLOAT4E2M1, INT4,
  UINT4, INT2, UINT2 (two or four values a byte) and FLOAT6E2M3 / FLOAT6E3M2 (four in
  three bytes) unpacked bit-exactly, one value a byte, as ml_dtypes arrays with their
  logical shape (an odd FLOAT4 length stays odd). STRING tensors are listed and refused
  when read (no dtype holds text); so are types newer than onnx 1.23 and segments.
  Values agree bit for bit with ``onnx.numpy_helper.to_array``, whatever the storage.
* **Zero-copy where the bytes are the values.** ``raw_data`` and external data of the
  unpacked types are read-only views of the mapped model or data file (torch:
  copy-on-write); typed fields and packed types are decoded into new memory.
* **Bounded.** The model is walked by :mod:`.wire`, tensorbridge's own protobuf reader,
  through the map, never loaded: opening costs the header (names and spans, a few
  dozen bytes an initializer), not the weights, and needs no ``onnx`` package. Every
  size is checked against the bytes present when the model is opened: ``raw_data``
  and typed entries against ``dims``, external ``offset`` / ``length`` against the
  data file. A model file over protobuf's 2 GiB limit is refused as such.
* **External data stays beside the model.** A ``location`` that is absolute or climbs
  out with ``..`` is a :class:`~tensorbridge.errors.FormatError`; one that is a link
  out of the model's directory a :class:`~tensorbridge.errors.LinkError` unless
  ``follow_links=True``. Only regular files are read.
* **The graph's initializers by name**; ``open(path, constants=True)`` adds each
  ``Constant`` node's value (``value``, ``value_float(s)``, ``value_int(s)``) under
  its output's name, ``sparse=True`` each sparse initializer as its dense array (a
  note says when a model holds either and they were not read). Subgraphs' and
  functions' tensors are not read. ``f.metadata`` is the model's ``metadata_props``;
  ``f.ir_version``, ``f.opsets`` and ``f.producer`` describe it, ``f.data_type(name)``
  names a tensor's ONNX type and ``f.raw(name)`` gives its stored bytes.

**Writing** (needs ``pip install tensorbridge[onnx]``): :func:`save` with ``into=`` a
model replaces the initializers its tensors name (``name_map`` for renamed ones),
each checked to keep the initializer's type and shape (``float_dtype`` casts floats
first); without it, it writes a model of initializers alone. Tensors of 1024 bytes or
more (``onnx.save_model``'s threshold) go to ``NAME.onnx.data`` (the name
``torch.onnx.export`` gives it) at aligned offsets (:func:`layout`), the rest inline;
the model and its data are committed together, atomically. :func:`replace_weights` is
the deployment loop in one call: fine-tune in torch, put the weights into the exported
model. ``tensorbridge convert weights.safetensors out.onnx --into model.onnx`` does
the same from the command line.

The package: :mod:`.wire` (the protobuf reader), :mod:`.data_types` (ONNX's types,
packing, typed fields), :mod:`.reader` (:class:`OnnxFile`, :func:`open`, :func:`load`),
:mod:`.writer` (:func:`save`, :func:`replace_weights`).

>>> import os, tempfile, ml_dtypes, numpy as np
>>> p = os.path.join(tempfile.mkdtemp(), "q.onnx")
>>> q = np.array([-8, 7, 1], ml_dtypes.int4)
>>> save({"q": q, "s": np.float32([0.5])}, p)
>>> with open(p) as f:
...     f.data_type("q"), f["q"].tolist(), f.raw("q").tolist()
('INT4', [-8, 7, 1], [120, 1])
"""

from __future__ import annotations

from .reader import MAX_MODEL_BYTES, OnnxFile, load, open
from .wire import sniff
from .writer import layout, replace_weights, require_onnx, save

__all__ = [
    "MAX_MODEL_BYTES",
    "OnnxFile",
    "layout",
    "load",
    "open",
    "replace_weights",
    "require_onnx",
    "save",
    "sniff",
]

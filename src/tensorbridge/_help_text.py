"""Help text the command line prints without importing the format table (which imports torch).

Generated from the format table by ``tensorbridge.cli.destinations_from_table()``;
``tests/test_cli.py`` checks that it is current (regenerate with
``PYTHONPATH=src python -c "import tensorbridge.cli as c; c.write_help_text()"``).
"""

DESTINATIONS = (
    "destinations (by DST's suffix) and what each keeps:\n"
    "  .safetensors                 tensors by dotted name; metadata as text; "
    "shards\n"
    "                               with an index\n"
    "  .npy                         one array, of any dtype of the table; no "
    "metadata\n"
    "  .npz                         arrays by dotted name, of any dtype of the "
    "table\n"
    "                               (int4, float6, ...); no metadata; from a "
    "NumPy\n"
    "                               source, members torch cannot hold (float128,\n"
    "                               strings) copied unchanged\n"
    "  .pt, .pth, .bin              a .pt source's nesting and plain values, as\n"
    "                               torch.load gives them; from other sources,\n"
    "                               tensors by dotted name with the metadata "
    "beside\n"
    "                               them\n"
    "  .gguf                        tensors by name; typed metadata\n"
    "                               (general.architecture required)\n"
    "  .zarr                        one array per tensor; metadata as attributes\n"
    "  .h5, .hdf5                   tensors by name ('/' makes groups); metadata "
    "as\n"
    "                               attributes\n"
    "  .onnx                        initializers by name (--into MODEL: its "
    "weights\n"
    "                               replaced); metadata as text; weights as "
    "external\n"
    "                               data in DST.data\n"
    "  DIR/                         model.safetensors inside (a DCP source: "
    "shards +\n"
    "                               index)\n"
    "  NAME.safetensors.index.json  shards of --max-shard-size and their index\n"
    "  DIR/ --format npy            a DCP source: one NAME.npy per tensor; no\n"
    "                               metadata"
)

SAVE_OPTIONS = (
    ("into", "MODEL", "an ONNX model whose initializers the tensors replace, by name", ".onnx"),
    ("name_map", "JSON", 'a JSON file {"tensor": "initializer"} for renamed weights', ".onnx"),
)

"""``tensorbridge convert``: a checkpoint from one format to another, streamed, atomically.

The destination's suffix names the format (the table of ``convert --help``). Options
select tensors (``--include`` / ``--exclude``), cast them (``--float-dtype``), shard the
output, add metadata, dequantize a quantized checkpoint (``tb.open(...,
dequantize=...)``) or quantize a plain one (:func:`tensorbridge.quantize_checkpoint`),
and check the result bit for bit (``--verify``: :func:`tensorbridge.verify`). A DCP
checkpoint is converted window by window (:mod:`._dcp`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import InvalidArgumentError, TensorBridgeError
from ._dequantize import write_dequantized
from ._errors import UsageError, as_options
from ._files import convertible, is_gguf, open_file, select
from ._metadata import metadata_args
from ._options import block_size as block_size_arg
from ._options import command, dtype_arg, progress, reading
from ._output import conversion_report
from ._quantize import quantize_arg, write_quantized

if TYPE_CHECKING:
    from .._tensorfile import TensorFile
    from ..io import Format

# the library's arguments -> the options of convert that give them (what Destination.check
# and tb.quantize_checkpoint's refusals name: scheme= is what --quantize gives)
OPTIONS = {"max_shard_size": "--max-shard-size", "metadata": "--metadata", "scheme": "--quantize"}

EXAMPLES = (
    "examples:\n  tensorbridge convert pytorch_model.bin model.safetensors\n"
    "  tensorbridge convert model.safetensors out/ --float-dtype bf16 \\\n"
    "      --max-shard-size 5GB --verify\n"
    "  tensorbridge convert model.safetensors emb.npy --include 'embed*'\n"
    "  tensorbridge convert model-Q4_K_M.gguf out.safetensors --dequantize bf16\n"
    "  tensorbridge convert deepseek-fp8/ out/model.safetensors --dequantize bf16\n"
    "  tensorbridge convert dcp_checkpoint/ hf_model/ --max-shard-size 5GB --workers 4\n"
    "  tensorbridge convert finetuned.safetensors out.onnx --into model.onnx"
)


def add_parser(subparsers: Any) -> None:
    """``convert``'s options, each with its help text: long because convert has many
    options, and a list reads best in one place."""
    p = command(
        subparsers,
        "convert",
        "convert a checkpoint between formats, streamed, atomically",
        EXAMPLES,
        destinations=True,
    )
    p.add_argument(
        "src", metavar="SRC", help="the checkpoint to read: a file, shard index or directory"
    )
    p.add_argument(
        "dst",
        metavar="DST",
        help="the file to write; its suffix names the format (see destinations below); "
        "missing parent directories are created",
    )
    p.add_argument(
        "--float-dtype",
        metavar="DTYPE",
        help="cast floating-point tensors (bf16, f16, f32, float8_e4m3fn, ...)",
    )
    p.add_argument("--max-shard-size", metavar="SIZE", help="shard .safetensors output (5GB)")
    p.add_argument(
        "--dequantize",
        metavar="DTYPE",
        help="write quantized weights (GGUF blocks, codes + scales) as DTYPE (bf16, f16, f32)",
    )
    p.add_argument(
        "--scheme",
        metavar="NAME",
        help="the quantization scheme, when no config says it (fp8-block, mxfp4, ...)",
    )
    p.add_argument(
        "--quantize",
        metavar="SCHEME",
        help="write 2-D+ weights quantized (mxfp8, mxfp4, nvfp4-modelopt, "
        "nvfp4-compressed-tensors, fp8-block) in the scheme's published layout",
    )
    p.add_argument(
        "--layout",
        metavar="NAME",
        help="with --quantize mxfp4: gpt-oss writes openai/gpt-oss's experts "
        "NAME_blocks / NAME_scales (default: compressed-tensors)",
    )
    p.add_argument(
        "--element",
        metavar="TYPE",
        help="with --quantize mxfp8: the fp8 element type, e4m3 (default) or e5m2",
    )
    p.add_argument(
        "--metadata",
        action="append",
        default=[],
        metavar="KEY[:TYPE]=VALUE",
        help="add a metadata key (GGUF: general.architecture=llama is required); VALUE is "
        'JSON (2, 1e-5, true, [1, 2], "text") or else text; TYPE forces a GGUF type '
        "(uint64, float64, ...); repeatable",
    )
    p.add_argument(
        "--metadata-json",
        metavar="FILE",
        help="add the metadata keys of a JSON object in FILE (typed as --metadata's VALUE)",
    )
    p.add_argument(
        "--no-metadata",
        action="store_true",
        help="leave SRC's metadata out (a .pt source: its plain values, such as epoch)",
    )
    p.add_argument(
        "--block-size",
        metavar="R,C",
        help="fp8 block-wise block: to read when no config.json gives it, or to write "
        "(default 128,128)",
    )
    p.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="PATTERN",
        help="with --quantize: keep weights matching PATTERN unquantized (glob; repeatable)",
    )
    p.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="PATTERN",
        help="keep only tensors whose name matches (glob; repeatable)",
    )
    p.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PATTERN",
        help="drop tensors whose name matches (glob; repeatable)",
    )
    p.add_argument(
        "--skip-unsupported",
        action="store_true",
        help="leave out entries that are not tensors (strings, objects), naming each on stderr",
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace DST if it exists (even when it is SRC)"
    )
    p.add_argument(
        "--verify", action="store_true", help="re-read the output and check it against the source"
    )
    p.add_argument("--json", action="store_true", help="print a JSON summary")
    p.add_argument(
        "--format",
        choices=("safetensors", "npy"),
        help="DCP source: npy writes DST as a directory of NAME.npy files",
    )
    p.add_argument(
        "--workers",
        type=int,
        metavar="N",
        help="DCP source: write tensors in N local processes (byte-identical output)",
    )
    p.add_argument(
        "--dask-scheduler",
        metavar="ADDRESS",
        help="DCP source: run the tensor tasks on a dask.distributed cluster (shared disk)",
    )
    from .._help_text import SAVE_OPTIONS  # the formats' own options, without the table

    for option, metavar, text, suffixes in SAVE_OPTIONS:
        p.add_argument(
            "--" + option.replace("_", "-"),
            dest=f"save_{option}",
            metavar=metavar,
            help=f"{text} ({suffixes} destinations)",
        )
    reading(p, dequantize=False)


def save_options(args: argparse.Namespace, fmt: Any, dst: str) -> dict[str, Any]:
    """The format's own save options given (``--into``), each checked to be ``fmt``'s."""
    from .._help_text import SAVE_OPTIONS

    given = {o[0]: getattr(args, f"save_{o[0]}", None) for o in SAVE_OPTIONS}
    given = {k: v for k, v in given.items() if v is not None}
    for option in given:
        if fmt is None or option not in fmt.save_options:
            takes = next(o[3] for o in SAVE_OPTIONS if o[0] == option)
            raise UsageError(
                f"--{option.replace('_', '-')} applies to {takes} destinations, not {dst}"
            )
    return given


class _Lazy(Mapping[str, Any]):
    """Names of an open file, values read (mapped) only when asked: keeps convert streaming.

    A value is what a copy to ``fmt`` takes (``io.copied_value``): a bfloat16 or float8
    tensor goes to the NumPy formats and safetensors as its stored bytes, without ml_dtypes.
    """

    def __init__(
        self, f: TensorFile, names: list[str], carried: Mapping[str, Any], fmt: Format
    ) -> None:
        self._f, self._names, self._carried, self._fmt = f, names, carried, fmt

    def __getitem__(self, name: str) -> Any:
        from .. import io as tbio

        if name in self._carried:
            return self._carried[name]
        return tbio.copied_value(self._f, name, self._fmt)

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def run(args: argparse.Namespace) -> int:
    float_dtype, dequantize, block_size, quantize = _checked(args)
    from ._dcp import convert_chunked, entry_files, is_chunked

    # what the save creates is said in the summary, not done silently
    entries = entry_files(args)
    args.created = _missing_directory(args.dst, entries is not None or is_chunked(args.src))
    if entries is not None or is_chunked(args.src):
        save_options(args, None, args.dst)  # none applies
        if args.metadata or args.metadata_json:
            raise UsageError(
                "--metadata applies to a checkpoint converted to safetensors, GGUF, .pt or "
                "Zarr, not to a DCP checkpoint's conversion"
            )
        if quantize is not None:
            raise UsageError(
                "--quantize reads a safetensors (or .bin, .pt, .npz) checkpoint; convert the DCP "
                "checkpoint to safetensors first"
            )
        if dequantize is not None:
            raise UsageError(
                "--dequantize reads quantized checkpoints; a DCP checkpoint is converted as "
                "stored (pass --float-dtype to cast it)"
            )
        return convert_chunked(args, float_dtype)
    dst, given_meta = _destination(args, quantize)
    start = time.perf_counter()
    opened, schemes = _source(args, dequantize, block_size)
    with opened as src:
        names, carried, unsupported = _names(args, src, dst)
        meta, dropped = _metadata(args, src, dst, names, given_meta)
        if quantize is not None:
            return write_quantized(args, src, names, meta, quantize, block_size, start, sys.stdout)
        if schemes:
            report = (unsupported, dropped, start)
            return write_dequantized(args, src, names, meta, dequantize, report, sys.stdout)
        _write(args, src, dst, names, carried, meta, given_meta, float_dtype)
        took = time.perf_counter() - start
        written = str(dst.written())
        summary: dict[str, Any] = {
            "src": args.src,
            "dst": written,
            "tensors": len(names),
            "bytes_in": sum(
                c.size if (c := carried.get(n)) else src.nbytes(n)
                for n in names
                if n not in src.aliases
            ),
            "bytes_out": sum(p.stat().st_size for p in dst.existing()),
            "seconds": round(took, 3),
            "skipped": sorted(unsupported),
            "dropped_metadata": dropped,
        }
        ok = True
        if args.verify:
            from ..io.verify import verify

            check = verify(
                src, written, names=names, float_dtype=float_dtype, progress=progress(args)
            )
            summary["verified"] = check.ok
            summary["problems"] = list(check.problems)
            ok = check.ok
    return conversion_report(summary, args, sys.stdout, ok, float_dtype)


def _checked(args: argparse.Namespace) -> tuple[Any, Any, tuple[int, int] | None, str | None]:
    """The options' values (float dtype, dequantize dtype, block size, quantize scheme),
    checked against each other before anything is read."""
    float_dtype = dtype_arg(args.float_dtype, "--float-dtype", floating=True)
    dequantize = dtype_arg(args.dequantize, "--dequantize", floating=True)
    block_size = block_size_arg(args)
    quantize = quantize_arg(args, dequantize, float_dtype, block_size)
    if (args.scheme or args.block_size) is not None and dequantize is None and not quantize:
        raise UsageError(
            "--scheme / --block-size say how to dequantize; pass --dequantize bf16 with them"
        )
    if dequantize is not None and float_dtype is not None:
        raise UsageError("--dequantize already sets the weights' dtype; leave out --float-dtype")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers {args.workers}: pass a number of processes >= 1")
    if args.workers is not None and args.dask_scheduler is not None:
        raise UsageError("pass --workers or --dask-scheduler, not both")
    return float_dtype, dequantize, block_size, quantize


def _destination(args: argparse.Namespace, quantize: str | None) -> tuple[Any, dict[str, Any]]:
    """DST as ``tb.save`` reads it, checked by its rules (``Destination.check``, said with
    convert's options) before anything is read, and the metadata given."""
    from .. import io as tbio
    from ..io.safetensors import parse_size

    try:
        dst = tbio.destination(args.dst)
        if args.max_shard_size is not None:
            parse_size(args.max_shard_size)
    except (TensorBridgeError, ValueError) as e:
        raise UsageError(str(e)) from None
    given_meta = metadata_args(args, dst.format)
    args.save_options = save_options(args, dst.format, args.dst)
    try:  # before reading anything; an existing DST is no usage error (exit status 1)
        dst.check(
            overwrite=args.overwrite,
            max_shard_size=args.max_shard_size,
            metadata=given_meta,
            scheme=quantize,
        )
    except InvalidArgumentError as e:
        raise UsageError(as_options(str(e), OPTIONS)) from None
    if args.workers is not None or args.dask_scheduler is not None or args.format:
        raise UsageError(
            "--workers, --dask-scheduler and --format apply to a DCP checkpoint source; "
            f"{args.src} is not one"
        )
    return dst, given_meta


def _source(
    args: argparse.Namespace, dequantize: Any, block_size: tuple[int, int] | None
) -> tuple[TensorFile, bool]:
    """SRC opened, dequantizing (``tb.open(..., dequantize=..., scheme=..., block_size=...)``)
    with --dequantize; and whether a quantization scheme (not GGUF's blocks) is dequantized."""
    schemes = dequantize is not None and not is_gguf(args.src)  # GGUF dequantizes as it reads
    return open_file(args.src, args, schemes=schemes, block_size=block_size), schemes


def _names(
    args: argparse.Namespace, src: TensorFile, dst: Any
) -> tuple[list[str], dict[str, Any], dict[str, str]]:
    """The names written (--include / --exclude), the members copied as their .npy bytes,
    and the entries skipped (--skip-unsupported)."""
    from .. import io as tbio
    from ..io import listing

    names = select(src.keys(), args.include, args.exclude)
    if not src.keys():
        raise TensorBridgeError(f"{args.src} holds no arrays or tensors; nothing to convert")
    if not names:
        raise UsageError(
            f"no tensor of {args.src} matches --include/--exclude; "
            f"'tensorbridge inspect {args.src}' lists the names"
        )
    try:  # NumPy to NumPy: members torch cannot hold are copied as they are
        carried = tbio.carried_members(src, dst.format, names, skip_refused=args.skip_unsupported)
    except TensorBridgeError as e:  # an object array
        raise TensorBridgeError(
            f"{e}; pass --exclude NAME or --skip-unsupported to convert the rest"
        ) from None
    selected = names
    names, unsupported = convertible(
        src, [n for n in names if n not in carried], args, len(carried)
    )
    names = [n for n in selected if n in carried or n in names]
    if carried and not args.quiet:
        kinds = ", ".join(f"{n} ({c.stored})" for n, c in list(carried.items())[:5])
        print(
            f"note: copied {kinds}{' ...' if len(carried) > 5 else ''} unchanged: no "
            "torch dtype holds them, so their .npy bytes are carried as they are",
            file=sys.stderr,
        )
    if not dst.format.many_arrays and len(names) != 1:
        raise UsageError(
            f"a {dst.path.suffix} file holds one array but {len(names)} tensors were "
            f"selected; pick one with --include NAME or write "
            f"{listing(lambda f: f.many_arrays)}"
        )
    return names, carried, unsupported


def _metadata(
    args: argparse.Namespace,
    src: TensorFile,
    dst: Any,
    names: list[str],
    given_meta: dict[str, Any],
) -> tuple[dict[str, Any], list[str]]:
    """The metadata written (SRC's, unless --no-metadata, and the keys given), and SRC's
    keys the destination has no place for (a note names them)."""
    from .. import io as tbio

    meta, dropped = (
        ({}, [])
        if args.no_metadata
        else tbio.carried_metadata(src, dst.format, names, fix="pass --no-metadata")
    )
    meta.update(given_meta)
    clash = [k for k in given_meta if k in names]
    if clash and dst.format.metadata_with_tensors:
        raise UsageError(
            f"--metadata {clash[0]}: a {dst.path.suffix} file keeps metadata beside the "
            "tensors under one set of names, and a tensor has that name; pick another key"
        )
    if dropped and not args.quiet:
        print(
            f"note: dropped metadata {', '.join(dropped)}: {dst.path.suffix} files have no "
            f"place for it (convert to {tbio.metadata_homes(dropped, names)} to keep it; "
            "--no-metadata leaves it out without this note)",
            file=sys.stderr,
        )
    return meta, dropped


def _write(
    args: argparse.Namespace,
    src: TensorFile,
    dst: Any,
    names: list[str],
    carried: dict[str, Any],
    meta: dict[str, Any],
    given_meta: dict[str, Any],
    float_dtype: Any,
) -> None:
    """``tb.save`` of the selected tensors: streamed from SRC, mapped (or, from a GGUF
    file read with --dequantize, computed) as written."""
    from .. import io as tbio
    from ..io import listing

    if not dst.format.many_arrays:
        tbio.save(
            carried.get(names[0]) or tbio.copied_value(src, names[0], dst.format),
            dst.path,
            float_dtype=float_dtype,
            progress=progress(args),
            overwrite=True,
        )
        return
    values: Any = _Lazy(src, names, carried, dst.format)
    try:
        tree = (
            tbio.nested_values(src, names, plain=not args.no_metadata)
            if dst.format.nested
            else None
        )
    except InvalidArgumentError as e:  # a list's items selected in part
        raise UsageError(
            f"{e} (--include / --exclude), or convert to "
            f"{listing(lambda f: f.many_arrays and not f.nested)}, which keep flat names"
        ) from None
    if tree is not None:  # the source's nesting, its plain values in their places
        values, meta = tree, given_meta
    tbio.save(
        values,
        args.dst,
        float_dtype=float_dtype,
        metadata=meta or None,
        max_shard_size=args.max_shard_size,
        progress=progress(args),
        overwrite=True,
        options=args.save_options,
    )


def _missing_directory(dst: str, chunked: bool) -> str | None:
    """The directory a save to ``dst`` will create (with its missing parents), or None."""
    from pathlib import Path

    path = Path(dst)
    directory = dst.endswith(("/", os.sep)) or (chunked and not path.suffix) or path.is_dir()
    wanted = path if directory else path.parent
    return None if wanted.exists() or wanted.is_symlink() else str(wanted)

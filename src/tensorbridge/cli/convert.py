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
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, TextIO

from ..errors import InvalidArgumentError, TensorBridgeError
from ._errors import UsageError, cli_words, note
from ._files import is_gguf, open_file, select
from ._options import block_size as block_size_arg
from ._options import command, dtype_arg, progress, reading
from ._output import colour, dump, plural, size

if TYPE_CHECKING:
    from ..io._common import TensorFile

EXAMPLES = (
    "examples:\n  tensorbridge convert pytorch_model.bin model.safetensors\n"
    "  tensorbridge convert model.safetensors out/ --float-dtype bf16 \\\n"
    "      --max-shard-size 5GB --verify\n"
    "  tensorbridge convert model.safetensors emb.npy --include 'embed*'\n"
    "  tensorbridge convert model-Q4_K_M.gguf out.safetensors --dequantize bf16\n"
    "  tensorbridge convert deepseek-fp8/ out/model.safetensors --dequantize bf16\n"
    "  tensorbridge convert dcp_checkpoint/ hf_model/ --max-shard-size 5GB --workers 4"
)


def add_parser(subparsers: Any) -> None:
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
    reading(p, dequantize=False)


class _Lazy(Mapping[str, Any]):
    """Names of an open file, values read (mapped) only when asked: keeps convert streaming."""

    def __init__(self, f: TensorFile, names: list[str], carried: Mapping[str, Any]) -> None:
        self._f, self._names, self._carried = f, names, carried

    def __getitem__(self, name: str) -> Any:
        return self._carried[name] if name in self._carried else self._f[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


def convertible(
    src: TensorFile, names: list[str], args: argparse.Namespace, carried: int = 0
) -> tuple[list[str], dict[str, str]]:
    """The selected names convert can write, and the entries it skips (with --skip-unsupported);
    ``carried``: how many more entries are copied as they are (NumPy to NumPy)."""
    unsupported = {n: why for n, why in src.unsupported().items() if n in names}
    if unsupported and not args.skip_unsupported:
        first = next(iter(unsupported))
        raise TensorBridgeError(
            f"{cli_words(unsupported[first])}; {plural(len(unsupported), 'entry')} cannot be "
            f"converted: pass --exclude {first}{' (each)' if len(unsupported) > 1 else ''} "
            "or --skip-unsupported"
        )
    for name, why in unsupported.items():
        print(f"skipped {name}: {cli_words(why)}", file=sys.stderr)
    kept = [n for n in names if n not in unsupported]
    if not kept and not carried:  # one rule for every convert path: nothing to write is an error
        raise TensorBridgeError(
            f"every selected entry of {args.src} is unsupported ({plural(len(names), 'entry')} "
            "skipped); nothing to convert, so nothing was written"
        )
    return kept, unsupported


def _metadata_args(args: argparse.Namespace, fmt: Any) -> dict[str, Any]:
    """``--metadata-json FILE``'s keys, then each ``--metadata KEY[:TYPE]=VALUE``.

    VALUE is read as JSON (``2``, ``1e-5``, ``true``, ``[1, 2]``, ``"2"``), else as
    text; a format that keeps text metadata (safetensors) keeps VALUE as given. TYPE
    names a GGUF value type (``uint64``, ``float64``, ``string``, ...).
    """
    if not args.metadata and not args.metadata_json:
        return {}
    if not fmt.metadata:
        from ..io._formats import listing

        raise UsageError(
            f"--metadata: {fmt.description} keeps no metadata; write "
            f"{listing(lambda f: f.metadata, ' or ')}"
        )
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
            if fmt.name != "gguf":
                raise UsageError(f"--metadata {item}: :{kind} names a GGUF value type; drop it")
            from ..io.gguf import metadata_value

            try:
                value = metadata_value(value, kind)
            except TensorBridgeError as e:
                raise UsageError(f"--metadata {item}: {e}") from None
        out[key] = value
    return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def run(args: argparse.Namespace) -> int:
    from .. import io as tbio
    from ..io._formats import listing  # what each format can hold, for the messages
    from ..io.safetensors import parse_size
    from ..io.verify import verify

    out = sys.stdout
    float_dtype = dtype_arg(args.float_dtype, "--float-dtype", floating=True)
    dequantize = dtype_arg(args.dequantize, "--dequantize", floating=True)
    block_size = block_size_arg(args)
    quantize = _quantize_arg(args, dequantize, float_dtype, block_size)
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
    from ._dcp import convert_chunked, is_chunked

    # what the save creates is said in the summary, not done silently
    args.created = _missing_directory(args.dst, args.format == "npy" or is_chunked(args.src))
    if args.format == "npy" or is_chunked(args.src):
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
    try:
        dst = tbio.destination(args.dst)
        if args.max_shard_size is not None:
            parse_size(args.max_shard_size)
    except (TensorBridgeError, ValueError) as e:
        raise UsageError(str(e)) from None
    if args.max_shard_size is not None and not dst.format.sharding:
        raise UsageError(
            f"--max-shard-size needs a {listing(lambda f: f.sharding, ' or ')} destination "
            f"(or a directory), not {args.dst}"
        )
    given_meta = _metadata_args(args, dst.format)
    if quantize is not None and dst.format.name != "safetensors":
        raise UsageError(
            f"--quantize writes the schemes' published safetensors layouts, not {args.dst}; "
            "write a .safetensors file or a directory"
        )
    dst.check_overwrite(args.overwrite)  # before reading anything
    if args.workers is not None or args.dask_scheduler is not None or args.format:
        raise UsageError(
            "--workers, --dask-scheduler and --format apply to a DCP checkpoint source; "
            f"{args.src} is not one"
        )
    start = time.perf_counter()
    opened = open_file(args.src, args)
    schemes = dequantize is not None and not is_gguf(args.src)  # GGUF dequantizes as it reads
    if schemes:
        from ..quant.api import DequantizedFile

        try:
            opened = DequantizedFile(
                opened,
                dequantize,
                scheme=args.scheme,
                block_size=block_size,
            )
        except BaseException:
            opened.close()
            raise
        if not args.quiet and opened.plan.quantized:
            note(opened.notes[-1])
    with opened as src:
        names = select(src.keys(), args.include, args.exclude)
        if not src.keys():
            raise TensorBridgeError(f"{args.src} holds no arrays or tensors; nothing to convert")
        if not names:
            raise UsageError(
                f"no tensor of {args.src} matches --include/--exclude; "
                f"'tensorbridge inspect {args.src}' lists the names"
            )
        try:  # NumPy to NumPy: members torch cannot hold are copied as they are
            carried = tbio.carried_members(
                src, dst.format, names, skip_refused=args.skip_unsupported
            )
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
        if dst.format.name == "gguf":
            from ..io.gguf import check_architecture

            check_architecture(
                meta,
                dst.path,
                fix="pass --metadata general.architecture=NAME (e.g. llama), or "
                "--metadata-json FILE",
            )
        if dropped and not args.quiet:
            print(
                f"note: dropped metadata {', '.join(dropped)}: {dst.path.suffix} files have no "
                f"place for it (convert to {tbio.metadata_homes(dropped, names)} to keep it; "
                "--no-metadata leaves it out without this note)",
                file=sys.stderr,
            )
        if quantize is not None:
            return _quantized(args, src, names, meta, quantize, block_size, start, out)
        if not dst.format.many_arrays:
            tbio.save(
                carried.get(names[0]) or src[names[0]],
                dst.path,
                float_dtype=float_dtype,
                progress=progress(args),
                overwrite=True,
            )
        else:
            values: Any = _Lazy(src, names, carried)
            if schemes and dst.format.name == "safetensors":
                values = {n: src.stream_value(n) for n in names}
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
            )
        if schemes:
            from ..quant.checkpoint import copy_config

            source = getattr(src, "path", None)
            if source is not None:
                copy_config(source, dst.path, overwrite=args.overwrite)
        took = time.perf_counter() - start
        in_bytes = sum(
            c.size if (c := carried.get(n)) else src.nbytes(n)
            for n in names
            if n not in src.aliases
        )
        out_bytes = sum(p.stat().st_size for p in dst.existing())
        written = str(dst.written())
        summary: dict[str, Any] = {
            "src": args.src,
            **(
                {"dequantized": src.plan.summary(), "dropped": list(src.plan.dropped)}  # type: ignore[attr-defined]
                if schemes
                else {}
            ),
            "dst": written,
            "tensors": len(names),
            "bytes_in": in_bytes,
            "bytes_out": out_bytes,
            "seconds": round(took, 3),
            "skipped": sorted(unsupported),
            "dropped_metadata": dropped,
        }
        ok = True
        if args.verify:
            check = verify(
                src, written, names=names, float_dtype=float_dtype, progress=progress(args)
            )
            summary["verified"] = check.ok
            summary["problems"] = list(check.problems)
            ok = check.ok
    return report(summary, args, out, ok, float_dtype)


def _quantize_arg(
    args: argparse.Namespace, dequantize: Any, float_dtype: Any, block_size: Any
) -> str | None:
    """``--quantize``'s scheme, checked against the options it cannot go with."""
    from ..errors import QuantizationError
    from ..quant.write import writable

    if args.quantize is None:
        if args.ignore:
            raise UsageError("--ignore says which weights --quantize leaves; pass --quantize")
        for given, flag in ((args.layout, "--layout"), (args.element, "--element")):
            if given:
                raise UsageError(f"{flag} says how --quantize writes weights; pass --quantize")
        return None
    if dequantize is not None:
        raise UsageError("pass --quantize or --dequantize, not both")
    if float_dtype is not None:
        raise UsageError(
            "--quantize sets the weights' dtypes; cast the other tensors in a second convert "
            "with --float-dtype"
        )
    if args.scheme is not None:
        raise UsageError("--quantize names the scheme; leave out --scheme")
    try:
        scheme = writable(args.quantize, args.layout, args.element)
    except QuantizationError as e:
        raise UsageError(str(e)) from None
    if block_size is not None and scheme != "fp8-block":
        raise UsageError(f"--block-size is fp8-block's; {scheme} has fixed blocks")
    return scheme


def _quantized(
    args: argparse.Namespace,
    src: TensorFile,
    names: list[str],
    meta: dict[str, Any],
    scheme: str,
    block_size: tuple[int, int] | None,
    start: float,
    out: TextIO,
) -> int:
    """convert --quantize: :func:`tensorbridge.quantize_checkpoint`, and its notes."""
    from ..quant.checkpoint import quantize_checkpoint

    done = quantize_checkpoint(
        src,
        args.dst,
        scheme,
        layout=args.layout,
        element=args.element,
        block_size=block_size,
        ignore=args.ignore,
        names=names,
        metadata=meta or False,
        max_shard_size=args.max_shard_size,
        overwrite=args.overwrite,
        progress=progress(args),
        verify=args.verify,
    )
    if not args.quiet:
        for n, why in done.left_unquantized.items():
            print(f"note: left {n} unquantized: {why}", file=sys.stderr)
    if done.config_kept is not None:
        print(
            f"note: kept the existing {done.config_kept} (pass --overwrite to replace it)",
            file=sys.stderr,
        )
    if done.config is not None and done.caveat and not args.quiet:
        print(f"note: {done.caveat}", file=sys.stderr)
    if done.config is None and not args.quiet:
        blocks = f" --block-size {','.join(map(str, block_size or (128, 128)))}"
        print(
            f"note: no config.json beside {args.src}, so none says how {args.dst} is "
            f"quantized: read it with --scheme {scheme}"
            + (blocks if scheme == "fp8-block" else "")
            + " (tb.open(..., dequantize=..., scheme=...))",
            file=sys.stderr,
        )
    summary: dict[str, Any] = {
        "src": args.src,
        "quantized": f"{scheme}: {plural(len(done.quantized), 'weight')}",
        **({"layout": args.layout} if args.layout else {}),
        **({"element": args.element} if args.element else {}),
        "quantized_weights": list(done.quantized),
        "left_unquantized": dict(done.left_unquantized),
        "config": done.config,
        "dst": done.path,
        "tensors": done.tensors,
        "bytes_in": done.bytes_in,
        "bytes_out": done.bytes_out,
        "seconds": round(time.perf_counter() - start, 3),
        "skipped": [],
        "dropped_metadata": [],
    }
    ok = True
    if done.problems is not None:
        summary["verified"] = not done.problems
        summary["problems"] = list(done.problems)
        ok = not done.problems
    return report(summary, args, out, ok, None)


def _missing_directory(dst: str, chunked: bool) -> str | None:
    """The directory a save to ``dst`` will create (with its missing parents), or None."""
    from pathlib import Path

    path = Path(dst)
    directory = dst.endswith(("/", os.sep)) or (chunked and not path.suffix) or path.is_dir()
    wanted = path if directory else path.parent
    return None if wanted.exists() or wanted.is_symlink() else str(wanted)


def report(
    summary: dict[str, Any], args: argparse.Namespace, out: TextIO, ok: bool, cast: Any
) -> int:
    """Print a conversion's summary (JSON, or a line and the verdict of --verify)."""
    created = getattr(args, "created", None)
    if created is not None and os.path.isdir(created):
        summary["created_directory"] = created
    if args.json:
        dump(summary, out)
        return 0 if ok else 1
    out.write(
        f"converted {plural(summary['tensors'], 'tensor')} ({size(summary['bytes_in'])} in, "
        f"{size(summary['bytes_out'])} out) {args.src} -> {summary['dst']} in "
        f"{summary['seconds']:.2f} s"
        + (f" (created the directory {created}/)" if "created_directory" in summary else "")
        + "\n"
    )
    if "quantized" in summary:
        config = f"; {summary['config']} written" if summary["config"] else ""
        out.write(f"quantized: {summary['quantized']}{config}\n")
    if args.verify:
        if not ok:
            verdict = plural(len(summary["problems"]), "mismatch")
        elif cast is not None:
            verdict = (
                f"bit-exact to the source cast to {cast.name} (torch's kernel); "
                "the cast itself may round: see tensorbridge cast-report"
            )
        else:
            verdict = "bit-exact"
        out.write("verify: " + colour(verdict, ok, out) + "\n")
        for p in summary["problems"]:
            out.write(f"  {p}\n")
    return 0 if ok else 1

"""``convert`` of a DCP checkpoint: each tensor assembled window by window into the output
(sharded safetensors, or with ``--format npy`` a directory of ``NAME.npy``), in local
processes (``--workers``) or on a dask.distributed cluster (``--dask-scheduler``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from ..errors import MissingExtraError, TensorBridgeError
from ._errors import UsageError
from ._files import convertible, open_file, select
from ._options import progress
from ._output import conversion_report


def is_chunked(path: str) -> bool:
    """Whether ``path`` is a checkpoint stored in chunks (a DCP directory), by content."""
    from pathlib import Path

    from ..io import by_kind, detect, resolve

    try:
        fmt = by_kind(detect(resolve(Path(path))))
    except (OSError, TensorBridgeError):
        return False  # the usual path reports what is wrong
    return fmt is not None and fmt.chunked


@contextlib.contextmanager
def _executor(args: argparse.Namespace) -> Iterator[Any]:
    """The executor --workers / --dask-scheduler ask for, or None (serial)."""
    if args.workers is not None and args.workers > 1:
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context

        with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as ex:
            yield ex
    elif args.dask_scheduler is not None:
        try:
            from distributed import Client
        except ImportError:
            raise MissingExtraError(
                "--dask-scheduler needs dask.distributed; pip install tensorbridge[dask]"
            ) from None
        with Client(args.dask_scheduler) as client:  # type: ignore[no-untyped-call]
            yield client.get_executor()
    else:
        yield None


def _as_directory(path: str) -> str:
    """A suffix-less destination of a DCP conversion is a directory (sharded safetensors)."""
    from pathlib import Path

    p = Path(path)
    if p.suffix or path.endswith(("/", os.sep)) or p.is_file():
        return path
    return path + os.sep


def entry_files(args: argparse.Namespace) -> Any:
    """The format ``--format`` names whose files a DCP conversion writes, one per tensor
    (``npy``), or None (the default layout)."""
    from ..io import entry_files as files_of

    try:
        return files_of(args.format)
    except TensorBridgeError as e:
        raise UsageError(str(e)) from None


def convert_chunked(args: argparse.Namespace, float_dtype: Any) -> int:
    """Convert a DCP checkpoint: each tensor assembled window by window into the output."""
    from pathlib import Path

    from .. import io as tbio
    from ..io.verify import verify

    entries = entry_files(args)
    if entries is not None and args.max_shard_size is not None:
        raise UsageError("--max-shard-size applies to safetensors; .npy files are not sharded")
    start = time.perf_counter()
    with open_file(args.src, args) as src:
        if not getattr(src, "chunked", False):
            raise UsageError(
                f"--format npy writes a DCP checkpoint's tensors; {args.src} is not one"
            )
        names = select(src.keys(), args.include, args.exclude)
        if not names:
            raise UsageError(
                f"no tensor of {args.src} matches --include/--exclude; "
                f"'tensorbridge inspect {args.src}' lists the names"
            )
        names, unsupported = convertible(src, names, args)
        view = src.select(names)  # type: ignore[attr-defined]
        with _executor(args) as executor:
            tbio.save(
                view,
                _as_directory(args.dst),
                float_dtype=float_dtype,
                metadata=False if args.no_metadata else None,
                max_shard_size=args.max_shard_size,
                overwrite=args.overwrite,
                progress=progress(args),
                format=args.format,
                executor=executor,
            )
        took = time.perf_counter() - start
        in_bytes = sum(src.nbytes(n) for n in names)
        if entries is not None:
            files = [Path(args.dst) / f"{n}{entries.suffixes[0]}" for n in names]
            written = str(args.dst)
        else:
            dst = tbio.destination(_as_directory(args.dst))
            files = dst.existing()
            written = str(dst.written())
        out_bytes = sum(p.stat().st_size for p in files)
        summary: dict[str, Any] = {
            "src": args.src,
            "dst": written,
            "tensors": len(names),
            "bytes_in": in_bytes,
            "bytes_out": out_bytes,
            "seconds": round(took, 3),
            "skipped": sorted(unsupported),
            "dropped_metadata": sorted(src.plain_values())
            if entries is not None or args.no_metadata
            else [],
        }
        ok = True
        if args.verify:
            problems: list[str] = []
            if entries is not None:  # one file a tensor
                for n, p in zip(names, files, strict=True):
                    check = verify(
                        src, p, names=[n], float_dtype=float_dtype, progress=progress(args)
                    )
                    problems += check.problems
            else:
                check = verify(
                    src, written, names=names, float_dtype=float_dtype, progress=progress(args)
                )
                problems = list(check.problems)
            summary["verified"] = not problems
            summary["problems"] = problems
            ok = not problems
    return conversion_report(summary, args, sys.stdout, ok, None)

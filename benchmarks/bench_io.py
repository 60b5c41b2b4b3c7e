"""File-layer benchmarks (issue 3): speed and memory of tb.save / tb.load, side by side.

Every row runs in a fresh child process; the parent samples the child's
/proc/<pid>/status (RssAnon, RssFile) every millisecond from the outside, so a
sampler can't be starved by code that holds the child's GIL. "Growth" is the peak
minus the level measured once the inputs exist, just before the timed step.

Rows:
1. Save a 1 GiB float32 state dict to safetensors: tb.save vs safetensors.torch.save_file
   (both followed by fsync: tb.save fsyncs as part of its atomic write, so the official
   writer's file is fsynced too). Target: throughput >= 0.9x, anon growth <= 64 MiB.
2. NumPy-side save (a dict of NumPy arrays) vs safetensors.torch.save_file: >= 1.0x.
3. Load a 1 GiB file with framework="numpy": open + first tensor < 10 ms; full read
   (every page touched) >= 0.9x the official loader: mapped vs safetensors.torch.load_file
   (also mapped), owned memory (mmap=False) vs safetensors.numpy.load_file (also owned).
4. Export a 2 GiB memory-mapped bf16 .npy to a float32 .npy (4 GiB written): anon growth
   < 512 MiB, total RSS growth near one chunk; time >= 0.8x a raw sequential write of the
   same 4 GiB (64 MiB buffer, fsync) in the same run.

Usage: python benchmarks/bench_io.py [--quick] [--dir DIR]
(--quick shrinks the sizes 16x so the harness runs in seconds; its figures are not targets.)
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass

MiB = 1 << 20


@dataclass
class Run:
    seconds: float
    anon_growth: int
    rss_growth: int
    extra: dict[str, float]


def _status(pid: int) -> tuple[int, int]:
    anon = file = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                anon = int(line.split()[1]) * 1024
            elif line.startswith("RssFile:"):
                file = int(line.split()[1]) * 1024
    return anon, file


def run_child(setup: str, step: str) -> Run:
    """Run ``setup`` then ``step`` in a child; sample its memory from here during ``step``."""
    code = textwrap.dedent(
        """
        import os, sys, time
        import numpy as np, torch
        import tensorbridge as tb
        {setup}
        extra = {{}}
        sys.stdout.write("ready\\n"); sys.stdout.flush()
        sys.stdin.readline()
        t0 = time.perf_counter()
        {step}
        took = time.perf_counter() - t0
        sys.stdout.write(repr((took, extra)) + "\\n"); sys.stdout.flush()
        """
    ).format(setup=textwrap.dedent(setup).strip(), step=textwrap.dedent(step).strip())
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.wait()
        raise RuntimeError(f"child failed during setup: {line!r}")
    base_anon, base_file = _status(proc.pid)
    peak_anon, peak_total = base_anon, base_anon + base_file
    proc.stdin.write("go\n")
    proc.stdin.flush()
    while proc.poll() is None:
        try:
            anon, file = _status(proc.pid)
        except (FileNotFoundError, ProcessLookupError):
            break
        peak_anon = max(peak_anon, anon)
        peak_total = max(peak_total, anon + file)
        time.sleep(0.001)
        # the child prints its result and exits; stop sampling once output is ready
    out = proc.stdout.read()
    proc.wait()
    took, extra = eval(out.strip().splitlines()[-1])  # our own child's repr
    return Run(took, peak_anon - base_anon, peak_total - (base_anon + base_file), extra)


def best(runs: list[Run]) -> Run:
    return min(runs, key=lambda r: r.seconds)


def fmt_mib(n: int) -> str:
    return f"{n / MiB:,.0f} MiB"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="16x smaller sizes, one repeat")
    ap.add_argument("--dir", default=None, help="scratch directory (default: a temp dir)")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    scale = 16 if args.quick else 1
    repeat = 1 if args.quick else args.repeat
    work = tempfile.mkdtemp(dir=args.dir, prefix="tb-bench-io-")
    try:
        return _bench(work, scale, repeat)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _bench(work: str, scale: int, repeat: int) -> int:
    total = (1 << 30) // scale
    n_tensors = 16
    per = total // n_tensors // 4  # float32 elements per tensor
    sd_setup = f"sd = {{f'layer{{i}}.weight': torch.randn({per}) for i in range({n_tensors})}}"
    ours = os.path.join(work, "ours.safetensors")
    theirs = os.path.join(work, "theirs.safetensors")
    rows: list[tuple[str, str, str, str]] = []

    # 1. save 1 GiB float32 state dict
    tb_runs = [run_child(sd_setup, f"tb.save(sd, {ours!r}, progress=False)") for _ in range(repeat)]
    st_runs = [
        run_child(
            "from safetensors.torch import save_file\n" + sd_setup,
            f"save_file(sd, {theirs!r})\nfd = os.open({theirs!r}, os.O_RDONLY)\n"
            "os.fsync(fd)\nos.close(fd)",
        )
        for _ in range(repeat)
    ]
    a, b = best(tb_runs), best(st_runs)
    gb = total / 1e9
    rows.append(
        (
            "save 1 GiB f32 (torch) -> safetensors, tb vs save_file (both fsynced)",
            f"{gb / a.seconds:.2f} vs {gb / b.seconds:.2f} GB/s = {b.seconds / a.seconds:.2f}x",
            ">= 0.9x",
            "PASS" if b.seconds / a.seconds >= 0.9 else "FAIL",
        )
    )
    rows.append(
        (
            "  anonymous-memory growth during tb.save",
            fmt_mib(a.anon_growth),
            "<= 64 MiB",
            "PASS" if a.anon_growth <= 64 * MiB else "FAIL",
        )
    )
    rows.append(("  (save_file's growth, for reference)", fmt_mib(b.anon_growth), "", ""))

    # 2. NumPy-side save
    np_setup = sd_setup + "\nsd = {k: v.numpy() for k, v in sd.items()}"
    np_runs = [run_child(np_setup, f"tb.save(sd, {ours!r}, progress=False)") for _ in range(repeat)]
    c = best(np_runs)
    rows.append(
        (
            "save NumPy arrays -> safetensors, tb vs save_file (torch)",
            f"{gb / c.seconds:.2f} GB/s = {b.seconds / c.seconds:.2f}x",
            ">= 1.0x",
            "PASS" if b.seconds / c.seconds >= 1.0 else "FAIL",
        )
    )

    # 3. load with framework="numpy"
    first = [
        run_child(
            "",
            f"f = tb.open({theirs!r})\nx = f[f.keys()[0]]\n"
            "extra['first'] = time.perf_counter() - t0",
        )
        for _ in range(repeat)
    ]
    first_s = min(r.extra["first"] for r in first)
    rows.append(
        (
            "open + first tensor of a 1 GiB file (numpy)",
            f"{first_s * 1e3:.2f} ms",
            "< 10 ms",
            "PASS" if first_s < 0.010 else "FAIL",
        )
    )
    # "Full read": every page of every tensor touched, so lazy (mapped) loaders pay too.
    touch_np = "s = sum(int(a.view(np.uint8)[::4096].sum()) for a in d.values())"
    touch_pt = "s = sum(int(t.view(torch.uint8)[::4096].sum()) for t in d.values())"
    loaders = {
        "tb.load (mmap)": ("", f"d = tb.load({theirs!r})\n" + touch_np),
        "tb.load (mmap=False)": ("", f"d = tb.load({theirs!r}, mmap=False)\n" + touch_np),
        "safetensors.torch.load_file": (
            "from safetensors.torch import load_file",
            f"d = load_file({theirs!r})\n" + touch_pt,
        ),
        "safetensors.numpy.load_file": (
            "from safetensors.numpy import load_file",
            f"d = load_file({theirs!r})\n" + touch_np,
        ),
    }
    took = {k: best([run_child(*v) for _ in range(repeat)]).seconds for k, v in loaders.items()}
    for ours_k, theirs_k in (
        ("tb.load (mmap)", "safetensors.torch.load_file"),
        ("tb.load (mmap=False)", "safetensors.numpy.load_file"),
    ):
        ratio = took[theirs_k] / took[ours_k]
        rows.append(
            (
                f"full read: {ours_k} vs {theirs_k}",
                f"{gb / took[ours_k]:.2f} vs {gb / took[theirs_k]:.2f} GB/s = {ratio:.2f}x",
                ">= 0.9x",
                "PASS" if ratio >= 0.9 else "FAIL",
            )
        )

    # 4. export 2 GiB mmapped bf16 -> f32 .npy, against a raw write of the same bytes
    src = os.path.join(work, "src_bf16.npy")
    dst = os.path.join(work, "dst_f32.npy")
    raw = os.path.join(work, "raw.bin")
    n = (2 << 30) // scale // 2
    make = (
        "import ml_dtypes, numpy as np\n"
        f"m = np.lib.format.open_memmap({src!r}, mode='w+', dtype=np.uint16,\n"
        f"                              shape=({n},))\n"
        f"step = 1 << 24\n"
        f"for i in range(0, {n}, step):\n"
        "    k = min(step, m.size - i)\n"
        "    bits = np.arange(k, dtype=np.float32).astype(ml_dtypes.bfloat16)\n"
        "    m[i:i+step] = bits.view(np.uint16)\n"
        "m.flush(); del m"
    )
    subprocess.run([sys.executable, "-c", make], check=True)
    exp = [
        run_child(
            f"import ml_dtypes\nm = np.load({src!r}, mmap_mode='r').view(ml_dtypes.bfloat16)",
            f"tb.save(m, {dst!r}, float_dtype='f32', progress=False)",
        )
        for _ in range(repeat)
    ]
    raw_w = [
        run_child(
            "buf = np.ones(64 << 20, np.uint8)",
            f"with open({raw!r}, 'wb') as f:\n"
            f"    for _ in range({n * 4} // buf.size):\n"
            "        f.write(buf)\n"
            "    f.flush(); os.fsync(f.fileno())",
        )
        for _ in range(repeat)
    ]
    e, r = best(exp), best(raw_w)
    out_gb = n * 4 / 1e9
    rows.append(
        (
            "export 2 GiB mmapped bf16 -> f32 .npy (4 GiB) vs raw sequential write",
            f"{out_gb / e.seconds:.2f} vs {out_gb / r.seconds:.2f} GB/s = "
            f"{r.seconds / e.seconds:.2f}x",
            ">= 0.8x",
            "PASS" if r.seconds / e.seconds >= 0.8 else "FAIL",
        )
    )
    rows.append(
        (
            "  anonymous-memory growth",
            fmt_mib(e.anon_growth),
            "< 512 MiB",
            "PASS" if e.anon_growth < 512 * MiB else "FAIL",
        )
    )
    rows.append(
        (
            "  total RSS growth (file pages included)",
            fmt_mib(e.rss_growth),
            "near one chunk (64 MiB)",
            "PASS" if e.rss_growth <= 192 * MiB else "FAIL",
        )
    )

    import numpy as np
    import torch

    print(f"# tensorbridge file-layer benchmark{' (--quick: sizes / 16)' if scale > 1 else ''}")
    print(
        f"torch {torch.__version__}, numpy {np.__version__}, {os.cpu_count()} cores, "
        f"best of {repeat}\n"
    )
    print("| measurement | result | target | |")
    print("| --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

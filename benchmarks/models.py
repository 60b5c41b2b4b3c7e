"""Section 4: whole models, bf16 state dicts of real architectures built in code.

Two architectures with random weights, cast to bfloat16: ``torch.nn.Transformer`` and a
ResNet-style CNN defined here (torchvision is not a dependency; its BatchNorm buffers
keep an int64 ``num_batches_tracked``, so the state dict mixes dtypes as real ones do).
First the tree conversions in this process (interleaved timing, results checked bit for
bit), then every writer and reader in a child process of its own with its peak memory
sampled from outside: tensorbridge's safetensors / .npz / .pt next to
``safetensors.torch.save_file`` / ``load_file``, ``np.savez`` / ``np.load`` and
``torch.save`` / ``torch.load(mmap=True, weights_only=True)``. Every writer is followed
by an fsync (``tb.save`` fsyncs as part of its atomic write), and every load reads one
byte of every page, so lazily mapped loaders pay for their reads too.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import nn

import tensorbridge as tb
from tensorbridge.tree import tree_to_numpy, tree_to_torch

from . import plot
from .child import ChildRun, Task, fsync, touch
from .core import Context, Section, Stats, fmt_bytes, fmt_mib, fmt_time
from .trees import HEADERS, require_same, row

TITLE = "Whole models: bf16 state dicts through trees and files"


class _Block(nn.Module):
    """A ResNet basic block: two 3x3 convolutions with batch norm and a shortcut."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + self.shortcut(x))


def resnet(widths: tuple[int, ...], blocks: tuple[int, ...], classes: int = 1000) -> nn.Module:
    """A ResNet-style CNN; ``(64, 128, 256, 512), (2, 2, 2, 2)`` is ResNet-18's shape."""
    layers: list[nn.Module] = [
        nn.Conv2d(3, widths[0], 7, 2, 3, bias=False),
        nn.BatchNorm2d(widths[0]),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = widths[0]
    for stage, (width, count) in enumerate(zip(widths, blocks, strict=True)):
        for i in range(count):
            layers.append(_Block(cin, width, 2 if stage and not i else 1))
            cin = width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


# (name, {mode: constructor arguments})
TRANSFORMER = {
    "full": {"d_model": 512, "nhead": 8, "layers": 3, "ff": 2048},
    "quick": {"d_model": 128, "nhead": 4, "layers": 1, "ff": 512},
    "tiny": {"d_model": 32, "nhead": 2, "layers": 1, "ff": 64},
}
RESNET = {
    "full": ((64, 128, 256, 512), (2, 2, 2, 2)),
    "quick": ((16, 32, 64, 128), (1, 1, 1, 1)),
    "tiny": ((8, 16, 32, 64), (1, 1, 1, 1)),
}
MODELS = ("transformer", "resnet")


def build(kind: str, mode: str) -> dict[str, torch.Tensor]:
    """The bf16 state dict of one of the two models, the same bits in every process."""
    torch.manual_seed(0)
    model: nn.Module
    if kind == "transformer":
        c = TRANSFORMER[mode]
        model = nn.Transformer(
            d_model=c["d_model"],
            nhead=c["nhead"],
            num_encoder_layers=c["layers"],
            num_decoder_layers=c["layers"],
            dim_feedforward=c["ff"],
            batch_first=True,
        )
    else:
        model = resnet(*RESNET[mode])
    return dict(model.to(torch.bfloat16).state_dict())


def describe(kind: str, mode: str, sd: dict[str, torch.Tensor]) -> str:
    n = sum(v.numel() for v in sd.values())
    size = sum(v.numel() * v.element_size() for v in sd.values())
    if kind == "transformer":
        c = TRANSFORMER[mode]
        what = (
            f"`torch.nn.Transformer(d_model={c['d_model']}, nhead={c['nhead']}, "
            f"{c['layers']}+{c['layers']} layers, dim_feedforward={c['ff']})`"
        )
    else:
        widths, blocks = RESNET[mode]
        what = f"ResNet-style CNN (widths {widths}, blocks {blocks})"
    return f"{what}: {len(sd)} tensors, {n:,} parameters, {fmt_bytes(size)} in bf16"


def run(ctx: Context, sec: Section) -> None:
    sds = {kind: build(kind, ctx.mode) for kind in MODELS}
    sec.intro(
        "The models: "
        + "; ".join(describe(k, ctx.mode, sd) for k, sd in sds.items())
        + ". Random weights, cast with `model.to(torch.bfloat16)`."
    )
    _trees(ctx, sec, sds)
    _files(ctx, sec, sds)


# --- trees, in this process -------------------------------------------------------------------


def _to_f32(sd: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    """The loop people write: floating-point tensors to float32 arrays, the rest as they are."""
    return {k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in sd.items()}


def _to_bf16(arrays: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {
        k: torch.from_numpy(v).bfloat16() if v.dtype.kind == "f" else torch.from_numpy(v)
        for k, v in arrays.items()
    }


def _tree_cases(
    sd: dict[str, torch.Tensor], want: dict[str, np.ndarray]
) -> dict[str, Callable[[], Any]]:
    return {
        "loop": lambda: _to_f32(sd),
        "tree": lambda: tree_to_numpy(sd, float_dtype="float32"),
        "loop back": lambda: _to_bf16(want),
        "tree back": lambda: tree_to_torch(want, float_dtype=torch.bfloat16),
        "share loop": lambda: {k: tb.to_numpy(v) for k, v in sd.items()},
        "share tree": lambda: tree_to_numpy(sd),
    }


def _trees(ctx: Context, sec: Section, sds: dict[str, dict[str, torch.Tensor]]) -> None:
    sec.text(
        """**State dict to NumPy and back** (deploying to a float32-only target, and the
        zero-copy bf16 view). Ratio = tensorbridge time / baseline time (< 1: tensorbridge
        is faster), minima / medians; goals (minima): <= 1.05x for the casts both ways,
        <= 1.1x for the zero-copy export. Baselines cast only floating-point tensors, as
        `float_dtype=` does."""
    )
    rows = []
    for kind, sd in sds.items():
        want = _to_f32(sd)
        require_same(tree_to_numpy(sd, float_dtype="float32"), want, f"{kind}: float_dtype=f32")
        back = _to_bf16(want)
        require_same(tree_to_torch(want, float_dtype=torch.bfloat16), back, f"{kind}: back")
        require_same(tree_to_numpy(sd), {k: tb.to_numpy(v) for k, v in sd.items()}, kind)
        st = ctx.measure(
            _tree_cases(sd, want),
            repeats=ctx.pick(10, 3, 3),
            sample_s=5e-3,
        )
        rows += [
            row(
                ctx,
                sec,
                f"{kind}: tree_to_numpy(sd, float_dtype=f32) vs {{k: v.float().numpy()}}",
                st["loop"],
                st["tree"],
                1.05,
            ),
            row(
                ctx,
                sec,
                f"{kind}: tree_to_torch(f32, float_dtype=bf16) vs {{k: from_numpy(v).bfloat16()}}",
                st["loop back"],
                st["tree back"],
                1.05,
            ),
            row(
                ctx,
                sec,
                f"{kind}: tree_to_numpy(sd) vs {{k: tb.to_numpy(v)}} (zero-copy bf16)",
                st["share loop"],
                st["share tree"],
                1.1,
            ),
        ]
    sec.table(HEADERS, rows)


# --- files, each row in a child process --------------------------------------------------------


# Writers and readers. A writer is followed by an fsync (``tb.save`` fsyncs as part of
# its atomic write); a reader returns a mapping of the loaded tensors.


def _tb_save(sd: dict[str, torch.Tensor], path: str) -> None:
    tb.save(sd, path, progress=False, overwrite=True)


def _st_save(sd: dict[str, torch.Tensor], path: str) -> None:
    from safetensors.torch import save_file

    save_file(sd, path)
    fsync(path)


def _st_load(path: str) -> Mapping[str, Any]:
    from safetensors.torch import load_file

    return load_file(path)


def _np_save(sd: dict[str, torch.Tensor], path: str) -> None:
    np.savez(path, **{k: tb.to_numpy(v) for k, v in sd.items()})
    fsync(path)


def _np_load(path: str) -> Mapping[str, Any]:
    z = np.load(path)
    return {k: z[k] for k in z.files}


def _torch_save(sd: dict[str, torch.Tensor], path: str) -> None:
    torch.save(sd, path)
    fsync(path)


def _torch_load(path: str) -> Mapping[str, Any]:
    loaded: Mapping[str, Any] = torch.load(path, mmap=True, weights_only=True)
    return loaded


class Method(NamedTuple):
    """A writer / reader pair, compared with its ``counterpart`` (a key; "": none)."""

    key: str
    label: str
    suffix: str
    save: Callable[[dict[str, torch.Tensor], str], None]
    load: Callable[[str], Mapping[str, Any]]
    counterpart: str


METHODS = [Method(*m) for m in [
    ("tb_st", "`tb.save` / `tb.load` .safetensors", ".safetensors", _tb_save, tb.load, "st"),
    ("st", "`safetensors.torch` `save_file` / `load_file`", ".safetensors", _st_save, _st_load,
     ""),
    ("tb_npz", "`tb.save` / `tb.load` .npz", ".npz", _tb_save, tb.load, "np"),
    ("np", "`np.savez` / `np.load`", ".npz", _np_save, _np_load, ""),
    ("tb_pt", "`tb.save` / `tb.load` .pt", ".pt", _tb_save, tb.load, "torch"),
    ("torch", "`torch.save` / `torch.load(mmap=True, weights_only=True)`", ".pt", _torch_save,
     _torch_load, ""),
]]  # fmt: skip
BY_KEY = {m.key: m for m in METHODS}


# --- what the child processes run -------------------------------------------------------------


def save_inputs(key: str, kind: str, mode: str, path: str) -> tuple[str, dict[str, Any], str]:
    """A saving child's inputs: the method, the model's state dict, the file."""
    return key, build(kind, mode), path


def save_step(inputs: tuple[str, dict[str, torch.Tensor], str]) -> None:
    key, sd, path = inputs
    BY_KEY[key].save(sd, path)


def load_inputs(key: str, path: str, weight: str) -> tuple[str, str, str]:
    return key, path, weight


def load_step(inputs: tuple[str, str, str]) -> dict[str, Any]:
    """Load the file and read one byte of every page; report how a bf16 weight came back."""
    key, path, weight = inputs
    d = BY_KEY[key].load(path)
    return {"touched": touch(d.values()), "dtype": str(d[weight].dtype)}


def _files(ctx: Context, sec: Section, sds: dict[str, dict[str, torch.Tensor]]) -> None:
    repeats = ctx.pick(3, 1, 1)
    methods = METHODS
    if importlib.util.find_spec("safetensors") is None:
        methods = [m for m in METHODS if m.key != "st"]
    sec.text(
        f"""**Save and load, each in a fresh child process** (best of {repeats}: time min /
        median; memory: the largest peak over the runs). *Peak RSS +* is the child's
        peak resident memory during the call above its level just before it (file
        pages included; anonymous memory alone in brackets); for a save the state dict
        is already in memory, for a load nothing is. *Load + read* opens the file and
        reads one byte of every page of every tensor. *vs counterpart* = the counterpart's
        time / tensorbridge's (> 1: tensorbridge is faster), save / load, minima."""
    )
    rows: list[list[str]] = []
    plot_data: dict[str, dict[str, tuple[float, float, int, int]]] = {}
    for kind, sd in sds.items():
        key = next(k for k, v in sd.items() if v.is_floating_point() and v.dim() >= 2)
        paths = {m.key: str(ctx.scratch / f"{kind}-{m.key}{m.suffix}") for m in methods}
        saves = ctx.rounds(
            {m.key: Task(save_inputs, save_step, (m.key, kind, ctx.mode, paths[m.key]))
             for m in methods},
            repeats,
        )  # fmt: skip
        loads = ctx.rounds(
            {m.key: Task(load_inputs, load_step, (m.key, paths[m.key], key)) for m in methods},
            repeats,
        )
        plot_data[kind] = {}
        for m in methods:
            s, ld = saves[m.key], loads[m.key]
            s_st, l_st = Stats([r.seconds for r in s]), Stats([r.seconds for r in ld])
            vs = ""
            if m.counterpart in saves:
                cs, cl = saves[m.counterpart], loads[m.counterpart]
                vs = (
                    f"{min(r.seconds for r in cs) / s_st.min:.2f}x / "
                    f"{min(r.seconds for r in cl) / l_st.min:.2f}x"
                )
            size = _file_size(paths[m.key])
            rows.append(
                [
                    kind,
                    m.label,
                    f"{fmt_time(s_st.min)} / {fmt_time(s_st.median)}",
                    _rss(s),
                    f"{fmt_time(l_st.min)} / {fmt_time(l_st.median)}",
                    _rss(ld),
                    fmt_bytes(size),
                    str(ld[0].extra.get("dtype", "?")),
                    vs,
                ]
            )
            plot_data[kind][m.label] = (
                s_st.min,
                l_st.min,
                max(r.rss_growth for r in s),
                max(r.rss_growth for r in ld),
            )
        for p in paths.values():
            _remove(p)
    sec.table(
        [
            "model",
            "writer / reader",
            "save min / median",
            "save peak RSS +",
            "load + read min / median",
            "load peak RSS +",
            "file",
            "a bf16 weight loads as",
            "vs counterpart (save / load)",
        ],
        rows,
    )
    sec.text(
        """`np.savez` stores ml_dtypes bfloat16 arrays as raw `|V2` void (NumPy has no
        bfloat16), so `np.load` gives bytes, not numbers; tensorbridge's `.npz` keeps the
        dtype and plain `np.load` still reads its files (see the file-format docs)."""
    )
    ctx.plot(sec, "models.png", "save and load time and peak memory per format", _drawer(plot_data))


def _rss(runs: list[ChildRun]) -> str:
    worst = max(runs, key=lambda r: r.rss_growth)
    return f"{fmt_mib(worst.rss_growth)} ({fmt_mib(max(r.anon_growth for r in runs))})"


def _file_size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


def _remove(path: str) -> None:
    if os.path.exists(path):
        os.remove(path)


def _drawer(data: dict[str, dict[str, tuple[float, float, int, int]]]) -> Callable[[Any], Any]:
    def draw(plt: Any) -> Any:
        fig, axes = plot.figure(plt, len(data), 2, width=11, height=2.6 * len(data) + 0.6)
        for i, (kind, methods) in enumerate(data.items()):
            labels = [name.replace("`", "") for name in methods]
            ys = np.arange(len(labels))
            values = list(methods.values())
            for j, (title, scale, unit) in enumerate(
                (("time", 1e3, "ms"), ("peak RSS growth", 1 / 2**20, "MiB"))
            ):
                ax = axes[i, j]
                ax.barh(ys - 0.2, [v[2 * j] * scale for v in values], 0.4, label="save")
                ax.barh(ys + 0.2, [v[2 * j + 1] * scale for v in values], 0.4, label="load + read")
                ax.set_yticks(ys)
                ax.set_yticklabels(labels if j == 0 else [], fontsize=7)
                ax.invert_yaxis()
                ax.set_title(f"{kind}: {title} ({unit})", fontsize=9)
                ax.grid(True, axis="x", alpha=0.3)
                if i == 0 and j == 0:
                    ax.legend(fontsize=7)
        return fig

    return draw

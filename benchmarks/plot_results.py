"""Plots from the benchmark JSON files (no GPU needed): TFLOP/s against sequence length.

For ``<results>/<DEVICE>/flash_attention.json`` it writes ``flash_attention.png``: one panel per
(dtype, mode, head dim, causal), one line per implementation, the measured matmul ceiling as a
dashed line. For ``flash_attention_decode.json`` it writes ``flash_attention_decode.png``: K/V
read TB/s against key length, one panel per (batch, queries), the copy ceiling dashed.

    pip install matplotlib && python benchmarks/plot_results.py benchmarks/results/NVIDIA_H100_80GB_HBM3
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys


def _grid(n: int) -> tuple[int, int]:
    cols = min(n, 4)
    return (n + cols - 1) // cols, cols


def plot_dense(path: pathlib.Path, plt) -> pathlib.Path:
    data = json.loads(path.read_text())
    rows = [r for r in data["rows"] if "tflops" in r]
    panels = sorted({(r.get("dtype", "bf16"), r["mode"], r["D"], r["causal"]) for r in rows})
    nr, nc = _grid(len(panels))
    fig, axes = plt.subplots(nr, nc, figsize=(4.2 * nc, 3.2 * nr), squeeze=False)
    for ax, (dtype, mode, D, causal) in zip(axes.flat, panels):
        mine = [r for r in rows if (r.get("dtype", "bf16"), r["mode"], r["D"], r["causal"]) == (dtype, mode, D, causal)]
        for impl in sorted({r["impl"] for r in mine}):
            pts = sorted((r["S"], r["tflops"]) for r in mine if r["impl"] == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=impl,
                    lw=2.2 if impl == "kernelops" else 1.2)
        ax.axhline(data["matmul_bf16_tflops"], ls="--", c="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{dtype} {mode} D={D} {'causal' if causal else 'full'}", fontsize=9)
        ax.set_xlabel("sequence length", fontsize=8)
        ax.set_ylabel("TFLOP/s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_ylim(bottom=0)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{data['device']}, torch {data['torch']}, triton {data['triton']} "
                 f"(dashed: bf16 matmul {data['matmul_bf16_tflops']:.0f} TFLOP/s)", fontsize=10)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_decode(path: pathlib.Path, plt) -> pathlib.Path:
    data = json.loads(path.read_text())
    rows = [r for r in data["rows"] if "tbps" in r]
    panels = sorted({(r["B"], r["Sq"]) for r in rows})
    nr, nc = _grid(len(panels))
    fig, axes = plt.subplots(nr, nc, figsize=(4.2 * nc, 3.2 * nr), squeeze=False)
    for ax, (B, Sq) in zip(axes.flat, panels):
        mine = [r for r in rows if (r["B"], r["Sq"]) == (B, Sq)]
        for impl in sorted({r["impl"] for r in mine}):
            pts = sorted((r["Sk"], r["tbps"]) for r in mine if r["impl"] == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=impl,
                    lw=2.2 if impl == "kernelops" else 1.2)
        ax.axhline(data["copy_tbps"], ls="--", c="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(f"B={B} Sq={Sq} (Hq={mine[0]['Hq']}, Hkv={mine[0]['Hkv']}, D={mine[0]['D']})", fontsize=9)
        ax.set_xlabel("key length", fontsize=8)
        ax.set_ylabel("K/V read TB/s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_ylim(bottom=0)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(f"{data['device']} decode, torch {data['torch']}, triton {data['triton']} "
                 f"(dashed: copy {data['copy_tbps']:.2f} TB/s read+write)", fontsize=10)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("folder", help="benchmarks/results/<DEVICE>")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    folder = pathlib.Path(args.folder)
    made = []
    for name, fn in (("flash_attention.json", plot_dense), ("flash_attention_decode.json", plot_decode)):
        if (folder / name).exists():
            made.append(fn(folder / name, plt))
    for path in made:
        print(path)
    return 0 if made else 1


if __name__ == "__main__":
    sys.exit(main())

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


def _plot(path: pathlib.Path, plt, rows: list, panel_of, x: str, y: str, title_of, xlabel: str, ylabel: str,
          ceiling: float, suptitle: str) -> pathlib.Path:
    """One panel per ``panel_of(row)``, one line per implementation (kernelops thicker), a dashed
    ceiling; saved next to ``path`` as .png."""
    panels = sorted({panel_of(r) for r in rows})
    nr, nc = _grid(len(panels))
    fig, axes = plt.subplots(nr, nc, figsize=(4.2 * nc, 3.2 * nr), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        mine = [r for r in rows if panel_of(r) == panel]
        for impl in sorted({r["impl"] for r in mine}):
            pts = sorted((r[x], r[y]) for r in mine if r["impl"] == impl)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=impl,
                    lw=2.2 if impl == "kernelops" else 1.2)
        ax.axhline(ceiling, ls="--", c="gray", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(title_of(panel, mine[0]), fontsize=9)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.set_ylabel(ylabel, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_ylim(bottom=0)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout()
    out = path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def plot_dense(path: pathlib.Path, plt) -> pathlib.Path:
    data = json.loads(path.read_text())
    return _plot(path, plt, [r for r in data["rows"] if "tflops" in r],
                 lambda r: (r.get("dtype", "bf16"), r["mode"], r["D"], r["causal"]), "S", "tflops",
                 lambda p, _: f"{p[0]} {p[1]} D={p[2]} {'causal' if p[3] else 'full'}", "sequence length",
                 "TFLOP/s", data["matmul_bf16_tflops"],
                 f"{data['device']}, torch {data['torch']}, triton {data['triton']} "
                 f"(dashed: bf16 matmul {data['matmul_bf16_tflops']:.0f} TFLOP/s)")


def plot_decode(path: pathlib.Path, plt) -> pathlib.Path:
    data = json.loads(path.read_text())
    return _plot(path, plt, [r for r in data["rows"] if "tbps" in r], lambda r: (r["B"], r["Sq"]), "Sk", "tbps",
                 lambda p, r: f"B={p[0]} Sq={p[1]} (Hq={r['Hq']}, Hkv={r['Hkv']}, D={r['D']})", "key length",
                 "K/V read TB/s", data["copy_tbps"],
                 f"{data['device']} decode, torch {data['torch']}, triton {data['triton']} "
                 f"(dashed: copy {data['copy_tbps']:.2f} TB/s read+write)")


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

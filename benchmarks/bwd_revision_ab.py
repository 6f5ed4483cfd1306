"""A/B of the Gluon backward kernels against an earlier revision, in one process (NOTES v28c).

``--prepare REV`` (on a machine with the git history): copy REV's ``bwd_fused.py`` and ``bwd_ws.py``
into ``gpu_old/`` (ignored by git; carry it to the GPU machine), importing each other there. Only
those two files are taken from REV: what they import from other modules (``fwd_ws``'s descriptor
helpers, ``common``) comes from the working tree, so REV must be recent enough to run against it.
``--run``: per row, the fused and dK/dV launchers of both revisions at the kernel level (the same
inputs, lse and delta), timed ABAB by ``triton.testing.do_bench`` (median); reports the best of the
two medians and their spread, and writes ``--out``/ab.json. bf16, B*S = 16k tokens, H*D = 2048.

    python benchmarks/bwd_revision_ab.py --prepare HEAD~1
    python benchmarks/bwd_revision_ab.py --run --out DIR
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
OLD = ROOT / "gpu_old"
MODULES = ("bwd_fused", "bwd_ws")
ROWS = [(128, False, 4096, 1), (128, False, 16384, 1), (128, True, 4096, 1), (128, True, 16384, 1),
        (128, True, 16384, 4), (64, False, 4096, 1), (64, False, 16384, 1), (64, True, 16384, 1)]


def prepare(rev: str) -> None:
    OLD.mkdir(exist_ok=True)
    (OLD / "__init__.py").write_text("")
    for name in MODULES:
        text = subprocess.run(["git", "show", f"{rev}:kernelops/kernels/flash_attention/{name}.py"], cwd=ROOT,
                              check=True, capture_output=True, text=True).stdout
        for other in MODULES:
            text = text.replace(f"kernelops.kernels.flash_attention.{other} import", f"gpu_old.{other}_old import")
        (OLD / f"{name}_old.py").write_text(text)
    print(f"gpu_old/ holds {rev}'s {', '.join(MODULES)}")


def run(out: str | None) -> None:
    import torch
    import triton.testing

    sys.path.insert(0, str(ROOT))
    from gluon_fwd import print_row
    from gpu_old import bwd_fused_old as old_f
    from gpu_old import bwd_ws_old as old_w

    from kernelops import flash_attention
    from kernelops.kernels.flash_attention import bwd_fused as new_f
    from kernelops.kernels.flash_attention import bwd_ws as new_w

    rows = []
    for D, causal, S, group in ROWS:
        B, H = max(1, 16384 // S), 2048 // D
        q = torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16)
        k, v = (torch.randn(B, S, H // group, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        o, lse = flash_attention(q, k, v, return_lse=True, causal=causal)
        do = torch.randn_like(o)
        delta = (o.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        kw = dict(softmax_scale=D ** -0.5, causal=causal)
        fns = {f"fused_{tag}": (lambda f=f: f.flash_attention_bwd_fused(q, k, v, do, lse, delta, dq, dk, dv, **kw))
               for tag, f in (("old", old_f), ("new", new_f))}
        fns.update({f"dkdv_{tag}": (lambda w=w: w.flash_attention_bwd_dkdv_ws(q, k, v, do, lse, delta, dk, dv, **kw))
                    for tag, w in (("old", old_w), ("new", new_w))})
        times = {name: [] for name in fns}
        for _ in range(2):
            for name, fn in fns.items():
                times[name].append(triton.testing.do_bench(fn, warmup=25, rep=150, return_mode="median"))
        row = dict(D=D, causal=causal, S=S, group=group, **{n: min(t) for n, t in times.items()},
                   spread={n: max(t) / min(t) for n, t in times.items()})
        for kernel in ("fused", "dkdv"):
            row[f"{kernel}_new_vs_old"] = row[f"{kernel}_old"] / row[f"{kernel}_new"]
        rows.append(row)
        print_row(row, skip=("spread",))
    if out:
        pathlib.Path(out).mkdir(parents=True, exist_ok=True)
        (pathlib.Path(out) / "ab.json").write_text(json.dumps(rows, indent=1))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prepare", metavar="REV", help="copy REV's kernel modules into gpu_old/")
    p.add_argument("--run", action="store_true", help="time both revisions on the GPU")
    p.add_argument("--out", help="where --run writes ab.json")
    args = p.parse_args(argv)
    if args.prepare:
        prepare(args.prepare)
    if args.run:
        run(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Experiment (NOTES v31): the launch order of the warp-specialised kernels, swept per row (GPU).

The Gluon kernels walk (batch, head) pairs in chunks of ``chunk`` heads, each chunk block by
block (``bwd_ws.launch_order``, ``fwd_ws.unit_order``): ``chunk=1`` walks one head's blocks, then
the next head's; ``chunk=heads`` every head's first block, then every head's second (the backward's
order at D=128 causal before v31). This times each kernel alone (``triton.testing.do_bench``
median of its launch, outputs preallocated) for chunks 1, 2, 4, ... up to all heads, with the
launcher's own rule beside them, on bf16 rows of B*S = 16k tokens and H*D = 2048, and checks that
every order gives the same dK / dV (bitwise) and the same output.

    python benchmarks/launch_order.py [--kernels fwd fused dkdv] [--dims 128 64] [--out DIR]
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

ROWS = [(S, True, 1) for S in (512, 1024, 2048, 4096, 8192, 16384)] + [
    (S, False, 1) for S in (1024, 4096, 16384)] + [(1024, True, 4), (16384, True, 4)]


def _launch(kernel: str, tensors: dict, causal: bool, chunk: int | None):
    """``(kernel, grid, args, meta, outputs)`` of one kernel's launch with ``chunk`` (None: its rule)."""
    from kernelops.kernels.flash_attention import bwd_fused, bwd_ws, fwd_ws

    q, k, v, do, lse, delta = (tensors[n] for n in ("q", "k", "v", "do", "lse", "delta"))
    scale = q.shape[-1] ** -0.5
    if kernel == "fwd":
        out, lse_out = torch.empty_like(q), torch.empty_like(lse)
        return (*fwd_ws.fwd_ws_launch(q, k, v, out, lse_out, scale, causal, 128, 2, chunk=chunk), (out, lse_out))
    dk, dv = torch.full_like(k, float("nan")), torch.full_like(v, float("nan"))
    if kernel == "fused":
        dq_acc = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        return (*bwd_fused.fused_launch(q, k, v, do, lse, delta, dq_acc, dk, dv, scale, causal, chunk=chunk),
                (dk, dv))
    return (*bwd_ws.dkdv_ws_launch(q, k, v, do, lse, delta, dk, dv, scale, causal, chunk=chunk), (dk, dv))


def sweep(kernels, dims) -> list:
    import triton.testing

    from gluon_fwd import print_row

    from kernelops import flash_attention

    rows = []
    for D in dims:
        for S, causal, group in ROWS:
            B, H = 16384 // S, 2048 // D
            q, do = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            k, v = (torch.randn(B, S, H // group, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            out, lse = flash_attention(q, k, v, return_lse=True, causal=causal)
            delta = (out.float() * do.float()).sum(-1).transpose(1, 2).contiguous()
            tensors = dict(q=q, k=k, v=v, do=do, lse=lse, delta=delta)
            for kernel in kernels:
                heads = B * (H if kernel == "fwd" else H // group)
                chunks = [None] + sorted({c for c in (1, 2, 4, 8, 16, 32, 64, heads) if c <= heads})
                row = {"kernel": kernel, "D": D, "S": S, "causal": causal, "group": group, "heads": heads}
                first = None
                for chunk in chunks:
                    fn, grid, args, meta, outs = _launch(kernel, tensors, causal, chunk)
                    fn[grid](*args, **meta)
                    torch.cuda.synchronize()
                    if first is None:
                        first = [t.clone() for t in outs]
                    elif not all(torch.equal(a, b) for a, b in zip(outs, first)):
                        row.setdefault("differs", []).append(chunk)
                    name = "rule" if chunk is None else f"chunk{chunk}"
                    row[f"{name}_us"] = 1e3 * triton.testing.do_bench(lambda: fn[grid](*args, **meta), warmup=25,
                                                                      rep=150, return_mode="median")
                    if chunk is None:
                        row["rule_chunk"] = args[-1]
                best = min((key for key in row if key.startswith("chunk")), key=row.get)
                row["best"] = best
                row["rule_vs_best"] = row[best] / row["rule_us"]
                rows.append(row)
                print_row(row)
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kernels", nargs="+", default=["fwd", "fused", "dkdv"], choices=["fwd", "fused", "dkdv"])
    p.add_argument("--dims", type=int, nargs="+", default=[128, 64])
    p.add_argument("--out", help="write <DEVICE>/launch_order.json here")
    args = p.parse_args(argv)
    from gluon_fwd import write_rows

    rows = sweep(args.kernels, args.dims)
    write_rows(args.out, "launch_order.json", rows)
    return 1 if any("differs" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

"""Kernel time of the D=256 Gluon backward (kernels/flash_attention/bwd_d256.py), before/after: run
it once per tree, alternating, and compare the JSON lines.

    python benchmarks/bwd_d256.py --tree /tmp/old --tag old1 >> ab.jsonl
    python benchmarks/bwd_d256.py --tree .        --tag new1 >> ab.jsonl

Rows: bf16, B*S = 16k tokens, H = 8, D = 256, S in --seqs, causal and full; the time of one
backward as the library runs it (the float32 dQ buffer zeroed, the kernel, dQ converted), the
median of triton.testing.do_bench on random inputs. TFLOP/s count 2.5x the forward's 4*B*H*S*S*D
(half when causal). ``dk_sum`` (the sum of |dK|) tells whether two trees' outputs differ.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", default=".", help="folder holding the kernelops package to import")
    p.add_argument("--tag", default="new")
    p.add_argument("--seqs", type=int, nargs="+", default=[2048, 16384])
    args = p.parse_args(argv)
    sys.path.insert(0, args.tree)
    import torch
    import triton.testing as tt

    from kernelops import flash_attention
    from kernelops.kernels.flash_attention import bwd_d256

    torch.manual_seed(0)
    D, H = 256, 8
    for S in args.seqs:
        B = max(1, 16384 // S)
        for causal in (False, True):
            q, k, v, dout = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            out, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
            delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
            dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            acc = torch.zeros(q.shape, device="cuda", dtype=torch.float32)

            def run():
                acc.zero_()
                bwd_d256.flash_attention_bwd_d256(q, k, v, dout, lse, delta, dq, dk, dv,  # noqa: B023
                                                  softmax_scale=D ** -0.5, causal=causal, dq_acc=acc)  # noqa: B023

            ms = tt.do_bench(run, warmup=30, rep=200)
            flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
            print(json.dumps(dict(tag=args.tag, S=S, causal=causal, ms=ms, bwd_tflops=flops / ms * 1e-9,
                                  dk_sum=dk.float().abs().sum().item())), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Time flash_attention with dropout on the current tree (GPU): the A/B behind the 64-bit dropout
counter of session 40 (``fwd.dropout_keep``), run once per tree and compared by hand.

bf16, D=128, Hq=Hkv=16, B*S = 16k tokens, causal and not, S in {1k, 4k, 16k}, dropout_prob 0.1;
``triton.testing.do_bench`` median of the forward and of forward+backward. Prints one JSON line
per row with the tag given.

    python benchmarks/dropout_counter_ab.py --tag new

Session 40's runs (two alternating rounds a tree, old files swapped in between):
``results/NVIDIA_H200/dropout_counter_ab_s40.jsonl`` (the kept counter) and
``dropout_counter64_ab_s40.jsonl`` (a 64-bit offset, not kept); NOTES v78.
"""

from __future__ import annotations

import argparse
import json

import torch


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tag", default="")
    p.add_argument("--seqs", type=int, nargs="+", default=[1024, 4096, 16384])
    args = p.parse_args(argv)
    import triton.testing as tt

    from kernelops import flash_attention

    torch.manual_seed(0)
    for S in args.seqs:
        for causal in (False, True):
            B, H, D = 16384 // S, 16, 128
            q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn_like(q)

            def fwd():
                return flash_attention(q, k, v, causal=causal, dropout_prob=0.1, dropout_seed=1234)

            def fwdbwd():
                out = fwd()
                torch.autograd.grad(out, (q, k, v), dout)

            fwd(), fwdbwd()  # compile and tune outside the timing
            row = {"tag": args.tag, "S": S, "causal": causal, "fwd_ms": tt.do_bench(fwd, return_mode="median"),
                   "fwdbwd_ms": tt.do_bench(fwdbwd, return_mode="median")}
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

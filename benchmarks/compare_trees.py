"""Before/after on one GPU: the same calls timed with kernelops imported from a given tree.

Export the old tree beside this one and run both (alternating, so drift shows up as a spread):

    git archive <commit> kernelops autotune_cache | tar -x -C /tmp/old
    python benchmarks/compare_trees.py /tmp/old old >> ab.jsonl
    python benchmarks/compare_trees.py .        new >> ab.jsonl

Each line is JSON: ``ms`` (median of triton.testing.do_bench, GPU wall time between events, so
host-bound calls show their host cost), useful TFLOP/s, and ``host_ms`` (Python time per call of
20 back-to-back calls, before the synchronise). Cases (bf16, D=128, 16k tokens):

* varlen: 16 random documents (the flash_attention_masks.py case), causal, H=16, with
  ``max_seqlen``; forward and forward+backward. varlen128: 128 documents of 128 tokens, forward.
* causal dense at S = 1k / 4k / 16k (H=16, B = 16k / S) and GQA 32/8 at 16k, forward and
  forward+backward.
"""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    import argparse

    p = argparse.ArgumentParser(description="time the same calls with kernelops imported from TREE")
    p.add_argument("tree", help="folder that holds the kernelops package to import")
    p.add_argument("tag", help="label printed in every row (e.g. old / new)")
    args = p.parse_args(argv)
    tree, tag = args.tree, args.tag
    from trees import import_tree

    import_tree(tree)
    import torch
    import triton.testing as tt
    from documents import random_documents

    from kernelops import flash_attention

    D, H, T = 128, 16, 16384

    def bench(name, fn, flops, grads=None):
        if grads:
            for t in grads:
                t.requires_grad_(True)
            dout = torch.randn_like(fn())
            call = lambda: fn().backward(dout)  # noqa: E731
        else:
            call = fn
        call()
        torch.cuda.synchronize()
        ms = tt.do_bench(call, warmup=25, rep=200, return_mode="median", grad_to_none=grads)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(20):
            call()
        host = (time.perf_counter() - start) / 20 * 1e3
        torch.cuda.synchronize()
        for t in grads or ():
            t.requires_grad_(False)
        print(json.dumps(dict(tag=tag, case=name, ms=round(ms, 4), tflops=round(flops / ms / 1e9, 1),
                              host_ms=round(host, 3))), flush=True)

    gen = torch.Generator().manual_seed(0)
    lens, cu = random_documents(T, 16, gen)
    flops = 4 * H * D * sum(n * (n + 1) // 2 for n in lens)
    q, k, v = (torch.randn(T, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    longest = max(lens)
    packed = lambda: flash_attention(q, k, v, causal=True, cum_seqlens_q=cu, cum_seqlens_k=cu,  # noqa: E731
                                     max_seqlen_q=longest, max_seqlen_k=longest)
    bench("varlen fwd", packed, flops)
    bench("varlen fwdbwd", packed, 3.5 * flops, [q, k, v])
    cu128 = torch.arange(0, T + 1, 128, dtype=torch.int32, device="cuda")
    short = lambda: flash_attention(q, k, v, causal=True, cum_seqlens_q=cu128, cum_seqlens_k=cu128,  # noqa: E731
                                    max_seqlen_q=128, max_seqlen_k=128)
    bench("varlen128 fwd", short, 4 * H * D * 128 * (128 * 129 // 2))
    for S, hq, hkv in ((1024, 16, 16), (4096, 16, 16), (16384, 16, 16), (16384, 32, 8)):
        B = max(1, T // S)
        qd = torch.randn(B, S, hq, D, device="cuda", dtype=torch.bfloat16)
        kd, vd = (torch.randn(B, S, hkv, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        dense_flops = 4 * B * hq * D * S * S / 2
        dense = lambda: flash_attention(qd, kd, vd, causal=True)  # noqa: E731
        bench(f"causal S{S} gqa{hq}/{hkv} fwd", dense, dense_flops)
        bench(f"causal S{S} gqa{hq}/{hkv} fwdbwd", dense, 3.5 * dense_flops, [qd, kd, vd])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

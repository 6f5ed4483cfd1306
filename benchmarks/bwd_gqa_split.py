"""Split vs walk in the fused Gluon backwards' GQA handling (NOTES v37): kernel time of one backward
with each program walking its KV head's query heads (``split=False``) or taking one query head and
summing dK/dV in a float32 workspace (``split=True``; the workspace's zeroing and conversion are
timed with it), alternating twice in one process, best of each. Also prints what the library's
rule picks (``rule``) and the largest difference between the two paths' gradients.

    python benchmarks/bwd_gqa_split.py --dims 256 128 64 >> split.jsonl
    python benchmarks/bwd_gqa_split.py --dims 128 --seqs 16384 --groups 4 --heads 32 --modes causal

Rows: bf16, B*S = 16k tokens (B = 16384 / S), Hq = 2048 / D unless --heads, Hkv = Hq / group;
modes ``causal``, ``full`` and ``window`` (causal with a --window-key left window). The D=256
kernel is :func:`bwd_d256.flash_attention_bwd_d256`, D=64/128 :func:`bwd_fused.flash_attention_bwd_fused`.
Needs an sm_90 GPU with Gluon. Session 20's rows (H200, torch 2.11, Triton 3.6) are in
``results/NVIDIA_H200/bwd_gqa_split.jsonl``: most came from scratch forms of this script with the
same timing (each row's ``source``), the last four from this script.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def _time_pair(tt, fn, inputs, scale: float, causal: bool, win):
    """``(walk ms, split ms, max |difference| of the gradients)``: ``fn`` over ``inputs`` (q, k, v,
    dout, lse, delta) with ``split`` False / True / False / True, best of each."""
    import torch

    q, k, v = inputs[:3]
    grads = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    acc = torch.empty(q.shape, device=q.device, dtype=torch.float32)
    times, outs = {False: [], True: []}, {}
    for split in (False, True, False, True):
        def run():
            acc.zero_()
            fn(*inputs, *grads, softmax_scale=scale, causal=causal, win_left=win, dq_acc=acc,
               split=split)  # noqa: B023

        times[split].append(tt.do_bench(run, warmup=20, rep=150))
        outs[split] = [t.float().clone() for t in grads]
    diff = max((a - b).abs().max().item() for a, b in zip(outs[False], outs[True]))
    return min(times[False]), min(times[True]), diff


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dims", type=int, nargs="+", default=[256, 128, 64])
    p.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--groups", type=int, nargs="+", default=[2, 4, 8])
    p.add_argument("--modes", nargs="+", choices=["causal", "full", "window"], default=["causal", "full", "window"])
    p.add_argument("--window", type=int, default=1024, help="left window of the window mode (keys)")
    p.add_argument("--heads", type=int, default=None, help="query heads (default 2048 / D)")
    args = p.parse_args(argv)

    import torch
    import triton.testing as tt

    from kernelops import flash_attention
    from kernelops.kernels.flash_attention import bwd_d256, bwd_fused

    torch.manual_seed(0)
    for D in args.dims:
        hq = args.heads or 2048 // D
        fn, rule = ((bwd_d256.flash_attention_bwd_d256, bwd_d256.d256_split) if D == 256 else
                    (bwd_fused.flash_attention_bwd_fused, bwd_fused.fused_split))
        for S in args.seqs:
            B = max(1, 16384 // S)
            for group in args.groups:
                if hq % group:
                    continue
                for mode in args.modes:
                    causal, win = mode != "full", (args.window if mode == "window" else None)
                    q, dout = (torch.randn(B, S, hq, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                    k, v = (torch.randn(B, S, hq // group, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
                    out, lse = flash_attention(q, k, v, causal=causal, sliding_window=(win, 0) if win else None,
                                               return_lse=True)
                    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
                    walk, split_ms, diff = _time_pair(tt, fn, (q, k, v, dout, lse, delta), D ** -0.5, causal, win)
                    print(json.dumps(dict(D=D, B=B, S=S, Hq=hq, Hkv=hq // group, mode=mode, window=win,
                                          walk_ms=walk, split_ms=split_ms, ratio=round(walk / split_ms, 4),
                                          maxdiff=diff, rule=rule(q.shape, k.shape, causal, win))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

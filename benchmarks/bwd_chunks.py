"""The fused Gluon backward's launch chunk swept against the rule (GPU; NOTES v70).

For D in {128, 64}, causal and full, S in {512, 1k, 2k, 4k} (B*S = 16k tokens, H*D = 2048, bf16),
times ``bwd_fused.flash_attention_bwd_fused(..., chunk=c)`` (the kernel with its dQ workspace and
copy, ``triton.testing.do_bench`` median) for the rule's chunk (``bwd_ws.launch_order``), powers of
two up to 64 and every head in one chunk, in ``--rounds`` rounds; prints each chunk's time over the
rule's and writes the milliseconds to ``<out>/bwd_chunk_sweep.json``.

    python benchmarks/bwd_chunks.py [--rounds 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", default=".")
    args = p.parse_args(argv)
    import torch
    import triton.testing as tt

    from kernelops import flash_attention
    from kernelops.kernels.flash_attention import bwd_fused
    from kernelops.kernels.flash_attention.bwd_ws import launch_order

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for rnd in range(args.rounds):
        for D in (128, 64):
            for causal in (True, False):
                for S in (512, 1024, 2048, 4096):
                    B, H = 16384 // S, 2048 // D
                    torch.manual_seed(0)
                    q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                    out, lse = flash_attention(q, k, v, causal=causal, return_lse=True)
                    dout = torch.randn_like(out)
                    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
                    dq, dk, dv = (torch.empty_like(t) for t in (q, k, v))
                    rule = launch_order(B * H, S, sms)[0]
                    ms = {}
                    for c in sorted({rule, 1, 2, 4, 8, 16, 32, 64, B * H}):
                        def call(c=c):
                            bwd_fused.flash_attention_bwd_fused(q, k, v, dout, lse, delta, dq, dk, dv,
                                                                softmax_scale=D ** -0.5, causal=causal, chunk=c)
                        ms[c] = tt.do_bench(call, warmup=20, rep=150, return_mode="median")
                    best = min(ms, key=ms.get)
                    print(f"r{rnd} D={D} {'causal' if causal else 'full  '} S={S:5d} rule={rule:3d} "
                          f"{ms[rule] * 1e3:7.1f}us best={best:3d} {ms[rule] / ms[best]:.3f}x  "
                          + " ".join(f"{c}:{ms[c] / ms[rule]:.3f}" for c in ms), flush=True)
                    rows.append(dict(rnd=rnd, D=D, causal=causal, S=S, rule=rule, ms=ms))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bwd_chunk_sweep.json").write_text(json.dumps(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

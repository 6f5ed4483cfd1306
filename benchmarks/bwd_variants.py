"""Backward tiles side by side with cuDNN SDPA's backward, in one process.

Commit 4ad976d also timed a split dK/dV variant (``--split``: dV and dK in two passes), removed
after it measured 0.93-0.98x the fused kernel at D=256 (results/NVIDIA_H100_80GB_HBM3/
bwd_variants_split_d256.json, NOTES v20).

Commit f0ce87c also timed an atomic-dQ variant (removed after this measurement showed no gain:
results/NVIDIA_H100_80GB_HBM3/bwd_variants.json, benchmarks/NOTES.md v15).

bf16, B*S = 16k tokens, H*D = 2048, causal and not. Each variant at the fastest of the listed
BwdParams tiles. Backward FLOPs = 2.5x the forward's 4*B*H*S*S*D (half when causal); cuDNN's
backward time is its forward+backward time minus its forward time, both measured here.

    python benchmarks/bwd_variants.py --out $OUT [--dims 64 128] [--seqs 2048 8192 16384]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

BIG = 1 << 30
TILES = {  # (q_blocksize, kv_blocksize, num_warps, num_stages)
    64: [(32, 128, 4, 3), (64, 128, 8, 3), (64, 64, 4, 2), (32, 64, 4, 3)],
    128: [(64, 128, 8, 3), (64, 64, 4, 2), (32, 128, 8, 3), (64, 128, 8, 2), (32, 64, 4, 3)],
    256: [(64, 64, 8, 2), (64, 32, 8, 2)],
}


def main(argv=None) -> int:
    import triton
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from kernelops.kernels.flash_attention.bwd import flash_attention_bwd
    from kernelops.kernels.flash_attention.fwd import flash_attention_fwd

    p = argparse.ArgumentParser()
    p.add_argument("--out", default=".")
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--seqs", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--budget-s", type=float, default=300)
    args = p.parse_args(argv)
    t0 = time.time()
    rows = []

    def bench(fn):
        try:
            fn()
            return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            return f"{type(exc).__name__}: {str(exc)[:160]}"

    for D in args.dims:
        for causal in (False, True):
            for S in args.seqs:
                if time.time() - t0 > args.budget_s:
                    print("budget reached", flush=True)
                    break
                B, H = max(1, 16384 // S), 2048 // D
                q, k, v, do = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
                band = dict(softmax_scale=D ** -0.5, win_left=BIG, win_right=0 if causal else BIG, softcap=None)
                fwd_tile = (128, 64, 8, 3) if D <= 128 else (64, 64, 4, 2)
                out, lse = flash_attention_fwd(q, k, v, **band, q_blocksize=fwd_tile[0], kv_blocksize=fwd_tile[1],
                                               num_warps=fwd_tile[2], num_stages=fwd_tile[3])
                flops = 2.5 * 4 * B * H * S * S * D / (2 if causal else 1)
                row = {"D": D, "causal": causal, "S": S, "B": B, "H": H}
                for t in TILES[D]:
                    prm = dict(q_blocksize=t[0], kv_blocksize=t[1], num_warps=t[2], num_stages=t[3])
                    row[f"two-kernel {t}"] = bench(lambda: flash_attention_bwd(q, k, v, out, do, lse, **band, **prm))
                qt, kt, vt, dot = (x.transpose(1, 2).contiguous() for x in (q, k, v, do))
                for x in (qt, kt, vt):
                    x.requires_grad_(True)

                def fwd():
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        return sdpa(qt, kt, vt, is_causal=causal)

                f_ms = bench(lambda: fwd().detach())
                fb_ms = bench(lambda: fwd().backward(dot))
                if isinstance(f_ms, float) and isinstance(fb_ms, float):
                    row["cudnn_bwd"] = fb_ms - f_ms
                tf = {name: flops / ms / 1e9 for name, ms in row.items() if isinstance(ms, float)}
                row["tflops"] = tf
                best = {fam: max(((n, x) for n, x in tf.items() if n.startswith(fam)), key=lambda nx: nx[1],
                                 default=(None, 0.0)) for fam in ("two-kernel",)}
                print(f"D={D:3d} causal={int(causal)} S={S:6d} bwd TFLOP/s: two-kernel {best['two-kernel'][1]:6.1f} "
                      f"{best['two-kernel'][0]} | "
                      f"cudnn {tf.get('cudnn_bwd', float('nan')):6.1f}", flush=True)
                rows.append(row)
    out_dir = pathlib.Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "bwd_variants.json").write_text(json.dumps({
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""FP8 (e4m3) forward beside the bf16 forward and cuDNN SDPA (bf16), in one process.

Accuracy first: e4m3 inputs quantised with per-tensor scales, against float64 on the
dequantised inputs, next to the error of an emulation that rounds P to e4m3 the same way (the
error the method itself costs), for the TMA kernel and the warp-specialised one. Then time:
B*S = 16k tokens, H*D = 2048, D = 128 (``--head-dims``), causal and not, S = 1k..16k; the
warp-specialised FP8 kernel (``fp8_ws``, at two ring depths) and the TMA kernel at the fastest
of a few tiles. FLOPs 4*B*H*S*S*D (half when causal).

    python benchmarks/fp8_forward.py --out benchmarks/results
"""

from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

BIG = 1 << 30
FP8_CONFIGS = [(128, 128, 8, 3), (128, 64, 4, 3), (128, 128, 4, 3), (64, 128, 4, 3), (128, 128, 8, 4)]


def quantize(t: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Per-tensor e4m3 quantisation: ``(t / scale).to(e4m3)`` with ``scale = amax / 448``."""
    scale = max(t.abs().max().item() / 448.0, 1e-12)
    return (t / scale).to(torch.float8_e4m3fn), scale


def accuracy(D: int, causal: bool, kernel: str) -> dict:
    from kernelops.kernels.flash_attention.fwd_tma import flash_attention_fwd_tma
    from kernelops.kernels.flash_attention.fwd_ws_fp8 import flash_attention_fwd_ws_fp8

    q, k, v = (torch.randn(2, 1000, 4, D, device="cuda") for _ in range(3))
    (q8, sq), (k8, sk), (v8, sv) = quantize(q), quantize(k), quantize(v)
    wr = 0 if causal else BIG
    if kernel == "ws":
        out, _ = flash_attention_fwd_ws_fp8(q8, k8, v8, softmax_scale=D ** -0.5, causal=causal, descale=(sq, sk, sv))
    else:
        out, _ = flash_attention_fwd_tma(q8, k8, v8, softmax_scale=D ** -0.5, win_left=BIG, win_right=wr,
                                         softcap=None, q_blocksize=128, kv_blocksize=128, num_warps=8, num_stages=3,
                                         descale=(sq, sk, sv))
    qd, kd, vd = ((t8.double() * s).transpose(1, 2) for t8, s in ((q8, sq), (k8, sk), (v8, sv)))
    hide = torch.ones(1000, 1000, device="cuda", dtype=torch.bool).triu(1) if causal else None
    s = qd @ kd.mT * D ** -0.5
    if causal:
        s = s.masked_fill(hide, float("-inf"))
    p = torch.exp(s - s.amax(-1, keepdim=True))
    ref = (p @ vd) / p.sum(-1, keepdim=True)
    p8 = (p * 256).to(torch.float8_e4m3fn).double() / 256
    emu = (p8 @ vd) / p.sum(-1, keepdim=True)
    s_real = q.double().transpose(1, 2) @ k.double().transpose(1, 2).mT * D ** -0.5
    if causal:
        s_real = s_real.masked_fill(hide, float("-inf"))
    real = torch.softmax(s_real, -1) @ v.double().transpose(1, 2)
    rel = lambda a, b: ((a - b).norm() / b.norm()).item()  # noqa: E731
    return {"D": D, "causal": causal, "kernel": kernel, "kernel_vs_dequantised": rel(out.double().transpose(1, 2), ref),
            "emulated_p_rounding": rel(emu, ref), "kernel_vs_unquantised": rel(out.double().transpose(1, 2), real)}


def main(argv=None) -> int:
    import triton
    import triton.testing
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from kernelops import flash_attention
    from kernelops.kernels.flash_attention.fwd_tma import flash_attention_fwd_tma
    from kernelops.kernels.common.transpose import transpose_seq
    from kernelops.kernels.flash_attention.fwd_ws_fp8 import flash_attention_fwd_ws_fp8

    p = argparse.ArgumentParser()
    p.add_argument("--out", default="benchmarks/results")
    p.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    p.add_argument("--head-dims", type=int, nargs="+", default=[128])
    p.add_argument("--tma-configs", type=int, default=len(FP8_CONFIGS), help="how many of FP8_CONFIGS to time")
    p.add_argument("--name", default="fp8_forward", help="the results file's name (without .json)")
    args = p.parse_args(argv)
    acc = [accuracy(D, c, kernel) for D in args.head_dims for c in (False, True) for kernel in ("tma", "ws")]
    for a in acc:
        print(f"fp8 accuracy {a['kernel']} D={a['D']} causal={int(a['causal'])}: kernel vs dequantised float64 "
              f"{a['kernel_vs_dequantised']:.2e} (P rounding alone {a['emulated_p_rounding']:.2e}); "
              f"vs unquantised inputs {a['kernel_vs_unquantised']:.2e}", flush=True)

    def bench(fn):
        try:
            fn()
            return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median")
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            return f"{type(exc).__name__}: {str(exc)[:160]}"

    rows = []
    for D, causal, S in ((D, c, S) for D in args.head_dims for c in (False, True) for S in args.seqs):
        B, H = max(1, 16384 // S), 2048 // D
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        (q8, sq), (k8, sk), (v8, sv) = quantize(q), quantize(k), quantize(v)
        flops = 4 * B * H * S * S * D / (2 if causal else 1)
        row = {"D": D, "causal": causal, "S": S, "B": B, "H": H}
        with torch.no_grad():
            row["bf16_kernelops"] = bench(lambda: flash_attention(q, k, v, causal=causal))

            def cudnn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return sdpa(qt, kt, vt, is_causal=causal)
            row["bf16_cudnn"] = bench(cudnn)
            for stages in (2, 3):
                row[f"fp8_ws s{stages}"] = bench(lambda: flash_attention_fwd_ws_fp8(  # noqa: B023
                    q8, k8, v8, softmax_scale=D ** -0.5, causal=causal, descale=(sq, sk, sv),  # noqa: B023
                    num_stages=stages, kv_blocksize=64 if D == 256 else 128))  # noqa: B023
            v8t = transpose_seq(v8)  # the kernel alone, V^T made beforehand (as a cache that keeps V^T would)
            row["fp8_ws s3 given V^T"] = bench(lambda: flash_attention_fwd_ws_fp8(
                q8, k8, v8, softmax_scale=D ** -0.5, causal=causal, descale=(sq, sk, sv), num_stages=3,
                kv_blocksize=64 if D == 256 else 128, v_t=v8t))
            transpose_ms = bench(lambda: transpose_seq(v8))
            for cfg in FP8_CONFIGS[:args.tma_configs]:
                bm, bn, w, st = cfg
                row[f"fp8 {cfg}"] = bench(lambda: flash_attention_fwd_tma(
                    q8, k8, v8, softmax_scale=D ** -0.5, win_left=BIG, win_right=0 if causal else BIG,
                    softcap=None, q_blocksize=bm, kv_blocksize=bn, num_warps=w, num_stages=st,
                    descale=(sq, sk, sv)))
        row["tflops"] = {name: flops / ms / 1e9 for name, ms in row.items() if isinstance(ms, float)}
        row["v_transpose_ms"] = transpose_ms
        fp8 = {n: t for n, t in row["tflops"].items() if n.startswith("fp8 (")}
        best = max(fp8, key=fp8.get) if fp8 else None
        tf = row["tflops"]
        print(f"D={D} causal={int(causal)} S={S:6d} bf16 kernelops {tf.get('bf16_kernelops', 0):6.1f} "
              f"cudnn {tf.get('bf16_cudnn', 0):6.1f} | fp8 ws s2 {tf.get('fp8_ws s2', 0):6.1f} "
              f"s3 {tf.get('fp8_ws s3', 0):6.1f} given V^T {tf.get('fp8_ws s3 given V^T', 0):6.1f} "
              f"(V^T {transpose_ms * 1e3 if isinstance(transpose_ms, float) else 0:5.1f} us) | fp8 tma best "
              f"{fp8.get(best, 0):6.1f} {best}", flush=True)
        rows.append(row)
    out = pathlib.Path(args.out) / torch.cuda.get_device_name().replace(" ", "_")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps({
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "accuracy": acc, "rows": rows}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How the warp-specialised forward forms tanh for a soft cap (``fwd_ws.SOFTCAP_MODE``), timed and
checked against float64 in one run (GPU, NOTES v54).

Per shape (bf16, ``B*S = 16k`` tokens, ``H * D = 2048``, causal, optionally a left window) this times
``fwd_ws.flash_attention_fwd_ws`` without a cap and with the cap under each mode (1: ``cap - 2 cap /
(1 + e^(2x))`` from an exp2 and a reciprocal, 2: the MUFU's ``tanh.approx.f32``), and the Triton TMA
kernel with the cap (its tanh in plain float32 operations, ``masking.tanh``), as
``triton.testing.do_bench`` medians of kernel time; then, on the first sequence's first two heads,
each capped output's and lse's error against float64 (the scores of the bf16 inputs, capped, masked
and normalised in float64): relative L2 error of O, max abs error of O and of the lse.

    python benchmarks/fwd_ws_softcap.py [--dims 64 128 256] [--seq 8192] [--windows none 4096]
        [--softcap 50] [--gain 1] > results/<DEVICE>/fwd_ws_softcap.txt

``--gain`` scales the softmax scale (``gain / sqrt(D)``): with 4, logits spread over about +-4 standard
deviations of 4, so a cap of 5-10 bends most of them.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

TOKENS = 16384


def float64_reference(q, k, v, scale, cap, window):
    """``(out [Sq, H, D], lse [H, Sq])`` of one sequence ``q/k/v [S, H, D]`` in float64 (causal, capped)."""
    qd, kd, vd = (t.double().transpose(0, 1) for t in (q, k, v))
    s = scale * qd @ kd.transpose(1, 2)
    s = cap * torch.tanh(s / cap)
    i = torch.arange(q.shape[0], device=q.device)
    keep = i[None, :] <= i[:, None]
    if window is not None:
        keep &= i[:, None] - i[None, :] <= window
    s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, -1)
    return (torch.exp(s - lse[..., None]) @ vd).transpose(0, 1), lse


def main(argv=None) -> int:
    import triton.testing

    from kernelops.kernels.flash_attention import fwd_ws
    from kernelops.kernels.flash_attention.fwd_tma import flash_attention_fwd_tma

    p = argparse.ArgumentParser()
    p.add_argument("--dims", nargs="+", type=int, default=[64, 128, 256])
    p.add_argument("--seq", type=int, default=8192)
    p.add_argument("--windows", nargs="+", type=lambda w: None if w == "none" else int(w), default=[None, 4096])
    p.add_argument("--softcap", type=float, default=50.0)
    p.add_argument("--gain", type=float, default=1.0)
    args = p.parse_args(argv)
    cap, S = args.softcap, args.seq
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}; bf16, "
          f"{TOKENS} tokens, H*D=2048, causal, cap {cap:g}, scale {args.gain:g}/sqrt(D); kernel ms (median), "
          f"TFLOP/s of the visible pairs; errors vs float64 on 2 heads of sequence 0")
    for D in args.dims:
        H = 2048 // D
        scale = args.gain / math.sqrt(D)
        q, k, v = (torch.randn(TOKENS // S, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for window in args.windows:
            w = S if window is None else window + 1
            pairs = (TOKENS // S) * (S * w - w * (w - 1) // 2)
            flops = 4 * H * D * pairs
            ref_out, ref_lse = float64_reference(q[0, :, :2], k[0, :, :2], v[0, :, :2], scale, cap, window)
            left = (1 << 30) if window is None else window
            runs = {"ws no cap": lambda: fwd_ws.flash_attention_fwd_ws(q, k, v, softmax_scale=scale, causal=True,
                                                                       window=window)}
            for mode in (1, 2):
                def ws(mode=mode):
                    default, fwd_ws.SOFTCAP_MODE = fwd_ws.SOFTCAP_MODE, mode
                    try:
                        return fwd_ws.flash_attention_fwd_ws(q, k, v, softmax_scale=scale, causal=True, window=window,
                                                             softcap=cap)
                    finally:
                        fwd_ws.SOFTCAP_MODE = default
                runs[f"ws cap mode {mode}"] = ws
            runs["tma cap"] = lambda: flash_attention_fwd_tma(
                q, k, v, softmax_scale=scale, win_left=left, win_right=0, softcap=cap,
                **(dict(q_blocksize=128, kv_blocksize=64, num_warps=8, num_stages=3) if D <= 128 else
                   dict(q_blocksize=64, kv_blocksize=64, num_warps=4, num_stages=2)))
            for name, fn in runs.items():
                out, lse = fn()
                ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")
                line = f"D={D:3d} W={str(window):5s} {name:14s} {ms:7.3f} ms {flops / ms / 1e9:6.1f} TFLOP/s"
                if "cap" in name and "no cap" not in name:
                    o, l = out[0, :, :2].double(), lse[0, :2].double()
                    rel = ((o - ref_out).norm() / ref_out.norm()).item()
                    line += (f"  O rel {rel:.2e} max {(o - ref_out).abs().max().item():.2e}"
                             f"  lse max {(l - ref_lse).abs().max().item():.2e}")
                print(line, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

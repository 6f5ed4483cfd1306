"""Does the persistent dense forward lose its last, partly filled round at short S? (GPU)

D=128, bf16, BSHD, full and causal, S = 512 to 4k. For each S, batch and head counts whose
128-row tiles (``B * H * S / 128``) fill the 132 SMs' rounds in different fractions: a whole
number of rounds (``B * H * S / 128 = 16 * 132``), just over (15.03 rounds: the last one 3% full)
and between. If the last round cost a whole round, TFLOP/s would drop by up to 6% between the
whole and the 15.03-round shapes. kernelops (``flash_attention``, heuristic or shipped configs)
beside SDPA's cuDNN backend, each timed twice (``do_bench``, median, best of two). Prints one line
a row; NOTES v61 has the outcome (``results/NVIDIA_H200/fwd_rounds.txt``).

    python benchmarks/fwd_rounds.py
"""

from __future__ import annotations

import torch

D = 128
SHAPES = ((512, ((32, 16), (33, 16), (31, 16))), (1024, ((16, 16), (33, 8), (31, 8), (17, 16))),
          (2048, ((8, 16), (33, 4), (31, 4), (9, 16))), (4096, ((4, 16), (33, 2), (31, 2))))


def main() -> int:
    import triton.testing as tt
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    from kernelops import flash_attention
    from kernelops.kernels.common.host import num_sms

    sms = num_sms(torch.device("cuda"), 0)
    for S, shapes in SHAPES:
        for B, H in shapes:
            for causal in (False, True):
                q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                qt, kt, vt = (t.transpose(1, 2).contiguous() for t in (q, k, v))
                flops = 4 * B * H * S * S * D / (2 if causal else 1)
                flash_attention(q, k, v, causal=causal)
                ours, cudnn = [], []
                for _ in range(2):
                    ours.append(flops / tt.do_bench(lambda: flash_attention(q, k, v, causal=causal),  # noqa: B023
                                                    warmup=25, rep=200, return_mode="median") / 1e9)
                    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                        cudnn.append(flops / tt.do_bench(lambda: sdpa(qt, kt, vt, is_causal=causal),  # noqa: B023
                                                         warmup=25, rep=200, return_mode="median") / 1e9)
                tiles = B * H * (S // 128)
                print(f"S={S:5d} B={B:2d} H={H:2d} causal={int(causal)} tiles={tiles:5d} rounds={tiles / sms:6.2f} "
                      f"kernelops {max(ours):6.1f} cudnn {max(cudnn):6.1f} ratio {max(ours) / max(cudnn):.3f}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

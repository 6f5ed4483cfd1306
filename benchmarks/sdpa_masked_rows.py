"""What torch's SDPA backends return for a query whose every key is masked (GPU).

bf16, fp16 and fp32, B=1, H=4, Sq=64, Sk=96, D=64, query row 5 fully masked, by a boolean mask and
by the same mask as a 0 / -inf float mask; per backend (math, memory-efficient, cuDNN, flash) the
largest magnitude in that row's output, "nan", or the refusal. kernelops gives 0 there (docs/ops/
scaled_dot_product_attention.md). Result of session 40 (torch 2.11, H200):
``results/NVIDIA_H200/sdpa_masked_rows_s40.txt``.

    python benchmarks/sdpa_masked_rows.py
"""
import torch
from torch.nn.attention import sdpa_kernel, SDPBackend
import torch.nn.functional as F
torch.manual_seed(0)
for dt in (torch.bfloat16, torch.float16, torch.float32):
    q = torch.randn(1, 4, 64, 64, device="cuda", dtype=dt); k = torch.randn(1, 4, 96, 64, device="cuda", dtype=dt); v = torch.randn_like(k)
    m = torch.ones(1, 1, 64, 96, dtype=torch.bool, device="cuda"); m[..., 5, :] = False
    fm = torch.zeros(1, 1, 64, 96, device="cuda", dtype=dt).masked_fill(~m, float("-inf"))
    for name, be in (("math", SDPBackend.MATH), ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        for mk, mask in (("bool", m), ("float", fm)):
            try:
                with sdpa_kernel(be):
                    o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                row = o[0, :, 5]
                print(dt, name, mk, "nan" if row.isnan().any().item() else f"max|row|={row.abs().max().item():.3g}")
            except Exception as e:
                print(dt, name, mk, "refused:", str(e).splitlines()[0][:80])

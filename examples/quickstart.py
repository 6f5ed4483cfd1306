"""Quickstart: flash_attention forward and backward, and what the executor chose.

Runs on a GPU (Triton kernels) or on a CPU (the torch platform), small sizes:

    python examples/quickstart.py
"""

import torch

import kernelops
from kernelops import FlashAttention, flash_attention
from kernelops.ops import default_executor


def main() -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q = torch.randn(2, 256, 8, 64, device=device, dtype=dtype, requires_grad=True)   # [B, Sq, Hq, D]
    k = torch.randn(2, 256, 2, 64, device=device, dtype=dtype, requires_grad=True)   # [B, Sk, Hkv, D]: GQA 8/2
    v = torch.randn_like(k, requires_grad=True)

    out = flash_attention(q, k, v, causal=True, sliding_window=(128, 0))
    out.float().pow(2).mean().backward()
    print(f"kernelops {kernelops.__version__} on {device}: out {tuple(out.shape)}, "
          f"|dq| {q.grad.float().norm():.3f}, |dk| {k.grad.float().norm():.3f}")
    print(default_executor().explain(FlashAttention(), query=q, key=k, value=v, causal=True,
                                     sliding_window=(128, 0)))


if __name__ == "__main__":
    main()

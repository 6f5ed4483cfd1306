"""Quickstart: flash_attention forward and backward, checked against float64, and what the executor chose.

Runs on a GPU (Triton kernels, bfloat16) or on a CPU (the torch platform, float32), small sizes:

    python examples/quickstart.py
"""

import torch
import torch.nn.functional as F

import kernelops
from kernelops import FlashAttention, flash_attention
from kernelops.ops import default_executor

WINDOW = 128  # sliding_window=(WINDOW, 0): query i sees keys i - WINDOW .. i


def reference(q, k, v):
    """The same attention in float64 with torch's SDPA and an explicit causal + window mask (BSHD in and out)."""
    qh, kh, vh = (t.double().transpose(1, 2) for t in (q, k, v))           # [B, H, S, D]
    i = torch.arange(q.shape[1], device=q.device)[:, None]
    j = torch.arange(k.shape[1], device=q.device)[None, :]
    mask = (j <= i) & (j >= i - WINDOW)
    return F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, enable_gqa=True).transpose(1, 2)


def relative_error(got, want) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


def main() -> dict:
    """Prints what it did; returns the errors against float64 (``out`` and the gradients) and the dtype."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q = torch.randn(2, 256, 8, 64, device=device, dtype=dtype, requires_grad=True)   # [B, Sq, Hq, D]
    k = torch.randn(2, 256, 2, 64, device=device, dtype=dtype, requires_grad=True)   # [B, Sk, Hkv, D]: GQA 8/2
    v = torch.randn_like(k, requires_grad=True)

    out = flash_attention(q, k, v, causal=True, sliding_window=(WINDOW, 0))
    out.float().pow(2).mean().backward()
    print(f"kernelops {kernelops.__version__} on {device}: out {tuple(out.shape)}, "
          f"|dq| {q.grad.float().norm():.3f}, |dk| {k.grad.float().norm():.3f}")

    # the same call in float64: output and gradients of the same loss
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = reference(q64, k64, v64)
    ref.pow(2).mean().backward()
    errors = {"out": relative_error(out.detach(), ref.detach())}
    errors.update({name: relative_error(t.grad, t64.grad) for name, t, t64 in
                   (("dq", q, q64), ("dk", k, k64), ("dv", v, v64))})
    print("relative error against float64: " + ", ".join(f"{name} {err:.1e}" for name, err in errors.items()))

    print(default_executor().explain(FlashAttention(), query=q, key=k, value=v, causal=True,
                                     sliding_window=(WINDOW, 0)))
    return {"errors": errors, "dtype": dtype}


if __name__ == "__main__":
    main()

"""Sequence-minor copies of BSHD tensors: ``[B, S, H, D] -> [B, H, D, S_pad]``.

Hopper's FP8 matrix instructions take K-major operands only, so the FP8 forwards read V as V^T
tiles. torch's strided copy of a one-byte permute runs far under the memory bandwidth; this
kernel moves ``[BLOCK_S, D]`` tiles (rows read whole, D contiguous) and writes them transposed
(``S`` contiguous), both coalesced, and zero-fills the padding ``S .. S_pad``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelops.kernels.common.host import cdiv, interpreting, on_input_device

#: the padded sequence length is a multiple of this many elements (16 bytes for FP8: TMA's row stride)
PAD = 16
BLOCK_S = 64


@triton.jit
def _transpose_kernel(X, Y, seq, seq_pad, heads, stride_xb, stride_xs, stride_xh, HEAD_DIM: tl.constexpr,
                      BLOCK: tl.constexpr):
    bh = tl.program_id(0)  # (B * H on the grid's first axis: the others stop at 65535)
    s0 = tl.program_id(1) * BLOCK
    b = bh // heads
    h = (bh % heads).to(tl.int64)
    rows = s0 + tl.arange(0, BLOCK)
    cols = tl.arange(0, HEAD_DIM)
    x = tl.load(X + b.to(tl.int64) * stride_xb + h * stride_xh + rows[:, None].to(tl.int64) * stride_xs
                + cols[None, :], mask=(rows < seq)[:, None], other=0.0)
    y = Y + bh.to(tl.int64) * HEAD_DIM * seq_pad + cols[:, None] * seq_pad + rows[None, :]
    tl.store(y, tl.trans(x), mask=(rows < seq_pad)[None, :])


@on_input_device
def transpose_seq(x: torch.Tensor) -> torch.Tensor:
    """``x [B, S, H, D]`` (``stride(3) == 1``, D a power of two on CUDA) copied into a contiguous
    ``[B, H, D, S_pad]`` (``S_pad``: S rounded up to :data:`PAD`; zeros past S). CPU tensors
    take torch's copy (outside Triton's interpreter)."""
    B, S, H, D = x.shape
    s_pad = cdiv(S, PAD) * PAD
    y = torch.empty((B, H, D, s_pad), dtype=x.dtype, device=x.device)
    if not (x.is_cuda or interpreting()) or x.stride(3) != 1 or D & (D - 1) or y.numel() == 0:
        y[..., :S].copy_(x.permute(0, 2, 3, 1))
        y[..., S:].zero_()
        return y
    _transpose_kernel[(B * H, cdiv(s_pad, BLOCK_S))](x, y, S, s_pad, H, x.stride(0), x.stride(1), x.stride(2),
                                                     HEAD_DIM=D, BLOCK=BLOCK_S, num_warps=4)
    return y

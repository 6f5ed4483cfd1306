"""The Triton kernels' dropout keep mask, materialised, for tests and debugging.

``triton_keep_mask`` writes exactly the mask the Triton kernels draw (Philox per (batch, head)
seed, counter ``(j, i)`` for query row ``i`` and key column ``j``). The torch platform cannot run
Philox on every device, so it draws its own mask from torch generators, one per key chunk
(``reference.torch_keep_mask``). Each platform is reproducible from the seed; the two platforms'
masks differ.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernelops.kernels.common.host import cdiv, on_input_device
from kernelops.kernels.common.launch import direct_launch
from kernelops.kernels.flash_attention.fwd import dropout_keep, head_seed


@direct_launch
@triton.jit
def _keep_mask_kernel(Out, seed, dropout_p, num_heads, seq_q, seq_k, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pid_bh = tl.program_id(2)
    b = pid_bh // num_heads
    h = pid_bh % num_heads
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    keep = dropout_keep(rows[:, None], cols[None, :], head_seed(seed, b.to(tl.int64), h.to(tl.int64), num_heads),
                        dropout_p)
    ptrs = Out + pid_bh.to(tl.int64) * seq_q * seq_k + rows[:, None] * seq_k + cols[None, :]
    tl.store(ptrs, keep.to(tl.int8), mask=(rows[:, None] < seq_q) & (cols[None, :] < seq_k))


def triton_keep_mask(seed: int, dropout_p: float, batch: int, heads: int, seq_q: int, seq_k: int,
                     device) -> torch.Tensor:
    """Boolean ``[B, Hq, Sq, Sk]``: True where the Triton kernels keep the probability.

    For packed sequences, call it per sequence with ``batch = 1`` and index ``[seq]`` of a
    ``[num_seqs, ...]`` result: the kernels seed by (sequence, head).
    """
    out = torch.empty((batch, heads, seq_q, seq_k), dtype=torch.int8, device=device)
    _fill_keep_mask(out, seed, dropout_p)
    return out.bool()


@on_input_device
def _fill_keep_mask(out: torch.Tensor, seed: int, dropout_p: float) -> None:
    """Write the int8 keep mask into ``out [B, Hq, Sq, Sk]``."""
    batch, heads, seq_q, seq_k = out.shape
    grid = (cdiv(seq_q, 32), cdiv(seq_k, 32), batch * heads)
    _keep_mask_kernel[grid](out, seed, dropout_p, heads, seq_q, seq_k, BLOCK_M=32, BLOCK_N=32)

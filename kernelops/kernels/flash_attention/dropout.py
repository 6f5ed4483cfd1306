"""The dropout keep masks, materialised: for tests, debugging and the torch platform.

``triton_keep_mask`` writes exactly the mask the Triton kernels draw (Philox per (batch, head)
seed, counter ``(j, i)`` for query row ``i`` and key column ``j``). The torch platform cannot run
Philox on every device, so it draws its own mask from torch generators, one per key chunk,
seeded from the dropout seed (``torch_keep_mask`` gives the whole of it). Each platform is reproducible from the seed; the
two platforms' masks differ.
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


_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """A 64-bit mix (splitmix64's finaliser): every output bit depends on every input bit. The CPU
    generator keeps only the low 32 bits of its seed, so seeds must not differ in the high bits
    alone (before this, seeds ``s`` and ``s + 2**32`` drew one mask on the CPU)."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def torch_chunk_keep(seed: int, dropout_p: float, k0: int, shape, device) -> torch.Tensor:
    """The torch platform's keep mask for the key chunk starting at ``k0`` (``shape`` is the
    chunk's ``[B, Hkv, G, Sq, C]``)."""
    gen = torch.Generator(device=device).manual_seed(_mix64(seed * 1000003 + k0) >> 1)
    return torch.rand(shape, generator=gen, device=device) >= dropout_p


def torch_keep_mask(seed: int, dropout_p: float, batch: int, heads: int, kv_heads: int, seq_q: int, seq_k: int,
                    device, chunk: int | None = None) -> torch.Tensor:
    """Boolean ``[B, Hq, Sq, Sk]``: the torch platform's keep mask (its chunks concatenated)."""
    from kernelops.kernels.flash_attention import reference

    chunk = chunk or reference.DEFAULT_CHUNK
    group = heads // kv_heads
    parts = [torch_chunk_keep(seed, dropout_p, k0, (batch, kv_heads, group, seq_q, min(seq_k, k0 + chunk) - k0), device)
             for k0 in range(0, seq_k, chunk)]
    return torch.cat(parts, dim=-1).reshape(batch, heads, seq_q, seq_k)

"""Variable-length (packed) batches: block tables built on the device, without a host sync.

Sequences are packed along one token axis: ``q [total_q, H, D]`` with ``cum_seqlens_q [n + 1]``
(int32, starting at 0). A launch over packed sequences has one program per (tile of one
sequence, head). Its grid has ``total // block + n`` rows (an upper bound on
``sum(ceil(len_i / block))`` known from the shapes alone); row ``r`` looks up its sequence in
``block_seq[r]`` and its tile as ``r - block_start[seq]``, and rows past the real tiles get
sequence ``n`` and do nothing. Work is therefore ~ sum of lengths, never n x max length.
"""

from __future__ import annotations

import torch


def block_table(cum_seqlens: torch.Tensor, block: int, total: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``(block_seq [rows] int32, block_start [n + 1] int32, rows)`` for tiles of ``block`` tokens."""
    n = cum_seqlens.numel() - 1
    lens = (cum_seqlens[1:] - cum_seqlens[:-1]).to(torch.int64)
    block_start = torch.zeros(n + 1, dtype=torch.int64, device=cum_seqlens.device)
    block_start[1:] = torch.cumsum((lens + block - 1) // block, 0)
    rows = max(total // block + n, 1)
    block_seq = torch.searchsorted(block_start, torch.arange(rows, device=cum_seqlens.device), right=True) - 1
    return block_seq.to(torch.int32), block_start.to(torch.int32), rows


def dense_varlen_args(q: torch.Tensor) -> tuple:
    """Placeholder varlen kernel arguments for a dense launch: ``(CuQ, CuK, BlockSeq, BlockStart)``."""
    return q, q, q, q

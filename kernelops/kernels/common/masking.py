"""Triton helpers for banded attention masks (causal and sliding window).

Every attention kernel here uses one rule: query row ``i`` may attend key column ``j`` iff

    -win_left <= j - (i + q_shift) <= win_right      and      0 <= j < seq_k

where ``q_shift = seq_k - seq_q`` aligns causal masks bottom-right (flash-attn >= 2.1). Causal is
``win_right = 0``; "no window" is a bound larger than any sequence. The range helpers split a
block's loop into masked edges and an unmasked middle, so the mask arithmetic only runs on the
blocks that a mask actually cuts.
"""

import triton
import triton.language as tl


@triton.jit
def tanh(x):
    """float32 tanh, accurate to a few ulp, in plain tl ops (interpreter and every GPU).

    ``(1 - e) / (1 + e)`` with ``e = exp(-2|x|)`` cancels badly near 0, so |x| < 0.25 uses the
    odd Taylor series to x^11 instead (truncation error < 1e-10 there).
    """
    ax = tl.abs(x)
    e = tl.exp(-2.0 * ax)
    far = (1.0 - e) / (1.0 + e)
    x2 = x * x
    near = ax * (1.0 + x2 * (-0.3333333333333333 + x2 * (0.13333333333333333 + x2 * (
        -0.05396825396825397 + x2 * (0.021869488536155203 + x2 * -0.008863235529902197)))))
    r = tl.where(ax < 0.25, near, far)
    return tl.where(x < 0, -r, r)


@triton.jit
def band_mask(rows, cols, seq_q, seq_k, q_shift, win_left, win_right):
    """Which (query, key) pairs may attend, rows/cols in range included.

    ``rows`` and ``cols`` come already broadcast (``rows[:, None], cols[None, :]`` for a
    [queries, keys] tile, the other way round for a [keys, queries] tile).
    """
    rel = cols - (rows + q_shift)
    return (rel >= -win_left) & (rel <= win_right) & (rows < seq_q) & (cols < seq_k)


@triton.jit
def split_block_range(lo, full_lo, full_hi, hi, BLOCK: tl.constexpr):
    """Align the unmasked middle to blocks; an empty middle collapses onto ``hi``."""
    lo = tl.maximum(lo, 0) // BLOCK * BLOCK
    full_lo = tl.maximum(full_lo, lo)
    full_lo = (full_lo + BLOCK - 1) // BLOCK * BLOCK
    full_hi = full_hi // BLOCK * BLOCK
    if full_hi <= full_lo:
        full_lo = hi
        full_hi = hi
    return lo, full_lo, full_hi, hi


@triton.jit
def key_block_range(start_m, seq_q, seq_k, q_shift, win_left, win_right,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Key columns that rows [start_m, start_m + BLOCK_M) need, split for the masked/unmasked loops.

    Returns ``lo <= full_lo <= full_hi <= hi``: blocks in [lo, full_lo) and [full_hi, hi) need the
    mask, blocks in [full_lo, full_hi) are fully visible to every row of this query block.
    """
    last_row = tl.minimum(start_m + BLOCK_M, seq_q) - 1
    lo = start_m + q_shift - win_left
    hi = tl.minimum(seq_k, last_row + q_shift + win_right + 1)
    full_lo = last_row + q_shift - win_left
    full_hi = tl.minimum(start_m + q_shift + win_right + 1, seq_k)
    if start_m + BLOCK_M > seq_q:  # rows past seq_q need the row mask
        full_hi = full_lo
    return split_block_range(lo, full_lo, full_hi, hi, BLOCK_N)


@triton.jit
def query_block_range(start_n, seq_q, seq_k, q_shift, win_left, win_right,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Query rows that attend key columns [start_n, start_n + BLOCK_N), split like key_block_range."""
    last_col = tl.minimum(start_n + BLOCK_N, seq_k) - 1
    lo = start_n - q_shift - win_right
    hi = tl.minimum(seq_q, last_col - q_shift + win_left + 1)
    full_lo = last_col - q_shift - win_right
    full_hi = tl.minimum(start_n - q_shift + win_left + 1, seq_q)
    if start_n + BLOCK_N > seq_k:  # columns past seq_k need the column mask
        full_hi = full_lo
    return split_block_range(lo, full_lo, full_hi, hi, BLOCK_M)

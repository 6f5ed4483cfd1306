"""The balanced decode plan's program: one pipelined loop over a run of key blocks that crosses pairs.

A balanced plan (:func:`kernelops.kernels.flash_attention.decode.balanced_split`) lays the key
blocks of all (batch, KV head) pairs in a row, ``pair_blocks`` blocks of ``BLOCK_N`` keys each
from ``k0``, and gives program ``p`` blocks ``[p * per, p * per + per)``. A run starts inside one
pair and ends inside a later one. :func:`balanced_run` walks the whole run in one software-pipelined
loop: the K/V tiles of the next pair are in flight while the current pair's last tiles are
multiplied, where one loop per pair drained and refilled the pipeline at each pair boundary (the
DRAM's loaded latency: docs/performance.md). At a block that starts a pair (or the run) the
softmax state restarts (set, not rescaled, so a NaN in one pair's keys stays in that pair); at a
block that ends one (or the run) the program writes its piece of that pair to the workspace for the
combine launch (or, when every pair lies in one run, the finished rows).

A pair's last tile is moved back to end at ``k1`` (the keys it already took are masked out), so it
reads only keys of this sequence: no value rows past the sequence (the next sequence's keys, an
unwritten cache's garbage, or zeros past the tensor) reach ``P V``. Pairs shorter than a tile
(``SHORT``) zero those value rows instead.

Workspace layout as in :mod:`decode`: ``o_part [B * Hkv, slots, group * Sq, D]`` float32,
normalised; ``l_part [B * Hkv, slots, group * Sq]`` float32, log2 units.
"""

from __future__ import annotations

import triton
import triton.language as tl

from kernelops.kernels.common.masking import band_mask, tanh
from kernelops.kernels.flash_attention.fwd import join_sink


@triton.jit
def store_piece(acc, l_i, m_i, O, LSE, OPart, LPart, Sink, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, b,
                head, pos, bh, slots, piece, n_rows, r, offs_d, row_ok, d_ok, DIRECT: tl.constexpr,
                HAS_SINK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Finish a pair's piece ``acc [BLOCK_M, BLOCK_D]`` (unnormalised, running max ``m_i`` and sum
    ``l_i`` in log2 units). ``DIRECT`` (the pair's only piece): join the sink logits, normalise and
    store rows of ``out``/``lse`` (natural log); else normalise and store it with its lse (log2
    units; -inf for rows that saw no key) in workspace slot ``piece`` of pair ``bh``."""
    if DIRECT and HAS_SINK:
        sink = tl.load(Sink + head, mask=row_ok, other=0.0).to(tl.float32) * 1.4426950408889634
        acc, l_i, m_i = join_sink(acc, l_i, m_i, sink)
    empty = l_i == 0.0
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse2 = tl.where(empty, float("-inf"), m_i + tl.math.log2(tl.where(empty, 1.0, l_i)))
    ok = row_ok[:, None] & d_ok[None, :]
    if DIRECT:
        tl.store(O + b * stride_ob + pos[:, None].to(tl.int64) * stride_os + head[:, None] * stride_oh
                 + offs_d[None, :], out.to(O.dtype.element_ty), mask=ok)
        tl.store(LSE + b * stride_lb + head * stride_lh + pos, lse2 * 0.6931471805599453, mask=row_ok)
    else:
        part = (bh.to(tl.int64) * slots + piece) * n_rows + r
        tl.store(OPart + part[:, None] * HEAD_DIM + offs_d[None, :], out, mask=ok)
        tl.store(LPart + part, lse2, mask=row_ok)


@triton.jit
def _kv_tile(X, stride_xb, stride_xs, stride_xh, b, hk, start, seq_k, kv_pitch, kv_head_pitch, kv_head_col, offs_n,
             offs_d, d_ok, TMA: tl.constexpr):
    """Keys ``[start, start + BLOCK_N)`` of pair (b, hk): ``[BLOCK_N, BLOCK_D]`` through the
    descriptor ``X`` (rows ``b * kv_pitch + hk * kv_head_pitch + key``, columns from
    ``hk * kv_head_col``) or through pointers (zeros from ``seq_k`` on)."""
    if TMA:
        x = X.load([(b * kv_pitch + hk * kv_head_pitch + start).to(tl.int32), (hk * kv_head_col).to(tl.int32)])
    else:
        keys = start + offs_n
        x = tl.load(X + b * stride_xb + hk * stride_xh + keys[:, None].to(tl.int64) * stride_xs + offs_d[None, :],
                    mask=(keys < seq_k)[:, None] & d_ok[None, :], other=0.0)
    return x


@triton.jit
def balanced_run(Q, K, V, OPart, LPart, Sink, O, LSE, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
                 stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, num_kv_heads,
                 group, seq_q, seq_k, slots, k0, k1, per, total_blocks, win_left, win_right, kv_pitch, kv_head_pitch,
                 kv_head_col, qk_scale, softcap, SOFTCAP: tl.constexpr, DIRECT: tl.constexpr, TMA: tl.constexpr,
                 SHORT: tl.constexpr, HAS_SINK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, Q_EACH_BLOCK: tl.constexpr):
    """This program's run of key blocks, ``[pid * per, pid * per + per)`` of the ``total_blocks``
    blocks of all pairs (``cdiv(k1 - k0, BLOCK_N)`` each): each pair's piece goes to its workspace
    slot, ``pid - first program of the pair``, or with ``DIRECT`` (every pair in one run) to
    ``out``/``lse``. ``SHORT``: ``k1 - k0 < BLOCK_N``. ``Q_EACH_BLOCK``: the query rows are read
    with every block (the pipeliner has them in flight early; for short pairs) rather than at the
    start of each pair (for long ones: ``decode.Q_EACH_BLOCK_MAX``)."""
    pid = tl.program_id(0)
    pair_blocks = (k1 - k0 + BLOCK_N - 1) // BLOCK_N
    g_lo = pid * per
    g_hi = tl.minimum(g_lo + per, total_blocks)
    n_rows = group * seq_q
    r = tl.arange(0, BLOCK_M)
    pos = r // group                     # the query position of each row
    offs_d = tl.arange(0, BLOCK_D)
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    row_ok = r < n_rows
    q_shift = seq_k - seq_q
    full_lo = seq_q - 1 + q_shift - win_left                  # keys every row sees: [full_lo, full_hi)
    full_hi = tl.minimum(q_shift + win_right + 1, seq_k)
    q_rows = Q + pos[:, None].to(tl.int64) * stride_qs + (r % group)[:, None] * stride_qh + offs_d[None, :]
    q_ok = row_ok[:, None] & d_ok[None, :]
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    q = tl.zeros([BLOCK_M, BLOCK_D], dtype=Q.dtype.element_ty)
    for g in tl.range(g_lo, g_hi):
        bh = g // pair_blocks
        j = g - bh * pair_blocks
        hk = (bh % num_kv_heads).to(tl.int64)
        b = (bh // num_kv_heads).to(tl.int64)
        fresh = (j == 0) | (g == g_lo)   # the block starts a pair's piece
        q_at = q_rows + b * stride_qb + hk * group * stride_qh  # (a few KB, from L2 after the first read)
        if Q_EACH_BLOCK:
            q = tl.load(q_at, mask=q_ok, other=0.0)
        elif fresh:
            q = tl.load(q_at, mask=q_ok, other=0.0)
        lo = k0 + j * BLOCK_N            # this block's first new key
        start = lo if SHORT else tl.minimum(lo, k1 - BLOCK_N)
        k = _kv_tile(K, stride_kb, stride_ks, stride_kh, b, hk, start, seq_k, kv_pitch, kv_head_pitch, kv_head_col,
                     offs_n, offs_d, d_ok, TMA)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if SOFTCAP:
            s = tanh(qk * qk_scale) * softcap
        else:
            s = qk * qk_scale
        cols = start + offs_n
        if (start < lo) | (start < full_lo) | (start + BLOCK_N > full_hi):  # keys some row may not see
            seen = band_mask(pos[:, None], cols[None, :], seq_q, seq_k, q_shift, win_left, win_right)
            s = tl.where(seen & (cols >= lo)[None, :], s, float("-inf"))
        # a new pair: its own softmax state, set rather than rescaled (0 * NaN from a pair's bad value
        m_i = tl.where(fresh, float("-inf"), m_i)  # would otherwise reach the next pair)
        l_i = tl.where(fresh, 0.0, l_i)
        acc = tl.where(fresh, 0.0, acc)
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)      # a row with no key yet: exp2(-inf) = 0
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = _kv_tile(V, stride_vb, stride_vs, stride_vh, b, hk, start, seq_k, kv_pitch, kv_head_pitch, kv_head_col,
                     offs_n, offs_d, d_ok, TMA)
        if SHORT:  # rows past the sequence's keys: keep them out of 0 * v
            v = tl.where((cols < seq_k)[:, None], v, tl.zeros_like(v))
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
        if (j == pair_blocks - 1) | (g == g_hi - 1):  # the end of this program's piece of the pair
            piece = pid - (bh * pair_blocks) // per  # this program's slot among the pair's pieces
            store_piece(acc, l_i, m_i, O, LSE, OPart, LPart, Sink, stride_ob, stride_os, stride_oh, stride_lb,
                        stride_lh, b, hk * group + (r % group), pos, bh, slots, piece, n_rows, r, offs_d, row_ok, d_ok,
                        DIRECT, HAS_SINK, HEAD_DIM)

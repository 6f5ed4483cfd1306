"""Flash attention backward in Triton: recompute P from the saved log-sum-exp, no S x S storage.

Three launches:
1. ``delta = rowsum(out * dout) - dlse``  ``[B, Hq, Sq]`` float32 (``dlse``: gradient reaching
   the returned lse, when any).
2. ``flash_attention_bwd_dkdv_kernel``: one program per (key block, batch, KV head) accumulates
   dK and dV over every query head of its GQA group, so no atomics and a deterministic result.
3. ``flash_attention_bwd_dq_kernel``: one program per (query block, batch, query head).

Tiles (BwdParams): the dK/dV kernel holds ``kv_blocksize`` keys and walks queries
``q_blocksize`` at a time; the dQ kernel uses the mirrored tile, ``kv_blocksize`` queries held
and keys walked ``q_blocksize`` at a time, so one parameter set gives both kernels the
"large resident tile, small streamed tile" shape.
"""

import triton
import triton.language as tl

from kernelops.kernels.common.host import LAUNCH_OPTIONS, cdiv, next_pow2
from kernelops.kernels.common.launch import direct_launch
from kernelops.kernels.common.masking import band_mask, key_block_range, query_block_range, tanh
from kernelops.kernels.flash_attention.fwd import (
    SHAPE_ARGS, batch_strides, dot_precision, dropout_scale, extra_args, head_extras, head_seed,
    query_program, scale_args, score_mods, split_program,
)
from kernelops.kernels.flash_attention.varlen import packed_rows, sequence_of


@direct_launch
@triton.jit(do_not_specialize=["num_heads", "seq_q", "num_blocks", "delta_len"])
def _bwd_preprocess_kernel(O, DO, DLSE, DELTA, DQ_ACC, stride_ob, stride_os, stride_oh,
                           stride_db, stride_ds, stride_dh, num_heads, seq_q, num_blocks, delta_len,
                           HAS_DLSE: tl.constexpr, ZERO_DQ: tl.constexpr, HEAD_DIM: tl.constexpr,
                           BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr):
    """delta rows ``[BLOCK_M]`` of one (batch, head) (``DELTA`` rows of ``delta_len`` values: Sq, or
    packed sequences' padded rows); with ``ZERO_DQ`` also zeroes the same rows
    of the fused backward's float32 dQ workspace ``DQ_ACC`` (contiguous ``[B, Sq, H, D]``)."""
    pid_m, pid_bh = split_program(num_blocks)
    b = (pid_bh // num_heads).to(tl.int64)
    h = (pid_bh % num_heads).to(tl.int64)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (rows[:, None] < seq_q) & (offs_d[None, :] < HEAD_DIM)
    o = tl.load(O + b * stride_ob + h * stride_oh + rows[:, None].to(tl.int64) * stride_os + offs_d[None, :],
                mask=ok, other=0.0).to(tl.float32)
    do = tl.load(DO + b * stride_db + h * stride_dh + rows[:, None].to(tl.int64) * stride_ds + offs_d[None, :],
                 mask=ok, other=0.0).to(tl.float32)
    delta = tl.sum(o * do, 1)
    row_base = (b * num_heads + h) * seq_q
    if HAS_DLSE:
        delta -= tl.load(DLSE + row_base + rows, mask=rows < seq_q, other=0.0)
    tl.store(DELTA + (b * num_heads + h) * delta_len + rows, delta, mask=rows < seq_q)
    if ZERO_DQ:
        acc_rows = (b * seq_q + rows[:, None].to(tl.int64)) * num_heads + h
        tl.store(DQ_ACC + acc_rows * HEAD_DIM + offs_d[None, :], tl.zeros([BLOCK_M, BLOCK_D], tl.float32), mask=ok)


@triton.jit
def _load_row_stats(LSE, DELTA, rows, seq_q, MASKED: tl.constexpr):
    """lse in log2 units (+inf for rows that saw no key, so their P is 0) and delta."""
    if MASKED:
        lse = tl.load(LSE + rows, mask=rows < seq_q, other=0.0)
        delta = tl.load(DELTA + rows, mask=rows < seq_q, other=0.0)
    else:
        lse = tl.load(LSE + rows)
        delta = tl.load(DELTA + rows)
    return tl.where(lse == float("-inf"), float("inf"), lse * 1.4426950408889634), delta


@triton.jit
def _scores(qk, qk_scale, softcap, SOFTCAP: tl.constexpr):
    """Logits in log2 units and the tanh of the soft cap (1.0 placeholder without one)."""
    if SOFTCAP:
        t = tanh(qk * qk_scale)
        return t * softcap, t
    return qk * qk_scale, qk


@triton.jit
def _dkdv_block_loop(dk, dv, k, v, Q, DO, LSE, DELTA, stride_qs, stride_ds, Bias, stride_zm, stride_zn, slope,
                     QSeg, KSeg, cols, offs_d, lo, hi, seq_q, seq_k, q_shift, win_left, win_right, qk_scale, softcap,
                     seed_bh, dropout_p, MASKED: tl.constexpr, SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr,
                     HAS_ALIBI: tl.constexpr, HAS_SEG: tl.constexpr, HAS_DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr,
                     BLOCK_M: tl.constexpr, PRECISION: tl.constexpr):
    offs_m = tl.arange(0, BLOCK_M)
    d_ok = offs_d < HEAD_DIM
    for start_m in range(lo, hi, BLOCK_M):
        rows = start_m + offs_m
        ok = d_ok[None, :]
        if MASKED:
            ok = ok & (rows[:, None] < seq_q)
        q = tl.load(Q + rows[:, None].to(tl.int64) * stride_qs + offs_d[None, :], mask=ok, other=0.0)
        do = tl.load(DO + rows[:, None].to(tl.int64) * stride_ds + offs_d[None, :], mask=ok, other=0.0)
        lse2, delta = _load_row_stats(LSE, DELTA, rows, seq_q, MASKED)
        s, t = _scores(tl.dot(k, tl.trans(q), input_precision=PRECISION), qk_scale, softcap, SOFTCAP)  # [N, M]
        s = score_mods(s, rows[None, :], cols[:, None], Bias, stride_zm, stride_zn, slope, QSeg, KSeg, seq_q, seq_k,
                       q_shift, HAS_BIAS, HAS_ALIBI, HAS_SEG, MASKED)
        if MASKED:
            s = tl.where(band_mask(rows[None, :], cols[:, None], seq_q, seq_k, q_shift, win_left, win_right),
                         s, float("-inf"))
        p = tl.math.exp2(s - lse2[None, :])
        if HAS_DROPOUT:  # same Philox mask as the forward: dV = P_dropped^T dO, dP = dP_dropped * keep / (1 - p)
            dv = tl.dot(dropout_scale(p, rows[None, :], cols[:, None], seed_bh, dropout_p).to(do.dtype), do, dv,
                        input_precision=PRECISION)
            dp = dropout_scale(tl.dot(v, tl.trans(do), input_precision=PRECISION), rows[None, :], cols[:, None],
                               seed_bh, dropout_p)
        else:  # dV first, then dP: the order the H100 sweeps were measured with
            dv = tl.dot(p.to(do.dtype), do, dv, input_precision=PRECISION)
            dp = tl.dot(v, tl.trans(do), input_precision=PRECISION)
        ds = p * (dp - delta[None, :])
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dk = tl.dot(ds.to(q.dtype), q, dk, input_precision=PRECISION)
    return dk, dv


@triton.jit
def key_program(num_heads, group, seq_q, seq_k, num_blocks, CuQ, CuK, num_seqs,
                BLOCK_N: tl.constexpr, VARLEN: tl.constexpr):
    """The key tile a dK/dV program owns: ``(b, hk, start_n, seq_q, seq_k, q_start, k_start)``.

    Flat grid of ``num_blocks`` key blocks (varlen: packed rows of key tiles) per (batch, KV head).
    """
    blk, bh = split_program(num_blocks)
    if VARLEN:
        b, start_n, seq_q, seq_k, q_start, k_start = sequence_of(blk, CuK, CuQ, CuK, num_seqs, BLOCK_N)
        hk = bh.to(tl.int64)
    else:
        num_kv_heads = num_heads // group
        b = (bh // num_kv_heads).to(tl.int64)
        hk = (bh % num_kv_heads).to(tl.int64)
        start_n = blk * BLOCK_N
        q_start = b * 0
        k_start = b * 0
    return b, hk, start_n, seq_q, seq_k, q_start, k_start


@direct_launch
@triton.jit(do_not_specialize=SHAPE_ARGS)
def flash_attention_bwd_dkdv_kernel(
    Q, K, V, DO, LSE, DELTA, Bias, Alibi, Sink, QSeg, KSeg, CuQ, CuK, DK, DV,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_db, stride_ds, stride_dh,
    stride_zb, stride_zh, stride_zm, stride_zn, stride_ab, stride_sqb, stride_skb, stride_lb, stride_lh,
    stride_dkb, stride_dks, stride_dkh, stride_dvb, stride_dvs, stride_dvh,
    num_heads, group, seq_q, seq_k, num_blocks, num_seqs, win_left, win_right, qk_scale, softcap, seed, dropout_p,
    sm_scale, SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SINK: tl.constexpr,
    HAS_SEG: tl.constexpr, HAS_DROPOUT: tl.constexpr, VARLEN: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    b, hk, start_n, seq_q, seq_k, q_start, k_start = key_program(
        num_heads, group, seq_q, seq_k, num_blocks, CuQ, CuK, num_seqs, BLOCK_N, VARLEN)
    q_shift = seq_k - seq_q

    cols = start_n + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    kv_ok = (cols[:, None] < seq_k) & (offs_d[None, :] < HEAD_DIM)
    col_off = k_start + cols[:, None].to(tl.int64)
    k = tl.load(K + b * stride_kb + hk * stride_kh + col_off * stride_ks + offs_d[None, :], mask=kv_ok, other=0.0)
    v = tl.load(V + b * stride_vb + hk * stride_vh + col_off * stride_vs + offs_d[None, :], mask=kv_ok, other=0.0)
    dk = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)

    lo, full_lo, full_hi, hi = query_block_range(start_n, seq_q, seq_k, q_shift, win_left, win_right,
                                                 BLOCK_M, BLOCK_N)
    for g in range(0, group):
        h = hk * group + g
        Qh = Q + b * stride_qb + h * stride_qh + q_start * stride_qs
        DOh = DO + b * stride_db + h * stride_dh + q_start * stride_ds
        LSEh = LSE + b * stride_lb + h * stride_lh + q_start
        DELTAh = DELTA + b * stride_lb + h * stride_lh + q_start
        Bh, slope, QSegb, KSegb = head_extras(Bias, stride_zb, stride_zh, Alibi, stride_ab, QSeg, KSeg, stride_sqb,
                                              stride_skb, b, h, HAS_ALIBI)
        seed_bh = head_seed(seed, b, h, num_heads)
        dk, dv = _dkdv_block_loop(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, stride_qs, stride_ds, Bh, stride_zm,
                                  stride_zn, slope, QSegb, KSegb, cols, offs_d, lo, full_lo, seq_q, seq_k, q_shift,
                                  win_left, win_right, qk_scale, softcap, seed_bh, dropout_p, True, SOFTCAP,
                                  HAS_BIAS, HAS_ALIBI, HAS_SEG, HAS_DROPOUT, HEAD_DIM, BLOCK_M, PRECISION)
        dk, dv = _dkdv_block_loop(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, stride_qs, stride_ds, Bh, stride_zm,
                                  stride_zn, slope, QSegb, KSegb, cols, offs_d, full_lo, full_hi, seq_q, seq_k,
                                  q_shift, win_left, win_right, qk_scale, softcap, seed_bh, dropout_p, False,
                                  SOFTCAP, HAS_BIAS, HAS_ALIBI, HAS_SEG, HAS_DROPOUT, HEAD_DIM, BLOCK_M, PRECISION)
        dk, dv = _dkdv_block_loop(dk, dv, k, v, Qh, DOh, LSEh, DELTAh, stride_qs, stride_ds, Bh, stride_zm,
                                  stride_zn, slope, QSegb, KSegb, cols, offs_d, full_hi, hi, seq_q, seq_k, q_shift,
                                  win_left, win_right, qk_scale, softcap, seed_bh, dropout_p, True, SOFTCAP,
                                  HAS_BIAS, HAS_ALIBI, HAS_SEG, HAS_DROPOUT, HEAD_DIM, BLOCK_M, PRECISION)
    dk = dk * sm_scale
    tl.store(DK + b * stride_dkb + hk * stride_dkh + col_off * stride_dks + offs_d[None, :],
             dk.to(DK.dtype.element_ty), mask=kv_ok)
    tl.store(DV + b * stride_dvb + hk * stride_dvh + col_off * stride_dvs + offs_d[None, :],
             dv.to(DV.dtype.element_ty), mask=kv_ok)


@triton.jit
def _dq_block_loop(dq, q, do, lse2, delta, K, V, stride_ks, stride_vs, Bias, stride_zm, stride_zn, slope,
                   QSeg, KSeg, DBias, stride_gm, rows, offs_d, lo, hi, seq_q, seq_k, q_shift, win_left, win_right,
                   qk_scale, softcap, seed_bh, dropout_p, MASKED: tl.constexpr, SOFTCAP: tl.constexpr,
                   HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SEG: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                   BIAS_GRAD: tl.constexpr, HEAD_DIM: tl.constexpr,
                   BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        ok = d_ok[None, :]
        if MASKED:
            ok = ok & (cols[:, None] < seq_k)
        k = tl.load(K + cols[:, None].to(tl.int64) * stride_ks + offs_d[None, :], mask=ok, other=0.0)
        v = tl.load(V + cols[:, None].to(tl.int64) * stride_vs + offs_d[None, :], mask=ok, other=0.0)
        s, t = _scores(tl.dot(q, tl.trans(k), input_precision=PRECISION), qk_scale, softcap, SOFTCAP)  # [M, N]
        s = score_mods(s, rows[:, None], cols[None, :], Bias, stride_zm, stride_zn, slope, QSeg, KSeg, seq_q, seq_k,
                       q_shift, HAS_BIAS, HAS_ALIBI, HAS_SEG, MASKED)
        if MASKED:
            s = tl.where(band_mask(rows[:, None], cols[None, :], seq_q, seq_k, q_shift, win_left, win_right),
                         s, float("-inf"))
        p = tl.math.exp2(s - lse2[:, None])
        dp = tl.dot(do, tl.trans(v), input_precision=PRECISION)
        if HAS_DROPOUT:
            dp = dropout_scale(dp, rows[:, None], cols[None, :], seed_bh, dropout_p)
        ds = p * (dp - delta[:, None])
        if BIAS_GRAD:  # d loss / d bias = dS (each (b, h, i, j) is visited by exactly one program)
            ptrs = DBias + rows[:, None].to(tl.int64) * stride_gm + cols[None, :]
            if MASKED:
                tl.store(ptrs, ds, mask=(rows[:, None] < seq_q) & (cols[None, :] < seq_k))
            else:
                tl.store(ptrs, ds)
        if SOFTCAP:
            ds = ds * (1.0 - t * t)
        dq = tl.dot(ds.to(k.dtype), k, dq, input_precision=PRECISION)
    return dq


@direct_launch
@triton.jit(do_not_specialize=SHAPE_ARGS)
def flash_attention_bwd_dq_kernel(
    Q, K, V, DO, LSE, DELTA, Bias, Alibi, Sink, QSeg, KSeg, CuQ, CuK, DQ, DBias,
    stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh, stride_db, stride_ds, stride_dh,
    stride_zb, stride_zh, stride_zm, stride_zn, stride_ab, stride_sqb, stride_skb, stride_lb, stride_lh,
    stride_dqb, stride_dqs, stride_dqh,
    num_heads, group, seq_q, seq_k, num_blocks, num_seqs, win_left, win_right, qk_scale, softcap, seed, dropout_p,
    sm_scale, SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SINK: tl.constexpr,
    HAS_SEG: tl.constexpr, HAS_DROPOUT: tl.constexpr, VARLEN: tl.constexpr, BIAS_GRAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    b, h, hk, start_m, seq_q, seq_k, q_start, k_start = query_program(
        num_heads, group, seq_q, seq_k, num_blocks, CuQ, CuK, num_seqs, BLOCK_M, VARLEN)
    q_shift = seq_k - seq_q
    seed_bh = head_seed(seed, b, h, num_heads)

    rows = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    ok = (rows[:, None] < seq_q) & (offs_d[None, :] < HEAD_DIM)
    row_off = q_start + rows[:, None].to(tl.int64)
    q = tl.load(Q + b * stride_qb + h * stride_qh + row_off * stride_qs + offs_d[None, :], mask=ok, other=0.0)
    do = tl.load(DO + b * stride_db + h * stride_dh + row_off * stride_ds + offs_d[None, :], mask=ok, other=0.0)
    row_base = b * stride_lb + h * stride_lh + q_start
    lse2, delta = _load_row_stats(LSE + row_base, DELTA + row_base, rows, seq_q, True)
    K += b * stride_kb + hk * stride_kh + k_start * stride_ks
    V += b * stride_vb + hk * stride_vh + k_start * stride_vs
    dq = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    Bias, slope, QSeg, KSeg = head_extras(Bias, stride_zb, stride_zh, Alibi, stride_ab, QSeg, KSeg, stride_sqb,
                                          stride_skb, b, h, HAS_ALIBI)
    DBias += (b * num_heads + h) * seq_q * seq_k  # contiguous float32 [B, Hq, Sq, Sk] when BIAS_GRAD

    lo, full_lo, full_hi, hi = key_block_range(start_m, seq_q, seq_k, q_shift, win_left, win_right,
                                               BLOCK_M, BLOCK_N)
    dq = _dq_block_loop(dq, q, do, lse2, delta, K, V, stride_ks, stride_vs, Bias, stride_zm, stride_zn, slope,
                        QSeg, KSeg, DBias, seq_k, rows, offs_d, lo, full_lo, seq_q, seq_k, q_shift, win_left,
                        win_right, qk_scale, softcap, seed_bh, dropout_p, True, SOFTCAP, HAS_BIAS, HAS_ALIBI, HAS_SEG,
                        HAS_DROPOUT, BIAS_GRAD, HEAD_DIM, BLOCK_N, PRECISION)
    dq = _dq_block_loop(dq, q, do, lse2, delta, K, V, stride_ks, stride_vs, Bias, stride_zm, stride_zn, slope,
                        QSeg, KSeg, DBias, seq_k, rows, offs_d, full_lo, full_hi, seq_q, seq_k, q_shift, win_left,
                        win_right, qk_scale, softcap, seed_bh, dropout_p, False, SOFTCAP, HAS_BIAS, HAS_ALIBI, HAS_SEG,
                        HAS_DROPOUT, BIAS_GRAD, HEAD_DIM, BLOCK_N, PRECISION)
    dq = _dq_block_loop(dq, q, do, lse2, delta, K, V, stride_ks, stride_vs, Bias, stride_zm, stride_zn, slope,
                        QSeg, KSeg, DBias, seq_k, rows, offs_d, full_hi, hi, seq_q, seq_k, q_shift, win_left,
                        win_right, qk_scale, softcap, seed_bh, dropout_p, True, SOFTCAP, HAS_BIAS, HAS_ALIBI, HAS_SEG,
                        HAS_DROPOUT, BIAS_GRAD, HEAD_DIM, BLOCK_N, PRECISION)
    dq = dq * sm_scale
    tl.store(DQ + b * stride_dqb + h * stride_dqh + row_off * stride_dqs + offs_d[None, :],
             dq.to(DQ.dtype.element_ty), mask=ok)


def preprocess_launch(out4, dout4, dlse, delta, dq_acc=None):
    """``(kernel, grid, args, meta)`` of the delta kernel over ``out4/dout4 [B, Sq, H, D]`` (unit
    last stride), ``dlse`` (contiguous, or None) and ``delta [B, H, Sq]``; with ``dq_acc``
    (contiguous float32 ``[B, Sq, H, D]``) it zeroes that too."""
    B, Sq, Hq, D = out4.shape
    pre_m = 64
    args = (out4, dout4, dlse if dlse is not None else delta, delta, delta if dq_acc is None else dq_acc,
            out4.stride(0), out4.stride(1), out4.stride(2), dout4.stride(0), dout4.stride(1), dout4.stride(2),
            Hq, Sq, cdiv(Sq, pre_m), delta.shape[-1])
    meta = dict(HAS_DLSE=dlse is not None, ZERO_DQ=dq_acc is not None, HEAD_DIM=D, BLOCK_D=max(16, next_pow2(D)),
                BLOCK_M=pre_m)
    return _bwd_preprocess_kernel, (cdiv(Sq, pre_m) * B * Hq,), args, meta


def split_launches(q4, k4, v4, dout4, lse, delta, dq4, dk4, dv4, terms, *, softmax_scale, win_left, win_right,
                   softcap, q_blocksize, kv_blocksize, num_warps, num_stages, dropout_p=0.0, dropout_seed=0,
                   cum_seqlens_q=None, cum_seqlens_k=None, dbias_full=None, dkdv: bool = True) -> list:
    """The Triton dK/dV (when ``dkdv``) and dQ launches as ``[(kernel, grid, args, meta)]``: 4-D
    tensors (packed ones as a batch of one), ``terms`` the optional score-term tensors
    ``(bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids)``, ``dbias_full`` the float32
    bias gradient the dQ kernel writes (or None)."""
    varlen = cum_seqlens_q is not None
    B, Sq, Hq, D = q4.shape
    Sk, Hkv = k4.shape[1], k4.shape[2]
    qk_scale, cap = scale_args(softmax_scale, softcap)
    pointers, extra_strides, flags = extra_args(q4, *terms)
    common = dict(SOFTCAP=bool(softcap), **flags, HAS_DROPOUT=dropout_p > 0, VARLEN=varlen, HEAD_DIM=D,
                  BLOCK_D=max(16, next_pow2(D)), PRECISION=dot_precision(q4.dtype), num_warps=num_warps,
                  num_stages=num_stages, **LAUNCH_OPTIONS)
    if varlen:
        num_seqs = cum_seqlens_q.numel() - 1
        table = (cum_seqlens_q, cum_seqlens_k)
        q_blocks = packed_rows(Sq, num_seqs, kv_blocksize)  # dQ tiles: kv_blocksize rows
        k_blocks = packed_rows(Sk, num_seqs, kv_blocksize)  # dK/dV tiles over the key lengths
        seq_args, lse_strides, batch = (0, 0), (0, Sq), 1
    else:
        table = (q4, q4)
        q_blocks, k_blocks = cdiv(Sq, kv_blocksize), cdiv(Sk, kv_blocksize)
        num_seqs, seq_args, lse_strides, batch = 1, (Sq, Sk), (Hq * Sq, Sq), B
    strides = (*batch_strides(q4, varlen), *batch_strides(k4, varlen), *batch_strides(v4, varlen),
               *batch_strides(dout4, varlen), *extra_strides, *lse_strides)
    tail = (win_left, win_right, qk_scale, cap, dropout_seed, dropout_p, softmax_scale)
    launches = []
    if dkdv:
        launches.append((flash_attention_bwd_dkdv_kernel, (k_blocks * batch * Hkv,), (
            q4, k4, v4, dout4, lse, delta, *pointers, *table, dk4, dv4, *strides,
            *batch_strides(dk4, varlen), *batch_strides(dv4, varlen), Hq, Hq // Hkv, *seq_args, k_blocks, num_seqs,
            *tail), dict(BLOCK_M=q_blocksize, BLOCK_N=kv_blocksize, **common)))
    bias_grad = dbias_full is not None
    launches.append((flash_attention_bwd_dq_kernel, (q_blocks * batch * Hq,), (
        q4, k4, v4, dout4, lse, delta, *pointers, *table, dq4, dbias_full if bias_grad else delta, *strides,
        *batch_strides(dq4, varlen), Hq, Hq // Hkv, *seq_args, q_blocks, num_seqs, *tail),
        dict(BIAS_GRAD=bias_grad, BLOCK_M=kv_blocksize, BLOCK_N=q_blocksize, **common)))
    return launches

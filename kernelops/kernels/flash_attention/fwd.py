"""Flash attention forward in Triton: online softmax over key blocks, exp2 with the scale folded in.

Layout: ``q [B, Sq, Hq, D]``, ``k/v [B, Sk, Hkv, D]`` with any strides (BSHD);
``out [B, Sq, Hq, D]`` and ``lse [B, Hq, Sq]`` (float32, natural log). Query head ``h`` reads key
head ``h // (Hq // Hkv)`` (GQA/MQA without repeating K/V). One program computes one
``BLOCK_M x D`` tile of one (batch, head); the key loop is split into masked edges and an
unmasked middle (see kernels/common/masking.py).
"""

import torch
import triton
import triton.language as tl

from kernelops.kernels.common.host import LAUNCH_OPTIONS, cdiv, next_pow2, on_input_device
from kernelops.kernels.common.launch import direct_launch
from kernelops.kernels.common.masking import band_mask, key_block_range, tanh
from kernelops.kernels.flash_attention.varlen import packed_rows, sequence_of

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def score_mods(s, rows, cols, Bias, stride_zm, stride_zn, slope, QSeg, KSeg, seq_q, seq_k, q_shift,
               HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SEG: tl.constexpr, MASKED: tl.constexpr):
    """Add the additive bias tile and the ALiBi term to scores ``s`` (log2 units), and mask
    pairs from different segments.

    ``rows``/``cols`` come pre-broadcast like ``band_mask``'s; ``Bias`` points at this
    (batch, head)'s ``[Sq, Sk]`` plane (any strides, 0 where broadcast); ``slope`` is the head's
    ALiBi slope times log2(e); ``QSeg``/``KSeg`` point at this batch's segment ids (int32 or int64).
    """
    if HAS_SEG:
        if MASKED:
            qs = tl.load(QSeg + rows, mask=rows < seq_q, other=-1)
            ks = tl.load(KSeg + cols, mask=cols < seq_k, other=-2)
        else:
            qs = tl.load(QSeg + rows)
            ks = tl.load(KSeg + cols)
        s = tl.where(qs == ks, s, float("-inf"))
    if HAS_BIAS:
        ptrs = Bias + rows.to(tl.int64) * stride_zm + cols.to(tl.int64) * stride_zn
        if MASKED:
            bias = tl.load(ptrs, mask=(rows < seq_q) & (cols < seq_k), other=0.0)
        else:
            bias = tl.load(ptrs)
        s += bias.to(tl.float32) * 1.4426950408889634
    if HAS_ALIBI:
        s -= slope * tl.abs(cols - (rows + q_shift)).to(tl.float32)
    return s


@triton.jit
def dropout_keep(rows, cols, seed_bh, dropout_p):
    """The dropout keep mask: Philox of (this head's seed, counter ``(j, i, 0, 0)``) >= p.

    Query row ``i`` and key column ``j`` are Philox counter words of their own, so no two
    elements of a head share random bits however long the sequences (an earlier
    counter, ``i * Sk + j`` in 32 bits, repeated the mask once ``Sq * Sk > 2**32``).
    The backward regenerates exactly the same mask from the seed; nothing is stored.
    ``rows``/``cols`` come pre-broadcast to the tile's orientation.
    """
    col = (cols + rows * 0).to(tl.uint32)  # both broadcast to the tile
    bits, _, _, _ = tl.philox(seed_bh, col, (rows + cols * 0).to(tl.uint32), col * 0, col * 0)
    return tl.uint_to_uniform_float(bits) >= dropout_p


@triton.jit
def dropout_scale(p, rows, cols, seed_bh, dropout_p):
    """``p`` with dropped entries zeroed and kept ones scaled by ``1 / (1 - dropout_p)``."""
    keep = dropout_keep(rows, cols, seed_bh, dropout_p)
    return tl.where(keep, p * (1.0 / (1.0 - dropout_p)), 0.0)


@triton.jit
def head_seed(seed, b, h, num_heads):
    """The dropout seed of one (batch or sequence, head)."""
    return seed + (b * num_heads + h) * 1000003


@triton.jit
def join_sink(acc, l_i, m_i, sink):
    """Add a sink logit (log2 units; a scalar or one per row) to the softmax denominator only:
    ``(acc, l_i, m_i)`` rescaled to the new running max."""
    m_fin = tl.maximum(m_i, sink)
    alpha = tl.math.exp2(m_i - m_fin)
    return acc * alpha[:, None], l_i * alpha + tl.math.exp2(sink - m_fin), m_fin


@triton.jit
def fwd_block_loop(acc, l_i, m_i, q, K, V, stride_kn, stride_vn, Bias, stride_zm, stride_zn, slope, QSeg, KSeg,
                    rows, offs_d, lo, hi, seq_q, seq_k, q_shift, win_left, win_right, qk_scale, softcap,
                    seed_bh, dropout_p,
                    MASKED: tl.constexpr, SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr,
                    HAS_SEG: tl.constexpr, HAS_DROPOUT: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    offs_n = tl.arange(0, BLOCK_N)
    d_ok = offs_d < HEAD_DIM
    for start_n in range(lo, hi, BLOCK_N):
        cols = start_n + offs_n
        kv_ok = d_ok[None, :]
        if MASKED:
            kv_ok = kv_ok & (cols[:, None] < seq_k)
        k = tl.load(K + cols[:, None].to(tl.int64) * stride_kn + offs_d[None, :], mask=kv_ok, other=0.0)
        qk = tl.dot(q, tl.trans(k), input_precision=PRECISION)
        if SOFTCAP:
            # qk_scale = scale / cap, softcap = cap * log2(e): s = cap * tanh(scale * qk / cap), in log2 units
            s = tanh(qk * qk_scale) * softcap
        else:
            s = qk * qk_scale
        s = score_mods(s, rows[:, None], cols[None, :], Bias, stride_zm, stride_zn, slope, QSeg, KSeg, seq_q, seq_k,
                       q_shift, HAS_BIAS, HAS_ALIBI, HAS_SEG, MASKED)
        if MASKED:
            s = tl.where(band_mask(rows[:, None], cols[None, :], seq_q, seq_k, q_shift, win_left, win_right), s,
                         float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if MASKED or HAS_BIAS or HAS_SEG:  # a row that sees nothing yet keeps m = -inf: shift by 0 (exp2 -> 0)
            m_new_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_new_safe = m_new
        p = tl.math.exp2(s - m_new_safe[:, None])
        alpha = tl.math.exp2(m_i - m_new_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(V + cols[:, None].to(tl.int64) * stride_vn + offs_d[None, :], mask=kv_ok, other=0.0)
        if HAS_DROPOUT:  # the normaliser l_i keeps the undropped p; only P @ V sees the dropout
            p = dropout_scale(p, rows[:, None], cols[None, :], seed_bh, dropout_p)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def split_program(num_blocks):
    """A flat 1-D grid of ``num_blocks * (batch x heads)`` programs: ``(block, batch-head index)``.

    One axis (limit 2^31 - 1) instead of two: CUDA caps grid axes 1 and 2 at 65535, which
    ``B * H`` passes in decode-shaped calls. Blocks vary fastest, so the programs of one
    (batch, head) run side by side and share its K/V in L2.
    """
    pid = tl.program_id(0)
    return pid % num_blocks, pid // num_blocks


@triton.jit
def query_program(num_heads, group, seq_q, seq_k, num_blocks, CuQ, CuK, num_seqs,
                  BLOCK_M: tl.constexpr, VARLEN: tl.constexpr):
    """The query tile a program owns: ``(b, h, hk, start_m, seq_q, seq_k, q_start, k_start)``.

    Dense: ``num_blocks = cdiv(Sq, BLOCK_M)`` blocks per (batch, head), B * Hq of them; varlen:
    ``num_blocks`` packed rows per head (kernels/flash_attention/varlen.py), where ``b`` is the sequence and
    ``q_start``/``k_start`` its offsets in the packed tensors (0 when dense). Heads and offsets
    are int64. Blocks are taken last first: under a causal mask the last query blocks see the
    most keys, so they start first and the short ones fill the tail (longest-first; no change
    when every block has the same work).
    """
    blk, bh = split_program(num_blocks)
    blk = num_blocks - 1 - blk
    if VARLEN:
        b, start_m, seq_q, seq_k, q_start, k_start = sequence_of(blk, CuQ, CuQ, CuK, num_seqs, BLOCK_M)
        h = bh
    else:
        h = bh % num_heads
        b = (bh // num_heads).to(tl.int64)
        start_m = blk * BLOCK_M
        q_start = b * 0
        k_start = b * 0
    return b, h.to(tl.int64), (h // group).to(tl.int64), start_m, seq_q, seq_k, q_start, k_start


#: shape integers that change from call to call: not specialised, so a new length reuses the binary
SHAPE_ARGS = ["num_heads", "group", "seq_q", "seq_k", "num_blocks", "num_seqs", "win_left", "win_right", "seed"]


@triton.jit
def head_extras(Bias, stride_zb, stride_zh, Alibi, stride_ab, QSeg, KSeg, stride_sqb, stride_skb, b, h,
                HAS_ALIBI: tl.constexpr):
    """This (batch, head)'s bias plane, ALiBi slope (times log2(e); 0 without ALiBi) and the
    batch's query / key segment-id rows."""
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(Alibi + b * stride_ab + h).to(tl.float32) * 1.4426950408889634
    return Bias + b * stride_zb + h * stride_zh, slope, QSeg + b * stride_sqb, KSeg + b * stride_skb


@direct_launch
@triton.jit(do_not_specialize=SHAPE_ARGS)
def flash_attention_fwd_kernel(
    Q, K, V, O, LSE, Bias, Alibi, Sink, QSeg, KSeg, CuQ, CuK,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_zb, stride_zh, stride_zm, stride_zn, stride_ab, stride_sqb, stride_skb, stride_lb, stride_lh,
    num_heads, group, seq_q, seq_k, num_blocks, num_seqs, win_left, win_right, qk_scale, softcap, seed, dropout_p,
    SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SINK: tl.constexpr,
    HAS_SEG: tl.constexpr, HAS_DROPOUT: tl.constexpr, VARLEN: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    b, h, hk, start_m, seq_q, seq_k, q_start, k_start = query_program(
        num_heads, group, seq_q, seq_k, num_blocks, CuQ, CuK, num_seqs, BLOCK_M, VARLEN)
    q_shift = seq_k - seq_q
    seed_bh = head_seed(seed, b, h, num_heads)

    rows = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    q_ok = (rows[:, None] < seq_q) & d_ok[None, :]
    row_off = rows[:, None].to(tl.int64)
    q = tl.load(Q + b * stride_qb + h * stride_qh + (q_start + row_off) * stride_qs + offs_d[None, :],
                mask=q_ok, other=0.0)
    K += b * stride_kb + hk * stride_kh + k_start * stride_ks
    V += b * stride_vb + hk * stride_vh + k_start * stride_vs
    Bias, slope, QSeg, KSeg = head_extras(Bias, stride_zb, stride_zh, Alibi, stride_ab, QSeg, KSeg, stride_sqb,
                                          stride_skb, b, h, HAS_ALIBI)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    lo, full_lo, full_hi, hi = key_block_range(start_m, seq_q, seq_k, q_shift, win_left, win_right,
                                               BLOCK_M, BLOCK_N)
    acc, l_i, m_i = fwd_block_loop(acc, l_i, m_i, q, K, V, stride_ks, stride_vs, Bias, stride_zm, stride_zn,
                                    slope, QSeg, KSeg, rows, offs_d, lo, full_lo, seq_q, seq_k, q_shift, win_left,
                                    win_right, qk_scale, softcap, seed_bh, dropout_p, True, SOFTCAP, HAS_BIAS, HAS_ALIBI,
                                    HAS_SEG, HAS_DROPOUT, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION)
    acc, l_i, m_i = fwd_block_loop(acc, l_i, m_i, q, K, V, stride_ks, stride_vs, Bias, stride_zm, stride_zn,
                                    slope, QSeg, KSeg, rows, offs_d, full_lo, full_hi, seq_q, seq_k, q_shift,
                                    win_left, win_right, qk_scale, softcap, seed_bh, dropout_p, False, SOFTCAP, HAS_BIAS,
                                    HAS_ALIBI, HAS_SEG, HAS_DROPOUT, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION)
    acc, l_i, m_i = fwd_block_loop(acc, l_i, m_i, q, K, V, stride_ks, stride_vs, Bias, stride_zm, stride_zn,
                                    slope, QSeg, KSeg, rows, offs_d, full_hi, hi, seq_q, seq_k, q_shift, win_left,
                                    win_right, qk_scale, softcap, seed_bh, dropout_p, True, SOFTCAP, HAS_BIAS, HAS_ALIBI,
                                    HAS_SEG, HAS_DROPOUT, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION)
    if HAS_SINK:  # the sink logit joins the denominator only (gpt-oss attention sinks)
        acc, l_i, m_i = join_sink(acc, l_i, m_i, tl.load(Sink + h).to(tl.float32) * 1.4426950408889634)
    empty = l_i == 0.0  # rows that see no key at all: output 0, lse -inf
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    tl.store(O + b * stride_ob + h * stride_oh + (q_start + row_off) * stride_os + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=q_ok)
    tl.store(LSE + b * stride_lb + h * stride_lh + q_start + rows, lse, mask=rows < seq_q)


def check_buffer(name: str, t: torch.Tensor, shape: tuple, dtype: torch.dtype, contiguous: bool = False) -> None:
    """A preallocated output must match exactly: the kernels write into it as given."""
    if tuple(t.shape) != tuple(shape) or t.dtype != dtype:
        raise ValueError(f"{name} buffer must be {tuple(shape)} {dtype}, got {name}.shape={tuple(t.shape)} {t.dtype}")
    if (contiguous and not t.is_contiguous()) or (t.numel() and t.stride(-1) != 1):
        raise ValueError(f"{name} buffer needs {'contiguous' if contiguous else 'unit last-dim'} strides, "
                         f"got {name}.stride()={t.stride()}")


def unit_last_stride(*tensors):
    """The kernels address the head dim with stride 1; any other stride (rare) is copied once."""
    return tuple(t if t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous() for t in tensors)


def dot_precision(dtype: torch.dtype) -> str:
    """float32 inputs get ``tf32x3`` dots: three TF32 tensor-core products that recover float32
    accuracy (plain tf32 would lose it; ``ieee`` FMA loops compile 5x slower and run slower)."""
    return "tf32x3" if dtype == torch.float32 else "tf32"


def scale_args(softmax_scale: float, softcap: float | None) -> tuple[float, float]:
    """(qk_scale, softcap) kernel arguments, log2(e) folded in (see fwd_block_loop)."""
    if softcap:
        return softmax_scale / softcap, softcap * LOG2E
    return softmax_scale * LOG2E, 0.0


def bias_strides(bias: torch.Tensor | None) -> tuple[int, int, int, int]:
    """Strides of a ``[B or 1, H or 1, Sq, Sk]`` bias, 0 along broadcast (size-1) dims."""
    if bias is None:
        return 0, 0, 0, 0
    return tuple(0 if bias.shape[i] == 1 else bias.stride(i) for i in range(4))


_WIDE_IDS = (torch.int64, torch.uint32, torch.uint64)


def segment_ids_for_kernels(q_segment_ids: torch.Tensor, kv_segment_ids: torch.Tensor):
    """Both id tensors in one integer dtype the kernels compare exactly, contiguous: int32, or
    int64 when either holds a type wider than int32 (narrowing could make two different
    documents' ids equal, e.g. 0 and 2**32)."""
    wide = q_segment_ids.dtype in _WIDE_IDS or kv_segment_ids.dtype in _WIDE_IDS
    dtype = torch.int64 if wide else torch.int32
    return q_segment_ids.to(dtype).contiguous(), kv_segment_ids.to(dtype).contiguous()


def extra_args(q: torch.Tensor, bias, alibi_slopes, softmax_aux, q_segment_ids=None,
               kv_segment_ids=None) -> tuple[tuple, tuple, dict]:
    """Kernel arguments for the optional score terms: ``(pointers, strides, constexpr flags)``.

    ``bias [B|1, H|1, Sq, Sk]`` (any float dtype, any strides), ``alibi_slopes [H]`` or ``[B, H]``,
    ``softmax_aux [H]`` (sink logits), segment ids ``[B, Sq]`` / ``[B, Sk]`` (int32 or int64). Absent ones
    get q as a placeholder pointer.
    """
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.contiguous()
    if softmax_aux is not None:
        softmax_aux = softmax_aux.contiguous()
    stride_ab = alibi_slopes.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0
    has_seg = q_segment_ids is not None
    if has_seg:
        q_segment_ids, kv_segment_ids = segment_ids_for_kernels(q_segment_ids, kv_segment_ids)
    pointers = tuple(q if t is None else t for t in (bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids))
    strides = (*bias_strides(bias), stride_ab, q_segment_ids.stride(0) if has_seg else 0,
               kv_segment_ids.stride(0) if has_seg else 0)
    flags = dict(HAS_BIAS=bias is not None, HAS_ALIBI=alibi_slopes is not None, HAS_SINK=softmax_aux is not None,
                 HAS_SEG=has_seg)
    return pointers, strides, flags


@on_input_device
def flash_attention_fwd(q, k, v, *, softmax_scale: float, win_left: int, win_right: int,
                        softcap: float | None, q_blocksize: int, kv_blocksize: int,
                        num_warps: int, num_stages: int, bias: torch.Tensor | None = None,
                        alibi_slopes: torch.Tensor | None = None, softmax_aux: torch.Tensor | None = None,
                        q_segment_ids: torch.Tensor | None = None, kv_segment_ids: torch.Tensor | None = None,
                        cum_seqlens_q: torch.Tensor | None = None, cum_seqlens_k: torch.Tensor | None = None,
                        dropout_p: float = 0.0, dropout_seed: int = 0,
                        out: torch.Tensor | None = None, lse: torch.Tensor | None = None):
    """Launch the forward kernel. Shapes as in the module docstring; returns ``(out, lse)``.

    Logits are ``softcap(softmax_scale * q.k) + bias - slope_h * |j - (i + Sk - Sq)|``; the
    sink logit ``softmax_aux[h]`` joins each row's softmax denominator only; with segment ids a
    query sees only keys of its own segment. ``out`` ([B, Sq, Hq, D], q's dtype, unit last
    stride) and ``lse`` ([B, Hq, Sq] float32, contiguous) may be given preallocated; they are
    written in full.

    Packed variable-length batches: ``q [total_q, Hq, D]``, ``k/v [total_k, Hkv, D]`` with
    ``cum_seqlens_q/k [n + 1]`` (int32, validated by the caller); then ``out [total_q, Hq, D]``
    and ``lse [Hq, total_q]``, and ``alibi_slopes`` is ``[Hq]`` or ``[n, Hq]``.

    Dropout (``dropout_p > 0``) drops probabilities with a Philox mask drawn from
    ``dropout_seed`` and the element's (batch, head, row, column); the backward regenerates it.

    ``win_left``/``win_right`` are the band bounds of kernels/common/masking.py (already resolved
    from causal / sliding_window by the caller).
    """
    varlen = cum_seqlens_q is not None
    if varlen:  # the kernels read the offsets with unit stride
        cum_seqlens_q, cum_seqlens_k = cum_seqlens_q.contiguous(), cum_seqlens_k.contiguous()
    q, k, v = unit_last_stride(q, k, v)
    if varlen:
        total_q, Hq, D = q.shape
        out_shape, lse_shape = (total_q, Hq, D), (Hq, total_q)
    else:
        B, Sq, Hq, D = q.shape
        out_shape, lse_shape = (B, Sq, Hq, D), (B, Hq, Sq)
    out = torch.empty(out_shape, dtype=q.dtype, device=q.device) if out is None else out
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device) if lse is None else lse
    check_buffer("out", out, out_shape, q.dtype)
    check_buffer("lse", lse, lse_shape, torch.float32, contiguous=True)
    if out.numel() == 0:
        lse.fill_(float("-inf"))
        return out, lse
    kernel, grid, args, meta = fwd_launch(
        q, k, v, out, lse, softmax_scale=softmax_scale, win_left=win_left, win_right=win_right, softcap=softcap,
        q_blocksize=q_blocksize, kv_blocksize=kv_blocksize, num_warps=num_warps, num_stages=num_stages, bias=bias,
        alibi_slopes=alibi_slopes, softmax_aux=softmax_aux, q_segment_ids=q_segment_ids,
        kv_segment_ids=kv_segment_ids, cum_seqlens_q=cum_seqlens_q, cum_seqlens_k=cum_seqlens_k, dropout_p=dropout_p,
        dropout_seed=dropout_seed)
    kernel[grid](*args, **meta)
    return out, lse


def fwd_launch(q, k, v, out, lse, *, softmax_scale: float, win_left: int, win_right: int, softcap: float | None,
               q_blocksize: int, kv_blocksize: int, num_warps: int, num_stages: int, bias=None, alibi_slopes=None,
               softmax_aux=None, q_segment_ids=None, kv_segment_ids=None, cum_seqlens_q=None, cum_seqlens_k=None,
               dropout_p: float = 0.0, dropout_seed: int = 0, views=None):
    """``(kernel, grid, args, meta)`` of :func:`flash_attention_fwd`'s launch over checked tensors
    (unit last strides, contiguous offsets, ``out`` and ``lse`` of the right shapes, nothing empty):
    the launch it makes, and that a per-signature plan binds once (``plans.PtrFwdPlan``). Packed
    calls' q/k/v/out enter the launch as batch-of-one views: ``views`` (the caller's, which a plan
    binds) or made here."""
    varlen = cum_seqlens_q is not None
    if varlen:
        total_q, Hq, D = q.shape
        Hkv = k.shape[1]
    else:
        B, Sq, Hq, D = q.shape
        Sk, Hkv = k.shape[1], k.shape[2]
    qk_scale, cap = scale_args(softmax_scale, softcap)
    pointers, strides, flags = extra_args(q, bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids)
    if varlen:
        num_seqs = cum_seqlens_q.numel() - 1
        table, rows = (cum_seqlens_q, cum_seqlens_k), packed_rows(total_q, num_seqs, q_blocksize)
        q4, k4, v4, o4 = views or (t.unsqueeze(0) for t in (q, k, v, out))
        grid = (rows * Hq,)
        shape_args = (Hq, Hq // Hkv, 0, 0, rows, num_seqs)
        lse_strides = (0, total_q)
    else:
        table = (q, q)
        q4, k4, v4, o4 = q, k, v, out
        grid = (cdiv(Sq, q_blocksize) * B * Hq,)
        shape_args = (Hq, Hq // Hkv, Sq, Sk, cdiv(Sq, q_blocksize), 1)
        lse_strides = (Hq * Sq, Sq)
    args = (q4, k4, v4, o4, lse, *pointers, *table,
            *batch_strides(q4, varlen), *batch_strides(k4, varlen), *batch_strides(v4, varlen),
            *batch_strides(o4, varlen), *strides, *lse_strides,
            *shape_args, win_left, win_right, qk_scale, cap, dropout_seed, dropout_p)
    meta = dict(SOFTCAP=bool(softcap), **flags, HAS_DROPOUT=dropout_p > 0, VARLEN=varlen, HEAD_DIM=D,
                BLOCK_D=max(16, next_pow2(D)), BLOCK_M=q_blocksize, BLOCK_N=kv_blocksize,
                PRECISION=dot_precision(q.dtype), num_warps=num_warps, num_stages=num_stages, **LAUNCH_OPTIONS)
    return flash_attention_fwd_kernel, grid, args, meta


def batch_strides(t: torch.Tensor, varlen: bool) -> tuple[int, int, int]:
    """(batch, seq, head) strides of a BSHD tensor; the batch stride is 0 for packed sequences."""
    stride = t.stride()  # one call: launch paths take these for 6-11 tensors per call
    return (0 if varlen else stride[0]), stride[1], stride[2]

"""Decode-shaped flash attention (few queries, long keys): split-KV ("flash-decoding") in Triton.

Layout as in fwd.py: ``q [B, Sq, Hq, D]``, ``k/v [B, Sk, Hkv, D]``, ``out [B, Sq, Hq, D]``,
``lse [B, Hq, Sq]`` float32 (natural log). Meant for ``Sq <= 16``.

A dense forward launch gives each (batch, query head) one program that walks all of K/V: at
``Sq = 1`` that is ``B * Hq`` programs with one useful query row each, too few to fill the GPU
for a single sequence, and each KV head's K/V is read once per query head of its group. Here:

1. ``decode_split_kernel``: one program per (batch, KV head, key split). Its tile's rows are the
   ``group * Sq`` query rows that read this KV head (row ``r`` = query ``r // group`` of head
   ``hk * group + r % group``), so K/V are read from memory once per KV head, and ``num_splits``
   programs share the keys of one (batch, KV head). Each writes its partial output (normalised,
   float32) and partial lse (log2 units) to a workspace ``[B * Hkv, num_splits, group * Sq, D]``.
   Balanced plans (more pairs than SMs, :func:`balanced_split`) instead give each program a run of
   key blocks across pairs, walked in one pipelined loop (:mod:`decode_balanced`).
2. ``decode_combine_kernel``: one program per output row merges the splits' partial results
   by their lse (and the sink logit, when given) into ``out`` and ``lse``. With a single split
   (large batches fill the GPU without splitting) the first kernel writes ``out``/``lse`` itself
   and this launch is skipped. On sm_90+ it is a programmatic dependent launch (:func:`decode_pdl`):
   its programs start while the split kernel runs and wait in ``griddepcontrol.wait`` for its
   results (docs/performance.md).

K/V tiles come through TMA descriptors (one bulk copy per tile) on sm_90+ for 16-bit inputs whose
strides give a row view (:func:`tma_rows`), else through pointers. BSHD storage reads as rows of
``Hkv * D`` (as in :mod:`fwd_tma`), BHSD storage as rows of ``D``; either may be a slice
``cache[:, :Sk]`` of a longer cache. A split's last tile may run into rows past the sequence's
keys, which the key mask drops. On an H200 the descriptors lifted the K/V read rate at 4k keys from
0.79-0.95x cuDNN's to 0.94-1.14x (docs/performance.md).

Masks: causal / sliding window (bottom-right aligned, per row) and softcap; sink logits
(``softmax_aux``) join in the combine. Other score terms go to the dense kernel.
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from kernelops.kernels.common.host import LAUNCH_OPTIONS, cdiv, cuda_capability, interpreting, next_pow2, num_sms
from kernelops.kernels.common.launch import direct_launch
from kernelops.kernels.common.masking import split_block_range
from kernelops.kernels.common.tma import TensorDescriptor, descriptor, tma_row_pitch
from kernelops.kernels.flash_attention.decode_balanced import balanced_run, store_piece
from kernelops.kernels.flash_attention.fwd import dot_precision, fwd_block_loop, scale_args
from kernelops.kernels.flash_attention.fwd_tma import TMA_HEAD_DIMS, tma_block_loop
from kernelops.kernels.flash_attention.smem import decode_rows
from kernelops.ops.device import device_info

#: automatic split plans take one split with twice the key tile (:func:`wide_tile`) for pairs that
#: fill more than WIDE_MIN_FILL of the SMs, within WIDE_SMEM bytes of K/V stages
WIDE_MIN_FILL = 0.7
WIDE_SMEM = 200 * 1024
WIDE_MAX_ROWS = 16
#: the doubled tile's score block, ``max(16, rows) * keys``, stays within this many elements (the
#: heuristic's largest tile: 512 keys at D=16); D=16's 1024-key doubled tile ran 7-16x slower
WIDE_MAX_SCORES = 8192
#: automatic plans with at most half as many (batch, KV head) pairs as SMs put one
#: program on each SM with twice the key tile, ``num_sms // pairs`` splits per pair
#: (:func:`wide_splits`), where each split keeps at least WIDE_SPLIT_MIN_KEYS keys (shorter splits
#: lost 1-7% at 4k keys and B = 1 at 32k at D=128)
WIDE_SPLIT_MIN_KEYS = 4096
#: automatic plans with more pairs than SMs cut all pairs' keys into equal runs, one
#: per program (:func:`balanced_split`), where one split per pair fills less than BALANCED_MIN_FILL
#: of its waves, with more than two waves' pairs or BALANCED_MIN_KEYS keys per pair
BALANCED_MIN_FILL = 0.95
BALANCED_MIN_KEYS = 16384
#: balanced plans put one program on each SM with twice the key tile where :func:`widened`
#: lets it and the pairs have at least BALANCED_WIDE_KEYS keys (else two programs per SM with the
#: given tile)
BALANCED_WIDE_KEYS = 2048
#: no balanced plan for pairs of fewer keys: runs of a few blocks cost more than the balance gains
BALANCED_MIN_PAIR_KEYS = 512
#: single-wave plans with fewer than BALANCED_MIN_KEYS keys balance too when the pairs exceed the
#: SMs by at most this fraction and each pair has at least BALANCED_NEAR_KEYS keys
BALANCED_NEAR = 0.1
BALANCED_NEAR_KEYS = 2048
#: the descriptors' row coordinates are int32: the rows up to the last key (plus a tile) must stay
#: below 2^31
TMA_MAX_ROWS = 2 ** 31 - 4096
#: balanced plans' programs read the query rows with every key block for pairs of fewer blocks than
#: this (the read is in flight before a pair starts), else once at each pair's start: on an H200 the
#: read with every block saved 1-5% at 8-32 blocks a pair and cost 2% at 128-256
Q_EACH_BLOCK_MAX = 64


@triton.jit
def _decode_blocks(acc, l_i, m_i, q, Q, K, V, stride_ks, stride_vs, kv_row, kv_col, pos, offs_d, lo, hi, seq_q, seq_k,
                   q_shift, win_left, win_right, qk_scale, softcap, MASKED: tl.constexpr, SOFTCAP: tl.constexpr,
                   TMA: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                   PRECISION: tl.constexpr):
    """Online softmax over key blocks ``[lo, hi)``: K/V tiles through TMA descriptors (rows
    ``kv_row + key``, columns from ``kv_col``) or through pointers (K, V at this (batch, KV head))."""
    if TMA:
        acc, l_i, m_i = tma_block_loop(acc, l_i, m_i, q, K, V, kv_row, kv_col, 0, pos, lo, hi, seq_q, seq_k, q_shift,
                                        win_left, win_right, qk_scale, softcap, MASKED, SOFTCAP, False, False, BLOCK_N,
                                        False)
    else:  # score terms the decode path does not take: placeholders (compiled away)
        acc, l_i, m_i = fwd_block_loop(acc, l_i, m_i, q, K, V, stride_ks, stride_vs, Q, 0, 0, 0.0, Q, Q, pos, offs_d,
                                        lo, hi, seq_q, seq_k, q_shift, win_left, win_right, qk_scale, softcap, 0, 0.0,
                                        MASKED, SOFTCAP, False, False, False, False, HEAD_DIM, BLOCK_D, BLOCK_N,
                                        PRECISION)
    return acc, l_i, m_i


@triton.jit
def _segment(Q, K, V, OPart, LPart, Sink, O, LSE, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks, stride_kh,
             stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, num_kv_heads,
             group, seq_q, seq_k, slots, bh, piece, s_lo, s_hi, win_left, win_right, kv_pitch, kv_head_pitch,
             kv_head_col, qk_scale, softcap, SOFTCAP: tl.constexpr, DIRECT: tl.constexpr, TMA: tl.constexpr,
             HAS_SINK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_N: tl.constexpr, PRECISION: tl.constexpr):
    """Keys ``[s_lo, s_hi)`` of (batch, KV head) ``bh`` for its ``group * Sq`` query rows: with
    ``DIRECT`` the finished ``out``/``lse`` rows, else the normalised partial result and its lse
    (log2 units) in workspace slot ``piece`` of ``slots``."""
    hk = (bh % num_kv_heads).to(tl.int64)
    b = (bh // num_kv_heads).to(tl.int64)
    n_rows = group * seq_q
    r = tl.arange(0, BLOCK_M)
    pos = r // group                     # the query position of each row
    head = hk * group + (r % group)      # and its query head
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    row_ok = r < n_rows
    q = tl.load(Q + b * stride_qb + pos[:, None].to(tl.int64) * stride_qs + head[:, None] * stride_qh
                + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)

    # keys any row may see, and keys every row sees (the unmasked middle), cut to this segment
    q_shift = seq_k - seq_q
    lo = tl.maximum(s_lo, q_shift - win_left)
    hi = tl.minimum(s_hi, tl.minimum(seq_k, seq_q - 1 + q_shift + win_right + 1))
    full_lo = tl.maximum(lo, seq_q - 1 + q_shift - win_left)
    full_hi = tl.minimum(hi, tl.minimum(q_shift + win_right + 1, seq_k))
    lo, full_lo, full_hi, hi = split_block_range(lo, full_lo, full_hi, hi, BLOCK_N)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    if not TMA:
        K += b * stride_kb + hk * stride_kh
        V += b * stride_vb + hk * stride_vh
    kv_row = (b * kv_pitch + hk * kv_head_pitch).to(tl.int32)  # TMA: the key's row (tma_rows)
    kv_col = (hk * kv_head_col).to(tl.int32)
    acc, l_i, m_i = _decode_blocks(acc, l_i, m_i, q, Q, K, V, stride_ks, stride_vs, kv_row, kv_col, pos, offs_d,
                                   lo, full_lo, seq_q, seq_k, q_shift, win_left, win_right, qk_scale, softcap,
                                   True, SOFTCAP, TMA, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION)
    acc, l_i, m_i = _decode_blocks(acc, l_i, m_i, q, Q, K, V, stride_ks, stride_vs, kv_row, kv_col, pos, offs_d,
                                   full_lo, full_hi, seq_q, seq_k, q_shift, win_left, win_right, qk_scale, softcap,
                                   False, SOFTCAP, TMA, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION)
    acc, l_i, m_i = _decode_blocks(acc, l_i, m_i, q, Q, K, V, stride_ks, stride_vs, kv_row, kv_col, pos, offs_d,
                                   full_hi, hi, seq_q, seq_k, q_shift, win_left, win_right, qk_scale, softcap,
                                   True, SOFTCAP, TMA, HEAD_DIM, BLOCK_D, BLOCK_N, PRECISION)
    store_piece(acc, l_i, m_i, O, LSE, OPart, LPart, Sink, stride_ob, stride_os, stride_oh, stride_lb, stride_lh, b,
                head, pos, bh, slots, piece, n_rows, r, offs_d, row_ok, d_ok, DIRECT, HAS_SINK, HEAD_DIM)


@direct_launch
@triton.jit(do_not_specialize=["num_kv_heads", "group", "seq_q", "seq_k", "num_splits", "k0", "k1", "split_len",
                               "win_left", "win_right", "kv_pitch", "kv_head_pitch", "kv_head_col", "total_blocks"])
def decode_split_kernel(
    Q, K, V, OPart, LPart, Sink, O, LSE,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    num_kv_heads, group, seq_q, seq_k, num_splits, k0, k1, split_len, win_left, win_right, kv_pitch, kv_head_pitch,
    kv_head_col, total_blocks, qk_scale, softcap, SOFTCAP: tl.constexpr, DIRECT: tl.constexpr, TMA: tl.constexpr,
    HAS_SINK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, PDL: tl.constexpr, BALANCED: tl.constexpr, SHORT: tl.constexpr,
    Q_EACH_BLOCK: tl.constexpr,
):
    if PDL:  # the combine grid may launch once every split program has started
        gdc_launch_dependents()
    pid = tl.program_id(0)
    if BALANCED:  # key blocks [pid * per, pid * per + per) of all pairs' blocks in a row, in one loop
        balanced_run(Q, K, V, OPart, LPart, Sink, O, LSE, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks,
                     stride_kh, stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                     num_kv_heads, group, seq_q, seq_k, num_splits, k0, k1, split_len // BLOCK_N, total_blocks,
                     win_left, win_right, kv_pitch, kv_head_pitch, kv_head_col, qk_scale, softcap, SOFTCAP, DIRECT,
                     TMA, SHORT, HAS_SINK, HEAD_DIM, BLOCK_D, BLOCK_M, BLOCK_N, PRECISION, Q_EACH_BLOCK)
    else:
        split = pid % num_splits
        bh = pid // num_splits
        s_lo = k0 + split * split_len
        s_hi = tl.minimum(s_lo + split_len, k1)
        _segment(Q, K, V, OPart, LPart, Sink, O, LSE, stride_qb, stride_qs, stride_qh, stride_kb, stride_ks,
                 stride_kh, stride_vb, stride_vs, stride_vh, stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
                 num_kv_heads, group, seq_q, seq_k, num_splits, bh, split, s_lo, s_hi, win_left, win_right, kv_pitch,
                 kv_head_pitch, kv_head_col, qk_scale, softcap, SOFTCAP, DIRECT, TMA, HAS_SINK, HEAD_DIM, BLOCK_D,
                 BLOCK_M, BLOCK_N, PRECISION)


@direct_launch
@triton.jit(do_not_specialize=["num_kv_heads", "group", "seq_q", "num_splits", "pair_blocks", "per"])
def decode_combine_kernel(
    OPart, LPart, Sink, O, LSE,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    num_kv_heads, group, seq_q, num_splits, pair_blocks, per,
    HAS_SINK: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr,
    BALANCED: tl.constexpr,
):
    if PDL:  # launched early: wait for the split kernel's results (all its writes visible)
        gdc_wait()
    pid = tl.program_id(0).to(tl.int64)
    n_rows = group * seq_q
    r = pid % n_rows
    bh = pid // n_rows
    b = bh // num_kv_heads
    head = (bh % num_kv_heads) * group + r % group
    pos = r // group
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    if BALANCED:  # the pair's pieces: one per program whose run of key blocks meets the pair's blocks
        first = bh * pair_blocks // per
        s_ok = offs_s <= ((bh + 1) * pair_blocks - 1) // per - first
    else:
        s_ok = offs_s < num_splits
    d_ok = offs_d < HEAD_DIM
    part = (bh * num_splits + offs_s) * n_rows + r
    lse2 = tl.load(LPart + part, mask=s_ok, other=float("-inf"))
    m = tl.max(lse2, 0)
    if HAS_SINK:
        sink = tl.load(Sink + head).to(tl.float32) * 1.4426950408889634
        m = tl.maximum(m, sink)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.math.exp2(lse2 - m_safe)
    total = tl.sum(w, 0)
    o = tl.load(OPart + part[:, None] * HEAD_DIM + offs_d[None, :], mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    acc = tl.sum(o * w[:, None], 0)
    if HAS_SINK:
        total += tl.math.exp2(sink - m_safe)
    empty = total == 0.0
    out = acc / tl.where(empty, 1.0, total)
    lse = tl.where(empty, float("-inf"), (m_safe + tl.math.log2(tl.where(empty, 1.0, total))) * 0.6931471805599453)
    tl.store(O + b * stride_ob + pos * stride_os + head * stride_oh + offs_d, out.to(O.dtype.element_ty), mask=d_ok)
    tl.store(LSE + b * stride_lb + head * stride_lh + pos, lse)


def plan_thresholds() -> tuple:
    """The module's thresholds that shape a plan (:func:`decode_splits`), read at each call: part
    of a decode plan's signature."""
    return (WIDE_MIN_FILL, WIDE_SMEM, WIDE_MAX_ROWS, WIDE_MAX_SCORES, WIDE_SPLIT_MIN_KEYS,
            BALANCED_MIN_FILL, BALANCED_MIN_KEYS, BALANCED_WIDE_KEYS,
            BALANCED_MIN_PAIR_KEYS, BALANCED_NEAR, BALANCED_NEAR_KEYS, Q_EACH_BLOCK_MAX)


def key_span(seq_q: int, seq_k: int, win_left: int, win_right: int) -> tuple[int, int]:
    """``[k0, k1)``: the keys any query may see under the band (k0 not aligned)."""
    shift = seq_k - seq_q
    return max(0, shift - win_left), max(0, min(seq_k, seq_q - 1 + shift + win_right + 1))


def split_plan(batch_heads: int, span: int, block_n: int, num_splits: int, num_sms: int) -> tuple[int, int]:
    """``(num_splits, split_len)``: ``num_splits = 0`` picks the most splits whose programs
    (``batch_heads * num_splits``) still run in one wave of two programs per SM, with at least two
    key blocks per split (one split once ``batch_heads`` alone fills the wave); ``split_len`` is a
    multiple of ``block_n``.

    One wave, not "at least two programs per SM": the programs are memory-bound and equal, so a
    second wave that is only partly full runs its programs with the GPU's bandwidth partly idle.
    Measured (H200, Sq=1, GQA 32/8, D=128, under CUDA graphs): with 64 (batch, KV head)
    pairs 4 splits read 4.45 TB/s at 128k keys where 5 (320 programs, 1.2 waves)
    read 4.23; with 16 pairs 16 splits 4.30 where 17 read 4.01."""
    blocks = max(1, cdiv(span, block_n))
    if num_splits <= 0:
        num_splits = max(1, min(2 * num_sms // batch_heads, cdiv(blocks, 2)))
    num_splits = min(num_splits, blocks)
    split_len = cdiv(blocks, num_splits) * block_n
    return cdiv(max(span, 1), split_len), split_len


def bhsd_pitches(t: torch.Tensor) -> tuple[int, int] | None:
    """``(batch pitch, head pitch)`` in rows of ``D`` elements when a ``[B, S, H, D]``-indexed tensor
    stores each head's keys as consecutive rows (BHSD storage, ``cache.transpose(1, 2)``, or a slice
    ``[:, :S]`` of it): key ``s`` of head ``h`` of batch ``b`` is row ``b * batch + h * head + s``,
    rows 16-byte aligned and not overlapping; else None."""
    B, S, H, D = t.shape
    sb, ss, sh, sd = t.stride()
    if sd != 1 or ss < D or t.data_ptr() % 16 or (ss * t.element_size()) % 16:
        return None
    head = 0 if H == 1 else (sh // ss if sh % ss == 0 and sh >= S * ss else None)
    if head is None:
        return None
    span = (H - 1) * head + S  # rows of one batch
    batch = 0 if B == 1 else (sb // ss if sb % ss == 0 and sb >= span * ss else None)
    return None if batch is None else (batch, head)


def tma_rows(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[int, int, int, int] | None:
    """How the split kernel reads K/V through TMA descriptors, ``(width, batch pitch, head pitch,
    head column)``: key ``s`` of KV head ``h`` in batch ``b`` starts at row ``b * batch + h * head
    + s``, column ``h * column``, of a ``[rows, width]`` view. BSHD storage
    (:func:`common.tma.tma_row_pitch`): ``(Hkv * D, pitch, 0, D)``; BHSD storage
    (:func:`bhsd_pitches`): ``(D, batch, head, 0)``. None (read through pointers) unless
    sm_90+ or the interpreter, float16/bfloat16, D a power of two, K and V of
    one layout, and fewer than :data:`TMA_MAX_ROWS` rows up to the last key."""
    if TensorDescriptor is None or q.dtype not in (torch.float16, torch.bfloat16):
        return None
    if (cuda_capability(q)[0] < 9) if q.is_cuda else not interpreting():
        return None
    B, Sk, Hkv, D = k.shape
    if D not in TMA_HEAD_DIMS or q.shape[-1] != D or not k.dtype == v.dtype == q.dtype or not Sk:
        return None
    pitch = tma_row_pitch(k)
    if pitch is not None and tma_row_pitch(v) == pitch:
        rows = (Hkv * D, pitch, 0, D)
    else:
        pitches = bhsd_pitches(k)
        if pitches is None or bhsd_pitches(v) != pitches:
            return None
        rows = (D, *pitches, 0)
    return rows if (B - 1) * rows[1] + (Hkv - 1) * rows[2] + Sk < TMA_MAX_ROWS else None


def decode_tma(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the split kernel reads K/V through TMA descriptors (:func:`tma_rows`)."""
    return tma_rows(q, k, v) is not None


def decode_pdl(q: torch.Tensor) -> bool:
    """Whether the combine launch goes as a programmatic dependent launch (a
    CUDA device of compute capability 9.0 or newer, not the interpreter)."""
    return q.is_cuda and not interpreting() and cuda_capability(q)[0] >= 9


def workspace_shapes(q: torch.Tensor, k: torch.Tensor, num_splits: int) -> tuple[tuple, tuple] | None:
    """Shapes of the split results ``(o_part, l_part)`` (float32), or None for one split (the
    split kernel writes ``out``/``lse`` itself)."""
    if num_splits == 1:
        return None
    B, Hkv, rows, D = q.shape[0], k.shape[2], decode_rows(q, k), q.shape[-1]
    return (B * Hkv, num_splits, rows, D), (B * Hkv, num_splits, rows)


def wide_tile(batch_heads: int, num_splits: int, kv_blocksize: int, num_stages: int, head_dim: int, elem: int,
              num_sms: int, rows: int = 1, smem_limit: int = WIDE_SMEM) -> int:
    """The key tile of the split plan: ``2 * kv_blocksize`` with one split per (batch, KV head)
    when the split count is automatic (``num_splits = 0``), the pairs
    alone fill more than :data:`WIDE_MIN_FILL` of the SMs but not more than all of them, the tile
    has at most :data:`WIDE_MAX_ROWS` query rows (``group * Sq``; taller tiles with wide key tiles
    left ptxas short of registers offline and were not measured), and the wider tile's K/V stages
    and query rows fit in :data:`WIDE_SMEM` bytes and in the device's ``smem_limit`` (GPUs with
    ~100 KiB per program take no wide tile at these sizes); else ``kv_blocksize`` (and
    :func:`split_plan`'s count).

    There :func:`split_plan` gives two splits at two programs per SM; one split puts one program
    on each busy SM, which then has the SM's shared memory to itself and takes twice the tile
    (the same bytes per SM). Measured (H200, Sq=1, GQA 32/8, D=128, bf16, graphs)."""
    if num_splits or not WIDE_MIN_FILL * num_sms < batch_heads <= num_sms:
        return kv_blocksize
    return widened(kv_blocksize, num_stages, head_dim, elem, rows, smem_limit)


def widened(kv_blocksize: int, num_stages: int, head_dim: int, elem: int, rows: int, smem_limit: int) -> int:
    """``2 * kv_blocksize`` when a program alone on its SM may take the doubled key tile (at most
    :data:`WIDE_MAX_ROWS` query rows and :data:`WIDE_MAX_SCORES` scores; the K/V stages and query
    rows within :data:`WIDE_SMEM` and ``smem_limit`` bytes), else ``kv_blocksize``."""
    wide = 2 * kv_blocksize
    smem = (2 * wide * num_stages + max(16, rows)) * head_dim * elem
    fits = rows <= WIDE_MAX_ROWS and max(16, rows) * wide <= WIDE_MAX_SCORES
    return wide if fits and smem <= min(WIDE_SMEM, smem_limit) else kv_blocksize


def wide_splits(batch_heads: int, num_splits: int, keys: int, kv_blocksize: int, num_stages: int, head_dim: int,
                elem: int, rows: int, num_sms: int, smem_limit: int) -> tuple[int, int] | None:
    """``(key tile, num_splits)`` of a plan with one program on each SM: twice the key tile
    (:func:`widened`) and ``num_sms // batch_heads`` splits per pair, when
    the split count is automatic, the pairs fill at most half the SMs, the doubled tile fits
    and each split keeps at least :data:`WIDE_SPLIT_MIN_KEYS` keys; else None (:func:`split_plan`'s
    two programs per SM with the given tile). The one-split case, pairs filling most of the SMs, is
    :func:`wide_tile`'s. Measured (H200, Sq=1, GQA 32/8, B = 1-8): from 4096 keys a
    split, D=64 +1.1-3.9% and D=128 +0.6-1.7% at 32k-128k keys; shorter splits lost up to 7%."""
    if num_splits or 2 * batch_heads > num_sms:
        return None
    wide = widened(kv_blocksize, num_stages, head_dim, elem, rows, smem_limit)
    splits = num_sms // batch_heads
    return (wide, splits) if wide != kv_blocksize and keys >= splits * WIDE_SPLIT_MIN_KEYS else None


def balanced_split(batch_heads: int, blocks: int, block_n: int, num_splits: int, num_sms: int,
                   wave: int = 2, keys: int | None = None) -> tuple[int, int, int] | None:
    """``(programs, per, slots)`` of a balanced plan of ``wave`` programs per SM, or None for
    :func:`split_plan`'s uniform one.

    Balanced plans need an automatic split count, more (batch, KV head)
    pairs than SMs, and one split per pair filling less than :data:`BALANCED_MIN_FILL` of its waves
    of two programs per SM. They also need more than two waves of pairs, or at least
    :data:`BALANCED_MIN_KEYS` keys per pair, or pairs exceeding the SMs by at most
    :data:`BALANCED_NEAR` with at least :data:`BALANCED_NEAR_KEYS` keys each (a few SMs would run
    two pairs while the rest run one). Elsewhere in a single wave the combine launch costs more
    than the balance gains; so it does for pairs of fewer than :data:`BALANCED_MIN_PAIR_KEYS` keys
    (B=40-48 at 64-130 keys measured 1.15-1.3x slower balanced).

    The pairs' ``blocks`` key blocks each, in a row, are cut into runs of ``per`` blocks
    (``block_n`` keys each), one per program: ``wave * num_sms`` programs, the last run shorter. A
    run may end one pair and start the next. The combine kernel merges a pair's runs (at most
    ``slots``). Measured on an H200 at B=17-48, Hkv=8 (also the near rule, one
    program per SM with the doubled tile)."""
    slots_per_wave = 2 * num_sms
    if num_splits or batch_heads <= num_sms or blocks < 1:
        return None
    if batch_heads >= BALANCED_MIN_FILL * cdiv(batch_heads, slots_per_wave) * slots_per_wave:
        return None
    keys = blocks * block_n if keys is None else keys  # (the pairs' keys; default: whole tiles')
    if keys < BALANCED_MIN_PAIR_KEYS:
        return None
    near = batch_heads <= (1 + BALANCED_NEAR) * num_sms and keys >= BALANCED_NEAR_KEYS
    if batch_heads <= slots_per_wave and keys < BALANCED_MIN_KEYS and not near:
        return None
    per = cdiv(batch_heads * blocks, wave * num_sms)
    return cdiv(batch_heads * blocks, per), per, (blocks + per - 2) // per + 1


def decode_splits(q: torch.Tensor, k: torch.Tensor, win_left: int, win_right: int, kv_blocksize: int,
                  num_splits: int, num_stages: int) -> tuple[int, int, int, int, int, int]:
    """``(k0, k1, num_splits, split_len, block_n, programs)``: the keys the band lets any query see
    (``k0`` aligned to a tile), how they are split and the key tile. Uniform plans
    (:func:`split_plan`, :func:`wide_tile`, :func:`wide_splits`): ``num_splits`` splits of
    ``split_len`` keys per (batch, KV head), ``programs = 0``. Balanced plans (:func:`balanced_split`): runs of
    ``split_len`` keys over all pairs' keys in a row, ``programs`` programs, ``num_splits`` workspace
    slots per pair; one program per SM with twice the key tile where :func:`widened` lets it,
    the pairs have at least :data:`BALANCED_WIDE_KEYS` keys, else
    two per SM (one program per SM with the given tile read 0.94-0.99x two; with short
    pairs a program walks several, each ending in a mostly masked doubled tile)."""
    batch_heads, sms = q.shape[0] * k.shape[2], num_sms(q.device, 4)
    head_dim, elem, rows, smem = q.shape[-1], q.element_size(), decode_rows(q, k), device_info(q.device).smem_bytes
    block_n = wide_tile(batch_heads, num_splits, kv_blocksize, num_stages, head_dim, elem, sms, rows, smem)
    if block_n != kv_blocksize:
        num_splits = 1
    first, k1 = key_span(q.shape[1], k.shape[1], win_left, win_right)
    keys = max(k1 - first, 0)
    wide_split = wide_splits(batch_heads, num_splits, keys, block_n, num_stages, head_dim, elem, rows, sms, smem)
    if wide_split is not None:
        block_n, num_splits = wide_split

    def balanced_with(block: int, wave: int):  # (k0 aligned to the tile, the balanced plan or None)
        k0 = first // block * block
        return k0, balanced_split(batch_heads, cdiv(max(k1 - k0, 0), block), block, num_splits, sms, wave, keys)

    k0, balanced = balanced_with(block_n, 2)
    if balanced is not None and keys >= BALANCED_WIDE_KEYS:
        wide = widened(block_n, num_stages, head_dim, elem, rows, smem)
        if wide != block_n:  # one program per SM with the doubled tile
            block_n = wide
            k0, balanced = balanced_with(block_n, 1)
    if balanced is not None:
        programs, per, slots = balanced
        return k0, k1, slots, per * block_n, block_n, programs
    num_splits, split_len = split_plan(batch_heads, k1 - k0, block_n, num_splits, sms)
    return k0, k1, num_splits, split_len, block_n, 0


def decode_launches(q, k, v, out, lse, o_part, l_part, sink, *, softmax_scale: float, win_left: int, win_right: int,
                    softcap: float | None, kv_blocksize: int, num_warps: int, num_stages: int, splits: tuple,
                    has_sink: bool) -> list[tuple]:
    """The launches of one decode call, ``[(kernel, grid, args, meta)]``: the split kernel and,
    with more than one split, the combine kernel. ``splits``: :func:`decode_splits` (its key tile
    replaces ``kv_blocksize``);
    ``o_part``/``l_part``: the workspace (any tensor with one split); ``sink``: the sink logits,
    or any tensor without them."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    k0, k1, num_splits, split_len, kv_blocksize, programs = splits
    balanced = programs > 0
    pair_blocks = cdiv(k1 - k0, kv_blocksize)  # key blocks of each (batch, KV head)
    rows = decode_rows(q, k)
    direct = num_splits == 1
    qk_scale, cap = scale_args(softmax_scale, softcap)
    block_d = max(16, next_pow2(D))
    view = tma_rows(q, k, v)
    tma = view is not None
    pdl = not direct and decode_pdl(q)
    if tma:  # rows past the last head's keys read as zeros
        width, batch_pitch, head_pitch, head_col = view
        shape = [(B - 1) * batch_pitch + (Hkv - 1) * head_pitch + Sk, width]
        k_in = descriptor(k, shape, [k.stride(1), 1], (kv_blocksize, D), gluon=False)
        v_in = descriptor(v, shape, [v.stride(1), 1], (kv_blocksize, D), gluon=False)
    else:
        k_in, v_in = k, v
        batch_pitch = head_pitch = head_col = 0
    out_strides = (out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1))
    launches = [(decode_split_kernel, (programs or B * Hkv * num_splits,), (
        q, k_in, v_in, o_part, l_part, sink, out, lse, q.stride(0), q.stride(1), q.stride(2), k.stride(0),
        k.stride(1), k.stride(2), v.stride(0), v.stride(1), v.stride(2), *out_strides, Hkv, Hq // Hkv, Sq, Sk,
        num_splits, k0, k1, split_len, win_left, win_right, batch_pitch, head_pitch, head_col,
        B * Hkv * pair_blocks, qk_scale, cap), dict(
        SOFTCAP=bool(softcap), DIRECT=direct, TMA=tma, HAS_SINK=has_sink, HEAD_DIM=D, BLOCK_D=block_d,
        BLOCK_M=max(16, next_pow2(rows)), BLOCK_N=kv_blocksize, PRECISION=dot_precision(q.dtype), PDL=pdl,
        BALANCED=balanced, SHORT=balanced and k1 - k0 < kv_blocksize,
        Q_EACH_BLOCK=balanced and pair_blocks < Q_EACH_BLOCK_MAX, num_warps=num_warps,
        num_stages=num_stages, **LAUNCH_OPTIONS))]
    if not direct:
        launches.append((decode_combine_kernel, (B * Hkv * rows,), (
            o_part, l_part, sink, out, lse, *out_strides, Hkv, Hq // Hkv, Sq, num_splits,
            pair_blocks, split_len // kv_blocksize), dict(
            HAS_SINK=has_sink, HEAD_DIM=D, BLOCK_D=block_d, BLOCK_S=max(2, next_pow2(num_splits)), PDL=pdl,
            BALANCED=balanced,
            num_warps=1 if block_d <= 64 else 2, **({"launch_pdl": True} if pdl else {}))))
    return launches

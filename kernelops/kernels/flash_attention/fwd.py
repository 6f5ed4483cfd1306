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

from kernelops.kernels.common.masking import band_mask, key_block_range, tanh

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@triton.jit
def score_mods(s, rows, cols, Bias, stride_zm, stride_zn, slope, QSeg, KSeg, seq_q, seq_k, q_shift,
               HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SEG: tl.constexpr, MASKED: tl.constexpr):
    """Add the additive bias tile and the ALiBi term to scores ``s`` (log2 units), and mask
    pairs from different segments.

    ``rows``/``cols`` come pre-broadcast like ``band_mask``'s; ``Bias`` points at this
    (batch, head)'s ``[Sq, Sk]`` plane (any strides, 0 where broadcast); ``slope`` is the head's
    ALiBi slope times log2(e); ``QSeg``/``KSeg`` point at this batch's int32 segment ids.
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
def _fwd_block_loop(acc, l_i, m_i, q, K, V, stride_kn, stride_vn, Bias, stride_zm, stride_zn, slope, QSeg, KSeg,
                    rows, offs_d, lo, hi, seq_q, seq_k, q_shift, win_left, win_right, qk_scale, softcap,
                    MASKED: tl.constexpr, SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr,
                    HAS_SEG: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_N: tl.constexpr,
                    PRECISION: tl.constexpr):
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
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None], input_precision=PRECISION)
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def query_program_heads(num_heads, group):
    """(batch, query head, KV head) of a program on the grid ``(query blocks, B * Hq)``, as int64."""
    pid_bh = tl.program_id(1)
    h = pid_bh % num_heads
    return (pid_bh // num_heads).to(tl.int64), h.to(tl.int64), (h // group).to(tl.int64)


#: shape integers that change from call to call: not specialised, so a new length reuses the binary
SHAPE_ARGS = ["num_heads", "group", "seq_q", "seq_k", "win_left", "win_right"]


@triton.jit
def head_extras(Bias, stride_zb, stride_zh, Alibi, stride_ab, QSeg, KSeg, stride_sqb, stride_skb, b, h,
                HAS_ALIBI: tl.constexpr):
    """This (batch, head)'s bias plane, ALiBi slope (times log2(e); 0 without ALiBi) and the
    batch's query / key segment-id rows."""
    slope = 0.0
    if HAS_ALIBI:
        slope = tl.load(Alibi + b * stride_ab + h).to(tl.float32) * 1.4426950408889634
    return Bias + b * stride_zb + h * stride_zh, slope, QSeg + b * stride_sqb, KSeg + b * stride_skb


@triton.jit(do_not_specialize=SHAPE_ARGS)
def flash_attention_fwd_kernel(
    Q, K, V, O, LSE, Bias, Alibi, Sink, QSeg, KSeg,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ob, stride_os, stride_oh,
    stride_zb, stride_zh, stride_zm, stride_zn, stride_ab, stride_sqb, stride_skb,
    num_heads, group, seq_q, seq_k, win_left, win_right, qk_scale, softcap,
    SOFTCAP: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_ALIBI: tl.constexpr, HAS_SINK: tl.constexpr,
    HAS_SEG: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, PRECISION: tl.constexpr,
):
    b, h, hk = query_program_heads(num_heads, group)
    start_m = tl.program_id(0) * BLOCK_M
    q_shift = seq_k - seq_q

    rows = start_m + tl.arange(0, BLOCK_M)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d < HEAD_DIM
    q_ok = (rows[:, None] < seq_q) & d_ok[None, :]
    q = tl.load(Q + b * stride_qb + h * stride_qh + rows[:, None].to(tl.int64) * stride_qs + offs_d[None, :],
                mask=q_ok, other=0.0)
    K += b * stride_kb + hk * stride_kh
    V += b * stride_vb + hk * stride_vh
    Bias, slope, QSeg, KSeg = head_extras(Bias, stride_zb, stride_zh, Alibi, stride_ab, QSeg, KSeg, stride_sqb,
                                          stride_skb, b, h, HAS_ALIBI)

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)

    lo, full_lo, full_hi, hi = key_block_range(start_m, seq_q, seq_k, q_shift, win_left, win_right,
                                               BLOCK_M, BLOCK_N)
    acc, l_i, m_i = _fwd_block_loop(acc, l_i, m_i, q, K, V, stride_ks, stride_vs, Bias, stride_zm, stride_zn,
                                    slope, QSeg, KSeg, rows, offs_d, lo, full_lo, seq_q, seq_k, q_shift, win_left,
                                    win_right, qk_scale, softcap, True, SOFTCAP, HAS_BIAS, HAS_ALIBI, HAS_SEG,
                                    HEAD_DIM, BLOCK_D,
                                    BLOCK_N, PRECISION)
    acc, l_i, m_i = _fwd_block_loop(acc, l_i, m_i, q, K, V, stride_ks, stride_vs, Bias, stride_zm, stride_zn,
                                    slope, QSeg, KSeg, rows, offs_d, full_lo, full_hi, seq_q, seq_k, q_shift,
                                    win_left, win_right, qk_scale, softcap, False, SOFTCAP, HAS_BIAS, HAS_ALIBI,
                                    HAS_SEG, HEAD_DIM,
                                    BLOCK_D, BLOCK_N, PRECISION)
    acc, l_i, m_i = _fwd_block_loop(acc, l_i, m_i, q, K, V, stride_ks, stride_vs, Bias, stride_zm, stride_zn,
                                    slope, QSeg, KSeg, rows, offs_d, full_hi, hi, seq_q, seq_k, q_shift, win_left,
                                    win_right, qk_scale, softcap, True, SOFTCAP, HAS_BIAS, HAS_ALIBI, HAS_SEG,
                                    HEAD_DIM, BLOCK_D,
                                    BLOCK_N, PRECISION)
    if HAS_SINK:  # the sink logit joins the denominator only (gpt-oss attention sinks)
        sink = tl.load(Sink + h).to(tl.float32) * 1.4426950408889634
        m_fin = tl.maximum(m_i, sink)
        alpha = tl.math.exp2(m_i - m_fin)
        l_i = l_i * alpha + tl.math.exp2(sink - m_fin)
        acc = acc * alpha[:, None]
        m_i = m_fin
    empty = l_i == 0.0  # rows that see no key at all: output 0, lse -inf
    out = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    tl.store(O + b * stride_ob + h * stride_oh + rows[:, None].to(tl.int64) * stride_os + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=q_ok)
    tl.store(LSE + (b * num_heads + h) * seq_q + rows, lse, mask=rows < seq_q)


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
    """(qk_scale, softcap) kernel arguments, log2(e) folded in (see _fwd_block_loop)."""
    if softcap:
        return softmax_scale / softcap, softcap * LOG2E
    return softmax_scale * LOG2E, 0.0


def bias_strides(bias: torch.Tensor | None) -> tuple[int, int, int, int]:
    """Strides of a ``[B or 1, H or 1, Sq, Sk]`` bias, 0 along broadcast (size-1) dims."""
    if bias is None:
        return 0, 0, 0, 0
    return tuple(0 if bias.shape[i] == 1 else bias.stride(i) for i in range(4))


def extra_args(q: torch.Tensor, bias, alibi_slopes, softmax_aux, q_segment_ids=None,
               kv_segment_ids=None) -> tuple[tuple, tuple, dict]:
    """Kernel arguments for the optional score terms: ``(pointers, strides, constexpr flags)``.

    ``bias [B|1, H|1, Sq, Sk]`` (any float dtype, any strides), ``alibi_slopes [H]`` or ``[B, H]``,
    ``softmax_aux [H]`` (sink logits), segment ids ``[B, Sq]`` / ``[B, Sk]`` (int32). Absent ones
    get q as a placeholder pointer.
    """
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.contiguous()
    if softmax_aux is not None:
        softmax_aux = softmax_aux.contiguous()
    stride_ab = alibi_slopes.stride(0) if alibi_slopes is not None and alibi_slopes.dim() == 2 else 0
    has_seg = q_segment_ids is not None
    if has_seg:
        q_segment_ids = q_segment_ids.to(torch.int32).contiguous()
        kv_segment_ids = kv_segment_ids.to(torch.int32).contiguous()
    pointers = tuple(q if t is None else t for t in (bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids))
    strides = (*bias_strides(bias), stride_ab, q_segment_ids.stride(0) if has_seg else 0,
               kv_segment_ids.stride(0) if has_seg else 0)
    flags = dict(HAS_BIAS=bias is not None, HAS_ALIBI=alibi_slopes is not None, HAS_SINK=softmax_aux is not None,
                 HAS_SEG=has_seg)
    return pointers, strides, flags


def flash_attention_fwd(q, k, v, *, softmax_scale: float, win_left: int, win_right: int,
                        softcap: float | None, q_blocksize: int, kv_blocksize: int,
                        num_warps: int, num_stages: int, bias: torch.Tensor | None = None,
                        alibi_slopes: torch.Tensor | None = None, softmax_aux: torch.Tensor | None = None,
                        q_segment_ids: torch.Tensor | None = None, kv_segment_ids: torch.Tensor | None = None,
                        out: torch.Tensor | None = None, lse: torch.Tensor | None = None):
    """Launch the forward kernel. Shapes as in the module docstring; returns ``(out, lse)``.

    Logits are ``softcap(softmax_scale * q.k) + bias - slope_h * |j - (i + Sk - Sq)|``; the
    sink logit ``softmax_aux[h]`` joins each row's softmax denominator only; with segment ids a
    query sees only keys of its own segment. ``out``
    ([B, Sq, Hq, D], q's dtype, unit last stride) and ``lse`` ([B, Hq, Sq] float32, contiguous)
    may be given preallocated; they are written in full.

    ``win_left``/``win_right`` are the band bounds of kernels/common/masking.py (already resolved
    from causal / sliding_window by the caller).
    """
    q, k, v = unit_last_stride(q, k, v)
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    out = torch.empty((B, Sq, Hq, D), dtype=q.dtype, device=q.device) if out is None else out
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device) if lse is None else lse
    check_buffer("out", out, (B, Sq, Hq, D), q.dtype)
    check_buffer("lse", lse, (B, Hq, Sq), torch.float32, contiguous=True)
    if out.numel() == 0:
        lse.fill_(float("-inf"))
        return out, lse
    qk_scale, cap = scale_args(softmax_scale, softcap)
    pointers, strides, flags = extra_args(q, bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids)
    grid = (triton.cdiv(Sq, q_blocksize), B * Hq)
    flash_attention_fwd_kernel[grid](
        q, k, v, out, lse, *pointers,
        q.stride(0), q.stride(1), q.stride(2),
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        out.stride(0), out.stride(1), out.stride(2), *strides,
        Hq, Hq // Hkv, Sq, Sk, win_left, win_right, qk_scale, cap,
        SOFTCAP=bool(softcap), **flags, HEAD_DIM=D, BLOCK_D=max(16, triton.next_power_of_2(D)),
        BLOCK_M=q_blocksize, BLOCK_N=kv_blocksize, PRECISION=dot_precision(q.dtype),
        num_warps=num_warps, num_stages=num_stages,
    )
    return out, lse

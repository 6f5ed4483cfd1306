"""Flash attention forward over TMA tensor descriptors (Hopper's bulk tensor copy engine).

The plain dense case of :mod:`fwd` (no bias, ALiBi, segments, dropout or packing; causal,
sliding window, softcap, sinks and GQA kept) with K/V tiles fetched by tensor descriptors instead
of pointer arithmetic: one bulk copy per tile, no address or mask registers in the loop, and the
software pipeliner overlaps the copies with the two matrix products. Optional FP8 (e4m3) inputs
with per-tensor descale factors.

Layout: ``q [B, Sq, Hq, D]``, ``k/v [B, Sk, Hkv, D]`` (BSHD) whose (batch, seq) dims flatten into
one row axis (``stride(0) == S * stride(1)``) and whose heads sit side by side
(``stride(2) == D``, ``stride(3) == 1``): contiguous BSHD, or q/k/v sliced from a fused QKV
projection. The descriptors view them as 2-D ``[B * S, H * D]`` matrices; a tile that runs past
a sequence's end reads the next sequence's rows (or zeros past the tensor), which the band mask
removes from the scores and the value tile. ``out [B, Sq, Hq, D]`` (``out_dtype``),
``lse [B, Hq, Sq]`` float32, natural log, as in fwd.py. ``D`` must be a power of two (16..256).
"""

from __future__ import annotations


import torch
import triton
import triton.language as tl

from kernelops.kernels.common.host import LAUNCH_OPTIONS, cdiv, cuda_capability, interpreting, on_input_device
from kernelops.kernels.common.launch import direct_launch
from kernelops.kernels.common.masking import band_mask, key_block_range, tanh
from kernelops.kernels.common.tma import TensorDescriptor, row_descriptor, tma_rows_view
from kernelops.kernels.common.transpose import transpose_seq
from kernelops.kernels.flash_attention.fwd import check_buffer, join_sink, scale_args



FP8_DTYPES = (torch.float8_e4m3fn,)
#: head dims the descriptors' tiles take (a power of two, one 16..256-element row per tile row)
TMA_HEAD_DIMS = (16, 32, 64, 128, 256)


@triton.jit
def tma_block_loop(acc, l_i, m_i, q, desc_k, desc_v, kv_row, kv_col, vt_row, rows, lo, hi, seq_q, seq_k, q_shift,
                    win_left, win_right, qk_scale, softcap, MASKED: tl.constexpr, SOFTCAP: tl.constexpr,
                    V_T: tl.constexpr, FP8: tl.constexpr, BLOCK_N: tl.constexpr, WARP_SPEC: tl.constexpr):
    """Online softmax over key blocks ``[lo, hi)``; scores in log2 units (scale folded in)."""
    offs_n = tl.arange(0, BLOCK_N)
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WARP_SPEC):
        k = desc_k.load([kv_row + start_n, kv_col])
        qk = tl.dot(q, k.T)
        if SOFTCAP:
            s = tanh(qk * qk_scale) * softcap
        else:
            s = qk * qk_scale
        if MASKED:
            cols = start_n + offs_n
            s = tl.where(band_mask(rows[:, None], cols[None, :], seq_q, seq_k, q_shift, win_left, win_right), s,
                         float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp2(-inf) = 0
        else:
            m_new = tl.maximum(m_i, tl.max(s, 1))
            m_safe = m_new
        p = tl.math.exp2(s - m_safe[:, None])
        alpha = tl.math.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        if V_T:  # FP8: V^T tiles [D, BLOCK_N] so the second product's B operand is K-major (as wgmma wants)
            vt = desc_v.load([vt_row, start_n])
            if MASKED:  # columns past seq_k are padding: keep them out of 0 * v
                vt = tl.where((start_n + offs_n < seq_k)[None, :], vt, tl.zeros_like(vt))
            if FP8:  # P in [0, 1] scaled by 2^8 into e4m3's normal range (its subnormals start at 2^-6)
                acc = tl.dot((p * 256.0).to(vt.dtype), vt.T, acc * alpha[:, None])
            else:
                acc = tl.dot(p.to(vt.dtype), vt.T, acc * alpha[:, None])
        else:
            v = desc_v.load([kv_row + start_n, kv_col])
            if MASKED:  # rows past seq_k belong to the next sequence: keep their values out of 0 * v
                v = tl.where((start_n + offs_n < seq_k)[:, None], v, tl.zeros_like(v))
            acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@direct_launch
@triton.jit(do_not_specialize=["num_heads", "group", "seq_q", "seq_k", "num_blocks", "win_left", "win_right"])
def flash_attention_fwd_tma_kernel(
    desc_q, desc_k, desc_v, O, LSE, Sink,
    stride_ob, stride_os, stride_oh, stride_lb, stride_lh,
    num_heads, group, seq_q, seq_k, num_blocks, win_left, win_right, qk_scale, softcap, v_descale,
    SOFTCAP: tl.constexpr, HAS_SINK: tl.constexpr, LONGEST_FIRST: tl.constexpr, V_T: tl.constexpr, FP8: tl.constexpr,
    HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WARP_SPEC: tl.constexpr,
):
    pid = tl.program_id(0)
    blk = pid % num_blocks
    bh = pid // num_blocks
    if LONGEST_FIRST:  # causal: the last query blocks see the most keys; start them first
        blk = num_blocks - 1 - blk
    h = bh % num_heads
    b = bh // num_heads
    hk = h // group
    start_m = blk * BLOCK_M
    q_shift = seq_k - seq_q
    rows = start_m + tl.arange(0, BLOCK_M)
    q = desc_q.load([b * seq_q + start_m, h * HEAD_DIM])

    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], dtype=tl.float32)
    lo, full_lo, full_hi, hi = key_block_range(start_m, seq_q, seq_k, q_shift, win_left, win_right, BLOCK_M, BLOCK_N)
    kv_row = b * seq_k
    kv_col = hk * HEAD_DIM
    vt_row = (b * (num_heads // group) + hk) * HEAD_DIM
    acc, l_i, m_i = tma_block_loop(acc, l_i, m_i, q, desc_k, desc_v, kv_row, kv_col, vt_row, rows, lo, full_lo, seq_q,
                                    seq_k, q_shift, win_left, win_right, qk_scale, softcap, True, SOFTCAP, V_T, FP8,
                                    BLOCK_N, False)
    acc, l_i, m_i = tma_block_loop(acc, l_i, m_i, q, desc_k, desc_v, kv_row, kv_col, vt_row, rows, full_lo, full_hi, seq_q,
                                    seq_k, q_shift, win_left, win_right, qk_scale, softcap, False, SOFTCAP, V_T, FP8,
                                    BLOCK_N, WARP_SPEC)
    acc, l_i, m_i = tma_block_loop(acc, l_i, m_i, q, desc_k, desc_v, kv_row, kv_col, vt_row, rows, full_hi, hi, seq_q,
                                    seq_k, q_shift, win_left, win_right, qk_scale, softcap, True, SOFTCAP, V_T, FP8,
                                    BLOCK_N, False)
    if HAS_SINK:  # the sink logit joins the denominator only
        acc, l_i, m_i = join_sink(acc, l_i, m_i, tl.load(Sink + h).to(tl.float32) * 1.4426950408889634)
    empty = l_i == 0.0
    out = acc * (v_descale / tl.where(empty, 1.0, l_i))[:, None]
    lse = tl.where(empty, float("-inf"), (m_i + tl.math.log2(tl.where(empty, 1.0, l_i))) * 0.6931471805599453)
    offs_d = tl.arange(0, HEAD_DIM)
    b64 = b.to(tl.int64)
    h64 = h.to(tl.int64)
    tl.store(O + b64 * stride_ob + h64 * stride_oh + rows[:, None].to(tl.int64) * stride_os + offs_d[None, :],
             out.to(O.dtype.element_ty), mask=rows[:, None] < seq_q)
    tl.store(LSE + b64 * stride_lb + h64 * stride_lh + rows, lse, mask=rows < seq_q)


def tma_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether :func:`flash_attention_fwd_tma` can run these dense BSHD inputs (see the module docstring)."""
    if TensorDescriptor is None or q.dim() != 4:
        return False
    if q.is_cuda:
        if cuda_capability(q)[0] < 9:
            return False
    elif not interpreting():
        return False
    D = q.shape[-1]
    if D not in TMA_HEAD_DIMS or q.dtype not in (torch.float16, torch.bfloat16, *FP8_DTYPES):
        return False
    for t in (q, k, v):
        if t.dtype != q.dtype or not tma_rows_view(t):
            return False
    return q.numel() > 0 and k.numel() > 0


@on_input_device
def flash_attention_fwd_tma(q, k, v, *, softmax_scale: float, win_left: int, win_right: int, softcap: float | None,
                            q_blocksize: int, kv_blocksize: int, num_warps: int, num_stages: int,
                            softmax_aux: torch.Tensor | None = None, descale: tuple[float, float, float] | None = None,
                            out_dtype: torch.dtype | None = None, longest_first: bool | None = None,
                            warp_specialize: bool = False, transpose_v: bool | None = None,
                            out: torch.Tensor | None = None,
                            lse: torch.Tensor | None = None, checked: bool = False):
    """Launch the TMA forward; returns ``(out [B, Sq, Hq, D], lse [B, Hq, Sq] float32)``.

    Same semantics as :func:`kernelops.kernels.flash_attention.fwd.flash_attention_fwd` for the
    terms it takes. FP8 (``float8_e4m3fn`` q/k/v): ``descale = (dq, dk, dv)`` are the per-tensor
    factors that map the stored values back to real ones (``q_real = dq * q``); the scores use
    ``dq * dk * softmax_scale`` and the output is multiplied by ``dv``; P enters the second product
    as e4m3 (scaled by 2^8). ``out_dtype`` defaults to q's dtype (bfloat16 for FP8). ``longest_first`` (default: when
    causal) launches the query blocks that see the most keys first. ``transpose_v`` (default: for
    FP8) copies V once into ``[B, Hkv, D, Sk]`` so the P @ V product reads K-major tiles, the only
    operand order Hopper's FP8 matrix instructions take. ``checked``: the caller has run
    :func:`tma_supported` (the dense dispatcher), so the launch does not repeat it.
    """
    if not checked and not tma_supported(q, k, v):
        raise ValueError(f"the TMA forward needs CUDA sm90+ BSHD inputs with [B*S, H*D] row views and D a power of two; "
                         f"got q.shape={tuple(q.shape)} q.stride()={q.stride()} k.stride()={k.stride()} {q.dtype}")
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    fp8 = q.dtype in FP8_DTYPES
    if fp8 and descale is None:
        descale = (1.0, 1.0, 1.0)
    out_dtype = out_dtype or (torch.bfloat16 if fp8 else q.dtype)
    out = torch.empty((B, Sq, Hq, D), dtype=out_dtype, device=q.device) if out is None else out
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device) if lse is None else lse
    check_buffer("out", out, (B, Sq, Hq, D), out_dtype)
    check_buffer("lse", lse, (B, Hq, Sq), torch.float32, contiguous=True)
    dq, dk, dv = descale if fp8 else (1.0, 1.0, 1.0)
    qk_scale, cap = scale_args(softmax_scale * dq * dk, softcap)  # the cap applies to the real (descaled) logits
    if longest_first is None:
        longest_first = win_right == 0
    if transpose_v is None:
        transpose_v = fp8
    if transpose_v:
        vt = transpose_seq(v)
        desc_v = TensorDescriptor(vt, [B * Hkv * D, vt.shape[-1]], [vt.shape[-1], 1], [D, kv_blocksize])
    else:
        desc_v = row_descriptor(v, kv_blocksize, gluon=False)
    num_blocks = cdiv(Sq, q_blocksize)
    flash_attention_fwd_tma_kernel[(num_blocks * B * Hq,)](
        row_descriptor(q, q_blocksize, gluon=False), row_descriptor(k, kv_blocksize, gluon=False), desc_v, out, lse,
        q if softmax_aux is None else softmax_aux.contiguous(),
        out.stride(0), out.stride(1), out.stride(2), lse.stride(0), lse.stride(1),
        Hq, Hq // Hkv, Sq, Sk, num_blocks, win_left, win_right, qk_scale, cap, float(dv) / 256.0 if fp8 else 1.0,
        SOFTCAP=bool(softcap), HAS_SINK=softmax_aux is not None, LONGEST_FIRST=bool(longest_first), V_T=bool(transpose_v), FP8=fp8,
        HEAD_DIM=D, BLOCK_M=q_blocksize, BLOCK_N=kv_blocksize, WARP_SPEC=bool(warp_specialize),
        num_warps=num_warps, num_stages=num_stages, **LAUNCH_OPTIONS,
    )
    return out, lse

"""Which kernels run a flash-attention backward, as lists of launches.

:func:`ws_mode` picks the warp-specialised Gluon kernels a call can take (the dK/dV kernel of
:mod:`bwd_ws`, the fused kernels of :mod:`bwd_fused` and :mod:`bwd_d256`), and
:func:`bwd_launches` lists every launch of a backward, in order, as ``(kernel, grid, args, meta)``
tuples: the general path (``dispatch.flash_attention_bwd``) runs them and a per-signature plan
(:mod:`plans`) binds them once.
"""

from __future__ import annotations

import torch

from kernelops.kernels.flash_attention.bwd import preprocess_launch, split_launches
from kernelops.kernels.flash_attention.bwd_d256 import D256, d256_launch, d256_split, d256_supported
from kernelops.kernels.flash_attention.bwd_fused import (
    bwd_fused_packed_supported, dkv_buffer, fused_launch, fused_split, packed_table, packed_unit)
from kernelops.kernels.flash_attention.bwd_ws import dkdv_ws_band, dkdv_ws_launch, dkdv_ws_supported
from kernelops.kernels.flash_attention.varlen import ws_schedule_launch
from kernelops.kernels.flash_attention.ws_common import packed_window_band


def ws_mode(q, k, v, dout, dk, dv, win_left, win_right, softcap, terms, dropout_p, packed, fused: bool):
    """``(mode, band)``: which warp-specialised Gluon kernels take the call (causal, causal with a
    left window, or full attention, no other score terms or dropout, :func:`bwd_ws.dkdv_ws_supported`
    tensors; ``terms``: the optional score-term tensors, all None here). Mode 2: the fused kernel
    writes dQ, dK and dV (``fused``, :mod:`bwd_fused`); 1: the dK/dV kernel writes dK and dV (the
    dQ kernel still runs); 0: neither (``band`` None). ``band``: ``(causal, win_left or None)``.
    At D=256 only the fused kernel exists (:mod:`bwd_d256`, :func:`bwd_d256.d256_supported` tensors):
    mode 2 with ``fused``, else 0. ``packed``: False, or packed sequences' ``(cum_seqlens_q,
    cum_seqlens_k)`` (``[total, H, D]`` tensors), which the fused kernels take at D 64/128/256 with one
    offsets tensor or two, causal, full or a causal window (:func:`bwd_fused.bwd_fused_packed_supported`;
    dq is checked as dout; the band: ``ws_common.packed_window_band``).
    A soft cap runs the fused kernels only (mode 2)."""

    if (softcap and not fused) or dropout_p > 0 or any(t is not None for t in terms):
        return 0, None
    if packed:
        band = packed_window_band(win_left, win_right, q, k)  # any sequence's band: the whole one's
        if not fused or band is None or not bwd_fused_packed_supported(q, k, v, dout, dout, dk, dv, *packed):
            return 0, None
        return 2, band
    if q.dim() != 4:
        return 0, None
    band = dkdv_ws_band(win_left, win_right, k.shape[1])
    if band is None:
        return 0, None
    if q.shape[-1] == D256:
        return (2, band) if fused and d256_supported(q, k, v, dout, dk, dv) else (0, None)
    if not dkdv_ws_supported(q, k, v, dout, dk, dv):
        return 0, None
    return (2 if fused else 1), band


def dkv_workspace(q, k, causal: bool, win_left: int | None = None) -> torch.Tensor | None:
    """The zeroed float32 ``[2, B, S, Hkv, D]`` the fused Gluon kernel adds dK and dV into when it
    splits the query heads of these tensors (``q [B, S, Hq, D]``, ``k [B, S, Hkv, D]``) and band:
    :func:`bwd_d256.d256_split` at D=256, :func:`bwd_fused.fused_split` otherwise; else None. The
    caller passes its halves as dk and dv and copies them into the gradients after
    (:func:`bwd_fused.copy_workspaces`)."""

    rule = d256_split if q.shape[-1] == D256 else fused_split
    return dkv_buffer(k) if rule(q.shape, k.shape, causal, win_left) else None


def ws_launches(mode, band, q, k, v, dout, lse, delta, dq_acc, dk, dv, softmax_scale, softcap=None) -> list:
    """The Gluon launch of :func:`ws_mode`'s ``mode`` (1 or 2; ``softcap`` with 2 only) as
    ``[(kernel, grid, args, meta)]`` (dense tensors; packed ones: :func:`packed_launches`)."""

    if q.shape[-1] == D256:
        return [d256_launch(q, k, v, dout, lse, delta, dq_acc, dk, dv, softmax_scale, band[0], win_left=band[1],
                            softcap=softcap)]
    if mode == 2:
        return [fused_launch(q, k, v, dout, lse, delta, dq_acc, dk, dv, softmax_scale, band[0], win_left=band[1],
                             softcap=softcap)]
    return [dkdv_ws_launch(q, k, v, dout, lse, delta, dk, dv, softmax_scale, band[0], win_left=band[1])]


def packed_launches(q, k, v, dout, lse, delta, dq_acc, dk, dv, cum_seqlens, table, softmax_scale: float,
                    causal: bool, cum_seqlens_k=None, win_left: int | None = None,
                    softcap: float | None = None) -> list:
    """The packed fused backward's launches after the delta kernel, as ``[(kernel, grid, args,
    meta)]``: the programs' schedule filling ``table`` (``bwd_fused.packed_table`` over the keys' offsets;
    one program per (sequence, KV head, key block of :func:`packed_unit` keys), sequences with the
    most queries first and each one's key blocks in order: ``varlen.ws_schedule_launch`` with
    full-attention units), then ``bwd_fused.fused_launch`` (D 64/128) or ``bwd_d256.d256_launch`` (D=256)
    over the batch-of-one tensors. ``cum_seqlens_k``: the keys' own offsets (None: ``cum_seqlens``
    delimits both sides); ``win_left`` (with ``causal``): a sliding window per sequence; ``softcap``:
    soft-capped logits. What
    :func:`bwd_launches` makes for packed calls, and a plan binds."""

    cu_k = cum_seqlens if cum_seqlens_k is None else cum_seqlens_k
    schedule = (cum_seqlens, table, cu_k)
    if q.shape[-1] == 256:

        launch = d256_launch(q, k, v, dout, lse, delta, dq_acc, dk, dv, softmax_scale, causal, win_left=win_left,
                             schedule=schedule, softcap=softcap)
    else:
        launch = fused_launch(q, k, v, dout, lse, delta, dq_acc, dk, dv, softmax_scale, causal, win_left=win_left,
                              schedule=schedule, softcap=softcap)
    return [ws_schedule_launch(cu_k, table, k.shape[2], False, block=packed_unit(q.shape[-1]), weights=cum_seqlens),
            launch]


def bwd_launches(mode, band, q4, k4, v4, out4, dout4, lse, dlse, delta, dq_acc, dq4, dk4, dv4, terms, *,
                 softmax_scale, **split) -> list:
    """Every launch of a backward, in order, as ``[(kernel, grid, args, meta)]``: the delta kernel
    (zeroing ``dq_acc`` for the fused kernel; packed sequences' delta and lse as
    :func:`bwd_fused.padded_stats` makes them), then :func:`ws_mode`'s Gluon kernel for ``mode`` 1 or
    2, then the Triton kernels unless the fused one wrote dQ (``split``: :func:`split_launches`'
    keywords). The general path runs them; a plan binds them (:mod:`plans`)."""
    launches = [preprocess_launch(out4, dout4, dlse, delta, dq_acc)]
    cu, cu_k = split.get("cum_seqlens_q"), split.get("cum_seqlens_k")
    if mode and cu is not None:  # packed (the fused kernel, mode 2): its programs' schedule, then the kernel
        table = packed_table(cu_k, k4.shape[1], k4.shape[2], q4.shape[-1])
        launches += packed_launches(q4, k4, v4, dout4, lse, delta, dq_acc, dk4, dv4, cu, table,
                                              softmax_scale, band[0], cum_seqlens_k=cu_k, win_left=band[1],
                                              softcap=split.get("softcap"))
    elif mode:
        launches += ws_launches(mode, band, q4, k4, v4, dout4, lse, delta, dq_acc, dk4, dv4, softmax_scale,
                                split.get("softcap"))
    if mode != 2:
        launches += split_launches(q4, k4, v4, dout4, lse, delta, dq4, dk4, dv4, terms, softmax_scale=softmax_scale,
                                   dkdv=mode == 0, **split)
    return launches

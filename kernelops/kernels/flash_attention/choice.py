"""Which flash-attention kernels a call takes by default: the Operation's rules over its prepared
inputs (``FlashAttentionInputs``) and a device (``DeviceInfo``), kept beside the kernels they
choose between: the TMA-descriptor forward (:mod:`fwd_tma`), the warp-specialised Gluon forward
(:mod:`fwd_ws`) and backwards (:mod:`bwd_ws`, :mod:`bwd_fused`, :mod:`bwd_d256`).
"""

from __future__ import annotations

import torch

from kernelops.kernels.common.gluon import GLUON
from kernelops.kernels.flash_attention.bwd_d256 import d256_shape_supported
from kernelops.kernels.flash_attention.bwd_fused import PACKED_HEAD_DIMS
from kernelops.kernels.flash_attention.bwd_ws import DKDV_HEAD_DIMS
from kernelops.kernels.flash_attention.fwd_tma import TMA_HEAD_DIMS
from kernelops.kernels.flash_attention.ws_common import (
    WS_HEAD_DIMS, packed_window_band, same_offsets, window_band, ws_scale_ok, ws_shape_supported)


def tma_applies(inputs, device) -> bool:
    """Whether the call may run the TMA-descriptor forward (``FwdParams.tma``): Hopper or
    newer, float16/bfloat16, D a power of two, no bias / ALiBi / segments / packing / dropout.
    (The inputs' strides are checked at launch; calls the kernel cannot read fall back to the
    pointer kernel.)"""

    return (device.is_cuda and device.capability is not None and device.capability[0] >= 9
            and inputs.query.dtype in (torch.float16, torch.bfloat16) and inputs.query.dim() == 4
            and inputs.query.shape[-1] in TMA_HEAD_DIMS and not inputs.varlen and inputs.bias is None
            and inputs.alibi_slopes is None and inputs.q_segment_ids is None and inputs.dropout_prob == 0)

def ws_applies(inputs, device, backward: bool = False) -> bool:
    """Whether the call may run the warp-specialised Gluon kernels (``FwdParams.ws`` /
    ``BwdParams.ws``): sm_90, a Triton with Gluon, float16/bfloat16 BSHD, D 64/128 (the forward
    also 256), causal or full attention or a causal left window (``ws_common.window_band``), a
    soft cap (in the backward the fused kernels take it, the dK/dV kernel alone does not:
    ``backward.ws_mode``), no other score terms. The forward takes any ``0 < Sq <= Sk`` (bottom-right causal); the dK/dV
    kernel (``backward``) needs ``Sq == Sk`` a multiple of 128; the forward a positive
    scale (``ws_common.ws_scale_ok``). The backward also takes D=256 (the fused kernel of
    ``bwd_d256``, ``Sq == Sk`` a multiple of 64). (Strides are checked at launch; calls the
    kernels cannot read run the tiles' kernels.)"""

    q, k = inputs.query, inputs.key
    if inputs.varlen:  # the backward: the fused kernels (bwd_fused.bwd_fused_packed_supported, D 64/128/256)
        return ws_packed_applies(inputs, device) and (not backward or q.shape[-1] in PACKED_HEAD_DIMS)
    band = window_band(inputs.win_left, inputs.win_right, k.shape[1])
    if backward:
        shape_ok = (ws_shape_supported(q.shape, k.shape, q.dtype, head_dims=DKDV_HEAD_DIMS)
                    or d256_shape_supported(q.shape, k.shape, q.dtype))
    else:
        shape_ok = ws_shape_supported(q.shape, k.shape, q.dtype, ragged=True)
    # the TMA kernel's scope (plain score terms, no packing or dropout), narrowed
    return (GLUON and tma_applies(inputs, device) and tuple(device.capability) == (9, 0)
            and shape_ok and k.dtype == q.dtype
            and band is not None and inputs.softmax_aux is None
            and (backward or ws_scale_ok(inputs.softmax_scale)))

def ws_packed_applies(inputs, device) -> bool:
    """Whether a packed call may run the warp-specialised forward
    (``fwd_ws.flash_attention_fwd_ws_packed``) and the fused backward (when
    ``BwdParams.fused`` allows): sm_90, Gluon, float16/bfloat16, D 64/128/256, a causal or
    full band or a causal sliding window (``ws_common.packed_window_band``), a soft cap, a
    positive scale and no other score terms or dropout (``ws_common.ws_packed_supported``, with
    strides, at launch). Both take one offsets tensor for queries and keys, or two (per-side
    lengths)."""

    q, k = inputs.query, inputs.key
    band = packed_window_band(inputs.win_left, inputs.win_right, q, k)
    return (GLUON and device.is_cuda and tuple(device.capability or ()) == (9, 0)
            and q.dtype in (torch.float16, torch.bfloat16) and k.dtype == q.dtype
            and q.shape[-1] in WS_HEAD_DIMS and k.shape[-1] == q.shape[-1]
            and band is not None and inputs.softmax_aux is None
            and inputs.bias is None
            and inputs.alibi_slopes is None and inputs.q_segment_ids is None and inputs.dropout_prob == 0
            and ws_scale_ok(inputs.softmax_scale))

def ws_flops(inputs) -> float:
    """Forward FLOPs of the call over the keys its queries see (about half when causal, fewer
    with a left window), the measure of the ws kernels' floor. Packed calls: as if every query
    saw the longest sequence's keys (``max_seqlen_k``, else the key token count), an upper
    bound, halved when causal with one offsets tensor (with two, a short query chunk over a
    long prefix sees nearly all of its keys)."""
    if inputs.varlen:

        Tq, Hq, D = inputs.query.shape
        Tk = inputs.key.shape[0]
        pairs = Tq * min(inputs.max_seqlen_k or Tk, Tk)
        halved = inputs.win_right == 0 and same_offsets(inputs.cum_seqlens_q, inputs.cum_seqlens_k)
        return 4 * Hq * D * pairs / (2 if halved else 1)
    B, Sq, Hq, D = inputs.query.shape
    Sk = inputs.key.shape[1]
    if inputs.win_right != 0:
        return 4 * B * Hq * D * Sq * Sk
    if inputs.win_left >= Sk - 1:
        return 4 * B * Hq * D * Sq * Sk / 2
    w = inputs.win_left + 1  # keys per query away from the start
    return 4 * B * Hq * D * (Sq * w - w * (w - 1) / 2)


def ws_auto(inputs, device, floor: float, backward: bool = False) -> bool:
    """``FwdParams.ws=None`` / ``BwdParams.ws=None`` resolved: the warp-specialised kernels where they
    apply, with ``Sq == Sk`` a multiple of 128 (other lengths run the forward only when a config
    or the tuner asks: correct on an H100, speed not yet measured), for calls of at least ``floor``
    forward FLOPs (the op's ``WS_MIN_FLOPS`` / ``WS_MIN_FLOPS_BWD``, 1e10 each): below them a
    call's host time, not its kernel, sets its speed. The forward
    at D=128 (1.0-1.2x the other kernels from 1k keys; on an H200 0.95-1.1x at 512-1k keys) and
    at D=64 (on an H200 1.15-1.22x the TMA and pointer kernels' causal forward at 1k-4k keys and
    1.18x the full one at 1k) and at D=256 (64-key blocks and one Q buffer:
    1.3-1.5x the TMA kernel on an H200 at 512-32k keys, full and causal);
    the dK/dV kernel at both (1.1-1.3x the Triton kernel), and with a causal left window at
    D=128 (1.2-1.6x at 1k-4k windows of 16k keys) and at D=64 (the tuner's configs on the
    Gluon backward, fused or split, ran 4096-key windows at 8k-128k keys 1.11-1.31x faster than
    the heuristic's Triton backward on an H200, with and without GQA); the D=256
    backward (bwd_d256.py: forward+backward 1.6-1.8x the Triton kernels' on an H200 at 512-32k
    keys, full and causal; with a left window checked against float64, its speed not
    measured)."""
    q, k = inputs.query, inputs.key
    if not ws_applies(inputs, device, backward) or ws_flops(inputs) < floor:
        return False
    if inputs.varlen or backward:  # (as ws_applies; it checked Sq == Sk for the backward)
        return True
    return ws_shape_supported(q.shape, k.shape, q.dtype)

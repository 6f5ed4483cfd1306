"""The flash-attention kernels' entry points: each picks the kernel a call takes and runs it
through its per-signature launch plan (:mod:`plans`) where one applies.

- :func:`flash_attention_fwd_dense` / :func:`dense_forward`: the forward (warp-specialised Gluon
  kernel :mod:`fwd_ws`, TMA kernel :mod:`fwd_tma`, or the pointer kernel :mod:`fwd`);
- :func:`flash_attention_bwd`: the backward (:mod:`backward` lists its launches);
- :func:`flash_attention_decode`: the split-KV forward for a few queries (:mod:`decode`).
"""

from __future__ import annotations

import functools

import torch

from kernelops.kernels.common.host import on_input_device
from kernelops.kernels.common.tma import tma_rows_view
from kernelops.kernels.flash_attention.backward import bwd_launches, dkv_workspace, ws_mode
from kernelops.kernels.flash_attention.bwd_fused import copy_workspaces, padded_stats
from kernelops.kernels.flash_attention.decode import decode_launches, decode_splits, workspace_shapes
from kernelops.kernels.flash_attention.fwd import check_buffer, flash_attention_fwd, unit_last_stride
from kernelops.kernels.flash_attention.fwd_tma import flash_attention_fwd_tma, tma_supported
from kernelops.kernels.flash_attention.fwd_ws import flash_attention_fwd_ws, flash_attention_fwd_ws_packed
from kernelops.kernels.flash_attention.plans import (
    bwd_plan, decode_plan, fwd_ws_plan, packed_bwd_plan, packed_fwd_plan, ptr_fwd_plan, ptr_scalars, run_on_device)
from kernelops.kernels.flash_attention.reference import reduce_bias_grad, sink_grad
from kernelops.kernels.flash_attention.smem import MAX_DECODE_ROWS, decode_rows
from kernelops.kernels.flash_attention.ws_common import (
    packed_window_band, same_offsets, ws_call_band, ws_packed_supported, ws_scale_ok, ws_supported)


#: flash_attention_fwd arguments the TMA kernel does not take: a call that sets one runs the pointer kernel
#: score terms only the pointer kernel takes, and with them packed sequences
_EXTRA_TERMS = ("bias", "alibi_slopes", "q_segment_ids", "kv_segment_ids")
_POINTER_ONLY = _EXTRA_TERMS + ("cum_seqlens_q", "cum_seqlens_k")


def ws_packed_forward(q, k, v, kwargs):
    """The warp-specialised packed forward's ``(out, lse)`` when it takes the call (packed
    sequences with one offsets tensor or two, and nothing else but a causal or full band or a causal
    sliding window and a soft cap: ``ws_common.ws_packed_supported``,
    ``ws_common.packed_window_band``), else None."""
    softcap = kwargs.get("softcap") or None
    if (kwargs.get("dropout_p") or kwargs.get("softmax_aux") is not None
            or any(kwargs.get(n) is not None for n in _EXTRA_TERMS) or not ws_scale_ok(kwargs["softmax_scale"])):
        return None
    out, lse = kwargs.get("out"), kwargs.get("lse")
    cu_q, cu_k = kwargs["cum_seqlens_q"], kwargs["cum_seqlens_k"]
    if out is None and lse is None:
        plan = packed_fwd_plan(q, k, v, cu_q, cu_k, kwargs["softmax_scale"], kwargs["win_left"], kwargs["win_right"],
                               softcap)
        if plan is not None:
            return run_on_device(q, plan, k, v, cu_q, cu_k)
    band = packed_window_band(kwargs["win_left"], kwargs["win_right"], q, k)
    if band is None or not ws_packed_supported(q, k, v, cu_q, cu_k, two_offsets=True):
        return None
    if out is not None and not tma_rows_view(out[None]):
        return None
    return flash_attention_fwd_ws_packed(q, k, v, cu_q, softmax_scale=kwargs["softmax_scale"], causal=band[0],
                                         window=band[1], softcap=softcap, out=out, lse=lse, checked=True,
                                         cum_seqlens_k=None if same_offsets(cu_q, cu_k) else cu_k)


def ws_dense_forward(q, k, v, kwargs):
    """The warp-specialised dense forward's ``(out, lse)`` when it takes the call (its band, scale,
    soft cap and inputs: ``ws_common.ws_call_band``; through the
    signature's plan when the outputs are not preallocated), else None. The caller has checked
    the rest (no extra terms, packing, dropout or sinks)."""
    softcap, out = kwargs.get("softcap") or None, kwargs.get("out")
    if out is None and kwargs.get("lse") is None:
        plan = fwd_ws_plan(q, k, v, kwargs["softmax_scale"], kwargs["win_left"], kwargs["win_right"], softcap)
        if plan is not None:
            return run_on_device(q, plan, k, v)
    band = ws_call_band(q, k, v, kwargs["softmax_scale"], kwargs["win_left"], kwargs["win_right"])
    if band is None or not (out is None or ws_supported(out, k, v, True)):
        return None
    return flash_attention_fwd_ws(q, k, v, softmax_scale=kwargs["softmax_scale"], causal=band[0], window=band[1],
                                  softcap=softcap, out=out, lse=kwargs.get("lse"), ragged=True, checked=True)


def planned_pointer_forward(q, k, v, kwargs, scalars=None):
    """The pointer forward's ``(out, lse)`` through its per-signature plan when one takes the call
    (no extra score terms, dropout or preallocated outputs: ``plans.ptr_fwd_plan``), else None.
    ``scalars``: ``plans.ptr_scalars(kwargs)`` when the caller has it already."""
    if kwargs.get("dropout_p") or kwargs.get("out") is not None or kwargs.get("lse") is not None or \
            kwargs.get("softmax_aux") is not None or any(kwargs.get(n) is not None for n in _EXTRA_TERMS):
        return None
    cu_q, cu_k = kwargs.get("cum_seqlens_q"), kwargs.get("cum_seqlens_k")
    plan = ptr_fwd_plan(q, k, v, cu_q, cu_k, ptr_scalars(kwargs) if scalars is None else scalars)
    return None if plan is None else run_on_device(q, plan, k, v, cu_q, cu_k)


def dense_forward(*, tma: bool = False, ws: bool = False, **kwargs):
    """:func:`flash_attention_fwd_dense` with everything but ``(q, k, v)`` bound once (scalars and
    tiles, no tensors): a callable ``(q, k, v) -> (out, lse)``. Without ``ws``, and without ``tma``
    or with dropout (which the TMA kernel does not take), it is the pointer kernel's launcher
    (through its per-signature plan where one takes the call), so a call skips the per-call choice."""
    if not ws and (not tma or kwargs.get("dropout_p")):
        pointer = functools.partial(flash_attention_fwd, **kwargs)
        if kwargs.get("dropout_p"):
            return pointer
        scalars = ptr_scalars(kwargs)  # (once: the plan's key part these calls share)

        def run(q, k, v):
            planned = planned_pointer_forward(q, k, v, kwargs, scalars)
            return pointer(q, k, v) if planned is None else planned
        return run
    return functools.partial(flash_attention_fwd_dense, tma=tma, ws=ws, **kwargs)


def flash_attention_fwd_dense(q, k, v, *, tma: bool = False, ws: bool = False, **kwargs):
    """The dense forward as a config chose it: ``(out, lse)`` with the arguments and results of
    :func:`kernels.flash_attention.fwd.flash_attention_fwd`. With ``ws`` (``FwdParams.ws``
    resolved), calls the warp-specialised kernel takes (a positive scale among its conditions) run
    it (:mod:`fwd_ws`). With ``tma``
    (``FwdParams.tma``), calls the TMA kernel takes (plain score terms and sinks, no dropout,
    :func:`tma_supported` inputs) run it; every other call runs the pointer kernel with the tiles."""
    plain = not kwargs.get("dropout_p") and all(kwargs.get(n) is None for n in _POINTER_ONLY)
    if ws and kwargs.get("cum_seqlens_q") is not None:
        packed = ws_packed_forward(q, k, v, kwargs)
        if packed is not None:
            return packed
    if ws and plain and kwargs.get("softmax_aux") is None:
        dense = ws_dense_forward(q, k, v, kwargs)
        if dense is not None:
            return dense
    if tma and plain and tma_supported(q, k, v):
        kwargs.pop("dropout_p", None)
        kwargs.pop("dropout_seed", None)
        for name in _POINTER_ONLY:
            kwargs.pop(name, None)
        return flash_attention_fwd_tma(q, k, v, **kwargs, checked=True)
    planned = planned_pointer_forward(q, k, v, kwargs)
    return flash_attention_fwd(q, k, v, **kwargs) if planned is None else planned


@on_input_device
def flash_attention_bwd(q, k, v, out, dout, lse, dlse=None, *, softmax_scale: float, win_left: int,
                        win_right: int, softcap: float | None, q_blocksize: int, kv_blocksize: int,
                        num_warps: int, num_stages: int, bias: torch.Tensor | None = None,
                        alibi_slopes: torch.Tensor | None = None, softmax_aux: torch.Tensor | None = None,
                        q_segment_ids: torch.Tensor | None = None, kv_segment_ids: torch.Tensor | None = None,
                        cum_seqlens_q: torch.Tensor | None = None, cum_seqlens_k: torch.Tensor | None = None,
                        dropout_p: float = 0.0, dropout_seed: int = 0, bias_grad: bool = False,
                        dq: torch.Tensor | None = None,
                        dk: torch.Tensor | None = None, dv: torch.Tensor | None = None, ws: bool = False,
                        fused: bool = False):
    """Gradients ``(dq [B,Sq,Hq,D], dk [B,Sk,Hkv,D], dv [B,Sk,Hkv,D], dbias, dsink)``.

    ``lse [B, Hq, Sq]`` is the forward's float32 log-sum-exp; ``dlse`` (same shape, optional) the
    gradient that reached it. ``bias``/``alibi_slopes``/``softmax_aux`` as in the forward;
    ``dbias`` (bias's shape and dtype) is computed when ``bias_grad``, ``dsink [H]`` when a
    ``softmax_aux`` is given; otherwise they are None. ``dq/dk/dv`` may be given preallocated
    (written in full). Packed sequences (``cum_seqlens_q/k``): tensors ``[total, H, D]`` and
    ``lse [Hq, total_q]`` as in the forward. ``ws`` (``BwdParams.ws`` resolved): dK and dV of the
    calls the warp-specialised Gluon kernel takes come from it (:mod:`bwd_ws`); the tiles then
    serve the dQ kernel only; with ``fused`` as well, dQ comes from the same Gluon kernel
    (:mod:`bwd_fused`: float32 adds in any order, so not bit-reproducible) and the tiles are unused.
    """
    varlen = cum_seqlens_q is not None
    terms = (bias, alibi_slopes, softmax_aux, q_segment_ids, kv_segment_ids)
    if (not varlen and dq is None and dk is None and dv is None and not bias_grad and all(t is None for t in terms)
            and not softcap and not dropout_p):
        plan = bwd_plan(q, k, v, out, dout, lse, dlse, softmax_scale, win_left, win_right, q_blocksize, kv_blocksize,
                        num_warps, num_stages, ws, fused)
        if plan is not None:
            return plan(q, k, v, out, dout, lse, dlse)
    if (varlen and ws and fused and dlse is None and dq is None and dk is None and dv is None and not bias_grad
            and all(t is None for t in terms) and not softcap and not dropout_p):
        plan = packed_bwd_plan(q, k, v, out, dout, lse, cum_seqlens_q, cum_seqlens_k, softmax_scale, win_left,
                               win_right)
        if plan is not None:  # (this function runs with q's device current)
            return plan(q, k, v, out, dout, lse, cum_seqlens_q, cum_seqlens_k)
    if varlen:  # the kernels read the offsets with unit stride
        cum_seqlens_q, cum_seqlens_k = cum_seqlens_q.contiguous(), cum_seqlens_k.contiguous()
    q, k, v, out, dout = unit_last_stride(q, k, v, out, dout)
    if varlen:  # packed [total, H, D] as a batch of one with batch stride 0
        q4, k4, v4, out4, dout4 = (t.unsqueeze(0) for t in (q, k, v, out, dout))
    else:
        q4, k4, v4, out4, dout4 = q, k, v, out, dout
    B, Sq, Hq, D = q4.shape
    Sk = k4.shape[1]
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device) if dq is None else dq
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device) if dk is None else dk
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device) if dv is None else dv
    for name, buf, shape in (("dq", dq, q.shape), ("dk", dk, k.shape), ("dv", dv, v.shape)):
        check_buffer(name, buf, shape, q.dtype)
    bias_grad = bias_grad and bias is not None
    dbias_full = torch.zeros((B, Hq, Sq, Sk), dtype=torch.float32, device=q.device) if bias_grad else None
    lse = lse.contiguous()
    if q.numel() == 0 or k.numel() == 0:
        delta = (out4.float() * dout4.float()).sum(-1).transpose(1, 2).reshape(lse.shape)
        delta = delta - (0 if dlse is None else dlse)
        dsink = None
        if softmax_aux is not None:
            dsink = sink_grad(softmax_aux, lse, delta) if q.numel() else torch.zeros_like(softmax_aux)
        dbias = reduce_bias_grad(dbias_full, bias) if bias_grad else None
        return dq.zero_(), dk.zero_(), dv.zero_(), dbias, dsink
    mode, band = ws_mode(q, k, v, dout, dk, dv, win_left, win_right, softcap, terms, dropout_p,
                         varlen and (cum_seqlens_q, cum_seqlens_k), fused) if ws else (0, None)
    dq_acc = torch.empty(q4.shape, dtype=torch.float32, device=q.device) if mode == 2 else None
    # long GQA calls: dK, dV summed in float32 (packed calls walk their groups)
    dkv_acc = dkv_workspace(q, k, *band) if mode == 2 and not varlen else None
    if varlen and mode == 2:  # [1, Hq, total] rows padded to a multiple of 4 values for the Gluon kernel's TMA boxes
        lse, delta = padded_stats(lse)
    else:
        delta = torch.empty(lse.shape, dtype=torch.float32, device=q.device)  # same layout as lse
    dk4, dv4, dq4 = (t.unsqueeze(0) if varlen else t for t in (dk, dv, dq))
    launches = bwd_launches(
        mode, band, q4, k4, v4, out4, dout4, lse, dlse.contiguous() if dlse is not None else None, delta, dq_acc,
        dq4, *((dk4, dv4) if dkv_acc is None else dkv_acc.unbind(0)), terms, softmax_scale=softmax_scale,
        win_left=win_left, win_right=win_right, softcap=softcap,
        q_blocksize=q_blocksize, kv_blocksize=kv_blocksize, num_warps=num_warps, num_stages=num_stages,
        dropout_p=dropout_p, dropout_seed=dropout_seed, cum_seqlens_q=cum_seqlens_q, cum_seqlens_k=cum_seqlens_k,
        dbias_full=dbias_full)
    for kernel, grid, args, meta in launches:
        kernel[grid](*args, **meta)
    if mode == 2:  # no bias, sinks or other extra terms on that path
        copy_workspaces(dq_acc, dkv_acc, dq4, dk, dv)
        return dq, dk, dv, None, None
    dbias = reduce_bias_grad(dbias_full, bias) if bias_grad else None
    dsink = sink_grad(softmax_aux, lse, delta) if softmax_aux is not None else None
    return dq, dk, dv, dbias, dsink


@on_input_device
def flash_attention_decode(q, k, v, *, softmax_scale: float, win_left: int, win_right: int,
                           softcap: float | None, kv_blocksize: int, num_warps: int, num_stages: int,
                           num_splits: int = 0, softmax_aux: torch.Tensor | None = None,
                           out: torch.Tensor | None = None, lse: torch.Tensor | None = None):
    """Split-KV forward for ``group * Sq <= MAX_DECODE_ROWS``; returns ``(out, lse)`` like
    :func:`kernelops.kernels.flash_attention.fwd.flash_attention_fwd` (same masks, softcap, sinks).

    ``num_splits = 0`` sizes the split count from the device's SM count (see
    ``decode.split_plan``); the workspace holds ``B * Hkv * num_splits * group * Sq * (D + 1)``
    float32 values. Calls without preallocated outputs run through their signature's plan
    (:func:`plans.decode_plan`) where one takes them.
    """
    tiles = dict(softmax_scale=softmax_scale, win_left=win_left, win_right=win_right, softcap=softcap,
                 kv_blocksize=kv_blocksize, num_warps=num_warps, num_stages=num_stages)
    if out is None and lse is None:
        plan = decode_plan(q, k, v, softmax_aux, num_splits, tiles)
        if plan is not None:
            return plan(q, k, v, softmax_aux)
    q, k, v = unit_last_stride(q, k, v)
    B, Sq, Hq, D = q.shape
    rows = decode_rows(q, k)
    if rows > MAX_DECODE_ROWS:
        raise ValueError(f"decode launches take group * Sq <= {MAX_DECODE_ROWS} query rows per KV head, got {rows} "
                         f"(q.shape={tuple(q.shape)}, k.shape={tuple(k.shape)})")
    out = torch.empty_like(q, memory_format=torch.contiguous_format) if out is None else out
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device) if lse is None else lse
    check_buffer("out", out, (B, Sq, Hq, D), q.dtype)
    check_buffer("lse", lse, (B, Hq, Sq), torch.float32, contiguous=True)
    if out.numel() == 0:
        lse.fill_(float("-inf"))
        return out, lse
    splits = decode_splits(q, k, win_left, win_right, kv_blocksize, num_splits, num_stages)
    shapes = workspace_shapes(q, k, splits[2])
    o_part, l_part = (q, lse) if shapes is None else (q.new_empty(shape, dtype=torch.float32) for shape in shapes)
    sink = softmax_aux.contiguous() if softmax_aux is not None else q
    for kernel, grid, args, meta in decode_launches(q, k, v, out, lse, o_part, l_part, sink, **tiles, splits=splits,
                                                    has_sink=softmax_aux is not None):
        kernel[grid](*args, **meta)
    return out, lse

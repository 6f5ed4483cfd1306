"""The warp-specialised Hopper forward (:mod:`fwd_ws`) over FP8 (e4m3) inputs.

The same Gluon kernel, specialised by its operands' type: Q K^T is an e4m3 warpgroup MMA, P enters
P V as e4m3 scaled by 2^8 (the running maximum is lowered by 8 powers of two, so the scaling costs
no operation per element), and V is read as V^T tiles, because Hopper's FP8 matrix instructions
take K-major operands only: V is copied once per call into ``[B, Hkv, D, Sk_pad]``
(:func:`kernels.common.transpose.transpose_seq`, as the TMA kernel's FP8 path does; a caller
holding V^T already may pass it). O leaves through a staging
box of its own (a 16-bit O tile is twice an e4m3 Q box).

Layout: ``q [B, Sq, Hq, D]``, ``k/v [B, Sk, Hkv, D]`` ``torch.float8_e4m3fn`` (q and k row views as
:func:`common.tma.tma_rows_view` reads them; v any strides), ``D`` in {64, 128, 256}, ``0 < Sq <= Sk``
(bottom-right causal), causal or full attention, GQA. Per-tensor descale factors
``(dq, dk, dv)``: the scores use ``softmax_scale * dq * dk`` and O is multiplied by ``dv``.
Returns ``out [B, Sq, Hq, D]`` (``out_dtype``: bfloat16, float16 or float32) and
``lse [B, Hq, Sq]`` float32, natural log.
"""

from __future__ import annotations

import torch

from kernelops.kernels.common.gluon import GLUON
from kernelops.kernels.common.host import cuda_capability, on_input_device
from kernelops.kernels.common.tma import tma_rows_view
from kernelops.kernels.common.transpose import transpose_seq
from kernelops.kernels.flash_attention import fwd_ws, ws_common

FP8_DTYPE = torch.float8_e4m3fn


def ws_fp8_supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether :func:`flash_attention_fwd_ws_fp8` takes these inputs on this machine (module docstring)."""
    if not GLUON or not q.is_cuda or not ws_common.ws_shape_supported(q.shape, k.shape, q.dtype, ragged=True,
                                                                          dtypes=(FP8_DTYPE,)):
        return False
    if cuda_capability(q) != (9, 0):
        return False
    return (all(t.dtype == q.dtype and t.device == q.device for t in (k, v)) and v.shape == k.shape
            and tma_rows_view(q) and tma_rows_view(k))


def fp8_tiles(head_dim: int) -> tuple[int, int, int]:
    """``(kv_blocksize, num_stages, q_buffers)`` unless told: :func:`fwd_ws.ws_tiles`' tiles with
    three-stage K and V rings at D=64/128 (e4m3 tiles take half the shared memory: 160 KB at
    D=128 with the O boxes). On an H200 (benchmarks/flash_attention_fp8.py) three stages ran
    1.0-1.1x two from 2k keys at D=128, full and causal; at D=256 (64-key blocks) the two were
    within the runs' spread, so it keeps the 16-bit kernel's two."""
    return (64, 2, 1) if head_dim == 256 else (128, 3, 2)


@on_input_device
def flash_attention_fwd_ws_fp8(q, k, v, *, softmax_scale: float, causal: bool,
                               descale: tuple[float, float, float] = (1.0, 1.0, 1.0),
                               out_dtype: torch.dtype = torch.bfloat16, out: torch.Tensor | None = None,
                               lse: torch.Tensor | None = None, kv_blocksize: int | None = None,
                               num_stages: int | None = None, q_buffers: int | None = None,
                               consumers: int | None = None, v_t: torch.Tensor | None = None, checked: bool = False,
                               warmup_only: bool = False):
    """Launch the FP8 warp-specialised forward; returns ``(out [B, Sq, Hq, D], lse [B, Hq, Sq])``.

    ``descale = (dq, dk, dv)`` maps the stored e4m3 values to real ones (``q_real = dq * q``).
    ``softmax_scale * dq * dk`` must pass :func:`ws_common.ws_scale_ok`. Tiles (None each:
    :func:`fp8_tiles`), ``consumers`` and ``warmup_only`` as in :func:`fwd_ws.flash_attention_fwd_ws`;
    the FP8 tiles take half the shared memory of 16-bit ones plus an O staging box per consumer. ``v_t``: V already transposed, as
    :func:`transpose_seq` makes it (``[B, Hkv, D, Sk_pad]`` contiguous and 16-byte aligned; its
    columns past Sk must be zeros, which is not checked: P is 0 there, but 0 * NaN is not; None: made
    here). ``checked``: the caller has run :func:`ws_fp8_supported`."""
    from kernelops.kernels.flash_attention.fwd import check_buffer

    if not (warmup_only or checked) and not ws_fp8_supported(q, k, v):
        raise ValueError(f"the FP8 warp-specialised forward needs an sm_90 GPU, Gluon, float8_e4m3fn BSHD q/k row "
                         f"views, D in {ws_common.WS_HEAD_DIMS} and 0 < Sq <= Sk; got q {tuple(q.shape)} {q.stride()}, "
                         f"k {tuple(k.shape)} {k.stride()}, {q.dtype} on {q.device}")
    B, Sq, Hq, D = q.shape
    dq, dk, dv = descale
    kv_blocksize, num_stages, q_buffers = (default if x is None else x for x, default in
                                           zip((kv_blocksize, num_stages, q_buffers), fp8_tiles(D)))
    if v_t is None:
        v_t = transpose_seq(v)
    elif not (v_t.is_contiguous() and v_t.shape[:3] == (B, k.shape[2], D) and v_t.shape[3] % 16 == 0
              and v_t.shape[3] >= k.shape[1] and v_t.dtype == FP8_DTYPE and v_t.data_ptr() % 16 == 0):
        raise ValueError(f"v_t must be a contiguous, 16-byte aligned float8_e4m3fn [B, Hkv, D, Sk_pad] (Sk_pad >= "
                         f"Sk, a multiple of 16), "
                         f"got {tuple(v_t.shape)} {v_t.dtype}")
    out = torch.empty((B, Sq, Hq, D), dtype=out_dtype, device=q.device) if out is None else out
    lse = torch.empty((B, Hq, Sq), dtype=torch.float32, device=q.device) if lse is None else lse
    check_buffer("out", out, (B, Sq, Hq, D), out.dtype)
    check_buffer("lse", lse, (B, Hq, Sq), torch.float32, contiguous=True)
    if out.dtype not in (torch.bfloat16, torch.float16, torch.float32) or not tma_rows_view(out):
        raise ValueError(f"out must be a bfloat16/float16/float32 16-byte aligned [B*S, H*D] row view, got "
                         f"{out.dtype} strides {out.stride()}")
    kernel, grid, args, meta = fwd_ws.fwd_ws_launch(
        q, k, None, out, lse, softmax_scale * dq * dk, causal, kv_blocksize, num_stages, consumers=consumers,
        q_buffers=q_buffers, v_t=v_t, o_scale=dv)
    if warmup_only:
        return kernel.warmup(*args, **meta, grid=grid)
    kernel[grid](*args, **meta)
    return out, lse

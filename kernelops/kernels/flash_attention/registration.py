"""torch.library registration of flash attention: custom ops, fake (meta) kernels, autograd.

``kernelops::flash_attention_fwd(q, k, v, ..., platform, fwd_params, bwd_params) -> (out, lse)``
``kernelops::flash_attention_bwd(q, k, v, out, dout, lse, dlse, ..., platform, bwd_params) -> (dq, dk, dv)``

``platform`` is ``"triton"`` or ``"torch"``; params are ``[q_blocksize, kv_blocksize, num_warps,
num_stages]``. The forward op carries the backward's params so autograd can launch the tuned
backward. Registering as custom ops gives torch.compile an opaque, traceable node with shapes
from the fake kernels.
"""

from __future__ import annotations

import torch

from kernelops.kernels.flash_attention.bwd import flash_attention_bwd
from kernelops.kernels.flash_attention.fwd import flash_attention_fwd
from kernelops.kernels.flash_attention.reference import flash_attention_torch_bwd, flash_attention_torch_fwd


def _params(p: list[int]) -> dict:
    return dict(q_blocksize=p[0], kv_blocksize=p[1], num_warps=p[2], num_stages=p[3])


def _band(softmax_scale: float, win_left: int, win_right: int, softcap: float) -> dict:
    return dict(softmax_scale=softmax_scale, win_left=win_left, win_right=win_right, softcap=softcap or None)


@torch.library.custom_op("kernelops::flash_attention_fwd", mutates_args=())
def flash_attention_fwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale: float,
                           win_left: int, win_right: int, softcap: float, platform: str,
                           fwd_params: list[int], bwd_params: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    band = _band(softmax_scale, win_left, win_right, softcap)
    if platform == "triton":
        return flash_attention_fwd(q, k, v, **band, **_params(fwd_params))
    return flash_attention_torch_fwd(q, k, v, **band)


@flash_attention_fwd_op.register_fake
def _fwd_fake(q, k, v, softmax_scale, win_left, win_right, softcap, platform, fwd_params, bwd_params):
    B, Sq, Hq, D = q.shape
    return q.new_empty((B, Sq, Hq, D)), q.new_empty((B, Hq, Sq), dtype=torch.float32)


@torch.library.custom_op("kernelops::flash_attention_bwd", mutates_args=())
def flash_attention_bwd_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                           dout: torch.Tensor, lse: torch.Tensor, dlse: torch.Tensor | None,
                           softmax_scale: float, win_left: int, win_right: int, softcap: float,
                           platform: str, bwd_params: list[int]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    band = _band(softmax_scale, win_left, win_right, softcap)
    if platform == "triton":
        return flash_attention_bwd(q, k, v, out, dout, lse, dlse, **band, **_params(bwd_params))
    return flash_attention_torch_bwd(q, k, v, out, dout, lse, dlse, **band)


@flash_attention_bwd_op.register_fake
def _bwd_fake(q, k, v, out, dout, lse, dlse, softmax_scale, win_left, win_right, softcap, platform, bwd_params):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, win_left, win_right, softcap, platform, _fwd, bwd_params = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.args = (softmax_scale, win_left, win_right, softcap, platform, bwd_params)


def _backward(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    if dout is None:
        dout = torch.zeros_like(out)
    dq, dk, dv = flash_attention_bwd_op(q, k, v, out, dout, lse, dlse, *ctx.args)
    return dq, dk, dv, None, None, None, None, None, None, None


flash_attention_fwd_op.register_autograd(_backward, setup_context=_setup_context)

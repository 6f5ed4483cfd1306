"""Low-level flash attention API for users who drive the kernels themselves.

No executor, no autograd, no caches: one forward or backward launch with the block sizes you
give (missing ones from the heuristic). Both functions accept BSHD tensors (``layout="bshd"``,
``[B, S, H, D]``) or BHSD tensors (``layout="bhsd"``, ``[B, H, S, D]``); BHSD inputs are read
through transposed views, and outputs come back in the same layout as views, never copied.
"""

from __future__ import annotations

import dataclasses

import torch

from kernelops.modules.flash_attention import FLASH_ATTENTION, FlashAttentionConfig
from kernelops.ops.device import device_info
from kernelops.ops.params import BwdParams, FwdParams

LAYOUTS = ("bshd", "bhsd")


def _to_bshd(layout: str, *tensors):
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if layout == "bshd":
        return tensors
    return tuple(None if t is None else t.transpose(1, 2) for t in tensors)


def _params(kind, default, block_q, block_kv, num_warps, num_stages):
    given = dict(q_blocksize=block_q, kv_blocksize=block_kv, num_warps=num_warps, num_stages=num_stages)
    return kind(**{**dataclasses.asdict(default), **{k: v for k, v in given.items() if v is not None}})


def _prepare(q, k, v, kwargs):
    q, k, v = _to_bshd(kwargs.pop("layout"), q, k, v)
    inputs = FLASH_ATTENTION.prepare(query=q, key=k, value=v, **kwargs)
    heuristic = FLASH_ATTENTION.heuristic_config(inputs, device_info(q.device))
    platform = FLASH_ATTENTION.resolve_platform(inputs, FlashAttentionConfig(platform=kwargs.get("platform", "auto")))
    band = dict(softmax_scale=inputs.softmax_scale, win_left=inputs.win_left, win_right=inputs.win_right,
                softcap=inputs.logits_soft_cap)
    extras = dict(bias=inputs.bias, alibi_slopes=inputs.alibi_slopes, softmax_aux=inputs.softmax_aux)
    return inputs, heuristic, platform, band, extras


def flash_attention_forward(q, k, v, *, causal: bool = False, softmax_scale: float | None = None,
                            sliding_window=None, logits_soft_cap: float | None = None, bias=None, alibi_slopes=None,
                            softmax_aux=None, block_q: int | None = None, block_kv: int | None = None,
                            num_warps: int | None = None, num_stages: int | None = None, layout: str = "bshd",
                            platform: str = "auto"):
    """One forward launch: ``(out, lse)``.

    ``q [B, Sq, Hq, D]``, ``k/v [B, Sk, Hkv, D]`` (or ``[B, H, S, D]`` with ``layout="bhsd"``);
    ``out`` in the same layout as ``q``, ``lse [B, Hq, Sq]`` float32. Arguments as in
    :func:`kernelops.flash_attention`; ``block_q``/``block_kv``/``num_warps``/``num_stages``
    override the heuristic's forward parameters (and, when given, keep the call off the
    warp-specialised Hopper kernel, whose tiles are fixed).

    >>> q = torch.randn(2, 8, 128, 64)                      # [B, H, S, D]
    >>> out, lse = flash_attention_forward(q, q, q, causal=True, layout="bhsd", platform="torch")
    >>> out.shape, lse.shape
    (torch.Size([2, 8, 128, 64]), torch.Size([2, 8, 128]))
    """
    from kernelops.kernels.flash_attention.dispatch import flash_attention_fwd_dense
    from kernelops.kernels.flash_attention.reference import ScoreTerms, flash_attention_torch_fwd

    inputs, heuristic, platform, band, extras = _prepare(q, k, v, dict(
        causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
        bias=bias, alibi_slopes=alibi_slopes, softmax_aux=softmax_aux, layout=layout, platform=platform))
    if platform == "triton":
        p = _params(FwdParams, heuristic.fwd_params, block_q, block_kv, num_warps, num_stages)
        # the warp-specialised kernel has fixed tiles: it runs (by its own rule) only when none are given
        ws = (block_q, block_kv, num_warps, num_stages) == (None,) * 4 and FLASH_ATTENTION.ws_on(inputs, p)
        out, lse = flash_attention_fwd_dense(inputs.query, inputs.key, inputs.value, **band,
                                             **dict(dataclasses.asdict(p), ws=ws), **extras)
    else:
        out, lse = flash_attention_torch_fwd(inputs.query, inputs.key, inputs.value, **band, terms=ScoreTerms(**extras))
    return _to_bshd(layout, out)[0], lse


def flash_attention_backward(q, k, v, out, dout, lse, *, dlse=None, causal: bool = False,
                             softmax_scale: float | None = None, sliding_window=None,
                             logits_soft_cap: float | None = None, bias=None, alibi_slopes=None, softmax_aux=None,
                             bias_grad: bool = False, return_extra_grads: bool = False,
                             block_q: int | None = None, block_kv: int | None = None, num_warps: int | None = None,
                             num_stages: int | None = None, layout: str = "bshd", platform: str = "auto"):
    """One backward launch: ``(dq, dk, dv)`` in the inputs' layout.

    ``out``/``dout`` are laid out like ``q``; ``lse [B, Hq, Sq]`` is the forward's; ``dlse``
    (same shape) the gradient reaching it, if any. With ``return_extra_grads=True`` the result is
    ``(dq, dk, dv, dbias, dsink)`` (``dbias`` when ``bias_grad``, ``dsink`` when ``softmax_aux``
    is given, else None). Tile parameters override the heuristic's backward parameters (see
    :class:`kernelops.BwdParams` for how the two backward kernels use them).
    """
    from kernelops.kernels.flash_attention.dispatch import flash_attention_bwd
    from kernelops.kernels.flash_attention.reference import ScoreTerms, flash_attention_torch_bwd

    out, dout = _to_bshd(layout, out, dout)
    inputs, heuristic, platform, band, extras = _prepare(q, k, v, dict(
        causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window, logits_soft_cap=logits_soft_cap,
        bias=bias, alibi_slopes=alibi_slopes, softmax_aux=softmax_aux, layout=layout, platform=platform))
    if platform == "triton":
        p = _params(BwdParams, heuristic.bwd_params, block_q, block_kv, num_warps, num_stages)
        # the warp-specialised dK/dV kernel has fixed tiles: it runs (by its own rule) only when none are given
        ws = (block_q, block_kv, num_warps, num_stages) == (None,) * 4 and FLASH_ATTENTION.ws_on(inputs, p)
        grads = flash_attention_bwd(inputs.query, inputs.key, inputs.value, out, dout, lse, dlse, **band,
                                    **dict(dataclasses.asdict(p), ws=ws, fused=FLASH_ATTENTION.fused_on(inputs, p)),
                                    **extras, bias_grad=bias_grad)
    else:
        grads = flash_attention_torch_bwd(inputs.query, inputs.key, inputs.value, out, dout, lse, dlse, **band,
                                          terms=ScoreTerms(**extras), bias_grad=bias_grad)
    dq, dk, dv = _to_bshd(layout, *grads[:3])
    return (dq, dk, dv, *grads[3:]) if return_extra_grads else (dq, dk, dv)


def get_optimal_block_sizes(seq_len: int, head_dim: int, *, dtype: torch.dtype = torch.bfloat16, device=None,
                            seq_len_k: int | None = None, causal: bool = False, num_heads: int = 1,
                            num_kv_heads: int | None = None) -> FlashAttentionConfig:
    """The heuristic's launch configuration for a shape (``FlashAttention.heuristic_config``), no timing.

    >>> cfg = get_optimal_block_sizes(4096, 128, device="cpu")
    >>> cfg.fwd_params.q_blocksize > 0
    True
    """
    device = torch.device(device) if device is not None else (
        torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu"))
    q = torch.empty((1, seq_len, num_heads, head_dim), dtype=dtype, device="meta")
    kv = torch.empty((1, seq_len_k or seq_len, num_kv_heads or num_heads, head_dim), dtype=dtype, device="meta")
    inputs = FLASH_ATTENTION.prepare(query=q, key=kv, value=kv, causal=causal)
    return FLASH_ATTENTION.heuristic_config(inputs, device_info(device))


def estimate_memory_usage(batch: int, heads: int, seq_len: int, head_dim: int, *, dtype: torch.dtype = torch.bfloat16,
                          kv_heads: int | None = None, seq_len_k: int | None = None,
                          train: bool = True) -> dict[str, int]:
    """Bytes a flash_attention call allocates and holds, by kind, plus their ``total``.

    ``inputs`` (q, k, v), ``outputs`` (out), ``saved_statistics`` (lse), ``workspace`` (the
    backward's delta, and where the fused Gluon backward runs by default on an sm_90 GPU, its
    float32 dQ buffer: an upper bound on other devices) and ``gradients`` (dq, dk, dv and the incoming dout), the last two only with
    ``train``. ``total`` sums everything but ``inputs``: the memory the call adds.
    """
    q = torch.empty((batch, seq_len, heads, head_dim), dtype=dtype, device="meta", requires_grad=train)
    kv = torch.empty((batch, seq_len_k or seq_len, kv_heads or heads, head_dim), dtype=dtype, device="meta",
                     requires_grad=train)
    with torch.enable_grad():
        estimate = FLASH_ATTENTION.estimate_memory(FLASH_ATTENTION.prepare(query=q, key=kv, value=kv))
    estimate["total"] = sum(v for k, v in estimate.items() if k != "inputs")
    return estimate

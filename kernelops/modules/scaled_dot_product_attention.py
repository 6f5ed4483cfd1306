"""scaled_dot_product_attention: torch SDPA's semantics on BSHD tensors, on the flash kernels.

``query [B, Sq, Hq, D]``, ``key/value [B, Sk, Hkv, D]`` (GQA allowed), output ``[B, Sq, Hq, D]``.
As in ``torch.nn.functional.scaled_dot_product_attention``: ``attention_mask`` is boolean
(True = attend) or additive float, broadcastable to ``[B, Hq, Sq, Sk]``; ``causal`` is aligned
top-left (query ``i`` sees keys ``j <= i``) even when ``Sq != Sk``. ``platform="torch"`` calls
torch's own SDPA; ``triton`` runs the flash kernels with the mask as an additive bias, and
dropout with a seed drawn from torch's RNG. A query whose every key is masked gets output 0 on
the triton platform, as torch's math and memory-efficient backends give (docs/ops/
scaled_dot_product_attention.md).
"""

from __future__ import annotations

import dataclasses

import torch

from kernelops.kernels.flash_attention.runtime_config import register_resolver
from kernelops.modules.attention_args import UNBOUNDED, bool_mask_bias, check_tensors
from kernelops.modules.flash_attention import FlashAttention, FlashAttentionInputs, register_traced_op
from kernelops.ops.executor import default_executor


@dataclasses.dataclass(frozen=True)
class SdpaInputs(FlashAttentionInputs):
    """FlashAttentionInputs (the mask lowered to ``bias``) plus the mask as torch's SDPA takes it."""

    attention_mask: torch.Tensor | None = None


def _mask_as_bias(mask: torch.Tensor, shape: tuple[int, int, int, int], dtype: torch.dtype) -> torch.Tensor:
    """A broadcastable bool/float mask as a 4-D additive bias view ``[B|1, H|1, Sq, Sk]``."""
    while mask.dim() < 4:
        mask = mask[None]
    B, H, Sq, Sk = shape
    mask = mask.expand(mask.shape[0], mask.shape[1], Sq, Sk)
    return bool_mask_bias(mask, dtype) if mask.dtype == torch.bool else mask


class ScaledDotProductAttention(FlashAttention):
    """torch-SDPA-compatible attention on the flash kernels (configs as FlashAttention's)."""

    name = "scaled_dot_product_attention"

    def signature(self, kwargs):
        """No hot path yet: this op's arguments (attention_mask, top-left causal) are not the
        ones FlashAttention.signature summarises, so every call goes through prepare."""
        return None

    def prepare(self, *, query, key, value, attention_mask=None, causal=False, softmax_scale=None,
                dropout_prob=0.0, platform="auto") -> SdpaInputs:
        check_tensors(query, key, value)
        B, Sq, Hq, _ = query.shape
        Sk = key.shape[1]
        bias = None
        if attention_mask is not None:
            if not isinstance(attention_mask, torch.Tensor):
                raise TypeError(f"attention_mask must be a torch.Tensor, got {type(attention_mask).__name__}")
            if attention_mask.dtype != torch.bool and not attention_mask.is_floating_point():
                raise TypeError(f"attention_mask must be bool or floating point, got {attention_mask.dtype=}")
            if attention_mask.device != query.device:
                raise ValueError(f"attention_mask must be on the query's device, got {attention_mask.device=}, "
                                 f"{query.device=}")
            try:
                fits = torch.broadcast_shapes(attention_mask.shape, (B, Hq, Sq, Sk)) == (B, Hq, Sq, Sk)
            except RuntimeError:
                fits = False
            if not fits or attention_mask.dim() > 4:
                raise ValueError(f"attention_mask must broadcast to [B, Hq, Sq, Sk] = [{B}, {Hq}, {Sq}, {Sk}], got "
                                 f"attention_mask.shape={tuple(attention_mask.shape)}")
            bias = _mask_as_bias(attention_mask, (B, Hq, Sq, Sk), query.dtype)
        base = super().prepare(query=query, key=key, value=value, softmax_scale=softmax_scale, bias=bias,
                               dropout_prob=dropout_prob, platform=platform)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        if causal:  # torch's causal mask is top-left aligned: j <= i, i.e. j - (i + Sk - Sq) <= Sq - Sk
            fields.update(causal=True, win_left=UNBOUNDED, win_right=Sq - Sk)
        return SdpaInputs(**fields, attention_mask=attention_mask)

    def run(self, inputs, config):
        if self.resolve_platform(inputs, config) == "triton":
            return super().run(inputs, config)
        return _torch_sdpa(inputs)


def _torch_sdpa(inputs: SdpaInputs) -> torch.Tensor:
    """torch's own SDPA on BHSD views of the BSHD inputs."""
    q, k, v = (t.transpose(1, 2) for t in (inputs.query, inputs.key, inputs.value))
    mask, causal = inputs.attention_mask, inputs.causal
    if mask is not None and mask.dim() < 4:  # broadcastable, but torch's kernels want [.., Sq, Sk]
        mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    if mask is not None and mask.dtype not in (torch.bool, q.dtype):  # torch wants the query's float dtype
        mask = mask.to(q.dtype)
    if causal and mask is not None:  # torch refuses both at once: fold the causal mask into the mask
        Sq, Sk = q.shape[2], k.shape[2]
        tril = torch.ones(Sq, Sk, dtype=torch.bool, device=q.device).tril()
        mask = (mask & tril) if mask.dtype == torch.bool else mask.masked_fill(~tril, float("-inf"))
        causal = False
    gqa = True if q.shape[1] != k.shape[1] else False  # noqa: SIM210 - a plain bool even for traced (symbolic) heads
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=inputs.dropout_prob, is_causal=causal, scale=inputs.softmax_scale,
        enable_gqa=gqa)
    return out.transpose(1, 2)


SCALED_DOT_PRODUCT_ATTENTION = ScaledDotProductAttention()
register_traced_op(SCALED_DOT_PRODUCT_ATTENTION)
register_resolver(SCALED_DOT_PRODUCT_ATTENTION.name, SCALED_DOT_PRODUCT_ATTENTION.resolve_at_run_time)


def scaled_dot_product_attention(query, key, value, *, attention_mask=None, causal: bool = False,
                                 softmax_scale: float | None = None, dropout_prob: float = 0.0,
                                 platform: str = "auto", cfg=None):
    """torch SDPA semantics on BSHD tensors; see the module docstring.

    >>> q = torch.randn(1, 64, 4, 32)
    >>> k = v = torch.randn(1, 80, 2, 32)
    >>> scaled_dot_product_attention(q, k, v, causal=True, platform="torch").shape
    torch.Size([1, 64, 4, 32])
    """
    return default_executor()(SCALED_DOT_PRODUCT_ATTENTION, cfg=cfg, query=query, key=key, value=value,
                              attention_mask=attention_mask, causal=causal, softmax_scale=softmax_scale,
                              dropout_prob=dropout_prob, platform=platform)

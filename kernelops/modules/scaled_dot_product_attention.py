"""scaled_dot_product_attention: torch SDPA's semantics on BSHD tensors, on the flash kernels.

Layout: ``query [B, Sq, Hq, D]``, ``key/value [B, Sk, Hkv, D]``, output ``[B, Sq, Hq, D]``
(BSHD, sequence before heads, as every kernelops op), where
``torch.nn.functional.scaled_dot_product_attention`` takes and returns BHSD ``[B, H, S, D]``:
a torch call ``F.scaled_dot_product_attention(q, k, v)`` on BHSD tensors is
``scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)``
here (views, no copies). The mask keeps torch's layout: broadcastable to ``[B, Hq, Sq, Sk]``.

Arguments take torch's names (``attn_mask``, ``dropout_p``, ``is_causal``, ``scale``,
``enable_gqa``; the first four also by position, in torch's order) or kernelops' (``attention_mask``,
``dropout_prob``, ``causal``, ``softmax_scale``); giving both spellings of one argument is a
``TypeError``. As in torch: the mask is boolean (True = attend) or additive float; causal is
aligned top-left (query ``i`` sees keys ``j <= i``) even when ``Sq != Sk``. Unlike torch:
grouped-query attention (``Hq`` a multiple of ``Hkv``) needs no ``enable_gqa=True`` (only an
explicit ``enable_gqa=False`` asks for ``Hq == Hkv``), and a mask may be combined with causal.

``platform="torch"`` calls torch's own SDPA; ``triton`` runs the flash kernels with the mask as
an additive bias, and dropout with a seed drawn from torch's RNG. A query whose every key is
masked gets output 0 on the triton platform, as torch's math and memory-efficient backends give
(docs/ops/scaled_dot_product_attention.md).
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


def _checked_mask_bias(name: str, mask, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The mask argument (called ``name`` by the caller) checked against ``query [B, Sq, Hq, D]`` and
    ``key [B, Sk, Hkv, D]`` and lowered to an additive bias ``[B|1, Hq|1, Sq, Sk]``."""
    B, Sq, Hq, _ = query.shape
    Sk = key.shape[1]
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"{name} must be bool or floating point, got {name}.dtype={mask.dtype}")
    if mask.device != query.device:
        raise ValueError(f"{name} must be on the query's device, got {name}.device={mask.device}, {query.device=}")
    try:
        fits = torch.broadcast_shapes(mask.shape, (B, Hq, Sq, Sk)) == (B, Hq, Sq, Sk)
    except RuntimeError:
        fits = False
    if not fits or mask.dim() > 4:
        raise ValueError(f"{name} must broadcast to [B, Hq, Sq, Sk] = [{B}, {Hq}, {Sq}, {Sk}], got "
                         f"{name}.shape={tuple(mask.shape)} (query.shape={tuple(query.shape)}, "
                         f"key.shape={tuple(key.shape)}, BSHD)")
    return _mask_as_bias(mask, (B, Hq, Sq, Sk), query.dtype)


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

    def prepare(self, *, query, key, value, attention_mask=None, causal=None, softmax_scale=None,
                dropout_prob=None, platform="auto", attn_mask=None, is_causal=None, scale=None, dropout_p=None,
                enable_gqa=None) -> SdpaInputs:
        mask_name = "attn_mask" if attn_mask is not None else "attention_mask"  # errors use the caller's name
        attention_mask = _one_spelling("attn_mask", attn_mask, "attention_mask", attention_mask)
        causal = _one_spelling("is_causal", is_causal, "causal", causal)
        softmax_scale = _one_spelling("scale", scale, "softmax_scale", softmax_scale)
        dropout_prob = _one_spelling("dropout_p", dropout_p, "dropout_prob", dropout_prob)
        check_tensors(query, key, value)
        Sq, Hq, Sk = query.shape[1], query.shape[2], key.shape[1]
        if enable_gqa is not None and not isinstance(enable_gqa, bool):
            raise TypeError(f"enable_gqa must be a bool or None, got {enable_gqa!r}")
        if enable_gqa is False and Hq != key.shape[2]:
            raise ValueError(f"enable_gqa=False needs as many key/value heads as query heads, got "
                             f"query.shape={tuple(query.shape)}, key.shape={tuple(key.shape)} (BSHD); leave "
                             f"enable_gqa out or pass True for grouped-query attention")
        bias = None if attention_mask is None else _checked_mask_bias(mask_name, attention_mask, query, key)
        base = super().prepare(query=query, key=key, value=value, softmax_scale=softmax_scale, bias=bias,
                               dropout_prob=0.0 if dropout_prob is None else dropout_prob, platform=platform)
        fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
        if causal:  # torch's causal mask is top-left aligned: j <= i, i.e. j - (i + Sk - Sq) <= Sq - Sk
            fields.update(causal=True, win_left=UNBOUNDED, win_right=Sq - Sk)
        return SdpaInputs(**fields, attention_mask=attention_mask)

    def run(self, inputs, config):
        if self.resolve_platform(inputs, config) == "triton":
            return super().run(inputs, config)
        return _torch_sdpa(inputs)


def _one_spelling(torch_name: str, torch_value, name: str, value):
    """The argument given under torch's name or kernelops' (None: not given); TypeError for both."""
    if torch_value is None:
        return value
    if value is not None:
        raise TypeError(f"scaled_dot_product_attention got both {torch_name}= (torch's name) and {name}= "
                        f"(kernelops' name) for the same argument; pass one")
    return torch_value


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


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p: float | None = None,
                                 is_causal: bool | None = None, scale: float | None = None, *,
                                 enable_gqa: bool | None = None, attention_mask=None, causal: bool | None = None,
                                 softmax_scale: float | None = None, dropout_prob: float | None = None,
                                 platform: str = "auto", cfg=None):
    """torch SDPA semantics on BSHD tensors (torch's function takes BHSD); see the module docstring.

    Args:
        query: ``[B, Sq, Hq, D]`` (BSHD; torch's is ``[B, Hq, Sq, D]``), float16, bfloat16 or float32.
        key, value: ``[B, Sk, Hkv, D]``, ``Hq`` a multiple of ``Hkv``, the query's dtype and device.
        attn_mask / attention_mask: boolean (True = attend) or additive float mask broadcastable
            to ``[B, Hq, Sq, Sk]`` (torch's layout), or None.
        dropout_p / dropout_prob: dropout probability of the attention weights (default 0).
        is_causal / causal: top-left aligned causal mask, as torch's (default False).
        scale / softmax_scale: logits multiplier (default ``1 / sqrt(D)``).
        enable_gqa: None or True: GQA whenever ``Hkv`` divides ``Hq``; False: ``Hq == Hkv`` required.
        platform: ``"auto"``, ``"triton"`` or ``"torch"``; cfg: a :class:`FlashAttentionConfig`.

    Returns:
        ``[B, Sq, Hq, D]``, the query's dtype.

    Giving both spellings of one argument (``is_causal=`` and ``causal=``) raises ``TypeError``.

    >>> q = torch.randn(1, 64, 4, 32)
    >>> k = v = torch.randn(1, 80, 2, 32)
    >>> scaled_dot_product_attention(q, k, v, is_causal=True, platform="torch").shape
    torch.Size([1, 64, 4, 32])
    >>> x = torch.randn(1, 4, 64, 32)                       # torch's layout, BHSD
    >>> bshd = x.transpose(1, 2)                            # a view: [1, 64, 4, 32]
    >>> scaled_dot_product_attention(bshd, bshd, bshd, None, 0.0, True).transpose(1, 2).shape
    torch.Size([1, 4, 64, 32])
    """
    return default_executor()(SCALED_DOT_PRODUCT_ATTENTION, cfg=cfg, query=query, key=key, value=value,
                              attention_mask=attention_mask, causal=causal, softmax_scale=softmax_scale,
                              dropout_prob=dropout_prob, platform=platform, attn_mask=attn_mask, is_causal=is_causal,
                              scale=scale, dropout_p=dropout_p, enable_gqa=enable_gqa)

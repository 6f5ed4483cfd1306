"""nn.Module wrappers over :func:`kernelops.flash_attention`.

* :class:`FlashAttentionLayer`: no parameters; holds the static arguments (causal, window, scale,
  soft cap, dropout, an optional fixed launch config) and calls the function on ``q, k, v``.
* :class:`MultiheadAttention`: self-attention layer on ``x [B, S, E]`` (batch first): q/k/v
  projections (fused or separate), GQA/MQA, optional rotary embeddings, the attention above and
  the output projection.

On CUDA tensors the attention runs the Triton kernels; on CPU tensors the ``torch`` platform.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from kernelops.modules import FlashAttentionConfig, flash_attention
from kernelops.nn.rotary import RotaryEmbedding
from kernelops.types import MaskInfo

#: flash_attention arguments a FlashAttentionLayer fixes at construction (not per call)
_STATIC_ARGS = ("causal", "softmax_scale", "sliding_window", "logits_soft_cap", "dropout_prob", "platform", "cfg",
                "deterministic")
_PLATFORMS = ("auto", "triton", "torch")


def _positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {name}={value!r}")
    return int(value)


def _check_window(sliding_window):
    """None, an int ``w >= 0`` or a ``(left, right)`` pair of ints >= 0 / None (as flash_attention)."""
    if sliding_window is None:
        return None
    if isinstance(sliding_window, numbers.Integral) and not isinstance(sliding_window, bool):
        sides = (sliding_window,)
    elif isinstance(sliding_window, (tuple, list)) and len(sliding_window) == 2:
        sides = tuple(sliding_window)
    else:
        raise TypeError(f"sliding_window must be an int, a (left, right) pair or None, got {sliding_window!r}")
    for side in sides:
        if side is not None and (isinstance(side, bool) or not isinstance(side, numbers.Integral) or side < 0):
            raise ValueError(f"sliding_window bounds must be ints >= 0 or None, got sliding_window={sliding_window!r}")
    return int(sides[0]) if len(sides) == 1 else tuple(None if s is None else int(s) for s in sides)


def _check_scalar(name: str, value, *, positive: bool):
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or \
            (positive and value <= 0):
        raise ValueError(f"{name} must be a {'positive ' if positive else ''}finite number or None, got {value!r}")
    return float(value)


class FlashAttentionLayer(nn.Module):
    """Module form of :func:`kernelops.flash_attention` with the static arguments fixed.

    (Not :class:`kernelops.FlashAttention`, the op's Operation class. ``kernelops.nn.FlashAttention``
    is a deprecated alias of this class.)

    Args:
        causal: mask keys after the query (bottom-right aligned when ``Sq != Sk``).
        softmax_scale: logits multiplier, default ``1 / sqrt(D)``.
        sliding_window: ``w`` or ``(left, right)`` (see :func:`kernelops.flash_attention`).
        logits_soft_cap: ``c * tanh(logits / c)`` on the scaled logits.
        dropout: probability of dropping an attention weight, applied only in training mode
            (``module.train()``); each call draws a fresh seed from torch's RNG, so
            ``torch.manual_seed`` makes a run reproducible. In eval mode no dropout.
        deterministic: passed to flash_attention.
        platform: ``"auto"`` (Triton on CUDA, torch elsewhere), ``"triton"`` or ``"torch"``.
        cfg: a fixed :class:`kernelops.FlashAttentionConfig` used for every call (bypasses the
            executor's caches and tuning); None lets the executor choose.

    ``forward(query [B, Sq, Hq, D], key [B, Sk, Hkv, D], value [B, Sk, Hkv, D], **extras)`` returns
    ``[B, Sq, Hq, D]``; ``extras`` are flash_attention's per-call arguments (``mask_info``,
    ``bias``, ``alibi_slopes``, ``softmax_aux``, ``cum_seqlens_q/k``, ``max_seqlen_q/k``,
    ``dropout_seed``, ``return_lse``). The module has no parameters.

    Example:
        >>> import torch
        >>> from kernelops.nn import FlashAttentionLayer
        >>> attn = FlashAttentionLayer(causal=True, sliding_window=(64, 0))
        >>> q, k, v = torch.randn(2, 100, 8, 32), torch.randn(2, 100, 2, 32), torch.randn(2, 100, 2, 32)
        >>> attn(q, k, v).shape
        torch.Size([2, 100, 8, 32])
    """

    def __init__(self, causal: bool = False, softmax_scale: float | None = None,
                 sliding_window: int | tuple[int | None, int | None] | None = None,
                 logits_soft_cap: float | None = None, dropout: float = 0.0, deterministic: bool = False,
                 platform: str = "auto", cfg: FlashAttentionConfig | None = None):
        super().__init__()
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {causal!r}")
        if isinstance(dropout, bool) or not isinstance(dropout, numbers.Real) or not 0 <= dropout < 1:
            raise ValueError(f"dropout must be a number in [0, 1), got dropout={dropout!r}")
        if platform not in _PLATFORMS:
            raise ValueError(f"platform must be one of {_PLATFORMS}, got {platform!r}")
        if cfg is not None and not isinstance(cfg, FlashAttentionConfig):
            raise TypeError(f"cfg must be a kernelops.FlashAttentionConfig or None, got {type(cfg).__name__}")
        self.causal = causal
        self.softmax_scale = _check_scalar("softmax_scale", softmax_scale, positive=False)
        self.sliding_window = _check_window(sliding_window)
        self.logits_soft_cap = _check_scalar("logits_soft_cap", logits_soft_cap, positive=True)
        self.dropout = float(dropout)
        self.deterministic = bool(deterministic)
        self.platform = platform
        self.cfg = cfg

    def extra_repr(self) -> str:
        parts = [f"causal={self.causal}"]
        for name in ("softmax_scale", "sliding_window", "logits_soft_cap"):
            if getattr(self, name) is not None:
                parts.append(f"{name}={getattr(self, name)}")
        if self.dropout:
            parts.append(f"dropout={self.dropout}")
        if self.deterministic:
            parts.append("deterministic=True")
        if self.platform != "auto":
            parts.append(f"platform={self.platform!r}")
        if self.cfg is not None:
            parts.append(f"cfg={self.cfg}")
        return ", ".join(parts)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, **extras):
        fixed = sorted(set(extras) & set(_STATIC_ARGS))
        if fixed:
            one = len(fixed) == 1
            raise TypeError(f"{', '.join(fixed)} {'is' if one else 'are'} fixed when the FlashAttentionLayer is "
                            f"built; pass {'it' if one else 'them'} to its constructor")
        return flash_attention(query, key, value, causal=self.causal, softmax_scale=self.softmax_scale,
                               sliding_window=self.sliding_window, logits_soft_cap=self.logits_soft_cap,
                               dropout_prob=self.dropout if self.training else 0.0,
                               deterministic=self.deterministic, platform=self.platform, cfg=self.cfg, **extras)


class MultiheadAttention(nn.Module):
    """Self-attention layer: projections, optional rotary embeddings, flash attention, output projection.

    Args:
        embed_dim: ``E``, the model width (input and output last dim).
        num_heads: query heads ``Hq``.
        num_kv_heads: key/value heads ``Hkv`` (default ``Hq``; ``Hq % Hkv == 0``: GQA, 1: MQA).
        head_dim: ``D`` (default ``E // Hq``, which then must divide exactly); the projections
            map ``E -> Hq * D`` (queries), ``E -> Hkv * D`` (keys, values), ``Hq * D -> E``.
        qkv_bias, out_bias: biases on the input projections / the output projection.
        fused_qkv: one ``qkv_proj`` Linear whose output rows are ``[q (Hq*D) | k (Hkv*D) |
            v (Hkv*D)]`` (one matmul), or separate ``q_proj``, ``k_proj``, ``v_proj``. The two
            layouts have different state_dict keys.
        causal, sliding_window, logits_soft_cap, softmax_scale: as in :func:`kernelops.flash_attention`.
        dropout: attention-weight dropout, applied only in training mode (fresh seed per call).
        rotary: apply rotary position embeddings to q and k (after the projections).
        rotary_base: RoPE frequency base.
        rotary_interleaved: False (default) pairs channels ``(i, i + R/2)`` (GPT-NeoX / HF Llama
            "rotate_half" layout); True pairs ``(2i, 2i + 1)`` (GPT-J / RoFormer layout).
        rotary_dim: ``R``, how many leading channels of each head rotate (default ``D``).
        platform, cfg: passed to the inner :class:`FlashAttentionLayer`.
        device, dtype: of the parameters.

    Weights are initialised by :meth:`reset_parameters`: Xavier-uniform per projection (each of q,
    k, v separately when fused), zero biases.

    ``forward(x, attention_mask=None, mask_info=None, position_ids=None)`` with ``x [B, S, E]``
    returns ``[B, S, E]`` in ``x``'s dtype (which must be the parameters' dtype). Packed
    variable-length input: ``x [T, E]`` with ``cum_seqlens [N + 1]`` int32 (and optionally
    ``max_seqlen``); rotary positions then restart at 0 in each sequence.

    Example:
        >>> import torch
        >>> from kernelops.nn import MultiheadAttention
        >>> mha = MultiheadAttention(64, num_heads=8, num_kv_heads=2, causal=True, rotary=True)
        >>> x = torch.randn(2, 50, 64)
        >>> pad = torch.ones(2, 50, dtype=torch.bool); pad[1, 40:] = False
        >>> mha(x, attention_mask=pad).shape
        torch.Size([2, 50, 64])
    """

    def __init__(self, embed_dim: int, num_heads: int, num_kv_heads: int | None = None, head_dim: int | None = None,
                 *, qkv_bias: bool = True, out_bias: bool = True, fused_qkv: bool = True, causal: bool = False,
                 sliding_window: int | tuple[int | None, int | None] | None = None,
                 logits_soft_cap: float | None = None, softmax_scale: float | None = None, dropout: float = 0.0,
                 rotary: bool = False, rotary_base: float = 10000.0, rotary_interleaved: bool = False,
                 rotary_dim: int | None = None, platform: str = "auto", cfg: FlashAttentionConfig | None = None,
                 device=None, dtype=None):
        super().__init__()
        embed_dim = _positive_int("embed_dim", embed_dim)
        num_heads = _positive_int("num_heads", num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else _positive_int("num_kv_heads", num_kv_heads)
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads must be a multiple of num_kv_heads (GQA), got num_heads={num_heads}, "
                             f"num_kv_heads={num_kv_heads}")
        if head_dim is None:
            if embed_dim % num_heads:
                raise ValueError(f"embed_dim must be divisible by num_heads when head_dim is not given, got "
                                 f"embed_dim={embed_dim}, num_heads={num_heads}")
            head_dim = embed_dim // num_heads
        head_dim = _positive_int("head_dim", head_dim)
        if head_dim > 256:
            raise ValueError(f"head_dim must be at most 256 (flash_attention's limit), got head_dim={head_dim}")
        if dtype is not None and dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
            raise TypeError(f"dtype must be float16, bfloat16, float32 or float64, got dtype={dtype}")
        self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim = embed_dim, num_heads, num_kv_heads, head_dim
        self.fused_qkv = bool(fused_qkv)
        factory = dict(device=device, dtype=dtype)
        q_out, kv_out = num_heads * head_dim, num_kv_heads * head_dim
        if self.fused_qkv:
            self.qkv_proj = nn.Linear(embed_dim, q_out + 2 * kv_out, bias=qkv_bias, **factory)
        else:
            self.q_proj = nn.Linear(embed_dim, q_out, bias=qkv_bias, **factory)
            self.k_proj = nn.Linear(embed_dim, kv_out, bias=qkv_bias, **factory)
            self.v_proj = nn.Linear(embed_dim, kv_out, bias=qkv_bias, **factory)
        self.out_proj = nn.Linear(q_out, embed_dim, bias=out_bias, **factory)
        self.attn = FlashAttentionLayer(causal=causal, softmax_scale=softmax_scale, sliding_window=sliding_window,
                                   logits_soft_cap=logits_soft_cap, dropout=dropout, platform=platform, cfg=cfg)
        self.rope = None
        if rotary:
            rotary_dim = head_dim if rotary_dim is None else rotary_dim
            if isinstance(rotary_dim, bool) or not isinstance(rotary_dim, numbers.Integral) or \
                    not 2 <= rotary_dim <= head_dim or rotary_dim % 2:
                raise ValueError(f"rotary_dim must be an even int in [2, head_dim={head_dim}], got "
                                 f"rotary_dim={rotary_dim!r}")
            self.rope = RotaryEmbedding(int(rotary_dim), base=rotary_base, interleaved=rotary_interleaved)
        elif rotary_dim is not None:
            raise ValueError(f"rotary_dim={rotary_dim!r} given but rotary=False")
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weights (q, k, v initialised as separate matrices even when fused), zero biases."""
        q_out, kv_out = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        if self.fused_qkv:
            w = self.qkv_proj.weight
            blocks = [w[:q_out], w[q_out:q_out + kv_out], w[q_out + kv_out:]]
            linears = [self.qkv_proj, self.out_proj]
        else:
            blocks = [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]
            linears = [self.q_proj, self.k_proj, self.v_proj, self.out_proj]
        for block in blocks + [self.out_proj.weight]:
            nn.init.xavier_uniform_(block)
        for linear in linears:
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    def extra_repr(self) -> str:
        text = f"embed_dim={self.embed_dim}, num_heads={self.num_heads}"
        if self.num_kv_heads != self.num_heads:
            text += f", num_kv_heads={self.num_kv_heads}"
        if self.head_dim * self.num_heads != self.embed_dim:
            text += f", head_dim={self.head_dim}"
        return text + f", fused_qkv={self.fused_qkv}"

    def _project(self, x: torch.Tensor):
        """``x [..., E]`` -> ``q [..., Hq, D]``, ``k, v [..., Hkv, D]`` (views of the projection output)."""
        D = self.head_dim
        if self.fused_qkv:
            q_out, kv_out = self.num_heads * D, self.num_kv_heads * D
            q, k, v = self.qkv_proj(x).split([q_out, kv_out, kv_out], dim=-1)
        else:
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        return q.unflatten(-1, (self.num_heads, D)), k.unflatten(-1, (self.num_kv_heads, D)), \
            v.unflatten(-1, (self.num_kv_heads, D))

    def _check_input(self, x, packed: bool) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        want = "[T, E] (packed, with cum_seqlens)" if packed else "[B, S, E]"
        if x.dim() != (2 if packed else 3) or x.shape[-1] != self.embed_dim:
            raise ValueError(f"x must be {want} with E={self.embed_dim}, got x.shape={tuple(x.shape)}")
        weight = self.out_proj.weight
        if x.dtype != weight.dtype:
            raise TypeError(f"x.dtype={x.dtype} differs from the parameters' dtype {weight.dtype}; "
                            f"cast the input or call module.to({x.dtype})")

    def forward(self, x: torch.Tensor, *, attention_mask: torch.Tensor | None = None,
                mask_info: MaskInfo | None = None, position_ids: torch.Tensor | None = None,
                cum_seqlens: torch.Tensor | None = None, max_seqlen: int | None = None) -> torch.Tensor:
        """Self-attention over ``x``.

        Args:
            x: ``[B, S, E]``, or packed ``[T, E]`` with ``cum_seqlens``.
            attention_mask: padding mask ``[B, S]``, bool or 0/1 (True / 1 = a real token, the
                Hugging Face convention; the opposite of torch.nn.MultiheadAttention's
                ``key_padding_mask``). Padded keys are masked for every query; a query that sees
                no key gets a zero attention output.
            mask_info: a :class:`kernelops.MaskInfo` (segments or a ``[B, 1|Hq, S, S]`` boolean
                mask), combined with causal / window. Not together with ``attention_mask``.
            position_ids: rotary positions ``[S]`` or ``[B, S]`` (``[T]`` packed); default
                ``0 .. S-1`` (per sequence when packed). Ignored without rotary.
            cum_seqlens: int32 ``[N + 1]`` sequence offsets into packed ``x [T, E]``.
            max_seqlen: with ``cum_seqlens``, an upper bound on the sequence lengths (saves a
                host sync on CUDA; see :func:`kernelops.flash_attention`).

        Returns:
            ``[B, S, E]`` (or ``[T, E]``), dtype of ``x``.
        """
        packed = cum_seqlens is not None
        self._check_input(x, packed)
        extras = {}
        if attention_mask is not None and mask_info is not None:
            raise ValueError("pass attention_mask or mask_info, not both")
        if packed:
            if attention_mask is not None or mask_info is not None:
                raise ValueError("attention_mask / mask_info do not apply to packed input (cum_seqlens): "
                                 "the sequences are already separated")
            extras = dict(cum_seqlens_q=cum_seqlens, cum_seqlens_k=cum_seqlens, max_seqlen_q=max_seqlen,
                          max_seqlen_k=max_seqlen)
        elif max_seqlen is not None:
            raise ValueError("max_seqlen goes with packed input (cum_seqlens)")
        if attention_mask is not None:
            B, S = x.shape[:2]
            if not isinstance(attention_mask, torch.Tensor) or tuple(attention_mask.shape) != (B, S) or \
                    attention_mask.is_floating_point():
                raise ValueError(f"attention_mask must be a bool or integer [B, S] = [{B}, {S}] padding mask, got "
                                 f"{getattr(attention_mask, 'dtype', type(attention_mask).__name__)} of shape "
                                 f"{tuple(getattr(attention_mask, 'shape', ()))}")
            mask_info = MaskInfo.from_attention_mask(attention_mask.to(x.device))
        if mask_info is not None:
            extras["mask_info"] = mask_info

        q, k, v = self._project(x)
        if self.rope is not None:
            if packed and position_ids is None:
                position_ids = _packed_positions(cum_seqlens, x.shape[0])
            q, k = self.rope(q, k, position_ids)
        out = self.attn(q, k, v, **extras)
        return self.out_proj(out.flatten(-2))


def _packed_positions(cum_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Position of each packed token within its sequence, ``[T]`` int64, computed on the device."""
    if not isinstance(cum_seqlens, torch.Tensor) or cum_seqlens.dim() != 1 or cum_seqlens.is_floating_point():
        raise ValueError(f"cum_seqlens must be an int32 tensor [N + 1], got "
                         f"{getattr(cum_seqlens, 'dtype', type(cum_seqlens).__name__)} of shape "
                         f"{tuple(getattr(cum_seqlens, 'shape', ()))}")
    offsets = cum_seqlens.long()
    tokens = torch.arange(total, device=cum_seqlens.device)
    seq = torch.searchsorted(offsets[1:], tokens, right=True).clamp_max(offsets.numel() - 2)
    return tokens - offsets[seq]


#: the warning for the module's former name, which is also the name of the op's Operation class
FLASH_ATTENTION_RENAMED = ("kernelops.nn.FlashAttention is deprecated: use kernelops.nn.FlashAttentionLayer (the "
                           "module; kernelops.FlashAttention is the op's Operation class)")


def __getattr__(name: str):
    if name == "FlashAttention":
        import warnings

        warnings.warn(FLASH_ATTENTION_RENAMED, DeprecationWarning, stacklevel=2)
        return FlashAttentionLayer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

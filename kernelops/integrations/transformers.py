"""Hugging Face transformers: ``attn_implementation="kernelops"``.

:func:`register` adds an attention function and its mask function to transformers'
``AttentionInterface`` and ``AttentionMaskInterface``; after it, any model whose attention goes
through that interface (Llama, Qwen2/3, Mistral, Gemma 2, BERT, ...) runs
:func:`kernelops.flash_attention`::

    >>> import torch, transformers
    >>> from kernelops.integrations.transformers import register
    >>> register()
    'kernelops'
    >>> cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
    ...                                num_attention_heads=4, num_key_value_heads=2)
    >>> model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="kernelops")
    >>> model(torch.randint(0, 64, (2, 10))).logits.shape
    torch.Size([2, 10, 64])

How HF's call maps onto kernelops (query/key/value arrive as ``[B, H, S, D]``):

* q, k, v are passed as transposed views ``[B, S, H, D]`` (no copies); K/V keep their own head
  count (GQA without ``repeat_kv``). The output is ``[B, Sq, Hq, D]``, as HF expects.
* The mask function keeps masks compact where kernelops can apply them in its kernels: for the
  plain causal, bidirectional and sliding-window patterns whose queries are the last ``Sq`` of the
  ``Sk`` keys (prefill, and decoding with a dynamic or sliding-window cache) it returns ``None``
  (no padding) or the ``[B, Sk]`` boolean padding mask. The attention function then takes the
  pattern from the module's call, as HF's flash-attention path does: ``is_causal`` (else
  ``module.is_causal``), ``sliding_window=w`` (``w - 1`` keys back when causal, as HF's
  ``kv_idx > q_idx - w``; ``w`` each side when not), ``softcap``, ``scaling``, ``dropout`` and
  ``s_aux`` (attention sinks), and the padding becomes segment ids (``MaskInfo``). Causal masks
  are aligned bottom-right, which is exact here because the queries end where the keys end.
* Any other mask (StaticCache, packed sequences found from ``position_ids``, or/and mask
  overlays, chunked attention, a 4-D mask given by the caller) goes as a 4-D mask: boolean masks
  become an additive ``-inf`` bias and float masks are added as a bias; the module's causal and
  window flags are then not applied (the mask holds them), so the alignment question never arises.
"""

from __future__ import annotations

import functools

import torch
from transformers import masking_utils
from transformers.modeling_utils import AttentionInterface

from kernelops.modules.flash_attention import flash_attention
from kernelops.types import MaskInfo

#: the name used by :func:`register` unless told otherwise
DEFAULT_NAME = "kernelops"


def _code_of(factory, *args):
    """The code object of the closure ``factory(*args)`` returns, or None if transformers lacks it."""
    try:
        return factory(*args).__code__
    except Exception:  # noqa: BLE001 - another transformers version: that pattern is not recognised
        return None


_CAUSAL = getattr(masking_utils, "causal_mask_function", None)
_BIDIRECTIONAL = getattr(masking_utils, "bidirectional_mask_function", None)
_AND_CODE = _code_of(getattr(masking_utils, "and_masks", None), _CAUSAL)
_SLIDING_CODES = tuple(c for c in (_code_of(getattr(masking_utils, "sliding_window_overlay", None), 1),
                                   _code_of(getattr(masking_utils, "sliding_window_bidirectional_overlay", None), 1))
                       if c is not None)


def _closure_vars(fn) -> dict:
    names = fn.__code__.co_freevars
    return dict(zip(names, (cell.cell_contents for cell in fn.__closure__ or ())))


def _is_band_pattern(mask_function) -> bool:
    """Whether HF's ``mask_function`` is plain causal, bidirectional, or one of them with HF's own
    sliding-window overlay: the patterns the module's call flags (``is_causal``,
    ``sliding_window``) describe. Anything else (packed sequences, chunks, custom overlays) is not."""
    if mask_function is not None and mask_function in (_CAUSAL, _BIDIRECTIONAL):
        return True
    code = getattr(mask_function, "__code__", None)
    if code is None or code is not _AND_CODE:
        return False
    parts = _closure_vars(mask_function).get("mask_functions", ())
    if len(parts) != 2:
        return False
    overlay, base = parts
    return base in (_CAUSAL, _BIDIRECTIONAL) and getattr(overlay, "__code__", None) in _SLIDING_CODES


def _padding_slice(attention_mask: torch.Tensor, kv_length: int, kv_offset: int) -> torch.Tensor:
    """The ``[B, kv_length]`` part of HF's 2-D padding mask for keys ``kv_offset ..``; positions
    past its end (not written yet) count as padding."""
    missing = kv_offset + kv_length - attention_mask.shape[-1]
    if missing > 0:
        attention_mask = torch.nn.functional.pad(attention_mask, (0, missing))
    return attention_mask[:, kv_offset:kv_offset + kv_length].bool()


def kernelops_mask(batch_size: int, q_length: int, kv_length: int, q_offset=0, kv_offset=0,
                   mask_function=_CAUSAL, attention_mask: torch.Tensor | None = None, **kwargs):
    """The mask function registered with ``AttentionMaskInterface``.

    Returns ``None`` or a boolean padding mask ``[B, kv_length]`` (True = real token) when the
    pattern is one kernelops applies from the module's flags and the queries are the last
    ``q_length`` of the keys; otherwise HF's boolean ``[B, 1, q_length, kv_length]`` mask
    (``sdpa_mask``), which :func:`attention_forward` adds as a bias.

    >>> kernelops_mask(2, 4, 4, attention_mask=torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])).tolist()
    [[False, True, True, True], [True, True, True, True]]
    """
    end_aligned = (isinstance(q_offset, int) and isinstance(kv_offset, int)
                   and q_offset + q_length == kv_offset + kv_length)
    if _is_band_pattern(mask_function) and (end_aligned or mask_function is _BIDIRECTIONAL):
        if attention_mask is None:
            return None
        padding = _padding_slice(attention_mask, kv_length, kv_offset)
        if not torch.compiler.is_compiling() and bool(padding.all()):
            return None  # no padding: keeps the call eligible for the decode kernel
        return padding
    return masking_utils.sdpa_mask(batch_size=batch_size, q_length=q_length, kv_length=kv_length, q_offset=q_offset,
                                   kv_offset=kv_offset, mask_function=mask_function, attention_mask=attention_mask,
                                   allow_is_causal_skip=False, allow_is_bidirectional_skip=False,
                                   use_vmap=kwargs.get("use_vmap", False), device=kwargs.get("device", "cpu"))


def _check_bhsd(query, key, value) -> None:
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name} must be a 4-D tensor [B, H, S, D] (HF's layout), got {name}.shape={shape}")
    if key.shape[:3] != value.shape[:3] or value.shape[-1] > key.shape[-1]:
        raise ValueError(f"key and value must be [B, Hkv, Sk, D] and [B, Hkv, Sk, Dv <= D], got "
                         f"key.shape={tuple(key.shape)}, value.shape={tuple(value.shape)}")


def _lower_mask(attention_mask, query_bshd, key_bshd):
    """HF's mask -> (mask_info, bias, mask_holds_pattern)."""
    if attention_mask is None:
        return None, None, False
    if not isinstance(attention_mask, torch.Tensor):
        raise TypeError(f"attention_mask must be a torch.Tensor or None for attn_implementation='kernelops', got "
                        f"{type(attention_mask).__name__} (flex BlockMasks are for 'flex_attention')")
    B, Sq, Hq, _ = query_bshd.shape
    Sk = key_bshd.shape[1]
    if attention_mask.dim() == 2:
        if tuple(attention_mask.shape) != (B, Sk):
            raise ValueError(f"a 2-D attention_mask is a padding mask [B, Sk] = [{B}, {Sk}], got "
                             f"attention_mask.shape={tuple(attention_mask.shape)}")
        return MaskInfo.from_attention_mask(attention_mask, seq_q=Sq), None, False
    if attention_mask.dim() != 4:
        raise ValueError(f"attention_mask must be [B, Sk] or [B or 1, 1 or Hq, Sq, Sk], got "
                         f"attention_mask.shape={tuple(attention_mask.shape)}")
    mask = attention_mask[..., :Sk] if attention_mask.shape[-1] > Sk else attention_mask  # eager's StaticCache slice
    ok = mask.shape[0] in (1, B) and mask.shape[1] in (1, Hq) and tuple(mask.shape[2:]) == (Sq, Sk)
    if not ok:
        raise ValueError(f"a 4-D attention_mask must broadcast as [B or 1, Hq or 1, Sq, Sk] = [{B}, {Hq}, {Sq}, {Sk}], "
                         f"got attention_mask.shape={tuple(attention_mask.shape)}")
    if mask.dtype == torch.bool:
        return MaskInfo(attention_mask=mask), None, True
    if mask.is_floating_point():
        return None, mask, True
    raise TypeError(f"a 4-D attention_mask must be boolean (True = attend) or additive float, got "
                    f"attention_mask.dtype={mask.dtype}")


def attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      sliding_window: int | None = None, softcap: float | None = None, is_causal: bool | None = None,
                      s_aux: torch.Tensor | None = None, *, platform: str = "auto", **kwargs):
    """HF's attention call on :func:`kernelops.flash_attention`.

    Args:
        module: the calling attention module (``is_causal`` is read from it when the call does
            not pass ``is_causal``).
        query: ``[B, Hq, Sq, D]``; key ``[B, Hkv, Sk, D]``, value ``[B, Hkv, Sk, Dv]`` with
            ``Hq % Hkv == 0`` and ``Dv <= D`` (a narrower value is zero-padded to ``D``, one copy).
        attention_mask: ``None``, a ``[B, Sk]`` boolean padding mask (from :func:`kernelops_mask`),
            or a ``[B or 1, 1 or Hq, Sq, Sk]`` boolean or additive float mask holding the whole
            pattern.
        dropout, scaling, sliding_window, softcap, is_causal, s_aux: as HF's modules pass them
            (``s_aux [Hq]``: attention-sink logits).
        platform: kernelops platform (``"auto"``: Triton on CUDA, torch elsewhere).

    Returns:
        ``(out [B, Sq, Hq, Dv], None)``: no attention weights are materialised.

    >>> q = torch.randn(1, 4, 6, 16)                                     # [B, H, S, D]
    >>> m = torch.nn.Module(); m.is_causal = True
    >>> attention_forward(m, q, q[:, :2], q[:, :2], None)[0].shape      # GQA 4/2
    torch.Size([1, 6, 4, 16])
    """
    if kwargs.get("position_bias") is not None:
        raise NotImplementedError("attn_implementation='kernelops' does not take position_bias (T5-style); use 'sdpa'")
    if kwargs.get("cache") is not None:
        raise NotImplementedError("attn_implementation='kernelops' does not support paged caches (continuous "
                                  "batching); use 'sdpa' or a flash_attention_* implementation")
    _check_bhsd(query, key, value)
    q, k, v = query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2)  # [B, S, H, D] views
    head_dim, v_head_dim = q.shape[-1], v.shape[-1]
    if v_head_dim != head_dim:  # e.g. MLA: kernelops wants one head dim for K and V
        v = torch.nn.functional.pad(v, (0, head_dim - v_head_dim))
    causal = bool(is_causal if is_causal is not None else getattr(module, "is_causal", True))
    mask_info, bias, mask_holds_pattern = _lower_mask(attention_mask, q, k)
    window = None
    if mask_holds_pattern:
        causal = False
    elif sliding_window is not None:
        # HF's sliding overlays: causal keeps kv_idx > q_idx - w (w - 1 keys back plus the query's
        # own), bidirectional keeps |q_idx - kv_idx| <= w
        window = (int(sliding_window) - 1, 0) if causal else (int(sliding_window), int(sliding_window))
    out = flash_attention(q, k, v, causal=causal, softmax_scale=scaling, sliding_window=window,
                          logits_soft_cap=softcap, bias=bias, softmax_aux=s_aux, mask_info=mask_info,
                          dropout_prob=float(dropout or 0.0), platform=platform)
    if v_head_dim != head_dim:
        out = out[..., :v_head_dim]
    return out, None


@functools.lru_cache(maxsize=None)
def _attention_for(platform: str):
    if platform == "auto":
        return attention_forward
    fn = functools.partial(attention_forward, platform=platform)
    functools.update_wrapper(fn, attention_forward)
    return fn


def register(name: str = DEFAULT_NAME, *, platform: str = "auto") -> str:
    """Register ``name`` as an ``attn_implementation`` of transformers; returns ``name``.

    Registers :func:`attention_forward` (bound to ``platform``) with ``AttentionInterface`` and,
    where the installed transformers has it, :func:`kernelops_mask` with
    ``AttentionMaskInterface``. Calling it again with the same arguments changes nothing; with
    another ``platform`` it rebinds ``name``. Register a second name to keep both, e.g.
    ``register("kernelops_triton", platform="triton")``.

    >>> register()
    'kernelops'
    >>> register() == register()                                     # idempotent
    True
    """
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"name must be a non-empty string without '/' (that marks hub kernels), got {name!r}")
    if platform not in ("auto", "triton", "torch"):
        raise ValueError(f"platform must be one of ('auto', 'triton', 'torch'), got {platform!r}")
    AttentionInterface.register(name, _attention_for(platform))
    mask_interface = getattr(masking_utils, "AttentionMaskInterface", None)
    if mask_interface is not None:
        mask_interface.register(name, kernelops_mask)
    return name


def is_registered(name: str = DEFAULT_NAME) -> bool:
    """Whether ``name`` is registered with transformers' ``AttentionInterface`` by :func:`register`."""
    fn = AttentionInterface._global_mapping.get(name)
    return fn is not None and getattr(fn, "__wrapped__", fn) is attention_forward


__all__ = ["DEFAULT_NAME", "attention_forward", "is_registered", "kernelops_mask", "register"]

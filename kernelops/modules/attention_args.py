"""Argument checks shared by the attention ops (flash_attention, its FP8 forward, attention,
scaled_dot_product_attention): tensor shapes, dtypes and devices, score terms, windows, scalars and
packed-sequence offsets. Each raises ``TypeError`` / ``ValueError`` naming the argument and its
shape before any kernel runs."""

from __future__ import annotations

import math
import numbers

import torch

from kernelops.modules.packed_offsets import check_max_seqlen, check_offset_values

#: a band bound wider than any sequence ("no limit on this side")
UNBOUNDED = 1 << 30
MAX_HEAD_DIM = 256


def window_bounds(sliding_window, causal: bool) -> tuple[int, int, bool]:
    if sliding_window is None:
        left, right = None, None
    elif isinstance(sliding_window, bool):
        raise TypeError(f"sliding_window must be an int, a (left, right) pair or None, got {sliding_window!r}")
    elif isinstance(sliding_window, numbers.Integral):
        left = right = int(sliding_window)
    elif isinstance(sliding_window, (tuple, list)) and len(sliding_window) == 2:
        left, right = sliding_window
    else:
        raise TypeError(f"sliding_window must be an int, a (left, right) pair or None, got {sliding_window!r}")
    for side, value in (("left", left), ("right", right)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise TypeError(f"sliding_window {side} bound must be an int or None, got {value!r}")
        if value is not None and value < 0:
            raise ValueError(f"sliding_window must not be negative, got {sliding_window!r}")
    left, right = (None if x is None else int(x) for x in (left, right))
    windowed = left is not None or right is not None
    left = UNBOUNDED if left is None else min(left, UNBOUNDED)
    right = UNBOUNDED if right is None else min(right, UNBOUNDED)
    if causal:
        right = 0
    return left, right, windowed


def check_tensors(query, key, value, packed: bool = False) -> None:
    """Types, dtypes, devices and shapes of ``query``/``key``/``value``: BSHD, or with ``packed``
    the ``[total, heads, head_dim]`` of packed sequences (messages show the shapes as given)."""
    for name, t in (("query", query), ("key", key), ("value", value)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 3 + (not packed):
            layout = "[total_tokens, heads, head_dim] (3-D)" if packed else "[batch, seq, heads, head_dim] (4-D)"
            raise ValueError(f"{name} must be {layout}, got {name}.shape={tuple(t.shape)}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {name}.dtype={t.dtype}")
    qs, ks, vs = (tuple(t.shape) for t in (query, key, value))
    shapes = f"(query.shape={qs}, key.shape={ks}, value.shape={vs})"
    if not (query.dtype == key.dtype == value.dtype):
        raise TypeError(f"query, key and value must share a dtype, got {query.dtype=}, {key.dtype=}, {value.dtype=} "
                        f"{shapes}")
    if not (query.device == key.device == value.device):
        raise ValueError(f"query, key and value must be on one device, got {query.device=}, {key.device=}, "
                         f"{value.device=} {shapes}")
    if ks != vs:
        raise ValueError(f"key and value must have the same shape, got key.shape={ks}, value.shape={vs}")
    (B, _, Hq, D), (Bk, _, Hkv, Dk) = ((1, *qs), (1, *ks)) if packed else (qs, ks)
    if B != Bk:
        raise ValueError(f"query and key batch sizes differ: query.shape={qs}, key.shape={ks}")
    if D != Dk:
        raise ValueError(f"query and key head dims differ: query.shape={qs}, key.shape={ks}")
    if Hkv == 0 or Hq % Hkv:
        raise ValueError(f"query heads must be a multiple of key/value heads (GQA), got Hq={Hq}, Hkv={Hkv} "
                         f"(query.shape={qs}, key.shape={ks})")
    if D > MAX_HEAD_DIM or D < 1:
        raise ValueError(f"head_dim must be in 1..{MAX_HEAD_DIM}, got query.shape={qs}")


def check_extras(query, key, bias, alibi_slopes, softmax_aux) -> None:
    """Shapes, dtypes and devices of the optional score terms (bias, ALiBi slopes, sink logits)."""
    B, Sq, Hq, _ = query.shape
    Sk = key.shape[1]
    for name, t in (("bias", bias), ("alibi_slopes", alibi_slopes), ("softmax_aux", softmax_aux)):
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {name}.dtype={t.dtype}")
        if t.device != query.device:
            raise ValueError(f"{name} must be on the query's device, got {name}.device={t.device}, {query.device=}")
    if bias is not None:
        ok = bias.dim() == 4 and bias.shape[0] in (1, B) and bias.shape[1] in (1, Hq) and \
            tuple(bias.shape[2:]) == (Sq, Sk)
        if not ok:
            raise ValueError(f"bias must broadcast as [B or 1, Hq or 1, Sq, Sk] = [{B} or 1, {Hq} or 1, {Sq}, {Sk}], "
                             f"got bias.shape={tuple(bias.shape)}")
    if alibi_slopes is not None and tuple(alibi_slopes.shape) not in ((Hq,), (B, Hq)):
        raise ValueError(f"alibi_slopes must be [Hq] or [B, Hq] = [{Hq}] or [{B}, {Hq}], "
                         f"got alibi_slopes.shape={tuple(alibi_slopes.shape)}")
    if softmax_aux is not None and tuple(softmax_aux.shape) != (Hq,):
        raise ValueError(f"softmax_aux must hold one sink logit per query head, [Hq] = [{Hq}], "
                         f"got softmax_aux.shape={tuple(softmax_aux.shape)}")


def check_scalars(head_dim: int, softmax_scale, logits_soft_cap) -> tuple[float, float | None]:
    """``(softmax_scale, logits_soft_cap)`` validated: the scale defaults to ``1 / sqrt(head_dim)``
    and must be finite; the cap is None or a positive finite number."""
    if softmax_scale is None:  # finite: head_dim >= 1 (left unchecked, since it may be symbolic under torch.compile)
        softmax_scale = 1.0 / math.sqrt(head_dim)
    elif isinstance(softmax_scale, bool) or not isinstance(softmax_scale, numbers.Real) or \
            not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale must be a finite number, got {softmax_scale!r}")
    if logits_soft_cap is not None:
        if isinstance(logits_soft_cap, bool) or not isinstance(logits_soft_cap, numbers.Real) or \
                not 0 < logits_soft_cap < math.inf:
            raise ValueError(f"logits_soft_cap must be a positive finite number or None, got {logits_soft_cap!r}")
        logits_soft_cap = float(logits_soft_cap)
    return float(softmax_scale), logits_soft_cap


def check_dropout(dropout_prob) -> float:
    if isinstance(dropout_prob, bool) or not isinstance(dropout_prob, numbers.Real) or not 0 <= dropout_prob < 1:
        raise ValueError(f"dropout_prob must be a number in [0, 1), got {dropout_prob!r}")
    return float(dropout_prob)


def check_varlen(query, key, value, cum_seqlens_q, cum_seqlens_k, max_seqlen_q=None,
                  max_seqlen_k=None) -> tuple[int, int]:
    """Validate packed-sequence inputs; returns the longest query and key lengths (the given
    ``max_seqlen_*`` when set: see modules/packed_offsets.py)."""
    if (cum_seqlens_q is None) != (cum_seqlens_k is None):
        raise ValueError("cum_seqlens_q and cum_seqlens_k must be given together")
    if (max_seqlen_q is None) != (max_seqlen_k is None):
        raise ValueError("max_seqlen_q and max_seqlen_k must be given together")
    for name, t in (("query", query), ("key", key), ("value", value)):
        if isinstance(t, torch.Tensor) and t.dim() != 3:
            raise ValueError(f"with cum_seqlens, {name} must be packed as [total_tokens, heads, head_dim] (3-D), "
                             f"got {name}.shape={tuple(t.shape)}")
    check_tensors(query, key, value, packed=True)
    maxima = []
    for name, cu, max_len in (("cum_seqlens_q", cum_seqlens_q, max_seqlen_q),
                              ("cum_seqlens_k", cum_seqlens_k, max_seqlen_k)):
        if not isinstance(cu, torch.Tensor) or cu.dtype != torch.int32 or cu.dim() != 1 or cu.numel() < 2:
            raise ValueError(f"{name} must be a 1-D int32 tensor [num_seqs + 1], got "
                             f"{getattr(cu, 'dtype', type(cu).__name__)} of shape {tuple(getattr(cu, 'shape', ()))}")
        if cu.device != query.device:
            raise ValueError(f"{name} must be on the query's device ({query.device}), got {cu.device}")
        maxima.append(None if max_len is None else check_max_seqlen("max_seqlen_" + name[-1], max_len))
    if cum_seqlens_q.numel() != cum_seqlens_k.numel():
        raise ValueError(f"cum_seqlens_q and cum_seqlens_k must describe the same number of sequences, got "
                         f"cum_seqlens_q.shape={tuple(cum_seqlens_q.shape)} and "
                         f"cum_seqlens_k.shape={tuple(cum_seqlens_k.shape)}")
    return check_offset_values(cum_seqlens_q, cum_seqlens_k, query.shape, key.shape, *maxima)


def bool_mask_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A boolean mask (True = may attend) as an additive bias: 0 where kept, -inf where masked."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))


def lower_mask_info(mask_info, query, key, bias):
    """MaskInfo -> (bias, q_segment_ids, kv_segment_ids): segment ids go to the kernels as int32
    ``[B, S]`` rows (int64 where a wider type was given); a boolean mask becomes an additive
    ``-inf`` bias (added to ``bias``)."""
    if mask_info is None:
        return bias, None, None
    from kernelops.types import MaskInfo

    if not isinstance(mask_info, MaskInfo):
        raise TypeError(f"mask_info must be a kernelops.MaskInfo, got {type(mask_info).__name__}")
    B, Sq, Hq, _ = query.shape
    Sk = key.shape[1]
    if mask_info.attention_mask is not None:
        mask = mask_info.attention_mask.to(query.device)
        if mask.shape[0] not in (1, B) or mask.shape[1] not in (1, Hq) or tuple(mask.shape[2:]) != (Sq, Sk):
            raise ValueError(f"mask_info.attention_mask must be [B or 1, Hq or 1, Sq, Sk] = [{B}, {Hq}, {Sq}, {Sk}], "
                             f"got mask_info.attention_mask.shape={tuple(mask.shape)}")
        mask_bias = bool_mask_bias(mask, query.dtype)
        return (mask_bias if bias is None else bias + mask_bias), None, None
    qs, ks = mask_info.q_segment_ids, mask_info.kv_segment_ids
    if tuple(qs.shape) != (B, Sq) or tuple(ks.shape) != (B, Sk):
        raise ValueError(f"segment ids must be [B, Sq] = [{B}, {Sq}] and [B, Sk] = [{B}, {Sk}], got "
                         f"q_segment_ids.shape={tuple(qs.shape)}, kv_segment_ids.shape={tuple(ks.shape)}")
    if qs.device != query.device or ks.device != query.device:
        raise ValueError(f"segment ids must be on the query's device ({query.device}), got {qs.device}, {ks.device}")
    from kernelops.kernels.flash_attention.fwd import segment_ids_for_kernels

    return (bias, *segment_ids_for_kernels(qs, ks))

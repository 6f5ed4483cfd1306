"""Plain-PyTorch flash attention: the ``torch`` platform and the materialised reference.

``flash_attention_torch_fwd`` / ``flash_attention_torch_bwd`` run on any device and dtype. They
walk the keys ``chunk`` at a time with an online softmax (forward) and recompute the
probabilities from the saved log-sum-exp (backward), so peak extra memory is
O(B * Hq * Sq * chunk), never O(Sq * Sk) for the whole sequence (a bias gradient is itself
O(Sq * Sk)). Accumulation is float32 (float64 for float64 inputs).

``attention_materialized`` builds the whole score matrix and differentiates through torch
autograd: an independent implementation used by tests as the float64 reference.

Shapes (BSHD): ``q [B, Sq, Hq, D]``, ``k/v [B, Sk, Hkv, D]``, ``out [B, Sq, Hq, D]``,
``lse [B, Hq, Sq]`` float32, float64 for float64 inputs (natural log, -inf for rows that see no key). Logits are
``softcap(scale * q.k) + bias - slope_h * |j - (i + Sk - Sq)|``; the sink logit
``softmax_aux[h]`` joins each row's denominator. The mask rule is the one in
kernels/common/masking.py: query ``i`` sees key ``j`` iff ``-win_left <= j - (i + Sk - Sq) <= win_right``.
"""

from __future__ import annotations

import dataclasses

import torch

#: keys per chunk on the torch platform (read at call time, so it can be changed)
DEFAULT_CHUNK = 1024


@dataclasses.dataclass(frozen=True)
class ScoreTerms:
    """Optional additions to the logits: ``bias [B|1, Hq|1, Sq, Sk]``, ``alibi_slopes [Hq]`` or
    ``[B, Hq]``, ``softmax_aux [Hq]`` (sink logits), a boolean ``mask [B|1, Hq|1, Sq, Sk]``
    (True = may attend; torch paths only) and segment ids ``q_segment_ids [B, Sq]`` /
    ``kv_segment_ids [B, Sk]`` (a query sees only keys with its id)."""

    bias: torch.Tensor | None = None
    alibi_slopes: torch.Tensor | None = None
    softmax_aux: torch.Tensor | None = None
    mask: torch.Tensor | None = None
    q_segment_ids: torch.Tensor | None = None
    kv_segment_ids: torch.Tensor | None = None

    def segment_mask(self, k0: int = 0, k1: int | None = None) -> torch.Tensor | None:
        """``[B, 1, Sq, k1 - k0]``: True where the query and key segment ids agree."""
        if self.q_segment_ids is None:
            return None
        kv = self.kv_segment_ids[:, k0:k1]
        return self.q_segment_ids[:, None, :, None] == kv[:, None, None, :]


NO_TERMS = ScoreTerms()


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The returned lse's dtype for inputs of ``dtype``: float32, float64 for float64 inputs."""
    return _acc_dtype(dtype)


def band_mask(seq_q: int, seq_k: int, win_left: int, win_right: int, device, k0: int = 0, k1: int | None = None):
    """Boolean ``[Sq, k1 - k0]``: True where query i may attend key j (keys k0..k1)."""
    k1 = seq_k if k1 is None else k1
    rows = torch.arange(seq_q, device=device)[:, None] + (seq_k - seq_q)
    cols = torch.arange(k0, k1, device=device)[None, :]
    rel = cols - rows
    return (rel >= -win_left) & (rel <= win_right)


def alibi_distance(seq_q: int, seq_k: int, device, k0: int = 0, k1: int | None = None) -> torch.Tensor:
    """``|j - (i + Sk - Sq)|`` as ``[Sq, k1 - k0]`` (the ALiBi distance, bottom-right aligned)."""
    k1 = seq_k if k1 is None else k1
    rows = torch.arange(seq_q, device=device)[:, None] + (seq_k - seq_q)
    return (torch.arange(k0, k1, device=device)[None, :] - rows).abs()


def _grouped(x: torch.Tensor, num_kv_heads: int, dtype) -> torch.Tensor:
    """``[B, S, H, D]`` -> ``[B, Hkv, G, S, D]`` in ``dtype`` (query head h = hkv * G + g)."""
    B, S, H, D = x.shape
    return x.to(dtype).permute(0, 2, 1, 3).reshape(B, num_kv_heads, H // num_kv_heads, S, D)


def _ungroup(x: torch.Tensor) -> torch.Tensor:
    """``[B, Hkv, G, S, D]`` -> ``[B, S, Hkv * G, D]``."""
    B, Hkv, G, S, D = x.shape
    return x.reshape(B, Hkv * G, S, D).permute(0, 2, 1, 3)


def _group_heads(t: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """``[X, H or 1, ...]`` -> ``[X, Hkv or 1, G or 1, ...]`` (a size-1 head dim stays broadcast)."""
    if t.shape[1] == 1:
        return t.unsqueeze(2)
    return t.reshape(t.shape[0], num_kv_heads, t.shape[1] // num_kv_heads, *t.shape[2:])


def _slopes(terms: ScoreTerms, num_kv_heads: int, dtype) -> torch.Tensor | None:
    """ALiBi slopes as ``[B or 1, Hkv, G, 1, 1]``."""
    if terms.alibi_slopes is None:
        return None
    s = terms.alibi_slopes.to(dtype)
    s = s[None] if s.dim() == 1 else s
    return _group_heads(s, num_kv_heads)[..., None, None]


def _key_chunks(qg, k, v, softmax_scale, softcap, win_left, win_right, chunk, acc_t, terms=NO_TERMS):
    """Walk the keys ``chunk`` at a time: ``(k0, k1, kc, vc, s, t)`` with masked logits ``s``
    ``[B, Hkv, G, Sq, k1 - k0]`` and the soft cap's tanh ``t`` (None without one)."""
    Sq, Sk, Hkv = qg.shape[3], k.shape[1], k.shape[2]
    slopes = _slopes(terms, Hkv, acc_t)
    for k0 in range(0, Sk, chunk):
        k1 = min(Sk, k0 + chunk)
        kc = k[:, k0:k1].to(acc_t).permute(0, 2, 1, 3)
        vc = v[:, k0:k1].to(acc_t).permute(0, 2, 1, 3)
        s = torch.einsum("bhgqd,bhkd->bhgqk", qg, kc) * softmax_scale
        t = None
        if softcap:
            t = torch.tanh(s / softcap)
            s = t * softcap
        if terms.bias is not None:
            s = s + _group_heads(terms.bias[..., k0:k1].to(acc_t), Hkv)
        if slopes is not None:
            s = s - slopes * alibi_distance(Sq, Sk, qg.device, k0, k1).to(acc_t)
        s = s.masked_fill(~band_mask(Sq, Sk, win_left, win_right, qg.device, k0, k1), float("-inf"))
        if terms.mask is not None:
            s = s.masked_fill(~_group_heads(terms.mask[..., k0:k1], Hkv), float("-inf"))
        if terms.q_segment_ids is not None:
            s = s.masked_fill(~_group_heads(terms.segment_mask(k0, k1), Hkv), float("-inf"))
        yield k0, k1, kc, vc, s, t


def _sinks(terms: ScoreTerms, num_kv_heads: int, dtype) -> torch.Tensor | None:
    """Sink logits as ``[1, Hkv, G, 1]``."""
    if terms.softmax_aux is None:
        return None
    return _group_heads(terms.softmax_aux.to(dtype)[None], num_kv_heads)[..., None]


_MASK64 = (1 << 64) - 1


def _mix64(x: int) -> int:
    """A 64-bit mix (splitmix64's finaliser): every output bit depends on every input bit. The CPU
    generator keeps only the low 32 bits of its seed, so seeds must not differ in the high bits
    alone (unmixed, seeds ``s`` and ``s + 2**32`` would draw one mask on the CPU)."""
    x &= _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def torch_chunk_keep(seed: int, dropout_p: float, k0: int, shape, device) -> torch.Tensor:
    """The torch platform's keep mask for the key chunk starting at ``k0`` (``shape`` is the
    chunk's ``[B, Hkv, G, Sq, C]``)."""
    gen = torch.Generator(device=device).manual_seed(_mix64(seed * 1000003 + k0) >> 1)
    return torch.rand(shape, generator=gen, device=device) >= dropout_p


def torch_keep_mask(seed: int, dropout_p: float, batch: int, heads: int, kv_heads: int, seq_q: int, seq_k: int,
                    device, chunk: int | None = None) -> torch.Tensor:
    """Boolean ``[B, Hq, Sq, Sk]``: the torch platform's keep mask (its chunks concatenated)."""
    chunk = chunk or DEFAULT_CHUNK
    group = heads // kv_heads
    parts = [torch_chunk_keep(seed, dropout_p, k0, (batch, kv_heads, group, seq_q, min(seq_k, k0 + chunk) - k0), device)
             for k0 in range(0, seq_k, chunk)]
    return torch.cat(parts, dim=-1).reshape(batch, heads, seq_q, seq_k)


def _dropped(p: torch.Tensor, dropout_p: float, dropout_seed: int, k0: int) -> torch.Tensor:
    """``p`` with the torch platform's dropout mask for the chunk at ``k0`` applied (kept / (1 - p))."""
    keep = torch_chunk_keep(dropout_seed, dropout_p, k0, p.shape, p.device)
    return torch.where(keep, p / (1.0 - dropout_p), torch.zeros_like(p))


def flash_attention_torch_fwd(q, k, v, *, softmax_scale: float, win_left: int, win_right: int,
                              softcap: float | None, terms: ScoreTerms = NO_TERMS, dropout_p: float = 0.0,
                              dropout_seed: int = 0, chunk: int | None = None):
    """Forward on the torch platform; returns ``(out [B,Sq,Hq,D], lse [B,Hq,Sq])``, lse float32
    (float64 for float64 inputs, whose backward rebuilds P from it)."""
    B, Sq, Hq, D = q.shape
    Hkv = k.shape[2]
    acc_t = _acc_dtype(q.dtype)
    qg = _grouped(q, Hkv, acc_t)
    G = Hq // Hkv
    m = torch.full((B, Hkv, G, Sq), float("-inf"), dtype=acc_t, device=q.device)
    l = torch.zeros((B, Hkv, G, Sq), dtype=acc_t, device=q.device)
    acc = torch.zeros((B, Hkv, G, Sq, D), dtype=acc_t, device=q.device)

    def merge(m, l, acc, s_max, p_sum, pv):
        m_new = torch.maximum(m, s_max)
        m_safe = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha, beta = torch.exp(m - m_safe), torch.exp(s_max - m_safe)
        return m_new, l * alpha + p_sum * beta, acc * alpha[..., None] + pv * beta[..., None]

    for k0, _, _, vc, s, _ in _key_chunks(qg, k, v, softmax_scale, softcap, win_left, win_right,
                                          chunk or DEFAULT_CHUNK, acc_t, terms):
        s_max = s.amax(-1)
        s_safe = torch.where(torch.isinf(s_max), torch.zeros_like(s_max), s_max)
        p = torch.exp(s - s_safe[..., None])
        p_v = _dropped(p, dropout_p, dropout_seed, k0) if dropout_p > 0 else p
        m, l, acc = merge(m, l, acc, s_max, p.sum(-1), torch.einsum("bhgqk,bhkd->bhgqd", p_v, vc))
    sinks = _sinks(terms, Hkv, acc_t)
    if sinks is not None:
        sinks = sinks.expand_as(m)
        m, l, acc = merge(m, l, acc, sinks, torch.ones_like(l), torch.zeros_like(acc))
    empty = l == 0
    out = acc / torch.where(empty, torch.ones_like(l), l)[..., None]
    lse = torch.where(empty, torch.full_like(l, float("-inf")), m + torch.log(torch.where(empty, torch.ones_like(l), l)))
    return _ungroup(out).to(q.dtype).contiguous(), lse.reshape(B, Hq, Sq).to(lse_dtype(q.dtype))


def _reduce_to(t: torch.Tensor, shape) -> torch.Tensor:
    """Sum ``t`` over the dims where ``shape`` has size 1 (undo broadcasting)."""
    dims = [i for i, n in enumerate(shape) if n == 1 and t.shape[i] != 1]
    return t.sum(dims, keepdim=True) if dims else t


def reduce_bias_grad(dbias: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The full ``[B, Hq, Sq, Sk]`` dS summed over the dims the bias broadcasts along, in its dtype."""
    return _reduce_to(dbias, bias.shape).to(bias.dtype)


def sink_grad(softmax_aux: torch.Tensor, lse: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
    """d loss / d sink_h = -sum over rows of P(sink) * delta, with P(sink) = exp(sink_h - lse).

    ``lse`` and ``delta = rowsum(out * dout) - dlse`` are ``[B, Hq, Sq]`` (or ``[Hq, total]`` for
    packed sequences); computed in ``lse``'s dtype.
    """
    sinks = softmax_aux.to(lse.dtype)[:, None]  # [Hq, 1] broadcasts against [..., Hq, S]
    terms = torch.exp(sinks - lse) * delta
    dims = [d for d in range(terms.dim()) if d != terms.dim() - 2]
    return (-terms.sum(dims)).to(softmax_aux.dtype)


def flash_attention_torch_bwd(q, k, v, out, dout, lse, dlse=None, *, softmax_scale: float, win_left: int,
                              win_right: int, softcap: float | None, terms: ScoreTerms = NO_TERMS,
                              bias_grad: bool = False, dropout_p: float = 0.0, dropout_seed: int = 0,
                              chunk: int | None = None):
    """Backward on the torch platform, recomputed chunk by chunk from ``lse``:
    ``(dq, dk, dv, dbias or None, dsink or None)``."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    acc_t = _acc_dtype(q.dtype)
    qg = _grouped(q, Hkv, acc_t)
    dog = _grouped(dout, Hkv, acc_t)
    delta = (dog * _grouped(out, Hkv, acc_t)).sum(-1)  # [B, Hkv, G, Sq]
    if dlse is not None:
        delta = delta - dlse.to(acc_t).reshape(B, Hkv, G, Sq)
    lse_g = lse.to(acc_t).reshape(B, Hkv, G, Sq)
    lse_g = torch.where(torch.isinf(lse_g), torch.full_like(lse_g, float("inf")), lse_g)
    dq = torch.zeros_like(qg)
    dk = torch.zeros((B, Sk, Hkv, D), dtype=k.dtype, device=k.device)
    dv = torch.zeros((B, Sk, Hkv, D), dtype=v.dtype, device=v.device)
    bias = terms.bias
    dbias = torch.zeros(bias.shape, dtype=acc_t, device=q.device) if bias_grad and bias is not None else None
    for k0, k1, kc, vc, s, t in _key_chunks(qg, k, v, softmax_scale, softcap, win_left, win_right,
                                            chunk or DEFAULT_CHUNK, acc_t, terms):
        p = torch.exp(s - lse_g[..., None])
        dp = torch.einsum("bhgqd,bhkd->bhgqk", dog, vc)
        if dropout_p > 0:  # the same chunk masks as the forward
            dv_c = torch.einsum("bhgqk,bhgqd->bhkd", _dropped(p, dropout_p, dropout_seed, k0), dog)
            dp = _dropped(dp, dropout_p, dropout_seed, k0)
        else:
            dv_c = torch.einsum("bhgqk,bhgqd->bhkd", p, dog)
        ds = p * (dp - delta[..., None])
        if dbias is not None:
            dbias[..., k0:k1] = _reduce_to(ds.reshape(B, Hq, Sq, k1 - k0), bias.shape)
        if t is not None:
            ds = ds * (1 - t * t)
        dq += torch.einsum("bhgqk,bhkd->bhgqd", ds, kc) * softmax_scale
        dk_c = torch.einsum("bhgqk,bhgqd->bhkd", ds, qg) * softmax_scale
        dk[:, k0:k1] = dk_c.permute(0, 2, 1, 3).to(k.dtype)
        dv[:, k0:k1] = dv_c.permute(0, 2, 1, 3).to(v.dtype)
    dsink = None
    if terms.softmax_aux is not None:  # lse_g has +inf for empty rows, so their P(sink) is 0
        dsink = sink_grad(terms.softmax_aux, lse_g.reshape(B, Hq, Sq), delta.reshape(B, Hq, Sq))
    dq = _ungroup(dq).to(q.dtype).contiguous()
    return dq, dk, dv, reduce_bias_grad(dbias, bias) if dbias is not None else None, dsink


def attention_materialized(q, k, v, *, softmax_scale: float, win_left: int, win_right: int,
                           softcap: float | None, terms: ScoreTerms = NO_TERMS, return_weights: bool = False,
                           dropout_prob: float = 0.0, generator: torch.Generator | None = None,
                           dropout_mask: torch.Tensor | None = None):
    """Whole-matrix attention with autograd, computed in the inputs' dtype: ``(out, lse)``
    (and the attention weights ``[B, Hq, Sq, Sk]``, before dropout, with ``return_weights``).

    Rows that see no key give output 0 and lse -inf, with zero gradients (no NaN anywhere).
    Gradients flow to ``terms.bias`` and ``terms.softmax_aux`` when they require them. Dropout
    zeroes weights with probability ``dropout_prob`` (drawn from ``generator``, or where the
    given boolean ``dropout_mask [B, Hq, Sq, Sk]`` is False) and scales the kept ones by
    ``1 / (1 - dropout_prob)``.
    """
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    G = Hq // Hkv
    qh = q.permute(0, 2, 1, 3)
    kh = k.permute(0, 2, 1, 3).repeat_interleave(G, dim=1)
    vh = v.permute(0, 2, 1, 3).repeat_interleave(G, dim=1)
    s = torch.matmul(qh, kh.transpose(-1, -2)) * softmax_scale
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    if terms.bias is not None:
        s = s + terms.bias.to(s.dtype)
    if terms.alibi_slopes is not None:
        slopes = terms.alibi_slopes.to(s.dtype)
        slopes = (slopes[None] if slopes.dim() == 1 else slopes)[..., None, None]
        s = s - slopes * alibi_distance(Sq, Sk, q.device).to(s.dtype)
    s = s.masked_fill(~band_mask(Sq, Sk, win_left, win_right, q.device), float("-inf"))
    if terms.mask is not None:
        s = s.masked_fill(~terms.mask, float("-inf"))
    if terms.q_segment_ids is not None:
        s = s.masked_fill(~terms.segment_mask(), float("-inf"))
    if terms.softmax_aux is not None:
        s = torch.cat([s, terms.softmax_aux.to(s.dtype)[None, :, None, None].expand(B, Hq, Sq, 1)], dim=-1)
    if s.shape[-1] == 0:  # no key and no sink: every row is empty (amax cannot reduce over nothing)
        m = s.new_zeros((*s.shape[:-1], 1))
    else:
        m = s.amax(-1, keepdim=True).detach()
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    l = e.sum(-1, keepdim=True)
    p = e / torch.where(l == 0, torch.ones_like(l), l)
    if terms.softmax_aux is not None:
        p = p[..., :Sk]
    p_used = p
    if dropout_prob > 0:
        keep = dropout_mask if dropout_mask is not None else \
            torch.rand(p.shape, generator=generator, device=p.device) >= dropout_prob
        p_used = p * keep / (1.0 - dropout_prob)
    out = torch.matmul(p_used, vh).permute(0, 2, 1, 3)
    empty = l == 0
    lse = torch.where(empty, float("-inf"), m + torch.log(torch.where(empty, torch.ones_like(l), l))).squeeze(-1)
    return (out, lse, p) if return_weights else (out, lse)


def _varlen_slices(cum_seqlens_q: torch.Tensor, cum_seqlens_k: torch.Tensor):
    """``(i, q slice, k slice)`` per packed sequence (reads the offsets on the host)."""
    cq, ck = cum_seqlens_q.tolist(), cum_seqlens_k.tolist()
    for i in range(len(cq) - 1):
        yield i, slice(cq[i], cq[i + 1]), slice(ck[i], ck[i + 1])


def _sequence_terms(terms: ScoreTerms, i: int) -> ScoreTerms:
    """The score terms of packed sequence ``i`` (per-sequence ALiBi slopes ``[n, Hq]`` pick row i)."""
    slopes = terms.alibi_slopes
    if slopes is not None and slopes.dim() == 2:
        slopes = slopes[i]
    return dataclasses.replace(terms, alibi_slopes=slopes)


def _sequence_seed(band: dict, i: int) -> dict:
    """Per-sequence dropout seed for packed batches (each sequence gets its own masks)."""
    if band.get("dropout_p", 0) > 0:
        return {**band, "dropout_seed": band["dropout_seed"] + 7919 * (i + 1)}
    return band


def flash_attention_torch_fwd_varlen(q, k, v, cum_seqlens_q, cum_seqlens_k, *, terms: ScoreTerms = NO_TERMS, **band):
    """Packed sequences on the torch platform: ``q [total_q, Hq, D]`` -> ``(out [total_q, Hq, D],
    lse [Hq, total_q])``, one dense call per sequence."""
    out = torch.zeros_like(q)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=lse_dtype(q.dtype), device=q.device)
    for i, qs, ks in _varlen_slices(cum_seqlens_q, cum_seqlens_k):
        if qs.stop > qs.start:
            o, l = flash_attention_torch_fwd(q[None, qs], k[None, ks], v[None, ks], terms=_sequence_terms(terms, i),
                                             **_sequence_seed(band, i))
            out[qs], lse[:, qs] = o[0], l[0]
    return out, lse


def flash_attention_torch_bwd_varlen(q, k, v, out, dout, lse, dlse, cum_seqlens_q, cum_seqlens_k, *,
                                     terms: ScoreTerms = NO_TERMS, **band):
    """Backward of :func:`flash_attention_torch_fwd_varlen`: ``(dq, dk, dv, None, dsink or None)``."""
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    dsink = None if terms.softmax_aux is None else torch.zeros_like(terms.softmax_aux)
    for i, qs, ks in _varlen_slices(cum_seqlens_q, cum_seqlens_k):
        if qs.stop == qs.start:
            continue
        grads = flash_attention_torch_bwd(
            q[None, qs], k[None, ks], v[None, ks], out[None, qs], dout[None, qs], lse[None, :, qs],
            None if dlse is None else dlse[None, :, qs], terms=_sequence_terms(terms, i), **_sequence_seed(band, i))
        dq[qs], dk[ks], dv[ks] = grads[0][0], grads[1][0], grads[2][0]
        if dsink is not None:
            dsink += grads[4]
    return dq, dk, dv, None, dsink

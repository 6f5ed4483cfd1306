"""Helpers for attention tests: random inputs, the float64 reference, the flash-attn error rule
with attention's floors (the op-agnostic rule itself: tests/op_checks.py)."""

from __future__ import annotations

import torch

from kernelops.kernels.flash_attention.reference import ScoreTerms, attention_materialized
from kernelops.modules.attention_args import UNBOUNDED, window_bounds
from tests.op_checks import TOL_FLOOR, assert_close_to_reference, check_gradients, rel_err

# On a GPU float32 runs as 3xTF32 tensor-core products (~1e-6 relative each, vs ~6e-8 for true
# float32); where dS = P * (dP - delta) cancels (e.g. a single key), that shows up to ~1e-5.
GPU_FLOAT32_FLOOR = 2e-5
# Rounding units allowed on the size of the terms a gradient sums (see gradient_term_norms): on
# 30 random draws of the single-key case the kernels' error was at most 0.42 of one unit.
TERM_ULPS = 4


def make_qkv(B, Sq, Sk, Hq, Hkv, D, dtype, device, requires_grad=True, generator=None):
    """Fresh random BSHD inputs (never zeros): q [B,Sq,Hq,D], k/v [B,Sk,Hkv,D]."""
    def r(*shape):
        return torch.randn(*shape, dtype=torch.float32, device=device, generator=generator).to(dtype)
    q, k, v = r(B, Sq, Hq, D), r(B, Sk, Hkv, D), r(B, Sk, Hkv, D)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def band(causal, sliding_window):
    left, right, _ = window_bounds(sliding_window, causal)
    return left, right


def reference(q, k, v, *, causal=False, sliding_window=None, softmax_scale=None, logits_soft_cap=None,
              bias=None, alibi_slopes=None, softmax_aux=None, mask_info=None, dropout_prob=0.0, dropout_mask=None,
              dout=None, dlse=None, dtype=torch.float64, return_weights=False):
    """Materialised attention in ``dtype`` (float64 by default): ``(out, lse, grads)``, and the
    weights P ``[B, Hq, Sq, Sk]`` after them with ``return_weights``.

    ``grads`` is ``(dq, dk, dv)`` plus ``dbias`` / ``dsink`` for a bias / softmax_aux that
    requires grad (in that order).
    """
    left, right = band(causal, sliding_window)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    qd, kd, vd = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    wants = [qd, kd, vd]
    extras = []
    for t in (bias, softmax_aux):
        if t is None:
            extras.append(None)
            continue
        td = t.detach().to(dtype).requires_grad_(t.requires_grad)
        extras.append(td)
        if t.requires_grad:
            wants.append(td)
    slopes = None if alibi_slopes is None else alibi_slopes.detach().to(dtype)
    mask = None if mask_info is None else mask_info.to_dense()
    out, lse, weights = attention_materialized(
        qd, kd, vd, softmax_scale=scale, win_left=left, win_right=right, softcap=logits_soft_cap,
        terms=ScoreTerms(extras[0], slopes, extras[1], mask), dropout_prob=dropout_prob, dropout_mask=dropout_mask,
        return_weights=True)
    grads = None
    if dout is not None:
        loss = (out * dout.to(dtype)).sum()
        if dlse is not None:
            loss = loss + (torch.where(torch.isfinite(lse), lse, 0.0) * dlse.to(dtype)).sum()
        grads = torch.autograd.grad(loss, wants)
    if return_weights:
        return out.detach(), lse.detach(), grads, weights.detach()
    return out.detach(), lse.detach(), grads


def reference_fn(*, causal=False, sliding_window=None, softmax_scale=None, logits_soft_cap=None, alibi_slopes=None,
                 mask_info=None, dropout_prob=0.0, dropout_mask=None, return_lse=False):
    """The reference as a function for :func:`tests.op_checks.check_gradients`:
    ``ref(query, key, value, bias=None, softmax_aux=None)`` gives materialised attention computed
    in the inputs' dtype, ``out`` or ``(out, lse)`` with ``return_lse``, with autograd. Options as
    in :func:`reference`."""
    left, right = band(causal, sliding_window)
    mask = None if mask_info is None else mask_info.to_dense()

    def ref(query, key, value, bias=None, softmax_aux=None):
        scale = softmax_scale if softmax_scale is not None else query.shape[-1] ** -0.5
        slopes = None if alibi_slopes is None else alibi_slopes.detach().to(query.dtype)
        out, lse = attention_materialized(
            query, key, value, softmax_scale=scale, win_left=left, win_right=right, softcap=logits_soft_cap,
            terms=ScoreTerms(bias, slopes, softmax_aux, mask), dropout_prob=dropout_prob, dropout_mask=dropout_mask)
        return (out, lse) if return_lse else out

    return ref


def check_attention_gradients(fn, q, k, v, *, extras=None, return_lse=False, poison=False, factor=3.0, **ref_kw):
    """:func:`tests.op_checks.check_gradients` for an attention call: ``fn(query=q, key=k, value=v,
    **extras)`` (returning ``out``, or ``(out, lse)`` with ``return_lse``) against
    :func:`reference_fn` (``ref_kw``) in float64 and in the inputs' dtype, with attention's floors;
    the lse also by :func:`assert_lse_matches`. ``extras`` (bias, softmax_aux) are inputs too: the
    ones that require grad get their gradients checked. Returns the :class:`GradientCheck`."""
    inputs = dict(query=q, key=k, value=v, **(extras or {}))
    floor = attention_floor(q.dtype, q)
    result = check_gradients(fn, reference_fn(return_lse=return_lse, **ref_kw), inputs,
                             out_names=("out", "lse") if return_lse else None, factor=factor, floor=floor,
                             poison=poison)
    if return_lse:
        assert_lse_matches(result.outputs[1], result.ref_outputs[1], q.dtype)
    return result


def assert_attention_matches(out, q, k, v, *, dtype=None, lse=None, dout=None, dlse=None, grads=None, **ref_kw):
    """Results an attention call produced elsewhere (a replayed CUDA graph, a launcher called
    directly, a compiled function) against :func:`reference` in float64 and in ``dtype`` (default:
    q's): ``out``, and ``lse`` if given; with ``dout`` (and ``dlse``) the gradients ``grads``
    (default: q, k and v's ``.grad``) as ``dq``, ``dk``, ``dv``."""
    dtype = dtype or q.dtype
    ref_out, ref_lse, ref_grads = reference(q, k, v, dout=dout, dlse=dlse, **ref_kw)
    low_out, _, low_grads = reference(q, k, v, dout=dout, dlse=dlse, dtype=dtype, **ref_kw)
    assert_matches("out", out, ref_out, low_out, dtype)
    if lse is not None:
        assert_lse_matches(lse, ref_lse, dtype)
    if dout is None:
        assert grads is None, "gradients need the dout they were computed with"
        return
    grads = (q.grad, k.grad, v.grad) if grads is None else grads
    for name, got, ref, low in zip(("dq", "dk", "dv"), grads, ref_grads, low_grads):
        assert got is not None, f"{name}: no gradient"
        assert_matches(name, got, ref, low.to(got.dtype), got.dtype)


def attention_floor(dtype, got: torch.Tensor, ref64: torch.Tensor | None = None, term_norm=None) -> float:
    """The floor of the flash-attn rule for an attention result ``got`` of input ``dtype``: the
    dtype's, float32 on a GPU's 3xTF32 products, plus ``TERM_ULPS`` units of rounding on the
    size of the terms a gradient sums (``term_norm``, see :func:`gradient_term_norms`)."""
    gpu_f32 = dtype == torch.float32 and got.is_cuda
    floor = GPU_FLOAT32_FLOOR if gpu_f32 else TOL_FLOOR[dtype]
    if term_norm is not None:  # dS is formed in float32 whatever the inputs' dtype
        unit = torch.finfo(torch.float32).eps * (8 if gpu_f32 else 1)
        floor += TERM_ULPS * unit * term_norm / max(ref64.double().norm().item(), 1e-30)
    return floor


def assert_matches(name, got, ref64, ref_lowp, dtype, factor=3.0, term_norm=None):
    """The flash-attn rule (:func:`tests.op_checks.assert_close_to_reference`): error vs float64
    within a small multiple of the low-precision reference's, plus :func:`attention_floor`.

    ``term_norm`` (from :func:`gradient_term_norms`) is the size of the terms a gradient sums
    before they cancel. Rounding errors scale with those terms, not with what is left of them,
    so the bound also allows ``TERM_ULPS`` units of rounding of that size (a unit is float32's
    eps, the precision dS is formed in for every input dtype; 8 of them for float32 inputs on a
    GPU, whose products run as 3xTF32). Input rounding is the low-precision reference's part.
    """
    assert_close_to_reference(got, ref64, ref_lowp, name=name, dtype=dtype, factor=factor,
                              floor=attention_floor(dtype, got, ref64, term_norm))


def gradient_term_norms(q, k, v, weights, out, dout, dlse=None, softmax_scale=None):
    """Norms of the terms that dq and dk sum before they cancel: ``{"dq": ..., "dk": ...}``.

    The backward forms dS = P * (dP - delta) with delta = rowsum(dout * out) - dlse; where a row
    sees one key (P = 1) dP and rowsum(dout * out) are the same number computed two ways, so dS
    is mostly rounding and the relative error of dk grows as |dlse| shrinks, in any flash
    kernel. Its rounding error is bounded by a few ulps of P * (|dO| @ |V|^T + sum |dO * O| +
    |dlse|), carried into dq = scale * dS @ K and dk = scale * dS^T @ Q with |K| and |Q|; these
    are the norms of those carried sizes.
    ``weights`` is the reference's P ``[B, Hq, Sq, Sk]``; q ``[B,Sq,Hq,D]``, k/v ``[B,Sk,Hkv,D]``.
    """
    B, Sq, Hq, D = q.shape
    Hkv = k.shape[2]
    G = Hq // Hkv
    scale = softmax_scale if softmax_scale is not None else D ** -0.5
    qh, oh, doh = (t.detach().double().permute(0, 2, 1, 3) for t in (q, out, dout))
    kh, vh = (t.detach().double().permute(0, 2, 1, 3).repeat_interleave(G, dim=1) for t in (k, v))
    p = weights.detach().double()
    delta = (oh * doh).abs().sum(-1)
    if dlse is not None:
        delta = delta + dlse.double().abs()  # rows that see no key have P = 0, so their dlse drops out
    sizes = p * (doh.abs() @ vh.abs().transpose(-1, -2) + delta[..., None])
    dq_terms = scale * sizes @ kh.abs()
    dk_terms = (scale * sizes.transpose(-1, -2) @ qh.abs()).reshape(B, Hkv, G, -1, D).sum(2)
    return {"dq": dq_terms.norm().item(), "dk": dk_terms.norm().item()}


def assert_lse_matches(lse, ref_lse, dtype):
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), "lse must be -inf exactly on rows that see no key"
    if (~empty).any():
        err = (lse[~empty].double() - ref_lse[~empty]).abs().max().item()
        assert err <= 1e-4 + 10 * TOL_FLOOR[dtype], f"lse max abs err {err:.3e}"


def assert_sink_grad_matches(got, ref_dsink, sinks, ref_out, ref_lse, dout, dlse, dtype, factor=4.0):
    """dsink_h = -sum_i P(sink)_i * delta_i sums terms of both signs, so its error is judged
    against the terms' own size, sum_i |P(sink)_i * delta_i|, not the cancelled result: an error
    of a few input-dtype ulps of that scale passes, anything real fails."""
    assert torch.isfinite(got).all(), "dsink: non-finite values"
    p_sink = torch.exp(sinks.detach().double()[None, :, None] - ref_lse)  # [B, H, Sq]
    delta = (ref_out * dout.double()).sum(-1).transpose(1, 2)
    if dlse is not None:
        delta = delta - dlse.double()
    scale = (p_sink * delta).abs().sum((0, 2))
    err = ((got.double() - ref_dsink) / scale).abs().max().item()
    eps = torch.finfo(dtype).eps
    assert err <= factor * eps, f"dsink: error {err:.3e} of sum|P(sink) * delta| > {factor} eps ({factor * eps:.1e})"


__all__ = ["UNBOUNDED", "assert_attention_matches", "assert_lse_matches", "assert_matches", "assert_sink_grad_matches",
           "attention_floor", "band", "check_attention_gradients", "gradient_term_norms", "make_qkv", "reference",
           "reference_fn", "rel_err"]

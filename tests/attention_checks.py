"""Helpers for attention tests: random inputs, the float64 reference, the flash-attn error rule."""

from __future__ import annotations

import torch

from kernelops.kernels.flash_attention.reference import ScoreTerms, attention_materialized
from kernelops.modules.flash_attention import UNBOUNDED, _window

# float32 floor: where dS = P * (dP - delta) cancels (a single key), float32 gradients carry
# ~1e-6..5e-6 relative error in both the kernels and the float32 reference run; 1e-5 keeps that
# from failing at random while any real bug (>= 1e-3) still fails.
TOL_FLOOR = {torch.float32: 1e-5, torch.float16: 2e-4, torch.bfloat16: 2e-3, torch.float64: 1e-12}
# On a GPU float32 runs as 3xTF32 tensor-core products (~1e-6 relative each, vs ~6e-8 for true
# float32); where dS = P * (dP - delta) cancels (e.g. a single key), that shows up to ~1e-5.
GPU_FLOAT32_FLOOR = 2e-5


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    return ((got - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def make_qkv(B, Sq, Sk, Hq, Hkv, D, dtype, device, requires_grad=True, generator=None):
    """Fresh random BSHD inputs (never zeros): q [B,Sq,Hq,D], k/v [B,Sk,Hkv,D]."""
    def r(*shape):
        return torch.randn(*shape, dtype=torch.float32, device=device, generator=generator).to(dtype)
    q, k, v = r(B, Sq, Hq, D), r(B, Sk, Hkv, D), r(B, Sk, Hkv, D)
    return [t.requires_grad_(requires_grad) for t in (q, k, v)]


def band(causal, sliding_window):
    left, right, _ = _window(sliding_window, causal)
    return left, right


def reference(q, k, v, *, causal=False, sliding_window=None, softmax_scale=None, logits_soft_cap=None,
              bias=None, alibi_slopes=None, softmax_aux=None, mask_info=None, dropout_prob=0.0, dropout_mask=None,
              dout=None, dlse=None, dtype=torch.float64):
    """Materialised attention in ``dtype`` (float64 by default): ``(out, lse, grads)``.

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
    out, lse = attention_materialized(qd, kd, vd, softmax_scale=scale, win_left=left, win_right=right,
                                      softcap=logits_soft_cap, terms=ScoreTerms(extras[0], slopes, extras[1], mask),
                                      dropout_prob=dropout_prob, dropout_mask=dropout_mask)
    grads = None
    if dout is not None:
        loss = (out * dout.to(dtype)).sum()
        if dlse is not None:
            loss = loss + (torch.where(torch.isfinite(lse), lse, 0.0) * dlse.to(dtype)).sum()
        grads = torch.autograd.grad(loss, wants)
    return out.detach(), lse.detach(), grads


def assert_matches(name, got, ref64, ref_lowp, dtype, factor=3.0):
    """The flash-attn rule: error vs float64 within a small multiple of the low-precision reference's."""
    assert torch.isfinite(got).all(), f"{name}: non-finite values in the result"
    err, ref_err = rel_err(got, ref64), rel_err(ref_lowp, ref64)
    floor = GPU_FLOAT32_FLOOR if (dtype == torch.float32 and got.is_cuda) else TOL_FLOOR[dtype]
    bound = factor * ref_err + floor
    assert err <= bound, f"{name}: rel err {err:.3e} > {bound:.3e} (reference in {dtype}: {ref_err:.3e})"


def assert_lse_matches(lse, ref_lse, dtype):
    empty = torch.isinf(ref_lse)
    assert torch.equal(torch.isneginf(lse), empty), "lse must be -inf exactly on rows that see no key"
    if (~empty).any():
        err = (lse[~empty].double() - ref_lse[~empty]).abs().max().item()
        assert err <= 1e-4 + 10 * TOL_FLOOR[dtype], f"lse max abs err {err:.3e}"


__all__ = ["UNBOUNDED", "assert_lse_matches", "assert_matches", "band", "make_qkv", "reference", "rel_err"]


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

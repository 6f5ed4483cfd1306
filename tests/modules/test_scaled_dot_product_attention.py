"""scaled_dot_product_attention: torch SDPA semantics (top-left causal, bool/additive masks, torch's argument
names as well as kernelops')."""

import pytest
import torch

from kernelops import scaled_dot_product_attention
from kernelops.modules.attention_args import UNBOUNDED
from kernelops.kernels.flash_attention.reference import ScoreTerms, attention_materialized
from tests.attention_checks import assert_matches, make_qkv, rel_err
from tests.conftest import DEVICE


def _reference(q, k, v, mask, causal, dtype):
    """Float64 (or ``dtype``) materialised SDPA: mask as bias/bool, causal top-left."""
    Sq, Sk = q.shape[1], k.shape[1]
    qd, kd, vd = (t.detach().to(dtype).requires_grad_() for t in (q, k, v))
    bias = boolmask = None
    if mask is not None:
        m = mask
        while m.dim() < 4:
            m = m[None]
        if m.dtype == torch.bool:
            boolmask = m
        else:
            bias = m.to(dtype)
    out, _ = attention_materialized(qd, kd, vd, softmax_scale=q.shape[-1] ** -0.5, win_left=UNBOUNDED,
                                    win_right=(Sq - Sk) if causal else UNBOUNDED, softcap=None,
                                    terms=ScoreTerms(bias=bias, mask=boolmask))
    return out, qd, kd, vd


MASKS = {
    "none": lambda B, H, Sq, Sk: None,
    "bool-2d": lambda B, H, Sq, Sk: torch.rand(Sq, Sk, device=DEVICE) > 0.2,
    "bool-b1": lambda B, H, Sq, Sk: torch.rand(B, 1, Sq, Sk, device=DEVICE) > 0.2,
    "float-bh": lambda B, H, Sq, Sk: torch.randn(B, H, Sq, Sk, device=DEVICE),
    "float-keys": lambda B, H, Sq, Sk: torch.randn(B, 1, 1, Sk, device=DEVICE),
    "float-1d": lambda B, H, Sq, Sk: torch.randn(Sk, device=DEVICE),  # broadcast over everything but keys
    "bool-1d": lambda B, H, Sq, Sk: torch.rand(Sk, device=DEVICE) > 0.2,
}


@pytest.mark.parametrize("platform", ["triton", "torch"])
@pytest.mark.parametrize("mask_kind", list(MASKS))
@pytest.mark.parametrize("causal,Sq,Sk", [(False, 45, 61), (True, 45, 61), (True, 61, 45)])
def test_matches_reference(platform, mask_kind, causal, Sq, Sk):
    B, Hq, Hkv, D = 2, 4, 2, 32
    q, k, v = make_qkv(B, Sq, Sk, Hq, Hkv, D, torch.float32, DEVICE)
    mask = MASKS[mask_kind](B, Hq, Sq, Sk)
    if mask is not None and mask.dtype == torch.bool:
        mask[..., 0] = True  # every query sees a key (torch and kernelops differ on fully masked rows)
    out = scaled_dot_product_attention(q, k, v, attention_mask=mask, causal=causal, platform=platform)
    dout = torch.randn_like(out)
    out.backward(dout)
    ref, qd, kd, vd = _reference(q, k, v, mask, causal, torch.float64)
    ref_grads = torch.autograd.grad((ref * dout.double()).sum(), (qd, kd, vd))
    low, ql, kl, vl = _reference(q, k, v, mask, causal, torch.float32)
    low_grads = torch.autograd.grad((low * dout).sum(), (ql, kl, vl))
    assert_matches("out", out, ref.detach(), low.detach(), torch.float32)
    for name, t, r, lo in zip(("dq", "dk", "dv"), (q, k, v), ref_grads, low_grads):
        assert_matches(name, t.grad, r, lo, torch.float32)


def test_causal_is_top_left_like_torch():
    q, k, v = make_qkv(1, 8, 20, 2, 2, 16, torch.float32, DEVICE, requires_grad=False)
    ours = scaled_dot_product_attention(q, k, v, causal=True, platform="triton")
    torch_out = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True).transpose(1, 2)
    assert rel_err(ours, torch_out) < 1e-5


@pytest.mark.parametrize("platform", ["triton", "torch"])
def test_dropout_follows_torch_rng(platform):
    q, k, v = make_qkv(1, 64, 64, 2, 2, 16, torch.float32, DEVICE, requires_grad=False)
    torch.manual_seed(0)
    a = scaled_dot_product_attention(q, k, v, dropout_prob=0.5, platform=platform)
    torch.manual_seed(0)
    b = scaled_dot_product_attention(q, k, v, dropout_prob=0.5, platform=platform)
    c = scaled_dot_product_attention(q, k, v, platform=platform)
    assert a.shape == q.shape and torch.equal(a, b) and not torch.allclose(a, c)
    # the kept weights are rescaled: with all-ones values every output is ~1 on average. Each row's
    # value has a std of ~0.2 here, so average over 1024 rows (std of the mean ~0.006; 128 rows gave
    # a 3.4-sigma miss once on fresh random inputs)
    q, k, _ = make_qkv(4, 128, 128, 2, 2, 16, torch.float32, DEVICE, requires_grad=False)
    ones = torch.ones(4, 128, 2, 16, device=DEVICE)
    assert abs(scaled_dot_product_attention(q, k, ones, dropout_prob=0.5, platform=platform).mean().item() - 1) < 0.05


def test_a_mask_on_another_device_is_named():
    q = torch.randn(2, 8, 2, 16)
    with pytest.raises(ValueError, match="attention_mask must be on the query's device"):
        scaled_dot_product_attention(q, q, q, attention_mask=torch.zeros(8, 8, device="meta"))


@pytest.mark.parametrize("mask_dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("platform", ["triton", "torch"])
def test_a_float_mask_of_another_dtype_is_accepted(platform, mask_dtype):
    """A float mask need not have the query's dtype on either platform (torch's own SDPA wants it
    to: the torch platform converts it to the query's dtype)."""
    q, k, v = make_qkv(2, 24, 40, 4, 2, 16, torch.float32, DEVICE, requires_grad=False)
    mask = torch.randn(2, 1, 24, 40, device=DEVICE).to(mask_dtype)
    out = scaled_dot_product_attention(q, k, v, attention_mask=mask, platform=platform)
    ref, *_ = _reference(q, k, v, mask.float(), False, torch.float64)
    low, *_ = _reference(q, k, v, mask.float(), False, torch.float32)
    assert_matches("out", out, ref, low, torch.float32)


@pytest.mark.parametrize("mask", [torch.ones(3, 8, 8, dtype=torch.bool), torch.ones(8, 9, dtype=torch.bool),
                                  torch.ones(1, 1, 1, 2, 8, 8), torch.ones(8, 8, dtype=torch.int32)])
def test_bad_masks(mask):
    q = torch.randn(2, 8, 2, 16)
    with pytest.raises((ValueError, TypeError), match="attention_mask"):
        scaled_dot_product_attention(q, q, q, attention_mask=mask)


def _torch_sdpa_bshd(q, k, v, **kwargs):
    """torch's own function on BHSD views of BSHD tensors, back to BSHD."""
    out = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                           **kwargs)
    return out.transpose(1, 2)


@pytest.mark.parametrize("platform", ["triton", "torch"])
def test_torch_argument_names_give_torch_results(platform):
    q, k, v = make_qkv(2, 21, 33, 4, 2, 16, torch.float32, DEVICE, requires_grad=False)
    mask = torch.rand(2, 1, 21, 33, device=DEVICE) > 0.3
    mask[..., 0] = True
    for kwargs in (dict(attn_mask=mask), dict(is_causal=True), dict(scale=0.11), dict(attn_mask=mask.float() - 1),
                   dict(attn_mask=mask, scale=0.3, enable_gqa=True)):
        want = _torch_sdpa_bshd(q, k, v, enable_gqa=True, **{n: a for n, a in kwargs.items() if n != "enable_gqa"})
        ours = scaled_dot_product_attention(q, k, v, platform=platform, **kwargs)
        assert rel_err(ours, want) < 1e-5, kwargs
        ejkernel = {{"attn_mask": "attention_mask", "is_causal": "causal", "scale": "softmax_scale"}.get(n, n): a
                    for n, a in kwargs.items()}
        assert torch.equal(scaled_dot_product_attention(q, k, v, platform=platform, **ejkernel), ours), kwargs
    # torch's positional order: attn_mask, dropout_p, is_causal, scale
    positional = scaled_dot_product_attention(q, k, v, mask, 0.0, True, 0.2, platform=platform)
    keywords = scaled_dot_product_attention(q, k, v, attention_mask=mask, causal=True, softmax_scale=0.2,
                                            platform=platform)
    assert torch.equal(positional, keywords)
    torch.manual_seed(3)
    a = scaled_dot_product_attention(q, k, v, dropout_p=0.4, platform=platform)
    torch.manual_seed(3)
    assert torch.equal(a, scaled_dot_product_attention(q, k, v, dropout_prob=0.4, platform=platform))


@pytest.mark.parametrize("torch_name, name, value", [
    ("attn_mask", "attention_mask", torch.ones(8, 8, dtype=torch.bool)), ("is_causal", "causal", False),
    ("scale", "softmax_scale", 0.5), ("dropout_p", "dropout_prob", 0.0),
])
def test_both_spellings_of_one_argument_is_a_type_error(torch_name, name, value):
    q = torch.randn(2, 8, 2, 16)
    with pytest.raises(TypeError, match=f"both {torch_name}= .* and {name}= "):
        scaled_dot_product_attention(q, q, q, **{torch_name: value, name: value})


def test_enable_gqa_as_torch_reads_it():
    q, k, v = make_qkv(1, 12, 12, 4, 2, 16, torch.float32, DEVICE, requires_grad=False)
    want = _torch_sdpa_bshd(q, k, v, enable_gqa=True)
    for enable_gqa in (None, True):  # GQA without asking, unlike torch
        assert rel_err(scaled_dot_product_attention(q, k, v, enable_gqa=enable_gqa), want) < 1e-5
    with pytest.raises(ValueError, match=r"enable_gqa=False .*query.shape=\(1, 12, 4, 16\), "
                                         r"key.shape=\(1, 12, 2, 16\)"):
        scaled_dot_product_attention(q, k, v, enable_gqa=False)
    same = scaled_dot_product_attention(q, q, q, enable_gqa=False)  # Hq == Hkv: fine
    assert rel_err(same, _torch_sdpa_bshd(q, q, q)) < 1e-5
    with pytest.raises(TypeError, match="enable_gqa must be a bool"):
        scaled_dot_product_attention(q, k, v, enable_gqa=1)


def test_mask_errors_use_the_callers_name_and_show_the_shapes():
    q = torch.randn(2, 8, 2, 16)
    with pytest.raises(ValueError, match=r"attn_mask must broadcast .* attn_mask.shape=\(8, 9\) \(query.shape="
                                         r"\(2, 8, 2, 16\)"):
        scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 9, dtype=torch.bool))
    with pytest.raises(TypeError, match="attn_mask must be bool or floating point, got attn_mask.dtype=torch.int32"):
        scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(8, 8, dtype=torch.int32))

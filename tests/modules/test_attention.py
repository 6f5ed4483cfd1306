"""attention (materialised, returns weights) against the float64 reference."""

import pytest
import torch

from kernelops import MaskInfo, attention, flash_attention
from tests.attention_checks import assert_matches, make_qkv, reference
from tests.conftest import DEVICE


def test_outputs_weights_and_grads_with_segments():
    B, S, Hq, Hkv, D = 2, 37, 4, 2, 16
    q, k, v = make_qkv(B, S, S, Hq, Hkv, D, torch.float32, DEVICE)
    seg = torch.sort(torch.randint(0, 3, (B, S), device=DEVICE), dim=1).values
    info = MaskInfo.from_segments(seg)
    out, w = attention(q, k, v, mask_info=info, causal=True, logits_soft_cap=20.0)
    assert w.shape == (B, Hq, S, S)
    dout = torch.randn_like(out)
    out.backward(dout)
    # reference: the segment mask as an additive -inf bias in float64
    bias = torch.zeros(B, 1, S, S, device=DEVICE, dtype=torch.float64).masked_fill(~info.to_dense(), float("-inf"))
    ref, _, grads = reference(q, k, v, causal=True, logits_soft_cap=20.0, bias=bias, dout=dout)
    low, _, low_grads = reference(q, k, v, causal=True, logits_soft_cap=20.0, bias=bias.float(), dout=dout,
                                  dtype=torch.float32)
    assert_matches("out", out, ref, low, torch.float32)
    for name, t, r, lo in zip(("dq", "dk", "dv"), (q, k, v), grads, low_grads):
        assert_matches(name, t.grad, r, lo, torch.float32)
    visible = info.to_dense() & torch.ones(S, S, dtype=torch.bool, device=DEVICE).tril()
    torch.testing.assert_close(w.sum(-1), torch.ones(B, Hq, S, device=DEVICE))
    assert (w.masked_select(~visible.expand_as(w)) == 0).all()


def test_no_keys_gives_zero_rows_like_flash_attention():
    q, k, v = make_qkv(1, 5, 0, 2, 2, 16, torch.float32, DEVICE)
    out, w = attention(q, k, v)
    assert out.shape == q.shape and w.shape == (1, 2, 5, 0)
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.equal(out, flash_attention(q.detach(), k.detach(), v.detach()))
    out.sum().backward()
    assert torch.equal(q.grad, torch.zeros_like(q)) and k.grad.shape == k.shape


def test_sinks_take_a_share_of_the_weights():
    q, k, v = make_qkv(1, 20, 20, 1, 1, 8, torch.float64, DEVICE, requires_grad=False)
    q, k, v = (t.expand(1, 20, 2, 8) for t in (q, k, v))  # two identical heads: only the sink differs
    sinks = torch.tensor([0.5, 2.0], dtype=torch.float64, device=DEVICE)
    _, w = attention(q, k, v, softmax_aux=sinks)
    mass = w.sum(-1)  # [B, H, Sq]
    assert (mass < 1).all() and (mass[:, 1] < mass[:, 0]).all()
    # exactly: 1 - mass = e^sink / (e^sink + sum_j e^s_j), so (1 - mass) / mass = e^sink / sum_j e^s_j
    ratio = (1 - mass) / mass
    torch.testing.assert_close(ratio[:, 1] / ratio[:, 0], torch.full_like(ratio[:, 0], float(torch.e ** 1.5)))


def test_dropout_fraction_and_seed():
    q, k, v = make_qkv(2, 128, 128, 4, 4, 16, torch.float32, DEVICE, requires_grad=False)
    v = torch.ones_like(v)  # then out = rowsum(dropped weights): mean 1 - p... scaled back to 1 on average
    a, w = attention(q, k, v, dropout_prob=0.25, dropout_seed=7)
    b, _ = attention(q, k, v, dropout_prob=0.25, dropout_seed=7)
    c, _ = attention(q, k, v, dropout_prob=0.25, dropout_seed=8)
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert abs(a.mean().item() - 1.0) < 0.02  # kept weights are rescaled by 1 / (1 - p)
    torch.testing.assert_close(w.sum(-1), torch.ones_like(w.sum(-1)))  # weights are pre-dropout


@pytest.mark.parametrize("bad", [dict(dropout_prob=1.0), dict(dropout_prob=-0.1), dict(mask_info="x"),
                                 dict(logits_soft_cap=float("inf")), dict(softmax_scale=True),
                                 dict(mask_info=MaskInfo.from_segments(torch.zeros(1, 5, dtype=torch.long)))])
def test_bad_input(bad):
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises((ValueError, TypeError)):
        attention(q, q, q, **bad)


def test_platform_and_cfg_like_every_other_op():
    from kernelops import AttentionConfig
    from kernelops.ops import NotSupportedError

    q, k, v = make_qkv(1, 9, 11, 4, 2, 16, torch.float32, DEVICE, requires_grad=False)
    want, want_w = attention(q, k, v, causal=True)
    for kwargs in (dict(platform="torch"), dict(platform="auto"), dict(cfg=AttentionConfig(platform="torch")),
                   dict(cfg=AttentionConfig()), dict(platform="torch", cfg=AttentionConfig(backend="any"))):
        out, w = attention(q, k, v, causal=True, **kwargs)
        assert torch.equal(out, want) and torch.equal(w, want_w), kwargs
    for kwargs in (dict(platform="triton"), dict(cfg=AttentionConfig(platform="triton"))):
        with pytest.raises(NotSupportedError, match="platform='triton'.*plain torch only"):
            attention(q, k, v, **kwargs)
    with pytest.raises(ValueError, match="platform must be one of .*'gpu'"):
        attention(q, k, v, platform="gpu")
    with pytest.raises(TypeError, match="cfg must be a AttentionConfig, got FlashAttentionConfig"):
        attention(q, k, v, cfg=__import__("kernelops").FlashAttentionConfig())
    other = "gpu" if DEVICE == "cpu" else "cpu"
    with pytest.raises(ValueError, match=f"backend='{other}'"):
        attention(q, k, v, cfg=AttentionConfig(backend=other))


def test_platform_under_torch_compile():
    from kernelops.ops import NotSupportedError

    q, k, v = make_qkv(1, 9, 9, 2, 2, 16, torch.float32, DEVICE, requires_grad=False)

    def fn(q, k, v, platform):
        return attention(q, k, v, causal=True, platform=platform)[0]

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="eager", fullgraph=True)
    torch.testing.assert_close(compiled(q, k, v, "torch"), fn(q, k, v, "torch"), rtol=0, atol=0)
    with pytest.raises(Exception) as caught:  # dynamo wraps what the traced call raised
        compiled(q, k, v, "triton")
    assert isinstance(caught.value, NotSupportedError) or "plain torch only" in str(caught.value)

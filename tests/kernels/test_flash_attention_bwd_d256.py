"""The D=256 Gluon backward (kernels/flash_attention/bwd_d256.py): dQ, dK and dV from one
warp-specialised kernel whose two consumer warpgroups split the head dim. Gradients against
float64 on an sm_90 GPU (bf16 and fp16, full, causal, GQA, a sliding window, lengths that are
multiples of 64 but not of 128, outputs poisoned with NaN first), the public call taking it, and
the checks and the dispatch rule on any machine."""

import pytest
import torch

from kernelops.kernels.flash_attention import bwd_d256
from tests.attention_checks import assert_matches, make_qkv, reference
from tests.modules.test_flash_attention_ws_choice import launch_spy, needs_sm90

D = 256


def _case(B, S, Hq, Hkv, causal, window, dtype):
    from kernelops import flash_attention

    q, k, v = make_qkv(B, S, S, Hq, Hkv, D, dtype, "cuda", requires_grad=False)
    band = dict(causal=causal, sliding_window=(window, 0) if window is not None else None)
    out, lse = flash_attention(q, k, v, return_lse=True, **band)
    return q, k, v, out, lse, torch.randn_like(out)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("B, S, Hq, Hkv, causal, window", [
    (2, 256, 4, 4, False, None), (2, 384, 4, 1, True, None), (1, 192, 2, 2, True, None), (1, 64, 2, 1, True, None),
    (2, 512, 4, 2, True, 100), (1, 1024, 2, 2, False, None), (1, 320, 6, 2, False, None)],
    ids=["full", "gqa4-causal", "s192-causal", "one-block", "window100", "full-1k", "gqa3-s320"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_matches_float64(B, S, Hq, Hkv, causal, window, dtype):
    q, k, v, out, lse, dout = _case(B, S, Hq, Hkv, causal, window, dtype)
    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    bwd_d256.flash_attention_bwd_d256(q, k, v, dout, lse, delta, dq, dk, dv, softmax_scale=D ** -0.5, causal=causal,
                                      win_left=window)
    kw = dict(causal=causal, sliding_window=window, dout=dout)
    _, _, ref = reference(q, k, v, **kw)
    _, _, low = reference(q, k, v, **kw, dtype=dtype)
    for name, got, want, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, low):
        assert_matches(name, got, want, lo, dtype)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("chunk", [1, 3, 64])
def test_launch_orders_cover_every_program(chunk):
    """Chunks of 1, 3 (two chunks of 3 heads) and more heads than there are: every key block of
    every head is written (outputs poisoned with NaN) and the gradients match float64."""
    q, k, v, out, lse, dout = _case(3, 256, 4, 2, True, None, torch.bfloat16)  # 6 heads of 4 key blocks
    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    bwd_d256.flash_attention_bwd_d256(q, k, v, dout, lse, delta, dq, dk, dv, softmax_scale=D ** -0.5, causal=True,
                                      chunk=chunk)
    _, _, ref = reference(q, k, v, causal=True, dout=dout)
    _, _, low = reference(q, k, v, causal=True, dout=dout, dtype=torch.bfloat16)
    for name, got, want, lo in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, low):
        assert_matches(f"{name} chunk={chunk}", got, want, lo, torch.bfloat16)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_public_backward_runs_it(monkeypatch, causal):
    """``flash_attention(...).backward()`` at D=256 above the FLOP floor runs this kernel (once) and
    its gradients match float64; ``deterministic=True`` keeps the Triton kernels."""
    from kernelops import flash_attention

    seen = launch_spy(monkeypatch, "flash_attention_bwd_d256_kernel")
    q, k, v = make_qkv(1, 2048, 2048, 8, 2, D, torch.bfloat16, "cuda")  # 4 * 8 * 2048^2 * 256 > 1e10 FLOPs
    dout = torch.randn_like(q)
    flash_attention(q, k, v, causal=causal).backward(dout)
    assert seen == ["ws"]
    _, _, ref = reference(q, k, v, causal=causal, dout=dout)
    _, _, low = reference(q, k, v, causal=causal, dout=dout, dtype=torch.bfloat16)
    for name, got, want, lo in zip(("dq", "dk", "dv"), (q.grad, k.grad, v.grad), ref, low):
        assert_matches(name, got, want, lo, torch.bfloat16)
    for t in (q, k, v):
        t.grad = None
    flash_attention(q, k, v, causal=causal, deterministic=True).backward(dout)
    assert seen == ["ws"]


def test_shape_rule():
    ok = bwd_d256.d256_shape_supported
    bf16 = torch.bfloat16
    assert ok((2, 192, 8, 256), (2, 192, 2, 256), bf16)
    assert ok((1, 64, 1, 256), (1, 64, 1, 256), torch.float16)
    assert not ok((2, 160, 8, 256), (2, 160, 2, 256), bf16)  # not a multiple of 64
    assert not ok((2, 128, 8, 256), (2, 256, 2, 256), bf16)  # Sq != Sk
    assert not ok((2, 128, 8, 128), (2, 128, 2, 128), bf16)  # D=128: the other kernels
    assert not ok((2, 128, 6, 256), (2, 128, 4, 256), bf16)  # Hq not a multiple of Hkv
    assert not ok((2, 128, 8, 256), (2, 128, 2, 256), torch.float32)
    assert not ok((128, 8, 256), (128, 2, 256), bf16)  # packed


def test_bad_arguments_are_refused_before_any_launch():
    q = torch.empty(1, 256, 4, D, dtype=torch.bfloat16)
    kv = torch.empty(1, 256, 2, D, dtype=torch.bfloat16)
    stats = torch.empty(1, 4, 256)
    call = dict(softmax_scale=0.1, causal=True, warmup_only=True)
    with pytest.raises(ValueError, match="lse"):
        bwd_d256.flash_attention_bwd_d256(q, kv, kv, q, stats[..., :128], stats, q, kv, kv, **call)
    with pytest.raises(ValueError, match="dq_acc"):
        bwd_d256.flash_attention_bwd_d256(q, kv, kv, q, stats, stats, q, kv, kv, dq_acc=q.float()[:, :128], **call)
    with pytest.raises(ValueError, match="win_left"):
        bwd_d256.flash_attention_bwd_d256(q, kv, kv, q, stats, stats, q, kv, kv, softmax_scale=0.1, causal=False,
                                          win_left=5, warmup_only=True)
    with pytest.raises(ValueError, match="sm_90"):  # CPU tensors: never supported
        bwd_d256.flash_attention_bwd_d256(q, kv, kv, q, stats, stats, q, kv, kv, softmax_scale=0.1, causal=True)


def test_dispatch_takes_it_only_when_fused():
    """``bwd.ws_mode`` at D=256: the fused mode when the tensors fit (never on CPU tensors), no
    dK/dV-only mode (there is no such kernel at D=256), nothing for other bands or terms."""
    from kernelops.kernels.flash_attention import bwd

    q = torch.empty(1, 256, 4, D, dtype=torch.bfloat16)
    kv = torch.empty(1, 256, 2, D, dtype=torch.bfloat16)
    big = 1 << 30
    args = (q, kv, kv, q, kv, kv, big, 0, None, (None,) * 5, 0.0, False)
    assert bwd.ws_mode(*args, True) == (0, None)  # CPU tensors
    assert bwd.ws_mode(*args, False) == (0, None)
    if bwd_d256.d256_supported(q.cuda(), kv.cuda(), kv.cuda(), q.cuda(), kv.cuda(), kv.cuda()) \
            if torch.cuda.is_available() else False:  # pragma: no cover - sm_90 machines
        cuda = tuple(t.cuda() for t in (q, kv, kv, q, kv, kv))
        assert bwd.ws_mode(*cuda, big, 0, None, (None,) * 5, 0.0, False, True) == (2, (True, None))
        assert bwd.ws_mode(*cuda, big, 0, None, (None,) * 5, 0.0, False, False) == (0, None)
        assert bwd.ws_mode(*cuda, big, 5, None, (None,) * 5, 0.0, False, True) == (0, None)  # a right window

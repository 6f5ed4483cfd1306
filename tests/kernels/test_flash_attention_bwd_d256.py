"""The D=256 Gluon backward (kernels/flash_attention/bwd_d256.py): dQ, dK and dV from one
warp-specialised kernel whose two consumer warpgroups split the head dim. Gradients against
float64 on an sm_90 GPU (bf16 and fp16, full, causal, GQA, a sliding window, lengths that are
multiples of 64 but not of 128, outputs poisoned with NaN first), the public call taking it, and
the shape and dispatch rules on any machine (its argument checks: test_flash_attention_bwd_fused.py)."""

import pytest
import torch

from kernelops.kernels.flash_attention import bwd_d256
from tests.attention_checks import make_qkv
from tests.kernels.test_flash_attention_bwd_fused import _case as fused_case
from tests.kernels.test_flash_attention_bwd_fused import assert_grads_match, assert_splits_on_every_path
from tests.modules.test_flash_attention_ws_choice import launch_spy, needs_sm90

D = 256


def _case(B, S, Hq, Hkv, causal, window, dtype):
    return fused_case(B, S, Hq, Hkv, D, causal, window, dtype)


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
    assert_grads_match((dq, dk, dv), q, k, v, dout, dtype, causal=causal, sliding_window=window)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("B, S, Hq, Hkv, causal, window, chunk", [
    (2, 384, 4, 1, True, None, None), (1, 256, 8, 2, False, None, None), (2, 512, 4, 2, True, 100, None),
    (1, 320, 6, 2, False, None, 5), (3, 256, 4, 4, True, None, 1)],
    ids=["gqa4-causal", "gqa4-full", "window100", "gqa3-s320-chunk5", "no-gqa-chunk1"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_split_heads_match_float64(B, S, Hq, Hkv, causal, window, chunk, dtype):
    """``split=True``: one query head per program, dK and dV added into a float32 workspace by every
    head of the group (outputs poisoned with NaN; chunks that split groups across chunks too)."""
    q, k, v, out, lse, dout = _case(B, S, Hq, Hkv, causal, window, dtype)
    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    bwd_d256.flash_attention_bwd_d256(q, k, v, dout, lse, delta, dq, dk, dv, softmax_scale=D ** -0.5, causal=causal,
                                      win_left=window, chunk=chunk, split=True)
    assert_grads_match((dq, dk, dv), q, k, v, dout, dtype, " split", causal=causal, sliding_window=window)


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
    assert_grads_match((dq, dk, dv), q, k, v, dout, torch.bfloat16, f" chunk={chunk}", causal=True)


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
    assert_grads_match((q.grad, k.grad, v.grad), q, k, v, dout, torch.bfloat16, causal=causal)
    for t in (q, k, v):
        t.grad = None
    flash_attention(q, k, v, causal=causal, deterministic=True).backward(dout)
    assert seen == ["ws"]


@pytest.mark.gpu
@needs_sm90
def test_public_gqa_backward_splits_heads(monkeypatch):
    """At 4k keys with GQA the public backward splits the query heads (:func:`bwd_d256.d256_split`),
    through the general path and a plan's bound launches alike: gradients match float64 each time."""
    from kernelops import flash_attention

    q, k, v = make_qkv(1, 4096, 4096, 8, 2, D, torch.bfloat16, "cuda")  # GQA 4
    dout = torch.randn_like(q)

    def step(tag):
        for t in (q, k, v):
            t.grad = None
        flash_attention(q, k, v, causal=True).backward(dout)
        assert_grads_match((q.grad, k.grad, v.grad), q, k, v, dout, torch.bfloat16, tag, causal=True)

    assert_splits_on_every_path(monkeypatch, "flash_attention_bwd_d256_kernel", k, step)


def test_split_rule():
    """Causal GQA calls (windowed or not) split from :data:`bwd_d256.SPLIT_MIN_KEYS_CAUSAL` keys with
    a group of 4 or more, or without a window with a group of 8 or more at any length; full ones and causal groups of 2-3
    without a window from :data:`bwd_d256.SPLIT_MIN_KEYS`; windowed groups of 2-3 and GQA-1 never. The workspace is a zeroed float32 pair of
    k's shape when the rule splits (``backward.dkv_workspace``)."""
    split = bwd_d256.d256_split
    c, f = bwd_d256.SPLIT_MIN_KEYS_CAUSAL, bwd_d256.SPLIT_MIN_KEYS

    def shapes(s, hq, hkv):
        return (1, s, hq, 256), (1, s, hkv, 256)

    assert split(*shapes(c, 8, 2), True) and split(*shapes(c, 8, 2), True, 100)
    assert not split(*shapes(c - 64, 8, 2), True)
    assert split(*shapes(1024, 8, 1), True)  # GQA 8: the causal tail at any length
    assert not split(*shapes(1024, 8, 1), True, 256) and split(*shapes(c, 8, 1), True, 256)  # windows from c
    assert not split(*shapes(c, 8, 4), True) and split(*shapes(f, 8, 4), True)  # GQA 2
    assert not split(*shapes(f, 8, 4), True, 1024) and split(*shapes(f, 8, 2), True, 1024)  # windows: GQA 2, 4
    assert not split(*shapes(c, 8, 2), False) and split(*shapes(f, 8, 2), False)
    assert not split(*shapes(4 * f, 8, 8), True)
    from kernelops.kernels.flash_attention.backward import dkv_workspace

    q, k = torch.empty(1, c, 4, 256), torch.empty(1, c, 1, 256)
    ws = dkv_workspace(q, k, True)
    assert ws.shape == (2, 1, c, 1, 256) and ws.dtype == torch.float32 and not ws.any()
    assert dkv_workspace(q, k, False) is None
    assert dkv_workspace(q[..., :128], k[..., :128], True) is None  # D=128 splits from more keys


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


def test_dispatch_takes_it_only_when_fused():
    """``backward.ws_mode`` at D=256: the fused mode when the tensors fit (never on CPU tensors), no
    dK/dV-only mode (there is no such kernel at D=256), nothing for other bands or terms."""
    from kernelops.kernels.flash_attention import backward

    q = torch.empty(1, 256, 4, D, dtype=torch.bfloat16)
    kv = torch.empty(1, 256, 2, D, dtype=torch.bfloat16)
    big = 1 << 30
    args = (q, kv, kv, q, kv, kv, big, 0, None, (None,) * 5, 0.0, False)
    assert backward.ws_mode(*args, True) == (0, None)  # CPU tensors
    assert backward.ws_mode(*args, False) == (0, None)
    cuda = tuple(t.cuda() for t in (q, kv, kv, q, kv, kv)) if torch.cuda.is_available() else None
    if cuda is not None and bwd_d256.d256_supported(*cuda):  # pragma: no cover - sm_90 machines
        assert backward.ws_mode(*cuda, big, 0, None, (None,) * 5, 0.0, False, True) == (2, (True, None))
        assert backward.ws_mode(*cuda, big, 0, None, (None,) * 5, 0.0, False, False) == (0, None)
        assert backward.ws_mode(*cuda, big, 5, None, (None,) * 5, 0.0, False, True) == (0, None)  # a right window

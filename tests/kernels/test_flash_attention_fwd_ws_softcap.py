"""Soft-capped logits in the warp-specialised Gluon kernels (their ``SOFTCAP``: scores
``cap * tanh(scale * q.k / cap)``, tanh the MUFU's approximation: ``ws_common.softcap_tanh``): on an
sm_90 GPU, the forward's dense (full, causal, windowed, ragged; D 64/128/256, three consumers,
float16) and packed calls (one offsets tensor or two, with windows)
and the fused backwards' (D 64/128 and D=256, GQA split, packed) against float64 with the outputs
poisoned first, scales large enough that the cap bends most logits, and the library's soft-capped
calls through the kernels, their plans and the automatic rule. On the CPU: the launch's arguments,
its checks and the rule."""

import math

import pytest
import torch

from kernelops import BwdParams, FlashAttentionConfig, FwdParams, flash_attention
from kernelops.kernels.flash_attention import fwd_ws
from tests.attention_checks import make_qkv
from tests.modules.test_flash_attention import check_call
from tests.modules.test_flash_attention_ws_choice import _check_against_float64, launch_spy, needs_gluon, needs_sm90


@needs_gluon
def test_launch_passes_the_cap():
    """A cap sets SOFTCAP and the kernel's (qk_scale, softcap) pair; bad caps and FP8 are refused."""
    q = torch.empty(1, 256, 2, 128, dtype=torch.bfloat16)
    lse = torch.empty(1, 2, 256)
    _, _, args, meta = fwd_ws.fwd_ws_launch(q, q, q, q, lse, 0.125, True, softcap=50.0, programs=132)
    assert meta["SOFTCAP"] == 1 and args[5] == pytest.approx(0.125 / 50)  # (a flag: the MUFU's tanh of args[5] * s)
    assert args[-1] == pytest.approx(50 * math.log2(math.e)) and args[-2] == 0  # (no window)
    _, _, args, meta = fwd_ws.fwd_ws_launch(q, q, q, q, lse, 0.125, True, window=7, programs=132)
    assert not meta["SOFTCAP"] and args[5] == pytest.approx(0.125 * math.log2(math.e)) and args[-2:] == (7, 0.0)
    for cap in (-1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="softcap"):
            fwd_ws.fwd_ws_launch(q, q, q, q, lse, 0.125, True, softcap=cap, programs=132)
    f8 = torch.empty(1, 256, 2, 128, dtype=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="softcap"):
        fwd_ws.fwd_ws_launch(f8, f8, f8, q, lse, 0.125, True, softcap=50.0, programs=132, v_t=f8)


@needs_gluon
def test_rule_takes_softcaps():
    """Soft-capped calls over the FLOP floor go to the Gluon kernels by the automatic rule, dense
    and packed, forward and backward."""
    from kernelops.modules.flash_attention import FLASH_ATTENTION
    from tests.kernels.test_flash_attention_fwd_ws_packed import _packed_inputs
    from tests.modules.test_flash_attention_ws_choice import H200, _inputs

    capped = _inputs(4096, B=4, H=16, logits_soft_cap=30.0)
    assert FLASH_ATTENTION.ws_auto(capped, H200) and FLASH_ATTENTION.ws_auto(capped, H200, backward=True)
    packed = _packed_inputs([1000, 3096], causal=True, logits_soft_cap=30.0)
    assert FLASH_ATTENTION.ws_auto(packed, H200) and FLASH_ATTENTION.ws_auto(packed, H200, backward=True)


def _poisoned(q, Sq):
    B, _, Hq, D = q.shape
    return torch.full_like(q, float("nan")), torch.full((B, Hq, Sq), float("nan"), device=q.device)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("B, Sq, Sk, Hq, Hkv, D, causal, window, cap, gain, extra", [
    (2, 512, 512, 4, 2, 128, True, None, 5.0, 4.0, {}),     # most logits past the cap's knee
    (2, 512, 512, 4, 2, 128, False, None, 50.0, 1.0, {}),   # Gemma 2's cap, logits well inside it
    (1, 1024, 1024, 4, 1, 128, True, 300, 2.0, 8.0, {}),    # a window, every logit near +-cap
    (2, 512, 512, 4, 2, 128, True, 100, 30.0, 4.0, dict(kv_blocksize=64)),
    (2, 384, 384, 4, 2, 256, True, None, 5.0, 4.0, {}),     # 64-key blocks, one Q buffer
    (1, 512, 512, 2, 1, 256, False, None, 10.0, 2.0, {}),
    (1, 512, 512, 2, 1, 256, True, 64, 10.0, 2.0, {}),
    (2, 1536, 1536, 2, 1, 64, True, None, 5.0, 4.0, dict(consumers=3)),  # 192-row tiles
    (1, 384, 384, 2, 2, 64, False, None, 3.0, 4.0, dict(consumers=3)),
    (2, 200, 333, 4, 2, 128, True, None, 5.0, 4.0, {}),     # ragged: bottom-right, masked past the ends
    (1, 77, 300, 2, 1, 64, False, None, 5.0, 4.0, {}),
    (1, 1, 1000, 2, 2, 128, True, 100, 5.0, 4.0, {}),       # one query row over many keys
    (2, 300, 300, 4, 2, 256, True, 70, 1000.0, 1.0, {}),    # a cap far above every logit
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_softcap_matches_float64(B, Sq, Sk, Hq, Hkv, D, causal, window, cap, gain, extra, dtype):
    q, k, v = make_qkv(B, Sq, Sk, Hq, Hkv, D, dtype, "cuda", requires_grad=False)
    scale = gain * D ** -0.5
    out, lse = _poisoned(q, Sq)
    ragged = Sq != Sk or Sq % 128 != 0
    fwd_ws.flash_attention_fwd_ws(q, k, v, softmax_scale=scale, causal=causal, window=window, softcap=cap, out=out,
                                  lse=lse, ragged=ragged, **extra)
    _check_against_float64(out, lse, q, k, v, dtype, causal=causal, softmax_scale=scale, logits_soft_cap=cap,
                           sliding_window=None if window is None else (window, 0))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("lens_q, lens_k, Hq, Hkv, D, causal, window, cap", [
    ([300, 0, 129, 128, 1, 517, 64], None, 4, 2, 128, True, None, 5.0),     # one offsets tensor
    ([1000, 24, 255, 256], None, 2, 1, 64, False, None, 5.0),
    ([200, 333, 1, 64], None, 4, 2, 256, True, 70, 5.0),
    ([300, 0, 129, 128, 1, 517, 64], [300, 40, 200, 128, 1000, 517, 1], 4, 2, 128, True, 150, 5.0),  # two
    ([190, 66, 300], [64, 200, 1], 2, 2, 256, True, None, 10.0),
    ([50, 64], [1000, 300], 2, 1, 128, True, 20, 50.0),                    # a long prefix, a short window
])
def test_packed_softcap_matches_float64(lens_q, lens_k, Hq, Hkv, D, causal, window, cap):
    """Packed sequences with capped logits (and a bottom-right window); nothing written past the tokens."""
    from tests.kernels.test_flash_attention_fwd_ws_window import check_packed_forward

    check_packed_forward(lens_q, lens_k, Hq, Hkv, D, causal, window, cap, gain=4.0, seed=sum(lens_q) + D + int(cap))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("B, S, Hq, Hkv, D, causal, window, cap, gain, split", [
    (2, 384, 4, 1, 128, True, None, 5.0, 4.0, False), (1, 512, 4, 4, 128, False, None, 50.0, 1.0, False),
    (2, 512, 4, 2, 128, True, 100, 2.0, 8.0, False), (1, 512, 8, 2, 64, True, None, 5.0, 4.0, False),
    (1, 384, 2, 1, 64, True, 200, 10.0, 2.0, False), (2, 384, 4, 1, 128, True, None, 5.0, 4.0, True),
    (2, 256, 4, 2, 256, True, None, 5.0, 4.0, False), (1, 384, 4, 4, 256, False, None, 30.0, 2.0, False),
    (1, 512, 4, 1, 256, True, 100, 5.0, 4.0, False), (1, 512, 8, 2, 256, True, None, 5.0, 4.0, True)],
    ids=["gqa4-causal", "full-cap50", "window100", "d64-gqa", "d64-window", "split", "d256-causal", "d256-full",
         "d256-window", "d256-split"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_fused_backward_softcap_matches_float64(B, S, Hq, Hkv, D, causal, window, cap, gain, split, dtype):
    """The fused Gluon backwards (bwd_fused at D 64/128, bwd_d256 at 256) with a soft cap after the
    capped ws forward: dQ, dK, dV against float64, outputs poisoned, GQA splits too."""
    from kernelops.kernels.flash_attention import bwd_d256, bwd_fused
    from tests.kernels.test_flash_attention_bwd_fused import assert_grads_match

    q, k, v = make_qkv(B, S, S, Hq, Hkv, D, dtype, "cuda", requires_grad=False)
    scale = gain * D ** -0.5
    out, lse = fwd_ws.flash_attention_fwd_ws(q, k, v, softmax_scale=scale, causal=causal, window=window, softcap=cap)
    dout = torch.randn_like(out)
    delta = (out.float() * dout.float()).sum(-1).transpose(1, 2).contiguous()
    dq, dk, dv = (torch.full_like(t, float("nan")) for t in (q, k, v))
    fn = bwd_d256.flash_attention_bwd_d256 if D == 256 else bwd_fused.flash_attention_bwd_fused
    fn(q, k, v, dout, lse, delta, dq, dk, dv, softmax_scale=scale, causal=causal, win_left=window, softcap=cap,
       split=split)
    assert_grads_match((dq, dk, dv), q, k, v, dout, dtype, causal=causal, softmax_scale=scale, logits_soft_cap=cap,
                       sliding_window=None if window is None else (window, 0))


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("lens_q, lens_k, Hq, Hkv, D, window, cap", [
    ([300, 0, 129, 128, 1, 517, 64], None, 4, 2, 128, None, 5.0),
    ([1000, 24, 255, 256], None, 2, 1, 64, 100, 5.0),
    ([300, 0, 129, 128, 1, 517, 63], None, 4, 2, 256, 70, 5.0),
    ([300, 0, 129, 128, 1, 517, 64], [300, 40, 200, 128, 1000, 517, 1], 4, 2, 128, 150, 10.0),
    ([190, 66, 300, 0], [64, 200, 1, 70], 4, 2, 256, None, 5.0),
])
def test_packed_backward_softcap_matches_float64(monkeypatch, lens_q, lens_k, Hq, Hkv, D, window, cap):
    """The packed fused backward with a soft cap (one offsets tensor and two, windows, D=256)."""
    from tests.kernels.test_flash_attention_fwd_ws_packed import check_packed_backward

    check_packed_backward(monkeypatch, lens_q, lens_k or lens_q, Hq, Hkv, D, True, window, softcap=cap, gain=4.0)


@pytest.fixture
def launches(monkeypatch):
    return launch_spy(monkeypatch, "flash_attention_fwd_ws_kernel")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("case", [(2, 512, 512, 4, 2, 128, True, None, 5.0),
                                  (1, 384, 384, 4, 1, 256, True, 200, 30.0),
                                  (2, 256, 256, 4, 2, 64, False, None, 2.0)], ids=["gqa", "d256-window", "d64-full"])
def test_ws_config_runs_softcaps_and_trains(monkeypatch, launches, case):
    """A ws config runs a soft-capped call through the kernels (twice: the second forward through the
    plan the first bound); output, lse and gradients (the fused Gluon backward's) match float64."""
    fused = launch_spy(monkeypatch, "flash_attention_bwd_d256_kernel" if case[5] == 256
                       else "flash_attention_bwd_fused_kernel")
    cfg = FlashAttentionConfig(FwdParams(64, 64, 4, 3, ws=True), BwdParams(64, 64, 4, 2, ws=True), platform="triton")
    for _ in range(2):
        check_call(case, torch.bfloat16, "triton", cfg=cfg)
    assert launches == ["ws", "ws"] and fused == ["ws", "ws"]


@pytest.mark.gpu
@needs_sm90
def test_default_softcapped_calls_run_it(monkeypatch, launches):
    """The automatic rule sends soft-capped calls over the FLOP floor to the kernels, dense and packed
    (forward, and the packed call's backward)."""
    from tests.modules.test_flash_attention_varlen import check_varlen

    q, k, v = make_qkv(1, 4096, 4096, 16, 4, 128, torch.bfloat16, "cuda", requires_grad=False)  # 6.9e10 FLOPs
    out, lse = flash_attention(q, k, v, causal=True, logits_soft_cap=30.0, return_lse=True)
    assert launches == ["ws"]
    _check_against_float64(out, lse, q, k, v, causal=True, logits_soft_cap=30.0)
    launches.clear()
    fused = launch_spy(monkeypatch, "flash_attention_bwd_fused_kernel")
    check_varlen([1500, 700, 0, 1801], [1500, 700, 0, 1801], 8, 2, 128, torch.bfloat16, "triton", device="cuda",
                 shared_offsets=True, causal=True, sliding_window=(300, 0), logits_soft_cap=20.0)
    assert launches == ["ws"] and fused == ["ws"]

"""The warp-specialised FP8 forward (kernels/flash_attention/fwd_ws_fp8.py) against float64 on the
dequantised inputs, bounded by the error that rounding P to e4m3 alone costs (an emulation)."""

import pytest
import torch

from kernelops import FlashAttentionFP8Config, FwdParams, flash_attention, flash_attention_fp8
from tests.modules.test_flash_attention_fp8 import E4M3, make, p_rounding_error, rel

pytestmark = pytest.mark.gpu


def _expanded(deq, group):
    """The dequantised inputs with K/V heads repeated for each query head (the emulation takes no GQA)."""
    q, k, v = deq
    return q, k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)


def _check(out, lse, deq, causal, group):
    deq = _expanded(deq, group)
    ref, ref_lse = flash_attention(*deq, causal=causal, return_lse=True, platform="torch")
    assert torch.isfinite(out).all()
    assert rel(out, ref) < 1.5 * p_rounding_error(deq, causal) + 8e-3
    # lse comes from the e4m3 scores in float32, with no rounding of P
    assert torch.allclose(lse.double(), ref_lse.double(), atol=2e-3, rtol=1e-4)


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("Sq,Sk,group", [(256, 256, 1), (384, 384, 2), (200, 333, 1), (1, 130, 2)])
def test_kernel_matches_float64(D, causal, Sq, Sk, group):
    from kernelops.kernels.flash_attention.fwd_ws_fp8 import flash_attention_fwd_ws_fp8, ws_fp8_supported

    (q8, k8, v8), descale, deq = make(2, Sq, Sk, 2 * group, 2, D, "cuda")
    assert ws_fp8_supported(q8, k8, v8)
    out, lse = flash_attention_fwd_ws_fp8(q8, k8, v8, softmax_scale=D ** -0.5, causal=causal, descale=descale)
    assert out.dtype == torch.bfloat16
    _check(out, lse, deq, causal, group)


@pytest.mark.parametrize("causal", [False, True])
def test_three_consumers_tiles_and_out_dtypes(causal):
    """D=64's 192-row tiles; other ring depths; float16 and float32 O (its own staging box)."""
    from kernelops.kernels.flash_attention.fwd_ws_fp8 import flash_attention_fwd_ws_fp8

    (q8, k8, v8), descale, deq = make(1, 640, 640, 4, 4, 64, "cuda")
    for extra in (dict(consumers=3), dict(num_stages=3, out_dtype=torch.float32),
                  dict(kv_blocksize=64, num_stages=4, out_dtype=torch.float16)):
        out, lse = flash_attention_fwd_ws_fp8(q8, k8, v8, softmax_scale=0.125, causal=causal, descale=descale,
                                              **extra)
        assert out.dtype == extra.get("out_dtype", torch.bfloat16)
        _check(out, lse, deq, causal, 1)


def test_refusals():
    from kernelops.kernels.flash_attention.fwd_ws_fp8 import flash_attention_fwd_ws_fp8, ws_fp8_supported

    (q8, k8, v8), descale, _ = make(1, 128, 128, 2, 2, 32, "cuda")  # D=32: not a ws head dim
    assert not ws_fp8_supported(q8, k8, v8)
    with pytest.raises(ValueError, match="FP8 warp-specialised"):
        flash_attention_fwd_ws_fp8(q8, k8, v8, softmax_scale=0.1, causal=True)
    (q8, k8, v8), _, _ = make(1, 128, 128, 2, 2, 64, "cuda")
    assert ws_fp8_supported(q8, k8, v8)
    assert not ws_fp8_supported(q8.to(torch.bfloat16), k8.to(torch.bfloat16), v8.to(torch.bfloat16))
    assert not ws_fp8_supported(q8, k8[:, :100], v8[:, :100])  # Sq > Sk


def test_operation_runs_it_by_default_and_on_request():
    """The op's rule picks the ws kernel for a causal call; ws=False runs the TMA kernel; a soft cap
    (outside the ws scope) runs the TMA kernel under ws=True; all three match float64."""
    from kernelops.modules.flash_attention_fp8 import FLASH_ATTENTION_FP8

    (q8, k8, v8), (sq, sk, sv), deq = make(2, 512, 512, 4, 2, 128, "cuda")
    kw = dict(q_descale=sq, k_descale=sk, v_descale=sv, causal=True)
    inputs = FLASH_ATTENTION_FP8.prepare(query=q8, key=k8, value=v8, **kw)
    assert FLASH_ATTENTION_FP8.ws_on(inputs, FwdParams())
    assert not FLASH_ATTENTION_FP8.ws_on(inputs, FwdParams(ws=False))
    ws, ws_lse = flash_attention_fp8(q8, k8, v8, **kw, return_lse=True)
    tma = flash_attention_fp8(q8, k8, v8, **kw, cfg=FlashAttentionFP8Config(FwdParams(128, 64, 4, 3, ws=False)))
    _check(ws, ws_lse, deq, True, 2)
    ref = flash_attention(*_expanded(deq, 2), causal=True, platform="torch")
    assert rel(tma, ref) < 1.5 * p_rounding_error(_expanded(deq, 2), True) + 8e-3
    capped = FLASH_ATTENTION_FP8.prepare(query=q8, key=k8, value=v8, logits_soft_cap=10.0, **kw)
    assert not FLASH_ATTENTION_FP8.ws_on(capped, FwdParams(ws=True))
    out = flash_attention_fp8(q8, k8, v8, **kw, logits_soft_cap=10.0, cfg=FlashAttentionFP8Config(FwdParams(ws=True)))
    assert rel(out, flash_attention(*deq, causal=True, logits_soft_cap=10.0, platform="torch")) < 5e-2
    assert q8.dtype == E4M3


def test_given_v_t_matches_and_bad_ones_are_refused():
    from kernelops.kernels.common.transpose import transpose_seq
    from kernelops.kernels.flash_attention.fwd_ws import fwd_ws_launch
    from kernelops.kernels.flash_attention.fwd_ws_fp8 import flash_attention_fwd_ws_fp8

    (q8, k8, v8), descale, _ = make(1, 200, 333, 2, 2, 128, "cuda")
    kw = dict(softmax_scale=0.1, causal=True, descale=descale)
    a, _ = flash_attention_fwd_ws_fp8(q8, k8, v8, **kw)
    b, _ = flash_attention_fwd_ws_fp8(q8, k8, v8, **kw, v_t=transpose_seq(v8))
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="v_t must"):
        flash_attention_fwd_ws_fp8(q8, k8, v8, **kw, v_t=transpose_seq(v8)[..., :320])  # shorter than Sk
    out, lse = torch.empty(q8.shape, device="cuda", dtype=torch.bfloat16), torch.empty(1, 2, 200, device="cuda")
    with pytest.raises(ValueError, match="e4m3"):  # e4m3 q without V^T: the kernel would misread V
        fwd_ws_launch(q8, k8, v8, out, lse, 0.1, True)

"""The low-level API: one launch, BSHD or BHSD without copies, heuristic helpers."""

import pytest
import torch

from kernelops import (FlashAttentionConfig, estimate_memory_usage, flash_attention_backward, flash_attention_forward,
                       get_optimal_block_sizes)
from kernelops.modules.flash_attention import FLASH_ATTENTION
from kernelops.ops.device import DeviceInfo, device_info
from tests.attention_checks import assert_lse_matches, assert_matches, make_qkv, reference
from tests.conftest import DEVICE

H100 = DeviceInfo("cuda", 0, "NVIDIA_H100_80GB_HBM3", (9, 0), 232448, 132)


@pytest.mark.parametrize("platform", ["triton", "torch"])
@pytest.mark.parametrize("layout", ["bshd", "bhsd"])
def test_forward_backward_against_reference(layout, platform):
    B, Sq, Sk, Hq, Hkv, D = 2, 53, 71, 4, 2, 32
    q, k, v = make_qkv(B, Sq, Sk, Hq, Hkv, D, torch.float32, DEVICE, requires_grad=False)
    bias = torch.randn(1, Hq, Sq, Sk, device=DEVICE)
    kw = dict(causal=True, sliding_window=(40, None), logits_soft_cap=25.0)
    qa, ka, va = (t.transpose(1, 2) if layout == "bhsd" else t for t in (q, k, v))  # BHSD views, no copy
    out, lse = flash_attention_forward(qa, ka, va, **kw, bias=bias, block_q=16, block_kv=32, num_stages=1,
                                       layout=layout, platform=platform)
    assert out.shape == qa.shape and lse.shape == (B, Hq, Sq)
    out_bshd = out.transpose(1, 2) if layout == "bhsd" else out
    dout = torch.randn_like(out_bshd)
    douta = dout.transpose(1, 2) if layout == "bhsd" else dout
    bias.requires_grad_(True)
    dq, dk, dv, dbias, dsink = flash_attention_backward(qa, ka, va, out, douta, lse, **kw, bias=bias, bias_grad=True,
                                                        return_extra_grads=True, block_q=16, block_kv=32,
                                                        layout=layout, platform=platform)
    assert dq.shape == qa.shape and dk.shape == ka.shape and dsink is None
    ref_out, ref_lse, grads = reference(q, k, v, **kw, bias=bias, dout=dout)
    low_out, _, low = reference(q, k, v, **kw, bias=bias, dout=dout, dtype=torch.float32)
    assert_matches("out", out_bshd, ref_out, low_out, torch.float32)
    assert_lse_matches(lse, ref_lse, torch.float32)
    got = [g.transpose(1, 2) if layout == "bhsd" else g for g in (dq, dk, dv)] + [dbias]
    for name, g, r, lo in zip(("dq", "dk", "dv", "dbias"), got, grads, low):
        assert_matches(name, g, r, lo, torch.float32)


def test_bad_layout():
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(ValueError, match="layout"):
        flash_attention_forward(q, q, q, layout="sbhd")


def _heuristic(Sq, Sk, Hq, Hkv, D, dtype, causal, device):
    """FlashAttention.heuristic_config for one call's shapes (meta tensors: nothing allocated)."""
    q = torch.empty(1, Sq, Hq, D, dtype=dtype, device="meta")
    kv = torch.empty(1, Sk, Hkv, D, dtype=dtype, device="meta")
    return FLASH_ATTENTION.heuristic_config(FLASH_ATTENTION.prepare(query=q, key=kv, value=kv, causal=causal), device)


SHAPES = [  # (seq_len, head_dim, dtype, seq_len_k, causal, num_heads, num_kv_heads)
    (4096, 128, torch.float16, None, False, 1, None), (4096, 128, torch.bfloat16, None, True, 32, 8),
    (1000, 64, torch.float32, 3000, False, 8, 8), (16, 128, torch.bfloat16, 8192, True, 32, 8),
    (200, 256, torch.bfloat16, None, True, 4, 1), (65536, 64, torch.float16, None, False, 2, 2),
]


@pytest.mark.parametrize("device", [H100, device_info(torch.device("cpu"))], ids=["h100", "cpu"])
def test_get_optimal_block_sizes_is_the_heuristic(device, monkeypatch):
    """What FlashAttention.heuristic_config gives for the call these arguments describe, on the
    device asked for (an H100 stands in for a GPU here: its heuristic differs by shape and dtype)."""
    monkeypatch.setitem(get_optimal_block_sizes.__globals__, "device_info", lambda _: device)
    seen = set()
    for S, D, dtype, Sk, causal, Hq, Hkv in SHAPES:
        cfg = get_optimal_block_sizes(S, D, dtype=dtype, device="cpu", seq_len_k=Sk, causal=causal, num_heads=Hq,
                                      num_kv_heads=Hkv)
        assert isinstance(cfg, FlashAttentionConfig)
        assert cfg == _heuristic(S, Sk or S, Hq, Hkv or Hq, D, dtype, causal, device)
        seen.add(cfg)
    if device.is_cuda:  # the comparison means something only where the heuristic varies
        assert len(seen) > 1


@pytest.mark.gpu
def test_get_optimal_block_sizes_on_this_gpu_is_the_heuristic():
    for S, D, dtype, Sk, causal, Hq, Hkv in SHAPES:
        cfg = get_optimal_block_sizes(S, D, dtype=dtype, seq_len_k=Sk, causal=causal, num_heads=Hq, num_kv_heads=Hkv)
        assert cfg == _heuristic(S, Sk or S, Hq, Hkv or Hq, D, dtype, causal, device_info(torch.device("cuda")))


def test_estimate_memory_usage_counts_every_buffer():
    B, H, S, D = 2, 8, 1000, 64
    est = estimate_memory_usage(B, H, S, D, dtype=torch.bfloat16, kv_heads=2)
    elem = 2
    assert est["inputs"] == (B * S * H * D + 2 * B * S * 2 * D) * elem
    assert est["outputs"] == B * S * H * D * elem
    assert est["saved_statistics"] == B * H * S * 4 and est["workspace"] == B * H * S * 4
    assert est["gradients"] == (2 * B * S * H * D + 2 * B * S * 2 * D) * elem
    assert est["total"] == sum(v for k, v in est.items() if k not in ("inputs", "total"))
    inference = estimate_memory_usage(B, H, S, D, dtype=torch.bfloat16, train=False)
    assert inference["gradients"] == 0 and inference["workspace"] == 0


@pytest.mark.gpu
def test_estimate_matches_measured_memory():
    from kernelops import flash_attention

    B, H, S, D = 2, 16, 4096, 128
    q, k, v = make_qkv(B, S, S, H, H, D, torch.bfloat16, "cuda")
    dout = torch.randn_like(q)
    flash_attention(q, k, v, causal=True).backward(dout)  # compile and warm the allocator
    for t in (q, k, v):
        t.grad = None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = flash_attention(q, k, v, causal=True)
    out.backward(dout)
    torch.cuda.synchronize()
    measured = torch.cuda.max_memory_allocated() - base
    est = estimate_memory_usage(B, H, S, D, dtype=torch.bfloat16)
    expected = est["total"] - dout.numel() * dout.element_size()  # dout existed before the call
    assert abs(measured - expected) <= 0.1 * expected, f"measured {measured} vs estimate {expected}"

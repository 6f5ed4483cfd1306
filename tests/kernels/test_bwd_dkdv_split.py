"""``flash_attention_bwd(..., dkdv_split=True)``: dV and dK in two passes give the float64 gradients."""

import pytest
import torch

from kernelops.kernels.flash_attention.bwd import flash_attention_bwd
from kernelops.kernels.flash_attention.fwd import flash_attention_fwd
from tests.attention_checks import assert_matches, make_qkv, reference
from tests.conftest import DEVICE

BIG = 1 << 30


@pytest.mark.parametrize("kw", [dict(), dict(causal=True, logits_soft_cap=5.0), dict(causal=True, dropout=0.2)],
                         ids=["full", "causal-softcap", "causal-dropout"])
def test_split_dkdv_matches_fused_and_float64(kw):
    dtype = torch.float32
    q, k, v = make_qkv(2, 40, 37, 4, 2, 32, dtype, DEVICE, requires_grad=False)
    causal, cap, p = kw.get("causal", False), kw.get("logits_soft_cap"), kw.get("dropout", 0.0)
    band = dict(softmax_scale=32 ** -0.5, win_left=BIG, win_right=0 if causal else BIG, softcap=cap,
                dropout_p=p, dropout_seed=11)
    tiles = dict(q_blocksize=16, kv_blocksize=16, num_warps=4, num_stages=1)
    out, lse = flash_attention_fwd(q, k, v, **band, **tiles)
    dout = torch.randn_like(out)
    fused = flash_attention_bwd(q, k, v, out, dout, lse, **band, **tiles)
    split = flash_attention_bwd(q, k, v, out, dout, lse, **band, **tiles, dkdv_split=True)
    for name, a, b in zip(("dq", "dk", "dv"), fused[:3], split[:3]):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5, msg=name)
    if p == 0:
        ref_kw = dict(causal=causal, logits_soft_cap=cap)
        _, _, hi = reference(q, k, v, dout=dout, **ref_kw)
        _, _, lo = reference(q, k, v, dout=dout, dtype=dtype, **ref_kw)
        for name, got, ref, low in zip(("dq", "dk", "dv"), split[:3], hi, lo):
            assert_matches(name, got, ref, low, dtype)

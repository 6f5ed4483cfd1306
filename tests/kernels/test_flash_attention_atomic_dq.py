"""The backward's atomic-dQ mode (dQ accumulated by the dK/dV kernel) against float64.

Same gradients as the two-kernel backward up to the order of float32 additions: checked on odd
sizes with GQA, causal / window, softcap, dropout and packed sequences (against the two-kernel
backward for the last two).
"""

import pytest
import torch

from kernelops.kernels.flash_attention.bwd import flash_attention_bwd
from kernelops.kernels.flash_attention.fwd import flash_attention_fwd
from kernelops.kernels.flash_attention.reference import ScoreTerms, flash_attention_torch_bwd, flash_attention_torch_fwd
from tests.conftest import DEVICE, HAS_CUDA

BIG = 1 << 30
DTYPES = [torch.float16, torch.bfloat16] if HAS_CUDA else [torch.float16]


def _grads(q, k, v, do, wl, wr, cap, tiles, atomic, dropout=0.0):
    params = dict(q_blocksize=tiles[0], kv_blocksize=tiles[1], num_warps=4, num_stages=2 if HAS_CUDA else 1)
    band = dict(softmax_scale=q.shape[-1] ** -0.5, win_left=wl, win_right=wr, softcap=cap, dropout_p=dropout,
                dropout_seed=7)
    out, lse = flash_attention_fwd(q, k, v, **band, **params)
    dq = torch.full_like(q, float("nan"))  # poisoned: every element must be written
    dq, dk, dv, _, _ = flash_attention_bwd(q, k, v, out, do, lse, **band, **params, atomic_dq=atomic, dq=dq)
    return dq, dk, dv


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal,window,cap,gqa", [(False, None, None, 1), (True, None, None, 2),
                                                   (True, 9, 5.0, 1), (False, 13, None, 2)])
def test_atomic_dq_matches_float64(dtype, causal, window, cap, gqa):
    B, Sq, Sk, Hkv, D = 2, 45, 37, 2, 32
    q = torch.randn(B, Sq, Hkv * gqa, D, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(B, Sk, Hkv, D, device=DEVICE, dtype=dtype) for _ in range(2))
    do = torch.randn_like(q)
    wl = BIG if window is None else window
    wr = 0 if causal else (BIG if window is None else window)
    dq, dk, dv = _grads(q, k, v, do, wl, wr, cap, (16, 16), atomic=True)
    dq2, dk2, dv2 = _grads(q, k, v, do, wl, wr, cap, (16, 16), atomic=False)
    band = dict(softmax_scale=D ** -0.5, win_left=wl, win_right=wr, softcap=cap, dropout_p=0.0, dropout_seed=0)
    terms = ScoreTerms(None, None, None)
    q64, k64, v64 = (t.double() for t in (q, k, v))
    out, lse = flash_attention_torch_fwd(q64, k64, v64, **band, terms=terms)
    ref = flash_attention_torch_bwd(q64, k64, v64, out, do.double(), lse, None, **band, terms=terms)[:3]
    for got, two_kernel, want in zip((dq, dk, dv), (dq2, dk2, dv2), ref):
        assert torch.isfinite(got).all()
        err = (got.double() - want).abs().max().item()
        assert err <= 2 * (two_kernel.double() - want).abs().max().item() + 2e-3
    assert torch.equal(dk, dk2) and torch.equal(dv, dv2)  # only dQ's path changes


def test_atomic_dq_with_dropout_regenerates_the_same_mask():
    q = torch.randn(1, 40, 2, 16, device=DEVICE, dtype=torch.float16)
    k, v = (torch.randn(1, 40, 2, 16, device=DEVICE, dtype=torch.float16) for _ in range(2))
    do = torch.randn_like(q)
    dq, _, _ = _grads(q, k, v, do, BIG, 0, None, (16, 16), atomic=True, dropout=0.3)
    dq2, _, _ = _grads(q, k, v, do, BIG, 0, None, (16, 16), atomic=False, dropout=0.3)
    assert (dq.double() - dq2.double()).abs().max().item() < 2e-3 * dq2.double().abs().max().item() + 1e-3


def test_atomic_dq_packed_sequences():
    cu = torch.tensor([0, 17, 17, 50, 51], dtype=torch.int32, device=DEVICE)
    q = torch.randn(51, 4, 16, device=DEVICE, dtype=torch.float16)
    k, v = (torch.randn(51, 2, 16, device=DEVICE, dtype=torch.float16) for _ in range(2))
    do = torch.randn_like(q)
    band = dict(softmax_scale=0.25, win_left=BIG, win_right=0, softcap=None, cum_seqlens_q=cu, cum_seqlens_k=cu)
    params = dict(q_blocksize=16, kv_blocksize=16, num_warps=4, num_stages=1)
    out, lse = flash_attention_fwd(q, k, v, **band, **params)
    got = flash_attention_bwd(q, k, v, out, do, lse, **band, **params, atomic_dq=True)[0]
    want = flash_attention_bwd(q, k, v, out, do, lse, **band, **params, atomic_dq=False)[0]
    assert (got.double() - want.double()).abs().max().item() < 2e-3 * want.double().abs().max().item() + 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D,tiles", [(64, (32, 128)), (128, (64, 128)), (256, (32, 32))])
@pytest.mark.parametrize("causal", [False, True])
def test_atomic_dq_gpu(dtype, D, tiles, causal):
    q = torch.randn(2, 1000, 8, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(2, 1000, 2, D, device="cuda", dtype=dtype) for _ in range(2))
    do = torch.randn_like(q)
    dq, dk, dv = _grads(q, k, v, do, BIG, 0 if causal else BIG, None, tiles, atomic=True)
    dq2, _, _ = _grads(q, k, v, do, BIG, 0 if causal else BIG, None, tiles, atomic=False)
    scale = dq2.double().abs().max().item()
    assert (dq.double() - dq2.double()).abs().max().item() < 1e-2 * scale

"""The TMA-descriptor forward kernel (kernels/flash_attention/fwd_tma.py) against float64.

It serves the FP8 path; here its float16 / bfloat16 form (interpreter: float16 only) checks the
masks, GQA, softcap, sinks and both V layouts on odd sizes, with outputs poisoned first.
"""

import pytest
import torch

from kernelops.kernels.common.tma import tma_row_pitch, tma_rows_view
from kernelops.kernels.flash_attention.fwd_tma import flash_attention_fwd_tma, tma_supported
from kernelops.kernels.flash_attention.reference import ScoreTerms, flash_attention_torch_fwd
from tests.conftest import DEVICE, HAS_CUDA

BIG = 1 << 30
DTYPES = [torch.float16, torch.bfloat16] if HAS_CUDA else [torch.float16]


def _case(B, Sq, Sk, Hq, Hkv, D, dtype, causal, window, cap, sinks, transpose_v, tiles):
    q = torch.randn(B, Sq, Hq, D, device=DEVICE, dtype=dtype)
    k, v = (torch.randn(B, Sk, Hkv, D, device=DEVICE, dtype=dtype) for _ in range(2))
    aux = torch.randn(Hq, device=DEVICE) if sinks else None
    wl = BIG if window is None else window
    wr = 0 if causal else (BIG if window is None else window)
    out = torch.full((B, Sq, Hq, D), float("nan"), device=DEVICE, dtype=dtype)
    lse = torch.full((B, Hq, Sq), float("nan"), device=DEVICE)
    assert tma_supported(q, k, v)
    flash_attention_fwd_tma(q, k, v, softmax_scale=D ** -0.5, win_left=wl, win_right=wr, softcap=cap,
                            q_blocksize=tiles[0], kv_blocksize=tiles[1], num_warps=4, num_stages=2,
                            softmax_aux=aux, transpose_v=transpose_v, out=out, lse=lse)
    ref, ref_lse = flash_attention_torch_fwd(q.double(), k.double(), v.double(), softmax_scale=D ** -0.5,
                                             win_left=wl, win_right=wr, softcap=cap, dropout_p=0.0, dropout_seed=0,
                                             terms=ScoreTerms(None, None, None if aux is None else aux.double()))
    # the same computation in the input dtype bounds the kernel's error (the flash-attn rule)
    low, _ = flash_attention_torch_fwd(q, k, v, softmax_scale=D ** -0.5, win_left=wl, win_right=wr, softcap=cap,
                                       dropout_p=0.0, dropout_seed=0,
                                       terms=ScoreTerms(None, None, None if aux is None else aux.to(dtype)))
    assert torch.isfinite(out).all()
    err = (out.double() - ref).abs().max().item()
    assert err <= 3 * (low.double() - ref).abs().max().item() + 1e-3
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite)
    assert torch.allclose(lse.double()[finite], ref_lse.double()[finite], atol=2e-3)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("causal,window,cap,sinks,gqa", [(False, None, None, False, 1), (True, None, None, True, 2),
                                                         (True, 20, 8.0, False, 1), (False, 17, None, False, 2)])
@pytest.mark.parametrize("transpose_v", [False, True])
def test_tma_forward(dtype, causal, window, cap, sinks, gqa, transpose_v):
    _case(2, 37, 53, 2 * gqa, 2, 32, dtype, causal, window, cap, sinks, transpose_v, (16, 16))


def test_tma_forward_more_queries_than_keys():
    # causal with Sq > Sk: the first Sq - Sk queries see no key (output 0, lse -inf)
    _case(1, 50, 20, 2, 1, 16, torch.float16, True, None, None, False, False, (16, 16))


def test_layouts_the_descriptors_cannot_read_are_refused():
    q = torch.randn(1, 8, 2, 16, device=DEVICE, dtype=torch.float16)
    assert not tma_supported(q.transpose(1, 2).contiguous().transpose(1, 2), q, q)  # BHSD storage
    assert not tma_supported(q[..., :12], q[..., :12], q[..., :12])  # D not a power of two


def test_row_pitch_of_tensors_slices_and_layouts_a_descriptor_cannot_read():
    """Rows from one batch to the next in the ``[rows, H * D]`` view: S when contiguous, the cache's
    length for a slice of a longer cache; None where no row view exists (BHSD storage, a stride-0
    sequence dim, heads apart, a batch stride not a whole number of rows, a misaligned base)."""
    cache = torch.randn(3, 40, 2, 16, device=DEVICE, dtype=torch.float16)
    assert tma_row_pitch(cache) == 40 and tma_rows_view(cache)
    assert tma_row_pitch(cache[:, :25]) == 40 and not tma_rows_view(cache[:, :25])
    assert tma_row_pitch(cache[:1, :25]) == 25 and tma_rows_view(cache[:1, :25])  # one batch: any pitch
    assert tma_row_pitch(cache[:, 8:33]) == 40                                     # a window of the cache
    assert tma_row_pitch(cache.transpose(1, 2).contiguous().transpose(1, 2)) is None  # BHSD storage
    assert tma_row_pitch(cache[:, :1].expand(3, 9, 2, 16)) is None                  # rows overlap (stride 0)
    assert tma_row_pitch(cache[:, :, :1]) == 40                                     # one head
    assert tma_row_pitch(torch.randn(3, 40, 2, 32, device=DEVICE, dtype=torch.float16)[..., :16]) is None
    flat = torch.randn(3 * 40 * 32 + 16, device=DEVICE, dtype=torch.float16)
    assert tma_row_pitch(flat[:3 * 30 * 32].view(3, 30, 2, 16)) == 30
    assert tma_row_pitch(flat[1:1 + 3 * 40 * 32].view(3, 40, 2, 16)) is None       # base 2 bytes off
    assert tma_row_pitch(torch.as_strided(flat, (3, 20, 2, 16), (20 * 32 + 8, 32, 16, 1))) is None
    # one row per batch: a sequence stride narrower than the row is never stepped within a batch (a
    # Hugging Face query, BHSD storage passed transposed, ran on an H200 so); a zero one is refused
    assert tma_row_pitch(cache[:, :1]) == 40 and tma_row_pitch(cache[:1, :1]) == 1
    one = torch.randn(3, 2, 1, 16, device=DEVICE, dtype=torch.float16).transpose(1, 2)  # BHSD storage, S = 1
    assert one.stride(1) == 16 and tma_row_pitch(one) == 2 and tma_row_pitch(one[:1]) == 1
    assert tma_row_pitch(torch.as_strided(flat, (1, 1, 2, 16), (32, 0, 16, 1))) is None  # stride-0 row
    assert tma_row_pitch(torch.as_strided(flat, (2, 1, 2, 16), (32, 0, 16, 1))) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_tma_forward_gpu(dtype, D, causal):
    tiles = (64, 64) if D == 256 else (128, 64)
    _case(2, 203, 1000, 8, 2, D, dtype, causal, None, None, False, False, tiles)
    _case(2, 1000, 113, 4, 4, D, dtype, causal, 64, 30.0, True, True, tiles)

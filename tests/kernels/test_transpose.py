"""transpose_seq: [B, S, H, D] -> [B, H, D, S_pad] with zeros past S (the FP8 forwards' V^T)."""

import pytest
import torch

from kernelops.kernels.common.transpose import PAD, transpose_seq
from tests.conftest import DEVICE


@pytest.mark.parametrize("S", [1, 70, 128])
@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.bfloat16])
def test_matches_permute_and_zero_pads(S, dtype):
    x = torch.randn(2, S, 3, 32, device=DEVICE).to(dtype)
    y = transpose_seq(x)
    s_pad = -(-S // PAD) * PAD
    assert y.shape == (2, 3, 32, s_pad) and y.is_contiguous() and y.dtype == dtype
    assert torch.equal(y[..., :S].float(), x.permute(0, 2, 3, 1).float())
    assert (y[..., S:].float() == 0).all()


def test_strided_rows_of_a_fused_projection():
    qkv = torch.randn(2, 50, 3 * 4 * 16, device=DEVICE).to(torch.float8_e4m3fn)
    v = qkv[..., 2 * 64:].view(2, 50, 4, 16)  # a view: rows 192 elements apart
    assert not v.is_contiguous()
    assert torch.equal(transpose_seq(v)[..., :50].float(), v.permute(0, 2, 3, 1).float())


@pytest.mark.gpu
def test_many_heads_pass_the_grid_limit():
    """B * H on the grid's first axis: more than 65535 (the limit of the others) heads copy."""
    x = torch.randn(70000, 20, 1, 16, device="cuda").to(torch.float8_e4m3fn)
    y = transpose_seq(x)
    assert torch.equal(y[..., :20].float(), x.permute(0, 2, 3, 1).float()) and (y[..., 20:].float() == 0).all()

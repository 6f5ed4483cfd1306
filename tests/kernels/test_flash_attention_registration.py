"""torch.library registration: opcheck (schema, fake kernels vs real outputs, autograd hooks)."""

import pytest
import torch

from kernelops.kernels.flash_attention.registration import flash_attention_bwd_op, flash_attention_fwd_op
from tests.conftest import DEVICE

PARAMS = [32, 32, 4, 1]


def _fwd_args(platform, requires_grad):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 37, 4, 16, generator=g).to(DEVICE).requires_grad_(requires_grad)
    k = torch.randn(1, 45, 2, 16, generator=g).to(DEVICE).requires_grad_(requires_grad)
    v = torch.randn(1, 45, 2, 16, generator=g).to(DEVICE).requires_grad_(requires_grad)
    sinks = torch.randn(4, generator=g).to(DEVICE)
    return (q, k, v, None, None, sinks, None, None, None, None, 0.25, 1 << 30, 0, 0.0, 0.0, 0, platform, PARAMS,
            PARAMS)


@pytest.mark.parametrize("platform", ["torch", "triton"])
def test_opcheck_forward(platform):
    torch.library.opcheck(flash_attention_fwd_op, _fwd_args(platform, requires_grad=True),
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


@pytest.mark.parametrize("platform", ["torch", "triton"])
def test_opcheck_backward(platform):
    args = _fwd_args(platform, requires_grad=False)
    q, k, v = args[:3]
    out, lse = flash_attention_fwd_op(*args)
    dout = torch.randn_like(out)
    bwd_args = (q, k, v, out, dout, lse, None, None, None, args[5], None, None, None, None, False, *args[10:17],
                PARAMS)
    torch.library.opcheck(flash_attention_bwd_op, bwd_args, test_utils=("test_schema", "test_faketensor"))

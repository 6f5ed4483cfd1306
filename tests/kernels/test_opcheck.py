"""torch.library.opcheck for every custom op: schema, fake kernels against real outputs, autograd
registration and AOT dispatch (static and dynamic shapes), with explicit launch params and with
auto params (``[]``: resolved when the op runs)."""

import pytest
import torch

from kernelops.kernels.attention.registration import attention_keep_mask_op, keep_mask
from kernelops.kernels.flash_attention.registration import flash_attention_bwd_op, flash_attention_fwd_op
from kernelops.kernels.flash_attention.runtime_config import AUTO
from kernelops.modules.attention_args import UNBOUNDED
from tests.conftest import DEVICE

PARAMS = [32, 32, 4, 1]
ALL_UTILS = ("test_schema", "test_faketensor", "test_autograd_registration", "test_aot_dispatch_static",
             "test_aot_dispatch_dynamic")


def _fwd_args(platform, params, requires_grad, sinks=True):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 37, 4, 16, generator=g).to(DEVICE).requires_grad_(requires_grad)
    k = torch.randn(1, 45, 2, 16, generator=g).to(DEVICE).requires_grad_(requires_grad)
    v = torch.randn(1, 45, 2, 16, generator=g).to(DEVICE).requires_grad_(requires_grad)
    aux = torch.randn(4, generator=g).to(DEVICE).requires_grad_(requires_grad) if sinks else None
    # causal (bottom-right): win_left unbounded, win_right 0
    return (q, k, v, None, None, aux, None, None, None, None, 0.25, UNBOUNDED, 0, 0.0, 0.0, 0, platform, params,
            params, "flash_attention", True, False, requires_grad, 0, 0)


def _bwd_args(platform, params):
    args = _fwd_args(platform, PARAMS, requires_grad=False)
    q, k, v = args[:3]
    out, lse = flash_attention_fwd_op(*args)
    dout = torch.randn_like(out)
    return (q, k, v, out, dout, lse, None, None, None, args[5], None, None, None, None, False, *args[10:17], params,
            "flash_attention", True, False, 0, 0)


@pytest.mark.parametrize("params", [PARAMS, AUTO], ids=["explicit", "auto"])
@pytest.mark.parametrize("platform", ["torch", "triton"])
def test_opcheck_flash_attention_fwd(platform, params):
    torch.library.opcheck(flash_attention_fwd_op, _fwd_args(platform, params, requires_grad=True),
                          test_utils=ALL_UTILS)


@pytest.mark.parametrize("params", [PARAMS, AUTO], ids=["explicit", "auto"])
@pytest.mark.parametrize("platform", ["torch", "triton"])
def test_opcheck_flash_attention_bwd(platform, params):
    torch.library.opcheck(flash_attention_bwd_op, _bwd_args(platform, params), test_utils=ALL_UTILS)


def test_opcheck_flash_attention_fwd_packed_auto():
    """Packed sequences with auto params and max_seqlen 0: the op reads the offsets when it runs."""
    lens = [5, 0, 12, 7]
    cu = torch.tensor([0, 5, 5, 17, 24], dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(lens), 4, 16, device=DEVICE, requires_grad=True)
    k = torch.randn(sum(lens), 2, 16, device=DEVICE, requires_grad=True)
    v = torch.randn(sum(lens), 2, 16, device=DEVICE, requires_grad=True)
    args = (q, k, v, None, None, None, None, None, cu, cu, 0.25, UNBOUNDED, 0, 0.0, 0.0, 0, "triton", AUTO, AUTO,
            "flash_attention", True, False, True, 0, 0)
    torch.library.opcheck(flash_attention_fwd_op, args,
                          test_utils=("test_schema", "test_faketensor", "test_autograd_registration"))


def test_auto_params_give_the_explicit_heuristic_result():
    """On CPU (no tuning) auto params resolve to the heuristic: bitwise the explicit launch."""
    from kernelops.modules.flash_attention import FLASH_ATTENTION
    from kernelops.ops import device_info

    args = _fwd_args("triton", AUTO, requires_grad=False)
    q, k, v = args[:3]
    inputs = FLASH_ATTENTION.prepare(query=q, key=k, value=v, causal=True, softmax_scale=0.25, softmax_aux=args[5])
    cfg = FLASH_ATTENTION.heuristic_config(inputs, device_info(q.device))
    explicit = list(args)
    explicit[17] = [cfg.fwd_params.q_blocksize, cfg.fwd_params.kv_blocksize, cfg.fwd_params.num_warps,
                    cfg.fwd_params.num_stages]
    for got, want in zip(flash_attention_fwd_op(*args), flash_attention_fwd_op(*explicit)):
        assert torch.equal(got, want)


@pytest.mark.parametrize("seed", [0, 12345])
def test_opcheck_attention_keep_mask(seed):
    q, k = torch.randn(2, 9, 4, 8, device=DEVICE), torch.randn(2, 13, 2, 8, device=DEVICE)
    torch.library.opcheck(attention_keep_mask_op, (q, k, seed, 0.3), test_utils=ALL_UTILS)
    mask = attention_keep_mask_op(q, k, seed, 0.3)
    assert mask.shape == (2, 4, 9, 13) and mask.dtype == torch.bool
    assert torch.equal(mask, keep_mask(q, k, seed, 0.3))
    assert 0.5 < mask.float().mean().item() < 0.9  # keeps ~70%
